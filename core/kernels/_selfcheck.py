"""What each op's ``selfcheck`` (in its numpy twin, ``core/kernels/<op>_ref.py``) shares: random
float32 inputs, the largest error of a device buffer against a reference, and the result row.

One ``selfcheck(dev, op=None, rng=None)`` per op runs the launches the model makes on small odd
shapes; the Device tab's check (``core/selftest.py``) and the op's test
(``tests/test_kernel_<op>.py``) both call it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyopencl as cl

    from core.device import Device


@dataclass(frozen=True)
class Check:
    """One launch compared with numpy: its name, the largest absolute (or, where the name says so,
    relative) error and the tolerance it must meet."""

    name: str
    max_abs_err: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.max_abs_err) and self.max_abs_err <= self.tolerance)


class Inputs:
    """Random inputs on ``dev`` from ``rng`` (default seed 1234) and errors of downloaded results."""

    def __init__(self, dev: Device, rng: np.random.Generator | None = None):
        self.dev = dev
        self.rng = rng if rng is not None else np.random.default_rng(1234)

    def f32(self, *shape: int) -> np.ndarray:
        """Standard normal float32 of ``shape``."""
        return self.rng.standard_normal(shape).astype(np.float32)

    def ints(self, high: int, n: int) -> np.ndarray:
        """``n`` int32 in ``[0, high)``."""
        return self.rng.integers(0, high, n).astype(np.int32)

    def err(self, buf: cl.Buffer, want: np.ndarray) -> float:
        """max |download(buf) - want| over ``want``'s shape (float32 results)."""
        return float(np.abs(self.dev.download(buf, want.shape) - want).max())
