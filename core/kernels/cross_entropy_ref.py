"""Numpy reference of the masked cross-entropy (``cross_entropy.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_cross_entropy.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``cross_entropy.py`` with it.
"""
from __future__ import annotations

import numpy as np


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
