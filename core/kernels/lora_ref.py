"""Numpy reference of ``lora.cl`` (the block-diagonal B of a fused matrix's adapters, its gradient's blocks) and
of one LoRA linear layer.

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
    from core.kernels.lora import LoRABlockDiag


def blockdiag(b_cat: np.ndarray, n_out: int, parts: list[tuple[int, int]], scale: float) -> np.ndarray:
    """``Bd (n_out, P * rank)``: ``scale * B_j`` (rows ``brow_j ..`` of ``b_cat (rows, rank)``) at rows
    ``col0_j .. col0_j + width_j - 1`` and columns ``j * rank ..``, zeros elsewhere."""
    rank = b_cat.shape[1]
    out, brow = np.zeros((n_out, len(parts) * rank)), 0
    for j, (col0, width) in enumerate(parts):
        out[col0:col0 + width, j * rank:(j + 1) * rank] = scale * b_cat[brow:brow + width].astype(np.float64)
        brow += width
    return out.astype(np.float32)


def blockdiag_grad(grad_b: np.ndarray, g: np.ndarray, parts: list[tuple[int, int]], scale: float) -> np.ndarray:
    """``grad_b (rows, rank)`` plus ``scale`` times the diagonal blocks of ``g (n_out, P * rank)``."""
    rank = grad_b.shape[1]
    out, brow = grad_b.astype(np.float64), 0
    for j, (col0, width) in enumerate(parts):
        out[brow:brow + width] += scale * g[col0:col0 + width, j * rank:(j + 1) * rank].astype(np.float64)
        brow += width
    return out.astype(np.float32)


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


def selfcheck(dev: Device, op: LoRABlockDiag | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """The block-diagonal B of three adapters (rank 3) on rows [0, 4), [6, 9) and [9, 13) of a fused matrix of
    13 rows (scale 0.37), and the B gradient taken out of a (13, 9) product (scale -2.5), against
    :func:`blockdiag` and :func:`blockdiag_grad` (1e-5). ``op`` defaults to a new ``LoRABlockDiag(dev)``; the
    errors are returned, not raised."""
    from core.kernels.lora import LoRABlockDiag

    op, t = op or LoRABlockDiag(dev), Inputs(dev, rng)
    n_out, rank, parts = 13, 3, [(0, 4), (6, 3), (9, 4)]
    b_cat, g, grad_b = t.f32(11, rank), t.f32(n_out, 3 * rank), t.f32(11, rank)
    bd, gb = dev.alloc(n_out * 3 * rank), dev.upload(grad_b)
    op.blockdiag(bd, dev.upload(b_cat), n_out, rank, parts, scale=0.37)
    op.blockdiag_grad(gb, dev.upload(g), rank, parts, scale=-2.5)
    return [Check("LoRA block-diagonal B", t.err(bd, blockdiag(b_cat, n_out, parts, 0.37)), 1e-5),
            Check("LoRA B gradient", t.err(gb, blockdiag_grad(grad_b, g, parts, -2.5)), 1e-5)]
