"""Launcher for ``matmul.cl``: C(M,N) = op(A) @ op(B), optionally accumulated, with offsets.

Tile sizes are compile-time (``-D`` build options) and chosen here from the device's limits:

* devices with on-chip local memory (GPUs): ``matmul_tiled`` with 64x64 C tiles, 4x4 outputs per
  work-item and K tiles of 16 (smaller tiles when the work-group size or local memory is short);
* CPUs, whose "local" memory is cached RAM: ``matmul_direct`` (6x16 outputs per work-item, read
  straight from global memory), or ``matmul_direct_nt`` for ``trans_b`` without ``trans_a``.

See the header of ``matmul.cl`` for why the CPU kernels do not stage tiles in local memory.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from core.device import Device

log = logging.getLogger(__name__)

KERNELS = ("matmul_tiled", "matmul_direct", "matmul_direct_nt")


@dataclass(frozen=True)
class MatmulTiles:
    """Compile-time tiling of one matmul kernel.

    Attributes:
        kernel: one of ``KERNELS``; ``matmul_direct_nt`` only serves ``trans_b and not trans_a``.
        tsm, tsn: rows / columns of C computed by one work-group.
        wptm, wptn: rows / columns of C computed by one work-item (``wptn`` in 1, 2, 4, 8, 16 except
            for ``matmul_direct_nt``, which takes any).
        tsk: depth of the local-memory tiles (``matmul_tiled`` only).
    """

    kernel: str
    tsm: int
    tsn: int
    wptm: int
    wptn: int
    tsk: int = 16

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if min(self.tsm, self.tsn, self.wptm, self.wptn, self.tsk) < 1:
            raise ValueError(f"tile sizes must be >= 1: {self}")
        if self.tsm % self.wptm or self.tsn % self.wptn:
            raise ValueError(f"tsm/tsn must be multiples of wptm/wptn: {self}")
        if self.kernel != "matmul_direct_nt" and self.wptn not in (1, 2, 4, 8, 16):
            raise ValueError(f"wptn must be 1, 2, 4, 8 or 16 for {self.kernel}: {self}")

    @property
    def local(self) -> tuple[int, int]:
        """Work-group shape (along N, along M)."""
        return self.tsn // self.wptn, self.tsm // self.wptm

    @property
    def items(self) -> int:
        """Work-items per work-group."""
        return self.local[0] * self.local[1]

    @property
    def local_mem_bytes(self) -> int:
        """Local memory the kernel declares (the two tiles of ``matmul_tiled``)."""
        return (self.tsm + self.tsn) * self.tsk * 4 if self.kernel == "matmul_tiled" else 0

    def options(self, trans_a: bool, trans_b: bool) -> tuple[str, ...]:
        """Build options for this tiling and transpose variant."""
        opts = [f"-DTSM={self.tsm}", f"-DTSN={self.tsn}", f"-DTSK={self.tsk}",
                f"-DWPTM={self.wptm}", f"-DWPTN={self.wptn}"]
        if trans_a:
            opts.append("-DTRANS_A")
        if trans_b:
            opts.append("-DTRANS_B")
        return tuple(opts)


def _uses_local_tiles(dev: Device) -> bool:
    """True when local memory is on-chip (CL_LOCAL): staging tiles there pays off (GPUs)."""
    cl = dev.cl
    try:
        on_chip = int(dev.cl_device.local_mem_type) == cl.device_local_mem_type.LOCAL
    except cl.Error:
        on_chip = False
    return on_chip and not int(dev.cl_device.type) & cl.device_type.CPU


def candidate_tiles(dev: Device, trans_a: bool, trans_b: bool,
                    max_items: int | None = None) -> list[MatmulTiles]:
    """Tilings for this device and transpose variant, best first.

    GPUs: the tiled kernel, 4x4 outputs per work-item, the largest square C tile whose work-group
    (``(tile/4)**2`` items) fits ``max_items`` (default: the device maximum) and whose two tiles
    fit local memory. CPUs: the direct kernels with the sizes measured best on PoCL (2-core AMD
    EPYC, AVX2): 6x16 outputs per work-item (12 AVX2 accumulators), one work-item per group; for
    ``trans_b`` alone, 4x3 dot products per work-item, 4 work-items per group along M.
    """
    max_items = max_items or dev.max_work_group_size
    if _uses_local_tiles(dev):
        out = []
        for tile, wpt in ((64, 4), (32, 4), (16, 4), (8, 4), (4, 4), (2, 2), (1, 1)):
            t = MatmulTiles("matmul_tiled", tile, tile, wpt, wpt, tsk=16)
            if t.items <= max_items and t.local_mem_bytes <= dev.local_mem_size:
                out.append(t)
        return out
    if trans_b and not trans_a:
        cpu = [MatmulTiles("matmul_direct_nt", 16, 3, 4, 3), MatmulTiles("matmul_direct_nt", 4, 3, 4, 3)]
    else:
        cpu = [MatmulTiles("matmul_direct", 6, 16, 6, 16)]
    cpu.append(MatmulTiles(cpu[0].kernel, 1, 1, 1, 1))
    return [t for t in cpu if t.items <= max_items]


class Matmul:
    """C(M,N) = op(A)(M,K) @ op(B)(K,N) on float32 buffers; ``+=`` when ``accumulate``.

    ``a`` is stored (M,K) row-major, or (K,M) when ``trans_a``; ``b`` is stored (K,N), or (N,K)
    when ``trans_b``; ``c`` is (M,N). A linear layer ``y = x @ W.T`` (W stored (out, in) as in
    llama.cpp/GGUF) is ``matmul(y, x, W, M=B*T, N=out, K=in, trans_b=True)``; its backward is
    ``matmul(dx, dy, W, M, in, out)`` and ``matmul(dW, dy, x, out, in, M, trans_a=True,
    accumulate=True)``.

    The four transpose variants are built once here, each with its own tiling (see
    :func:`candidate_tiles`).

    Args:
        dev: the device.
        local_size: largest work-group (in work-items) to use; default the device's maximum.
        tiles: override the tiling: one :class:`MatmulTiles` for every variant, or a dict
            ``{(trans_a, trans_b): MatmulTiles}`` for some (tests use this).
    """

    def __init__(self, dev: Device, local_size: int | None = None,
                 tiles: MatmulTiles | dict[tuple[bool, bool], MatmulTiles] | None = None):
        self.dev = dev
        self._variants: dict[tuple[bool, bool], tuple[object, MatmulTiles]] = {}
        for ta in (False, True):
            for tb in (False, True):
                forced = tiles.get((ta, tb)) if isinstance(tiles, dict) else tiles
                self._variants[(ta, tb)] = self._build(ta, tb, forced, local_size)

    def _build(self, ta: bool, tb: bool, forced: MatmulTiles | None, local_size: int | None):
        options = [forced] if forced is not None else candidate_tiles(self.dev, ta, tb, local_size)
        for t in options:
            if t.kernel == "matmul_direct_nt" and not (tb and not ta):
                raise ValueError("matmul_direct_nt only serves trans_b=True, trans_a=False")
            knl = self.dev.kernel("matmul", t.kernel, t.options(ta, tb))
            # a kernel can allow fewer work-items than the device (registers); then go smaller
            if self.dev.work_group_size(knl) >= t.items:
                log.debug("matmul trans_a=%s trans_b=%s: %s", ta, tb, t)
                return knl, t
            if forced is not None:
                raise ValueError(f"{t} needs {t.items} work-items; the kernel allows fewer")
        raise RuntimeError(f"no matmul tiling fits {self.dev.info.name}")

    def tiles(self, trans_a: bool = False, trans_b: bool = False) -> MatmulTiles:
        """The tiling used for this transpose variant."""
        return self._variants[(bool(trans_a), bool(trans_b))][1]

    def __call__(self, c, a, b, M: int, N: int, K: int, trans_a: bool = False,
                 trans_b: bool = False, accumulate: bool = False, a_offset: int = 0,
                 b_offset: int = 0, c_offset: int = 0) -> None:
        """c[c_offset:] (M,N) = (or +=, when ``accumulate``) op(a[a_offset:]) @ op(b[b_offset:]).

        Args:
            c: output buffer (float32), written (or accumulated into) at rows of N elements.
            a: (M,K) row-major, or (K,M) when ``trans_a``.
            b: (K,N) row-major, or (N,K) when ``trans_b``.
            M, N, K: sizes; K == 0 gives zeros (or leaves c as is when accumulating).
            a_offset, b_offset, c_offset: element offsets into the buffers.
        """
        if M <= 0 or N <= 0:
            return
        knl, t = self._variants[(bool(trans_a), bool(trans_b))]
        lx, ly = t.local
        global_size = (-(-N // t.tsn) * lx, -(-M // t.tsm) * ly)
        knl(self.dev.queue, global_size, (lx, ly), c, a, b, np.int32(M), np.int32(N),
            np.int32(K), np.int32(1 if accumulate else 0), np.int32(a_offset),
            np.int32(b_offset), np.int32(c_offset))
