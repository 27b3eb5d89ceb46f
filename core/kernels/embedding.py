"""Launcher for ``embedding.cl``: token embedding lookup and its deterministic backward."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.device import Device
from core.kernels._launch import prefers_row_per_item, round_up


@dataclass
class TokenIndex:
    """A batch's token positions grouped by id (host-built, on the device) for
    :meth:`Embedding.backward`: ``order`` (n_tokens) int32 positions sorted stably by id,
    ``starts`` (n_unique + 1) int32 run starts in ``order``, ``ids`` (n_unique) int32 the runs'
    ids (out-of-range ids left out)."""

    order: object
    starts: object
    ids: object
    n_tokens: int
    n_unique: int


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
        # GPUs: the backward over id runs built by index_tokens (enough work-items)
        self.sorted_backward = not prefers_row_per_item(dev)
        self._bwd_sorted = dev.kernel("embedding", "embedding_backward_sorted")
        self._index_bufs: tuple = ()
        self._index_size = 0

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

    def index_tokens(self, tokens: np.ndarray, vocab_size: int) -> TokenIndex:
        """Group the host token ids ``tokens`` (any shape, int) by id for :meth:`backward`; the
        device buffers are this launcher's own, reused by the next call (enqueue the backward
        that uses an index before making the next one; the in-order queue does the rest)."""
        t = np.asarray(tokens, np.int64).ravel()
        order = np.argsort(t, kind="stable").astype(np.int32)
        s = t[order]
        valid = (s >= 0) & (s < vocab_size)
        order, s = order[valid], s[valid]
        cut = np.flatnonzero(np.diff(s)) + 1
        starts = np.concatenate([[0], cut, [len(s)]]).astype(np.int32)
        ids = s[starts[:-1]].astype(np.int32) if len(s) else np.zeros(0, np.int32)
        n = max(1, t.size)
        if self._index_size < n:
            self._index_size = n
            self._index_bufs = (self.dev.alloc(n), self.dev.alloc(n + 1), self.dev.alloc(n))
        ob, sb, ib = self._index_bufs
        self.dev.upload(order, ob)
        self.dev.upload(starts, sb)
        self.dev.upload(ids, ib)
        return TokenIndex(ob, sb, ib, t.size, len(ids))

    def backward(self, d_weight, d_out, tokens, n_tokens: int, vocab_size: int, d_model: int,
                 index: TokenIndex | None = None) -> None:
        """d_weight (vocab_size, d_model) += scatter of d_out (n_tokens, d_model) rows by tokens.

        Accumulated (weight gradient). Deterministic, no atomics: one work-item per column adds
        the tokens' rows in token order; or, with ``index`` (from :meth:`index_tokens` of the same
        tokens), one work-item per column and id adds that id's rows in token order (the same
        additions, so the same bits; GPUs, where a work-item per column leaves most of it idle).
        """
        if n_tokens <= 0 or d_model <= 0:
            return
        if index is not None:
            if index.n_tokens != n_tokens:
                raise ValueError(f"token index of {index.n_tokens} tokens for a backward of {n_tokens}")
            if index.n_unique:
                self.dev.launch(self._bwd_sorted, (round_up(d_model, self.local_bwd), index.n_unique),
                                (self.local_bwd, 1), d_weight, d_out, index.order, index.starts, index.ids,
                                np.int32(index.n_unique), np.int32(d_model))
            return
        self.dev.launch(self._bwd, (round_up(d_model, self.local_bwd),), (self.local_bwd,),
                  d_weight, d_out, tokens, np.int32(n_tokens), np.int32(vocab_size), np.int32(d_model))
