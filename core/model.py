"""The llama-architecture transformer on OpenCL: forward in layer order, backward in reverse.

Computes exactly what llama.cpp's ``llama`` architecture computes (src/models/llama.cpp,
``llm_build_llama``), so a GGUF export needs no weight permutation:

    x = token_embd[tokens]                                   # (N, d_model), N = B*T
    for each layer:
        h = rmsnorm(x) * attn_norm                           # (N, d_model)
        q, k, v = h @ Wq.T, h @ Wk.T, h @ Wv.T               # (B,T,n_heads,hd), (B,T,n_kv,hd) x2
        q, k = rope(q), rope(k)                              # adjacent pairs, ggml "normal" rope
        a = causal_softmax(q k^T / sqrt(hd)) v               # (B,T,n_heads,hd)
        x = x + a @ Wo.T
        h = rmsnorm(x) * ffn_norm
        x = x + (silu(h @ Wgate.T) * (h @ Wup.T)) @ Wdown.T  # SwiGLU (Shazeer 2020)
    logits = (rmsnorm(x) * output_norm) @ Wout.T             # (N, vocab_size)
                                               # Wout = token_embd when config.tie_embeddings

All tensors stay on the device; the host reads back only the scalars it reports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import MODEL_TENSOR as T
from gguf import TENSOR_NAMES

from core.config import BLOCK_TENSORS, ModelConfig, tensor_name
from core.device import Device
from core.kernels.adamw import SQUARE_FLOOR, AdamW
from core.kernels.attention import Attention
from core.kernels.cross_entropy import CrossEntropy
from core.kernels.decode import DecodeLayer
from core.kernels.embedding import Embedding
from core.kernels.sums import Sums
from core.kernels import attention_autotune, matmul_autotune
from core.kernels.matmul import Matmul, scratch_bound_floats
from core.kernels.rmsnorm import RMSNorm
from core.kernels.rope import RoPE
from core.kernels.swiglu import SwiGLU
from core.kernels.lora import LoRABlockDiag
from core.lora import (FUSED, SUFFIX_A, SUFFIX_B, DenseFrozen, LoRAConfig, LoRALinear, LoRAScratch, adapter_params,
                       adapter_storage, base_name, fused_adapters, init_adapter, lora_matmuls, merge, scratch_floats,
                       target_shape)
from core.tensor_store import Layout, TensorStore
from core import quant_base
from core.quant_base import RawBase


class Ops:
    """One set of launchers (and so of ``cl.Kernel`` objects) for one thread's use."""

    def __init__(self, dev: Device):
        self.embedding = Embedding(dev)
        self.rmsnorm = RMSNorm(dev)
        self.matmul = Matmul(dev, tuned=matmul_autotune.tuned_configs(dev))  # tuned once per device (cached)
        self.rope = RoPE(dev)
        self.attention = Attention(dev)
        self.swiglu = SwiGLU(dev)
        self.cross_entropy = CrossEntropy(dev)
        self.adamw = AdamW(dev)
        self.sums = Sums(dev)
        self.dev, self._decode = dev, None

    @property
    def decode(self) -> DecodeLayer:
        """The one-launch decode layer, built on first use (only decode of small models needs it)."""
        if self._decode is None:
            self._decode = DecodeLayer(self.dev)
        return self._decode


def param_layout(dev: Device, config: ModelConfig, frozen: tuple[str, ...] = ()) -> Layout:
    """The flat layout of the model's parameters but ``frozen`` (matrices first, norm weights last,
    from ``blk.0.attn_norm.weight`` on); each layer's attn_q, attn_k, attn_v and its ffn_gate, ffn_up
    are stored back to back as the groups :func:`qkv_group` and :func:`gate_up_group` (one matmul each)."""
    shapes = [(n, s) for n, s in config.param_shapes() if n not in frozen]
    groups = {g: m for g, m in param_groups(config).items() if not set(m) & set(frozen)}  # a quantized group: gone
    return Layout(shapes, layout_align(dev), split_at=tensor_name(T.ATTN_NORM, 0), groups=groups)


LOGITS_MATRIX = "logits_matrix"
"""The key of a weight-views dict (what :func:`forward` reads) whose value, when present, is the output
projection as a matrix object with ``forward(out, x, n, x_offset=)`` (core.generate's quantized decode:
a :class:`core.quant_base.QuantFrozen`) instead of the float32 buffer ``config.output_weight``."""


def qkv_group(block: int) -> str:
    """``blk.{block}.attn_qkv``: layer ``block``'s [attn_q; attn_k; attn_v] stored as one matrix
    (llama.cpp's name of a fused QKV tensor, gguf's ``ATTN_QKV``; never exported)."""
    return TENSOR_NAMES[T.ATTN_QKV].format(bid=block)


def gate_up_group(block: int) -> str:
    """``blk.{block}.ffn_gate_up``: layer ``block``'s [ffn_gate; ffn_up] stored as one matrix (our name:
    gguf has no dense fused gate/up tensor; never exported)."""
    return TENSOR_NAMES[T.FFN_GATE].format(bid=block) + "_up"


def param_groups(config: ModelConfig) -> dict[str, list[str]]:
    """The tensors stored back to back so one matmul computes them: per layer :func:`qkv_group` =
    [attn_q, attn_k, attn_v] and :func:`gate_up_group` = [ffn_gate, ffn_up]."""
    groups = {}
    for i in range(config.n_layers):
        groups[qkv_group(i)] = [tensor_name(t, i) for t in (T.ATTN_Q, T.ATTN_K, T.ATTN_V)]
        groups[gate_up_group(i)] = [tensor_name(t, i) for t in (T.FFN_GATE, T.FFN_UP)]
    return groups


def block_matrices(config: ModelConfig) -> list[tuple[str, list[str]]]:
    """``[(matrix name, [member tensor names]), ...]``: every block matrix as one product multiplies it
    (:func:`qkv_group`, :func:`gate_up_group`, attn_output and ffn_down alone), in layer order."""
    groups, out = param_groups(config), []
    for i in range(config.n_layers):
        out += [(qkv_group(i), groups[qkv_group(i)]), (gate_up_group(i), groups[gate_up_group(i)])]
        out += [(tensor_name(t, i), [tensor_name(t, i)]) for t in (T.ATTN_OUT, T.FFN_DOWN)]
    return out


def quantized_plan(config: ModelConfig, lora: LoRAConfig | None, base: RawBase | None) -> dict:
    """The block matrices a LoRA model keeps in their GGUF formats (:func:`core.quant_base.plan`); none
    without LoRA or without a quantized base."""
    return quant_base.plan(config, block_matrices(config), base.types) if lora and base else {}


def layer_of(config: ModelConfig) -> dict[str, int]:
    """``{tensor name: its entry in StepStats.layer_grad_norms}``: 0 the embedding, ``1 + i`` the
    tensors of block ``i``, ``n_layers + 1`` the output norm and projection."""
    out = {name: config.n_layers + 1 for name, _ in config.param_shapes()}
    out[tensor_name(T.TOKEN_EMBD)] = 0
    out |= {tensor_name(t, i): 1 + i for i in range(config.n_layers) for t in BLOCK_TENSORS}
    return out


