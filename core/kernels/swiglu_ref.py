"""Numpy reference of SwiGLU (``swiglu.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_swiglu.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``swiglu.py`` with it.
"""
from __future__ import annotations

import numpy as np


def swiglu_forward(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up."""
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)


def swiglu_backward(d_out: np.ndarray, gate: np.ndarray, up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d_gate, d_up) of sum(d_out * silu(gate) * up)."""
    g = gate.astype(np.float64)
    s = 1.0 / (1.0 + np.exp(-g))
    return (d_out * up * (s + g * s * (1 - s))).astype(np.float32), (d_out * g * s).astype(np.float32)
