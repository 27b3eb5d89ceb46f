"""Numpy reference of the deterministic sums of ``sums.cl`` (gradient norms, loss sum).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_sums.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``sums.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.sums import Sums


def sum_squares(x: np.ndarray) -> float:
    """x (n) -> sum(x^2) in float64."""
    x = x.astype(np.float64)
    return float(np.dot(x, x))


def sum_(x: np.ndarray) -> float:
    """x (n) -> sum(x) in float64."""
    return float(x.astype(np.float64).sum())


def selfcheck(dev: Device, op: Sums | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """The sum of squares of 5,000 elements (a gradient norm), relative error against
    :func:`sum_squares` (1e-5). ``op`` defaults to a new ``Sums(dev)``; the error is returned, not
    raised."""
    from core.kernels.sums import Sums

    op, t = op or Sums(dev), Inputs(dev, rng)
    x = t.f32(5000)
    o = dev.alloc(1)
    op.sum_squares(o, 0, dev.upload(x), x.size)
    want = sum_squares(x)
    return [Check("gradient norm (relative)", abs(float(dev.download(o, (1,))[0]) - want) / want, 1e-5)]
