"""Numpy reference of the token embedding (``embedding.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_embedding.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``embedding.py`` with it.
"""
from __future__ import annotations

import numpy as np


def embedding_forward(tokens: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """tokens (N) int, weight (V, C) -> (N, C)."""
    return weight[np.asarray(tokens)].astype(np.float32)


def embedding_backward(d_out: np.ndarray, tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """d_out (N, C), tokens (N) -> d_weight (V, C) (scatter-add)."""
    g = np.zeros((vocab_size, d_out.shape[1]), np.float64)
    np.add.at(g, np.asarray(tokens), d_out.astype(np.float64))
    return g.astype(np.float32)
