"""Numpy reference of the AdamW step (``adamw.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_adamw.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``adamw.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.adamw import AdamW


def adamw_step(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float, step: int,
               grad_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One AdamW step (Loshchilov & Hutter 2019) in float64 -> new (p, m, v) as float64."""
    p, g, m, v = (np.asarray(a, np.float64) for a in (p, g, m, v))
    g = g * grad_scale
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mhat = m / (1 - beta1 ** step)
    vhat = v / (1 - beta2 ** step)
    p = p - lr * (mhat / (np.sqrt(vhat) + eps) + weight_decay * p)
    return p, m, v


def selfcheck(dev: Device, op: AdamW | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """One AdamW step (the third) of 300 parameters with grad_scale 0.5, against :func:`adamw_step`
    (1e-5); and one with an lr that overflows float32, which must leave every buffer as it was (error:
    the largest change, tolerance 0). ``op`` defaults to a new ``AdamW(dev)``; the errors are returned,
    not raised."""
    from core.kernels.adamw import AdamW

    op, t = op or AdamW(dev), Inputs(dev, rng)
    n, hp = 300, dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    p, g, m, v = t.f32(n), t.f32(n), t.f32(n) * 0.1, np.abs(t.f32(n)) * 0.1
    bufs = [dev.upload(a) for a in (p, g, m, v)]
    applied = op.step(*bufs, n, step=3, grad_scale=0.5, **hp)
    want = adamw_step(p, g, m, v, step=3, grad_scale=0.5, **hp)[0].astype(np.float32)
    before = [dev.download(b, (n,)) for b in bufs]
    refused = not op.step(*bufs, n, step=4, grad_scale=0.5, **(hp | {"lr": float("inf")}))
    kept = max(float(np.abs(dev.download(b, (n,)) - a).max()) for b, a in zip(bufs, before))
    return [Check("AdamW", t.err(bufs[0], want) if applied else float("inf"), 1e-5),
            Check("AdamW non-finite update not applied", kept if refused else float("inf"), 0.0)]
