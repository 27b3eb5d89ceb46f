"""Launcher for ``sums.cl``: deterministic sums and sums of squares (gradient norms, the finite-weights
check, loss and mask sums)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import contiguous_units

if TYPE_CHECKING:
    import pyopencl as cl

# Upper bound on pass-1 work-groups: enough to fill a GPU, few enough that pass 2 is one group.
MAX_GROUPS = 256
# Elements per work-group of the multi-segment sum of squares (sum_squares_segments): interleaved (GPUs),
# and a slice per work-item (CPUs: 64K measured 1.5x faster than 16K on PoCL, about numpy's dot product)
CHUNK = 16384
CHUNK_CONTIGUOUS = 65536


class Sums:
    """Two-pass deterministic reductions into a slot of a small result buffer: the per-tensor
    gradient norms (sums of squares), the finite-weights check and the loss and mask sums.

    Results land in ``out[out_index]`` on the device, so several (per-layer norms, the loss sum)
    can be computed and then downloaded in one copy. The pass-1 partials buffer belongs to this
    launcher (grown as needed): use one ``Sums`` per thread / queue.
    """

    def __init__(self, dev: Device, local_size: int | None = None, contiguous: bool | None = None):
        self.dev = dev
        # sum_squares_chunks' work split: a slice per work-item on CPUs, interleaved on GPUs (sums.cl)
        self.contiguous = np.int32(contiguous_units(dev) if contiguous is None else contiguous)
        self.chunk = CHUNK_CONTIGUOUS if self.contiguous else CHUNK
        self._sq = dev.kernel("sums", "sum_squares_partial")
        self._sum = dev.kernel("sums", "sum_partial")
        self._final = dev.kernel("sums", "sum_final")
        self._chunks = dev.kernel("sums", "sum_squares_chunks")
        self._segments = dev.kernel("sums", "sum_segments")
        wanted = local_size or 256
        self.local = min(dev.work_group_size(self._sq, wanted),
                         dev.work_group_size(self._sum, wanted))
        self.local_final = dev.work_group_size(self._final, wanted)
        # contiguous: one work-item a chunk, its four streams 16K floats apart (a group's items share a chunk and
        # run one after another on PoCL: their streams would be 64 floats apart, one stream of memory)
        self.local_chunks = 1 if self.contiguous else dev.work_group_size(self._chunks, wanted)
        self.local_segments = dev.work_group_size(self._segments, min(wanted, 32))  # few partials per tensor
        self._partials = None
        self._partials_len = 0
        self._tables: dict[tuple, tuple] = {}  # segments -> (chunks, first, n_chunks, partials)

    def _segment_tables(self, segments: tuple[tuple[int, int], ...]):
        tables = self._tables.get(segments)
        if tables is None:
            chunks, first = [], [0]
            for off, size in segments:
                if off < 0 or size < 0 or off + size >= 2**31:
                    raise ValueError(f"segment ({off}, {size}) outside the int32 index range")
                for start in range(off, off + size, self.chunk):
                    chunks.append((start, min(start + self.chunk, off + size)))
                first.append(len(chunks))
            n_chunks = len(chunks)
            chunk_buf = self.dev.upload(np.asarray(chunks or [(0, 0)], np.int32).reshape(-1))
            first_buf = self.dev.upload(np.asarray(first, np.int32))
            tables = (chunk_buf, first_buf, n_chunks, self.dev.alloc(max(1, n_chunks)))
            self._tables[segments] = tables
        return tables

    def _reduce(self, kernel, out, out_index: int, x, n: int) -> None:
        if n >= 2**31:
            raise ValueError(f"reduction over {n} elements exceeds the int32 index range")
        L = self.local
        n_groups = max(1, min(-(-int(n) // L), MAX_GROUPS))
        if n_groups > self._partials_len:
            self._partials = self.dev.alloc(n_groups)
            self._partials_len = n_groups
        lm = self.dev.cl.LocalMemory
        kernel(self.dev.queue, (n_groups * L,), (L,), self._partials, x, np.int32(n), lm(4 * L))
        Lf = self.local_final
        self.dev.launch(self._final, (Lf,), (Lf,), out, np.int32(out_index), self._partials,
                    np.int32(n_groups), lm(4 * Lf))

    def sum_squares(self, out: cl.Buffer, out_index: int, x: cl.Buffer, n: int) -> None:
        """``out[out_index] = sum(x[:n] ** 2)`` (overwritten); ``x`` float32 ``(n,)``, ``out``
        float32 with at least ``out_index + 1`` elements. Deterministic for a given device and
        local size. The L2 norm is ``sqrt`` of it; per-layer norms: call on sub-buffers with
        different ``out_index``."""
        self._reduce(self._sq, out, out_index, x, n)

    def sum(self, out: cl.Buffer, out_index: int, x: cl.Buffer, n: int) -> None:
        """``out[out_index] = sum(x[:n])`` (overwritten), e.g. the loss sum over rows."""
        self._reduce(self._sum, out, out_index, x, n)

    def sum_squares_segments(self, out: cl.Buffer, out_start: int, x: cl.Buffer,
                             segments: Iterable[tuple[int, int]]) -> None:
        """``out[out_start + s] = sum(x[off_s : off_s + size_s] ** 2)`` for every segment ``s``, in two
        launches for all segments together (overwritten).

        Each segment is cut into chunks of at most ``self.chunk`` elements (``CHUNK``, ``CHUNK_CONTIGUOUS``);
        one work-group sums a chunk
        (pass 1), one work-group per segment adds its chunks' partials in order (pass 2):
        deterministic for a given device and local size. Used for the per-tensor gradient norms
        over the flat gradient buffer. The chunk tables are built once per ``segments``.

        Args:
            out: float32 buffer with at least ``out_start + len(segments)`` elements.
            x: float32 buffer holding every segment.
            segments: ``[(offset, size), ...]`` in elements; an empty segment gives 0.

        Raises:
            ValueError: a segment reaches past the int32 index range.
        """
        segments = tuple((int(o), int(n)) for o, n in segments)
        if not segments:
            return
        chunk_buf, first_buf, n_chunks, partials = self._segment_tables(segments)
        lm = self.dev.cl.LocalMemory
        if n_chunks:
            L = self.local_chunks
            self.dev.launch(self._chunks, (n_chunks * L,), (L,), partials, x, chunk_buf, lm(4 * L), self.contiguous)
        Ls = self.local_segments
        self.dev.launch(self._segments, (len(segments) * Ls,), (Ls,), out, np.int32(out_start), partials,
                       first_buf, lm(4 * Ls))
