"""Numpy reference of SwiGLU (``swiglu.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_swiglu.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``swiglu.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.swiglu import SwiGLU


def swiglu_forward(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up."""
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)


def swiglu_backward(d_out: np.ndarray, gate: np.ndarray, up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d_gate, d_up) of sum(d_out * silu(gate) * up)."""
    g = gate.astype(np.float64)
    s = 1.0 / (1.0 + np.exp(-g))
    return (d_out * up * (s + g * s * (1 - s))).astype(np.float32), (d_out * g * s).astype(np.float32)


def selfcheck(dev: Device, op: SwiGLU | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """SwiGLU on the [gate | up] rows of the fused matmul (5 rows, ffn_dim 37), forward and backward,
    against :func:`swiglu_forward` and :func:`swiglu_backward` (1e-5). ``op`` defaults to a new
    ``SwiGLU(dev)``; the errors are returned, not raised."""
    from core.kernels.swiglu import SwiGLU

    op, t = op or SwiGLU(dev), Inputs(dev, rng)
    rows, f = 5, 37
    gu = t.f32(rows, 2 * f)
    o = dev.alloc(rows * f)
    op.forward_fused(o, dev.upload(gu), rows, f)
    forward = t.err(o, swiglu_forward(gu[:, :f], gu[:, f:]))
    gu, d_out = t.f32(rows, 2 * f), t.f32(rows, f)
    d_gu = dev.alloc(rows * 2 * f)
    op.backward_fused(d_gu, dev.upload(d_out), dev.upload(gu), rows, f)
    backward = t.err(d_gu, np.concatenate(swiglu_backward(d_out, gu[:, :f], gu[:, f:]), axis=1))
    return [Check("SwiGLU", forward, 1e-5), Check("SwiGLU backward", backward, 1e-5)]
