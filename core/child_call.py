"""Call a function in a child Python process, so that its Python work never holds this process's GIL.

The GUI counts a dataset's tokens after each edit (``core.estimates.dataset_stats``): seconds of pure
Python for 20,000 entries. In a thread of the GUI process that work holds the GIL, and each of Qt's
calls into Python (a search asks the model for every row's text) waited for it: a search typed while
the tokens were counted took 2.2 s on CI (0.7 s on this project's 2-core test machine without a count). A child process shares no GIL, and stopping it
is immediate (the process is terminated), where a thread can only be asked to stop.

The child is started with the ``spawn`` method (the only one on Windows, the default on macOS), so it
imports what ``fn`` needs afresh: about 0.4 s on a 2-core machine before ``fn`` starts. A frozen app
must call ``multiprocessing.freeze_support()`` first thing in its entry point.
"""
from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Callable
from typing import Any

POLL_S = 0.05  # how often the parent checks ``stop`` while it waits


class ChildFailed(RuntimeError):
    """The child process ended without an answer (killed, or crashed in native code)."""


class ChildError(RuntimeError):
    """An exception of the child that cannot cross to the parent as it is (pyopencl's errors do not pickle;
    an exception whose ``__init__`` takes other arguments than its ``args`` does not unpickle): its type's
    name and message."""


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives a pickle round trip, else a :class:`ChildError` naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any failure to pickle or rebuild
        return ChildError(f"{type(e).__name__}: {e}")


def _child_main(conn, fn: Callable[..., Any], args: tuple) -> None:
    """The child's side: ``("ok", fn(*args))`` or ``("error", exception)`` down ``conn``."""
    try:
        reply = ("ok", fn(*args))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        reply = ("error", _portable(e))
    try:
        conn.send(reply)
    except Exception as e:  # the result does not pickle
        conn.send(("error", ChildError(f"{fn.__name__}'s result cannot be sent back: {type(e).__name__}: {e}")))
    conn.close()


def call_in_child(fn: Callable[..., Any], *args: Any, stop: Callable[[], bool] = lambda: False) -> Any:
    """``fn(*args)`` computed in a child process; blocks until it answers (call it from a worker thread).

    Args:
        fn: a module-level function (it and ``args`` are pickled to the child, its result back).
        stop: polled every ``POLL_S`` seconds; once it returns True the child is terminated and
            ``None`` is returned.

    Returns:
        ``fn``'s return value, or ``None`` when stopped.

    Raises:
        whatever ``fn`` raised (the same exception type and message, re-raised here), or ChildError
            naming it where it cannot cross processes;
        ChildFailed: the child ended without an answer (e.g. killed by the system for memory).
    """
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(sender, fn, args), daemon=True, name=f"child:{fn.__name__}")
    try:
        child.start()  # pickles fn and args (spawn): may raise
    except BaseException:
        receiver.close()
        raise
    finally:
        sender.close()  # the child holds the only sending end: its death ends the pipe (EOFError below)
    answered = False
    try:
        while not receiver.poll(POLL_S):
            if stop():
                return None
        try:
            status, value = receiver.recv()
        except EOFError:
            child.join()
            raise ChildFailed(f"the process computing {fn.__name__} ended without an answer "
                              f"(exit code {child.exitcode})") from None
        answered = True
    finally:
        if not answered and child.is_alive():  # stopped, or this thread was interrupted
            child.terminate()
        child.join()
        receiver.close()
        child.close()
    if status == "error":
        raise value
    return value
