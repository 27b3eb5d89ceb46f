"""Launcher for ``adamw.cl``: the AdamW parameter update."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import contiguous_units, grid_stride_size

if TYPE_CHECKING:
    import pyopencl as cl


class AdamW:
    """AdamW with decoupled weight decay (Loshchilov & Hutter 2019; Adam: Kingma & Ba 2015).

    Elementwise over flat float32 buffers: one call updates all parameters at once, with weight
    decay on the first ``n_decay`` elements (the matrices) and none on the rest (norm weights); an update
    that would make a weight or moment non-finite is not applied (:meth:`step`).
    """

    def __init__(self, dev: Device, local_size: int | None = None,
                 contiguous: bool | None = None):
        self.dev = dev
        # work split of the element-wise loops (grid.h): blocks per item on CPUs, interleaved on GPUs
        self.contiguous = np.int32(contiguous_units(dev) if contiguous is None else contiguous)
        self._check = dev.kernel("adamw", "adamw_check")
        self._step = dev.kernel("adamw", "adamw_step")
        self.local = min(dev.work_group_size(k, local_size or 256) for k in (self._check, self._step))
        self._bad = dev.zeros(1, np.int32)  # adamw_check's flag: 1 when the update would not be finite

    def step(self, params: cl.Buffer, grads: cl.Buffer, m: cl.Buffer, v: cl.Buffer, n: int,
             lr: float, beta1: float, beta2: float, eps: float,
             weight_decay: float, step: int, grad_scale: float = 1.0, n_decay: int | None = None) -> bool:
        """One AdamW update of ``n`` elements, all or nothing: ``params``, ``m`` and ``v`` are updated in
        place unless the update would make any of them non-finite (then nothing changes).

        With ``g = grads * grad_scale``: ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
        ``p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd_i * p)``, ``t = step``, with
        ``wd_i = weight_decay`` for ``i < n_decay`` and 0 after. ``adamw_check`` computes the update first
        without storing it and sets a device flag that ``adamw_step`` reads (adamw.cl): no copy of the
        buffers is needed to undo a bad update, and the flag is read back once (one small download).

        Args:
            params, m, v: float32 ``(n,)``; ``m`` and ``v`` start at zero.
            grads: float32 ``(n,)``, read only.
            step: the 1-based step count ``t`` (bias corrections are computed here in float64
                and passed as float32).
            grad_scale: multiplies the gradient first (the clipping factor).
            n_decay: elements (from the start) that get weight decay; default all ``n``.

        Returns:
            Whether the update was applied (False: it would have made a weight or moment non-finite,
            e.g. an lr that overflows float32, and the buffers are as they were).

        Raises:
            ValueError: ``step < 1``, or ``n`` past the int32 index range.
        """
        if step < 1:
            raise ValueError(f"AdamW step is 1-based, got {step}")
        if n == 0:
            return True
        bc1 = 1.0 - float(beta1) ** int(step)
        bc2 = 1.0 - float(beta2) ** int(step)
        if n >= 2**31:
            raise ValueError(f"AdamW over {n} elements exceeds the int32 index range")
        n_decay = n if n_decay is None else max(0, min(int(n_decay), n))
        size = grid_stride_size(self.dev, -(-n // 4), self.local)
        scalars = (np.int32(n), np.int32(n_decay), np.float32(lr), np.float32(beta1), np.float32(beta2),
                   np.float32(eps), np.float32(weight_decay), np.float32(bc1), np.float32(bc2),
                   np.float32(grad_scale), self.contiguous)
        self.dev.set_int(self._bad, 0)
        self.dev.launch(self._check, (size,), (self.local,), self._bad, params, m, v, grads, *scalars)
        self.dev.launch(self._step, (size,), (self.local,), self._bad, params, m, v, grads, *scalars)
        return int(self.dev.download(self._bad, (1,), np.int32)[0]) == 0
