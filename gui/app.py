"""Entry point of the ``opencl-llm-studio`` GUI script and ``python -m gui``.

``--self-test`` runs :func:`core.selftest.run_self_test` without opening a window (for the packaged executable).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gui.paths import DATA_ENV

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication

APP_NAME = "OpenCL LLM Studio"
ORG_NAME = "opencl-llm-studio"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opencl-llm-studio", description="Train a tiny language model from scratch "
                                "with OpenCL, watch it learn, chat with it and export GGUF.")
    p.add_argument("project", nargs="?", help="project folder to open (an existing folder)")
    p.add_argument("--self-test", action="store_true", help="check devices, train a few steps, generate, export a "
                   "GGUF to a temporary folder, print a summary and exit (no window)")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    return p


def set_app_identity(app: QApplication) -> None:
    """Organization and application names: QSettings and the data folder depend on them.

    With ``$OPENCL_LLM_STUDIO_DATA`` set, the settings too live there (an INI file under
    ``$OPENCL_LLM_STUDIO_DATA/settings``), so that variable isolates the app completely.
    """
    app.setOrganizationName(ORG_NAME)
    app.setApplicationName(APP_NAME)
    app.setApplicationDisplayName(APP_NAME)
    data = os.environ.get(DATA_ENV)
    if data:
        from PySide6.QtCore import QSettings

        QSettings.setDefaultFormat(QSettings.Format.IniFormat)
        QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(Path(data) / "settings"))


def set_app_icon(app: QApplication) -> None:
    """Window icon and desktop-file name, so the window matches its menu entry (also on Wayland)."""
    from importlib import resources

    from PySide6.QtGui import QIcon, QPixmap

    data = resources.files("resources").joinpath("opencl-llm-studio.png").read_bytes()
    pixmap = QPixmap()
    if pixmap.loadFromData(data):
        app.setWindowIcon(QIcon(pixmap))
    app.setDesktopFileName("opencl-llm-studio")


def main(argv: list[str] | None = None) -> int:
    """Start the app (or the self-test); returns the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, qt_args = build_parser().parse_known_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.self_test:
        from core.selftest import run_self_test

        return run_self_test()

    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow

    project = args.project
    if project is not None and not Path(project).is_dir():  # e.g. the value of a Qt option such as -style
        qt_args.append(project)
        project = None
    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "opencl-llm-studio", *qt_args])
    set_app_identity(app)
    set_app_icon(app)
    # Collect cyclic garbage only in the GUI thread: a Qt object freed by Python's GC inside a
    # worker thread can deadlock Qt against the GIL (pyqtgraph's remedy, gc on a GUI timer).
    from pyqtgraph.util.garbage_collector import GarbageCollector

    collector = GarbageCollector(interval=1.0)  # noqa: F841 - must live as long as the app
    window = MainWindow(project_dir=project)
    window.show()
    _close_on_signals(window)
    return int(app.exec())


def _close_on_signals(window) -> None:
    """Ctrl-C / SIGTERM close the window the normal way (workers stopped, project saved)."""
    import signal

    from PySide6.QtCore import QTimer

    def close(*_):
        QTimer.singleShot(0, window.close)

    for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
        if sig is not None:
            signal.signal(sig, close)
    # Python runs signal handlers only between bytecodes: wake the interpreter now and then.
    timer = QTimer(window, interval=300)
    timer.timeout.connect(lambda: None)
    timer.start()


if __name__ == "__main__":
    sys.exit(main())
