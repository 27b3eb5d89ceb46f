"""The whole model in float64 numpy, written independently of the engine (tests only).

Each op's own numpy reference lives next to its launcher, ``core/kernels/<op>_ref.py``, where the
kernel tests and the Device tab's self-check both use it.
"""
from __future__ import annotations

import numpy as np


# ----------------------------------------------------------------------------- whole model

def llama_forward(weights, config, tokens):
    """Float64 logits (B, T, vocab) of the llama architecture, written straight from the papers and
    llama.cpp's llm_build_llama: RMSNorm, attention with adjacent-pair RoPE and GQA, SwiGLU.

    weights: {gguf tensor name: array}; tokens: int (B, T).
    """
    c = config
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    tokens = np.atleast_2d(tokens)
    b, t = tokens.shape
    hd, eps = c.head_dim, c.norm_eps

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x):  # x (B, T, H, hd)
        freq = c.rope_theta ** (-np.arange(0, hd, 2) / hd)
        ang = np.arange(t)[:, None] * freq[None, :]  # (T, hd/2)
        cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    x = w["token_embd.weight"][tokens]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(c.n_layers):
        p = lambda s: w[f"blk.{i}.{s}.weight"]  # noqa: E731
        h = norm(x, p("attn_norm"))
        q = rope((h @ p("attn_q").T).reshape(b, t, c.n_heads, hd))
        k = rope((h @ p("attn_k").T).reshape(b, t, c.n_kv_heads, hd))
        v = (h @ p("attn_v").T).reshape(b, t, c.n_kv_heads, hd)
        rep = c.n_heads // c.n_kv_heads
        k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
        s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(hd)
        s = np.where(causal, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("bhij,bjhd->bihd", s, v).reshape(b, t, c.d_model)
        x = x + a @ p("attn_output").T
        h = norm(x, p("ffn_norm"))
        g, u = h @ p("ffn_gate").T, h @ p("ffn_up").T
        x = x + (g / (1 + np.exp(-g)) * u) @ p("ffn_down").T
    return norm(x, w["output_norm.weight"]) @ w[c.output_weight].T  # tied: token_embd.weight


def llama_loss(weights, config, tokens, targets, mask):
    """Float64 masked mean cross-entropy of :func:`llama_forward` (the training loss)."""
    z = llama_forward(weights, config, tokens)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    return float((nll * mask).sum() / mask.sum())
