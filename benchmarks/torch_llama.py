"""The same llama architecture as core/model.py in PyTorch: the reference for benchmarks/compare.py.

Not product code. RMSNorm with a weight, RoPE on adjacent pairs (ggml "normal" mode), grouped-query
attention (query head h uses kv head h // (n_heads / n_kv_heads)), SwiGLU feed-forward, the output
projection ``output.weight`` or, with ``tie_embeddings``, the embedding itself; weights stored (out_features, in_features) under the GGUF
names, so ``load_gguf_weights`` takes our model's weights as they are.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.config import ModelConfig


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., dim) * rsqrt(mean(x^2) + eps) * w (dim)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(c: ModelConfig, seq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (seq, head_dim/2) of pos * theta^(-2i/head_dim)."""
    i = torch.arange(c.head_dim // 2, dtype=torch.float64)
    inv = c.rope_theta ** (-2.0 * i / c.head_dim)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x (B, T, heads, head_dim)."""
    b, t, h, d = x.shape
    p = x.view(b, t, h, d // 2, 2)
    x0, x1 = p[..., 0], p[..., 1]
    c, s = cos[None, :t, None, :], sin[None, :t, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).view(b, t, h, d)


class TorchLlama(nn.Module):
    """The llama model of core/model.py; parameters named like the GGUF tensors (dots -> '_')."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        self.w = nn.ParameterDict()
        for name, shape in c.param_shapes():
            init = torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape) * 0.02
            self.w[name.replace(".", "_")] = nn.Parameter(init)
        self._rope = None

    def p(self, name: str) -> torch.Tensor:
        return self.w[name.replace(".", "_")]

    def load_gguf_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Copy ``{gguf name: float32 array}`` (e.g. ``core.model.Model.weights()``) in."""
        with torch.no_grad():
            for name, arr in weights.items():
                self.p(name).copy_(torch.from_numpy(np.asarray(arr, np.float32)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) int64 -> logits (B, T, vocab_size)."""
        c = self.c
        b, t = tokens.shape
        if self._rope is None or self._rope[0].shape[0] < t or self._rope[0].device != tokens.device:
            self._rope = rope_tables(c, max(t, c.context_length), tokens.device)
        cos, sin = self._rope
        group = c.n_heads // c.n_kv_heads
        x = F.embedding(tokens, self.p("token_embd.weight"))
        for i in range(c.n_layers):
            w = lambda s: self.p(f"blk.{i}.{s}.weight")  # noqa: E731
            h = rms_norm(x, w("attn_norm"), c.norm_eps)
            q = rope((h @ w("attn_q").T).view(b, t, c.n_heads, c.head_dim), cos, sin)
            k = rope((h @ w("attn_k").T).view(b, t, c.n_kv_heads, c.head_dim), cos, sin)
            v = (h @ w("attn_v").T).view(b, t, c.n_kv_heads, c.head_dim)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (B, heads, T, head_dim)
            if group > 1:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(c.head_dim))
            x = x + a.transpose(1, 2).reshape(b, t, c.d_model) @ w("attn_output").T
            h = rms_norm(x, w("ffn_norm"), c.norm_eps)
            x = x + (F.silu(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        return rms_norm(x, self.p("output_norm.weight"), c.norm_eps) @ self.p(c.output_weight).T


def make_optimizer(model: TorchLlama, lr: float, weight_decay: float, beta1: float, beta2: float,
                   eps: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only, as core/model.py's optimizer_step."""
    mats = [p for n, p in model.w.items() if not n.endswith("norm_weight")]
    norms = [p for n, p in model.w.items() if n.endswith("norm_weight")]
    return torch.optim.AdamW([{"params": mats, "weight_decay": weight_decay},
                              {"params": norms, "weight_decay": 0.0}], lr=lr, betas=(beta1, beta2), eps=eps)


def train_step(model: TorchLlama, opt: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor,
               grad_clip: float, forward=None) -> float:
    """One full step: forward, mean cross-entropy, backward, grad-norm clip, AdamW. Returns the loss."""
    logits = (forward if forward is not None else model)(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss
