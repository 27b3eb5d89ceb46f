"""Launcher for ``rope.cl``: rotary position embedding (ggml "normal" mode, adjacent pairs)."""
from __future__ import annotations

import threading

import numpy as np

from core.device import Device
from core.kernels._launch import round_up


class RoPE:
    """In-place RoPE on Q or K rows and its backward (the inverse rotation).

    Pairs ``(x[2i], x[2i+1])`` of every head are rotated by ``pos * theta ** (-2i / head_dim)``,
    ggml's "normal" RoPE as llama.cpp uses for the llama architecture (``LLAMA_ROPE_TYPE_NORM``;
    ggml-cpu ``ops.cpp``: ``rope_yarn`` / ``ggml_compute_forward_rope_f32``); Su et al. 2021,
    "RoFormer". The frequencies ``theta ** (-2i / head_dim)`` are computed once per
    ``(head_dim, theta)`` on the host in float64 and kept on the device as a float
    hi + lo pair, so the kernel's angle stays accurate at positions of many thousands.
    """

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._fwd = dev.kernel("rope", "rope_forward")
        self._bwd = dev.kernel("rope", "rope_backward")
        self.local = dev.work_group_size(self._fwd, local_size or 256)
        self._tables: dict[tuple[int, float], object] = {}
        self._lock = threading.Lock()

    def _inv_freq(self, head_dim: int, theta: float):
        key = (int(head_dim), float(theta))
        with self._lock:
            buf = self._tables.get(key)
            if buf is None:
                i = np.arange(head_dim // 2, dtype=np.float64)
                f = float(theta) ** (-2.0 * i / head_dim)
                hi = f.astype(np.float32)
                lo = (f - hi.astype(np.float64)).astype(np.float32)
                buf = self.dev.upload(np.concatenate([hi, lo]))
                self._tables[key] = buf
        return buf

    def _launch(self, kernel, x, n_tokens, seq_len, n_heads, head_dim, pos_start, theta) -> None:
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        if seq_len < 1 or pos_start < 0:
            raise ValueError(f"RoPE needs seq_len >= 1 and pos_start >= 0, got {seq_len}, {pos_start}")
        n_pairs = n_tokens * n_heads * (head_dim // 2)
        if n_pairs >= 2**31:
            raise ValueError(f"RoPE on {n_pairs} pairs exceeds the int32 index range")
        if n_pairs == 0:
            return
        kernel(self.dev.queue, (round_up(n_pairs, self.local),), (self.local,), x,
               self._inv_freq(head_dim, theta), np.int32(n_tokens), np.int32(seq_len),
               np.int32(n_heads), np.int32(head_dim), np.int32(pos_start))

    def forward(self, x, n_tokens: int, seq_len: int, n_heads: int, head_dim: int,
                pos_start: int, theta: float) -> None:
        """Rotate ``x (n_tokens, n_heads, head_dim)`` float32 in place (overwritten).

        Token row ``r`` (rows are ``(B, T)`` flattened) has position ``pos_start + r % seq_len``.
        For training ``seq_len = T`` and ``pos_start = 0``; for KV-cache generation ``n_tokens``
        new tokens with ``seq_len = n_tokens`` and ``pos_start`` = number of cached tokens.

        Raises:
            ValueError: odd ``head_dim``, ``seq_len < 1`` or ``pos_start < 0``.
        """
        self._launch(self._fwd, x, n_tokens, seq_len, n_heads, head_dim, pos_start, theta)

    def backward(self, d_x, n_tokens: int, seq_len: int, n_heads: int, head_dim: int,
                 pos_start: int, theta: float) -> None:
        """Gradient of :meth:`forward`: rotate ``d_x (n_tokens, n_heads, head_dim)`` in place by
        the negated angle (the transpose of the rotation). Overwrites ``d_x``."""
        self._launch(self._bwd, d_x, n_tokens, seq_len, n_heads, head_dim, pos_start, theta)
