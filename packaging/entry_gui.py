"""Frozen entry point of ``opencl-llm-studio`` (the GUI executable of the PyInstaller bundle).

Everything goes to :func:`gui.app.main` (including ``--self-test``), except one option for smoke
tests of the bundle, handled here so the app's own parser stays as it is:

``--quit-after SECONDS``  start the window as usual, show the Dataset tab after 0.5 s, then after SECONDS
                          print whether the main window was shown and the tab's token counts (counted
                          in a child process, which re-runs this executable), and quit (exit 0 if the
                          window was shown, 3 if not). Used by tests/test_packaging.py with
                          QT_QPA_PLATFORM=offscreen.
"""
from __future__ import annotations

import sys


def _pop_quit_after(argv: list[str]) -> tuple[float | None, list[str]]:
    out: list[str] = []
    seconds = None
    it = iter(argv)
    for a in it:
        if a == "--quit-after":
            seconds = float(next(it, "5"))
        elif a.startswith("--quit-after="):
            seconds = float(a.split("=", 1)[1])
        else:
            out.append(a)
    return seconds, out


def _arm_quit_timer(seconds: float) -> None:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])

    def check_and_quit() -> None:
        shown = [w for w in app.topLevelWidgets() if isinstance(w, QMainWindow) and w.isVisible()]
        if shown:
            print(f"quit-after: main window {shown[0].windowTitle()!r} was shown "
                  f"(platform {app.platformName()})", flush=True)
            check = getattr(getattr(shown[0], "dataset_tab", None), "check", None)
            if check is not None:
                print(f"quit-after: dataset counts: {check.stats_label.text()!r}", flush=True)
        else:
            print("quit-after: no main window was shown", flush=True)
        for w in shown:
            w.close()
        app.exit(0 if shown else 3)

    def show_dataset_tab() -> None:  # its token counts run only while it is shown
        for w in app.topLevelWidgets():
            if isinstance(w, QMainWindow) and hasattr(w, "dataset_tab"):
                w.tabs.setCurrentWidget(w.dataset_tab)

    QTimer.singleShot(500, show_dataset_tab)
    QTimer.singleShot(int(seconds * 1000), check_and_quit)


def main() -> int:
    import multiprocessing

    multiprocessing.freeze_support()  # a child process (core.child_call) re-runs this executable: serve it
    seconds, argv = _pop_quit_after(sys.argv[1:])
    if seconds is not None and "--self-test" not in argv:
        _arm_quit_timer(seconds)  # creates the QApplication that gui.app.main then reuses
    from gui.app import main as app_main

    return app_main(argv)


if __name__ == "__main__":
    sys.exit(main())
