"""The main window's menus: File (projects, recent ones), Edit (undo / redo of dataset edits), Help."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtGui import QAction, QKeySequence, QUndoStack
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMessageBox

from gui import dialogs
from gui.paths import untitled_dir
from gui.project import ProjectError, check_save_as_target, is_project

APP_TITLE = "OpenCL LLM Studio"
MAX_RECENT = 8


class ProjectMenus:
    """The menus of ``window`` and the dialogs they open. ``window`` is the gui.main_window.MainWindow:
    its ``project``, ``is_untitled``, ``save``, ``open_project``, ``save_project_as`` and ``new_project``.

    Args:
        window: the main window (the menus' parent and the dialogs').
        undo_stack: the Dataset tab's edits (Edit ▸ Undo / Redo).
    """

    def __init__(self, window: QMainWindow, undo_stack: QUndoStack) -> None:
        self.window = window
        m = window.menuBar().addMenu("&File")
        self.new_action = self._action(m, "&New project", self.new_project_dialog, QKeySequence.StandardKey.New)
        self.open_action = self._action(m, "&Open project…", self.open_dialog, QKeySequence.StandardKey.Open)
        self.recent_menu = m.addMenu("Open &recent")
        self._action(m, "&Save", window.save, QKeySequence.StandardKey.Save)
        self.save_as_action = self._action(m, "Save project &as…", self.save_as_dialog, QKeySequence.StandardKey.SaveAs)
        m.addSeparator()
        self._action(m, "&Quit", window.close, QKeySequence.StandardKey.Quit)
        # Edit: undo / redo of the dataset's edits (gui.dataset_undo); a text field's own Ctrl+Z wins
        # while it has the focus
        e = window.menuBar().addMenu("&Edit")
        self.undo_action = undo_stack.createUndoAction(window, "&Undo")
        self.undo_action.setShortcuts([QKeySequence(QKeySequence.StandardKey.Undo)])
        self.redo_action = undo_stack.createRedoAction(window, "&Redo")
        redo_keys = [QKeySequence("Ctrl+Shift+Z")]
        redo_keys += [k for k in QKeySequence.keyBindings(QKeySequence.StandardKey.Redo) if k not in redo_keys]
        self.redo_action.setShortcuts(redo_keys)
        e.addAction(self.undo_action)
        e.addAction(self.redo_action)
        self._action(window.menuBar().addMenu("&Help"), "&About", self._about)
        self._update_recent_menu()

    def _action(self, menu, text: str, slot, shortcut=None) -> QAction:
        a = QAction(text, self.window)
        if shortcut is not None:
            a.setShortcut(shortcut)
        a.triggered.connect(slot)
        menu.addAction(a)
        return a

    def _about(self) -> None:
        from core import __version__

        QMessageBox.about(self.window, APP_TITLE, f"<b>{APP_TITLE}</b> {__version__}<br>Train a tiny llama-style "
                          "language model from scratch on any OpenCL device, chat with it, export GGUF.")

    def recent_projects(self) -> list[str]:
        value = QSettings().value("project/recent", [])
        if isinstance(value, str):
            value = [value]
        return [p for p in (value or []) if isinstance(p, str)]

    def remember(self, folder: Path) -> None:
        """``folder`` is the last project opened (and a recent one, unless it is the untitled project)."""
        settings = QSettings()
        settings.setValue("project/last", str(folder))
        if folder.resolve() == untitled_dir().resolve():
            return
        recent = [str(folder)] + [p for p in self.recent_projects() if p != str(folder)]
        settings.setValue("project/recent", recent[:MAX_RECENT])
        self._update_recent_menu()

    def _update_recent_menu(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_projects()
        for p in recent:
            a = self.recent_menu.addAction(p)
            a.triggered.connect(lambda checked=False, path=p: self.open_with_message(path))
        self.recent_menu.setEnabled(bool(recent))

    def set_busy(self, busy: bool) -> None:
        """No other project while training or an export runs."""
        for a in (self.new_action, self.open_action, self.save_as_action):
            a.setEnabled(not busy)
        self.recent_menu.setEnabled(not busy and bool(self.recent_projects()))

    def open_with_message(self, folder: str) -> None:
        try:
            self.window.open_project(folder)
        except (ProjectError, RuntimeError) as e:
            dialogs.warn(self.window, "Open project", f"Could not open the project:\n{e}")

    def open_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.window, "Open a project folder")
        if folder:
            self.open_with_message(folder)

    def save_as_dialog(self) -> None:
        w = self.window
        folder = QFileDialog.getExistingDirectory(w, "Save the project into a folder")
        if not folder:
            return
        try:
            replace = check_save_as_target(w.project, folder)
        except ProjectError as e:
            dialogs.warn(w, "Save project as", str(e))
            return
        if replace and not dialogs.ask(w, "Save project as", f"{folder} already holds a project. Replace its "
                                       "dataset, settings and trained model with this project's?", yes="Replace"):
            return
        try:
            w.save_project_as(folder, replace=replace)
        except (OSError, RuntimeError, ProjectError) as e:
            dialogs.warn(w, "Save project as", str(e))

    def new_project_dialog(self) -> None:
        u = untitled_dir()
        if is_project(u):
            if self.window.is_untitled():
                text = ("Discard the untitled project (its dataset, settings and trained model)? Use “Save project "
                        "as” to keep it.")
            else:
                text = (f"Start a new untitled project? This discards the earlier untitled project in {u} (its "
                        "dataset, settings and trained model); open it and use “Save project as” to keep it.")
            if not dialogs.ask(self.window, "New project", text + f"\n\nOther files in {u} are kept.", yes="Discard"):
                return
        try:
            self.window.new_project()
        except RuntimeError as e:
            dialogs.warn(self.window, "New project", str(e))
