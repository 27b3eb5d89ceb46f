"""Numpy reference of RoPE (``rope.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_rope.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``rope.py`` with it.
"""
from __future__ import annotations

import numpy as np


def rope_forward(x: np.ndarray, seq_len: int, pos_start: int, theta: float,
                 inverse: bool = False) -> np.ndarray:
    """x (n_tokens, n_heads, head_dim) -> x with adjacent pairs (x[2i], x[2i+1]) rotated by
    pos * theta**(-2i/head_dim), pos = pos_start + row % seq_len (ggml "normal" RoPE).
    ``inverse`` rotates by the negated angle. Written as a complex multiplication."""
    x64 = x.astype(np.float64)
    n_tokens, _, head_dim = x64.shape
    pos = pos_start + np.arange(n_tokens) % seq_len
    freq = float(theta) ** (-np.arange(0, head_dim, 2) / head_dim)
    angle = pos[:, None, None] * freq[None, None, :]
    z = (x64[..., 0::2] + 1j * x64[..., 1::2]) * np.exp((-1j if inverse else 1j) * angle)
    out = np.empty_like(x64)
    out[..., 0::2] = z.real
    out[..., 1::2] = z.imag
    return out.astype(x.dtype)


def rope_backward(d_out: np.ndarray, seq_len: int, pos_start: int, theta: float) -> np.ndarray:
    """d_out (n_tokens, n_heads, head_dim) -> d_x: the transpose of the rotation (inverse)."""
    return rope_forward(d_out, seq_len, pos_start, theta, inverse=True)
