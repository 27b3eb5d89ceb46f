"""Launcher for ``residual.cl``: out = a + b and gradient accumulation d_in += d_out."""
from __future__ import annotations

import numpy as np

from core.device import Device
from core.kernels._launch import round_up


class Residual:
    """Elementwise residual add and its backward (float32 buffers of ``n`` elements)."""

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._fwd = dev.kernel("residual", "residual_forward")
        self._bwd = dev.kernel("residual", "residual_backward")
        self.local = dev.work_group_size(self._fwd, local_size or 256)

    def forward(self, out, a, b, n: int) -> None:
        """out (n) = a (n) + b (n)."""
        self._fwd(self.dev.queue, (round_up(n, self.local),), (self.local,), out, a, b, np.int32(n))

    def backward(self, d_in, d_out, n: int) -> None:
        """d_in (n) += d_out (n). Call once per input of the forward add."""
        self._bwd(self.dev.queue, (round_up(n, self.local),), (self.local,), d_in, d_out, np.int32(n))
