"""Numpy reference of ``lora.cl`` (column blocks of row-major matrices) and of one LoRA linear layer.

Written independently of the kernels, float64 inside. ``tests/test_kernel_lora.py`` and
``tests/test_lora.py`` compare the launcher in ``lora.py`` and the engine's adapters with it;
:func:`selfcheck` is the launches' check both the test and core/selftest.py can call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.lora import LoRACols


def cols_add(out: np.ndarray, src: np.ndarray, col0: int, scale: float) -> np.ndarray:
    """``out (n, ld)`` with ``scale * src (n, width)`` added to columns ``col0 .. col0 + width - 1``."""
    res = out.astype(np.float64)
    res[:, col0:col0 + src.shape[1]] += scale * src.astype(np.float64)
    return res.astype(np.float32)


def cols_take(src: np.ndarray, col0: int, width: int, scale: float) -> np.ndarray:
    """``scale * src[:, col0 : col0 + width]`` as a contiguous ``(n, width)`` array."""
    return (scale * src[:, col0:col0 + width].astype(np.float64)).astype(np.float32)


def lora_forward(x: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """``y = x W^T + scale (x A^T) B^T``: x (n, n_in), W (n_out, n_in), A (r, n_in), B (n_out, r)."""
    x64 = x.astype(np.float64)
    return x64 @ w.T.astype(np.float64) + scale * (x64 @ a.T.astype(np.float64)) @ b.T.astype(np.float64)


def lora_backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray,
                  scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dA, dB)`` of :func:`lora_forward` for the output gradient ``dy (n, n_out)`` (float64):
    ``dx = dy W + scale (dy B) A``, ``dA = scale (dy B)^T x``, ``dB = scale dy^T (x A^T)``."""
    dy, x = dy.astype(np.float64), x.astype(np.float64)
    w, a, b = (t.astype(np.float64) for t in (w, a, b))
    du = scale * dy @ b
    return dy @ w + du @ a, du.T @ x, scale * dy.T @ (x @ a.T)


def selfcheck(dev: Device, op: LoRACols | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """An adapter's column block (columns 4 .. 12 of 5 rows of 13) added into a fused matmul's rows
    (scale 0.37) and taken back out (scale -2.5), against :func:`cols_add` and :func:`cols_take`
    (1e-5). ``op`` defaults to a new ``LoRACols(dev)``; the errors are returned, not raised."""
    from core.kernels.lora import LoRACols

    op, t = op or LoRACols(dev), Inputs(dev, rng)
    n, ld, col0, width = 5, 13, 4, 9
    out, src = t.f32(n, ld), t.f32(n, width)
    o, d = dev.upload(out), dev.alloc(n * width)
    op.add(o, dev.upload(src), n, ld, col0, width, scale=0.37)
    added = cols_add(out, src, col0, 0.37)
    add_err = t.err(o, added)
    op.take(d, o, n, ld, col0, width, scale=-2.5)
    return [Check("LoRA columns added", add_err, 1e-5),
            Check("LoRA columns taken", t.err(d, cols_take(added, col0, width, -2.5)), 1e-5)]
