"""Numpy reference of the quantized matmuls (``qmatmul.cl``).

The weight is dequantized by gguf-py's own ``gguf.quants.dequantize`` (an implementation independent
of our kernels, written after ggml's C code), then multiplied in float64. The tests
(``tests/test_kernel_qmatmul.py``) compare :class:`core.kernels.qmatmul.QMatmul` with it.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, quants


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
