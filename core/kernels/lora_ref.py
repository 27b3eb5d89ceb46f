"""Numpy reference of ``lora.cl`` (column blocks of row-major matrices) and of one LoRA linear layer.

Written independently of the kernels, float64 inside. ``tests/test_kernel_lora.py`` and
``tests/test_lora.py`` compare the launcher in ``lora.py`` and the engine's adapters with it.
"""
from __future__ import annotations

import numpy as np


def cols_add(out: np.ndarray, src: np.ndarray, col0: int, scale: float) -> np.ndarray:
    """``out (n, ld)`` with ``scale * src (n, width)`` added to columns ``col0 .. col0 + width - 1``."""
    res = out.astype(np.float64)
    res[:, col0:col0 + src.shape[1]] += scale * src.astype(np.float64)
    return res.astype(np.float32)


def cols_take(src: np.ndarray, col0: int, width: int, scale: float) -> np.ndarray:
    """``scale * src[:, col0 : col0 + width]`` as a contiguous ``(n, width)`` array."""
    return (scale * src[:, col0:col0 + width].astype(np.float64)).astype(np.float32)


def lora_forward(x: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """``y = x W^T + scale (x A^T) B^T``: x (n, n_in), W (n_out, n_in), A (r, n_in), B (n_out, r)."""
    x64 = x.astype(np.float64)
    return x64 @ w.T.astype(np.float64) + scale * (x64 @ a.T.astype(np.float64)) @ b.T.astype(np.float64)


def lora_backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray,
                  scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dA, dB)`` of :func:`lora_forward` for the output gradient ``dy (n, n_out)`` (float64):
    ``dx = dy W + scale (dy B) A``, ``dA = scale (dy B)^T x``, ``dB = scale dy^T (x A^T)``."""
    dy, x = dy.astype(np.float64), x.astype(np.float64)
    w, a, b = (t.astype(np.float64) for t in (w, a, b))
    du = scale * dy @ b
    return dy @ w + du @ a, du.T @ x, scale * dy.T @ (x @ a.T)
