"""Replaying one decode step's kernel launches instead of running its Python again.

A decode step (one new token through the whole model, core/generate.py) is the same launches every
token: the same kernels, sizes and buffers; only the position moves (RoPE's angle, the row of the KV
cache written, the number of keys attended). Its Python, though — the launchers choosing kernels and
packing arguments, about 20 launches per layer — costs more than the device's work on a small model
(about 0.3 of 0.42 ms per token for the default model on a 2-core CPU). So, as CUDA Graphs and
llama.cpp's reuse of its ggml graph between tokens do, the step is recorded
(:meth:`core.device.Device.recording`) and from then on replayed: each launch on its own copy of the
kernel (:meth:`core.device.Device.kernel_copy`) whose arguments are set once, and per token only the
arguments that follow the position are set again.

Which arguments follow the position is read from two recordings of consecutive positions ``p`` and
``p + 1``: the launches must match one for one (kernel, global and local size, every buffer), and an
argument that differs must be an integer that grew by exactly one (``pos + constant``); otherwise the
step is not replayable and is run as before. The contract for a launcher used in decode is therefore:
an integer argument depends on the position as ``pos + constant`` or not at all
(tests/test_generate.py checks replayed logits against the plain forward over whole contexts).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.device import Device

log = logging.getLogger(__name__)

Launch = tuple  # (cl.Kernel, global_size, local_size, args): core.device.Device.recording's entries


def _pos_args(first: list[Launch], second: list[Launch]) -> list[list[tuple[int, int]]] | str:
    """Per launch, ``[(argument index, its value in second)]`` of the arguments that grew by one
    from ``first`` (position p) to ``second`` (p + 1); or why the two are not the same step (a string)."""
    if len(first) != len(second):
        return f"{len(first)} launches, then {len(second)}"
    out = []
    for n, ((k1, g1, l1, a1), (k2, g2, l2, a2)) in enumerate(zip(first, second)):
        if k1 is not k2 or g1 != g2 or l1 != l2 or len(a1) != len(a2):
            return f"launch {n} ({k1.function_name}) differs in its kernel or sizes"
        moved = []
        for i, (x, y) in enumerate(zip(a1, a2)):
            if x is y or (type(x).__name__ == "LocalMemory" and type(y) is type(x) and x.size == y.size):
                continue
            ints = isinstance(x, (int, np.integer)) and isinstance(y, (int, np.integer))
            if ints and int(y) - int(x) == 1:
                moved.append((i, int(y)))
            elif not (ints or isinstance(x, (float, np.floating))) or x != y:
                return f"launch {n} ({k1.function_name}) argument {i} is not the same or pos + constant"
        out.append(moved)
    return out


class Replay:
    """A recorded step, replayable at any position.

    Args:
        dev: the device the launches were recorded on.
        launches: the step's launches at position ``pos0`` (:meth:`core.device.Device.recording`).
        pos_args: per launch, ``[(argument index, its value at pos0)]`` of the arguments that follow the
            position (:func:`_pos_args`).
        pos0: the position of ``launches``.
    """

    def __init__(self, dev: Device, launches: list[Launch], pos_args: list[list[tuple[int, int]]], pos0: int):
        self.dev = dev
        self._steps = []
        for (kernel, global_size, local_size, args), moved in zip(launches, pos_args):
            own = dev.kernel_copy(kernel)
            own.set_args(*args)
            # args kept: a kernel object does not hold its buffers alive
            self._steps.append((own, global_size, local_size, [(i, v - pos0) for i, v in moved], kernel.function_name,
                                args))

    def __len__(self) -> int:
        return len(self._steps)

    def run(self, pos: int) -> None:
        """Enqueue the step at position ``pos`` (asynchronous, on the device's queue)."""
        dev = self.dev
        enqueue, queue = dev.cl.enqueue_nd_range_kernel, dev.queue
        for kernel, global_size, local_size, moved, name, _ in self._steps:
            for i, offset in moved:
                kernel.set_arg(i, np.int32(pos + offset))
            evt = enqueue(queue, kernel, global_size, local_size)
            if dev.profiling:
                dev._events.append((name, evt))


class StepReplayer:
    """Runs a repeated step (a callable taking the position) through :class:`Replay` once two
    consecutive positions have been recorded and matched; until then, and for good when
    ``max_tries`` pairs did not match (logged), the step itself runs.

    Args:
        dev: the device.
        max_tries: pairs of recordings tried before giving up.
    """

    def __init__(self, dev: Device, max_tries: int = 3):
        self.dev, self.max_tries = dev, max_tries
        self.replay: Replay | None = None
        self._last: tuple[int, list[Launch]] | None = None
        self._tries = 0

    def __call__(self, pos: int, step: Callable[[int], None]) -> None:
        """Run ``step(pos)``, or its replay at ``pos``."""
        if self.replay is not None:
            self.replay.run(pos)
            return
        if self._tries >= self.max_tries:
            step(pos)
            return
        with self.dev.recording() as launches:
            step(pos)
        last, self._last = self._last, (pos, launches)
        if last is None or last[0] != pos - 1:
            return
        self._tries += 1
        moved = _pos_args(last[1], launches)
        if isinstance(moved, str):
            log.info("decode step not replayable (%s)%s", moved,
                     "; running it as is" if self._tries >= self.max_tries else "")
            return
        self.replay, self._last = Replay(self.dev, launches, moved, pos), None
