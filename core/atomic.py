"""Crash-safe writes: one file (temp file + fsync + rename) or one whole folder (SQLite-style swap).

This module imports nothing of the project, so every other module may use it.

A file: :func:`atomic_write` writes ``.NAME.<random>.tmp`` beside ``NAME``, fsyncs it, renames it over
``NAME`` and fsyncs the folder. Afterwards the new file is there, or (after a crash, a full disk, an
exception) the old file is untouched; a crash may leave the ``.tmp`` file, which
:func:`remove_stale_temp_files` deletes on the next start.

A folder (a checkpoint, after SQLite's atomic commit): :func:`replace_folder` writes every file into
``.NAME.tmp-<host>-<pid>-<random>`` beside ``NAME``, fsyncs the files and the folder, renames the old
``NAME`` to ``.NAME.bak``, renames the new folder to ``NAME``, fsyncs the parent and only then deletes
``.NAME.bak``. A reader sees the old or the new folder, never a mix: :func:`readable_folder` returns
``.NAME.bak`` in the one moment between the two renames, and :func:`recover_folder` (run by the next
writer, or by a reader when no writer holds the folder) finishes or discards what an interrupted swap
left. Only what the swap itself made is ever taken for its leftovers: the temp folder and the old folder get
the file :data:`MARK` before they take those names (the new folder loses it once in place), so a user's own
``.NAME.bak`` or ``.NAME.tmp-old`` is never moved or deleted (a save beside one is refused), and a file
write's leftover matches ``.NAME.<8 hex digits>.tmp`` exactly.

Crash tests inject faults at each of these file operations from outside (tests/file_ops.py), so this
module holds no test hook.
"""
from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

MARK = ".opencl-llm-swap"
"""An empty file in a folder that a swap made or is moving (its temp folder, the old folder about to become
``.NAME.bak``): what tells the swap's own leftovers from a user's folders of the same names."""

