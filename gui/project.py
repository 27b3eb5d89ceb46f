"""A project is one folder: the dataset, the settings and the trained weights.

    DIR/project.json      format marker, hyperparameter form values, sampling and export settings
    DIR/dataset.json      the dataset (core.dataset's JSON format)
    DIR/training-history.json  the Training tab's runs: plots, recall tables, verdicts, log (gui.history)
    DIR/chat-transcript.json   the Chat tab's transcript (gui.history)
    DIR/checkpoint/       the trained model (core.checkpoint's folder), once training has saved one
    DIR/checkpoint.new/   a new run that has not finished a stage yet while an older model exists;
                          it replaces checkpoint/ at its first stage end (so stopping a new run early
                          never leaves a half-trained model in place of a finished one)

These are the project's own files: nothing else in the folder is ever written or deleted (the
user may keep exported GGUF files there: the Export tab writes them while the app holds the project; another
process's export into it waits until the project is closed, core.checkpoint_meta.export_target). No Qt here;
the main window reads and writes projects through these functions.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from core.atomic import atomic_write, backup_path, made_by_swap, recover_folder, swap_in_folder
from core.checkpoint_meta import CheckpointError, CheckpointMeta, has_checkpoint
from core.dataset import Dataset, default_dataset, load_dataset, save_dataset
from core.folder_lock import APP_HOLDER, FolderBusyError, FolderLock
from core.json_text import read_format_json
from gui.history import CHAT_FILE, HISTORY_FILE

FORMAT = "opencl-llm-studio-project"
VERSION = 1
PROJECT_FILES = ("project.json", "dataset.json", HISTORY_FILE, CHAT_FILE)
CHECKPOINT, PENDING = "checkpoint", "checkpoint.new"
PROJECT_DIRS = (CHECKPOINT, PENDING)


class ProjectError(ValueError):
    """A folder that is not a readable project, or cannot become one."""


def checkpoint_meta(folder: str | Path) -> CheckpointMeta | None:
    """The :class:`core.checkpoint.CheckpointMeta` of a checkpoint folder, or None when it has none or
    it is unreadable (see :func:`checkpoint_problem` for why)."""
    try:
        return CheckpointMeta.read(folder)
    except CheckpointError:
        return None


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why a checkpoint folder's config.json cannot be used (one line), or None when it can."""
    try:
        CheckpointMeta.read(folder)
    except CheckpointError as e:
        return str(e)
    return None


def lock_project(folder: str | Path) -> FolderLock:
    """Hold a project folder for this app (one writer per folder, see core.folder_lock).

    Raises:
        ProjectError: another process (another window of the app, ``opencl-llm train`` into one of its
            folders) holds it; the message names the holder.
    """
    try:
        lock = FolderLock(folder, APP_HOLDER).acquire()
    except FolderBusyError as e:
        raise ProjectError(str(e)) from None
    except OSError as e:
        raise ProjectError(f"{folder}: cannot write its lock file ({e.strerror or e})") from None
    recover_project(folder)
    return lock


def recover_project(folder: str | Path) -> None:
    """Finish what an interrupted save or :func:`promote_pending` left in a project folder (call it
    while holding the project's lock): a promotion cut between its renames (the old model aside, no
    ``checkpoint``) is finished when the pending run is complete, then each checkpoint folder's own
    leftovers are recovered (core.atomic.recover_folder: else the old model comes back).
    ``checkpoint.old`` is the aside name of builds before core.atomic.swap_in_folder."""
    folder = Path(folder)
    checkpoint, pending = folder / CHECKPOINT, folder / PENDING
    legacy_old = checkpoint.with_name(checkpoint.name + ".old")
    aside = [p for p in (backup_path(checkpoint), legacy_old) if p.is_dir()
             and (made_by_swap(p) or p == legacy_old)]  # (a user's own .checkpoint.bak is not ours to use)
    if aside and not checkpoint.exists() and has_checkpoint(pending):
        try:
            os.replace(pending, checkpoint)
        except OSError:
            pass
    if legacy_old.is_dir() and not checkpoint.exists():
        try:
            os.replace(legacy_old, checkpoint)
        except OSError:
            pass
    if legacy_old.is_dir() and checkpoint.exists():
        shutil.rmtree(legacy_old, ignore_errors=True)
    for name in PROJECT_DIRS:
        recover_folder(folder / name)


@dataclass
class Project:
    """What a project folder holds, in memory.

    Attributes:
        folder: the project folder.
        dataset: facts and dialogues.
        settings: ``{"hyperparameters": {...}, "sampling": {...}, "export": {...}}`` (GUI form values).
        history: ``{"runs": [...], "log": [...]}`` as read by gui.history.load_history (the Training tab's).
        chat: the Chat tab's transcript as read by gui.history.load_history.
    """

    folder: Path
    dataset: Dataset
    settings: dict = field(default_factory=dict)
    history: dict = field(default_factory=lambda: {"runs": [], "log": []})
    chat: list = field(default_factory=list)

    @property
    def checkpoint_dir(self) -> Path:
        """The trained model (used by Chat and Export)."""
        return self.folder / CHECKPOINT

    @property
    def pending_dir(self) -> Path:
        """A new run that has not replaced the trained model yet."""
        return self.folder / PENDING

    def has_checkpoint(self) -> bool:
        return has_checkpoint(self.checkpoint_dir)

    def has_pending(self) -> bool:
        return has_checkpoint(self.pending_dir)

    def new_run_dir(self) -> Path:
        """Where a new run saves until its first stage end: beside the trained model if there is one."""
        return self.pending_dir if self.has_checkpoint() else self.checkpoint_dir

    def resume_dir(self) -> Path | None:
        """The checkpoint that Resume continues (the unfinished new run first), or None."""
        for d in (self.pending_dir, self.checkpoint_dir):
            meta = checkpoint_meta(d)
            if meta is not None:
                return d if not meta.done else None
        return None


