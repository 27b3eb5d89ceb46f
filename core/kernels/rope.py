"""Launcher for ``rope.cl``: rotary position embedding (ggml "normal" mode, adjacent pairs)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import grid_stride_size, work_layout

if TYPE_CHECKING:
    import pyopencl as cl


class RoPE:
    """RoPE on the Q and K of one fused QKV matmul while splitting its rows (:meth:`split_qkv`), and
    its backward, the inverse rotation while joining the gradients (:meth:`join_qkv`).

    Pairs ``(x[2i], x[2i+1])`` of every head are rotated by ``pos * theta ** (-2i / head_dim)``,
    ggml's "normal" RoPE as llama.cpp uses for the llama architecture (``LLAMA_ROPE_TYPE_NORM``;
    ggml-cpu ``ops.cpp``: ``rope_yarn`` / ``ggml_compute_forward_rope_f32``); Su et al. 2021,
    "RoFormer". The frequencies ``theta ** (-2i / head_dim)`` are computed once per
    ``(head_dim, theta)`` on the host in float64 and kept on the device as a float
    hi + lo pair, so the kernel's angle stays accurate at positions of many thousands.
    """

    def __init__(self, dev: Device, local_size: int | None = None,
                 contiguous: bool | None = None, rows_per_item: bool | None = None):
        self.dev = dev
        # work split of the element-wise loops (grid.h): blocks per item on CPUs, interleaved on GPUs
        # split/join: whole rows per work-item reading a (position, pair) cos/sin table (CPUs), or
        # one work unit per (row, pair) computing its angle (GPUs)
        self.contiguous, self.rows_per_item = work_layout(dev, contiguous, rows_per_item)
        suffix = "_rows" if self.rows_per_item else ""
        self._split = dev.kernel("rope", "rope_split_qkv" + suffix)
        self._join = dev.kernel("rope", "rope_join_qkv" + suffix)
        self._table = dev.kernel("rope", "rope_table")
        self.local = min(dev.work_group_size(k, local_size or 64) for k in (self._split, self._join))
        self.local_rows = min(dev.work_group_size(k, local_size or 16) for k in (self._split, self._join))
        self._tables: dict[tuple[int, float], object] = {}
        self._cs: dict[tuple[int, float], tuple[object, int]] = {}  # -> (cos/sin table, positions in it)
        self._lock = threading.Lock()

    def _inv_freq(self, head_dim: int, theta: float):
        with self._lock:
            return self._inv_freq_locked((int(head_dim), float(theta)))

    def _inv_freq_locked(self, key: tuple[int, float]):
        buf = self._tables.get(key)
        if buf is None:
            head_dim, theta = key
            i = np.arange(head_dim // 2, dtype=np.float64)
            f = theta ** (-2.0 * i / head_dim)
            hi = f.astype(np.float32)
            lo = (f - hi.astype(np.float64)).astype(np.float32)
            buf = self.dev.upload(np.concatenate([hi, lo]))
            self._tables[key] = buf
        return buf

    def _cos_sin(self, head_dim: int, theta: float, n_pos: int):
        """The (n_pos, head_dim/2, 2) cos/sin table of positions 0 .. n_pos - 1 (at least), on the
        device; computed by ``rope_table`` from the hi + lo frequencies, grown (doubled) on demand."""
        key = (int(head_dim), float(theta))
        with self._lock:
            buf, have = self._cs.get(key, (None, 0))
            if have >= n_pos:
                return buf
            have = max(n_pos, 2 * have, 128)
            n_freq = head_dim // 2
            buf = self.dev.alloc(have * head_dim)
            inv = self._inv_freq_locked(key)
            # enqueued before the table is published: later launches on the queue see it filled
            self.dev.launch(self._table, (grid_stride_size(self.dev, have * n_freq, self.local),), (self.local,),
                            buf, inv, np.int32(have), np.int32(n_freq), self.contiguous)
            self._cs[key] = (buf, have)
        return buf

    def cos_sin_table(self, head_dim: int, theta: float, n_pos: int) -> cl.Buffer:
        """float32 (at least n_pos, head_dim): row p holds (cos, sin) of pair i's angle at position p at
        [2i, 2i + 1] (what the CPU layout's split reads, and core/kernels/decode.cl), grown on demand (a
        replayed decode step keeps the buffer it recorded: core.generate builds its whole context's first)."""
        return self._cos_sin(head_dim, theta, n_pos)

    def _split_join_args(self, n_tokens: int, seq_len: int, head_dim: int, pos_start: int, theta: float):
        """(global size, local size, angle buffer) of a split/join launch."""
        if self.rows_per_item:
            size = grid_stride_size(self.dev, n_tokens, self.local_rows)
            return size, self.local_rows, self._cos_sin(head_dim, theta, pos_start + min(n_tokens, seq_len))
        size = grid_stride_size(self.dev, max(1, n_tokens * (head_dim // 2)), self.local)
        return size, self.local, self._inv_freq(head_dim, theta)

    def _check(self, n_tokens, seq_len, width, head_dim, pos_start) -> None:
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        if seq_len < 1 or pos_start < 0:
            raise ValueError(f"RoPE needs seq_len >= 1 and pos_start >= 0, got {seq_len}, {pos_start}")
        if (n_tokens + pos_start) * width >= 2**31:
            raise ValueError(f"RoPE on {n_tokens} rows exceeds the int32 index range")

    def split_qkv(self, q: cl.Buffer, k: cl.Buffer, v: cl.Buffer, qkv: cl.Buffer, n_tokens: int, seq_len: int,
                  n_heads: int, n_kv_heads: int, head_dim: int, pos_start: int, theta: float,
                  kv_row0: int = 0) -> None:
        """Split the rows ``[q | k | v]`` of one QKV matmul, ``qkv (n_tokens, (n_heads + 2 n_kv_heads)
        head_dim)``, into ``q (n_tokens, n_heads, head_dim)`` and rows ``kv_row0 ..`` of ``k``, ``v``
        ``(rows, n_kv_heads, head_dim)`` (the KV cache in generation), with RoPE on q and k. All
        overwritten.

        Token row ``r`` (rows are ``(B, T)`` flattened) has position ``pos_start + r % seq_len``.
        For training ``seq_len = T`` and ``pos_start = 0``; for KV-cache generation ``n_tokens``
        new tokens with ``seq_len = n_tokens`` and ``pos_start`` = number of cached tokens.

        Raises:
            ValueError: odd ``head_dim``, ``seq_len < 1``, ``pos_start < 0``, or sizes past the int32
                index range.
        """
        if n_tokens <= 0:
            return
        self._check(n_tokens, seq_len, (n_heads + 2 * n_kv_heads) * head_dim, head_dim, pos_start)
        size, local, angles = self._split_join_args(n_tokens, seq_len, head_dim, pos_start, theta)
        self.dev.launch(self._split, (size,), (local,), q, k, v, qkv, angles,
                        np.int32(n_tokens), np.int32(seq_len), np.int32(n_heads), np.int32(n_kv_heads),
                        np.int32(head_dim), np.int32(pos_start), np.int32(kv_row0), self.contiguous)

    def join_qkv(self, d_qkv: cl.Buffer, d_q: cl.Buffer, d_k: cl.Buffer, d_v: cl.Buffer, n_tokens: int,
                 seq_len: int, n_heads: int, n_kv_heads: int, head_dim: int, pos_start: int,
                 theta: float) -> None:
        """Gradient of :meth:`split_qkv` (``kv_row0 = 0``): ``d_qkv`` rows ``[d_q | d_k | d_v]`` with
        the inverse rotation on d_q and d_k; overwritten."""
        if n_tokens <= 0:
            return
        self._check(n_tokens, seq_len, (n_heads + 2 * n_kv_heads) * head_dim, head_dim, pos_start)
        size, local, angles = self._split_join_args(n_tokens, seq_len, head_dim, pos_start, theta)
        self.dev.launch(self._join, (size,), (local,), d_qkv, d_q, d_k, d_v, angles,
                        np.int32(n_tokens), np.int32(seq_len), np.int32(n_heads), np.int32(n_kv_heads),
                        np.int32(head_dim), np.int32(pos_start), self.contiguous)
