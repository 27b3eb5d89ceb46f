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


FUSED = (("attn_qkv", ("attn_q", "attn_k", "attn_v")), ("attn_output", ("attn_output",)),
         ("ffn_gate_up", ("ffn_gate", "ffn_up")), ("ffn_down", ("ffn_down",)))
"""Each block's matrices as the model multiplies them (fused groups: core.model.qkv_group, gate_up_group) and the
targets whose rows they hold, in row order."""


@dataclass(frozen=True)
class FusedAdapters:
    """The adapters of one block matrix (possibly fused: [q; k; v], [gate; up]).

    Attributes:
        block: the block index; matrix: the :data:`FUSED` key; n_out, n_in: the (fused) matrix's shape.
        parts: ``(target kind, col0, width)`` of each targeted part: its rows col0 .. col0 + width - 1 of the
            matrix (the fused output's columns), in row order.
    """

    block: int
    matrix: str
    n_out: int
    n_in: int
    parts: tuple[tuple[str, int, int], ...]

    @property
    def n_parts(self) -> int:
        """P, the number of adapters (their A's are stacked into one (P * rank, n_in) matrix)."""
        return len(self.parts)

    def names(self, suffix: str) -> list[str]:
        """The parts' adapter tensors of ``suffix`` (:data:`SUFFIX_A` / :data:`SUFFIX_B`), in row order."""
        return [tensor_name(TARGETS[kind], self.block) + suffix for kind, _, _ in self.parts]

    def group(self, suffix: str) -> str:
        """The name of the stacked tensors of ``suffix`` (a core.tensor_store group)."""
        return f"blk.{self.block}.{self.matrix}{suffix}"


def fused_adapters(config: ModelConfig, lora: LoRAConfig) -> list[FusedAdapters]:
    """Every block matrix that has adapters, block by block in :data:`FUSED` order."""
    out = []
    for i in range(config.n_layers):
        for matrix, kinds in FUSED:
            parts, col0 = [], 0
            for kind in kinds:
                width, n_in = target_shape(config, kind)
                if kind in lora.targets:
                    parts.append((kind, col0, width))
                col0 += width
            if parts:
                out.append(FusedAdapters(i, matrix, col0, n_in, tuple(parts)))
    return out


def adapter_storage(config: ModelConfig, lora: LoRAConfig) -> tuple[list[tuple[str, tuple[int, int]]], dict[str, list[str]]]:
    """The adapters in device storage order, with their groups (core.tensor_store.Layout's arguments): per block
    matrix the parts' A's back to back (one (P * rank, n_in) matrix) then their B's (one (sum of widths, rank)
    matrix). The same tensors as :func:`adapter_shapes`, which gives the files' order."""
    shapes, groups = dict(adapter_shapes(config, lora)), {}
    order = []
    for f in fused_adapters(config, lora):
        for suffix in (SUFFIX_A, SUFFIX_B):
            names = f.names(suffix)
            order += [(n, shapes[n]) for n in names]
            groups[f.group(suffix)] = names
    return order, groups


class LoRAScratch:
    """Buffers every :class:`LoRALinear` of a model shares: ``du`` (n_rows, du_cols) and ``g`` (g_floats), the
    largest ``dy Bd`` and ``dy^T u`` of its matrices; ``saved(dev, cols)`` makes a matrix's own ``u``
    (n_rows, cols)."""

    def __init__(self, dev: Device, n_rows: int, du_cols: int, g_floats: int):
        self.n_rows = n_rows
        self.du, self.g = dev.alloc(n_rows * du_cols), dev.alloc(g_floats)

    @staticmethod
    def sizes(config: ModelConfig, lora: LoRAConfig) -> tuple[int, int]:
        """``(du_cols, g_floats)`` of a model's adapters: the largest P * rank and n_out * P * rank."""
        fused = fused_adapters(config, lora)
        return max(f.n_parts for f in fused) * lora.rank, max(f.n_out * f.n_parts for f in fused) * lora.rank

    @classmethod
    def for_model(cls, dev: Device, n_rows: int, config: ModelConfig, lora: LoRAConfig) -> LoRAScratch:
        """The scratch of a model's adapters over ``n_rows`` rows (what :func:`scratch_floats` counts)."""
        return cls(dev, n_rows, *cls.sizes(config, lora))

    def saved(self, dev: Device, cols: int):
        """A new (n_rows, cols) buffer for one matrix's ``x A^T``."""
        return dev.alloc(self.n_rows * cols)


