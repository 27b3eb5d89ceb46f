"""Launcher for ``lora.cl``: add a contiguous (n_rows, width) block into columns of wider rows, or
take such a block out (the adapters of a fused projection, see core/lora.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import round_up

if TYPE_CHECKING:
    import pyopencl as cl


class LoRACols:
    """``cols_add`` / ``cols_take`` of ``lora.cl``.

    Args:
        dev: the OpenCL device.
        local_size: work-items per work-group along the columns (default 64, capped by the device and
            the compiled kernels); one row per work-group.
    """

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._add = dev.kernel("lora", "lora_cols_add")
        self._take = dev.kernel("lora", "lora_cols_take")
        self.local = min(dev.work_group_size(k, local_size or 64) for k in (self._add, self._take))

    def _launch(self, kernel, dst, src, n_rows: int, ld: int, col0: int, width: int, scale: float) -> None:
        if n_rows <= 0 or width <= 0:
            return
        if not 0 <= col0 <= ld - width:
            raise ValueError(f"columns {col0}..{col0 + width - 1} outside rows of {ld}")
        lx = min(self.local, round_up(width, 4))  # no more items along a row than it has columns (rounded)
        self.dev.launch(kernel, (round_up(width, lx), n_rows), (lx, 1), dst, src, np.int32(n_rows), np.int32(ld),
                        np.int32(col0), np.int32(width), np.float32(scale))

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
