"""Launcher for ``adamw.cl``: the AdamW parameter update."""
from __future__ import annotations

import numpy as np

from core.device import Device
from core.kernels._launch import round_up


class AdamW:
    """AdamW with decoupled weight decay (Loshchilov & Hutter 2019; Adam: Kingma & Ba 2015).

    Elementwise over flat float32 buffers, so one call can update all parameters at once, or a
    sub-buffer at a time (e.g. ``weight_decay=0`` for norm weights).
    """

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._step = dev.kernel("adamw", "adamw_step")
        self.local = dev.work_group_size(self._step, local_size or 256)

    def step(self, params, grads, m, v, n: int, lr: float, beta1: float, beta2: float, eps: float,
             weight_decay: float, step: int, grad_scale: float = 1.0) -> None:
        """One AdamW update of ``n`` elements; ``params``, ``m`` and ``v`` are updated in place.

        With ``g = grads * grad_scale``: ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
        ``p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * p)``, ``t = step``.

        Args:
            params, m, v: float32 ``(n,)``; ``m`` and ``v`` start at zero.
            grads: float32 ``(n,)``, read only.
            step: the 1-based step count ``t`` (bias corrections are computed here in float64
                and passed as float32).
            grad_scale: multiplies the gradient first (the clipping factor).

        Raises:
            ValueError: ``step < 1``.
        """
        if step < 1:
            raise ValueError(f"AdamW step is 1-based, got {step}")
        if n == 0:
            return
        bc1 = 1.0 - float(beta1) ** int(step)
        bc2 = 1.0 - float(beta2) ** int(step)
        self._step(self.dev.queue, (round_up(n, self.local),), (self.local,), params, m, v, grads,
                   np.int32(n), np.float32(lr), np.float32(beta1), np.float32(beta2),
                   np.float32(eps), np.float32(weight_decay), np.float32(bc1), np.float32(bc2),
                   np.float32(grad_scale))
