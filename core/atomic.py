"""Replacing a file all at once: write a temp file beside it, flush it to disk, ``os.replace`` it.

The lowest layer of ``core``: it imports nothing from the project, so any module may use it.
"""
from __future__ import annotations

import os
import tempfile
from os import PathLike
from pathlib import Path
from typing import BinaryIO, Callable


def atomic_write(path: str | PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(f)`` on a temp file in ``path``'s folder, fsync it, then rename it to ``path``.

    Either the whole new file is there afterwards or the old one is untouched (no temp file is left
    behind). A replaced file keeps its permission bits; a new one gets 0644 (mkstemp's 0600 would
    hide a data file from other users of the machine).

    Raises:
        OSError: the folder is not writable, the disk is full, ...; whatever ``write`` raises.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        except FileNotFoundError:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | PathLike, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_write`). Raises OSError."""
    data = text.encode("utf-8")
    atomic_write(path, lambda f: f.write(data))
