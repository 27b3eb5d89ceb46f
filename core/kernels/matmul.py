"""Launcher for ``matmul.cl``: C(M,N) = op(A) @ op(B), optionally accumulated, with offsets.

Every size is a compile-time ``-D`` option described by one of three configuration classes:

* :class:`TiledConfig` — ``matmul_tiled``, local-memory tiles with a register tile per work-item
  (devices with on-chip local memory: GPUs);
* :class:`PackedConfig` — ``matmul_pack_b`` (+ ``matmul_pack_a``) then ``matmul_packed``, a
  barrier-free register-blocked micro-kernel over packed panels (CPUs);
* :class:`GemvConfig` — ``matmul_gemv`` for ``M <= GEMV_MAX_M`` rows times ``b`` stored (N,K)
  (decode), chosen automatically when M is small.

Which configuration a device gets: the winner of :mod:`core.kernels.matmul_autotune` (timed once per
device, driver and kernel source, cached in the user cache folder), else :func:`default_configs`.
See the header of ``matmul.cl`` for the kernels themselves.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Union

import numpy as np

from core.device import Device, KernelBuildError, KernelLimitError
from core.kernels._launch import simd_width

if TYPE_CHECKING:
    import pyopencl as cl

log = logging.getLogger(__name__)

VARIANTS = ((False, False), (False, True), (True, False), (True, True))  # (trans_a, trans_b)
GEMV_MAX_M = 8  # rows of A up to which b-transposed products use matmul_gemv
PACK_KB = 16  # columns per work-item of matmul_pack_a (a stored (K,M)), and its work-group
PACK_LOCAL = 16  # work-items per group of the packing kernels (at most; the compiled kernel's limit decides)
SCRATCH_FLOATS = 1 << 24  # largest packed operand of one K chunk (64 MiB): bounds CPU scratch
# matmul_tiled splits K when C has fewer than SPLIT_WAVES work-groups per compute unit (a GPU
# would idle): into parts at least SPLIT_MIN_K deep where C has fewer tiles than half the compute
# units, else at least SPLIT_DEEP_K deep (measured on an H200 at d_model 512/768 shapes: splitting
# K of 512-768 over C's of 1-2 tiles per compute unit loses to the extra pass); the first part goes into
# C, the others' partial products (at most SCRATCH_FLOATS) are added to it in order by matmul_reduce_splits
SPLIT_WAVES = 4
SPLIT_MIN_K = 128
SPLIT_DEEP_K = 512
# A product that no per-shape measurement matches takes the choice of a measured one of its variant that differs
# in one size by at most this factor (Matmul._nearest_shape: a batch padded shorter than the longest one).
# Measured on an H100, SmolLM2's shape sized for 8 x 512 (benchmarks/padded_batches.py), steps with the nearest
# shape's tilings against the variants' ones: 1.025x at 448 tokens a row (ratio 1.14), 1.018x at 320 (1.6),
# 0.984x at 256 (2.0)
NEAR_SHAPE_RATIO = 1.6
# A stored (M,K) is read in place (the micro-kernel's MR row pointers walk along k): packing it cost a
# read and a write of all of A for no gain (measured on PoCL, 2-core Xeon with AVX-512, the blocked-sum
# kernel: a LoRA step's products 8 % less time, (256, 3072, 32) 34 %, d512's shapes within noise).
PACK_A_T_MIN_PANELS = 2
# A packed configuration without its own ``kc`` packs all of K in one round, unless K is deeper than
# PACKED_DEEP_K: then in equal rounds of at most PACKED_DEEP_KC rows, so that a B panel stays in the cache
# while the row blocks walk down it (measured on PoCL, 2-core Xeon: the tied logits' input gradient
# (256,576,49152) 119 -> 54 ms, (2048,576,8192) 92 -> 60 ms; K = 576-3072 products are as fast or faster
# in one round, so they keep it)
PACKED_DEEP_K = 4096
PACKED_DEEP_KC = 2048
# (Reading a B stored (K,N) in place, packing only a last partial panel, was measured and dropped: d512's
# backward products 2.3x slower (rows 2 KiB apart alias in L1), SmolLM2's 3 % slower, the default's 3 % faster.)
_VECTOR_WIDTHS = (1, 2, 4, 8, 16)


def _check(cond: bool, cfg, why: str) -> None:
    if not cond:
        raise ValueError(f"{type(cfg).__name__}: {why}: {cfg}")


class TileGrid:
    """What a tiled kernel's configuration (``matmul_tiled``'s :class:`TiledConfig`, ``qmatmul_tiled``'s
    ``QTiledConfig``) derives from its sizes ``tsm`` x ``tsn`` (C per work-group), ``tsk`` (K tile
    depth) and ``wptm`` x ``wptn`` (C per work-item): the work-group and the ``-D`` tile options."""

    @property
    def local(self) -> tuple[int, int]:
        """Work-group shape (along N, along M)."""
        return self.tsn // self.wptn, self.tsm // self.wptm

    @property
    def items(self) -> int:
        """Work-items per work-group."""
        return self.local[0] * self.local[1]

    def tile_options(self) -> tuple[str, ...]:
        """``-DTSM= -DTSN= -DTSK= -DWPTM= -DWPTN=`` of these sizes."""
        return (f"-DTSM={self.tsm}", f"-DTSN={self.tsn}", f"-DTSK={self.tsk}", f"-DWPTM={self.wptm}",
                f"-DWPTN={self.wptn}")


@dataclass(frozen=True)
class TiledConfig(TileGrid):
    """``matmul_tiled``: a ``tsm`` x ``tsn`` tile of C per work-group staged through local memory.

    Attributes:
        tsm, tsn: rows / columns of C per work-group.
        tsk: depth of the local-memory K tiles.
        wptm, wptn: rows / columns of C per work-item (register tile); work-group shape
            ``(tsn // wptn, tsm // wptm)``, dimension 0 along N.
        vw: vector width (1, 2, 4, 8, 16) of global loads and local reads; divides every size above.
        pad: floats of padding per local tile row (against bank conflicts), a multiple of ``vw``.
        dbuf: 1 = ping-pong buffered local tiles (one barrier per K tile), 2 = that with the next tile's global
            loads prefetched into registers during this tile's products, 0 = single.
    """

    tsm: int = 64
    tsn: int = 64
    tsk: int = 16
    wptm: int = 4
    wptn: int = 4
    vw: int = 4
    pad: int = 0
    dbuf: int = 0

    kernel = "matmul_tiled"

    def __post_init__(self) -> None:
        _check(min(self.tsm, self.tsn, self.tsk, self.wptm, self.wptn) >= 1, self, "sizes must be >= 1")
        _check(self.vw in _VECTOR_WIDTHS, self, "vw must be 1, 2, 4, 8 or 16")
        _check(self.tsm % self.wptm == 0 and self.tsn % self.wptn == 0, self, "tsm/tsn must be multiples of wptm/wptn")
        _check(all(v % self.vw == 0 for v in (self.tsm, self.tsn, self.tsk, self.wptm, self.wptn, self.pad)),
               self, "vw must divide tsm, tsn, tsk, wptm, wptn and pad")
        _check(self.dbuf in (0, 1, 2) and self.pad >= 0, self, "dbuf must be 0, 1 or 2, pad >= 0")

    @property
    def local_mem_bytes(self) -> int:
        """Local memory the kernel declares (the A and B tiles, twice when ping-pong buffered)."""
        return (2 if self.dbuf else 1) * self.tsk * (self.tsm + self.tsn + 2 * self.pad) * 4

    def options(self, trans_a: bool, trans_b: bool) -> tuple[str, ...]:
        """Build options for this configuration and transpose variant."""
        return (*self.tile_options(), f"-DVW={self.vw}", f"-DPAD={self.pad}", f"-DDBUF={self.dbuf}",
                *_trans_options(trans_a, trans_b))


@dataclass(frozen=True)
class PackedConfig:
    """``matmul_packed``: an ``mr`` x ``vw * nb`` block of C per work-item over packed panels.

    Attributes:
        mr: rows of C per work-item (and of a packed A panel).
        nb: vectors of ``vw`` columns per work-item (a B panel is ``vw * nb`` columns wide).
        vw: vector width of the accumulators (16 = one AVX-512 register, 8 = one AVX2 register).
        wg: work-items per work-group (consecutive row blocks of one B panel).
        super_rows: row blocks per super-row (the A rows a B panel is reused across).
        pack_a: also pack op(A) into MR-row panels when A is stored (K,M) and op(B) has several panels
            (``PACK_A_T_MIN_PANELS``); else, and always for A stored (M,K), it is read in place.
        kc: K chunk per launch (0 = all of K in one launch); later chunks accumulate into C.
    """

    mr: int = 6
    nb: int = 1
    vw: int = 16
    wg: int = 1
    super_rows: int = 32
    pack_a: bool = False
    kc: int = 0

    kernel = "matmul_packed"

    def __post_init__(self) -> None:
        _check(min(self.mr, self.nb, self.wg, self.super_rows) >= 1 and self.kc >= 0, self,
               "sizes must be >= 1 (kc >= 0)")
        _check(self.vw in _VECTOR_WIDTHS, self, "vw must be 1, 2, 4, 8 or 16")

    @property
    def nr(self) -> int:
        """Columns of C per work-item (width of a packed B panel)."""
        return self.vw * self.nb

    @property
    def local(self) -> tuple[int, ...]:
        """Work-group shape (1-D)."""
        return (self.wg,)

    @property
    def items(self) -> int:
        """Work-items per work-group."""
        return self.wg

    @property
    def local_mem_bytes(self) -> int:
        """Local memory the kernel declares (none)."""
        return 0

    def options(self, trans_a: bool, trans_b: bool) -> tuple[str, ...]:
        """Build options for this configuration and transpose variant."""
        return (f"-DMR={self.mr}", f"-DNB={self.nb}", f"-DVW={self.vw}", f"-DSUPER={self.super_rows}",
                f"-DPACK_KB={PACK_KB}",
                *(("-DPACK_A",) if self.pack_a else ()), *_trans_options(trans_a, trans_b))


@dataclass(frozen=True)
class GemvConfig:
    """``matmul_gemv``: ``rows`` outputs per work-group of ``wg`` work-items splitting K.

    Attributes:
        wg: work-items per work-group (a power of two; 1 = no local reduction).
        rows: output columns per work-group.
        vw: vector width of the loads along K.
    """

    wg: int = 64
    rows: int = 1
    vw: int = 4

    kernel = "matmul_gemv"

    def __post_init__(self) -> None:
        _check(self.wg >= 1 and self.wg & (self.wg - 1) == 0, self, "wg must be a power of two")
        _check(self.rows >= 1 and self.vw in _VECTOR_WIDTHS, self, "rows >= 1, vw in 1, 2, 4, 8, 16")

    @property
    def items(self) -> int:
        """Work-items per work-group."""
        return self.wg

    @property
    def local_mem_bytes(self) -> int:
        """Local memory of the reduction for GEMV_MAX_M rows."""
        return GEMV_MAX_M * self.rows * self.wg * 4 if self.wg > 1 else 0

    def options(self, m: int) -> tuple[str, ...]:
        """Build options for ``m`` rows of A (b transposed)."""
        return (f"-DGEMV_M={m}", f"-DGEMV_WG={self.wg}", f"-DGEMV_ROWS={self.rows}", f"-DVW={self.vw}",
                "-DTRANS_B")


GemmConfig = Union[TiledConfig, PackedConfig]
_CLASSES = {c.kernel: c for c in (TiledConfig, PackedConfig, GemvConfig)}


def config_to_dict(cfg: GemmConfig | GemvConfig) -> dict:
    """JSON-ready form of a configuration: its fields plus ``"kernel"``."""
    return {"kernel": cfg.kernel, **asdict(cfg)}


def config_from_dict(d: dict) -> GemmConfig | GemvConfig:
    """Inverse of :func:`config_to_dict`.

    Raises:
        ValueError: unknown kernel name or invalid fields.
    """
    d = dict(d)
    cls = _CLASSES.get(d.pop("kernel", None))
    if cls is None:
        raise ValueError(f"unknown matmul kernel in {d}")
    try:
        return cls(**d)
    except TypeError as e:
        raise ValueError(f"bad matmul configuration {d}: {e}") from None


def _trans_options(trans_a: bool, trans_b: bool) -> tuple[str, ...]:
    return (*(("-DTRANS_A",) if trans_a else ()), *(("-DTRANS_B",) if trans_b else ()))


def uses_local_tiles(dev: Device) -> bool:
    """True when local memory is on-chip (CL_LOCAL) and the device is no CPU: tiles pay (GPUs)."""
    cl = dev.cl
    try:
        on_chip = int(dev.cl_device.local_mem_type) == cl.device_local_mem_type.LOCAL
    except cl.Error:
        on_chip = False
    return on_chip and not int(dev.cl_device.type) & cl.device_type.CPU


def cpu_group_width(dev: Device) -> int:
    """Work-items per group of the CPU kernels: 1, or 8 on a CPU device that vectorises across work-items
    and says so with a preferred float vector width of 1 (Mesa's llvmpipe: SIMD lanes are work-items, and
    groups of one leave 7 of 8 idle; measured 0.47 -> 0.96 GFLOP per CPU second on the packed matmul)."""
    try:
        return 8 if int(dev.cl_device.preferred_vector_width_float) == 1 else 1
    except dev.cl.Error:
        return 1


def cpu_vector_width(dev: Device) -> int:
    """Float vector width of the CPU kernels: :func:`core.kernels._launch.simd_width` (16 on AVX-512 CPUs, 8 on
    AVX2), 4 if it is none of 4, 8, 16."""
    w = simd_width(dev)
    return w if w in (4, 8, 16) else 4


def fits(dev: Device, cfg: GemmConfig | GemvConfig, max_items: int | None = None) -> bool:
    """Whether ``cfg``'s work-group and local memory fit the device (and ``max_items``)."""
    limit = min(dev.max_work_group_size, max_items or dev.max_work_group_size)
    return cfg.items <= limit and cfg.local_mem_bytes <= dev.local_mem_size


def _check_fits(dev: Device, cfg: GemmConfig | GemvConfig, max_items: int | None) -> None:
    """Raise KernelLimitError with the reason when ``cfg`` does not fit the device (or ``max_items``)."""
    limit = min(dev.max_work_group_size, max_items or dev.max_work_group_size)
    if cfg.items > limit:
        raise KernelLimitError(f"{cfg}: needs {cfg.items} work-items per group; {dev.info.name} allows {limit}")
    if cfg.local_mem_bytes > dev.local_mem_size:
        raise KernelLimitError(f"{cfg}: needs {cfg.local_mem_bytes} bytes of local memory; {dev.info.name} "
                               f"has {dev.local_mem_size}")


_TILED_DEFAULTS = (TiledConfig(128, 128, 16, 8, 8, 4, 4, 1), TiledConfig(64, 64, 16, 4, 4, 4, 4, 1),
                   TiledConfig(32, 32, 16, 4, 4, 4, 4, 0), TiledConfig(16, 16, 16, 4, 4, 4, 0, 0),
                   TiledConfig(8, 8, 8, 4, 4, 4, 0, 0), TiledConfig(4, 4, 4, 4, 4, 4, 0, 0),
                   TiledConfig(1, 1, 1, 1, 1, 1, 0, 0))
_GEMV_DEFAULTS = (GemvConfig(128, 1, 4), GemvConfig(32, 1, 4), GemvConfig(1, 1, 4))
NARROW_MAX = 64
"""Tiled devices: a product whose N (else M) is at most this many uses the ``"narrow_n"`` (``"narrow_m"``)
configuration (LoRA's adapter products: N or M = P x rank; a 128 x 128 C tile would compute mostly padding,
and its few work-groups leave a GPU idle)."""
NARROW_KINDS = ("narrow_n", "narrow_m")
_NARROW_DEFAULTS = {"narrow_n": TiledConfig(64, 32, 16, 4, 4, 4, 4, 1), "narrow_m": TiledConfig(32, 64, 16, 4, 4, 4, 4, 1)}


def narrow_kind(M: int, N: int) -> str | None:
    """Which narrow configuration a tiled product of C (M, N) takes: ``"narrow_n"``, ``"narrow_m"`` or None."""
    return "narrow_n" if N <= NARROW_MAX else "narrow_m" if M <= NARROW_MAX else None


def default_narrow(dev: Device) -> dict[str, TiledConfig]:
    """Untuned narrow configurations of a tiled device (those that fit it; none for CPUs)."""
    if not uses_local_tiles(dev):
        return {}
    return {k: c for k, c in _NARROW_DEFAULTS.items() if fits(dev, c)}


def fallback_configs(dev: Device, max_items: int | None = None) -> tuple[list[GemmConfig], list[GemvConfig]]:
    """Untuned configurations in order of preference that fit the device's limits (and ``max_items``):
    (matrix-matrix, GEMV). The first of each is :func:`default_configs`'; the later ones, smaller,
    are what :class:`Matmul` takes when a compiled kernel allows fewer work-items than the device
    (registers: a compiled kernel's CL_KERNEL_WORK_GROUP_SIZE can be far below the device's maximum).
    The last of each (one work-item) fits any device."""
    if uses_local_tiles(dev):
        return ([c for c in _TILED_DEFAULTS if fits(dev, c, max_items)],
                [g for g in _GEMV_DEFAULTS if fits(dev, g, max_items)])
    vw, wg = cpu_vector_width(dev), cpu_group_width(dev)
    cfg = PackedConfig(mr=6, nb=4 if vw == 16 else 2, vw=vw, wg=wg, super_rows=16, pack_a=True)
    gemv = [GemvConfig(32, 1, 4)] if wg > 1 else []
    return [cfg, PackedConfig(4, 1, 4, 1, 16, True)], [*gemv, GemvConfig(1, 4, vw), GemvConfig(1, 1, 4)]


def default_configs(dev: Device, max_items: int | None = None) -> tuple[GemmConfig, GemvConfig]:
    """Untuned defaults: (matrix-matrix configuration, GEMV configuration) for this device.

    GPUs: 128x128 tiles of 8x8 per work-item (16x16 work-items), K tiles of 16, float4, padded,
    ping-pong buffered (CLBlast's best NVIDIA class of setting), or the largest smaller tile that fits
    the work-group and local memory limits. CPUs: blocks of 6 rows x 2 vectors of the device's
    vector width (12 accumulators, Goto's Haswell shape), or 6 x 4 vectors (24 of the 32
    registers) on AVX-512, both operands packed (measured best on PoCL, 2-core Xeon with
    AVX-512); GEMV one work-item per 4 outputs with full-width vectors. A compiled kernel may allow
    less than the device: :class:`Matmul` then goes down :func:`fallback_configs`.
    """
    gemm, gemv = fallback_configs(dev, max_items)
    return gemm[0], gemv[0]


class _Scratch:
    """Scratch buffers (packed panels) by name, grown on demand and kept for the next call."""

    def __init__(self, dev: Device):
        self.dev = dev
        self._buffers: dict[str, tuple[object, int]] = {}

    def get(self, name: str, n_floats: int):
        buf, size = self._buffers.get(name, (None, 0))
        if size < n_floats:
            size = max(n_floats, int(size * 1.25))
            buf = self.dev.alloc(size)  # the old one is freed once queued kernels are done with it
            self._buffers[name] = (buf, size)
        return buf

    def held_bytes(self) -> int:
        """Bytes of the scratch buffers held now."""
        return 4 * sum(size for _, size in self._buffers.values())


def scratch_bound_floats(shapes: Iterable[tuple[int, int, int, bool, bool]]) -> int:
    """At most the floats of scratch :meth:`Matmul.reserve` holds for these shapes on any device (for
    memory estimates made before a device's kernels are built). A device runs one family of kernels: CPUs
    the packed one, whose scratch is the packed panels of op(A) and op(B) of the widest products (rows padded
    to 16, at most ``SCRATCH_FLOATS`` each); GPUs the tiled one, whose scratch is the partial products of a
    K split into parts at least ``SPLIT_MIN_K`` deep (by the launcher's rule or a measured count of parts:
    at most ``K // SPLIT_MIN_K`` parts, all but the first in scratch as M x N each, and at most ``SCRATCH_FLOATS``).
    The larger of the two."""
    pad = lambda x: -(-x // 16) * 16  # noqa: E731 - widest register blocks (mr, nr)
    gemm = [(M, N, K) for M, N, K, ta, tb in shapes if not (tb and not ta and M <= GEMV_MAX_M)]  # GEMV: none
    a = max((min(pad(M) * K, SCRATCH_FLOATS) for M, N, K in gemm), default=0)
    b = max((min(pad(N) * K, SCRATCH_FLOATS) for M, N, K in gemm), default=0)
    splits = max((min((K // SPLIT_MIN_K - 1) * M * N, SCRATCH_FLOATS) for M, N, K in gemm if K >= 2 * SPLIT_MIN_K),
                 default=0)
    return max(a + b, splits)


class GemmKernel:
    """One matrix-matrix configuration built for one transpose variant (used by :class:`Matmul`
    and the tuner).

    Args:
        dev: the device.
        cfg: a :class:`TiledConfig` or :class:`PackedConfig`.
        trans_a, trans_b: the variant.
        max_items: work-group cap (default the device maximum).
        scratch: scratch-buffer pool to share (packed kernels); default a new one.

    Raises:
        KernelLimitError: ``cfg`` does not fit the device, ``max_items`` or a compiled kernel's limits.
        KernelBuildError: the kernel failed to build.
    """

    def __init__(self, dev: Device, cfg: GemmConfig, trans_a: bool, trans_b: bool,
                 max_items: int | None = None, scratch: _Scratch | None = None):
        _check_fits(dev, cfg, max_items)
        self.dev, self.cfg, self.scratch = dev, cfg, scratch or _Scratch(dev)
        self.trans = (bool(trans_a), bool(trans_b))
        self._aligned = None  # tiled: the ALIGNED program's kernel, built at the first product it serves
        if isinstance(cfg, TiledConfig):
            opts = cfg.options(trans_a, trans_b)
            self._main = dev.kernel("matmul", "matmul_tiled", opts)
            self._reduce = dev.kernel("matmul", "matmul_reduce_splits", opts)
        else:
            packs_a = cfg.pack_a and trans_a  # only an A stored (K,M) is packed (PACK_A_T_MIN_PANELS)
            opts = replace(cfg, pack_a=packs_a).options(trans_a, trans_b)  # one program for all three kernels
            self._main = dev.kernel("matmul", "matmul_packed", opts)
            self._pack_b = dev.kernel("matmul", "matmul_pack_b", opts)
            self._pack_a = dev.kernel("matmul", "matmul_pack_a", opts) if packs_a else None
            # the micro-kernel reading A in place, for products with few B panels
            self._direct_a = (dev.kernel("matmul", "matmul_packed", replace(cfg, pack_a=False).options(trans_a, trans_b))
                              if packs_a else None)
        # a compiled kernel can allow fewer work-items than the device (registers, as on iGPUs)
        self.limits = dev.kernel_limits(self._main)
        dev.check_fits(self._main, cfg.items, cfg)
        if isinstance(cfg, TiledConfig):
            self._reduce_wg = dev.work_group_size(self._reduce, 256)
        else:
            if self._direct_a is not None:
                dev.check_fits(self._direct_a, cfg.items, cfg)
            # packing launches get a fixed work-group (PoCL compiles a kernel per work-group size at its first
            # launch: a size it picks itself follows the global size, and each new product shape compiled again)
            self._pack_local = dev.work_group_size(self._pack_b, PACK_LOCAL)
            if self._pack_a is not None:
                dev.check_fits(self._pack_a, PACK_KB, cfg)

    def __call__(self, c: cl.Buffer, a: cl.Buffer, b: cl.Buffer, M: int, N: int, K: int, accumulate: bool,
                 a_offset: int, b_offset: int, c_offset: int, parts: int = 0) -> None:
        """Enqueue C = (or +=) op(A) @ op(B) (see :meth:`Matmul.__call__`); M, N >= 1. ``parts``: how a tiled
        product splits K (:meth:`splits`: 0 the rule, 1 never, n into n parts)."""
        cfg, q, i32 = self.cfg, self.dev.queue, np.int32
        acc = i32(1 if accumulate else 0)
        if isinstance(cfg, TiledConfig):
            lx, ly = cfg.local
            splits, k_split = self.splits(M, N, K, parts)
            grid = (-(-N // cfg.tsn) * lx, -(-M // cfg.tsm) * ly, splits)
            main = self._aligned_kernel() if self.aligned(M, N, K, a_offset, b_offset) else self._main
            # part 0 into c, the others into the scratch's slices, added to c in order afterwards
            part = self.scratch.get("splits", (splits - 1) * M * N) if splits > 1 else c
            main(q, grid, (lx, ly, 1), c, part, a, b, i32(M), i32(N), i32(K), acc, i32(a_offset),
                 i32(b_offset), i32(c_offset), i32(k_split if splits > 1 else max(K, 1)))
            if splits > 1:
                wg = self._reduce_wg
                self._reduce(q, (-(-(M * N) // wg) * wg,), (wg,), c, part, i32(M * N), i32(splits - 1),
                             i32(c_offset))
            return
        n_panels, n_blocks = -(-N // cfg.nr), -(-M // cfg.mr)
        kc, need = self._packing(M, N, K)
        bp = self.scratch.get("b", need["b"])
        pack_a, main = self._pack_a, self._main
        if "a" not in need and pack_a is not None:  # A read in place (few panels of B)
            pack_a, main = None, self._direct_a
        ap = self.scratch.get("a", need["a"]) if pack_a is not None else a
        global_size = (-(-(n_panels * n_blocks) // cfg.wg) * cfg.wg,)
        for k0 in range(0, max(K, 1), kc):  # one round for K == 0: writes zeros (or keeps c)
            n = i32(min(kc, K - k0))
            if n > 0:  # in-order queue: a chunk's packing waits for the previous chunk's product
                lb = self._pack_local  # rows past kc return at once
                self._pack_b(q, (-(-int(n) // lb) * lb, n_panels), (lb, 1), bp, b, i32(N), i32(K), i32(b_offset),
                             i32(k0), n)
                if pack_a is not None:  # a (K,M): 16 panels side by side per work-group; panels past M return
                    grid = (-(-n_blocks // PACK_KB) * PACK_KB, -(-int(n) // PACK_KB))
                    pack_a(q, grid, (PACK_KB, 1), ap, a, i32(M), i32(K), i32(a_offset), i32(k0), n)
            main(q, global_size, (cfg.wg,), c, ap, bp, i32(M), i32(N), i32(K),
                 acc if k0 == 0 else i32(1), i32(a_offset), i32(c_offset), i32(k0), n)

    def aligned(self, M: int, N: int, K: int, a_offset: int, b_offset: int) -> bool:
        """Whether a tiled product of these sizes and offsets may use the ``ALIGNED`` program: every whole
        tile's global vector read then starts at a multiple of ``vw`` floats (the offsets and the row
        lengths of op(A)'s and op(B)'s stored layouts are multiples of it, and the device aligns buffers
        to at least a vector)."""
        vw = self.cfg.vw
        if not isinstance(self.cfg, TiledConfig) or vw == 1 or self.dev.base_align_bytes < 4 * vw:
            return False
        trans_a, trans_b = self.trans
        rows_a = M if trans_a else K  # the contiguous axis of a stored (K,M) / (M,K)
        rows_b = K if trans_b else N
        return not (rows_a % vw or rows_b % vw or a_offset % vw or b_offset % vw)

    def _aligned_kernel(self):
        """The ``ALIGNED`` build of this configuration (built once, at first use; the plain kernel where
        the compiled one does not fit, logged)."""
        if self._aligned is None:
            knl = self.dev.kernel("matmul", "matmul_tiled", (*self.cfg.options(*self.trans), "-DALIGNED"))
            try:
                self.dev.check_fits(knl, self.cfg.items, self.cfg)
                self._aligned = knl
            except KernelLimitError as e:
                log.warning("matmul %s aligned: %s; using the plain kernel", self.cfg, e)
                self._aligned = self._main
        return self._aligned

    def splits(self, M: int, N: int, K: int, parts: int = 0) -> tuple[int, int]:
        """(parts, K elements per part) of a tiled product. ``parts`` 0 (the rule): 1 part unless C's tiles
        are fewer than ``SPLIT_WAVES`` per compute unit, each part a multiple of the K tile deep and at least
        ``SPLIT_MIN_K`` (``SPLIT_DEEP_K`` when C has half a tile per compute unit or more). ``parts`` n >= 1
        (a per-shape measurement, ``matmul_autotune.shape_configs``): at most n parts, each at least
        ``SPLIT_MIN_K`` deep. Either way the partial products held in scratch (all parts but the first, which goes
        into C) stay within ``SCRATCH_FLOATS``."""
        cfg, cu = self.cfg, self.dev.info.compute_units
        if parts > 0:
            n = min(parts, K // SPLIT_MIN_K, SCRATCH_FLOATS // (M * N) + 1)
        else:
            tiles = -(-M // cfg.tsm) * -(-N // cfg.tsn)
            want = -(-SPLIT_WAVES * cu // tiles)
            depth = SPLIT_MIN_K if 2 * tiles < cu else max(SPLIT_MIN_K, SPLIT_DEEP_K)
            n = min(want, K // depth, SCRATCH_FLOATS // (M * N) + 1)
        if n <= 1:
            return 1, K
        k_split = -(-(-(-K // n)) // cfg.tsk) * cfg.tsk
        parts = -(-K // k_split)
        return (parts, k_split) if parts > 1 else (1, K)

    def scratch_floats(self, M: int, N: int, K: int, parts: int = 0) -> dict[str, int]:
        """Floats of each scratch buffer a product of this shape uses (``parts`` as in :meth:`__call__`):
        ``"splits"`` (tiled kernels' partial products of split K), or ``"b"`` and ``"a"`` (the packed panels
        of op(B) and op(A) of one K chunk; no ``"a"`` when A is read in place)."""
        if isinstance(self.cfg, TiledConfig):
            splits = self.splits(M, N, K, parts)[0]
            return {"splits": (splits - 1) * M * N} if splits > 1 else {}
        return self._packing(M, N, K)[1]

    def _packing(self, M: int, N: int, K: int) -> tuple[int, dict[str, int]]:
        """(K rows per packing round, scratch floats) of a packed product (see :meth:`scratch_floats`)."""
        cfg = self.cfg
        n_panels, n_blocks = -(-N // cfg.nr), -(-M // cfg.mr)
        kc = self.chunk(M, N, K)
        need = {"b": n_panels * cfg.nr * kc}
        if self._pack_a is not None and n_panels >= PACK_A_T_MIN_PANELS:
            need["a"] = n_blocks * cfg.mr * kc
        return kc, need

    def chunk(self, M: int, N: int, K: int) -> int:
        """K rows per packing round: the configuration's ``kc`` (0: all of K, or rounds of at most
        ``PACKED_DEEP_KC`` when K is deeper than ``PACKED_DEEP_K``), shrunk so that the packed panels
        of one round stay within ``SCRATCH_FLOATS`` (and the device's largest buffer)."""
        cfg = self.cfg
        limit = min(SCRATCH_FLOATS, self.dev.max_alloc_bytes // 4)
        width = max(-(-N // cfg.nr) * cfg.nr, -(-M // cfg.mr) * cfg.mr)
        kc = cfg.kc if 0 < cfg.kc < K else max(K, 1)
        if cfg.kc == 0 and K > PACKED_DEEP_K:
            kc = -(-K // -(-K // PACKED_DEEP_KC))  # equal rounds of at most PACKED_DEEP_KC
        return max(1, min(kc, limit // width))


def gemv_rows(M: int) -> int:
    """The program (GEMV_M) that serves M rows: the next power of two, so that decode batches of 1 to
    GEMV_MAX_M rows build four programs (1, 2, 4, 8), not eight (first-run compile time)."""
    return 1 << max(0, int(M) - 1).bit_length()


class GemvKernel:
    """The GEMV configuration, built for M = 1 at once (its compiled kernel's limits checked) and
    lazily for each other row count M <= ``GEMV_MAX_M``. A row count whose compiled kernel allows
    fewer work-items than ``cfg.wg`` (more rows, more registers) gets the largest power of two it
    allows instead (logged): the same sums, split over fewer work-items.

    Raises:
        KernelLimitError: ``cfg`` does not fit the device, ``max_items`` or its compiled kernel (M = 1).
    """

    def __init__(self, dev: Device, cfg: GemvConfig, max_items: int | None = None):
        _check_fits(dev, cfg, max_items)
        self.dev, self.cfg = dev, cfg
        self._kernels: dict[int, tuple[GemvConfig, object]] = {}
        knl = dev.kernel("matmul", "matmul_gemv", cfg.options(1))
        dev.check_fits(knl, cfg.wg, cfg)
        self._kernels[1] = (cfg, knl)

    def _kernel(self, M: int) -> tuple[GemvConfig, object]:
        M = gemv_rows(M)
        if M not in self._kernels:
            g = self.cfg
            knl = self.dev.kernel("matmul", "matmul_gemv", g.options(M))
            allowed = self.dev.work_group_size(knl, g.wg)
            if allowed < g.wg:
                log.warning("matmul gemv M=%d: %s allows %d work-items; using that many", M, g, allowed)
                g = replace(g, wg=allowed)
                knl = self.dev.kernel("matmul", "matmul_gemv", g.options(M))
                self.dev.check_fits(knl, g.wg, g)
            self._kernels[M] = (g, knl)
        return self._kernels[M]

    def __call__(self, c: cl.Buffer, a: cl.Buffer, b: cl.Buffer, M: int, N: int, K: int, accumulate: bool,
                 a_offset: int, b_offset: int, c_offset: int) -> None:
        """Enqueue C (M,N) = (or +=) a (M,K) @ b (N,K).T; 1 <= M <= GEMV_MAX_M, N >= 1."""
        g, knl = self._kernel(M)
        i32 = np.int32
        self.dev.launch(knl, (-(-N // g.rows) * g.wg,), (g.wg,), c, a, b, i32(M), i32(N), i32(K),
                        i32(1 if accumulate else 0), i32(a_offset), i32(b_offset), i32(c_offset))


def _first_that_fits(configs: list, what: str, make: Callable):
    """``make(cfg)`` of the first of ``configs`` whose compiled kernels fit (the others logged with
    the reason); the last one's error is raised when none fits."""
    for i, cfg in enumerate(configs):
        try:
            return make(cfg)
        except KernelLimitError as e:
            if i == len(configs) - 1:
                raise
            log.warning("%s: %s; trying %s", what, e, configs[i + 1])
    raise ValueError(f"{what}: no configuration given")


class Matmul:
    """C(M,N) = op(A)(M,K) @ op(B)(K,N) on float32 buffers; ``+=`` when ``accumulate``.

    ``a`` is stored (M,K) row-major, or (K,M) when ``trans_a``; ``b`` is stored (K,N), or (N,K)
    when ``trans_b``; ``c`` is (M,N). A linear layer ``y = x @ W.T`` (W stored (out, in) as in
    llama.cpp/GGUF) is ``matmul(y, x, W, M=B*T, N=out, K=in, trans_b=True)``; its backward is
    ``matmul(dx, dy, W, M, in, out)`` and ``matmul(dW, dy, x, out, in, M, trans_a=True,
    accumulate=True)``. With ``trans_b`` alone and M <= ``GEMV_MAX_M`` (decode) the GEMV kernel runs.

    Args:
        dev: the device.
        local_size: largest work-group (in work-items) to use; default the device's maximum
            (a cap also skips the tuned configurations, which assume the full limit).
        configs: override the matrix-matrix configuration: one for every transpose variant, or a
            dict ``{(trans_a, trans_b): config}`` for some (tests use this). Default: the tuned
            ``tuned`` configuration, else :func:`default_configs`.
        gemv: override the GEMV configuration; ``False`` disables the GEMV path.
        narrow: tiled configurations of narrow products, ``{"narrow_n": cfg, "narrow_m": cfg}`` (see
            :data:`NARROW_MAX`); ``False`` disables them. Default: the tuned ones, else :func:`default_narrow`,
            on a tiled device without ``configs`` or ``local_size``; none otherwise.
        tuned: this device's tuning result (``core.kernels.matmul_autotune.tuned_configs``, which the
            caller runs: the tuner builds this module's kernels, so this module does not import it);
            None: :func:`default_configs`.

    Raises:
        KernelLimitError: a given configuration does not fit the device or its compiled kernels' limits
            (tuned and default ones fall back to smaller defaults that fit, logged).
        KernelBuildError: a kernel failed to build.
    """

    def __init__(self, dev: Device, local_size: int | None = None,
                 configs: GemmConfig | dict[tuple[bool, bool], GemmConfig] | None = None,
                 gemv: GemvConfig | bool | None = None, tuned: dict | None = None,
                 narrow: dict[str, TiledConfig] | bool | None = None):
        self.dev, self._local_size = dev, local_size
        self._narrow_kernels: dict[tuple, GemmKernel] = {}
        tuned = tuned if tuned is not None and local_size is None else {}
        if isinstance(narrow, dict):
            self._narrow_configs = dict(narrow)
        elif narrow is False or configs is not None or local_size is not None:
            self._narrow_configs = {}
        else:
            self._narrow_configs = {**default_narrow(dev), **{k: tuned[k] for k in NARROW_KINDS if k in tuned}}
        fallback_gemm, fallback_gemv = fallback_configs(dev, local_size)
        scratch = self._scratch = _Scratch(dev)
        self._variants: dict[tuple[bool, bool], GemmKernel] = {}
        for v in VARIANTS:
            forced = configs.get(v) if isinstance(configs, dict) else configs
            if forced is not None:  # given: it fits or is refused with the reason
                self._variants[v] = GemmKernel(dev, forced, *v, max_items=local_size, scratch=scratch)
            else:
                self._variants[v] = _first_that_fits(
                    ([tuned[v]] if v in tuned else []) + fallback_gemm, f"matmul {v}",
                    lambda c, v=v: GemmKernel(dev, c, *v, max_items=local_size, scratch=scratch))
            log.debug("matmul trans_a=%s trans_b=%s: %s", *v, self._variants[v].cfg)
        self._shapes: dict[tuple, tuple[GemmKernel, int]] = {}  # use_shape_configs: (ta, tb, M, N, K) -> kernel, parts
        self._near: dict[tuple, tuple[GemmKernel, int] | None] = {}  # other shapes: _nearest_shape's answer
        self._near_ratio = NEAR_SHAPE_RATIO
        self._gemv = None
        if isinstance(gemv, GemvConfig):
            self._gemv = GemvKernel(dev, gemv, local_size)
        elif gemv is not False:
            self._gemv = _first_that_fits(([tuned["gemv"]] if "gemv" in tuned else []) + fallback_gemv, "matmul gemv",
                                          lambda g: GemvKernel(dev, g, local_size))

    def config(self, trans_a: bool = False, trans_b: bool = False) -> GemmConfig:
        """The matrix-matrix configuration used for this transpose variant."""
        return self._variants[(bool(trans_a), bool(trans_b))].cfg

    @property
    def gemv_config(self) -> GemvConfig | None:
        """The GEMV configuration (None when the GEMV path is off)."""
        return self._gemv.cfg if self._gemv is not None else None

    def _route(self, M: int, N: int, K: int, trans_a: bool, trans_b: bool) -> tuple[GemmKernel | GemvKernel, int]:
        """The kernel of a product and how it splits K (``parts`` of :meth:`GemmKernel.splits`): the per-shape
        choice (:meth:`use_shape_configs`), else :meth:`_kernel`'s and the rule (0)."""
        if self._shapes:
            key = (bool(trans_a), bool(trans_b), M, N, K)
            entry = self._shapes.get(key)
            if entry is None:
                if key not in self._near:
                    self._near[key] = self._nearest_shape(key)
                entry = self._near[key]
            if entry is not None:
                return entry
        return self._kernel(M, N, trans_a, trans_b), 0

    @property
    def near_shape_ratio(self) -> float:
        """How far (a factor in one size) a product may be from a measured shape to take its choice
        (:meth:`_nearest_shape`; default :data:`NEAR_SHAPE_RATIO`; 1.0: measured shapes only)."""
        return self._near_ratio

    @near_shape_ratio.setter
    def near_shape_ratio(self, ratio: float) -> None:
        self._near_ratio, self._near = float(ratio), {}  # earlier answers were the old ratio's

    def _nearest_shape(self, key: tuple[bool, bool, int, int, int]) -> tuple[GemmKernel, int] | None:
        """The per-shape choice of the measured product of the same variant nearest to ``key`` =
        ``(trans_a, trans_b, M, N, K)``: one that differs in one size only, by at most a factor of
        :attr:`near_shape_ratio` (the closest ratio wins, then the larger size); None when there is none.

        A trainer sizes its model, and so the measured shapes, for its longest batch; a batch padded to a
        shorter length multiplies the same weights over fewer rows (M of the forward and input-gradient
        products, K of the weight gradients) and takes the tiling measured for the full batch."""
        ta, tb, M, N, K = key
        if (tb and not ta and M <= GEMV_MAX_M) or narrow_kind(M, N) is not None:  # never measured per shape
            return None
        best, best_rank = None, None
        for known, entry in self._shapes.items():
            if known[:2] != key[:2]:
                continue
            differ = [(a, b) for a, b in zip(known[2:], key[2:]) if a != b]
            if len(differ) != 1:
                continue
            size, want = differ[0]
            ratio = max(size, want) / min(size, want)
            rank = (ratio, -size)
            if ratio <= self.near_shape_ratio and (best_rank is None or rank < best_rank):
                best, best_rank = entry, rank
        return best

    def _kernel(self, M: int, N: int, trans_a: bool, trans_b: bool) -> GemmKernel | GemvKernel:
        if trans_b and not trans_a and M <= GEMV_MAX_M and self._gemv is not None:
            return self._gemv
        v = (bool(trans_a), bool(trans_b))
        kernel = self._variants[v]
        cfg = kernel.cfg
        if isinstance(cfg, PackedConfig) and N <= (cfg.nb - 1) * cfg.vw:
            return self._narrow(v, kernel, -(-N // cfg.vw))
        kind = narrow_kind(M, N) if self._narrow_configs else None
        if kind in self._narrow_configs:
            return self._narrow_tiled(v, kernel, kind)
        return kernel

    def _narrow_tiled(self, v: tuple[bool, bool], kernel: GemmKernel, kind: str) -> GemmKernel:
        """Variant ``v`` of the narrow tiled configuration ``kind`` (built once); ``kernel`` if it does not fit."""
        key = (*v, kind)
        if key not in self._narrow_kernels:
            try:
                self._narrow_kernels[key] = GemmKernel(self.dev, self._narrow_configs[kind], *v,
                                                       max_items=self._local_size, scratch=self._scratch)
            except KernelLimitError as e:
                log.warning("matmul %s %s: %s; using %s", v, kind, e, kernel.cfg)
                self._narrow_kernels[key] = kernel
        return self._narrow_kernels[key]

    def narrow_config(self, kind: str) -> TiledConfig | None:
        """The narrow tiled configuration ``kind`` (:data:`NARROW_KINDS`) this launcher uses, or None."""
        return self._narrow_configs.get(kind)

    def _narrow(self, v: tuple[bool, bool], kernel: GemmKernel, nb: int) -> GemmKernel:
        """The packed configuration of variant ``v`` with B panels of ``nb`` vectors, for products whose N
        fills fewer than the configuration's (LoRA's rank-wide products: a 64-column panel for N = 16
        computes 4x the products, measured 2.4x slower on PoCL), built once; ``kernel`` if it does not fit."""
        key = (*v, nb)
        if key not in self._narrow_kernels:
            try:
                self._narrow_kernels[key] = GemmKernel(self.dev, replace(kernel.cfg, nb=nb), *v,
                                                       max_items=self._local_size, scratch=self._scratch)
            except KernelLimitError as e:
                log.warning("matmul %s nb=%d: %s; using %s", v, nb, e, kernel.cfg)
                self._narrow_kernels[key] = kernel
        return self._narrow_kernels[key]

    def use_shape_configs(self, chosen: dict[tuple[int, int, int, bool, bool], tuple[TiledConfig, int]]) -> None:
        """Products of these ``(M, N, K, trans_a, trans_b)`` take the given ``(configuration, parts)``
        (``core.kernels.matmul_autotune.shape_configs``: the fastest measured for each shape of a model's step;
        ``parts`` as in :meth:`GemmKernel.splits`: 0 the rule, 1 never split K, n at most n parts) instead of
        their transpose variant's; so does a product of the same
        variant that differs from one of them in one size by at most :attr:`near_shape_ratio` (the nearest;
        neither GEMV nor narrow). A configuration whose compiled kernel does not fit is logged and left out.
        Replaces any earlier table."""
        self._shapes, self._near = {}, {}
        built: dict[tuple, GemmKernel | None] = {}
        for (M, N, K, ta, tb), (cfg, parts) in chosen.items():
            v = (bool(ta), bool(tb))
            if (cfg, v) not in built:
                own = self._variants[v]
                try:
                    built[(cfg, v)] = own if own.cfg == cfg else GemmKernel(
                        self.dev, cfg, *v, max_items=self._local_size, scratch=self._scratch)
                except (KernelLimitError, KernelBuildError, ValueError) as e:
                    log.warning("matmul %s for %dx%dx%d: %s; using %s", v, M, N, K, str(e).splitlines()[0], own.cfg)
                    built[(cfg, v)] = None
            if built[(cfg, v)] is not None:
                self._shapes[(*v, int(M), int(N), int(K))] = (built[(cfg, v)], int(parts))

    def shape_config(self, M: int, N: int, K: int, trans_a: bool = False,
                     trans_b: bool = False) -> tuple[GemmConfig, int] | None:
        """The ``(configuration, parts)`` this product takes from :meth:`use_shape_configs` (its own, or the nearest
        measured shape's), or None (its transpose variant's configuration)."""
        if not self._shapes:
            return None
        kernel, parts = self._route(M, N, K, trans_a, trans_b)
        key = (bool(trans_a), bool(trans_b), M, N, K)
        return (kernel.cfg, parts) if self._shapes.get(key) or self._near.get(key) else None

    def reserve(self, shapes: Iterable[tuple[int, int, int, bool, bool]]) -> int:
        """Allocate now the scratch that products of these ``(M, N, K, trans_a, trans_b)`` shapes need
        (a model's step: ``core.model.step_matmuls``), so that they allocate nothing while they run.

        Returns:
            The bytes of scratch held afterwards.
        """
        need: dict[str, int] = {}
        for M, N, K, trans_a, trans_b in shapes:
            kernel, parts = self._route(M, N, K, trans_a, trans_b)
            if M > 0 and N > 0 and isinstance(kernel, GemmKernel):
                for name, n in kernel.scratch_floats(M, N, K, parts).items():
                    need[name] = max(need.get(name, 0), n)
        for name, n in need.items():
            self._scratch.get(name, n)
        return self._scratch.held_bytes()

    def __call__(self, c: cl.Buffer, a: cl.Buffer, b: cl.Buffer, M: int, N: int, K: int,
                 trans_a: bool = False, trans_b: bool = False, accumulate: bool = False, a_offset: int = 0,
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
        kernel, parts = self._route(M, N, K, trans_a, trans_b)
        if parts == 0:  # also GEMV, which takes no parts
            kernel(c, a, b, M, N, K, accumulate, a_offset, b_offset, c_offset)
        else:  # a GemmKernel of a per-shape choice
            kernel(c, a, b, M, N, K, accumulate, a_offset, b_offset, c_offset, parts=parts)
