"""Numpy twins of every kernel (forward and backward), written independently of the kernels.

Float64 internally where it matters, float32 out. Shapes in each docstring follow the kernels'.
Helpers append their op's functions at the end of this file.
"""
from __future__ import annotations

import numpy as np


def residual_forward(a, b):
    """a (n), b (n) -> a + b."""
    return (a.astype(np.float64) + b).astype(np.float32)


# ----------------------------------------------------------------------------- rope

def rope_forward(x, seq_len, pos_start, theta, inverse=False):
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


def rope_backward(d_out, seq_len, pos_start, theta):
    """d_out (n_tokens, n_heads, head_dim) -> d_x: the transpose of the rotation (inverse)."""
    return rope_forward(d_out, seq_len, pos_start, theta, inverse=True)


# ----------------------------------------------------------------------------- attention

def _attention_heads(q, k, v):
    """(B, S, H, D) layouts -> (B, H, S, D) float64 with kv heads repeated to the query heads."""
    rep = q.shape[2] // k.shape[2]
    qh = q.astype(np.float64).transpose(0, 2, 1, 3)
    kh = np.repeat(k.astype(np.float64).transpose(0, 2, 1, 3), rep, axis=1)
    vh = np.repeat(v.astype(np.float64).transpose(0, 2, 1, 3), rep, axis=1)
    return qh, kh, vh


def attention_forward(q, k, v, q_pos_start=0):
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


def attention_lse(q, k, v, q_pos_start=0):
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


def attention_backward(d_out, q, k, v):
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


# ----------------------------------------------------------------------------- cross-entropy

def cross_entropy_forward(logits, targets, mask):
    """logits (n_rows, V), targets (n_rows) int, mask (n_rows) -> losses (n_rows):
    mask * -log softmax(logits)[target]; rows with mask 0 give 0 (target not read)."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    keep = mask != 0
    t = np.where(keep, targets, 0)
    nll = -logp[np.arange(len(t)), t]
    return np.where(keep, mask.astype(np.float64) * nll, 0.0).astype(logits.dtype)


def cross_entropy_backward(logits, targets, mask, grad_scale):
    """Gradient of grad_scale * sum(losses) w.r.t. logits (n_rows, V):
    (softmax - onehot(target)) * mask * grad_scale; rows with mask 0 give 0."""
    x = logits.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    keep = mask != 0
    rows = np.nonzero(keep)[0]
    p[rows, targets[rows]] -= 1.0
    g = p * (np.where(keep, mask, 0.0) * grad_scale)[:, None]
    return g.astype(logits.dtype)


# ----------------------------------------------------------------------------- adamw

def adamw_step(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step, grad_scale=1.0):
    """One AdamW step (Loshchilov & Hutter 2019) in float64 -> new (p, m, v) as float64."""
    p, g, m, v = (np.asarray(a, np.float64) for a in (p, g, m, v))
    g = g * grad_scale
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mhat = m / (1 - beta1 ** step)
    vhat = v / (1 - beta2 ** step)
    p = p - lr * (mhat / (np.sqrt(vhat) + eps) + weight_decay * p)
    return p, m, v


# ----------------------------------------------------------------------------- grad norm

def sum_squares(x):
    """x (n) -> sum(x^2) in float64."""
    x = x.astype(np.float64)
    return float(np.dot(x, x))


def sum_(x):
    """x (n) -> sum(x) in float64."""
    return float(x.astype(np.float64).sum())


def clip_factor(norm, max_norm):
    """Gradient-clipping factor: min(1, max_norm / (norm + 1e-6))."""
    return min(1.0, max_norm / (norm + 1e-6))


# ---------------------------------------------------------------- embedding, rmsnorm, swiglu
def embedding_forward(tokens, weight):
    """tokens (N) int, weight (V, C) -> (N, C)."""
    return weight[np.asarray(tokens)].astype(np.float32)


def embedding_backward(d_out, tokens, vocab_size):
    """d_out (N, C), tokens (N) -> d_weight (V, C) (scatter-add)."""
    g = np.zeros((vocab_size, d_out.shape[1]), np.float64)
    np.add.at(g, np.asarray(tokens), d_out.astype(np.float64))
    return g.astype(np.float32)


def rmsnorm_forward(x, w, eps):
    """x (R, C), w (C) -> (y (R, C), rstd (R)); y = x / sqrt(mean(x^2) + eps) * w."""
    x64 = x.astype(np.float64)
    rstd = 1.0 / np.sqrt((x64 ** 2).mean(axis=1) + eps)
    return (x64 * rstd[:, None] * w).astype(np.float32), rstd.astype(np.float32)


def rmsnorm_backward(d_out, x, w, eps):
    """Gradients (d_x (R, C), d_w (C)) of sum(d_out * rmsnorm(x, w)), derived by hand in float64."""
    x64, g = x.astype(np.float64), d_out.astype(np.float64)
    c = x.shape[1]
    r = 1.0 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps)
    gw = g * w
    d_x = r * gw - r ** 3 / c * x64 * (gw * x64).sum(axis=1, keepdims=True)
    d_w = (g * x64 * r).sum(axis=0)
    return d_x.astype(np.float32), d_w.astype(np.float32)


def swiglu_forward(gate, up):
    """silu(gate) * up."""
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)


def swiglu_backward(d_out, gate, up):
    """(d_gate, d_up) of sum(d_out * silu(gate) * up)."""
    g = gate.astype(np.float64)
    s = 1.0 / (1.0 + np.exp(-g))
    return (d_out * up * (s + g * s * (1 - s))).astype(np.float32), (d_out * g * s).astype(np.float32)


# ---------------------------------------------------------------- matmul
def matmul_forward(a, b, trans_a=False, trans_b=False, c=None):
    """op(a) (M,K) @ op(b) (K,N) in float64, plus c (M,N) when given (accumulate).

    a is stored (M,K), or (K,M) when trans_a; b is stored (K,N), or (N,K) when trans_b.
    """
    a64 = a.astype(np.float64).T if trans_a else a.astype(np.float64)
    b64 = b.astype(np.float64).T if trans_b else b.astype(np.float64)
    out = a64 @ b64
    if c is not None:
        out = out + c
    return out.astype(np.float32)


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
