"""Launcher for ``residual.cl``: out = a + b and gradient accumulation d_in += d_out."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import contiguous_units, grid_stride_size

if TYPE_CHECKING:
    import pyopencl as cl


class Residual:
    """Elementwise residual add and its backward (float32 buffers of ``n`` elements)."""

    def __init__(self, dev: Device, local_size: int | None = None,
                 contiguous: bool | None = None):
        self.dev = dev
        # work split of the element-wise loops (grid.h): blocks per item on CPUs, interleaved on GPUs
        self.contiguous = np.int32(contiguous_units(dev) if contiguous is None else contiguous)
        self._fwd = dev.kernel("residual", "residual_forward")
        self._bwd = dev.kernel("residual", "residual_backward")
        self.local = dev.work_group_size(self._fwd, local_size or 256)

    def _size(self, n: int) -> int:
        return grid_stride_size(self.dev, -(-n // 4), self.local)  # float4 groups per work-item loop

    def forward(self, out: cl.Buffer, a: cl.Buffer, b: cl.Buffer, n: int) -> None:
        """out (n) = a (n) + b (n)."""
        self.dev.launch(self._fwd, (self._size(n),), (self.local,), out, a, b, np.int32(n), self.contiguous)

    def backward(self, d_in: cl.Buffer, d_out: cl.Buffer, n: int) -> None:
        """d_in (n) += d_out (n). Call once per input of the forward add."""
        self.dev.launch(self._bwd, (self._size(n),), (self.local,), d_in, d_out, np.int32(n), self.contiguous)
