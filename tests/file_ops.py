"""Crash injection for the crash tests: every file operation core/atomic.py makes is counted, and one of
them can be turned into a kill -9, a full disk or a double Ctrl-C. Production code knows nothing of it.

:func:`install` wraps the calls core/atomic.py makes (``os.open`` with ``O_CREAT``, ``open`` for
writing, ``os.fsync``, ``os.replace``/``os.rename``, ``Path.mkdir``, ``shutil.rmtree``); a call counts
only when core/atomic.py makes it itself (what numpy, pyopencl or shutil do inside is not counted).
Before operation N (1-based, counted from :func:`install` or :func:`reset_op_count`):

- ``OPENCL_LLM_CRASH_AT=N``: the process kills itself (SIGKILL, like ``kill -9``);
- ``OPENCL_LLM_CRASH_AT=enospc:N``: the call raises ``OSError(ENOSPC)`` instead (a full disk);
- ``OPENCL_LLM_CRASH_AT=sigint2:N``: the process gets two SIGINTs (a double Ctrl-C), then the call runs;
- ``OPENCL_LLM_CRASH_LOG=PATH``: one line per operation (its number and name) is appended to PATH.

The variables are read at each operation, so a forked child may set them (tests/crash_worker.py).
A command of ours under injection: ``python -m tests.file_ops core.cli train ...`` installs the
wrappers, then runs that module as ``__main__``.
"""
from __future__ import annotations

import builtins
import errno
import os
import pathlib
import runpy
import shutil
import signal
import sys

CRASH_ENV = "OPENCL_LLM_CRASH_AT"
CRASH_LOG_ENV = "OPENCL_LLM_CRASH_LOG"
_MODULE = "core.atomic"

_count = 0
_names: dict[int, str] = {}  # open descriptor -> the name its fsync is logged under
_installed = False


def reset_op_count() -> None:
    """Restart the operation count at 0 (a forked child counts its own save from 1)."""
    global _count
    _count = 0


def _short(path) -> str:
    p = pathlib.Path(os.fspath(path))
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def _op(name: str) -> None:
    """Count one operation; log it, and kill / fail / interrupt here when CRASH_ENV names it."""
    global _count
    _count += 1
    log = os.environ.get(CRASH_LOG_ENV)
    if log:
        with builtins.open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{_count} {name}\n")
    kind, _, n = os.environ.get(CRASH_ENV, "").rpartition(":")
    if not n.isdigit() or int(n) != _count:
        return
    if kind == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected before file operation {n}: {name})")
    if kind == "sigint2":
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _ours() -> bool:
    """Whether the wrapped call was made by core/atomic.py itself (two frames up: caller of the wrapper)."""
    try:
        return sys._getframe(2).f_globals.get("__name__") == _MODULE
    except ValueError:  # called from C with no Python caller
        return False


def _wrap(real, name_of):
    def wrapper(*args, **kw):
        if _ours():
            name = name_of(*args, **kw)
            if name:
                _op(name)
        return real(*args, **kw)

    return wrapper


def _open_wrapper(real_open):
    def os_open(path, flags, *args, **kw):
        ours = _ours()
        if ours and flags & os.O_CREAT:
            _op(f"create {_short(path)}")
        fd = real_open(path, flags, *args, **kw)
        if ours:
            _names[fd] = _short(path)
        return fd

    return os_open


def _file_open_wrapper(real_open):
    def file_open(file, mode="r", *args, **kw):
        ours = _ours()
        if ours and "w" in mode:
            _op(f"write {_short(file)}")
        fh = real_open(file, mode, *args, **kw)
        if ours and not isinstance(file, int):
            _names[fh.fileno()] = _short(file)
        return fh

    return file_open


def install() -> None:
    """Wrap the calls core/atomic.py makes (see the module docstring); once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    reset_op_count()
    rename = lambda src, dst, *a, **k: f"rename {pathlib.Path(src).name} -> {pathlib.Path(dst).name}"  # noqa: E731
    os.open = _open_wrapper(os.open)
    builtins.open = _file_open_wrapper(builtins.open)
    os.fsync = _wrap(os.fsync, lambda fd: f"fsync {_names.get(fd, fd)}")
    os.replace = _wrap(os.replace, rename)
    os.rename = _wrap(os.rename, rename)
    shutil.rmtree = _wrap(shutil.rmtree, lambda path, *a, **k: f"rmtree {pathlib.Path(path).name}")
    pathlib.Path.mkdir = _wrap(pathlib.Path.mkdir, lambda self, *a, **k: f"mkdir {self.name}")


def main(argv: list[str]) -> None:
    """``python -m tests.file_ops MODULE ARGS...``: run MODULE as ``__main__`` with the wrappers installed."""
    install()
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
