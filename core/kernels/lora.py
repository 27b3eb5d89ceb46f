"""Launcher for ``lora.cl``: add a contiguous (n_rows, width) block into columns of wider rows, or
take such a block out (the adapters of a fused projection, see core/lora.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import grid_stride_size, work_layout

if TYPE_CHECKING:
    import pyopencl as cl


class LoRACols:
    """``cols_add`` / ``cols_take`` of ``lora.cl``.

    Args:
        dev: the OpenCL device.
        local_size: work-group size (default 256, capped by the device and the compiled kernels).
        contiguous: grid.h's work split (None: the device's default).
    """

    def __init__(self, dev: Device, local_size: int | None = None, contiguous: bool | None = None):
        self.dev = dev
        self.contiguous, _ = work_layout(dev, contiguous, None)
        self._add = dev.kernel("lora", "lora_cols_add")
        self._take = dev.kernel("lora", "lora_cols_take")
        self.local = min(dev.work_group_size(k, local_size or 256) for k in (self._add, self._take))

    def _launch(self, kernel, dst, src, n_rows: int, ld: int, col0: int, width: int, scale: float) -> None:
        if n_rows <= 0 or width <= 0:
            return
        if not 0 <= col0 <= ld - width:
            raise ValueError(f"columns {col0}..{col0 + width - 1} outside rows of {ld}")
        size = grid_stride_size(self.dev, n_rows * width, self.local)
        self.dev.launch(kernel, (size,), (self.local,), dst, src, np.int32(n_rows), np.int32(ld), np.int32(col0),
                        np.int32(width), np.float32(scale), self.contiguous)

    def add(self, out: cl.Buffer, src: cl.Buffer, n_rows: int, ld: int, col0: int, width: int,
            scale: float = 1.0) -> None:
        """``out (n_rows, ld)[:, col0 : col0 + width] += scale * src (n_rows, width)`` (float32).

        Raises:
            ValueError: the columns do not fit the rows.
        """
        self._launch(self._add, out, src, n_rows, ld, col0, width, scale)

    def take(self, dst: cl.Buffer, src: cl.Buffer, n_rows: int, ld: int, col0: int, width: int,
             scale: float = 1.0) -> None:
        """``dst (n_rows, width) = scale * src (n_rows, ld)[:, col0 : col0 + width]``, overwritten.

        Raises:
            ValueError: the columns do not fit the rows.
        """
        self._launch(self._take, dst, src, n_rows, ld, col0, width, scale)
