"""Numpy reference of the residual add (``residual.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_residual.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``residual.py`` with it.
"""
from __future__ import annotations

import numpy as np


def residual_forward(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (n), b (n) -> a + b."""
    return (a.astype(np.float64) + b).astype(np.float32)
