"""Render resources/opencl-llm-studio.svg to resources/opencl-llm-studio.png (256x256) with QtSvg.

Run after editing the SVG:  QT_QPA_PLATFORM=offscreen python packaging/make_icon.py
The PNG is committed, so builds need not run this.
"""
from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ROOT = Path(__file__).resolve().parent.parent


def main(size: int = 256) -> int:
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 - keeps Qt alive
    svg = ROOT / "resources" / "opencl-llm-studio.svg"
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        print(f"cannot parse {svg}", file=sys.stderr)
        return 1
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    out = svg.with_suffix(".png")
    if not image.save(str(out), "PNG"):
        print(f"cannot write {out}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
