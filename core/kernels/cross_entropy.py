"""Launcher for ``cross_entropy.cl``: masked softmax cross-entropy and its gradient."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import grid_stride_size, work_layout

if TYPE_CHECKING:
    import pyopencl as cl


class CrossEntropy:
    """Per-row softmax cross-entropy over the vocabulary with a per-row mask.

    ``losses[r] = mask[r] * -log softmax(logits[r])[targets[r]]`` with a stable log-sum-exp;
    ``d_logits[r] = (softmax(logits[r]) - onehot(targets[r])) * mask[r] * grad_scale``.
    A row with mask 0 gets loss 0 and gradient 0 (its target is not read). A row with mask != 0
    and a target outside ``[0, vocab_size)`` gets loss NaN. One work-group per row (GPUs), or
    whole rows per work-item without barriers (CPUs, the default there; ``rows_per_item``
    overrides).
    """

    def __init__(self, dev: Device, local_size: int | None = None, rows_per_item: bool | None = None,
                 contiguous: bool | None = None):
        self.dev = dev
        # work split of the element-wise loops (grid.h): blocks per item on CPUs, interleaved on GPUs
        self.contiguous, self.rows_per_item = work_layout(dev, contiguous, rows_per_item)
        suffix = "_rows" if self.rows_per_item else ""
        self._fwd = dev.kernel("cross_entropy", "cross_entropy_forward" + suffix)
        self._bwd = dev.kernel("cross_entropy", "cross_entropy_backward" + suffix)
        wanted = local_size or (16 if self.rows_per_item else 256)
        self.local_fwd = dev.work_group_size(self._fwd, wanted)
        self.local_bwd = dev.work_group_size(self._bwd, wanted)

    def forward(self, losses: cl.Buffer, logits: cl.Buffer, targets: cl.Buffer, mask: cl.Buffer,
                n_rows: int, vocab_size: int, row0: int = 0) -> None:
        """Losses only (evaluation).

        Args:
            losses: float32, elements ``row0 .. row0 + n_rows`` overwritten.
            logits: float32 ``(n_rows, vocab_size)``: the logits of rows ``row0 ..`` of the batch.
            targets: int32, the batch's; elements ``row0 .. row0 + n_rows`` read.
            mask: float32, the batch's weight of each row's loss (0 drops the row); as ``targets``.
            row0: the first row of the batch these logits are of (the Model's loss head runs in chunks).
        """
        if n_rows == 0:
            return
        L = self.local_fwd
        if self.rows_per_item:
            self.dev.launch(self._fwd, (grid_stride_size(self.dev, n_rows, L),), (L,), losses, logits, targets,
                      mask, np.int32(n_rows), np.int32(vocab_size), np.int32(row0), self.contiguous)
            return
        self.dev.launch(self._fwd, (n_rows * L,), (L,), losses, logits, targets, mask,
                  np.int32(vocab_size), np.int32(row0), self.dev.cl.LocalMemory(4 * L))

    def forward_backward(self, losses: cl.Buffer, d_logits: cl.Buffer, logits: cl.Buffer,
                         targets: cl.Buffer, mask: cl.Buffer, n_rows: int,
                         vocab_size: int, grad_scale: float, row0: int = 0) -> None:
        """Losses and the gradient of ``grad_scale * sum(losses)`` w.r.t. the logits.

        Args:
            losses: float32, elements ``row0 .. row0 + n_rows`` overwritten.
            d_logits: float32 ``(n_rows, vocab_size)``, overwritten (an activation gradient); may be
                ``logits`` itself (the gradient written over the logits, as the Model does).
            logits, targets, mask, row0: as :meth:`forward`.
            grad_scale: the trainer passes ``1 / sum(mask)`` (mean loss over real tokens).
        """
        if n_rows == 0:
            return
        L = self.local_bwd
        if self.rows_per_item:
            self.dev.launch(self._bwd, (grid_stride_size(self.dev, n_rows, L),), (L,), losses, d_logits, logits,
                      targets, mask, np.int32(n_rows), np.int32(vocab_size), np.float32(grad_scale),
                            np.int32(row0), self.contiguous)
            return
        self.dev.launch(self._bwd, (n_rows * L,), (L,), losses, d_logits, logits, targets, mask,
                  np.int32(vocab_size), np.float32(grad_scale), np.int32(row0), self.dev.cl.LocalMemory(4 * L))
