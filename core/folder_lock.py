"""One writer per folder: a lock file beside the folder naming its holder (pid, host, start time).

The lock of ``DIR`` is the file ``.DIR.lock`` in DIR's parent (beside it, not in it, because a
checkpoint folder is replaced as a whole by :func:`core.atomic.replace_folder`). It holds one JSON line
``{"pid": ..., "host": ..., "started": ..., "proc_start": ..., "what": ...}`` and is created in one
step (written to a temp file, then hard-linked to its name, which fails if it exists), so it is never
seen half written.

A lock whose holder is gone (same host, pid no longer running, or running but started at another time
— a reused pid) is stale and taken over. A folder is also busy when a folder above it or one directly
inside it is locked by another live process, so the app holding a project and ``opencl-llm train
--out PROJECT/checkpoint`` exclude each other. The same process may lock a folder again (re-entrant).

Why not the ``filelock`` library: its ``FileLock`` (flock) records no holder, so a refusal could not
name the holder's pid and program; its ``SoftFileLock`` records a pid but not what the holder does, and
neither sees a lock of a folder above or inside, nor tells a reader who holds a folder without taking
it (:func:`live_holder`, which ``core.checkpoint.load_checkpoint`` asks before recovering a folder).

This module imports nothing of the project but :mod:`core.atomic`.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from core.atomic import _pid_alive


class FolderBusyError(RuntimeError):
    """Another live process holds the folder (or a folder above or inside it)."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock: process id, host name, start time (Unix seconds) and what it does."""

    pid: int
    host: str
    started: float
    proc_start: str
    what: str
    path: Path

    def describe(self) -> str:
        """One line, e.g. ``process 1234 on host 'box' ('opencl-llm train', since 2026-12-01 19:40:02)``."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started)) if self.started else "?"
        return f"process {self.pid} on host {self.host!r} ({self.what or 'unknown program'}, since {when})"


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _resolved(folder: str | os.PathLike) -> Path:
    """``folder`` with links and ``..`` resolved (as the OS walks them): every spelling of one folder, a link to
    it included, has one lock.

    Raises:
        ValueError: ``folder`` is the root folder (nothing to put a lock beside).
    """
    folder = Path(os.path.realpath(folder))
    if not folder.name:
        raise ValueError(f"{folder}: the root folder cannot be locked or written as a whole; choose a folder in it")
    return folder


def lock_path(folder: str | os.PathLike) -> Path:
    """``.NAME.lock`` beside ``folder`` (links and ``..`` resolved)."""
    folder = _resolved(folder)
    return folder.with_name(f".{folder.name}.lock")


def _proc_start(pid: int) -> str:
    """The kernel's start time of ``pid`` (Linux /proc; '' elsewhere): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def read_holder(path: Path) -> LockHolder | None:
    """The holder recorded in lock file ``path``, or None when there is none or it is unreadable."""
    try:
        if path.stat().st_size > 4096:
            return None
        d = json.loads(path.read_text("utf-8"))
        return LockHolder(int(d["pid"]), str(d["host"]), float(d.get("started", 0)), str(d.get("proc_start", "")),
                          str(d.get("what", "")), path)
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


APP_HOLDER = "OpenCL LLM Studio"
"""``what`` of the app's lock of an open project (gui.project.lock_project)."""

EMPTY = "an empty lock file"
"""``LockHolder.what`` of an empty lock file under a minute old (being written; respected, not taken over)."""

FOREIGN = "not a lock file this app can read"
"""``LockHolder.what`` of a lock file that holds something else than a lock record (never removed)."""


def _unreadable(p: Path) -> LockHolder | None:
    """The holder to respect for lock file ``p`` that :func:`read_holder` cannot read: an empty one younger than
    a minute is being written (the exclusive-create fallback of :func:`_link`); an empty older one is stale
    (None: taken over); one with text in it the app did not write, a folder or a link is never removed
    (:data:`FOREIGN`)."""
    try:
        st = os.lstat(p)
    except OSError:
        return None
    if st.st_size or not stat.S_ISREG(st.st_mode):
        return LockHolder(0, "?", st.st_mtime, "", FOREIGN, p)
    return LockHolder(0, "?", st.st_mtime, "", EMPTY, p) if time.time() - st.st_mtime < 60 else None


def _mine(h: LockHolder) -> bool:
    return h.pid == os.getpid() and h.host == socket.gethostname()


def _is_live(h: LockHolder) -> bool:
    if h.host != socket.gethostname():
        return True  # another machine's lock on a shared folder: cannot check, so respect it
    if h.pid == os.getpid():
        return True
    if not _pid_alive(h.pid):
        return False
    now = _proc_start(h.pid)
    return not (h.proc_start and now and now != h.proc_start)


def live_holder(folder: str | os.PathLike, include_self: bool = False) -> LockHolder | None:
    """The live process (not this one, unless ``include_self``) that holds ``folder``, a folder above
    it, or a folder directly inside it; None when it is free. Stale locks are ignored (and left for
    :class:`FolderLock`)."""
    folder = Path(os.path.realpath(folder))
    candidates = [lock_path(a) for a in [folder, *folder.parents] if a.name]
    if folder.is_dir():
        try:
            candidates += [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".lock")]
        except OSError:
            pass
    for p in candidates:
        if not p.is_file():
            continue
        h = read_holder(p)
        if h is None:  # empty (being created, or cut by a crash) or not a lock of this app
            u = _unreadable(p)
            if u is not None:
                return u
            continue
        if _mine(h):
            if include_self:
                return h
            continue
        if _is_live(h):
            return h
    return None