def layout_align(dev: Device) -> int:
    """Alignment of every tensor in the flat buffers, in float32 elements (the device's base alignment)."""
    return max(1, dev.base_align_bytes // 4)


def init_weights(config: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Random initial weights: N(0, 0.02) for matrices, the residual output projections
    (attn_output, ffn_down) scaled by 1/sqrt(2 n_layers) as in GPT-2 (Radford et al. 2019),
    ones for RMSNorm weights.

    Returns:
        ``{gguf tensor name: float32 array}``.
    """
    rng = np.random.default_rng(seed)
    blocks = range(config.n_layers)
    norms = {tensor_name(T.OUTPUT_NORM)} | {tensor_name(t, i) for i in blocks for t in (T.ATTN_NORM, T.FFN_NORM)}
    projections = {tensor_name(t, i) for i in blocks for t in (T.ATTN_OUT, T.FFN_DOWN)}
    out = {}
    for name, shape in config.param_shapes():
        if name in norms:
            out[name] = np.ones(shape, np.float32)
        else:
            std = 0.02
            if name in projections:
                std /= math.sqrt(2 * config.n_layers)
            out[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


@dataclass
class StepStats:
    """What one training step reports (host floats)."""

    loss: float
    grad_norm: float
    layer_grad_norms: list[float]
    tokens: int


LOSS_CHUNK_BYTES = 128 * 2**20
"""The most bytes of logits a Model holds at once (unless LOSS_CHUNK_ALIGN rows of them are more): its loss head (the output projection, the cross-entropy and, in
training, their backward) runs over a batch's rows in chunks of :func:`loss_rows` rows, so the (tokens x vocab_size)
logits are never stored whole (issue 21; SmolLM2's vocabulary of 49152 at 8 x 512 tokens: 768 -> 120 MiB)."""
LOSS_CHUNK_ALIGN = 64
"""A chunk of the loss head that is not all of a batch's rows is a multiple of this many rows, at least this
(whole tiles of the matmuls)."""


def loss_rows(c: ModelConfig, n: int) -> int:
    """Rows of one chunk of the loss head of a Model of ``n`` rows (``Model.rows``): all ``n`` where their
    float32 logits fit :data:`LOSS_CHUNK_BYTES`, else the most that do in a multiple of :data:`LOSS_CHUNK_ALIGN`
    (at least that)."""
    fit = LOSS_CHUNK_BYTES // (4 * c.vocab_size) // LOSS_CHUNK_ALIGN * LOSS_CHUNK_ALIGN
    return max(1, min(n, max(LOSS_CHUNK_ALIGN, fit)))


def loss_chunks(n: int, rows: int) -> list[tuple[int, int]]:
    """``(first row, rows)`` of each chunk of ``rows`` rows (the last may be shorter) over ``n`` rows."""
    return [(r0, min(rows, n - r0)) for r0 in range(0, n, rows)]


def activation_sizes(c: ModelConfig, batch: int, seq: int, training: bool,
                     generation: bool = False) -> dict[str, list[int]]:
    """Every activation buffer one step needs: ``{name: [elements of each buffer]}``.

    Per-layer buffers have one entry per layer; ``x`` has ``n_layers + 1`` (the residual stream
    before each layer and after the last). All elements are 4 bytes (float32 or int32). The one
    place these sizes are written: :class:`Activations` allocates them and :func:`memory_bytes`
    (``core.estimates``) adds them up. With ``generation`` (core.generate.Generator, ``batch`` 1, ``seq``
    the context): what a forward keeps nothing of for a backward is one buffer shared by all layers
    (one entry), except the KV cache (``k``, ``v``: one per layer); :data:`GENERATION_ALIASES` reuse
    buffers; no targets, mask or losses; ``logits`` of the last row only. Training's ``d_logits`` is
    ``logits`` (:data:`TRAINING_ALIASES`); ``logits`` holds one chunk of the loss head (:func:`loss_rows`).
    """
    if generation:
        return _generation_sizes(c, seq)
    n = batch * seq
    d, f, kv, v, L = c.d_model, c.ffn_dim, c.kv_dim, c.vocab_size, c.n_layers
    rows = batch * c.n_heads * seq  # one float per query row and head (attention's lse, d_sum)
    per_layer = {"attn_in": n * d, "attn_rstd": n, "q": n * d, "k": n * kv, "v": n * kv, "lse": rows,
                 "attn_out": n * d, "x_mid": n * d, "ffn_in": n * d, "ffn_rstd": n, "gate_up": 2 * n * f,
                 "h": n * f}
    sizes = {name: [size] * L for name, size in per_layer.items()}
    sizes["x"] = [n * d] * (L + 1)
    # attn_scratch: attention's scratch, a layer at a time (Attention.scratch_floats; any batch of at most `batch`
    # rows of at most `seq` tokens needs no more): K and V transposed for the keys-as-lanes kernels (CPUs), or the
    # per-query-head dK and dV partials of the split backward and the stored dS (GPUs)
    single = {"tokens": n, "targets": n, "mask": n, "tmp": n * d, "qkv": n * (d + 2 * kv), "final": n * d, "final_rstd": n,
              "logits": loss_rows(c, n) * v, "losses": n,
              "attn_scratch": Attention.scratch_floats(batch, seq, c.n_heads, c.n_kv_heads, c.head_dim)}
    if training:
        single |= {"dx": n * d, "d_norm": n * d, "dq": n * d, "dk": n * kv,
                   "dv": n * kv, "d_sum": rows, "d_attn": n * d, "dh": n * f, "d_gate_up": 2 * n * f,
                   "d_qkv": n * (d + 2 * kv)}
    sizes |= {name: [size] for name, size in single.items()}
    return sizes


GENERATION_ALIASES = {"ffn_in": "attn_in", "final": "attn_in", "ffn_rstd": "attn_rstd", "final_rstd": "attn_rstd"}
"""Generation's buffers that are another one (a norm's output and rstd are read only by the next matmul)."""
TRAINING_ALIASES = {"d_logits": "logits"}
"""Training's buffers that are another one: the loss's gradient is written over the logits (nothing reads
the logits after the loss; core/kernels/cross_entropy.cl reads each row before writing it), which saves
a buffer of a chunk of the loss head (:func:`loss_rows` x vocab_size)."""


def _generation_sizes(c: ModelConfig, seq: int) -> dict[str, list[int]]:
    """:func:`activation_sizes` of generation (see there)."""
    full = activation_sizes(c, 1, seq, training=False)
    out = {name: sizes[:1] for name, sizes in full.items()
           if name not in ("targets", "mask", "losses", "attn_scratch") and name not in GENERATION_ALIASES}
    out["k"], out["v"], out["logits"] = full["k"], full["v"], [c.vocab_size]
    return out


def step_matmuls(c: ModelConfig, n: int, training: bool) -> list[tuple[int, int, int, bool, bool]]:
    """The ``(M, N, K, trans_a, trans_b)`` of every matmul of one step over ``n = batch * seq`` rows: the
    forward of :func:`layer_forward` and :func:`forward`, and with ``training`` the backward of
    :meth:`Model._backward` (tests/test_model.py checks them against the products a step runs). For
    sizing the matmuls' scratch (``Matmul.reserve``, ``scratch_bound_floats``)."""
    d, kv, f, v = c.d_model, c.kv_dim, c.ffn_dim, c.vocab_size
    head = sorted({rows for _, rows in loss_chunks(n, loss_rows(c, n))})  # the loss head's chunks (and the last)
    out = [(n, d + 2 * kv, d, False, True), (n, d, d, False, True), (n, 2 * f, d, False, True),
           (n, d, f, False, True)] + [(r, v, d, False, True) for r in head]
    if training:
        out += [s for r in head for s in ((v, d, r, True, False), (r, d, v, False, False))]  # output projection
        out += [(d, f, n, True, False), (n, f, d, False, False),                   # ffn_down
                (2 * f, d, n, True, False), (n, d, 2 * f, False, False),           # [ffn_gate; ffn_up]
                (d, d, n, True, False), (n, d, d, False, False),                   # attn_output
                (d + 2 * kv, d, n, True, False), (n, d, d + 2 * kv, False, False)]  # [attn_q; attn_k; attn_v]
    return out


# A run may plan to fill this share of CL_DEVICE_GLOBAL_MEM_SIZE: the driver, the display and the other
# programs on the device keep the rest. The one memory rule: Model, the CLI and the GUI all apply it.
MEMORY_SHARE = 0.9


def frozen_tensors(freeze_embeddings: bool) -> tuple[str, ...]:
    """The tensors that get no gradient and no AdamW moments: ``token_embd.weight`` when frozen."""
    return (tensor_name(T.TOKEN_EMBD),) if freeze_embeddings else ()


def memory_bytes(config: ModelConfig, batch_size: int, training: bool = True,
                 frozen: tuple[str, ...] = (), lora: LoRAConfig | None = None,
                 quantized: dict | None = None, generation: bool = False,
                 max_seq: int | None = None) -> tuple[int, int]:
    """``(total, largest)``: bytes of every device buffer a training run (or, without ``training``, a
    forward-only :class:`Model`) of ``batch_size`` sequences of at most ``max_seq`` tokens (None:
    ``context_length``; :class:`Model`'s ``max_seq``) allocates, and of its largest single buffer:
    weights; for training also gradients and two AdamW moments of every tensor not in ``frozen`` (the
    update is checked before it is applied, :meth:`Model.optimizer_step`: no copies of them);
    activations of :func:`activation_sizes`; the matmuls' scratch (``scratch_bound_floats`` of
    :func:`step_matmuls`, which :meth:`Model.__init__` reserves). With ``lora`` the whole base is frozen
    and the trained tensors are the adapters (``core.lora``: their weights, grads, moments,
    the products' scratch and :class:`core.lora.LoRAScratch`); ``quantized`` (:func:`quantized_plan`):
    those base matrices are held in their GGUF formats instead of float32
    (:func:`core.quant_base.device_bytes`; a group held as a matrix per member adds
    :func:`core.quant_base.group_scratch_floats`). ``generation``: a core.generate.Generator's buffers (its
    weights, its :func:`activation_sizes` with ``generation``, the matmuls' scratch of a full prompt;
    ``max_seq`` does not apply: the KV cache holds ``context_length`` rows).
    """
    seq = config.context_length if generation or max_seq is None else max_seq
    acts = activation_sizes(config, batch_size, seq, training and not generation, generation)
    n_params, rows = config.n_params(), batch_size * seq
    shapes = step_matmuls(config, rows, training)
    if lora:
        ad = adapter_params(config, lora)
        params = n_params + ad + (3 * ad if training else 0)
        params += scratch_floats(config, lora, rows)  # the forward keeps each matrix's u and Bd too
        shapes += lora_matmuls(config, lora, rows, training and not generation)
    else:
        trained = n_params - sum(math.prod(s) for n, s in config.param_shapes() if n in frozen)
        params = n_params + (3 * trained if training else 0)  # weights (+ grads, m, v)
    quant, replaced = quant_base.device_bytes(config, quantized) if quantized else (0, 0)
    scratch = scratch_bound_floats(shapes) + (quant_base.group_scratch_floats(config, quantized, rows) if quantized else 0)
    total = 4 * (params - replaced + scratch) + quant + 4 * sum(sum(v) for v in acts.values())
    largest = 4 * max([n_params - replaced] + [max(v) for v in acts.values()])
    return total, largest


def fits_in(total_bytes: int, global_mem_bytes: int) -> bool:
    """Whether ``total_bytes`` of buffers fit a device with ``global_mem_bytes`` (:data:`MEMORY_SHARE`)."""
    return total_bytes <= MEMORY_SHARE * global_mem_bytes


def memory_problem(config: ModelConfig, batch_size: int, global_mem_bytes: int, max_alloc_bytes: int | None,
                   device_name: str, training: bool = True, frozen: tuple[str, ...] = (),
                   lora: LoRAConfig | None = None, quantized: dict | None = None,
                   generation: bool = False, max_seq: int | None = None) -> str | None:
    """Why a device cannot hold a model's buffers (one line), or None when it can.

    The largest buffer must not exceed CL_DEVICE_MAX_MEM_ALLOC_SIZE (``max_alloc_bytes``; None: not
    known, not checked), and all buffers together must fit :func:`fits_in`; the message gives both figures.
    """
    total, largest = memory_bytes(config, batch_size, training, frozen, lora, quantized, generation, max_seq)
    gib = 2 ** 30
    if max_alloc_bytes is not None and largest > max_alloc_bytes:
        return (f"the model needs a single buffer of {largest / gib:.2f} GiB but {device_name} allows "
                f"{max_alloc_bytes / gib:.2f} GiB per buffer: lower batch_size, context_length, "
                "vocab_size or d_model")
    if not fits_in(total, global_mem_bytes):
        return (f"{'generation' if generation else 'training'} needs about {total / gib:.2f} GiB of device memory but {device_name} has "
                f"{global_mem_bytes / gib:.2f} GiB: lower batch_size, context_length, d_model, "
                "ffn_dim or n_layers")
    return None


def check_fits(dev: Device, config: ModelConfig, batch_size: int, training: bool = True,
               frozen: tuple[str, ...] = (), lora: LoRAConfig | None = None, quantized: dict | None = None,
               generation: bool = False, max_seq: int | None = None) -> None:
    """Refuse, before allocating, a model whose buffers the device cannot hold (``frozen`` tensors
    have no gradient and no AdamW moments; arguments as :func:`memory_bytes`).

    Raises:
        ValueError: :func:`memory_problem`'s message.
    """
    problem = memory_problem(config, batch_size, dev.global_mem_size, dev.max_alloc_bytes, dev.info.name,
                             training, frozen, lora, quantized, generation, max_seq)
    if problem:
        raise ValueError(problem)


def linear(o: Ops, w: Any, out: Any, x: Any, n: int, n_out: int, n_in: int) -> None:
    """``out (n, n_out) = x (n, n_in) @ W^T`` for a weight buffer ``w`` (row-major (n_out, n_in)), or
    ``w.forward(out, x, n)`` for a matrix object (core.lora: a frozen base, with or without adapters)."""
    if hasattr(w, "forward"):
        w.forward(out, x, n)
    else:
        o.matmul(out, x, w, n, n_out, n_in, trans_b=True)


def linear_input_grad(o: Ops, w: Any, dx: Any, dy: Any, x: Any, n: int, n_out: int, n_in: int) -> None:
    """``dx (n, n_in) = dy (n, n_out) @ W`` (overwritten) for a weight buffer, or the matrix object's
    ``input_grad`` (which, given the layer's input ``x``, also accumulates its adapters' gradients)."""
    if hasattr(w, "input_grad"):
        w.input_grad(dx, dy, n, x=x)
    else:
        o.matmul(dx, dy, w, n, n_in, n_out)


def layer_forward(o: Ops, c: ModelConfig, p: dict, a: Any, i: int, b: int, t: int, pos: int) -> None:
    """Layer ``i`` of the forward pass; the one code path of training and generation.

    Reads ``a.x[i]`` and ``a.attn_in[i] = rmsnorm(a.x[i]) * attn_norm`` (made by the previous step,
    see :func:`forward`); writes ``a.x[i + 1]`` and the norm that follows it, fused into the last
    residual add: ``a.attn_in[i + 1]`` (next layer's attn_norm) or ``a.final`` (output_norm).

    Args:
        o: launchers; c: architecture; p: ``{gguf name: cl.Buffer}`` weight views.
        a: activation buffers named as in :func:`activation_sizes`; for generation the per-layer
            lists may all hold one buffer each (nothing is kept for backward), and ``a.k[i]``,
            ``a.v[i]`` are the layer's KV cache.
        i: layer index.
        b, t: batch and new tokens per sequence (``n = b * t`` rows).
        pos: tokens already in the KV cache: the new rows' K/V are written at rows
            ``pos .. pos + t - 1`` of ``a.k[i]`` / ``a.v[i]`` and rotated for those positions;
            attention sees keys ``0 .. pos + t - 1``. Training: ``pos = 0`` (K/V of this batch only).
            ``pos > 0`` needs ``b == 1``.
    """
    n, d, kv, f = b * t, c.d_model, c.kv_dim, c.ffn_dim
    w = lambda kind: p[tensor_name(kind, i)]  # noqa: E731
    # attention block: x_mid = x + attention(attn_in) @ Wo.T
    # one matmul: rows [q | k | v] = attn_in @ [Wq; Wk; Wv].T (the weights are one group), then RoPE
    # on q and k while splitting the rows into q (n, d) and rows pos.. of k, v (n, kv)
    linear(o, p[qkv_group(i)], a.qkv, a.attn_in[i], n, d + 2 * kv, d)  # (n, d+2kv)
    o.rope.split_qkv(a.q[i], a.k[i], a.v[i], a.qkv, n, t, c.n_heads, c.n_kv_heads, c.head_dim, pos,
                     c.rope_theta, kv_row0=pos)
    o.attention.forward(a.attn_out[i], a.lse[i], a.q[i], a.k[i], a.v[i],
                        b, t, pos + t, pos, c.n_heads, c.n_kv_heads, c.head_dim,
                        scratch=getattr(a, "attn_scratch", None))
    linear(o, w(T.ATTN_OUT), a.tmp, a.attn_out[i], n, d, d)
    # x_mid = x + tmp, fused with ffn_in = rmsnorm(x_mid) * ffn_norm
    o.rmsnorm.forward_residual(a.x_mid[i], a.ffn_in[i], a.ffn_rstd[i], a.x[i], a.tmp, w(T.FFN_NORM), n, d,
                               c.norm_eps)
    # feed-forward block: x[i+1] = x_mid + swiglu(ffn_in) @ Wdown.T (SwiGLU, Shazeer 2020)
    # one matmul for gate and up: rows [gate | up] = ffn_in @ [Wgate; Wup].T (the weights are one group)
    linear(o, p[gate_up_group(i)], a.gate_up[i], a.ffn_in[i], n, 2 * f, d)  # (n, 2f)
    o.swiglu.forward_fused(a.h[i], a.gate_up[i], n, f)                                      # (n, f)
    linear(o, w(T.FFN_DOWN), a.tmp, a.h[i], n, d, f)                                       # (n, d)
    # x[i+1] = x_mid + tmp, fused with the norm that reads it next
    if i + 1 < c.n_layers:
        out, rstd, norm = a.attn_in[i + 1], a.attn_rstd[i + 1], p[tensor_name(T.ATTN_NORM, i + 1)]
    else:
        out, rstd, norm = a.final, a.final_rstd, p[tensor_name(T.OUTPUT_NORM)]
    o.rmsnorm.forward_residual(a.x[i + 1], out, rstd, a.x_mid[i], a.tmp, norm, n, d, c.norm_eps)


def decode_layer_forward(o: Ops, c: ModelConfig, p: dict, a: Any, i: int, pos: int) -> None:
    """:func:`layer_forward` for one token (b = t = 1) as one launch (core/kernels/decode.cl): the same
    buffers read and written as there but x_mid and the RMSNorm rstd's (not needed after a decode step);
    ``a.lse[i]`` (n_heads x rows floats, rows > pos) holds the attention scores instead of the lse."""
    w = lambda kind: p[tensor_name(kind, i)]  # noqa: E731
    out, norm = ((a.attn_in[i + 1], p[tensor_name(T.ATTN_NORM, i + 1)]) if i + 1 < c.n_layers
                 else (a.final, p[tensor_name(T.OUTPUT_NORM)]))
    embed = (a.tokens, p[tensor_name(T.TOKEN_EMBD)], p[tensor_name(T.ATTN_NORM, 0)]) if i == 0 else None
    o.decode(a.x[i + 1], out, a.k[i], a.v[i], a.qkv, a.q[i], a.attn_out[i], a.ffn_in[i], a.gate_up[i], a.h[i],
             a.lse[i], a.x[i], a.attn_in[i], embed, p[qkv_group(i)], w(T.ATTN_OUT), w(T.FFN_NORM),
             p[gate_up_group(i)], w(T.FFN_DOWN), norm, o.rope.cos_sin_table(c.head_dim, c.rope_theta, pos + 1), c, pos)


def forward(o: Ops, c: ModelConfig, p: dict, a: Any, b: int, t: int, pos: int = 0, last_row_only: bool = False,
            backward: bool = False) -> None:
    """The whole forward pass in layer order (training and generation): ``a.tokens (b*t)`` int32 ->
    ``a.final``, float32 ``(b*t, d_model)``, the loss head's input (a Model runs the head over chunks of rows:
    :func:`loss_rows`), and with ``last_row_only`` the logits of the last row (``vocab_size`` floats at the start
    of ``a.logits``; generation). Arguments as :func:`layer_forward`. One token of one sequence (decode) runs a
    layer as one launch where :meth:`core.kernels.decode.DecodeLayer.suits` says so (small, its matrices
    float32 buffers), unless ``backward``: a training step's forward, whose activations the backward reads
    (the one-launch layer keeps none of them).
    """
    n, d = b * t, c.d_model
    one = [not backward and n == 1 and DecodeLayer.suits(o.dev, c, [p[qkv_group(i)], p[gate_up_group(i)], p[tensor_name(T.ATTN_OUT, i)],
                                                   p[tensor_name(T.FFN_DOWN, i)]]) for i in range(c.n_layers)]
    if not one[0]:  # (else the first layer's launch embeds and normalises)
        o.embedding.forward(a.x[0], a.tokens, p[tensor_name(T.TOKEN_EMBD)], n, d, c.vocab_size)     # (n, d)
        o.rmsnorm.forward(a.attn_in[0], a.attn_rstd[0], a.x[0], p[tensor_name(T.ATTN_NORM, 0)], n, d, c.norm_eps)
    for i in range(c.n_layers):
        if one[i]:  # per layer: a file may keep some layers quantized (matrix objects) and others float32
            decode_layer_forward(o, c, p, a, i, pos)
        else:
            layer_forward(o, c, p, a, i, b, t, pos)
    # a.final = rmsnorm(x[n_layers]) * output_norm was fused into the last layer
    if not last_row_only:
        return
    w_out = p[LOGITS_MATRIX] if LOGITS_MATRIX in p else p[c.output_weight]  # (vocab, d); tied: token_embd
    if hasattr(w_out, "forward"):  # the last row's logits (1, vocab)
        w_out.forward(a.logits, a.final, 1, x_offset=(n - 1) * d)
    else:
        o.matmul(a.logits, a.final, w_out, 1, c.vocab_size, d, trans_b=True, a_offset=(n - 1) * d)


def adapter_layout(dev: Device, config: ModelConfig, lora: LoRAConfig) -> Layout:
    """The layout of a LoRA model's adapter store: each matrix's A's and B's stacked
    (:func:`core.lora.adapter_storage`), aligned as the parameters (:func:`layout_align`)."""
    shapes, groups = adapter_storage(config, lora)
    return Layout(shapes, layout_align(dev), groups=groups)


def lora_views(dev: Device, config: ModelConfig, lora: LoRAConfig, frozen_of, adapter_views: dict,
               grad_views: dict, matmul: Matmul, rows: int) -> tuple[dict[str, Any], list[LoRALinear]]:
    """Every block matrix (or fused group, :data:`core.lora.FUSED`) of a LoRA model as forward reads it: its
    frozen base matrix ``frozen_of(name, n_out, n_in)`` (a :class:`core.lora.FrozenMatrix`), wrapped in a
    :class:`core.lora.LoRALinear` over ``adapter_views`` (and ``grad_views``' gradients, when training) where
    it has adapters; the products' scratch is :class:`core.lora.LoRAScratch` for ``rows`` rows.
    The Model's and a Generator's (decoding a quantized base with its adapters) one construction.

    Returns:
        ``({name: frozen matrix or LoRALinear}, [the LoRALinears])``: call ``refresh()`` on each after the
        adapters' B's are loaded or changed.
    """
    scratch = LoRAScratch.for_model(dev, rows, config, lora)
    diag, views, linears = LoRABlockDiag(dev), {}, []
    names = {"attn_qkv": qkv_group, "ffn_gate_up": gate_up_group,
             "attn_output": lambda i: tensor_name(T.ATTN_OUT, i), "ffn_down": lambda i: tensor_name(T.FFN_DOWN, i)}
    fused = {(f.block, f.matrix): f for f in fused_adapters(config, lora)}
    for i in range(config.n_layers):
        for matrix, kinds in FUSED:
            name = names[matrix](i)
            n_out, n_in = sum(target_shape(config, k)[0] for k in kinds), target_shape(config, kinds[0])[1]
            frozen, f = frozen_of(name, n_out, n_in), fused.get((i, matrix))
            if f is None:
                views[name] = frozen
                continue
            a, b = f.group(SUFFIX_A), f.group(SUFFIX_B)
            lin = LoRALinear(frozen, n_out, n_in, [(col0, width) for _, col0, width in f.parts], lora.scale,
                             lora.rank, adapter_views[a], adapter_views[b], grad_views.get(a), grad_views.get(b),
                             matmul, diag, scratch, dev)
            views[name] = lin
            linears.append(lin)
    return views, linears


class Activations:
    """Buffers for one forward/backward of up to ``batch x seq`` tokens (see activation_sizes); with
    ``generation``, a core.generate.Generator's (one buffer per kind shared by the layers, a KV cache of
    ``seq`` rows per layer, :data:`GENERATION_ALIASES`)."""

    _INT32 = ("tokens", "targets")
    _SINGLE = ("tokens", "targets", "mask", "tmp", "qkv", "d_qkv", "final", "final_rstd", "logits", "losses", "attn_scratch", "d_logits", "dx",
               "d_norm", "dq", "dk", "dv", "d_sum", "d_attn", "dh", "d_gate_up")

    def __init__(self, dev: Device, c: ModelConfig, batch: int, seq: int, training: bool, generation: bool = False):
        for name, sizes in activation_sizes(c, batch, seq, training, generation).items():
            if name in self._INT32:
                bufs = [dev.zeros(n, np.int32) for n in sizes]
            elif name == "mask":
                bufs = [dev.zeros(n) for n in sizes]
            else:
                bufs = [dev.alloc(n) for n in sizes]
            if generation and name not in self._SINGLE and len(bufs) == 1:  # one buffer for every layer
                bufs = bufs * (c.n_layers + 1 if name == "x" else c.n_layers)
            setattr(self, name, bufs[0] if name in self._SINGLE else bufs)
        aliases = GENERATION_ALIASES if generation else TRAINING_ALIASES if training else {}
        for alias, name in aliases.items():
            bufs = getattr(self, name)
            setattr(self, alias, bufs[0] if alias in self._SINGLE and isinstance(bufs, list) else bufs)


class Model:
    """Weights, gradients, AdamW moments and activations of one model on one device.

    Args:
        dev: the OpenCL device.
        config: the architecture.
        batch_size: largest batch a step will use.
        weights: initial weights ``{gguf name: array}``; random (``init_weights``) when None.
        seed: seed for random weights.
        training: allocate gradients, moments and backward buffers.
        freeze_embeddings: ``token_embd.weight`` is not trained: it gets no gradient and no AdamW
            moments (the memory of three copies of it is saved). It must be the first tensor of the
            layout (it is: ``ModelConfig.param_shapes``).
        max_seq: the longest row of a full batch, 1..context_length (None: context_length). Every
            per-token buffer (activations, the matmuls' and the adapters' scratch) holds
            ``batch_size x max_seq`` tokens, as :func:`memory_bytes` counts them; a batch of fewer rows
            may have longer ones, up to context_length, in no more tokens (a recall check's long
            prompts come in small batches). A batch of more tokens is refused (ValueError).

    Raises:
        ValueError: ``max_seq`` outside 1..context_length, or :func:`check_fits`'s message.
    """

    def __init__(self, dev: Device, config: ModelConfig, batch_size: int = 1,
                 weights: dict[str, np.ndarray] | None = None, seed: int = 0, training: bool = True,
                 freeze_embeddings: bool = False, lora: LoRAConfig | None = None,
                 adapter: dict[str, np.ndarray] | None = None, quantized: RawBase | None = None,
                 max_seq: int | None = None):
        self.dev, self.config, self.batch_size, self.training = dev, config, batch_size, training
        self.max_seq = config.context_length if max_seq is None else int(max_seq)
        if not 1 <= self.max_seq <= config.context_length:
            raise ValueError(f"max_seq {self.max_seq} outside 1..context_length ({config.context_length})")
        self.lora = lora
        self.frozen = tuple(n for n, _ in config.param_shapes()) if lora else frozen_tensors(freeze_embeddings)
        self.quantized_plan = quantized_plan(config, lora, quantized)  # these stay in their GGUF formats
        check_fits(dev, config, batch_size, training, self.frozen, lora, self.quantized_plan, max_seq=self.max_seq)
        self.ops = Ops(dev)
        # GPUs: the attention kernels measured faster at this shape (once per device), built now, not mid-step
        self.ops.attention.use_tiling(config.head_dim, attention_autotune.tiling(
            dev, batch_size, self.max_seq, config.n_heads, config.n_kv_heads, config.head_dim, backward=training))
        self.ops.attention.tiles(config.head_dim)
        products = step_matmuls(config, self.rows, training) + (lora_matmuls(config, lora, self.rows, training)
                                                                if lora else [])
        # GPUs: each product's fastest tiling, timed once per device and shape (before this model's buffers
        # exist: the timing's operands are one product's, which the model holds anyway)
        self.ops.matmul.use_shape_configs(matmul_autotune.shape_configs(dev, products))
        self._setup_params(weights if weights is not None else init_weights(config, seed), quantized)
        # Trained tensors: all, or all but token_embd (frozen). Their layout is the parameter layout
        # shifted by token_embd's aligned size, so the optimizer's ranges are sub-buffers of params.
        self.train_layout, self._trained, self.trained = self.layout, self.params.flat, self.params
        self._views: dict[str, Any] = self.params.views  # what forward reads: buffers, or core.lora matrices
        self._norm_sink = None
        if lora:  # trained: the adapters only (their own store); the base is frozen (core/lora.py)
            self._setup_lora(lora, adapter, seed)
        elif self.frozen:
            self.train_layout = param_layout(dev, config, self.frozen)
            first = next(n for n, _ in config.param_shapes() if n not in self.frozen)
            shift = self.layout.slots[first].offset
            self._trained = self.params.flat.get_sub_region(shift * 4, self.train_layout.total * 4)
        if training:
            self.grads = TensorStore(dev, self.train_layout)
            self.m = TensorStore(dev, self.train_layout)
            self.v = TensorStore(dev, self.train_layout)
        if lora:
            self._views = self._lora_views(lora)
        self.act = Activations(dev, config, batch_size, self.max_seq, training)
        self.loss_rows = loss_rows(config, self.rows)  # rows of a chunk of the loss head (a.logits holds one)
        # the products of a step allocate nothing while they run (their scratch is counted by memory_bytes)
        self.ops.matmul.reserve(products)
        names = list(self.train_layout.slots)
        self._stat_names = names
        layer = layer_of(config)
        self._stat_layers = [layer[base_name(n)] for n in names]  # entry of StepStats.layer_grad_norms per tensor
        self._stat_segments = [(self.train_layout.slots[n].offset, self.train_layout.slots[n].size) for n in names]
        # stats[0] = loss sum, stats[1] = mask sum, stats[2 + i] = sum of squares of grad tensor i
        self._stats = dev.zeros(2 + len(names))
        self.adam_step = 0
        self._grad_sq: float | None = None  # sum of squares of the last forward_backward's gradients
        self._adam_bounds = None  # (_adam_state(), AdamW.bounds) after this model's last update
        self._token_index = None  # the batch's tokens grouped by id (GPUs; set by _load_batch)

    @property
    def rows(self) -> int:
        """Tokens (rows x sequence length) the largest batch may hold: ``batch_size x max_seq``."""
        return self.batch_size * self.max_seq

    def memory_estimate(self) -> int:
        """Bytes of this model's device buffers, as :func:`memory_bytes` counts them (what
        :func:`check_fits` checked)."""
        return memory_bytes(self.config, self.batch_size, self.training, self.frozen, self.lora,
                            self.quantized_plan, max_seq=self.max_seq)[0]

    def _setup_params(self, weights: dict[str, np.ndarray], quantized: RawBase | None) -> None:
        """The float32 parameter store, without the matrices of :attr:`quantized_plan` (uploaded in
        their GGUF bytes instead: ``self._quant_frozen``; their host arrays are kept for :meth:`weights`)."""
        in_quant = quant_base.members(self.quantized_plan)
        self.layout = param_layout(self.dev, self.config, in_quant)
        self.params = TensorStore(self.dev, self.layout)
        self.params.load(weights)
        self._host_quantized = {n: weights[n] for n in in_quant}
        self._quant_frozen = quant_base.frozen_matrices(self.dev, self.config, self.quantized_plan, quantized,
                                                        self.ops.matmul._scratch, rows=self.rows)

    # ------------------------------------------------------------------ LoRA
    def _setup_lora(self, lora: LoRAConfig, adapter: dict[str, np.ndarray] | None, seed: int) -> None:
        """The adapters' store (the trained tensors; each matrix's A's and B's stacked: core.lora.adapter_storage)
        and the sink of the frozen norms' gradients."""
        self.train_layout = adapter_layout(self.dev, self.config, lora)
        self.adapter = TensorStore(self.dev, self.train_layout)
        self.adapter.load(adapter if adapter is not None else init_adapter(self.config, lora, seed))
        self._trained, self.trained = self.adapter.flat, self.adapter
        self._norm_sink = self.dev.zeros(self.config.d_model)

    def _lora_views(self, lora: LoRAConfig) -> dict[str, Any]:
        """The weight views with every block matrix (or fused group) replaced by its frozen matrix
        (:meth:`_frozen_matrix`), wrapped in a :class:`core.lora.LoRALinear` where it has adapters."""
        gv = self.grads.views if self.training else {}  # no gradients: forward only
        views, self._lora_linears = lora_views(self.dev, self.config, lora, self._frozen_matrix, self.adapter.views,
                                               gv, self.ops.matmul, self.rows)
        self._adapter_version = None  # Bd built from the B's at the first batch (_load_batch)
        return {**self.params.views, **views}

    def _frozen_matrix(self, name: str, n_out: int, n_in: int) -> DenseFrozen:
        """The frozen base matrix ``name`` (a weight or a fused group, (n_out, n_in)) as a
        :class:`core.lora.FrozenMatrix`: our float32 matmul over its view of the parameter buffer (the
        one place a quantized matrix is chosen instead: :class:`core.quant_base.QuantFrozen` over its
        GGUF block bytes when :attr:`quantized_plan` keeps it)."""
        if name in self._quant_frozen:
            return self._quant_frozen[name]
        return DenseFrozen(self.ops.matmul, self.params.views[name], n_out, n_in)

    def adapter_weights(self) -> dict[str, np.ndarray]:
        """Host copy of the adapters, ``{<base name>.lora_a / .lora_b: float32 array}`` (LoRA models)."""
        return self.adapter.to_numpy()

    def inference_weights(self) -> TensorStore | dict[str, np.ndarray]:
        """What a :class:`core.generate.Generator` of this model takes: the parameter store, or with
        LoRA the base weights with the adapters merged in (host arrays)."""
        if not self.lora:
            return self.params
        return merge(self.weights(), self.adapter_weights(), self.lora)

    # ------------------------------------------------------------------ forward
    def _load_batch(self, tokens: np.ndarray, targets: np.ndarray | None, mask: np.ndarray | None):
        tokens = np.asarray(tokens, np.int32)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be (batch, seq), got shape {tokens.shape}")
        b, t = tokens.shape
        if b > self.batch_size:
            raise ValueError(f"batch of {b} exceeds the model's batch_size {self.batch_size}")
        if t > self.config.context_length:
            raise ValueError(f"sequence of {t} tokens exceeds context_length {self.config.context_length}")
        if b * t > self.rows:
            raise ValueError(f"batch of {b} x {t} tokens exceeds the {self.batch_size} x {self.max_seq} (max_seq) "
                             "the model's buffers were sized for")
        bad = (tokens < 0) | (tokens >= self.config.vocab_size)
        if bad.any():
            raise ValueError(f"token id {int(tokens[bad][0])} outside vocab_size {self.config.vocab_size}")
        if targets is not None:
            targets, mask = np.asarray(targets, np.int32), np.asarray(mask, np.float32)
            if targets.shape != tokens.shape or mask.shape != tokens.shape:
                raise ValueError(f"targets {targets.shape} and mask {mask.shape} must have the shape of tokens "
                                 f"{tokens.shape}")
            bad = (mask != 0) & ((targets < 0) | (targets >= self.config.vocab_size))
            if bad.any():
                raise ValueError(f"target id {int(targets[bad][0])} outside vocab_size {self.config.vocab_size}")
        if self.lora and self._adapter_version != self.adapter.version:  # the B's changed: rebuild each Bd
            for lin in self._lora_linears:
                lin.refresh()
            self._adapter_version = self.adapter.version
        self.dev.upload(tokens, self.act.tokens)
        # GPUs: the embedding backward runs over the batch's tokens grouped by id (built here, on the host)
        self._token_index = (self.ops.embedding.index_tokens(tokens, self.config.vocab_size)
                             if targets is not None and self.ops.embedding.sorted_backward else None)
        if targets is not None:
            self.dev.upload(targets, self.act.targets)
            self.dev.upload(mask, self.act.mask)
        return b, t

    def _forward(self, b: int, t: int, backward: bool = False) -> None:
        """Forward pass in layer order up to ``a.final`` (the loss head's input); with ``backward`` every
        activation the backward reads is kept (:func:`forward`)."""
        forward(self.ops, self.config, self._views, self.act, b, t, backward=backward)

    def _head_logits(self, row0: int, rows: int, src: Any = None) -> None:
        """``a.logits (rows, vocab_size)`` of rows ``row0 ..`` of ``src`` (default ``a.final``), (n, d_model)."""
        c, a = self.config, self.act
        self.ops.matmul(a.logits, a.final if src is None else src, self._views[c.output_weight], rows, c.vocab_size,
                        c.d_model, trans_b=True, a_offset=row0 * c.d_model)

    def _read_logits(self, n: int, src: Any = None) -> np.ndarray:
        """float32 ``(n, vocab_size)``: the logits of the first ``n`` rows of ``src`` (default ``a.final``), a chunk
        of the loss head at a time."""
        out = np.empty((n, self.config.vocab_size), np.float32)
        for row0, rows in loss_chunks(n, self.loss_rows):
            self._head_logits(row0, rows, src)
            out[row0:row0 + rows] = self.dev.download(self.act.logits, (rows, self.config.vocab_size))
        return out

    def _head_backward(self, row0: int, rows: int) -> None:
        """The output projection's backward for rows ``row0 ..`` from ``a.d_logits (rows, vocab_size)``: its weight
        gradient accumulated (tied embeddings: into token_embd.weight's, which the embedding's adds to last), and
        ``a.d_norm`` of those rows."""
        c, a, g, mm = self.config, self.act, self.grads.views, self.ops.matmul
        d, v = c.d_model, c.vocab_size
        if c.output_weight in g:  # not when frozen (tied embeddings, freeze_embeddings, LoRA)
            mm(g[c.output_weight], a.d_logits, a.final, v, d, rows, trans_a=True, accumulate=True, b_offset=row0 * d)
        mm(a.d_norm, a.d_logits, self._views[c.output_weight], rows, d, v, c_offset=row0 * d)

    # ------------------------------------------------------------------ backward
    def _backward(self, b: int, t: int) -> None:
        """Backward pass below the loss head (:meth:`_head_backward`), in reverse layer order; accumulates into
        ``self.grads``."""
        c, o, a, p, g = self.config, self.ops, self.act, self._views, self.grads.views
        n, d = b * t, c.d_model
        # the output projection's backward ran with the loss, chunk by chunk (_head_backward): a.d_norm is
        # dL/d(final) of every row; the final norm's backward
        out_norm = tensor_name(T.OUTPUT_NORM)
        o.rmsnorm.backward(a.dx, g.get(out_norm, self._norm_sink), a.d_norm, a.x[c.n_layers], p[out_norm],
                           a.final_rstd, n, d)
        # a.dx now holds dL/dx for the residual stream; walk the layers backwards
        for i in reversed(range(c.n_layers)):
            self._layer_backward(i, b, t)
        embd = tensor_name(T.TOKEN_EMBD)
        if embd in g:  # frozen embeddings get no gradient
            o.embedding.backward(g[embd], a.dx, a.tokens, n, c.vocab_size, d,
                                 index=self._token_index)

    def _layer_backward(self, i: int, b: int, t: int) -> None:
        """Layer ``i``'s backward (the reverse of :func:`layer_forward`): ``a.dx`` from dL/dx[i+1] to
        dL/dx[i]; weight gradients only of trained matrices (a frozen one gives its input gradient)."""
        c, o, a, p, g = self.config, self.ops, self.act, self._views, self.grads.views
        n, d, kv, f = b * t, c.d_model, c.kv_dim, c.ffn_dim
        mm, sink = o.matmul, self._norm_sink  # sink: the gradient of a frozen norm weight, never read
        down, ffn_norm, att_out, att_norm = (tensor_name(k, i) for k in (T.FFN_DOWN, T.FFN_NORM, T.ATTN_OUT,
                                                                         T.ATTN_NORM))
        gu, qkv = gate_up_group(i), qkv_group(i)  # [Wgate; Wup] (2f, d), [Wq; Wk; Wv] (d+2kv, d)
        # feed-forward block: x[i+1] = x_mid + swiglu(ffn_in) @ Wdown.T
        if down in g:
            mm(g[down], a.dx, a.h[i], d, f, n, trans_a=True, accumulate=True)
        linear_input_grad(o, p[down], a.dh, a.dx, a.h[i], n, d, f)
        o.swiglu.backward_fused(a.d_gate_up, a.dh, a.gate_up[i], n, f)  # rows [d_gate | d_up] (n, 2f)
        if gu in g:
            mm(g[gu], a.d_gate_up, a.ffn_in[i], 2 * f, d, n, trans_a=True, accumulate=True)
        linear_input_grad(o, p[gu], a.d_norm, a.d_gate_up, a.ffn_in[i], n, 2 * f, d)
        # dx += the norm's input gradient: dx = dL/dx_mid
        o.rmsnorm.backward(a.dx, g.get(ffn_norm, sink), a.d_norm, a.x_mid[i], p[ffn_norm], a.ffn_rstd[i], n, d,
                           accumulate=True)
        # attention block: x_mid = x[i] + attn(attn_in) @ Wo.T
        if att_out in g:
            mm(g[att_out], a.dx, a.attn_out[i], d, d, n, trans_a=True, accumulate=True)
        linear_input_grad(o, p[att_out], a.d_attn, a.dx, a.attn_out[i], n, d, d)
        o.attention.backward(a.dq, a.dk, a.dv, a.d_sum, a.d_attn, a.q[i], a.k[i], a.v[i], a.attn_out[i],
                             a.lse[i], b, t, c.n_heads, c.n_kv_heads, c.head_dim, scratch=a.attn_scratch)
        # rows [dq | dk | dv] with the inverse RoPE (n, d+2kv); one matmul each way for [Wq; Wk; Wv]
        o.rope.join_qkv(a.d_qkv, a.dq, a.dk, a.dv, n, t, c.n_heads, c.n_kv_heads, c.head_dim, 0, c.rope_theta)
        if qkv in g:
            mm(g[qkv], a.d_qkv, a.attn_in[i], d + 2 * kv, d, n, trans_a=True, accumulate=True)
        linear_input_grad(o, p[qkv], a.d_norm, a.d_qkv, a.attn_in[i], n, d + 2 * kv, d)
        # dx += the norm's input gradient: dx = dL/dx[i]
        o.rmsnorm.backward(a.dx, g.get(att_norm, sink), a.d_norm, a.x[i], p[att_norm], a.attn_rstd[i], n, d,
                           accumulate=True)

    # ------------------------------------------------------------------ public API
    def logits(self, tokens: np.ndarray) -> np.ndarray:
        """Logits for every position of a batch.

        Args:
            tokens: int (batch, seq) token ids, seq <= context_length, batch <= batch_size,
                batch x seq <= batch_size x max_seq.

        Returns:
            float32 (batch, seq, vocab_size).

        Raises:
            ValueError: shape or token ids out of range.
        """
        tokens = np.atleast_2d(tokens)
        b, t = self._load_batch(tokens, None, None)
        self._forward(b, t)
        return self._read_logits(b * t).reshape(b, t, self.config.vocab_size)

    def last_logits(self, tokens: np.ndarray, lengths: list[int] | np.ndarray) -> np.ndarray:
        """Logits after the last token of each row: row ``j``'s ``tokens[j, lengths[j] - 1]`` (core.recall's
        batched greedy decoding: only these rows of the output projection are computed and read back).

        Args:
            tokens: int (batch, seq) token ids, as :meth:`logits`.
            lengths: int (batch,), each in 1..seq: the tokens of each row (the rest is padding).

        Returns:
            float32 (batch, vocab_size).

        Raises:
            ValueError: shape, token ids or lengths out of range.
        """
        tokens = np.atleast_2d(tokens)
        lengths = np.asarray(lengths)
        b, t = tokens.shape
        if (lengths.shape != (b,) or lengths.dtype.kind not in "iu" or lengths.min(initial=1) < 1
                or lengths.max(initial=1) > t):
            raise ValueError(f"lengths {lengths.tolist()} must be one per row of {b}, each in 1..{t}")
        self._load_batch(tokens, None, None)
        self._forward(b, t)
        a, d = self.act, self.config.d_model
        for j, n_tok in enumerate(lengths):  # gather each row's last final vector: (b, d_model) at the start of a.tmp
            self.dev.copy(a.tmp, a.final, d, dst_offset=j * d, src_offset=(j * t + int(n_tok) - 1) * d)
        return self._read_logits(b, a.tmp)

    def next_logits(self, ids: list[int], pos: int) -> np.ndarray:
        """Logits after the last of ``ids``, one sequence decoded with this model's K/V buffers as its cache
        (core.recall's cached greedy decoding; what core.generate.Generator.feed does with its own).

        Args:
            ids: the sequence's next tokens (at least one).
            pos: its tokens before them, fed by the calls since the one with ``pos`` 0 (which starts it);
                the activations of any other batch in between are lost.

        Returns:
            float32 (vocab_size,) logits predicting the token after ``ids[-1]``.

        Raises:
            ValueError: ids out of range, or ``pos + len(ids)`` beyond the context or ``Model.rows``.
        """
        t = len(ids)
        if t == 0 or pos < 0 or pos + t > min(self.rows, self.config.context_length):
            raise ValueError(f"{pos} + {t} tokens do not fit the model's {min(self.rows, self.config.context_length)} "
                             "rows of K/V")
        self._load_batch(np.asarray([ids], np.int32), None, None)
        forward(self.ops, self.config, self._views, self.act, 1, t, pos=pos, last_row_only=True)
        return self.dev.download(self.act.logits, (self.config.vocab_size,))

    def loss(self, tokens: np.ndarray, targets: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
        """Masked mean cross-entropy (nats/token) of a batch, without gradients.

        Args:
            tokens, targets: int (batch, seq); mask: float (batch, seq) of 0/1.

        Returns:
            (mean loss over masked tokens, number of masked tokens).
        """
        b, t = self._load_batch(tokens, targets, mask)
        self._forward(b, t)
        n = b * t
        o, a = self.ops, self.act
        for row0, rows in loss_chunks(n, self.loss_rows):
            self._head_logits(row0, rows)
            o.cross_entropy.forward(a.losses, a.logits, a.targets, a.mask, rows, self.config.vocab_size, row0=row0)
        o.sums.sum(self._stats, 0, a.losses, n)
        o.sums.sum(self._stats, 1, a.mask, n)
        s = self.dev.download(self._stats, (2,))
        return float(s[0] / max(s[1], 1.0)), float(s[1])

    def forward_backward(self, tokens: np.ndarray, targets: np.ndarray, mask: np.ndarray,
                         accumulate: bool = False, total_count: float | None = None) -> StepStats:
        """Loss and gradients of one batch (gradients left in ``self.grads``).

        The loss is the mean over tokens with mask 1; gradients are of that mean.

        Gradient accumulation (several micro-batches, one optimizer step): pass ``total_count`` (the
        masked tokens of all micro-batches) to every call and ``accumulate=True`` to all but the
        first; the gradients then add up to those of the mean over the whole batch, and the
        reported grad_norm (after the last call) is that of the sum.

        Args:
            tokens, targets: int (batch, seq); mask: float (batch, seq) of 0/1.

        Returns:
            StepStats with loss (nats/token), global gradient L2 norm and one norm per layer
            (entry 0 = embedding, 1..n_layers = blocks, last = output norm + projection).

        Raises:
            ValueError: bad shapes or ids; RuntimeError: no token has mask 1.
        """
        if not self.training:
            raise RuntimeError("model was created with training=False")
        mask = np.asarray(mask, np.float32)
        count = float(mask.sum())
        if count <= 0:
            raise RuntimeError("batch has no token to learn from (all loss-mask entries are 0)")
        b, t = self._load_batch(tokens, targets, mask)
        n = b * t
        self._forward(b, t, backward=True)
        o, a = self.ops, self.act
        if not accumulate:
            self.grads.zero()
        for row0, rows in loss_chunks(n, self.loss_rows):  # the loss head, a chunk of rows at a time
            self._head_logits(row0, rows)
            o.cross_entropy.forward_backward(a.losses, a.d_logits, a.logits, a.targets, a.mask, rows,
                                             self.config.vocab_size, 1.0 / (total_count or count), row0=row0)
            self._head_backward(row0, rows)
        self._backward(b, t)
        o.sums.sum(self._stats, 0, a.losses, n)
        o.sums.sum(self._stats, 1, a.mask, n)
        o.sums.sum_squares_segments(self._stats, 2, self.grads.flat, self._stat_segments)
        stats = self.dev.download(self._stats, (2 + len(self._stat_names),)).astype(np.float64)
        sq = stats[2:]
        self._grad_sq = float(sq.sum())  # bounds every gradient element for the next optimizer_step
        per_layer = [0.0] * (self.config.n_layers + 2)
        for i, v in zip(self._stat_layers, sq):
            per_layer[i] += v
        return StepStats(loss=float(stats[0] / count), grad_norm=float(math.sqrt(sq.sum())) if np.all(np.isfinite(sq)) else float("nan"),
                         layer_grad_norms=[math.sqrt(x) if math.isfinite(x) else float("nan") for x in per_layer],
                         tokens=int(count))

    def optimizer_step(self, lr: float, weight_decay: float, beta1: float, beta2: float, eps: float,
                       grad_scale: float = 1.0) -> bool:
        """One AdamW update from ``self.grads`` (scaled by ``grad_scale``, the clip factor), all or nothing.

        Weight decay applies to matrices, not to RMSNorm weights. Uses Loshchilov & Hutter (2019).

        Returns:
            Whether it was applied: an update that would make a weight or moment non-finite leaves them
            and the step counter as they were (core.kernels.adamw.AdamW.step; the trainer's guard, with no
            copy of weights or moments).
        """
        # one launch over the flat buffers; the matrices come first, up to layout.split. The last
        # forward_backward's gradient norm bounds every element (padding between tensors stays 0), and the
        # bounds after this model's last update hold while nothing else wrote the weights or moments since: then
        # AdamW may prove the update finite and skip its check pass (core.kernels.adamw.update_bounds)
        grad_sq, self._grad_sq = self._grad_sq, None
        scale32 = abs(float(np.float32(grad_scale)))  # what the kernel multiplies by
        grad_bound = ((math.sqrt(grad_sq) + SQUARE_FLOOR) * scale32
                      if grad_sq is not None and math.isfinite(grad_sq) and math.isfinite(scale32) else None)
        known = self._adam_bounds[1] if self._adam_bounds and self._adam_bounds[0] == self._adam_state() else None
        adamw = self.ops.adamw
        applied = adamw.step(self._trained, self.grads.flat, self.m.flat, self.v.flat,
                             self.train_layout.total, lr, beta1, beta2, eps, weight_decay,
                             self.adam_step + 1, grad_scale, n_decay=self.train_layout.split,
                             grad_bound=grad_bound, bounds=known)
        self._adam_bounds = None
        if applied:
            self.adam_step += 1
            self.trained.changed()
            self._adam_bounds = (self._adam_state(), adamw.bounds) if adamw.bounds else None
        return applied

    def _adam_state(self) -> tuple[int, int, int]:
        """Versions of the trained weights and the moments (core.tensor_store.TensorStore.version): they
        move with every write but AdamW's, after which optimizer_step moves the weights' on itself."""
        return self.trained.version, self.m.version, self.v.version

    def weights(self) -> dict[str, np.ndarray]:
        """Host copy of every weight, ``{gguf tensor name: float32 array}`` (a matrix kept quantized on the
        device: the float32 host array it was built from)."""
        return {**self._host_quantized, **self.params.to_numpy()}

    def optimizer_state(self) -> dict[str, object]:
        """Host copy of AdamW's moments and step counter, for checkpoints."""
        m, v = self.m.to_numpy(), self.v.to_numpy()
        for name in () if self.lora else self.frozen:  # zeros: a checkpoint holds every tensor's moments
            m[name] = v[name] = np.zeros(self.layout.slots[name].shape, np.float32)
        return {"m": m, "v": v, "step": self.adam_step}

    def load_optimizer_state(self, state: dict) -> None:
        """Restore what :meth:`optimizer_state` returned."""
        self.m.load(state["m"])
        self.v.load(state["v"])
        self.adam_step = int(state["step"])
