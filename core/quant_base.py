"""A LoRA model's frozen base matrices kept in their GGUF block formats on the device (QLoRA-style,
Dettmers et al. 2023, with GGUF's formats instead of NF4).

:func:`plan` decides, from the file's tensor types, which of a :class:`core.model.Model`'s block
matrices stay quantized: attn_output and ffn_down alone, and the fused groups [attn_q; attn_k; attn_v]
and [ffn_gate; ffn_up] (row concatenations: their raw bytes are concatenated) when every member has
the same type, or Q8_0 where its members mix Q8_0, Q4_0 and Q5_0 (those widened to Q8_0 losslessly:
SmolLM2's Q4_K_M files mix Q5_0 and Q8_0 there); a group of other mixed types, an F32 tensor or a type
the kernels do not read stays float32 (dequantized as before). The embedding, the output projection and
the norms always stay float32.
:class:`QuantFrozen` is the :class:`core.lora.FrozenMatrix` over :mod:`core.kernels.qmatmul`.
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


def plan(config: ModelConfig, matrices: list[tuple[str, list[str]]],
         tensor_types: dict[str, str | int]) -> dict[str, tuple[list[str], Q]]:
    """``{matrix name: (member tensor names, GGML type)}`` of the matrices kept quantized (a group mixing
    Q8_0, Q4_0 and Q5_0: Q8_0, its other members widened by :func:`upload`).

    Args:
        config: the architecture.
        matrices: ``[(matrix name, [member tensor names]), ...]``, the block matrices as the model
            multiplies them (``core.model.block_matrices``).
        tensor_types: ``{tensor name: GGML type name or value}`` of the file
            (``core.gguf_import.import_gguf``'s ``meta["tensor_types"]``).
    """
    shapes, out = dict(config.param_shapes()), {}
    for matrix, members in matrices:
        types = {_qtype(tensor_types.get(m)) for m in members}
        qtype = types.pop() if len(types) == 1 else Q.Q8_0 if types <= {Q.Q8_0, *WIDENS_TO_Q8_0} else None
        if qtype in KEPT and all(shapes[m][1] % _block(qtype) == 0 for m in members):
            out[matrix] = (members, qtype)
    return out


def _block(qtype: Q) -> int:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qtype][0]


def device_bytes(config: ModelConfig, planned: dict[str, tuple[list[str], Q]]) -> tuple[int, int]:
    """``(bytes in their formats as :func:`core.kernels.qmatmul.upload_weight` holds them, float32
    elements they replace)`` of the :func:`plan`'s matrices."""
    shapes, quant, floats = dict(config.param_shapes()), 0, 0
    for members, qtype in planned.values():
        n_out, n_in = sum(shapes[m][0] for m in members), shapes[members[0]][1]
        quant += -(-weight_nbytes(qtype, (n_out, n_in)) // 4) * 4
        floats += n_out * n_in
    return quant, floats


def upload(dev: Device, config: ModelConfig, planned: dict[str, tuple[list[str], Q]],
           base: RawBase | None) -> dict[str, QuantWeight]:
    """The :func:`plan`'s matrices on the device: ``{matrix name: QuantWeight}`` of the members' raw
    bytes (``base``: the file's, e.g. ``LoadedModel.quantized``) concatenated; a member whose type differs
    from its matrix's is widened to Q8_0 first (:func:`core.kernels.qmatmul.widen_to_q8_0`).

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
        parts = [widen_to_q8_0(base.raw[m], own[m]) if own[m] != qtype
                 else np.asarray(base.raw[m]).reshape(-1).view(np.uint8) for m in members]
        data = np.concatenate(parts)
        shape = (sum(shapes[m][0] for m in members), shapes[members[0]][1])
        out[matrix] = upload_weight(dev, data, qtype, shape)
    return out


def members(planned: dict[str, tuple[list[str], Q]]) -> tuple[str, ...]:
    """The tensor names of the :func:`plan`'s matrices (what leaves the float32 parameter store)."""
    return tuple(m for names, _ in planned.values() for m in names)


def frozen_matrices(dev: Device, config: ModelConfig, planned: dict[str, tuple[list[str], Q]],
                    base: RawBase | None, scratch=None) -> dict[str, QuantFrozen]:
    """``{matrix name: QuantFrozen}`` of the :func:`plan`'s matrices on the device (:func:`upload`), over one
    :class:`core.kernels.qmatmul.QMatmul` (``scratch``: the float matmul's pool, shared) whose formats'
    kernels are built now, not mid-step. Empty without a plan.

    Raises:
        ValueError: as :func:`upload`.
    """
    if not planned:
        return {}
    qmatmul = QMatmul(dev, scratch=scratch)
    weights = upload(dev, config, planned, base)
    for w in weights.values():
        qmatmul.prepare(w.qtype)
    return {name: QuantFrozen(qmatmul, w) for name, w in weights.items()}


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


@dataclass(frozen=True)
class RawBase:
    """A GGUF file's tensors as stored: ``types`` ``{tensor name: GGML type name}`` and ``raw``
    ``{tensor name: its data bytes (memory-mapped, uint8)}`` of the 2-D tensors of a :data:`KEPT` type."""

    types: dict[str, str]
    raw: dict[str, np.ndarray]
