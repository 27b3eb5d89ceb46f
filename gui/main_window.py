"""The main window: six tabs, the File menu with projects, autosave, and a clean shutdown."""
from __future__ import annotations

import os
import time
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QFileDialog, QFrame, QMainWindow, QMessageBox, QScrollArea, QTabWidget, QVBoxLayout,
                               QWidget)

from gui import dialogs
from gui.app import DATA_ENV
from gui.chat_tab import ChatTab
from gui.dataset_tab import DatasetTab
from gui.device_tab import DeviceTab
from gui.export_tab import ExportTab
from gui.hyper_tab import HyperTab
from gui.project import (Project, ProjectError, check_save_as_target, copy_checkpoint, is_project, load_project,
                         new_project, project_files_in, remove_project_files, save_project)
from gui.training_tab import TrainingTab
from gui.workers import stop_all

APP_TITLE = "OpenCL LLM Studio"
MAX_RECENT = 8


def data_dir() -> Path:
    """Where the untitled (autosaved) project lives: $OPENCL_LLM_STUDIO_DATA or the app data folder."""
    env = os.environ.get(DATA_ENV)
    if env:
        base = Path(env)
    else:
        import platformdirs

        base = Path(platformdirs.user_data_dir("opencl-llm-studio", appauthor=False))
    base.mkdir(parents=True, exist_ok=True)
    return base


def untitled_dir() -> Path:
    return data_dir() / "untitled"


def default_export_dir() -> Path:
    """Where the Export tab suggests writing: the last export folder, else Documents, else home (never
    inside the app's data folder, whose untitled project is replaced by "New project")."""
    last = QSettings().value("export/folder", "", type=str)
    if last and Path(last).is_dir():
        return Path(last)
    import platformdirs

    docs = platformdirs.user_documents_dir()
    return Path(docs) if docs and Path(docs).is_dir() else Path.home()