_TEMP_SUFFIX = r"\.[0-9a-f]{8}\.tmp"  # after ".NAME": secrets.token_hex(4), then ".tmp"
_TEMP_FILE = re.compile(rf"^\..+{_TEMP_SUFFIX}$")
"""The name :func:`atomic_path` gives its temporary file (``secrets.token_hex(4)``)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_folder(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (new, renamed, removed files) to disk; a no-op where folders cannot be
    opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike, sync_folder: bool = True) -> Iterator[Path]:
    """Replace ``path`` in one step with what the ``with`` block writes to the temporary path it gets.

    For writers that want a file name (gguf-py's ``GGUFWriter``); :func:`atomic_write` takes the data
    itself. The block writes ``.NAME.<random>.tmp`` beside ``NAME`` (it may read it back to verify);
    when the block ends without an exception the file is fsynced, renamed over ``NAME`` and the
    folder fsynced, else it is removed and ``path`` untouched. Where ``path`` is a symbolic link the link
    stays and the file it points to is replaced (as ``cp`` and editors write through a link).

    Args:
        path: the file to write; its folder must exist.
        sync_folder: also fsync the folder so the rename itself survives a power cut.

    Raises:
        OSError: the folder is not writable (on entering), the disk is full, ...; the old file is
            untouched and the temporary file removed. Whatever the block raises, likewise.
    """
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 & ~_umask() if os.name != "nt" else 0o666))
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        try:
            os.chmod(tmp, path.stat().st_mode & 0o7777)  # keep the permissions of the file it replaces
        except FileNotFoundError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_folder:
        try:
            fsync_folder(path.parent)
        except OSError:
            pass  # the new file is in place; only the durability of its name is in doubt


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable, sync_folder: bool = True) -> Path:
    """Replace ``path`` with new content in one step: the whole new file or the old one, never a part
    (:func:`atomic_path` with the data written into it).

    Args:
        path: the file to write; its folder must exist.
        data: bytes, a str (written as UTF-8), or a function ``write(binary_file)`` that writes it.
        sync_folder: also fsync the folder so the rename itself survives a power cut.

    Returns:
        ``path`` as a Path.

    Raises:
        OSError: the folder is not writable, the disk is full, ...; the old file is untouched and the
            temporary file removed.
    """
    path = Path(path)
    with atomic_path(path, sync_folder) as tmp, open(tmp, "wb") as fh:
        if callable(data):
            data(fh)
        else:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def temp_files_of(path: str | os.PathLike) -> list[Path]:
    """The temporary files :func:`atomic_path` makes for ``path`` that are there now: ``.NAME.<8 hex>.tmp`` beside
    it (a user's ``.NAME.notes.tmp`` is not one)."""
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}{_TEMP_SUFFIX}$")
    try:
        return [p for p in path.parent.iterdir() if pattern.match(p.name) and p.is_file()]
    except OSError:
        return []


def remove_stale_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete the ``.NAME.<random>.tmp`` files an interrupted :func:`atomic_write` left in ``folder``.

    Returns:
        The files removed. Never raises for a file that cannot be removed.
    """
    out = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return out
    for p in entries:
        if _TEMP_FILE.match(p.name) and p.is_file():
            try:
                p.unlink()
                out.append(p)
            except OSError:
                pass
    return out


# ------------------------------------------------------------------------------------ folders
def backup_path(folder: str | os.PathLike) -> Path:
    """``.NAME.bak`` beside ``NAME``: the previous folder while a swap is under way (``.`` and ``x/..`` named by
    the folder they are)."""
    folder = Path(os.path.abspath(folder))
    return folder.with_name(f".{folder.name}.bak")


def _mark(folder: Path) -> None:
    """Put :data:`MARK` in ``folder`` (a swap's temp folder, or the old folder before it becomes the backup)."""
    os.close(os.open(folder / MARK, os.O_WRONLY | os.O_CREAT, 0o644))


def is_mark(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a swap's :data:`MARK`: an empty regular file of that name (a user's file of the same
    name with something in it, or a link, is theirs)."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except OSError:
        return False
    return p.name == MARK and stat.S_ISREG(st.st_mode) and st.st_size == 0


def _unmark(folder: Path) -> bool:
    """Remove :data:`MARK` from ``folder`` (the new folder once in place); whether there was one."""
    if not is_mark(folder / MARK):
        return False
    try:
        os.unlink(folder / MARK)
        return True
    except OSError:
        return False


def made_by_swap(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` (a ``.NAME.bak`` or ``.NAME.tmp-...``) is a swap's own: a folder, not a link to one,
    holding :data:`MARK` (:func:`is_mark`)."""
    return not os.path.islink(folder) and is_mark(Path(folder) / MARK)


def removable_backup(bak: Path) -> bool:
    """Whether ``.NAME.bak`` is the swap's (marked), or an empty folder (a swap killed after removing its mark
    and before the folder): either may be removed, the empty one losing nothing."""
    if made_by_swap(bak):
        return True
    try:
        return bak.is_dir() and not bak.is_symlink() and not any(bak.iterdir())
    except OSError:
        return False


def backup_in_the_way(folder: str | os.PathLike) -> Path | None:
    """``.NAME.bak`` of ``folder`` where it is there and not the swap's (:func:`removable_backup`), so a swap
    cannot put the old folder aside; None when the name is free or the swap's own."""
    bak = backup_path(folder)
    return bak if (bak.exists() or bak.is_symlink()) and not removable_backup(bak) else None


def _named_as_backup(folder: Path) -> bool:
    """Whether ``folder`` is itself ``.NAME.bak`` beside no ``NAME`` (a reader inside a cut save's backup, e.g.
    ``--model .`` from a shell left in it): its mark is what lets the next command put it back."""
    name = folder.name
    return name.startswith(".") and name.endswith(".bak") and len(name) > 5 and \
        not folder.with_name(name[1:-4]).exists()


def _remove_ours(folder: Path, strict: bool = False) -> None:
    """Delete a swap's folder, its :data:`MARK` only once all else is gone: one that cannot be removed whole
    stays recognisable as the swap's. ``strict``: raise the first failure (OSError naming the file), else
    leave what cannot be removed."""
    try:
        entries = [p for p in folder.iterdir() if p.name != MARK]
    except OSError:
        if strict:
            raise
        return
    for p in entries:
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError:
            if strict:
                raise
    try:
        if any(p.name != MARK for p in folder.iterdir()):
            return
        _unmark(folder)
        folder.rmdir()
    except OSError:
        if strict:
            raise


def _temp_prefix(folder: Path) -> str:
    return f".{folder.name}.tmp-"


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of ``folder`` (or of the nearest existing folder above it)
    allows: ``PC_NAME_MAX``, or 255 where the OS does not say (Windows, most file systems' limit)."""
    for p in (folder, *folder.parents):
        if p.is_dir():
            try:
                return int(os.pathconf(p, "PC_NAME_MAX"))
            except (AttributeError, OSError, ValueError):
                return 255
    return 255


def swap_name_problem(folder: str | os.PathLike) -> str | None:
    """Why :func:`replace_folder` cannot write beside ``folder``: its temp folder ``.NAME.tmp-HOST-PID-XXXXXX``, the
    longest name a swap writes, would be longer than the file system allows (:func:`_name_max`); None when it fits.
    One line naming ``folder`` and the longest name that fits. (A 245-character name trained a whole stage, then
    failed to save: "File name too long".)"""
    folder = Path(folder)
    longest = len(os.fsencode(f"{_temp_prefix(folder)}{_host()}-{'9' * 7}-{'0' * 6}"))  # pids have up to 7 digits
    limit = _name_max(folder.parent)
    if longest <= limit:
        return None
    fits = len(os.fsencode(folder.name)) - (longest - limit)
    return (f"{folder}: name too long for a save, which writes the new copy beside it first as .NAME.tmp-HOST-PID-..."
            f" ({longest} bytes, over this file system's {limit}); give a name of at most {max(fits, 0)} bytes")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    except OSError:
        return False
    return True


def _temp_owner_dead(name: str, prefix: str) -> bool:
    """Whether the process that made temp folder ``name`` (``<prefix><host>-<pid>-<rand>``) is gone."""
    parts = name[len(prefix):].rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return True
    host, pid = parts[0], int(parts[1])
    if host != _host():
        return False  # another machine's (a shared folder): not ours to judge
    return pid != os.getpid() and not _pid_alive(pid)


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40] or "host"


def readable_folder(folder: str | os.PathLike) -> Path:
    """The folder a reader should read: ``folder`` itself, or its ``.bak`` when a swap was cut
    between its two renames (the old, complete folder). Changes nothing on disk."""
    folder = Path(folder)
    if not folder.exists() and backup_path(folder).is_dir() and made_by_swap(backup_path(folder)):
        return backup_path(folder)
    return folder


def recover_folder(folder: str | os.PathLike) -> list[str]:
    """Finish or discard what an interrupted :func:`replace_folder` left beside ``folder``.

    - ``.NAME.bak`` and no ``NAME``: the swap was cut between its renames; the old folder is renamed back.
    - ``.NAME.bak`` and ``NAME``: the swap finished; the backup is deleted.
    - ``.NAME.tmp-...`` folders of processes that are gone: deleted (never a live writer's).
    - :data:`MARK` in ``NAME`` (a swap cut just before or after its renames): removed.
    - ``.X.<8 hex digits>.tmp`` files inside ``NAME`` (an interrupted file write): deleted.

    A ``.NAME.bak`` or ``.NAME.tmp-...`` folder without :data:`MARK` is the user's (a swap marks both before
    they take those names) and is left as it is; so is an empty temp folder's absence of one (it is removed:
    it holds nothing).

    Call it only while no other process writes the folder (hold its :class:`core.folder_lock.FolderLock`,
    or check that nobody does).

    Returns:
        One line per thing done (for the log). Never raises for what it cannot remove.
    """
    folder = Path(os.path.abspath(folder))  # (".": its name and siblings are those of the folder it is)
    done = []
    bak = backup_path(folder)
    if bak.is_dir() and not bak.is_symlink() and removable_backup(bak):
        if not folder.exists() and not made_by_swap(bak):  # empty: nothing to restore
            try:
                bak.rmdir()
            except OSError:
                pass
        elif not folder.exists():
            try:
                os.rename(bak, folder)
                fsync_folder(folder.parent)
                done.append(f"restored {folder} from the backup of an interrupted save")
            except OSError:
                pass
        else:
            _remove_ours(bak)
            done.append(f"removed {bak} (left by a save that had finished)")
    prefix = _temp_prefix(folder)
    try:
        siblings = list(folder.parent.iterdir())
    except OSError:
        siblings = []
    for p in siblings:
        if p.name.startswith(prefix) and p.is_dir() and _temp_owner_dead(p.name, prefix):
            try:
                empty = not any(p.iterdir())
            except OSError:
                continue
            if empty or made_by_swap(p):
                _remove_ours(p)
                done.append(f"removed {p} (an unfinished save)")
    if folder.is_dir() and not _named_as_backup(folder):
        _unmark(folder)
    for p in remove_stale_temp_files(folder) if folder.is_dir() else []:
        done.append(f"removed {p} (an unfinished file write)")
    return done


def replace_folder(folder: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Create or replace ``folder`` as one unit: ``write(temp_folder)`` fills a fresh sibling folder,
    which is then swapped in (see the module docstring).

    Args:
        folder: the folder to create or replace; its parent is created if needed.
        write: writes every file into the temp folder it is given (use :func:`atomic_write` with
            ``sync_folder=False`` or plain writes; each file is fsynced here afterwards).

    Returns:
        ``folder`` as a Path.

    Raises:
        OSError: anything the writes or renames raise (the old folder is then still in place, or
            restorable by :func:`recover_folder`); whatever ``write`` raises.
    """
    folder = Path(os.path.realpath(folder) if os.path.islink(folder) else os.path.abspath(folder))  # (a link stays)
    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists() and not folder.is_dir():
        raise OSError(errno.ENOTDIR, f"{folder}: exists and is not a folder")
    recover_folder(folder)
    tmp = folder.with_name(f"{_temp_prefix(folder)}{_host()}-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        tmp.mkdir()
        _mark(tmp)
        write(tmp)
        for p in sorted(tmp.iterdir()):
            if p.is_file():
                with open(p, "rb") as fh:
                    os.fsync(fh.fileno())
        fsync_folder(tmp)
        swap_in_folder(tmp, folder, recover=False)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def swap_in_folder(source: str | os.PathLike, folder: str | os.PathLike, recover: bool = True) -> Path:
    """Make the complete, fsynced folder ``source`` (a sibling of ``folder``) become ``folder``: the old
    ``folder`` is renamed to ``.NAME.bak``, ``source`` to ``NAME``, the parent fsynced, the backup deleted.
    :func:`replace_folder` ends with it; the app promotes a finished run's checkpoint with it.
    ``recover``: first finish what an interrupted swap left (:func:`recover_folder`).

    Returns:
        ``folder`` as a Path.

    Raises:
        OSError: a rename failed (the old folder is then back in place, or restorable by
            :func:`recover_folder`; ``source`` is still there); an old ``.NAME.bak`` cannot be removed
            (the message says which file and why); a ``.NAME.bak`` the app did not make is in the way
            (EEXIST; it is left as it is).
    """
    source = Path(source)
    folder = Path(os.path.realpath(folder) if os.path.islink(folder) else os.path.abspath(folder))  # (a link stays)
    if recover:
        recover_folder(folder)
    bak = backup_path(folder)
    theirs = backup_in_the_way(folder) is not None
    if theirs and folder.exists():  # (with no old folder to put aside, the name is not needed)
        raise OSError(errno.EEXIST, f"{bak}: a folder or file of that name is in the way of the save (the app "
                      f"names the old {folder.name} so while it puts the new one in place); move or rename it")
    if not theirs and bak.exists() and folder.exists():  # a finished save's backup recover_folder could not remove
        try:
            _remove_ours(bak, strict=True)
        except OSError as e:
            raise OSError(e.errno, f"cannot remove the old backup {bak} ({e.strerror or e}: "
                          f"{e.filename or bak}); remove it by hand") from None
    if folder.exists():
        _mark(folder)  # becomes the backup: marked as the swap's first
        os.rename(folder, bak)
    try:
        os.rename(source, folder)
    except BaseException:
        if made_by_swap(bak) and not folder.exists():
            os.rename(bak, folder)  # put the old one back
            _unmark(folder)
        raise
    try:  # the new folder is in place: what follows only tidies up, and may fail without harm
        fsync_folder(folder.parent)
        if removable_backup(bak):
            _remove_ours(bak)
        _unmark(folder)
    except OSError:
        pass  # a leftover .bak (or mark) is removed by the next recover_folder
    return folder


__all__ = ["MARK", "is_mark", "made_by_swap", "removable_backup", "backup_in_the_way", "atomic_write", "atomic_path", "replace_folder",
           "swap_in_folder", "recover_folder", "readable_folder", "backup_path", "remove_stale_temp_files", "temp_files_of",
           "fsync_folder"]