class LoRALinear:
    """A frozen matrix W (n_out, n_in) plus P adapters on row blocks of it (the fused output's columns).

    The parts' A's are one stacked matrix A (P r, n_in) and their B's, scaled, the diagonal blocks of one
    Bd (n_out, P r) (``core/kernels/lora.cl``; :meth:`refresh` rebuilds it from the B's, which the caller
    does whenever they change). Forward ``y = x W^T + u Bd^T`` with ``u = x A^T`` (kept for the backward);
    backward ``du = dy Bd``, ``dx = dy W + du A``, ``dA += du^T x`` and ``dB_j += scale (dy^T u)``'s diagonal
    block j (the backward must follow the forward of the same batch, as in a training step). Six products
    per matrix and step, whatever P.

    Args:
        frozen: the base matrix's products; n_out, n_in: its shape.
        parts: ``(col0, width)`` of each adapter, in the order of the stacked A's and B's.
        scale: ``alpha / rank``; rank: r.
        a, b: the stacked A (P r, n_in) and B (sum of widths, r); grad_a, grad_b: their gradients (None: no
            training).
        matmul, blockdiag: the launchers; scratch: the shared :class:`LoRAScratch`.
    """

    def __init__(self, frozen: FrozenMatrix, n_out: int, n_in: int, parts: list[tuple[int, int]], scale: float,
                 rank: int, a: cl.Buffer, b: cl.Buffer, grad_a: cl.Buffer | None, grad_b: cl.Buffer | None,
                 matmul: Matmul, blockdiag, scratch: LoRAScratch, dev: Device):
        self.frozen, self.n_out, self.n_in, self.parts, self.scale = frozen, n_out, n_in, list(parts), scale
        self.rank, self.inner = rank, rank * len(parts)
        self.a, self.b, self.grad_a, self.grad_b = a, b, grad_a, grad_b
        self.mm, self.diag, self.s = matmul, blockdiag, scratch
        self.u = scratch.saved(dev, self.inner)
        self.bd = dev.alloc(n_out * self.inner)

    def refresh(self) -> None:
        """Rebuild Bd from the B's (after they changed: an optimizer step, a load)."""
        self.diag.blockdiag(self.bd, self.b, self.n_out, self.rank, self.parts, self.scale)

    def forward(self, out: cl.Buffer, x: cl.Buffer, n: int) -> None:
        """``out (n, n_out)`` from ``x (n, n_in)``, overwritten."""
        self.frozen.forward(out, x, n)
        self.mm(self.u, x, self.a, n, self.inner, self.n_in, trans_b=True)                     # u = x A^T (n, Pr)
        self.mm(out, self.u, self.bd, n, self.n_out, self.inner, trans_b=True, accumulate=True)  # y += u Bd^T

    def input_grad(self, dx: cl.Buffer, dy: cl.Buffer, n: int, accumulate: bool = False, x: cl.Buffer = None) -> None:
        """``dx (n, n_in)`` = (or +=) the input gradient of ``dy (n, n_out)``; with the layer's input
        ``x (n, n_in)`` the adapters' gradients are accumulated too (they need it)."""
        self.frozen.input_grad(dx, dy, n, accumulate)
        s, pr = self.s, self.inner
        self.mm(s.du, dy, self.bd, n, pr, self.n_out)                                  # du = dy Bd  (n, Pr)
        self.mm(dx, s.du, self.a, n, self.n_in, pr, accumulate=True)                   # dx += du A
        if x is not None and self.grad_a is not None:
            self.mm(self.grad_a, s.du, x, pr, self.n_in, n, trans_a=True, accumulate=True)  # dA += du^T x
            self.mm(s.g, dy, self.u, self.n_out, pr, n, trans_a=True)                       # g = dy^T u (n_out, Pr)
            self.diag.blockdiag_grad(self.grad_b, s.g, self.rank, self.parts, self.scale)   # dB_j += scale g_jj


def lora_matmuls(config: ModelConfig, lora: LoRAConfig, n: int, training: bool = True) -> list[tuple[int, int, int, bool, bool]]:
    """``(M, N, K, trans_a, trans_b)`` of the adapters' products of one training step over ``n`` rows
    (for the matmuls' scratch, as ``core.model.step_matmuls``); without ``training`` the forward's two."""
    out = []
    for f in fused_adapters(config, lora):
        pr, n_out, n_in = f.n_parts * lora.rank, f.n_out, f.n_in
        out += [(n, pr, n_in, False, True), (n, n_out, pr, False, True)]
        if training:
            out += [(n, pr, n_out, False, False), (n, n_in, pr, False, False), (pr, n_in, n, True, False),
                    (n_out, pr, n, True, False)]
    return out


def scratch_floats(config: ModelConfig, lora: LoRAConfig, n: int) -> int:
    """Floats of :class:`LoRAScratch` and of every matrix's kept ``u`` and ``Bd`` for ``n`` rows (memory
    estimate)."""
    du_cols, g_floats = LoRAScratch.sizes(config, lora)
    return n * du_cols + g_floats + sum((n + f.n_out) * f.n_parts * lora.rank for f in fused_adapters(config, lora))


__all__ = ["TARGETS", "FUSED", "LoRAConfig", "LoRAError", "adapter_shapes", "adapter_storage", "adapter_params",
           "init_adapter", "merge", "base_name", "FrozenMatrix", "DenseFrozen", "FusedAdapters", "fused_adapters",
           "LoRAScratch", "LoRALinear", "lora_matmuls", "scratch_floats"]
