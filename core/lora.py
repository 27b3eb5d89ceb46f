"""LoRA: low-rank adapters on a frozen base (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models").

Each targeted linear layer ``y = x W^T`` (W (n_out, n_in), frozen) becomes

    y = x W^T + scale * (x A^T) B^T          A (rank, n_in), B (n_out, rank), scale = alpha / rank

with A drawn Kaiming-uniform as PEFT does (``kaiming_uniform_(a=sqrt(5))``: U(-1/sqrt(n_in),
1/sqrt(n_in))) and B zero, so training starts from the base model exactly. Only A and B are trained;
the base needs only its input gradient ``dx = dy W`` (no weight gradient of a frozen matrix is ever
computed). Adapter tensors are named as llama.cpp's adapter GGUF names them: ``<base tensor
name>.lora_a`` / ``.lora_b``, in numpy order (A (rank, n_in), B (n_out, rank)).

A frozen matrix on the device is an object with ``forward(out, x, n)`` and ``input_grad(dx, dy, n,
accumulate)``: :class:`DenseFrozen` (our float32 matmul) here; a quantized matrix can take its place.
:class:`LoRALinear` adds the adapters of one (possibly fused: [q; k; v], [gate; up]) matrix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
from gguf import MODEL_TENSOR as T

from core.config import ModelConfig, tensor_name

if TYPE_CHECKING:
    import pyopencl as cl

    from core.device import Device
    from core.kernels.matmul import Matmul

TARGETS = {"attn_q": T.ATTN_Q, "attn_k": T.ATTN_K, "attn_v": T.ATTN_V, "attn_output": T.ATTN_OUT,
           "ffn_gate": T.FFN_GATE, "ffn_up": T.FFN_UP, "ffn_down": T.FFN_DOWN}
"""Target modules by their llama.cpp short name (the middle of ``blk.N.<name>.weight``)."""

SUFFIX_A, SUFFIX_B = ".lora_a", ".lora_b"


class LoRAError(ValueError):
    """A LoRA setting or adapter that cannot be used (one line)."""


@dataclass(frozen=True)
class LoRAConfig:
    """Rank, alpha and target modules of the adapters.

    Attributes:
        rank: r >= 1, the inner size of every adapter.
        alpha: > 0; the adapter's product is scaled by ``alpha / rank`` (Hu et al. 2021, sec. 4.1).
        targets: names of :data:`TARGETS` (default all: every linear layer of every block).

    Raises:
        LoRAError: a field out of range (named).
    """

    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = field(default=tuple(TARGETS))

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise LoRAError(f"lora rank: must be an integer >= 1, got {self.rank!r}")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise LoRAError(f"lora alpha: must be a finite number > 0, got {self.alpha!r}")
        targets = tuple(self.targets)
        bad = [t for t in targets if t not in TARGETS]
        if bad or not targets or len(set(targets)) != len(targets):
            raise LoRAError(f"lora targets: {bad or list(targets)} is not a list of distinct names of "
                            f"{', '.join(TARGETS)}")
        object.__setattr__(self, "targets", tuple(t for t in TARGETS if t in targets))  # canonical order

    @property
    def scale(self) -> float:
        """``alpha / rank``."""
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, d: dict) -> LoRAConfig:
        """Inverse of :meth:`to_dict` (raises LoRAError for a bad field)."""
        if not isinstance(d, dict):
            raise LoRAError(f"lora: expected an object, got {type(d).__name__}")
        return cls(rank=d.get("rank"), alpha=d.get("alpha"), targets=tuple(d.get("targets") or ()))


def target_shape(config: ModelConfig, kind: str) -> tuple[int, int]:
    """``(n_out, n_in)`` of the base matrix of target ``kind`` (a key of :data:`TARGETS`)."""
    d, kv, f = config.d_model, config.kv_dim, config.ffn_dim
    return {"attn_q": (d, d), "attn_k": (kv, d), "attn_v": (kv, d), "attn_output": (d, d),
            "ffn_gate": (f, d), "ffn_up": (f, d), "ffn_down": (d, f)}[kind]


def adapter_shapes(config: ModelConfig, lora: LoRAConfig) -> list[tuple[str, tuple[int, int]]]:
    """Every adapter tensor in storage order: per block and target ``(<base>.lora_a, (rank, n_in))``
    then ``(<base>.lora_b, (n_out, rank))``."""
    out = []
    for i in range(config.n_layers):
        for kind in lora.targets:
            n_out, n_in = target_shape(config, kind)
            base = tensor_name(TARGETS[kind], i)
            out += [(base + SUFFIX_A, (lora.rank, n_in)), (base + SUFFIX_B, (n_out, lora.rank))]
    return out


def adapter_params(config: ModelConfig, lora: LoRAConfig) -> int:
    """Number of trained parameters (floats) of the adapters."""
    return sum(math.prod(s) for _, s in adapter_shapes(config, lora))


def init_adapter(config: ModelConfig, lora: LoRAConfig, seed: int) -> dict[str, np.ndarray]:
    """Initial adapters: A ~ U(-1/sqrt(n_in), 1/sqrt(n_in)) (PEFT's Kaiming-uniform with a = sqrt(5)),
    B = 0. Returns ``{name: float32 array}``."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in adapter_shapes(config, lora):
        if name.endswith(SUFFIX_A):
            bound = 1.0 / math.sqrt(shape[1])
            out[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
        else:
            out[name] = np.zeros(shape, np.float32)
    return out


def base_name(adapter_name: str) -> str:
    """The base tensor an adapter tensor belongs to (``blk.0.attn_q.weight.lora_a`` -> ``blk.0.attn_q.weight``)."""
    return adapter_name.removesuffix(SUFFIX_A).removesuffix(SUFFIX_B)


def merge(weights: dict[str, np.ndarray], adapter: dict[str, np.ndarray], lora: LoRAConfig) -> dict[str, np.ndarray]:
    """The base weights with the adapters merged in: ``W + scale * B @ A`` (float64 product, float32 out);
    untargeted tensors are the base's own arrays.

    Raises:
        LoRAError: an adapter's base tensor is missing or its shapes do not match.
    """
    out = dict(weights)
    for name in adapter:
        if not name.endswith(SUFFIX_A):
            continue
        base = base_name(name)
        a, b = adapter[name], adapter.get(base + SUFFIX_B)
        w = weights.get(base)
        if w is None or b is None or b.shape != (w.shape[0], a.shape[0]) or a.shape[1] != w.shape[1]:
            raise LoRAError(f"adapter {name}: no base tensor {base} of shape (n_out, n_in) to merge into")
        out[base] = (w.astype(np.float64) + lora.scale * (b.astype(np.float64) @ a.astype(np.float64))).astype(np.float32)
    return out


# ---------------------------------------------------------------------- device side
class FrozenMatrix(Protocol):
    """A frozen matrix W (n_out, n_in) on the device: its products, never its gradient."""

    def forward(self, out: cl.Buffer, x: cl.Buffer, n: int) -> None:
        """``out (n, n_out) = x (n, n_in) @ W^T``."""

    def input_grad(self, dx: cl.Buffer, dy: cl.Buffer, n: int, accumulate: bool = False, x: cl.Buffer = None) -> None:
        """``dx (n, n_in) = (or +=) dy (n, n_out) @ W`` (``x``: the layer's input, for objects that need it)."""


class DenseFrozen:
    """A float32 matrix W (n_out, n_in) of the parameter buffer, multiplied by our matmul.

    Args:
        matmul: the launcher; w: the weight's buffer (row-major (n_out, n_in)); n_out, n_in: its shape.
    """

    def __init__(self, matmul: Matmul, w: cl.Buffer, n_out: int, n_in: int):
        self.matmul, self.w, self.n_out, self.n_in = matmul, w, n_out, n_in

    def forward(self, out: cl.Buffer, x: cl.Buffer, n: int) -> None:
        """``out (n, n_out) = x (n, n_in) @ W^T``."""
        self.matmul(out, x, self.w, n, self.n_out, self.n_in, trans_b=True)

    def input_grad(self, dx: cl.Buffer, dy: cl.Buffer, n: int, accumulate: bool = False, x: cl.Buffer = None) -> None:
        """``dx (n, n_in) = (or +=) dy (n, n_out) @ W`` (no weight gradient; ``x``, the layer's input, is
        not needed)."""
        self.matmul(dx, dy, self.w, n, self.n_in, self.n_out, accumulate=accumulate)


@dataclass
class AdapterPart:
    """One adapter on columns ``col0 .. col0 + width - 1`` of a (fused) matrix's output rows."""

    col0: int
    width: int
    a: object  # cl.Buffer (rank, n_in)
    b: object  # cl.Buffer (width, rank)
    grad_a: object  # cl.Buffer, accumulated
    grad_b: object
    u: object = None  # cl.Buffer (n, rank): x A^T of the last forward, kept for the backward


class LoRAScratch:
    """Buffers every :class:`LoRALinear` of a model shares: ``du`` (n, rank) and ``wide`` (n, widest
    adapter output), ``n`` = the largest rows of a step; ``saved(dev)`` makes a part's own ``u`` (n, rank)."""

    def __init__(self, dev: Device, n_rows: int, rank: int, widest: int):
        self.rank, self.n_rows = rank, n_rows
        self.du, self.wide = dev.alloc(n_rows * rank), dev.alloc(n_rows * widest)

    def saved(self, dev: Device):
        """A new (n, rank) buffer for one adapter's ``x A^T``."""
        return dev.alloc(self.n_rows * self.rank)


class LoRALinear:
    """A frozen matrix (n_out, n_in) plus adapters on column blocks of its output.

    Forward ``y = x W^T + scale (x A_j^T) B_j^T`` on each part's columns; backward gives the input
    gradient ``dx = dy W + sum_j scale (dy_j B_j) A_j`` and accumulates ``dA_j = scale (dy_j B_j)^T x``,
    ``dB_j = scale dy_j^T (x A_j^T)`` (``u_j = x A_j^T`` is kept from the forward in the part's ``u``: the
    backward must follow the forward of the same batch, as in a training step).
    """

    def __init__(self, frozen: FrozenMatrix, n_out: int, n_in: int, parts: list[AdapterPart], scale: float,
                 matmul: Matmul, cols, scratch: LoRAScratch):
        self.frozen, self.n_out, self.n_in, self.parts, self.scale = frozen, n_out, n_in, parts, scale
        self.mm, self.cols, self.s = matmul, cols, scratch

    def forward(self, out: cl.Buffer, x: cl.Buffer, n: int) -> None:
        """``out (n, n_out)`` from ``x (n, n_in)``, overwritten."""
        self.frozen.forward(out, x, n)
        r, s = self.s.rank, self.s
        for p in self.parts:
            self.mm(p.u, x, p.a, n, r, self.n_in, trans_b=True)              # u = x A^T      (n, r), kept
            self.mm(s.wide, p.u, p.b, n, p.width, r, trans_b=True)           # u B^T          (n, width)
            self.cols.add(out, s.wide, n, self.n_out, p.col0, p.width, self.scale)

    def input_grad(self, dx: cl.Buffer, dy: cl.Buffer, n: int, accumulate: bool = False, x: cl.Buffer = None) -> None:
        """``dx (n, n_in)`` = (or +=) the input gradient of ``dy (n, n_out)``; with the layer's input
        ``x (n, n_in)`` the adapters' gradients are accumulated too (they need it)."""
        self.frozen.input_grad(dx, dy, n, accumulate)
        r, s = self.s.rank, self.s
        for p in self.parts:
            self.cols.take(s.wide, dy, n, self.n_out, p.col0, p.width, self.scale)  # g = scale dy_j (n, width)
            self.mm(p.grad_b, s.wide, p.u, p.width, r, n, trans_a=True, accumulate=True)   # dB += g^T u
            self.mm(s.du, s.wide, p.b, n, r, p.width)                                # du = g B  (n, r)
            self.mm(p.grad_a, s.du, x, r, self.n_in, n, trans_a=True, accumulate=True)     # dA += du^T x
            self.mm(dx, s.du, p.a, n, self.n_in, r, accumulate=True)                 # dx += du A


def lora_matmuls(config: ModelConfig, lora: LoRAConfig, n: int) -> list[tuple[int, int, int, bool, bool]]:
    """``(M, N, K, trans_a, trans_b)`` of the adapters' products of one training step over ``n`` rows
    (for the matmuls' scratch, as ``core.model.step_matmuls``)."""
    r, out = lora.rank, []
    for kind in lora.targets:
        n_out, n_in = target_shape(config, kind)
        out += [(n, r, n_in, False, True), (n, n_out, r, False, True), (n_out, r, n, True, False),
                (n, r, n_out, False, False), (r, n_in, n, True, False), (n, n_in, r, False, False)]
    return out


def widest_output(config: ModelConfig, lora: LoRAConfig) -> int:
    """The largest ``n_out`` of a targeted matrix (the width of :class:`LoRAScratch`'s ``wide``)."""
    return max(target_shape(config, k)[0] for k in lora.targets)


def scratch_floats(config: ModelConfig, lora: LoRAConfig, n: int) -> int:
    """Floats of :class:`LoRAScratch` and of every adapter's kept ``u`` for ``n`` rows (memory estimate)."""
    return n * (lora.rank + widest_output(config, lora)) + n * lora.rank * config.n_layers * len(lora.targets)


__all__ = ["TARGETS", "LoRAConfig", "LoRAError", "adapter_shapes", "adapter_params", "init_adapter", "merge",
           "base_name", "FrozenMatrix", "DenseFrozen", "AdapterPart", "LoRAScratch", "LoRALinear",
           "lora_matmuls", "widest_output", "scratch_floats"]
