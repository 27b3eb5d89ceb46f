"""Numpy reference of the quantized matmuls (``qmatmul.cl``).

The weight is dequantized by gguf-py's own ``gguf.quants.dequantize`` (an implementation independent
of our kernels, written after ggml's C code), then multiplied in float64. The tests
(``tests/test_kernel_qmatmul.py``) compare :class:`core.kernels.qmatmul.QMatmul` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType, quants

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.qmatmul import QMatmul


def dequantize(data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> np.ndarray:
    """W (n_out, n_in) float32 from the GGUF tensor bytes ``data`` of type ``qtype``.

    Args:
        data: the tensor's data as stored in the file (any dtype: its bytes are used).
        qtype: the GGML type.
        shape: (n_out, n_in), numpy order.
    """
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(shape[0], -1)
    return quants.dequantize(raw, qtype).reshape(shape).astype(np.float32)


def qmatmul_forward(x: np.ndarray, data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int],
                    c: np.ndarray | None = None) -> np.ndarray:
    """y (M, n_out) = x (M, n_in) @ W.T in float64 (+ c when given), returned as float32."""
    out = x.astype(np.float64) @ dequantize(data, qtype, shape).astype(np.float64).T
    return (out if c is None else out + c).astype(np.float32)


def qmatmul_input_grad(dy: np.ndarray, data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int],
                       c: np.ndarray | None = None) -> np.ndarray:
    """dx (M, n_in) = dy (M, n_out) @ W in float64 (+ c when given), returned as float32."""
    out = dy.astype(np.float64) @ dequantize(data, qtype, shape).astype(np.float64)
    return (out if c is None else out + c).astype(np.float32)


def selfcheck(dev: Device, op: QMatmul | None = None, rng: np.random.Generator | None = None,
              qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0) -> list[Check]:
    """A frozen ``qtype`` matrix W (37, 64), quantized by gguf-py, as LoRA on an imported base uses it:
    y = x W^T for 2 rows (decode: the GEMV) and 9 rows, and dx = dy W for 9 rows, against
    :func:`qmatmul_forward` and :func:`qmatmul_input_grad` (1e-4). ``op`` defaults to a new
    ``QMatmul(dev)``; the errors are returned, not raised."""
    from core.kernels.qmatmul import QMatmul, upload_weight

    op, t = op or QMatmul(dev), Inputs(dev, rng)
    shape = (37, 64)
    data = quants.quantize(t.f32(*shape), qtype)
    w = upload_weight(dev, data, qtype, shape)
    out = []
    for m in (2, 9):
        x = t.f32(m, shape[1])
        y = dev.alloc(m * shape[0])
        op.forward(y, dev.upload(x), w, m)
        out.append(Check(f"{qtype.name} matmul ({m} rows)", t.err(y, qmatmul_forward(x, data, qtype, shape)), 1e-4))
    dy = t.f32(9, shape[0])
    dx = dev.alloc(9 * shape[1])
    op.input_grad(dx, dev.upload(dy), w, 9)
    out.append(Check(f"{qtype.name} matmul input gradient", t.err(dx, qmatmul_input_grad(dy, data, qtype, shape)),
                     1e-4))
    return out
