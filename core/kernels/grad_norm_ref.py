"""Numpy reference of the deterministic sums of ``grad_norm.cl`` (gradient norms, loss sum).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_grad_norm.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``grad_norm.py`` with it.
"""
from __future__ import annotations

import numpy as np


def sum_squares(x: np.ndarray) -> float:
    """x (n) -> sum(x^2) in float64."""
    x = x.astype(np.float64)
    return float(np.dot(x, x))


def sum_(x: np.ndarray) -> float:
    """x (n) -> sum(x) in float64."""
    return float(x.astype(np.float64).sum())
