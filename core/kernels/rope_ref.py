"""Numpy reference of RoPE (``rope.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_rope.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``rope.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.rope import RoPE


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


def selfcheck(dev: Device, op: RoPE | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """The QKV matmul's rows (10 tokens, 3 query heads, 1 kv head, head_dim 16, from position 2) split
    into rotated q, k and v, and the gradients joined back, against :func:`rope_forward` and
    :func:`rope_backward` (1e-5). ``op`` defaults to a new ``RoPE(dev)``; the errors are returned,
    not raised."""
    from core.kernels.rope import RoPE

    op, t = op or RoPE(dev), Inputs(dev, rng)
    n, h, kvh, d, seq, pos, theta = 10, 3, 1, 16, 5, 2, 10000.0
    qd, kd = h * d, kvh * d
    qkv = t.f32(n, qd + 2 * kd)
    q, k, v = dev.alloc(n * qd), dev.alloc(n * kd), dev.alloc(n * kd)
    op.split_qkv(q, k, v, dev.upload(qkv), n, seq, h, kvh, d, pos, theta)
    split = max(t.err(q, rope_forward(qkv[:, :qd].reshape(n, h, d), seq, pos, theta)),
                t.err(k, rope_forward(qkv[:, qd:qd + kd].reshape(n, kvh, d), seq, pos, theta)),
                t.err(v, qkv[:, qd + kd:]))
    dq, dk, dv = t.f32(n, h, d), t.f32(n, kvh, d), t.f32(n, kd)
    d_qkv = dev.alloc(n * (qd + 2 * kd))
    op.join_qkv(d_qkv, dev.upload(dq), dev.upload(dk), dev.upload(dv), n, seq, h, kvh, d, pos, theta)
    want = np.concatenate([rope_backward(dq, seq, pos, theta).reshape(n, qd),
                           rope_backward(dk, seq, pos, theta).reshape(n, kd), dv], axis=1)
    return [Check("RoPE (QKV split)", split, 1e-5), Check("RoPE backward (QKV join)", t.err(d_qkv, want), 1e-5)]
