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


def default_export_dir() -> Path:
    """Where the Export tab suggests writing: the last export folder, else Documents, else home (never
    inside the app's data folder, whose untitled project is replaced by "New project")."""
    from PySide6.QtCore import QSettings  # here: gui.app imports this module before Qt is needed

    last = QSettings().value("export/folder", "", type=str)
    if last and Path(last).is_dir():
        return Path(last)
    import platformdirs

    docs = platformdirs.user_documents_dir()
    return Path(docs) if docs and Path(docs).is_dir() else Path.home()


def inside(path: Path, folder: Path) -> bool:
    """True when ``path`` is ``folder`` or lies in it (False when either cannot be resolved)."""
    try:
        path, folder = path.resolve(), folder.resolve()
    except OSError:
        return False
    return path == folder or folder in path.parents
