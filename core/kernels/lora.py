"""Launcher for ``lora.cl``: the block-diagonal B of a fused projection's adapters and the adapters' B
gradient taken out of its product (see core/lora.py)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import round_up

if TYPE_CHECKING:
    import pyopencl as cl

MAX_PARTS = 3
"""Adapters of one fused matrix at most ([q | k | v])."""


def _part_args(parts: Sequence[tuple[int, int]]) -> list:
    """(col0, width) of each part as the kernels take them: three pairs, width 0 past the parts."""
    if not 1 <= len(parts) <= MAX_PARTS or any(c < 0 or w < 1 for c, w in parts):
        raise ValueError(f"adapter parts {list(parts)}: 1 to {MAX_PARTS} (col0 >= 0, width >= 1) pairs")
    padded = list(parts) + [(0, 0)] * (MAX_PARTS - len(parts))
    return [np.int32(v) for pair in padded for v in pair]


class LoRABlockDiag:
    """``blockdiag`` / ``blockdiag_grad`` of ``lora.cl``.

    Args:
        dev: the OpenCL device.
        local_size: work-items per work-group (default 256, capped by the device and the compiled kernels):
            along a row, the rest over several rows (few work-groups: PoCL pays for each).
    """

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._fill = dev.kernel("lora", "lora_blockdiag")
        self._grad = dev.kernel("lora", "lora_blockdiag_grad")
        self.local = min(dev.work_group_size(k, local_size or 256) for k in (self._fill, self._grad))

    def _grid(self, width: int, rows: int) -> tuple[tuple[int, int], tuple[int, int]]:
        lx = min(self.local, round_up(width, 4))  # no more items along a row than it has elements (rounded)
        ly = max(1, min(self.local // lx, rows))
        return (round_up(width, lx), round_up(rows, ly)), (lx, ly)

    def blockdiag(self, bd: cl.Buffer, b_cat: cl.Buffer, n_out: int, rank: int, parts: Sequence[tuple[int, int]],
                  scale: float) -> None:
        """``bd (n_out, P * rank)`` (float32, overwritten) = ``scale`` times the parts' B's on its diagonal:
        ``bd[col0_j + row, j * rank + c] = scale * B_j[row, c]``, zeros elsewhere.

        Args:
            b_cat: the parts' B's stacked, ``(sum of widths, rank)``; B_j is ``(width_j, rank)``.
            parts: ``(col0, width)`` of each of the P <= 3 parts, in the order of ``b_cat``'s blocks.

        Raises:
            ValueError: bad parts, or a part outside the ``n_out`` columns.
        """
        args = _part_args(parts)
        if any(c + w > n_out for c, w in parts):
            raise ValueError(f"adapter parts {list(parts)} outside {n_out} output columns")
        grid, local = self._grid(len(parts) * rank, n_out)
        self.dev.launch(self._fill, grid, local, bd, b_cat, np.int32(n_out), np.int32(rank), np.int32(len(parts)),
                        *args, np.float32(scale))

    def blockdiag_grad(self, grad_b: cl.Buffer, g: cl.Buffer, rank: int, parts: Sequence[tuple[int, int]],
                       scale: float) -> None:
        """``grad_b (sum of widths, rank) += scale *`` the diagonal blocks of ``g (n_out, P * rank)`` (the
        gradient of an unscaled block-diagonal B): ``grad_b[brow_j + row, c] += scale * g[col0_j + row, j *
        rank + c]``, ``brow_j`` = the widths of the parts before j.

        Raises:
            ValueError: bad parts.
        """
        args = _part_args(parts)
        grid, local = self._grid(rank, sum(w for _, w in parts))
        self.dev.launch(self._grad, grid, local, grad_b, g, np.int32(rank), np.int32(len(parts)), *args,
                        np.float32(scale))