def _inside(path: Path, folder: Path) -> bool:
    try:
        path, folder = path.resolve(), folder.resolve()
    except OSError:
        return False
    return path == folder or folder in path.parents


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
        self.project: Project | None = None
        self._closing = False

        self.device_tab = DeviceTab()
        self.dataset_tab = DatasetTab()
        self.hyper_tab = HyperTab()
        self.training_tab = TrainingTab(self)
        self.chat_tab = ChatTab(self)
        self.export_tab = ExportTab(self)
        self.tabs = ScrollingTabs()
        for w, name in ((self.device_tab, "Device"), (self.dataset_tab, "Dataset"),
                        (self.hyper_tab, "Hyperparameters"), (self.training_tab, "Training"),
                        (self.chat_tab, "Chat"), (self.export_tab, "Export")):
            self.tabs.add_page(w, name)
        self.setCentralWidget(self.tabs)
        status = self.statusBar()  # there from the start, one line high: messages never shift the tabs
        status.setFixedHeight(status.fontMetrics().height() + 10)
        self.resize(1200, 860)

        self._autosave_timer = QTimer(self, singleShot=True, interval=800)
        self._autosave_timer.timeout.connect(self.save)

        self.device_tab.device_changed.connect(self._on_device_changed)
        self.dataset_tab.changed.connect(self._autosave_timer.start)
        self.hyper_tab.changed.connect(self._on_hyper_changed)
        self.hyper_tab.validity_changed.connect(lambda ok: self.training_tab.update_buttons())
        self.training_tab.model_saved.connect(self._on_model_saved)
        self.training_tab.running_changed.connect(self._on_training_running)
        self.export_tab.exported.connect(lambda d: self.statusBar().showMessage(f"exported {d['path']}", 8000))

        self._build_menu()
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

    # ----------------------------------------------------------------------------- menu
    def _build_menu(self) -> None:
        m = self.menuBar().addMenu("&File")

        def action(text, slot, shortcut=None):
            a = QAction(text, self)
            if shortcut is not None:
                a.setShortcut(shortcut)
            a.triggered.connect(slot)
            m.addAction(a)
            return a

        self.new_action = action("&New project", self._new_project_dialog, QKeySequence.StandardKey.New)
        self.open_action = action("&Open project…", self._open_project_dialog, QKeySequence.StandardKey.Open)
        self.recent_menu = m.addMenu("Open &recent")
        action("&Save", self.save, QKeySequence.StandardKey.Save)
        self.save_as_action = action("Save project &as…", self._save_as_dialog, QKeySequence.StandardKey.SaveAs)
        m.addSeparator()
        action("&Quit", self.close, QKeySequence.StandardKey.Quit)
        h = self.menuBar().addMenu("&Help")
        a = QAction("&About", self)
        a.triggered.connect(self._about)
        h.addAction(a)
        self._update_recent_menu()

    def _about(self) -> None:
        from core import __version__

        QMessageBox.about(self, APP_TITLE, f"<b>{APP_TITLE}</b> {__version__}<br>Train a tiny llama-style "
                          "language model from scratch on any OpenCL device, chat with it, export GGUF.")

    def recent_projects(self) -> list[str]:
        value = QSettings().value("project/recent", [])
        if isinstance(value, str):
            value = [value]
        return [p for p in (value or []) if isinstance(p, str)]

    def _remember(self, folder: Path) -> None:
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
            a.triggered.connect(lambda checked=False, path=p: self._open_with_message(path))
        self.recent_menu.setEnabled(bool(recent))

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
                self._set_project(new_project(project_dir))
                return
        else:
            last = QSettings().value("project/last", "", type=str)
            if last and is_project(last) and not _inside(Path(last), u) and self._try_open_initial(last):
                return
        if is_project(u) and self._try_open_initial(u):
            return
        if is_project(u) or (u / "dataset.json").exists():  # unreadable: keep it, start afresh beside it
            aside = u.with_name(f"untitled-unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
            try:
                os.replace(u, aside)
            except OSError as e:  # never write over it: better not to start
                raise SystemExit(f"{u}: unreadable project, and it cannot be moved aside ({e})") from None
            self._warn_soon("Untitled project", f"The untitled project could not be opened, so it was moved to "
                            f"{aside} (nothing was deleted) and a new untitled project was started.")
        self._set_project(new_project(u))

    def _set_project(self, project: Project, warnings: list[str] | None = None) -> None:
        self.project = project
        self.dataset_tab.set_dataset(project.dataset)
        hyper = project.settings.get("hyperparameters")
        if isinstance(hyper, dict):
            self.hyper_tab.set_state(hyper)
        else:
            self.hyper_tab.set_preset("Tiny")
        self._apply_sampling(project.settings.get("sampling"))
        export = project.settings.get("export")
        export = export if isinstance(export, dict) else {}
        self.export_tab.set_dtype(str(export.get("dtype", "f16")))
        self.export_tab.modelfile.setChecked(bool(export.get("modelfile", False)))
        path = str(export.get("path") or "")
        if not path or _inside(Path(path), data_dir()):  # never suggest the app's own data folder
            name = "model" if project.folder.resolve() == untitled_dir().resolve() else project.folder.name
            path = str(default_export_dir() / f"{name}.gguf")
        self.export_tab.path.setText(path)
        self.dataset_tab.set_limits(*self.hyper_tab.limits())
        self.chat_tab.set_trained_model(None)
        if project.has_checkpoint():
            self.chat_tab.set_trained_model(str(project.checkpoint_dir))
        self.export_tab.refresh()
        self.training_tab.show_project_state()
        self.save()
        self._remember(project.folder)
        self._update_title()
        for w in warnings or []:
            self.training_tab.append_log("WARNING", w)

    def _apply_sampling(self, s) -> None:
        if not isinstance(s, dict):
            return
        c = self.chat_tab
        for key, widget in (("temperature", c.temperature), ("top_k", c.top_k), ("top_p", c.top_p),
                            ("repetition_penalty", c.repetition), ("max_tokens", c.max_tokens)):
            if key in s:
                try:
                    widget.setValue(type(widget.value())(s[key]))
                except (TypeError, ValueError):
                    pass

    def _update_title(self) -> None:
        if self.project is None:
            self.setWindowTitle(APP_TITLE)
            return
        name = "Untitled" if self.is_untitled() else self.project.folder.name
        self.setWindowTitle(f"{name} — {APP_TITLE}")

    def is_untitled(self) -> bool:
        return self.project is not None and self.project.folder.resolve() == untitled_dir().resolve()

    def _busy(self) -> bool:
        return self.training_tab.is_running() or self.export_tab.is_exporting()

    def open_project(self, folder: str | os.PathLike) -> None:
        """Open a project folder (saving the current one first).

        Raises:
            ProjectError: not a project folder. RuntimeError: training or export is running.
        """
        if self._busy():
            raise RuntimeError("stop training or export before opening another project")
        project, warnings = load_project(folder)
        if self.project is not None:
            self.save()
        self._set_project(project, warnings)

    def save(self) -> None:
        """Write the current project (dataset and settings) to its folder now."""
        self._autosave_timer.stop()
        if self.project is None:
            return
        self.project.dataset = self.dataset_tab.dataset()
        sampling = self.chat_tab.settings()
        sampling.pop("seed", None)
        self.project.settings = {
            "hyperparameters": self.hyper_tab.state(),
            "sampling": sampling,
            "export": {"dtype": self.export_tab.dtype.currentData(), "modelfile": self.export_tab.modelfile.isChecked(),
                       "path": self.export_tab.path.text()},
        }
        try:
            save_project(self.project)
        except OSError as e:
            self.statusBar().showMessage(f"could not save the project: {e}", 10000)

    def save_project_as(self, folder: str | os.PathLike, replace: bool = False) -> None:
        """Copy the project (with its trained model) to ``folder`` and continue there.

        An untitled project's own files are then removed from the data folder (nothing else there).

        Raises:
            ProjectError: ``folder`` is inside the current project folder, holds files a project would
                overwrite, or holds another project and ``replace`` is False. RuntimeError: busy.
            OSError: writing failed.
        """
        if self._busy():
            raise RuntimeError("stop training or export before saving the project elsewhere")
        folder = Path(folder)
        old = self.project
        if check_save_as_target(old, folder) and not replace:
            raise ProjectError(f"{folder}: already holds a project")
        self.save()
        copy_checkpoint(old, folder)
        project = Project(folder, self.dataset_tab.dataset(), dict(old.settings))
        save_project(project)
        was_untitled = self.is_untitled()
        self._set_project(project)
        if was_untitled:  # the work now lives in the named folder: the next untitled one starts afresh
            remove_project_files(old.folder)

    def new_project(self) -> None:
        """Start a new untitled project with the example dataset. The untitled folder's project files
        (dataset, settings, trained model) are replaced; other files there are kept."""
        if self._busy():
            raise RuntimeError("stop training or export before starting a new project")
        self.save()
        u = untitled_dir()
        remove_project_files(u)
        self._set_project(new_project(u))

    def _open_with_message(self, folder: str) -> None:
        try:
            self.open_project(folder)
        except (ProjectError, RuntimeError) as e:
            dialogs.warn(self, "Open project", f"Could not open the project:\n{e}")

    def _open_project_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a project folder")
        if folder:
            self._open_with_message(folder)

    def _save_as_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Save the project into a folder")
        if not folder:
            return
        try:
            replace = check_save_as_target(self.project, folder)
        except ProjectError as e:
            dialogs.warn(self, "Save project as", str(e))
            return
        if replace and not dialogs.ask(self, "Save project as", f"{folder} already holds a project. Replace its "
                                       "dataset, settings and trained model with this project's?", yes="Replace"):
            return
        try:
            self.save_project_as(folder, replace=replace)
        except (OSError, RuntimeError, ProjectError) as e:
            dialogs.warn(self, "Save project as", str(e))

    def _new_project_dialog(self) -> None:
        u = untitled_dir()
        if is_project(u):
            if self.is_untitled():
                text = ("Discard the untitled project (its dataset, settings and trained model)? Use “Save project "
                        "as” to keep it.")
            else:
                text = (f"Start a new untitled project? This discards the earlier untitled project in {u} (its "
                        "dataset, settings and trained model); open it and use “Save project as” to keep it.")
            if not dialogs.ask(self, "New project", text + f"\n\nOther files in {u} are kept.", yes="Discard"):
                return
        try:
            self.new_project()
        except RuntimeError as e:
            dialogs.warn(self, "New project", str(e))

    # ----------------------------------------------------------------------------- studio API for the tabs
    def device_info(self):
        return self.device_tab.current()

    def has_cpu_device(self) -> bool:
        return any(d.kind == "CPU" for d in self.device_tab.devices)

    def switch_to_cpu(self) -> bool:
        ok = self.device_tab.select_cpu()
        if ok:
            self.statusBar().showMessage(f"switched to {self.device_info().label}", 8000)
        return ok

    def dataset_copy(self):
        return self.dataset_tab.dataset_copy()

    def configs(self):
        return self.hyper_tab.build()

    def base_model(self) -> str | None:
        """The GGUF file a new run starts from (Hyperparameters ▸ Start from), or None."""
        return self.hyper_tab.base_path()

    def train_blocker(self) -> str | None:
        """Why training cannot start now (for the button's tooltip), or None."""
        if self.device_info() is None:
            return "No OpenCL device: see the Device tab."
        error = self.hyper_tab.error_message()
        if error:
            return f"Fix the hyperparameters first: {error}"
        return None

    def can_train(self) -> bool:
        return self.train_blocker() is None

    def checkpoint_dir(self) -> Path:
        """The project's trained-model folder."""
        return self.project.checkpoint_dir if self.project is not None else untitled_dir() / "checkpoint"

    def new_run_dir(self) -> Path:
        """Where a new run saves until its first stage end (see gui.project)."""
        return self.project.new_run_dir() if self.project is not None else self.checkpoint_dir()

    def resume_dir(self) -> Path | None:
        """The checkpoint Resume continues, or None."""
        return self.project.resume_dir() if self.project is not None else None

    def trained_model_path(self) -> Path | None:
        if self.project is not None and self.project.has_checkpoint():
            return self.project.checkpoint_dir
        return None

    # ----------------------------------------------------------------------------- signals
    def _on_device_changed(self, info) -> None:
        self.hyper_tab.set_device(info)
        self.training_tab.update_buttons()

    def _on_hyper_changed(self) -> None:
        self.dataset_tab.set_limits(*self.hyper_tab.limits())
        self.training_tab.update_buttons()
        self._autosave_timer.start()

    def _on_model_saved(self, path: str) -> None:
        self.chat_tab.set_trained_model(path)
        self.export_tab.refresh()
        self.training_tab.update_buttons()

    def _on_training_running(self, running: bool) -> None:
        for a in (self.new_action, self.open_action, self.save_as_action):
            a.setEnabled(not running)
        self.recent_menu.setEnabled(not running and bool(self.recent_projects()))
        self.export_tab.refresh()

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
        stop_all()
        self.training_tab.plots.stop()
        self.save()
        settings = QSettings()
        settings.setValue("window/geometry", self.saveGeometry())
        settings.setValue("window/state", self.saveState())
        settings.setValue("window/tab", self.tabs.currentIndex())

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt API
        self.shutdown()
        event.accept()
