"""Launcher for ``swiglu.cl``: out = silu(gate) * up on the fused ``[gate | up]`` rows, and its backward."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import grid_stride_size, work_layout

if TYPE_CHECKING:
    import pyopencl as cl


class SwiGLU:
    """SwiGLU of the llama feed-forward block on the ``[gate | up]`` rows of the fused gate/up matmul.

    ``out = silu(gate) * up`` with ``silu(x) = x * sigmoid(x)`` (Shazeer 2020, "GLU Variants
    Improve Transformer"; llama.cpp's ``ggml_swiglu``). Finite for any finite input.
    """

    def __init__(self, dev: Device, local_size: int | None = None,
                 contiguous: bool | None = None, rows_per_item: bool | None = None):
        self.dev = dev
        # work split of the element-wise loops (grid.h): blocks per item on CPUs, interleaved on GPUs
        # fused [gate | up] rows: whole rows per work-item (CPUs) or float4 groups as work units
        self.contiguous, self.rows_per_item = work_layout(dev, contiguous, rows_per_item)
        suffix = "_rows" if self.rows_per_item else ""
        self._fused_fwd = dev.kernel("swiglu", "swiglu_fused_forward" + suffix)
        self._fused_bwd = dev.kernel("swiglu", "swiglu_fused_backward" + suffix)
        self.local = min(dev.work_group_size(k, local_size or 256) for k in (self._fused_fwd, self._fused_bwd))
        self.local_rows = min(dev.work_group_size(k, local_size or 16) for k in (self._fused_fwd, self._fused_bwd))

    def _fused_size(self, n_rows: int, ffn_dim: int) -> tuple[int, int]:
        if self.rows_per_item:
            return grid_stride_size(self.dev, n_rows, self.local_rows), self.local_rows
        return grid_stride_size(self.dev, n_rows * max(1, ffn_dim // 4), self.local), self.local

    def forward_fused(self, out: cl.Buffer, gate_up: cl.Buffer, n_rows: int, ffn_dim: int) -> None:
        """``out (n_rows, ffn_dim) = silu(gate) * up`` where row ``r`` of ``gate_up (n_rows,
        2 ffn_dim)`` is ``[gate_r | up_r]`` (the output of one matmul with ``[Wgate; Wup]``).
        Overwrites ``out``."""
        if n_rows <= 0 or ffn_dim <= 0:
            return
        size, local = self._fused_size(n_rows, ffn_dim)
        self.dev.launch(self._fused_fwd, (size,), (local,), out, gate_up, np.int32(n_rows), np.int32(ffn_dim),
                        self.contiguous)

    def backward_fused(self, d_gate_up: cl.Buffer, d_out: cl.Buffer, gate_up: cl.Buffer, n_rows: int,
                       ffn_dim: int) -> None:
        """Gradient of :meth:`forward_fused`: ``d_gate_up (n_rows, 2 ffn_dim)`` = ``[d_gate | d_up]``
        per row, overwritten, from ``d_out (n_rows, ffn_dim)``:
        ``d_up = d_out * silu(gate)``,
        ``d_gate = d_out * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))``."""
        if n_rows <= 0 or ffn_dim <= 0:
            return
        size, local = self._fused_size(n_rows, ffn_dim)
        self.dev.launch(self._fused_bwd, (size,), (local,), d_gate_up, d_out, gate_up, np.int32(n_rows),
                        np.int32(ffn_dim), self.contiguous)
