"""The main window: six tabs, the File menu with projects, autosave, and a clean shutdown."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import (QFrame, QMainWindow, QScrollArea, QTabWidget, QVBoxLayout,
                               QWidget)

from gui import dialogs
from gui.app_state import AppState
from gui.chat_tab import ChatTab
from gui.dataset_tab import DatasetTab
from gui.device_tab import DeviceTab
from gui.export_tab import ExportTab
from gui.file_menu import APP_TITLE, ProjectMenus
from gui.history import CHAT_FILE, HISTORY_FILE, chat_text, history_text, load_history, write_if_changed
from gui.hyper_tab import HyperTab
from gui.paths import inside, untitled_dir
from gui.project import (Project, ProjectError, check_save_as_target, copy_checkpoint, is_project, load_project,
                         lock_project, new_project, project_files_in, remove_project_files, save_project)
from gui.training_tab import TrainingTab
from gui.widgets import ElidedLabel
from gui.workers import stop_all

if TYPE_CHECKING:
    from PySide6.QtGui import QCloseEvent
    from core.config import ModelConfig, TrainConfig
    from core.device import DeviceInfo



class _NoHeightForWidth(QVBoxLayout):
    """A layout that hides its items' height-for-width: a QScrollArea would otherwise size a page with
    word-wrapped labels to its full preferred height (plots 1300 px tall) instead of the viewport."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt API
        return False


