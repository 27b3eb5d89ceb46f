"""Launcher for ``decode.cl``: one llama layer's forward for one new token, in one launch of one
work-group (decode of small models; ``core.model.forward`` chooses it through :meth:`DecodeLayer.suits`)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from core.device import Device

if TYPE_CHECKING:
    import pyopencl as cl

    from core.config import ModelConfig

DECODE_LAYER_MACS_X_UNITS = 2_000_000
"""A layer's multiply-adds per token times the device's compute units, up to which decode runs the layer as
one launch of one work-group (:meth:`DecodeLayer.suits`).

One work-group runs on one compute unit (one core of a CPU): the fused layer gives up the device's other
units to save the layer's eight other launches (and the embedding's two). Measured on a 2-core CPU (PoCL,
benchmarks/compare.py's decode, fused vs separate launches, tokens/s best of 5): d_model 128 (213k
multiply-adds a layer, the default model) 4,475 vs 3,345; d_model 256 (852k) 2,183 vs 1,929; d_model 384
(1.9M) 1,204 vs 1,261; d_model 512 (3.4M) 724 vs 898. The bound, 1M a layer on 2 units, is half the
measured crossover; with more units the separate launches get faster, so it shrinks in proportion (an
8-core CPU: 250k; a GPU of a hundred units: only toy sizes). SmolLM2-135M (3.5M) is never fused.
"""


class DecodeLayer:
    """``core.model.layer_forward`` for one token (batch 1, ``t = 1``) as one launch: the products,
    RoPE, attention over the KV cache, SwiGLU and both RMSNorms (decode.cl's header gives the phases).

    Args:
        dev: the device.
        local_size: work-items of the one work-group (default 16 on a CPU, where PoCL runs a work-group's
            items in a loop on one core (16: 10-20 % faster than 64 there, measured), else 64; capped by the
            device and kernel).
    """

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._kernel = dev.kernel("decode", "decode_layer")
        self.local = dev.work_group_size(self._kernel, local_size or (16 if dev.is_cpu else 64))

    @staticmethod
    def layer_macs(c: ModelConfig) -> int:
        """Multiply-adds of one layer's four products for one token."""
        d, kv, f = c.d_model, c.kv_dim, c.ffn_dim
        return d * (d + 2 * kv) + d * d + 2 * f * d + f * d

    @staticmethod
    def suits(dev: Device, c: ModelConfig, views: list) -> bool:
        """Whether decode runs a layer of ``c`` with these weights (``views``: the layer's matrices) as one
        launch on ``dev``: small enough (:data:`DECODE_LAYER_MACS_X_UNITS`) and every matrix a float32
        buffer (a quantized or LoRA matrix object goes through the separate launches)."""
        small = DecodeLayer.layer_macs(c) * max(1, dev.info.compute_units) <= DECODE_LAYER_MACS_X_UNITS
        return small and not any(hasattr(v, "forward") for v in views)

    def __call__(self, x_out: cl.Buffer, out_norm: cl.Buffer, k_cache: cl.Buffer, v_cache: cl.Buffer,
                 qkv: cl.Buffer, q: cl.Buffer, att: cl.Buffer, ffn_in: cl.Buffer, gate_up: cl.Buffer, h: cl.Buffer,
                 scores: cl.Buffer, x_in: cl.Buffer, attn_in: cl.Buffer, embed: tuple | None, w_qkv: cl.Buffer, w_o: cl.Buffer, ffn_norm: cl.Buffer,
                 w_gate_up: cl.Buffer, w_down: cl.Buffer, next_norm: cl.Buffer, cos_sin: cl.Buffer,
                 c: ModelConfig, pos: int) -> None:
        """Enqueue the layer for the token at position ``pos``.

        Args:
            x_out: float32 (d_model,), the residual stream after the layer, written (may be ``x_in``).
            out_norm: float32 (d_model,), ``rmsnorm(x_out) * next_norm``, written (may be ``attn_in``).
            k_cache, v_cache: float32 (rows > pos, kv_dim): row ``pos`` written, rows ``0 .. pos`` read.
            qkv (d_model + 2 kv_dim,), q (d_model,), att (d_model,), ffn_in (d_model,), gate_up (2 ffn_dim,),
                h (ffn_dim,), scores (at least n_heads * (pos + 1)): float32 intermediates, written (``ffn_in``
                may be ``attn_in``).
            x_in: float32 (d_model,), the residual stream before the layer.
            attn_in: float32 (d_model,), ``rmsnorm(x_in) * attn_norm``.
            embed: None, or for layer 0 ``(tokens, token_embd, attn_norm)``: int32 (1,) token id, float32
                (vocab_size, d_model), float32 (d_model,): x_in and attn_in are then written first from
                the token's embedding row (core.model.forward's embedding and first RMSNorm).
            w_qkv (d_model + 2 kv_dim, d_model), w_o (d_model, d_model), w_gate_up (2 ffn_dim, d_model),
                w_down (d_model, ffn_dim): float32 row-major weights (the fused groups of core.model).
            ffn_norm, next_norm: float32 (d_model,) RMSNorm weights (next_norm: the next layer's
                attn_norm, or output_norm after the last layer).
            cos_sin: float32 (positions > pos, head_dim) RoPE table (``core.kernels.rope.RoPE.cos_sin_table``).
            c: the architecture (d_model, n_heads, n_kv_heads, head_dim, ffn_dim, norm_eps).
            pos: the token's position (keys 0 .. pos attended).

        Raises:
            ValueError: odd head_dim, n_kv_heads not dividing n_heads, or ``pos < 0``.
        """
        if c.head_dim % 2 or c.n_heads % c.n_kv_heads or pos < 0:
            raise ValueError(f"decode_layer needs an even head_dim, n_kv_heads dividing n_heads and pos >= 0 "
                             f"(got {c.head_dim}, {c.n_kv_heads} of {c.n_heads}, {pos})")
        i32 = np.int32  # without embed, x_in stands in for the three unread buffers
        self.dev.launch(self._kernel, (self.local,), (self.local,), x_out, out_norm, k_cache, v_cache, qkv, q, att,
                        ffn_in, gate_up, h, scores, x_in, attn_in, *(embed or (x_in, x_in, x_in)), i32(embed is not None), w_qkv, w_o, ffn_norm, w_gate_up, w_down, next_norm, cos_sin,
                        i32(c.d_model), i32(c.n_heads), i32(c.n_kv_heads), i32(c.head_dim), i32(c.ffn_dim), i32(pos),
                        np.float32(c.norm_eps), np.float32(1.0 / math.sqrt(c.head_dim)))