def _write(path: Path, record: str, lock: Path, exclusive: bool = False) -> None:
    """Write ``record`` to ``path`` (``exclusive``: only if it does not exist, else FileExistsError). Any
    other OSError (a full disk) removes the part written and is one line naming ``lock``."""
    try:
        if not exclusive:
            path.write_text(record, "utf-8")
        else:
            with open(path, "x", encoding="utf-8") as fh:
                fh.write(record)
    except FileExistsError:
        raise
    except OSError as e:
        _remove(path)
        raise OSError(e.errno, f"cannot write the lock file {lock}: {e.strerror or e}") from None


def _link(tmp: Path, lock: Path, record: str) -> bool:
    """Give the written ``tmp`` the name ``lock`` in one step (a hard link, so it is never seen half
    written); False when ``lock`` exists. Where there are no hard links, an exclusive create instead."""
    try:
        os.link(tmp, lock)
    except FileExistsError:
        return False
    except OSError:
        try:
            _write(lock, record, lock, exclusive=True)
        except FileExistsError:
            return False
    return True


NAME_KEPT = 200
"""Characters of a lock's name kept in the names of its temp and set-aside files (a name near the file system's
255 would otherwise be too long for them)."""


def _take_over(lock: Path, seen: os.stat_result) -> None:
    """Remove the stale lock file ``lock`` that was judged from ``seen`` (its ``lstat``), and only that file: two
    processes taking over one stale lock at once each removed it and then each other's new lock, so both held
    the folder. It is renamed aside first (one step: of two such renames one gets it, the other nothing); what
    was renamed is removed where it is the file judged (same inode), else it is a lock another process took
    meanwhile and is put back."""
    aside = lock.with_name(f"{lock.name[:NAME_KEPT]}.{secrets.token_hex(4)}.stale")
    try:
        os.rename(lock, aside)
    except OSError:
        return  # taken over (or given back) meanwhile: the caller tries again
    try:
        got = os.lstat(aside)
    except OSError:
        return
    if (got.st_ino, got.st_dev) != (seen.st_ino, seen.st_dev):
        try:
            os.link(aside, lock)  # another process's new lock: give it back
        except OSError:
            pass  # a third process has taken the name since: the caller finds it live
    _remove(aside)


class FolderLock:
    """Hold ``folder`` for writing, as a context manager or with :meth:`acquire` / :meth:`release`.

    Args:
        folder: the folder to hold (it need not exist yet; its parent is created).
        what: what the holder does, shown to whoever is refused (e.g. ``"opencl-llm train"``).

    Raises (from acquire):
        FolderBusyError: another live process holds it; the message names the holder and the lock file.
        OSError: the lock file cannot be written.
    """

    def __init__(self, folder: str | os.PathLike, what: str = ""):
        self.folder = _resolved(folder)
        self.path = lock_path(self.folder)
        self.what = what
        self._held = False
        self._reentrant = False

    def acquire(self) -> "FolderLock":
        """Take the lock (see the class); returns self."""
        holder = live_holder(self.folder)
        if holder is not None:
            raise self._busy(holder)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mine = read_holder(self.path)
        if mine is not None and _mine(mine):
            self._held, self._reentrant = True, True
            return self
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                             "proc_start": _proc_start(os.getpid()), "what": self.what}) + "\n"
        tmp = self.path.with_name(f"{self.path.name[:NAME_KEPT]}.{secrets.token_hex(4)}.tmp")
        try:
            _write(tmp, record, self.path)
            for _ in range(5):
                if _link(tmp, self.path, record):
                    self._held = True
                    return self
                try:
                    seen = os.lstat(self.path)
                except FileNotFoundError:
                    continue  # given back meanwhile: try again (a lock not seen is never removed)
                old = read_holder(self.path)
                if old is not None and _is_live(old) and old.pid != os.getpid():
                    raise self._busy(old)
                if old is None and (u := _unreadable(self.path)) is not None:
                    raise self._busy(u)
                _take_over(self.path, seen)  # stale: a dead holder's lock (or an empty one)
            raise FolderBusyError(f"{self.folder}: another process keeps taking the lock {self.path}")
        finally:
            _remove(tmp)

    def _busy(self, holder: LockHolder) -> FolderBusyError:
        if holder.what == FOREIGN:
            return FolderBusyError(f"{self.folder}: its lock file {holder.path} cannot be read as a lock of this app "
                                   f"(not a lock file, or another user's); if no other program uses {self.folder.name}, "
                                   "move or rename the lock file, then try again")
        if holder.what == EMPTY:
            return FolderBusyError(f"{self.folder}: its lock file {holder.path} is empty and under a minute old (being "
                                   "written by another process, or left by one that was killed); try again in a minute")
        there = "" if holder.host == socket.gethostname() else \
            "; if no process on that host uses it any more (a renamed or restarted machine), remove the lock file"
        what = "close the project in the app, or use the app's own Export tab" if holder.what == APP_HOLDER else \
            "wait for it to finish or stop it"
        return FolderBusyError(f"{self.folder}: in use by {holder.describe()}; {what} (lock file {holder.path}){there}")

    def release(self) -> None:
        """Give the lock back (only if this process holds it)."""
        if not self._held:
            return
        self._held = False
        if self._reentrant:
            return
        h = read_holder(self.path)
        if h is not None and _mine(h):
            _remove(self.path)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._held

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["FolderLock", "FolderBusyError", "LockHolder", "live_holder", "lock_path", "read_holder"]
