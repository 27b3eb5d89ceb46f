"""Numpy reference of RMSNorm (``rmsnorm.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_rmsnorm.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``rmsnorm.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.rmsnorm import RMSNorm


def rmsnorm_forward(x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """x (R, C), w (C) -> (y (R, C), rstd (R)); y = x / sqrt(mean(x^2) + eps) * w."""
    x64 = x.astype(np.float64)
    rstd = 1.0 / np.sqrt((x64 ** 2).mean(axis=1) + eps)
    return (x64 * rstd[:, None] * w).astype(np.float32), rstd.astype(np.float32)


def rmsnorm_backward(d_out: np.ndarray, x: np.ndarray, w: np.ndarray,
                     eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Gradients (d_x (R, C), d_w (C)) of sum(d_out * rmsnorm(x, w)), derived by hand in float64."""
    x64, g = x.astype(np.float64), d_out.astype(np.float64)
    c = x.shape[1]
    r = 1.0 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps)
    gw = g * w
    d_x = r * gw - r ** 3 / c * x64 * (gw * x64).sum(axis=1, keepdims=True)
    d_w = (g * x64 * r).sum(axis=0)
    return d_x.astype(np.float32), d_w.astype(np.float32)


def selfcheck(dev: Device, op: RMSNorm | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """The three launches of every layer on (7, 96) rows, against :func:`rmsnorm_forward` and
    :func:`rmsnorm_backward` (1e-4): the norm, the norm after the residual add (x_sum = a + b) and
    the backward (d_x added into the residual stream's gradient, d_weight accumulated). ``op``
    defaults to a new ``RMSNorm(dev)``; the errors are returned, not raised."""
    from core.kernels.rmsnorm import RMSNorm

    op, t = op or RMSNorm(dev), Inputs(dev, rng)
    rows, dim, eps = 7, 96, 1e-5
    x, w = t.f32(rows, dim), t.f32(dim)
    o, rstd = dev.alloc(rows * dim), dev.alloc(rows)
    op.forward(o, rstd, dev.upload(x), dev.upload(w), rows, dim, eps)
    forward = t.err(o, rmsnorm_forward(x, w, eps)[0])
    a, b = t.f32(rows, dim), t.f32(rows, dim)
    x_sum = dev.alloc(rows * dim)
    op.forward_residual(x_sum, o, rstd, dev.upload(a), dev.upload(b), dev.upload(w), rows, dim, eps)
    residual = max(t.err(x_sum, a + b), t.err(o, rmsnorm_forward(a + b, w, eps)[0]))
    d_out, dx0 = t.f32(rows, dim), t.f32(rows, dim)
    want_rstd = rmsnorm_forward(x, w, eps)[1]
    want_dx, want_dw = rmsnorm_backward(d_out, x, w, eps)
    dx, dw = dev.upload(dx0), dev.upload(np.zeros(dim, np.float32))
    op.backward(dx, dw, dev.upload(d_out), dev.upload(x), dev.upload(w), dev.upload(want_rstd), rows, dim,
                accumulate=True)
    backward = max(t.err(dx, dx0 + want_dx), t.err(dw, want_dw))
    return [Check("RMSNorm", forward, 1e-4), Check("RMSNorm after the residual add", residual, 1e-4),
            Check("RMSNorm backward", backward, 1e-4)]