class ScrollingTabs(QTabWidget):
    """Tabs whose pages scroll when the window is smaller than a page needs (small laptop screens).

    ``widget(i)`` is the scroll area; :meth:`page` is the tab's own widget, and
    :meth:`setCurrentWidget` accepts either.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._pages: list[QWidget] = []

    def add_page(self, page: QWidget, name: str) -> None:
        holder = QWidget()
        lay = _NoHeightForWidth(holder)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(page)
        area = QScrollArea()
        area.setWidgetResizable(True)
        area.setFrameShape(QFrame.Shape.NoFrame)
        area.setWidget(holder)
        self.addTab(area, name)
        self._pages.append(page)

    def page(self, index: int) -> QWidget | None:
        return self._pages[index] if 0 <= index < len(self._pages) else None

    def setCurrentWidget(self, widget: QWidget) -> None:  # noqa: N802 - Qt API
        for i in range(self.count()):
            if widget is self.widget(i) or widget is self.page(i):
                self.setCurrentIndex(i)
                return
        raise ValueError(f"{widget!r} is not a tab")


GIL_SWITCH_S = 0.0005  # seconds a thread computing in Python keeps the GIL from the GUI thread (default 0.005)


class MainWindow(QMainWindow):
    """OpenCL LLM Studio.

    The project (dataset, settings, checkpoint) is always a folder and every change is autosaved
    into it, so nothing is lost on close; a new project lives in an "untitled" folder in the app's
    data folder until it is saved elsewhere with "Save project as".

    Args:
        project_dir: a project folder to open; default: the last one used (or a new untitled one).
    """

    def __init__(self, project_dir: str | os.PathLike | None = None) -> None:
        super().__init__()
        # Qt calls into Python once per row (a search over 22,000 entries: 22,000 calls), and each call waits
        # for the GIL up to this interval while a worker (token counts, the Auto plan) runs Python: at the
        # default 5 ms, clearing a search took 1.5-3.3 s instead of 0.06 s; at 0.5 ms at most 0.65 s
        # (tests/test_gui_dataset_large.py, 2-core CPU).
        sys.setswitchinterval(GIL_SWITCH_S)
        self._project_lock = None  # core.folder_lock.FolderLock of the open project
        self._written: dict[str, str] = {}  # history files' text as last written (gui.history.write_if_changed)
        self._closing = False

        self.state = AppState(self)
        self.device_tab = DeviceTab(self.state)
        self.dataset_tab = DatasetTab(self.state)
        self.hyper_tab = HyperTab(self.state)
        self.training_tab = TrainingTab(self.state)
        self.chat_tab = ChatTab(self.state)
        self.export_tab = ExportTab(self.state)
        self.tabs = ScrollingTabs()
        for w, name in ((self.device_tab, "Device"), (self.dataset_tab, "Dataset"),
                        (self.hyper_tab, "Hyperparameters"), (self.training_tab, "Training"),
                        (self.chat_tab, "Chat"), (self.export_tab, "Export")):
            self.tabs.add_page(w, name)
        self.setCentralWidget(self.tabs)
        status = self.statusBar()  # there from the start, one line high: messages never shift the tabs
        status.setFixedHeight(status.fontMetrics().height() + 10)
        # messages are elided to the bar's width (the whole one in the tooltip), never clipped
        self.status_label = ElidedLabel("", min_chars=10)
        status.addWidget(self.status_label, 1)
        self._status_timer = QTimer(self, singleShot=True)
        self._status_timer.timeout.connect(lambda: self.status_label.setText(""))
        self.resize(1200, 860)

        self._autosave_timer = QTimer(self, singleShot=True, interval=800)
        self._autosave_timer.timeout.connect(self.save)

        self.device_tab.device_changed.connect(self.state.set_device)
        self.state.dataset_edited.connect(self._autosave_timer.start)
        self.state.history_changed.connect(self._autosave_timer.start)
        self.hyper_tab.changed.connect(self._autosave_timer.start)
        self.state.message.connect(lambda text: self.show_status(text, 8000))
        self.menus = ProjectMenus(self, self.dataset_tab.undo_stack)
        self.state.busy_changed.connect(lambda: self.menus.set_busy(self.state.busy()))
        for name in ("new_action", "open_action", "save_as_action", "recent_menu", "undo_action", "redo_action"):
            setattr(self, name, getattr(self.menus, name))
        self.recent_projects, self._open_with_message = self.menus.recent_projects, self.menus.open_with_message
        self._save_as_dialog, self._new_project_dialog = self.menus.save_as_dialog, self.menus.new_project_dialog
        settings = QSettings()
        geometry = settings.value("window/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        state = settings.value("window/state")
        if state is not None:
            self.restoreState(state)
        self.tabs.setCurrentIndex(int(settings.value("window/tab", 0, type=int)))

        self.device_tab.refresh()
        self._open_initial(project_dir)

    # ----------------------------------------------------------------------------- projects
    def _warn_soon(self, title: str, text: str) -> None:
        """A warning shown once the event loop runs (the window may not be visible yet)."""
        QTimer.singleShot(0, lambda: dialogs.warn(self, title, text))

    def _try_open_initial(self, folder) -> bool:
        try:
            self.open_project(folder)
            return True
        except ProjectError as e:
            self._warn_soon("Open project", f"Could not open the project:\n{e}")
            return False

    def _open_initial(self, project_dir) -> None:
        u = untitled_dir()
        if project_dir:
            if is_project(project_dir):
                if self._try_open_initial(project_dir):
                    return
            elif project_files_in(project_dir):
                self._warn_soon("Open project", f"{project_dir} is not a project folder but holds "
                                f"{', '.join(project_files_in(project_dir))}; it is left as it is.")
            else:  # a folder that is not a project yet: start one there
                try:
                    self._set_project(new_project(project_dir))
                    return
                except ProjectError as e:
                    self._warn_soon("Open project", f"Could not open the project:\n{e}")
        else:
            last = QSettings().value("project/last", "", type=str)
            if last and is_project(last) and not inside(Path(last), u) and self._try_open_initial(last):
                return
        why = ""
        if is_project(u):
            try:
                self.open_project(u)
                return
            except ProjectError as e:  # said once, below, with the path it is moved to
                why = str(e)
        if is_project(u) or (u / "dataset.json").exists():  # unreadable: keep it, start afresh beside it
            aside = u.with_name(f"untitled-unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
            try:
                os.replace(u, aside)
            except OSError as e:  # never write over it: better not to start
                raise SystemExit(f"{u}: unreadable project, and it cannot be moved aside ({e})") from None
            why = f" ({why.replace(str(u), str(aside))})" if why else ""
            self._warn_soon("Untitled project", f"The untitled project could not be opened{why}, so it was moved "
                            f"to {aside} (nothing was deleted) and a new untitled project was started.")
        try:
            self._set_project(new_project(u))
        except ProjectError as e:  # another window of the app holds the untitled project
            raise SystemExit(f"opencl-llm-studio: {e}") from None

    @property
    def project(self) -> Project | None:
        """The open project (the state's)."""
        return self.state.project

    def _set_project(self, project: Project, warnings: list[str] | None = None) -> None:
        """Open ``project`` in the state: each tab loads its part (dataset, form, sampling, export)."""
        lock = lock_project(project.folder)  # one writer per folder: refuses a project in use elsewhere
        if self._project_lock is not None and self._project_lock.folder != lock.folder:
            self._project_lock.release()
        self._project_lock = lock
        # read while holding the lock: an unreadable file is moved aside (gui.history)
        project.history, project.chat, history_warnings = load_history(project.folder)
        warnings = list(warnings or []) + history_warnings
        self._written = {}
        self.state.set_project(project)
        self.save()
        self.menus.remember(project.folder)
        self._update_title()
        for w in warnings or []:
            self.training_tab.append_log("WARNING", w)

    def _update_title(self) -> None:
        if self.project is None:
            self.setWindowTitle(APP_TITLE)
            return
        name = "Untitled" if self.is_untitled() else self.project.folder.name
        self.setWindowTitle(f"{name} — {APP_TITLE}")

    def is_untitled(self) -> bool:
        return self.project is not None and self.project.folder.resolve() == untitled_dir().resolve()

    def open_project(self, folder: str | os.PathLike) -> None:
        """Open a project folder (saving the current one first).

        Raises:
            ProjectError: not a project folder. RuntimeError: training or export is running.
        """
        if self.state.busy():
            raise RuntimeError("stop training or export before opening another project")
        if self._project_lock is None or self._project_lock.folder != Path(os.path.abspath(folder)):
            lock_project(folder).release()  # refuse a project another process holds before reading it
        project, warnings = load_project(folder)
        if self.project is not None:
            self.save()
        self._set_project(project, warnings)

    def save(self) -> None:
        """Write the current project (dataset and settings) to its folder now."""
        self._autosave_timer.stop()
        if self.project is None:
            return
        self.project.dataset = self.state.dataset()
        self.project.settings = {
            "hyperparameters": self.hyper_tab.state(),
            "sampling": self.chat_tab.saved_settings(),
            "export": self.export_tab.saved_settings(),
        }
        folder = self.project.folder
        try:
            save_project(self.project)
            write_if_changed(folder / HISTORY_FILE, history_text(self.training_tab.saved_history()), self._written)
            write_if_changed(folder / CHAT_FILE, chat_text(self.chat_tab.saved_transcript()), self._written)
        except OSError as e:
            self.show_status(f"could not save the project: {e}", 10000)

    def save_project_as(self, folder: str | os.PathLike, replace: bool = False) -> None:
        """Copy the project (with its trained model) to ``folder`` and continue there.

        An untitled project's own files are then removed from the data folder (nothing else there).

        Raises:
            ProjectError: ``folder`` is inside the current project folder, holds files a project would
                overwrite, or holds another project and ``replace`` is False. RuntimeError: busy.
            OSError: writing failed.
        """
        if self.state.busy():
            raise RuntimeError("stop training or export before saving the project elsewhere")
        folder = Path(folder)
        old = self.project
        if check_save_as_target(old, folder) and not replace:
            raise ProjectError(f"{folder}: already holds a project")
        self.save()
        copy_checkpoint(old, folder)
        project = Project(folder, self.state.dataset(), dict(old.settings))
        save_project(project)
        was_untitled = self.is_untitled()
        self._set_project(project)
        if was_untitled:  # the work now lives in the named folder: the next untitled one starts afresh
            remove_project_files(old.folder)

    def new_project(self) -> None:
        """Start a new untitled project with the example dataset. The untitled folder's project files
        (dataset, settings, trained model) are replaced; other files there are kept."""
        if self.state.busy():
            raise RuntimeError("stop training or export before starting a new project")
        self.save()
        u = untitled_dir()
        remove_project_files(u)
        self._set_project(new_project(u))

    def show_status(self, text: str, ms: int = 8000) -> None:
        """A line in the status bar for ``ms`` milliseconds (elided to fit, whole in its tooltip)."""
        self.status_label.setText(text)
        self._status_timer.start(ms)

    # ----------------------------------------------------------------------------- for scripts and tests
    def device_info(self) -> DeviceInfo | None:
        """The chosen core.device.DeviceInfo (the state's), or None."""
        return self.state.device_info()

    def configs(self) -> tuple[ModelConfig, TrainConfig]:
        """The Hyperparameters form as (ModelConfig, TrainConfig). Raises core.config.ConfigError."""
        return self.hyper_tab.build()

    def trained_model_path(self) -> Path | None:
        """The project's trained model (the state's), or None."""
        return self.state.trained_model_path()

    # ----------------------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Stop every worker, wait for each, save the project and the window state."""
        if self._closing:
            return
        self._closing = True
        self.training_tab.stop_and_wait()
        self.device_tab.stop()
        self.chat_tab.stop()
        self.export_tab.stop()
        self.dataset_tab.stop()
        self.hyper_tab.stop()
        stop_all()
        self.save()
        if self._project_lock is not None:
            self._project_lock.release()
        settings = QSettings()
        settings.setValue("window/geometry", self.saveGeometry())
        settings.setValue("window/state", self.saveState())
        settings.setValue("window/tab", self.tabs.currentIndex())

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt API
        self.shutdown()
        event.accept()
