"""Launcher for ``rmsnorm.cl``: RMSNorm as llama.cpp computes it, forward and backward."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import grid_stride_size, round_up, work_layout

if TYPE_CHECKING:
    import pyopencl as cl

WEIGHT_CHUNK = 32  # rows per partial sum of d_weight on GPUs (two passes; see rmsnorm.cl)


class RMSNorm:
    """``y = x * rstd * weight`` per row, ``rstd = 1 / sqrt(mean(x**2) + eps)``; float32 buffers.

    RMSNorm (Zhang & Sennrich, 2019) as llama.cpp computes it: ``ggml_rms_norm`` followed by the
    multiply with the norm weight (the ``llama`` architecture's ``attn_norm`` / ``ffn_norm`` /
    ``output_norm``). Two layouts of the work: one work-group per row reducing in local memory
    (GPUs; its size is a power of two, ``local_size`` overrides the default 256), or whole rows
    per work-item, no barriers (CPUs, the default there; ``rows_per_item`` overrides).
    Backward: with ``g = d_out * weight``, ``d_x = rstd * (g - x * rstd**2 * mean(g * x))`` and
    ``d_weight += sum_rows(d_out * x * rstd)``.
    """

    def __init__(self, dev: Device, local_size: int | None = None, rows_per_item: bool | None = None,
                 contiguous: bool | None = None):
        self.dev = dev
        # work split of the element-wise loops (grid.h): blocks per item on CPUs, interleaved on GPUs
        self.contiguous, self.rows_per_item = work_layout(dev, contiguous, rows_per_item)
        if self.rows_per_item:
            self._fwd = dev.kernel("rmsnorm", "rmsnorm_forward_rows")
            self._fwd_res = dev.kernel("rmsnorm", "rmsnorm_residual_forward_rows")
            self._bwd_x = dev.kernel("rmsnorm", "rmsnorm_backward_input_rows")
            wanted = local_size or 16
        else:
            self._fwd = dev.kernel("rmsnorm", "rmsnorm_forward")
            self._fwd_res = dev.kernel("rmsnorm", "rmsnorm_residual_forward")
            self._bwd_x = dev.kernel("rmsnorm", "rmsnorm_backward_input")
            wanted = local_size or 256
        if self.rows_per_item:  # CPUs: d_weight with 16 columns per work-item, one item per group
            self._bwd_w = dev.kernel("rmsnorm", "rmsnorm_backward_weight_cols")
        else:  # GPUs: one column per item, or in two passes over row chunks (enough work-items)
            self._bwd_w = dev.kernel("rmsnorm", "rmsnorm_backward_weight")
            self._bwd_w_partial = dev.kernel("rmsnorm", "rmsnorm_backward_weight_partial")
            self._bwd_w_final = dev.kernel("rmsnorm", "rmsnorm_backward_weight_final")
            self._partial, self._partial_size = None, 0
        self.local = min(dev.work_group_size(k, wanted) for k in (self._fwd, self._fwd_res, self._bwd_x))
        self.local_w = 1 if self.rows_per_item else dev.work_group_size(self._bwd_w, local_size or 64)
        self._scratch = dev.cl.LocalMemory(4 * self.local)

    def _grid(self, n_rows: int) -> int:
        if self.rows_per_item:
            return grid_stride_size(self.dev, n_rows, self.local)
        return n_rows * self.local

    def _extra(self) -> tuple:
        return (self.contiguous,) if self.rows_per_item else (self._scratch,)

    def forward(self, out: cl.Buffer, rstd: cl.Buffer, x: cl.Buffer, weight: cl.Buffer, n_rows: int, dim: int,
                eps: float) -> None:
        """out (n_rows, dim) and rstd (n_rows), both overwritten, from x (n_rows, dim), weight (dim).

        ``rstd`` is kept for :meth:`backward`.
        """
        if n_rows <= 0:
            return
        self.dev.launch(self._fwd, (self._grid(n_rows),), (self.local,), out, rstd, x, weight,
                  np.int32(n_rows), np.int32(dim), np.float32(eps), *self._extra())

    def forward_residual(self, x_sum: cl.Buffer, out: cl.Buffer, rstd: cl.Buffer, a: cl.Buffer,
                         b: cl.Buffer, weight: cl.Buffer, n_rows: int, dim: int, eps: float) -> None:
        """The residual add fused with the RMSNorm after it: ``x_sum = a + b`` and ``out``, ``rstd``
        of :meth:`forward` applied to ``x_sum``; all overwritten, shapes as :meth:`forward`.
        ``x_sum`` is the residual stream the backward needs."""
        if n_rows <= 0:
            return
        self.dev.launch(self._fwd_res, (self._grid(n_rows),), (self.local,), x_sum, out, rstd, a, b, weight,
                      np.int32(n_rows), np.int32(dim), np.float32(eps), *self._extra())

    def backward(self, d_x: cl.Buffer, d_weight: cl.Buffer, d_out: cl.Buffer, x: cl.Buffer,
                 weight: cl.Buffer, rstd: cl.Buffer, n_rows: int, dim: int,
                 accumulate: bool = False) -> None:
        """d_x (n_rows, dim) overwritten, or added to when ``accumulate`` (the residual stream's
        gradient, which takes the norm's input gradient: saves a separate residual add);
        d_weight (dim) accumulated (+=).

        Inputs: d_out, x (n_rows, dim), weight (dim), rstd (n_rows) from :meth:`forward`.
        d_weight sums over rows in a fixed order (one work-item per column; on GPUs per column
        and chunk of ``WEIGHT_CHUNK`` rows, then over the chunks in order): deterministic.
        d_weight is computed first, so ``d_x`` may be the same buffer as ``d_out`` (not with
        ``accumulate``).
        """
        if n_rows <= 0:
            return
        if self.rows_per_item:
            self.dev.launch(self._bwd_w, (-(-dim // 16),), (self.local_w,), d_weight,
                            d_out, x, rstd, np.int32(n_rows), np.int32(dim))
        elif n_rows <= WEIGHT_CHUNK:
            self.dev.launch(self._bwd_w, (round_up(dim, self.local_w),), (self.local_w,), d_weight,
                            d_out, x, rstd, np.int32(n_rows), np.int32(dim))
        else:
            n_chunks = -(-n_rows // WEIGHT_CHUNK)
            if self._partial_size < n_chunks * dim:
                self._partial_size = n_chunks * dim
                self._partial = self.dev.alloc(self._partial_size)
            self.dev.launch(self._bwd_w_partial, (round_up(dim, self.local_w), n_chunks), (self.local_w, 1),
                            self._partial, d_out, x, rstd, np.int32(n_rows), np.int32(dim), np.int32(WEIGHT_CHUNK))
            self.dev.launch(self._bwd_w_final, (round_up(dim, self.local_w),), (self.local_w,), d_weight,
                            self._partial, np.int32(n_chunks), np.int32(dim))
        self.dev.launch(self._bwd_x, (self._grid(n_rows),), (self.local,), d_x, d_out, x, weight,
                        rstd, np.int32(n_rows), np.int32(dim), np.int32(bool(accumulate)), *self._extra())
