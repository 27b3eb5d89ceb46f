"""Numpy reference of the AdamW step (``adamw.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_adamw.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``adamw.py`` with it.
"""
from __future__ import annotations

import numpy as np


def adamw_step(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float, step: int,
               grad_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One AdamW step (Loshchilov & Hutter 2019) in float64 -> new (p, m, v) as float64."""
    p, g, m, v = (np.asarray(a, np.float64) for a in (p, g, m, v))
    g = g * grad_scale
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mhat = m / (1 - beta1 ** step)
    vhat = v / (1 - beta2 ** step)
    p = p - lr * (mhat / (np.sqrt(vhat) + eps) + weight_decay * p)
    return p, m, v
