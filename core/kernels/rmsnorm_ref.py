"""Numpy reference of RMSNorm (``rmsnorm.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_rmsnorm.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``rmsnorm.py`` with it.
"""
from __future__ import annotations

import numpy as np


def rmsnorm_forward(x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """x (R, C), w (C) -> (y (R, C), rstd (R)); y = x / sqrt(mean(x^2) + eps) * w."""
    x64 = x.astype(np.float64)
    rstd = 1.0 / np.sqrt((x64 ** 2).mean(axis=1) + eps)
    return (x64 * rstd[:, None] * w).astype(np.float32), rstd.astype(np.float32)


def rmsnorm_backward(d_out: np.ndarray, x: np.ndarray, w: np.ndarray,
                     eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Gradients (d_x (R, C), d_w (C)) of sum(d_out * rmsnorm(x, w)), derived by hand in float64."""
    x64, g = x.astype(np.float64), d_out.astype(np.float64)
    c = x.shape[1]
    r = 1.0 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps)
    gw = g * w
    d_x = r * gw - r ** 3 / c * x64 * (gw * x64).sum(axis=1, keepdims=True)
    d_w = (g * x64 * r).sum(axis=0)
    return d_x.astype(np.float32), d_w.astype(np.float32)
