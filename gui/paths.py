"""Where the app keeps its things: the data folder with the untitled project, the export folder it
suggests. Below gui.app and gui.main_window, which both use it.
"""
from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "OPENCL_LLM_STUDIO_DATA"  # overrides the data folder (and, see gui.app, the settings)


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
    """The untitled project's folder (inside :func:`data_dir`)."""
    return data_dir() / "untitled"


EXPORTS = "exports"  # a project's own export folder, beside its dataset and checkpoint
FALLBACK_EXPORTS = "opencl-llm-exports"  # in the home folder, when there is no Documents folder


def default_export_dir(project_folder: Path | None = None) -> Path:
    """Where the Export tab suggests writing (the export creates the folder).

    A saved project's own ``exports/`` folder. The untitled project lives inside the app's data folder,
    which "New project" replaces, so it gets the last export folder, else Documents, else
    ``~/opencl-llm-exports`` — never the home folder itself, where an export would be lost among the
    user's files.
    """
    if project_folder is not None and not inside(Path(project_folder), data_dir()):
        return Path(project_folder) / EXPORTS
    from PySide6.QtCore import QSettings  # here: gui.app imports this module before Qt is needed

    last = QSettings().value("export/folder", "", type=str)
    if last and Path(last).is_dir():
        return Path(last)
    import platformdirs

    docs = platformdirs.user_documents_dir()
    if docs and Path(docs).is_dir() and Path(docs).resolve() != Path.home().resolve():
        return Path(docs)
    return Path.home() / FALLBACK_EXPORTS


def inside(path: Path, folder: Path) -> bool:
    """True when ``path`` is ``folder`` or lies in it (False when either cannot be resolved)."""
    try:
        path, folder = path.resolve(), folder.resolve()
    except OSError:
        return False
    return path == folder or folder in path.parents
