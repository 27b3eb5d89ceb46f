"""Launcher for ``attention.cl``: causal multi-head attention with grouped-query attention."""
from __future__ import annotations

import math

import numpy as np

from core.device import Device


class Attention:
    """Causal softmax attention ``O = softmax(scale * Q K^T + mask) V`` and its backward.

    Vaswani et al. 2017 ("Attention Is All You Need", eq. 1); backward equations as in Dao et
    al. 2022 ("FlashAttention", Appendix B.2). ``scale = 1 / sqrt(head_dim)``. Query ``i`` (absolute
    position ``q_pos_start + i``) attends key ``j`` iff ``j <= q_pos_start + i``. Query head ``h``
    uses kv head ``h // (n_heads // n_kv_heads)`` (grouped-query attention).

    One work-group per query row keeps that row's ``seq_k`` scores in local memory, so the longest
    usable context depends on the device: see :meth:`max_seq_len`. Deterministic (no atomics).
    """

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._fwd = dev.kernel("attention", "attention_forward")
        self._bwd_q = dev.kernel("attention", "attention_backward")
        self._bwd_kv = dev.kernel("attention", "attention_backward_kv")
        wanted = local_size or 64  # fastest of 16..128 on PoCL (B8 T256 H8 D64); a GPU wavefront
        self.local_fwd = dev.work_group_size(self._fwd, wanted)
        self.local_bwd_q = dev.work_group_size(self._bwd_q, wanted)
        self.local_bwd_kv = dev.work_group_size(self._bwd_kv, wanted)

    def max_seq_len(self, head_dim: int) -> int:
        """Longest ``seq_k`` (context length) whose scores fit in this device's local memory."""
        local = max(self.local_fwd, self.local_bwd_q)
        return max(0, self.dev.local_mem_size // 4 - head_dim - local)

    def _local_mem(self, n_keys: int, head_dim: int, local: int):
        need = 4 * (n_keys + head_dim + local)
        if need > self.dev.local_mem_size:
            raise ValueError(
                f"attention over {n_keys} keys needs {need} bytes of local memory but "
                f"{self.dev.info.name} has {self.dev.local_mem_size}; lower context_length to at "
                f"most {self.max_seq_len(head_dim)} for this device")
        lm = self.dev.cl.LocalMemory
        return lm(4 * max(1, n_keys)), lm(4 * max(1, head_dim)), lm(4 * local)

    @staticmethod
    def _check_heads(n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads or head_dim < 1:
            raise ValueError(f"attention needs n_kv_heads ({n_kv_heads}) dividing n_heads "
                             f"({n_heads}) and head_dim >= 1 (got {head_dim})")

    def forward(self, out, probs, q, k, v, batch: int, seq_q: int, seq_k: int, q_pos_start: int,
                n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        """Causal attention forward (training and KV-cache generation).

        Args:
            out: float32 ``(batch, seq_q, n_heads, head_dim)``, overwritten.
            probs: float32 ``(batch, n_heads, seq_q, seq_k)``, overwritten with the softmax
                (0 for masked keys); :meth:`backward` reads it.
            q: float32 ``(batch, seq_q, n_heads, head_dim)``.
            k, v: float32 ``(batch, seq_k, n_kv_heads, head_dim)``.
            q_pos_start: absolute position of query 0; key ``j`` has position ``j``. Training:
                0 with ``seq_q = seq_k``; generation: the number of cached tokens, with
                ``seq_k = q_pos_start + seq_q``. A row that sees no key gets zeros.

        Raises:
            ValueError: ``seq_k`` keys do not fit in local memory (lower ``context_length``), or
                ``n_kv_heads`` does not divide ``n_heads``.
        """
        self._check_heads(n_heads, n_kv_heads, head_dim)
        n_rows = batch * n_heads * seq_q
        if n_rows == 0:
            return
        L = self.local_fwd
        scores, qrow, red = self._local_mem(seq_k, head_dim, L)
        self._fwd(self.dev.queue, (n_rows * L,), (L,), out, probs, q, k, v,
                  np.int32(seq_q), np.int32(seq_k), np.int32(q_pos_start), np.int32(n_heads),
                  np.int32(n_kv_heads), np.int32(head_dim), np.float32(1.0 / math.sqrt(head_dim)),
                  scores, qrow, red)

    def backward(self, d_q, d_k, d_v, d_scores, d_out, q, k, v, probs, batch: int, seq: int,
                 n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        """Gradients of :meth:`forward` for training (``q_pos_start = 0``, ``seq_q = seq_k = seq``).

        ``dP = dO V^T``, ``dS = P * (dP - rowsum(P * dP))``, ``dQ = scale dS K``,
        ``dK = scale dS^T Q``, ``dV = P^T dO`` (Dao et al. 2022, Appendix B.2); a kv head's dK and
        dV sum over its group of query heads.

        Args:
            d_q: float32 ``(batch, seq, n_heads, head_dim)``, overwritten.
            d_k, d_v: float32 ``(batch, seq, n_kv_heads, head_dim)``, overwritten.
            d_scores: float32 scratch ``(batch, n_heads, seq, seq)``, overwritten with dS.
            d_out: float32 ``(batch, seq, n_heads, head_dim)``, gradient of ``out``.
            q, k, v, probs: the forward's inputs and saved ``probs``.

        Raises:
            ValueError: as :meth:`forward`.
        """
        self._check_heads(n_heads, n_kv_heads, head_dim)
        if batch * seq == 0:
            return
        L = self.local_bwd_q
        ds, dorow, red = self._local_mem(seq, head_dim, L)
        self._bwd_q(self.dev.queue, (batch * n_heads * seq * L,), (L,), d_q, d_scores, d_out, k, v,
                    probs, np.int32(seq), np.int32(n_heads), np.int32(n_kv_heads),
                    np.int32(head_dim), np.float32(1.0 / math.sqrt(head_dim)), ds, dorow, red)
        # items of the kv kernel own head dims: no use for more items than dims
        L2 = min(self.local_bwd_kv, 1 << (head_dim - 1).bit_length())
        self._bwd_kv(self.dev.queue, (batch * n_kv_heads * seq * L2,), (L2,), d_k, d_v, d_scores,
                     probs, q, d_out, np.int32(seq), np.int32(n_heads), np.int32(n_kv_heads),
                     np.int32(head_dim), np.float32(1.0 / math.sqrt(head_dim)))
