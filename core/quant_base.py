"""A LoRA model's frozen base matrices kept in their GGUF block formats on the device (QLoRA-style,
Dettmers et al. 2023, with GGUF's formats instead of NF4).

:func:`plan` decides, from the file's tensor types, which of a :class:`core.model.Model`'s block
matrices stay quantized: attn_output and ffn_down alone, and the fused groups [attn_q; attn_k; attn_v]
and [ffn_gate; ffn_up] (row concatenations): one matrix, their raw bytes concatenated, when every member
has the same type, or Q8_0 where its members mix Q8_0, Q4_0 and Q5_0 (those widened to Q8_0 losslessly:
SmolLM2's Q4_K_M files mix Q5_0 and Q8_0 there); a matrix per member where they mix other kept types
(llama.cpp's Q4_K_M gives attn_v Q6_K beside Q4_K q and k in half the layers of a model whose d_model is
a multiple of 256; an F16 or BF16 member is a matrix of its own too). A group with an F32 member or a type
the kernels do not read stays float32 (dequantized as before). The embedding, the output projection and the norms always stay float32.
:class:`QuantFrozen` (one matrix) and :class:`QuantFrozenGroup` (a matrix per member) are the
:class:`core.lora.FrozenMatrix` over :mod:`core.kernels.qmatmul`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType

from core.config import ModelConfig
from core.kernels.qmatmul import (FORMATS, WIDENS_TO_Q8_0, QMatmul, QuantWeight, upload_weight, weight_nbytes,
                                  widen_to_q8_0)

if TYPE_CHECKING:
    import pyopencl as cl

    from core.device import Device

Q = GGMLQuantizationType
KEPT = tuple(f for f in FORMATS if f != Q.F32)
"""The types kept in their block bytes (an F32 tensor gains nothing: it stays in the float buffer)."""


def _qtype(name: str | int | Q | None) -> Q | None:
    try:
        return Q[name] if isinstance(name, str) else Q(name)
    except (KeyError, ValueError, TypeError):
        return None


Planned = dict[str, tuple[list[str], "Q | tuple[Q, ...]"]]
"""A :func:`plan`: ``{matrix name: (member tensor names, GGML type of the matrix, or a tuple of one type per
member for a group kept as a matrix per member)}``."""


def member_types(members: list[str], qtype: Q | tuple[Q, ...]) -> list[Q]:
    """The GGML type each member is held in (a planned entry's ``(members, qtype)``)."""
    return list(qtype) if isinstance(qtype, tuple) else [qtype] * len(members)


def plan(config: ModelConfig, matrices: list[tuple[str, list[str]]],
         tensor_types: dict[str, str | int]) -> Planned:
    """The matrices kept quantized (:data:`Planned`): a group of one type as that type, one mixing Q8_0,
    Q4_0 and Q5_0 as Q8_0 (its other members widened by :func:`upload`), one mixing other kept types as a
    tuple of its members' types (a matrix per member, :class:`QuantFrozenGroup`).

    Args:
        config: the architecture.
        matrices: ``[(matrix name, [member tensor names]), ...]``, the block matrices as the model
            multiplies them (``core.model.block_matrices``).
        tensor_types: ``{tensor name: GGML type name or value}`` of the file
            (``core.gguf_import.import_gguf``'s ``meta["tensor_types"]``).
    """
    shapes, out = dict(config.param_shapes()), {}
    for matrix, members in matrices:
        types = [_qtype(tensor_types.get(m)) for m in members]
        kinds = set(types)
        qtype = (types[0] if len(kinds) == 1 else Q.Q8_0 if kinds <= {Q.Q8_0, *WIDENS_TO_Q8_0} else tuple(types))
        held = member_types(members, qtype)
        if all(t in KEPT and shapes[m][1] % _block(t) == 0 for m, t in zip(members, held)):
            out[matrix] = (members, qtype)
    return out


def _block(qtype: Q) -> int:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qtype][0]


def _parts(members: list[str], qtype: Q | tuple[Q, ...]) -> list[tuple[list[str], Q]]:
    """The device matrices of a planned entry: ``[(its members, type)]``, one for all the members, or
    one per member."""
    if isinstance(qtype, tuple):
        return [([m], t) for m, t in zip(members, qtype)]
    return [(members, qtype)]


