"""A project is one folder: the dataset, the settings and the trained weights.

    DIR/project.json   format marker, hyperparameter form values, sampling and export settings
    DIR/dataset.json   the dataset (core.dataset's JSON format)
    DIR/checkpoint/    the trained model (core.checkpoint's folder), once training has saved one

No Qt here; the main window reads and writes projects through these functions.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from core.dataset import Dataset, atomic_write_text, default_dataset, load_dataset, save_dataset

FORMAT = "opencl-llm-studio-project"
VERSION = 1


class ProjectError(ValueError):
    """A folder that is not a readable project."""


@dataclass
class Project:
    """What a project folder holds, in memory.

    Attributes:
        folder: the project folder.
        dataset: facts and dialogues.
        settings: ``{"hyperparameters": {...}, "sampling": {...}, "export": {...}}`` (GUI form values).
    """

    folder: Path
    dataset: Dataset
    settings: dict = field(default_factory=dict)

    @property
    def checkpoint_dir(self) -> Path:
        return self.folder / "checkpoint"

    def has_checkpoint(self) -> bool:
        return (self.checkpoint_dir / "config.json").is_file()


def is_project(folder: str | Path) -> bool:
    return (Path(folder) / "project.json").is_file()


def new_project(folder: str | Path) -> Project:
    """A project with the default dataset (not yet written)."""
    return Project(Path(folder), default_dataset(), {})


def load_project(folder: str | Path) -> tuple[Project, list[str]]:
    """Read a project folder.

    Returns:
        (project, warnings): warnings list dataset entries that could not be read.

    Raises:
        ProjectError: no project.json, or it is not ours or unreadable.
    """
    folder = Path(folder)
    meta_path = folder / "project.json"
    if not meta_path.is_file():
        raise ProjectError(f"{folder}: not a project folder (no project.json)")
    try:
        meta = json.loads(meta_path.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise ProjectError(f"{meta_path}: unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ProjectError(f"{meta_path}: not an OpenCL LLM Studio project")
    warnings: list[str] = []
    ds_path = folder / "dataset.json"
    if ds_path.is_file():
        try:
            dataset, problems = load_dataset(ds_path)
        except (OSError, ValueError) as e:
            raise ProjectError(str(e)) from None
        warnings = [str(p) for p in problems]
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
    atomic_write_text(project.folder / "project.json", json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


def copy_checkpoint(src: Project, dst_folder: str | Path) -> None:
    """Copy ``src``'s checkpoint folder into ``dst_folder`` (for "Save project as")."""
    dst = Path(dst_folder) / "checkpoint"
    if src.has_checkpoint() and src.checkpoint_dir.resolve() != dst.resolve():
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src.checkpoint_dir, dst)
