"""Launcher for ``embedding.cl``: token embedding lookup and its deterministic backward."""
from __future__ import annotations

import numpy as np

from core.device import Device
from core.kernels._launch import round_up


class Embedding:
    """``out[n] = weight[tokens[n]]`` and the scatter-add backward (float32, ids int32).

    Token ids outside ``[0, vocab_size)`` are skipped: the forward writes a zero row for them and
    the backward adds nothing, so a bad id never reads or writes out of bounds.
    """

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._fwd = dev.kernel("embedding", "embedding_forward")
        self._bwd = dev.kernel("embedding", "embedding_backward")
        self.local_fwd = dev.work_group_size(self._fwd, local_size or 256)
        self.local_bwd = dev.work_group_size(self._bwd, local_size or 64)

    def forward(self, out, tokens, weight, n_tokens: int, d_model: int,
                vocab_size: int | None = None) -> None:
        """out (n_tokens, d_model) = weight (vocab_size, d_model)[tokens (n_tokens)], overwritten.

        Args:
            vocab_size: rows of ``weight``; default ``weight``'s size in bytes / (4 * d_model),
                which is right when ``weight`` is exactly the table (e.g. its sub-buffer).
        """
        if n_tokens <= 0 or d_model <= 0:
            return
        if vocab_size is None:
            vocab_size = weight.size // (4 * d_model)
        self.dev.launch(self._fwd, (round_up(d_model, self.local_fwd), n_tokens), (self.local_fwd, 1),
                  out, tokens, weight, np.int32(n_tokens), np.int32(vocab_size), np.int32(d_model))

    def backward(self, d_weight, d_out, tokens, n_tokens: int, vocab_size: int, d_model: int) -> None:
        """d_weight (vocab_size, d_model) += scatter of d_out (n_tokens, d_model) rows by tokens.

        Accumulated (weight gradient). Deterministic: one work-item per column adds the tokens'
        rows in token order, no atomics.
        """
        if n_tokens <= 0 or d_model <= 0:
            return
        self.dev.launch(self._bwd, (round_up(d_model, self.local_bwd),), (self.local_bwd,),
                  d_weight, d_out, tokens, np.int32(n_tokens), np.int32(vocab_size), np.int32(d_model))
