"""Take a PNG of each tab of the real window: ``python docs/screenshots.py [--out docs]``.

Runs offscreen with throw-away settings: tests the device, trains the Auto plan (so the plots and the
recall table have data; ``--preset Tiny`` with ``--pretrain-steps``/``--tune-steps`` for a quicker run),
chats, exports, and saves docs/tab-<name>.png. Then it trains a model of 30 layers for a few steps and
saves docs/tab-training-30-layers.png: its per-layer gradient norms as a heat map.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PySide6.QtCore import QEventLoop, QSettings, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


def wait_for(app, condition, timeout_s: float = 600.0) -> None:
    """Run the event loop until ``condition()`` is true."""
    loop = QEventLoop()
    timer = QTimer(interval=50)
    timer.timeout.connect(lambda: condition() and loop.quit())
    timer.start()
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    loop.exec()
    timer.stop()
    if not condition():
        raise TimeoutError("timed out waiting for the window")


def pause(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent), help="folder for the PNGs")
    p.add_argument("--preset", default="Auto", help="Auto (the app's default) or a preset: Tiny, Small, Larger")
    p.add_argument("--pretrain-steps", type=int, default=150, help="with a preset")
    p.add_argument("--tune-steps", type=int, default=100, help="with a preset")
    p.add_argument("--layer-steps", type=int, default=40, help="steps of each stage of the 30-layer run")
    args = p.parse_args()
    out = Path(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="studio-screens-"))
    os.environ["OPENCL_LLM_STUDIO_DATA"] = str(tmp / "data")

    app = QApplication([])
    from gui.app import set_app_identity
    from gui.main_window import MainWindow

    set_app_identity(app)
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp / "settings"))
    w = MainWindow()
    w.resize(1280, 880)
    w.show()

    # Device: run the test
    w.device_tab.start_test()
    wait_for(app, lambda: not w.device_tab.is_testing())

    # Hyperparameters: the Auto plan (or a preset's short run)
    from core.plan import AUTO

    h = w.hyper_tab
    if args.preset in ("Auto", AUTO):
        h.set_preset(AUTO)
    else:
        h.set_preset(args.preset)
        h.widgets["pretrain.steps"].setValue(args.pretrain_steps)
        h.widgets["dialogues.steps"].setValue(args.tune_steps)
        for s in ("pretrain", "dialogues"):
            h.widgets[f"{s}.batch_size"].setValue(8)

    # Training
    t = w.training_tab
    w.tabs.setCurrentWidget(t)
    if not t.start():
        raise SystemExit(f"could not start training: {t.banner_text.text()}")
    wait_for(app, lambda: not t.is_running())
    pause(300)

    # Chat
    c = w.chat_tab
    for question in ("Where is Brindlewick?", "How many hearts does an octopus have?"):
        c.send(question)
        wait_for(app, lambda: not c.is_answering(), 120)
    if c.pieces():
        c.show_token(min(2, len(c.pieces()) - 1))

    # Export
    e = w.export_tab
    e.path.setText(str(tmp / "brindlewick.gguf"))
    e.set_dtype("f16")
    e.modelfile.setChecked(True)
    e.export()
    wait_for(app, lambda: not e.is_exporting(), 120)

    # Dataset: show a two-turn dialogue
    d = w.dataset_tab
    two = next((i for i, dl in enumerate(d.dataset().dialogues) if len(dl.turns) > 1), 0)
    d.dialogues.setCurrentRow(two)

    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(["device", "dataset", "hyperparameters", "training", "chat", "export"]):
        w.tabs.setCurrentIndex(i)
        pause(250)
        save(w, out / f"tab-{name}.png")
    many_layers(w, args.layer_steps)
    save(w, out / "tab-training-30-layers.png")
    w.close()
    return 0


def save(w, path: Path) -> None:
    w.grab().save(str(path))
    print(f"wrote {path}")


def many_layers(w, steps: int) -> None:
    """Train a narrow model of 30 layers (as many blocks as SmolLM2) for ``steps`` steps a stage: the
    Training tab then draws its per-layer gradient norms as a heat map."""
    import gui.dialogs

    gui.dialogs.ask = lambda *a, **k: True  # "Replace the trained model?": yes
    h = w.hyper_tab
    h.set_preset("Tiny")
    h.set_values({"d_model": 32, "n_layers": 30, "n_heads": 2, "n_kv_heads": 2, "ffn_dim": 64,
                  "pretrain.steps": steps, "dialogues.steps": steps, "pretrain.batch_size": 8, "dialogues.batch_size": 8,
                  "check_every": 0}, preset="Custom")
    t = w.training_tab
    w.tabs.setCurrentWidget(t)
    if not t.start():
        raise SystemExit(f"could not start the 30-layer run: {t.banner_text.text()}")
    wait_for(None, lambda: not t.is_running())
    pause(300)
    if not t.plots.is_heat_map():
        raise SystemExit("the 30-layer run's per-layer plot is not a heat map")


if __name__ == "__main__":
    sys.exit(main())
