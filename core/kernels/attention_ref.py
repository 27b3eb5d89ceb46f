"""Numpy reference of causal grouped-query attention (``attention.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_attention.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``attention.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.attention import Attention


def _attention_heads(q: np.ndarray, k: np.ndarray,
                     v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, S, H, D) layouts -> (B, H, S, D) float64 with kv heads repeated to the query heads."""
    rep = q.shape[2] // k.shape[2]
    qh = q.astype(np.float64).transpose(0, 2, 1, 3)
    kh = np.repeat(k.astype(np.float64).transpose(0, 2, 1, 3), rep, axis=1)
    vh = np.repeat(v.astype(np.float64).transpose(0, 2, 1, 3), rep, axis=1)
    return qh, kh, vh


def attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      q_pos_start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """q (B, seq_q, H, D), k/v (B, seq_k, KVH, D) -> out (B, seq_q, H, D),
    probs (B, H, seq_q, seq_k). Causal (key j visible to query i iff j <= q_pos_start + i),
    scale 1/sqrt(D), query head h uses kv head h // (H // KVH). Rows that see no key give zeros.
    Float64 internally; results in q's dtype."""
    qh, kh, vh = _attention_heads(q, k, v)
    seq_q, seq_k, d = q.shape[1], k.shape[1], q.shape[3]
    s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(d)
    visible = np.arange(seq_k)[None, :] <= q_pos_start + np.arange(seq_q)[:, None]
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if seq_k else np.zeros(s.shape[:-1] + (1,))
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(visible, np.exp(s - m), 0.0)
    z = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
    out = (p @ vh).transpose(0, 2, 1, 3)
    return out.astype(q.dtype), p.astype(q.dtype)


def attention_lse(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos_start: int = 0) -> np.ndarray:
    """Per-row log-sum-exp of the scaled, masked scores: (B, H, seq_q); -inf for a row that sees no
    key. Float64 internally; result float64."""
    qh, kh, _ = _attention_heads(q, k, v)
    seq_q, seq_k, d = q.shape[1], k.shape[1], q.shape[3]
    s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(d)
    visible = np.arange(seq_k)[None, :] <= q_pos_start + np.arange(seq_q)[:, None]
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1) if seq_k else np.full(s.shape[:-1], -np.inf)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(s - safe[..., None]).sum(axis=-1))


def attention_backward(d_out: np.ndarray, q: np.ndarray, k: np.ndarray,
                       v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training backward (q_pos_start 0, seq_q = seq_k): d_out (B, S, H, D) ->
    d_q (B, S, H, D), d_k, d_v (B, S, KVH, D); a kv head's grads sum over its query heads.
    dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D)."""
    _, p = attention_forward(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    qh, kh, vh = _attention_heads(q, k, v)
    b, s_len, h, d = q.shape
    kvh = k.shape[2]
    do = d_out.astype(np.float64).transpose(0, 2, 1, 3)
    dv = p.transpose(0, 1, 3, 2) @ do
    dp = do @ vh.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = ds @ kh / np.sqrt(d)
    dk = ds.transpose(0, 1, 3, 2) @ qh / np.sqrt(d)
    dk = dk.reshape(b, kvh, h // kvh, s_len, d).sum(axis=2)
    dv = dv.reshape(b, kvh, h // kvh, s_len, d).sum(axis=2)
    t = (0, 2, 1, 3)
    return (dq.transpose(t).astype(q.dtype), dk.transpose(t).astype(q.dtype),
            dv.transpose(t).astype(q.dtype))


def selfcheck(dev: Device, op: Attention | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """Causal attention over 21 positions, 4 query heads on 2 kv heads, head_dim 32 (the default
    model's, so its kernels get built), against :func:`attention_forward` (1e-4). ``op`` defaults to
    a new ``Attention(dev)``; the errors are returned, not raised."""
    from core.kernels.attention import Attention

    op, t = op or Attention(dev), Inputs(dev, rng)
    s, h, kvh, d = 21, 4, 2, 32
    q, k, v = t.f32(1, s, h, d), t.f32(1, s, kvh, d), t.f32(1, s, kvh, d)
    o, lse = dev.alloc(q.size), dev.alloc(h * s)
    scratch = dev.alloc(op.scratch_floats(1, s, h, kvh, d))  # as the Model gives it (the keys-as-lanes kernels')
    op.forward(o, lse, dev.upload(q), dev.upload(k), dev.upload(v), 1, s, s, 0, h, kvh, d, scratch=scratch)
    return [Check("attention", t.err(o, attention_forward(q, k, v)[0]), 1e-4)]