def is_project(folder: str | Path) -> bool:
    return (Path(folder) / "project.json").is_file()


def new_project(folder: str | Path) -> Project:
    """A project with the default dataset (not yet written)."""
    return Project(Path(folder), default_dataset(), {})


def load_project(folder: str | Path) -> tuple[Project, list[str]]:
    """Read a project folder.

    Returns:
        (project, warnings): warnings say what was substituted (a missing dataset file) or not read (a name
        given twice in a JSON object of dataset.json: its last value is read).

    Raises:
        ProjectError: no project.json, or it is not ours, unreadable or of a newer version (never opened, so
            never rewritten without its newer fields); dataset.json unreadable or
            with any entry that cannot be read (autosave would otherwise drop it from the file).
    """
    folder = Path(folder)
    meta_path = folder / "project.json"
    if not meta_path.is_file():
        raise ProjectError(f"{folder}: not a project folder (no project.json)")
    meta = read_format_json(meta_path, FORMAT, ProjectError, "project", max_version=VERSION)
    warnings: list[str] = []
    ds_path = folder / "dataset.json"
    if ds_path.is_file():
        try:
            dataset, problems = load_dataset(ds_path, warnings)  # (a name given twice: noted, not refused)
        except (OSError, ValueError) as e:
            raise ProjectError(str(e)) from None
        if problems:
            shown = "\n".join(map(str, problems[:10])) + (f"\n… and {len(problems) - 10} more"
                                                           if len(problems) > 10 else "")
            raise ProjectError(f"{ds_path}: the project's dataset has entries that cannot be read:\n{shown}")
    else:
        dataset = default_dataset()
        warnings.append(f"{ds_path}: missing, the default dataset is used")
    settings = meta.get("settings") if isinstance(meta.get("settings"), dict) else {}
    return Project(folder, dataset, settings), warnings


def save_project(project: Project) -> None:
    """Write project.json and dataset.json (atomically each). Raises OSError."""
    project.folder.mkdir(parents=True, exist_ok=True)
    save_dataset(project.dataset, project.folder / "dataset.json")
    meta = {"format": FORMAT, "version": VERSION, "settings": project.settings}
    atomic_write(project.folder / "project.json", json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def check_save_as_target(src: Project, target: str | Path) -> bool:
    """Check that ``src`` can be saved into ``target``.

    Returns:
        True when ``target`` already holds another project (which the copy replaces: ask first).

    Raises:
        ProjectError: ``target`` is the project's own folder or inside it, or it is not a project
            but already has files a project would overwrite.
    """
    target = Path(target)
    if _inside(target, src.folder):
        raise ProjectError(f"{target}: is inside the project's current folder {src.folder}; choose a folder "
                           "outside it")
    if target.exists() and not target.is_dir():
        raise ProjectError(f"{target}: exists and is not a folder")
    if is_project(target):
        return True
    clash = project_files_in(target)
    if clash:
        raise ProjectError(f"{target}: already contains {', '.join(clash)}; choose an empty folder")
    return False


def project_files_in(folder: str | Path) -> list[str]:
    """Names of the project files and folders that exist in ``folder`` (a new project there would
    overwrite them)."""
    return [n for n in PROJECT_FILES + PROJECT_DIRS if (Path(folder) / n).exists()]


def copy_checkpoint(src: Project, dst_folder: str | Path) -> None:
    """Copy ``src``'s checkpoint folders and history files into ``dst_folder`` (for "Save project as");
    the target's own ones (of the project being replaced there) are removed first."""
    dst_folder = Path(dst_folder)
    dst_folder.mkdir(parents=True, exist_ok=True)
    for name in (HISTORY_FILE, CHAT_FILE):
        s, d = src.folder / name, dst_folder / name
        if s.resolve() == d.resolve():
            continue
        if s.is_file():
            atomic_write(d, s.read_bytes())
        elif d.exists():
            d.unlink()
    for name in PROJECT_DIRS:
        s, d = src.folder / name, dst_folder / name
        if s.resolve() == d.resolve():
            continue
        if d.exists():
            shutil.rmtree(d)
        if has_checkpoint(s):
            shutil.copytree(s, d)


def remove_project_files(folder: str | Path) -> None:
    """Delete a project's own files (project.json, dataset.json, checkpoint folders) and nothing else;
    the folder itself goes only when that leaves it empty."""
    folder = Path(folder)
    for name in PROJECT_DIRS:
        shutil.rmtree(folder / name, ignore_errors=True)
    for name in PROJECT_FILES:
        try:
            (folder / name).unlink()
        except FileNotFoundError:
            pass
    try:
        folder.rmdir()
    except OSError:  # not empty (other files are the user's) or already gone
        pass


def promote_pending(pending: str | Path, checkpoint: str | Path) -> None:
    """Make a new run's checkpoint the trained model: ``pending`` replaces ``checkpoint``
    (core.atomic.swap_in_folder: the old model is renamed aside first and deleted last, so an
    interruption leaves one complete model under one of the two names; :func:`recover_project` then
    promotes the pending run if it is complete).

    Raises:
        OSError: a rename failed; the old model is still the trained one.
    """
    swap_in_folder(pending, checkpoint)
