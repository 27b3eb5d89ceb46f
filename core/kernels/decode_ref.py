"""Numpy reference of the one-launch decode layer (``decode.cl``).

Composed of the other ops' float64 references (embedding, RMSNorm, RoPE, attention, SwiGLU) and plain
float64 products, in core.model.layer_forward's order, for one token. The tests
(``tests/test_kernel_decode.py``) and the Device tab's self-check (``core/selftest.py``) both compare the
launcher in ``decode.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs
from core.kernels.attention_ref import attention_forward
from core.kernels.rmsnorm_ref import rmsnorm_forward
from core.kernels.rope_ref import rope_forward
from core.kernels.swiglu_ref import swiglu_forward

if TYPE_CHECKING:
    from core.config import ModelConfig
    from core.device import Device
    from core.kernels.decode import DecodeLayer


def decode_layer(c: ModelConfig, x: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, w: dict, pos: int,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One layer for the token at ``pos``: x (d_model,) the residual stream before it; k_cache, v_cache
    (> pos, kv_dim) with rows 0 .. pos - 1 filled; w: ``attn_norm, qkv (d+2kv, d), o, ffn_norm, gate_up
    (2f, d), down (d, f), next_norm``. Returns (x after the layer, rmsnorm(it) * next_norm, k row, v row)
    (float32, computed in float64)."""
    d, kd, f, hd = c.d_model, c.kv_dim, c.ffn_dim, c.head_dim
    x64 = x.astype(np.float64)
    attn_in = rmsnorm_forward(x64[None], w["attn_norm"], c.norm_eps)[0][0]
    qkv = w["qkv"].astype(np.float64) @ attn_in
    q = rope_forward(qkv[None, :d].reshape(1, c.n_heads, hd), 1, pos, c.rope_theta)
    k = rope_forward(qkv[None, d:d + kd].reshape(1, c.n_kv_heads, hd), 1, pos, c.rope_theta)
    keys = np.concatenate([k_cache[:pos].astype(np.float64).reshape(pos, c.n_kv_heads, hd), k])
    values = np.concatenate([v_cache[:pos].astype(np.float64), qkv[None, d + kd:]]).reshape(pos + 1, c.n_kv_heads, hd)
    att = attention_forward(q[None], keys[None], values[None], q_pos_start=pos)[0].reshape(d)
    x64 = x64 + w["o"].astype(np.float64) @ att
    ffn_in = rmsnorm_forward(x64[None], w["ffn_norm"], c.norm_eps)[0][0]
    gu = w["gate_up"].astype(np.float64) @ ffn_in
    x64 = x64 + w["down"].astype(np.float64) @ swiglu_forward(gu[:f], gu[f:]).astype(np.float64)
    out = rmsnorm_forward(x64[None], w["next_norm"], c.norm_eps)[0][0]
    return (x64.astype(np.float32), np.asarray(out, np.float32), k.reshape(kd).astype(np.float32),
            qkv[d + kd:].astype(np.float32))


def run_layer(dev: Device, op: DecodeLayer, c: ModelConfig, x: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
              w: dict, pos: int, token_embd: np.ndarray | None = None, token: int = 0) -> dict:
    """The launcher on these inputs (the buffers layer_forward uses, separate ones here); with
    ``token_embd`` it embeds ``token`` first (layer 0: ``x`` is then ignored). Returns the downloads of
    ``x_out``, ``out_norm``, ``k_cache`` and ``v_cache``."""
    from core.kernels.rope import RoPE

    d, kd, f = c.d_model, c.kv_dim, c.ffn_dim
    up = {n: dev.upload(np.ascontiguousarray(a, np.float32)) for n, a in w.items()}
    kc, vc = dev.upload(k_cache), dev.upload(v_cache)
    x_in, attn_in = dev.upload(x), dev.upload(rmsnorm_forward(x[None], w["attn_norm"], c.norm_eps)[0][0])
    x_out, out_norm = dev.alloc(d), dev.alloc(d)
    embed = None
    if token_embd is not None:
        embed = (dev.upload(np.array([token], np.int32)), dev.upload(token_embd), up["attn_norm"])
    cs = RoPE(dev).cos_sin_table(c.head_dim, c.rope_theta, pos + 1)
    op(x_out, out_norm, kc, vc, dev.alloc(d + 2 * kd), dev.alloc(d), dev.alloc(d), dev.alloc(d), dev.alloc(2 * f),
       dev.alloc(f), dev.alloc(c.n_heads * (pos + 1)), x_in, attn_in, embed, up["qkv"], up["o"], up["ffn_norm"],
       up["gate_up"], up["down"], up["next_norm"], cs, c, pos)
    rows = k_cache.shape[0]
    return {"x": dev.download(x_out, (d,)), "out_norm": dev.download(out_norm, (d,)),
            "k_cache": dev.download(kc, (rows, kd)), "v_cache": dev.download(vc, (rows, kd))}


def layer_weights(c: ModelConfig, t: Inputs) -> dict:
    """Random weights of one layer (scaled like a trained model's: products of order one)."""
    d, kd, f = c.d_model, c.kv_dim, c.ffn_dim
    return {"attn_norm": 1 + 0.1 * t.f32(d), "qkv": t.f32(d + 2 * kd, d) / np.sqrt(d), "o": t.f32(d, d) / np.sqrt(d),
            "ffn_norm": 1 + 0.1 * t.f32(d), "gate_up": t.f32(2 * f, d) / np.sqrt(d), "down": t.f32(d, f) / np.sqrt(f),
            "next_norm": 1 + 0.1 * t.f32(d)}


def selfcheck(dev: Device, op: DecodeLayer | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """One decode layer (d_model 36, 6 query heads on 2 kv heads of head_dim 6, ffn_dim 29, position 7 after
    7 cached keys) and the first layer's embedding of a token, against :func:`decode_layer` (1e-5). ``op``
    defaults to a new ``DecodeLayer(dev)``; the errors are returned, not raised."""
    from core.config import ModelConfig
    from core.kernels.decode import DecodeLayer

    op, t = op or DecodeLayer(dev), Inputs(dev, rng)
    c = ModelConfig(vocab_size=11, d_model=36, n_layers=1, n_heads=6, n_kv_heads=2, ffn_dim=29, context_length=9)
    w, pos = layer_weights(c, t), 7
    x, k_cache, v_cache, embd = t.f32(c.d_model), t.f32(9, c.kv_dim), t.f32(9, c.kv_dim), t.f32(c.vocab_size, c.d_model)
    errs = []
    for first in (False, True):
        x_in = embd[3] if first else x
        want = decode_layer(c, x_in, k_cache, v_cache, w, pos)
        got = run_layer(dev, op, c, x, k_cache, v_cache, w, pos, token_embd=embd if first else None, token=3)
        errs.append(max(float(np.abs(got["x"] - want[0]).max()), float(np.abs(got["out_norm"] - want[1]).max()),
                        float(np.abs(got["k_cache"][pos] - want[2]).max()),
                        float(np.abs(got["v_cache"][pos] - want[3]).max()),
                        float(np.abs(got["k_cache"][:pos] - k_cache[:pos]).max())))
    return [Check("decode layer", errs[0], 1e-5), Check("decode layer (embedding first)", errs[1], 1e-5)]

