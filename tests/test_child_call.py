"""core.child_call: a function computed in a child process (the Dataset tab's token counts)."""
from __future__ import annotations

import os
import time

import pytest

from core.child_call import ChildError, ChildFailed, call_in_child
from core.dataset import Dataset
from core.estimates import dataset_stats


def _sleep_then(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


def _raise_value_error(message: str) -> None:
    raise ValueError(message)


def _die() -> None:
    os._exit(7)  # as if killed: no answer, no exception


def _pid() -> int:
    return os.getpid()


def test_the_answer_comes_from_another_process_and_equals_the_direct_call():
    ds = Dataset(["The heron nests by the old mill.", "Copper turns green in the rain."],
                 [])
    assert call_in_child(_pid) != os.getpid()
    assert call_in_child(dataset_stats, ds, 300, 64) == dataset_stats(ds, 300, 64)


def test_the_childs_exception_is_raised_here_with_its_type_and_message():
    with pytest.raises(ValueError, match="^line 3: no text$"):
        call_in_child(_raise_value_error, "line 3: no text")


class _TwoArgumentError(Exception):
    def __init__(self, field: str, problem: str) -> None:  # pickles, but cannot be rebuilt from its args
        super().__init__(f"{field}: {problem}")


def _raise_two_argument_error() -> None:
    raise _TwoArgumentError("lr", "must be positive")


def _raise_opencl_error() -> None:
    import pyopencl as cl

    raise cl.LogicError(cl._cl._ErrorRecord("clCreateBuffer", -61, "buffer size is zero"))


@pytest.mark.parametrize("fn, message", [(_raise_two_argument_error, "_TwoArgumentError: lr: must be positive"),
                                         (_raise_opencl_error, "LogicError: clCreateBuffer failed: INVALID_BUFFER_SIZE - buffer size is zero")])
def test_an_exception_that_cannot_cross_keeps_its_name_and_message(fn, message):
    with pytest.raises(ChildError, match=message):
        call_in_child(fn)


def test_a_child_that_dies_without_answering_is_an_error_naming_its_exit_code():
    with pytest.raises(ChildFailed, match="_die ended without an answer.*exit code 7"):
        call_in_child(_die)


def test_stop_ends_the_child_at_once():
    t0 = time.perf_counter()
    asked = []

    def stop() -> bool:
        asked.append(time.perf_counter())
        return time.perf_counter() - t0 > 0.3

    assert call_in_child(_sleep_then, 60.0, 1, stop=stop) is None
    assert time.perf_counter() - t0 < 10.0  # not the child's 60 s
    assert len(asked) >= 2
