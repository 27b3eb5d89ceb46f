"""Numpy reference of the masked cross-entropy (``cross_entropy.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_cross_entropy.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``cross_entropy.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.cross_entropy import CrossEntropy


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """logits (n_rows, V), targets (n_rows) int, mask (n_rows) -> losses (n_rows):
    mask * -log softmax(logits)[target]; rows with mask 0 give 0 (target not read)."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    keep = mask != 0
    t = np.where(keep, targets, 0)
    nll = -logp[np.arange(len(t)), t]
    return np.where(keep, mask.astype(np.float64) * nll, 0.0).astype(logits.dtype)


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray, mask: np.ndarray,
                           grad_scale: float) -> np.ndarray:
    """Gradient of grad_scale * sum(losses) w.r.t. logits (n_rows, V):
    (softmax - onehot(target)) * mask * grad_scale; rows with mask 0 give 0."""
    x = logits.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    keep = mask != 0
    rows = np.nonzero(keep)[0]
    p[rows, targets[rows]] -= 1.0
    g = p * (np.where(keep, mask, 0.0) * grad_scale)[:, None]
    return g.astype(logits.dtype)


def selfcheck(dev: Device, op: CrossEntropy | None = None,
              rng: np.random.Generator | None = None) -> list[Check]:
    """Losses of 9 rows over a vocabulary of 300 (every fourth row masked), and training's losses
    with d_logits written over the logits in one launch (grad_scale 0.25), against
    :func:`cross_entropy_forward` and :func:`cross_entropy_backward` (1e-4); each also as the Model's loss
    head runs it, in chunks of rows (logits of rows 0-3, then 4-8, ``row0`` 4, into a batch's losses). ``op``
    defaults to a new ``CrossEntropy(dev)``; the errors are returned, not raised."""
    from core.kernels.cross_entropy import CrossEntropy

    op, t = op or CrossEntropy(dev), Inputs(dev, rng)
    rows, vocab = 9, 300
    mask = (np.arange(rows) % 4 != 3).astype(np.float32)
    out = []
    for backward in (False, True):
        logits, targets = t.f32(rows, vocab) * 3, t.ints(vocab, rows)
        losses, d_logits = dev.alloc(rows), dev.alloc(rows * vocab)
        args = (dev.upload(logits), dev.upload(targets), dev.upload(mask), rows, vocab)
        want = cross_entropy_forward(logits, targets, mask)
        if not backward:
            op.forward(losses, *args)
            out.append(Check("cross-entropy", t.err(losses, want), 1e-4))
            continue
        op.forward_backward(losses, d_logits, *args, 0.25)
        err = max(t.err(losses, want), t.err(d_logits, cross_entropy_backward(logits, targets, mask, 0.25)))
        out.append(Check("cross-entropy with its gradient", err, 1e-4))
    # in chunks of rows: each chunk's logits at the start of one buffer, the batch's targets, mask and losses
    logits, targets = t.f32(rows, vocab) * 3, t.ints(vocab, rows)
    targets_buf, mask_buf = dev.upload(targets), dev.upload(mask)
    for backward in (False, True):
        losses, errs = dev.upload(np.full(rows, np.nan, np.float32)), []
        for row0, end in ((0, 4), (4, rows)):
            chunk = dev.upload(np.ascontiguousarray(logits[row0:end]))
            if backward:
                op.forward_backward(losses, chunk, chunk, targets_buf, mask_buf, end - row0, vocab, 0.25, row0=row0)
                errs.append(t.err(chunk, cross_entropy_backward(logits[row0:end], targets[row0:end], mask[row0:end],
                                                                0.25)))
            else:
                op.forward(losses, chunk, targets_buf, mask_buf, end - row0, vocab, row0=row0)
        errs.append(t.err(losses, cross_entropy_forward(logits, targets, mask)))
        out.append(Check("cross-entropy in chunks of rows" + (" with its gradient" if backward else ""),
                         max(errs), 1e-4))
    return out
