"""Numpy reference of the token embedding (``embedding.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_embedding.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``embedding.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.embedding import Embedding


def embedding_forward(tokens: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """tokens (N) int, weight (V, C) -> (N, C)."""
    return weight[np.asarray(tokens)].astype(np.float32)


def embedding_backward(d_out: np.ndarray, tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """d_out (N, C), tokens (N) -> d_weight (V, C) (scatter-add)."""
    g = np.zeros((vocab_size, d_out.shape[1]), np.float64)
    np.add.at(g, np.asarray(tokens), d_out.astype(np.float64))
    return g.astype(np.float32)


def selfcheck(dev: Device, op: Embedding | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """The lookup the model makes, on 13 tokens of a (50, 24) table, against :func:`embedding_forward`
    (exact). ``op`` defaults to a new ``Embedding(dev)``; the errors are returned, not raised."""
    from core.kernels.embedding import Embedding

    op, t = op or Embedding(dev), Inputs(dev, rng)
    n, vocab, d = 13, 50, 24
    tokens, w = t.ints(vocab, n), t.f32(vocab, d)
    o = dev.alloc(n * d)
    op.forward(o, dev.upload(tokens), dev.upload(w), n, d, vocab)
    return [Check("embedding", t.err(o, embedding_forward(tokens, w)), 0.0)]