def device_bytes(config: ModelConfig, planned: Planned) -> tuple[int, int]:
    """``(bytes in their formats as :func:`core.kernels.qmatmul.upload_weight` holds them, float32
    elements they replace)`` of the :func:`plan`'s matrices (:func:`group_scratch_floats` aside)."""
    shapes, quant, floats = dict(config.param_shapes()), 0, 0
    for members, qtype in planned.values():
        for part, t in _parts(members, qtype):
            n_out, n_in = sum(shapes[m][0] for m in part), shapes[part[0]][1]
            quant += -(-weight_nbytes(t, (n_out, n_in)) // 4) * 4
            floats += n_out * n_in
    return quant, floats


GROUP_SCRATCH = "quant_group"
"""The name of the groups' buffer in the scratch pool (core.kernels.matmul._Scratch)."""


def group_scratch_floats(config: ModelConfig, planned: Planned, rows: int) -> int:
    """Floats of the one scratch buffer the :class:`QuantFrozenGroup` products of ``rows`` rows use (a
    member's output, or its columns of dy, (rows, n_out of the widest member)); 0 without such a group."""
    shapes = dict(config.param_shapes())
    widest = max((shapes[m][0] for members, qtype in planned.values() if isinstance(qtype, tuple) for m in members),
                 default=0)
    return rows * widest if rows > 1 else 0


def upload(dev: Device, config: ModelConfig, planned: Planned, base: RawBase | None) -> dict[str, list[QuantWeight]]:
    """The :func:`plan`'s matrices on the device: ``{matrix name: [QuantWeight]}``, one of the members' raw
    bytes (``base``: the file's, e.g. ``LoadedModel.quantized``) concatenated (a member whose type differs
    from its matrix's widened to Q8_0 first: :func:`core.kernels.qmatmul.widen_to_q8_0`), or one per
    member for a group planned as a tuple of types.

    Raises:
        ValueError: a member's bytes are missing or do not match its type and shape.
    """
    shapes, out = dict(config.param_shapes()), {}
    base = base or RawBase({}, {})
    for matrix, (members, qtype) in planned.items():
        own = {m: _qtype(base.types.get(m)) for m in members}
        missing = [m for m in members if m not in base.raw or own[m] is None]
        if missing:
            raise ValueError(f"quantized base: the raw bytes or the type of {missing[0]} are missing")
        out[matrix] = []
        for part, t in _parts(members, qtype):
            data = np.concatenate([widen_to_q8_0(base.raw[m], own[m]) if own[m] != t
                                   else np.asarray(base.raw[m]).reshape(-1).view(np.uint8) for m in part])
            shape = (sum(shapes[m][0] for m in part), shapes[part[0]][1])
            out[matrix].append(upload_weight(dev, data, t, shape))
    return out


def members(planned: Planned) -> tuple[str, ...]:
    """The tensor names of the :func:`plan`'s matrices (what leaves the float32 parameter store)."""
    return tuple(m for names, _ in planned.values() for m in names)


def frozen_matrices(dev: Device, config: ModelConfig, planned: Planned, base: RawBase | None,
                    scratch=None, rows: int = 1) -> dict[str, QuantFrozen | QuantFrozenGroup]:
    """``{matrix name: QuantFrozen or QuantFrozenGroup}`` of the :func:`plan`'s matrices on the device
    (:func:`upload`), over one :class:`core.kernels.qmatmul.QMatmul` (``scratch``: the float matmul's pool,
    shared) whose formats' kernels are built now, not mid-step. The groups' scratch for products of up
    to ``rows`` rows (:func:`group_scratch_floats`) is taken from that pool now, at its full size, so
    that it never grows (what memory_bytes counts). Empty without a plan.

    Raises:
        ValueError: as :func:`upload`.
    """
    if not planned:
        return {}
    qmatmul = QMatmul(dev, scratch=scratch)
    weights = upload(dev, config, planned, base)
    if floats := group_scratch_floats(config, planned, rows):
        qmatmul._scratch.get(GROUP_SCRATCH, floats)
    for parts in weights.values():
        for w in parts:
            qmatmul.prepare(w.qtype)
    return {name: QuantFrozen(qmatmul, parts[0]) if len(parts) == 1 else QuantFrozenGroup(qmatmul, parts)
            for name, parts in weights.items()}


class QuantFrozen:
    """A frozen matrix W (n_out, n_in) in its GGUF block bytes (a :class:`core.lora.FrozenMatrix`),
    dequantized inside :class:`core.kernels.qmatmul.QMatmul`'s kernels.

    Args:
        qmatmul: the launcher; w: the weight on the device (:func:`upload`).
    """

    def __init__(self, qmatmul: QMatmul, w: QuantWeight):
        self.qmatmul, self.w, self.n_out, self.n_in = qmatmul, w, w.n_out, w.n_in

    def forward(self, out: cl.Buffer, x: cl.Buffer, n: int, x_offset: int = 0) -> None:
        """``out (n, n_out) = x[x_offset:] (n, n_in) @ W^T`` (``x_offset`` in elements)."""
        self.qmatmul.forward(out, x, self.w, n, x_offset=x_offset)

    def input_grad(self, dx: cl.Buffer, dy: cl.Buffer, n: int, accumulate: bool = False, x: cl.Buffer = None) -> None:
        """``dx (n, n_in) = (or +=) dy (n, n_out) @ W`` (no weight gradient; ``x`` is not needed)."""
        self.qmatmul.input_grad(dx, dy, self.w, n, accumulate=accumulate)


class QuantFrozenGroup:
    """A frozen row-concatenation W = [W_0; W_1; ...] (n_out, n_in) whose members are held in different
    GGUF formats, each its own matrix: member i's product writes the columns ``[c_i, c_i + n_out_i)`` of
    the output, and each member's ``dy`` columns add to ``dx``. One row goes straight to those columns (a
    GEMV per member); more rows go through a scratch buffer of the widest member's (rows, n_out_i)
    (:func:`group_scratch_floats`, from the qmatmul's scratch pool) and a rectangular copy
    (:meth:`core.device.Device.copy_columns`).

    Args:
        qmatmul: the launcher; parts: the members' weights, in row order (:func:`upload`).
    """

    def __init__(self, qmatmul: QMatmul, parts: list[QuantWeight]):
        self.qmatmul, self.parts = qmatmul, parts
        self.n_out, self.n_in = sum(w.n_out for w in parts), parts[0].n_in
        self._cols = np.cumsum([0] + [w.n_out for w in parts[:-1]]).tolist()
        self._widest = max(w.n_out for w in parts)

    def _scratch(self, n: int):
        return self.qmatmul._scratch.get(GROUP_SCRATCH, n * self._widest)

    def forward(self, out: cl.Buffer, x: cl.Buffer, n: int, x_offset: int = 0) -> None:
        """``out (n, n_out) = x[x_offset:] (n, n_in) @ W^T`` (``x_offset`` in elements)."""
        dev, tmp = self.qmatmul.dev, self._scratch(n) if n > 1 else None
        for w, col in zip(self.parts, self._cols):
            if n == 1:
                self.qmatmul.forward(out, x, w, 1, x_offset=x_offset, y_offset=col)
                continue
            self.qmatmul.forward(tmp, x, w, n, x_offset=x_offset)
            dev.copy_columns(out, tmp, n, w.n_out, dst_ld=self.n_out, src_ld=w.n_out, dst_col=col)

    def input_grad(self, dx: cl.Buffer, dy: cl.Buffer, n: int, accumulate: bool = False, x: cl.Buffer = None) -> None:
        """``dx (n, n_in) = (or +=) dy (n, n_out) @ W``: the sum of each member's ``dy`` columns times it."""
        dev, tmp = self.qmatmul.dev, self._scratch(n) if n > 1 else None
        for i, (w, col) in enumerate(zip(self.parts, self._cols)):
            add = accumulate or i > 0
            if n == 1:
                self.qmatmul.input_grad(dx, dy, w, 1, accumulate=add, dy_offset=col)
                continue
            dev.copy_columns(tmp, dy, n, w.n_out, dst_ld=w.n_out, src_ld=self.n_out, src_col=col)
            self.qmatmul.input_grad(dx, tmp, w, n, accumulate=add)


@dataclass(frozen=True)
class RawBase:
    """A GGUF file's tensors as stored: ``types`` ``{tensor name: GGML type name}`` and ``raw``
    ``{tensor name: its data bytes (memory-mapped, uint8)}`` of the 2-D tensors of a :data:`KEPT` type."""

    types: dict[str, str]
    raw: dict[str, np.ndarray]
