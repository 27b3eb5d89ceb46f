"""Launcher for ``qmatmul.cl``: matmuls with a frozen weight kept in its GGUF block bytes.

A frozen matrix W (n_out, n_in) of a GGUF file stays on the device exactly as the file stores it
(:func:`upload_weight`: the tensor's bytes, no float copy). :class:`QMatmul` then computes the
forward ``y = x @ W.T`` and the input gradient ``dx = dy @ W`` (a frozen matrix needs no weight
gradient), dequantizing inside the kernels; every format of :data:`FORMATS`. Three kernel families:

* :class:`QTiledConfig` — ``qmatmul_tiled``, local-memory tiles (GPUs);
* a :class:`core.kernels.matmul.PackedConfig` — ``qmatmul_pack_b`` dequantizes one K chunk of
  op(W) into the panels that ``matmul.cl``'s ``matmul_packed`` micro-kernel reads (CPUs): the
  float matmul's own kernels do the rest, and only one chunk of floats is held, in shared scratch;
* :class:`QGemvConfig` — ``qmatmul_gemv``, the forward for M <= ``GEMV_MAX_M`` rows (decode).

:func:`frozen_matrix_bytes` gives the device bytes of a file's matrices in their formats and as float32.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from core.device import Device
from core.kernels.matmul import (GEMV_MAX_M, GemmKernel, PackedConfig, TileGrid, _Scratch, default_configs,
                                 uses_local_tiles)

if TYPE_CHECKING:
    import pyopencl as cl

log = logging.getLogger(__name__)

Q = GGMLQuantizationType
FORMATS = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q6_K, Q.F16, Q.BF16, Q.F32)
"""The GGML types the kernels read (``-DQTYPE_<name>``)."""
QCH = 32  # elements of qmatmul.cl's dequantization chunks
PACK_KC = 256  # K rows of op(W) dequantized per packing round on CPUs (Goto's kc; bounds the scratch)


def _check_format(qtype: GGMLQuantizationType) -> None:
    if qtype not in FORMATS:
        raise ValueError(f"qmatmul: GGML type {Q(qtype).name} is not read on the device "
                         f"(readable: {', '.join(f.name for f in FORMATS)})")


def weight_nbytes(qtype: GGMLQuantizationType, shape: tuple[int, int]) -> int:
    """Bytes of a (n_out, n_in) matrix in GGML type ``qtype`` (as in a GGUF file).

    Raises:
        ValueError: n_in is not a multiple of the type's block size.
    """
    block, size = GGML_QUANT_SIZES[qtype]
    n_out, n_in = shape
    if n_in % block:
        raise ValueError(f"qmatmul: n_in = {n_in} is not a multiple of {Q(qtype).name}'s block of {block}")
    return n_out * (n_in // block) * size


@dataclass(frozen=True)
class QuantWeight:
    """W (n_out, n_in) on the device in its GGUF bytes.

    Attributes:
        buf: the device buffer: exactly the tensor's bytes (then up to 3 zero bytes to a multiple of 4).
        qtype: the GGML type.
        n_out, n_in: the shape in numpy order (GGUF's ne = [n_in, n_out]).
        nbytes: bytes of the tensor data (:func:`weight_nbytes`).
    """

    buf: cl.Buffer
    qtype: GGMLQuantizationType
    n_out: int
    n_in: int
    nbytes: int


def upload_weight(dev: Device, data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> QuantWeight:
    """Copy a GGUF tensor's bytes (e.g. ``GGUFReader`` tensor ``.data``, or ``gguf.quants.quantize``'s
    result) into a new read-only device buffer, unchanged.

    Args:
        dev: the device.
        data: the tensor data, any dtype (its bytes are used as they are).
        qtype: its GGML type; shape: (n_out, n_in).

    Raises:
        ValueError: a type the kernels do not read, or the bytes do not match type and shape.
    """
    _check_format(qtype)
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    need = weight_nbytes(qtype, shape)
    if raw.nbytes != need:
        raise ValueError(f"qmatmul: {Q(qtype).name} {shape} takes {need} bytes, the data has {raw.nbytes}")
    padded = np.zeros(-(-need // 4) * 4, np.uint8)
    padded[:need] = raw
    flags = dev.cl.mem_flags
    buf = dev.cl.Buffer(dev.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=padded)
    dev.allocated_bytes += padded.nbytes
    return QuantWeight(buf, Q(qtype), int(shape[0]), int(shape[1]), need)


WIDENS_TO_Q8_0 = (Q.Q4_0, Q.Q5_0)
"""Types whose blocks are Q8_0's exactly: d * (q - 8) / d * (q - 16) with the same half d and 32 elements,
the integers within int8 (:func:`widen_to_q8_0`)."""


def widen_to_q8_0(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """The Q8_0 bytes of a Q4_0 or Q5_0 tensor, losslessly: each block keeps its half d, and its element t
    (4 or 5 bits q, ggml's ``dequantize_row_q4_0`` / ``_q5_0`` layout) becomes the int8 ``q - 8`` / ``q - 16``,
    so every element dequantizes to the same float. Used where one fused matrix's members differ in type.

    Args:
        data: the tensor's GGUF bytes (any dtype, its bytes used), a whole number of blocks.
        qtype: Q4_0 or Q5_0.

    Returns:
        uint8 array of 34 bytes per block.

    Raises:
        ValueError: another type, or bytes that are not a whole number of its blocks.
    """
    size = GGML_QUANT_SIZES[Q(qtype)][1] if Q(qtype) in WIDENS_TO_Q8_0 else None
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if size is None or raw.size % size:
        raise ValueError(f"qmatmul: cannot widen {Q(qtype).name} ({raw.size} bytes) to Q8_0")
    blocks = raw.reshape(-1, size)
    qs = blocks[:, size - 16:]
    q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int16)  # elements 0-15, 16-31
    if qtype == Q.Q5_0:
        qh = blocks[:, 2:6].copy().view("<u4")  # (blocks, 1)
        q |= (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int16)
        q -= 16
    else:
        q -= 8
    out = np.empty((blocks.shape[0], GGML_QUANT_SIZES[Q.Q8_0][1]), np.uint8)
    out[:, :2] = blocks[:, :2]
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    return out.reshape(-1)


@dataclass(frozen=True)
class QTiledConfig(TileGrid):
    """``qmatmul_tiled``: a ``tsm`` x ``tsn`` tile of C per work-group, ``tsk``-deep local tiles,
    ``wptm`` x ``wptn`` outputs per work-item (work-group ``(tsn // wptn, tsm // wptm)``)."""

    tsm: int = 64
    tsn: int = 64
    tsk: int = 16
    wptm: int = 4
    wptn: int = 4

    def __post_init__(self) -> None:
        if min(self.tsm, self.tsn, self.tsk, self.wptm, self.wptn) < 1 or self.tsm % self.wptm or self.tsn % self.wptn:
            raise ValueError(f"QTiledConfig: sizes >= 1, tsm/tsn multiples of wptm/wptn: {self}")

    @property
    def local_mem_bytes(self) -> int:
        """Local memory of the two tiles."""
        return 4 * self.tsk * (self.tsm + self.tsn)

    def options(self) -> tuple[str, ...]:
        """Build options of this configuration."""
        return self.tile_options()


@dataclass(frozen=True)
class QGemvConfig:
    """``qmatmul_gemv``: ``rows`` outputs per work-group of ``wg`` work-items (a power of two)."""

    wg: int = 64
    rows: int = 1

    def __post_init__(self) -> None:
        if self.wg < 1 or self.wg & (self.wg - 1) or self.rows < 1:
            raise ValueError(f"QGemvConfig: wg a power of two, rows >= 1: {self}")

    @property
    def items(self) -> int:
        """Work-items per work-group."""
        return self.wg

    @property
    def local_mem_bytes(self) -> int:
        """Local memory of the reduction for GEMV_MAX_M rows."""
        return 4 * GEMV_MAX_M * self.rows * self.wg if self.wg > 1 else 0


TILED_CANDIDATES = (QTiledConfig(64, 64, 32, 4, 4), QTiledConfig(64, 64, 16, 4, 4), QTiledConfig(32, 32, 16, 4, 4),
                    QTiledConfig(16, 16, 16, 2, 2), QTiledConfig(8, 8, 8, 2, 2), QTiledConfig(4, 4, 4, 1, 1),
                    QTiledConfig(1, 1, 1, 1, 1))
"""Tile configurations tried in order (the first that fits the device and the built kernel wins); a K tile
of 32 dequantizes the forward's weight tiles by whole chunks."""
GEMV_CANDIDATES = (QGemvConfig(64, 1), QGemvConfig(32, 1), QGemvConfig(1, 1))


def cpu_gemv_rows(qtype: GGMLQuantizationType, M: int) -> int:
    """Rows of W per work-item of the CPU GEMV (one work-item per group): 1 for M > 2 (M x rows vector
    accumulators in registers); else 2 for the formats whose blocks hold one half scale (Q8_0, Q4_0) and 4
    for the others (their d and m fill the eight lanes of one scale decode). Measured on a 2-core AMD EPYC
    (Zen 1, AVX2), the GEMV alone at SmolLM2-135M's shapes, the variants alternating: Q4_1 with four rows
    7-12 % faster than with two, the Q8_0 head (49152 x 576) with two 12-15 % faster than with four; the
    chat decode (SmolLM2 Q4_1) 39.4 tok/s against 39.2 with two rows for all and 37.1 with four. Q5_0 (one
    half, but its fifth bits to unpack) measured like the others: 3072 x 576 0.31 ms with four, 0.36 with two."""
    if M > 2:
        return 1
    return 2 if Q(qtype) in (Q.Q8_0, Q.Q4_0) else 4


def _fits(dev: Device, cfg: QTiledConfig | QGemvConfig, max_items: int | None) -> bool:
    limit = min(dev.max_work_group_size, max_items or dev.max_work_group_size)
    return cfg.items <= limit and cfg.local_mem_bytes <= dev.local_mem_size


def _kernel_allows(dev: Device, knl) -> int:
    """CL_KERNEL_WORK_GROUP_SIZE of a built kernel on ``dev`` (registers can make it < the device's)."""
    return int(knl.get_work_group_info(dev.cl.kernel_work_group_info.WORK_GROUP_SIZE, dev.cl_device))


class QMatmul:
    """Matmuls with frozen GGUF-format weights (:class:`QuantWeight`); kernels built lazily per format.

    ``forward(y, x, w, M)``: y (M, n_out) = x (M, n_in) @ W.T; ``input_grad(dx, dy, w, M)``: dx (M, n_in)
    = dy (M, n_out) @ W; ``+=`` when ``accumulate``. All float32, row-major, offsets in elements.

    Args:
        dev: the device.
        family: "tiled" (local-memory tiles) or "packed" (dequantized panels + ``matmul_packed``);
            default: tiled where local memory is on-chip and the device is no CPU
            (:func:`core.kernels.matmul.uses_local_tiles`), else packed. Tests run both anywhere.
        tiled: the tile configuration; default the first of :data:`TILED_CANDIDATES` that fits the
            device, ``local_size`` and the built kernel's CL_KERNEL_WORK_GROUP_SIZE.
        packed: the packed configuration; default the float matmul's CPU default, K chunks of
            :data:`PACK_KC`.
        gemv: the forward's configuration for M <= ``GEMV_MAX_M``; False: no GEMV path (the GEMM
            family serves every M); default by the device kind and limits.
        local_size: largest work-group to use (default the device's maximum).
        scratch: the packed family's scratch pool to share (e.g. a ``Matmul``'s); default its own.

    Raises:
        ValueError: a given configuration does not fit the device, ``local_size`` or the kernel.
        KernelBuildError: a kernel failed to build (on first use of a format).
    """

    def __init__(self, dev: Device, family: str | None = None, tiled: QTiledConfig | None = None,
                 packed: PackedConfig | None = None, gemv: QGemvConfig | bool | None = None,
                 local_size: int | None = None, scratch: _Scratch | None = None):
        if family not in (None, "tiled", "packed"):
            raise ValueError(f"QMatmul: family must be 'tiled' or 'packed', not {family!r}")
        self.dev, self._max_items = dev, local_size
        self.family = family or ("tiled" if uses_local_tiles(dev) else "packed")
        self._tiled = tiled
        if packed is None:
            cpu = default_configs(dev, local_size)[0]
            packed = cpu if isinstance(cpu, PackedConfig) else PackedConfig(mr=6, nb=2, vw=4, wg=1, super_rows=16)
        self._packed = packed if packed.kc else replace(packed, kc=PACK_KC)
        self._gemv_cfg = gemv
        self._scratch = scratch or _Scratch(dev)
        self._kernels: dict[tuple, object] = {}

    def forward(self, y: cl.Buffer, x: cl.Buffer, w: QuantWeight, M: int, accumulate: bool = False,
                x_offset: int = 0, y_offset: int = 0) -> None:
        """y[y_offset:] (M, n_out) = (or +=) x[x_offset:] (M, n_in) @ W.T; nothing when M <= 0."""
        if M <= 0:
            return
        if M <= GEMV_MAX_M and self._gemv_cfg is not False:
            knl, cfg = self._gemv(w.qtype, M)
            i32 = np.int32
            self.dev.launch(knl, (-(-w.n_out // cfg.rows) * cfg.wg,), (cfg.wg,), y, x, w.buf, i32(M),
                            i32(w.n_out), i32(w.n_in), i32(bool(accumulate)), i32(x_offset), i32(y_offset))
            return
        self._gemm(w.qtype, True)(y, x, w.buf, M, w.n_out, w.n_in, accumulate, x_offset, y_offset)

    def input_grad(self, dx: cl.Buffer, dy: cl.Buffer, w: QuantWeight, M: int, accumulate: bool = False,
                   dy_offset: int = 0, dx_offset: int = 0) -> None:
        """dx[dx_offset:] (M, n_in) = (or +=) dy[dy_offset:] (M, n_out) @ W; nothing when M <= 0."""
        if M <= 0:
            return
        self._gemm(w.qtype, False)(dx, dy, w.buf, M, w.n_in, w.n_out, accumulate, dy_offset, dx_offset)

    def prepare(self, qtype: GGMLQuantizationType, M: int | None = None) -> None:
        """Build now the kernels that ``forward`` and ``input_grad`` of this format use for M rows (both
        GEMM directions; with M <= ``GEMV_MAX_M`` also the GEMV), so that a run fails before it starts.

        Raises:
            ValueError: the format is not read, or a given configuration does not fit (the reason).
            KernelBuildError: a kernel failed to build.
        """
        self._gemm(qtype, True)
        self._gemm(qtype, False)
        if M is not None and 0 < M <= GEMV_MAX_M and self._gemv_cfg is not False:
            self._gemv(qtype, M)

    def scratch_bytes(self) -> int:
        """Bytes of scratch the packed family holds now (one K chunk of dequantized panels, shared)."""
        return self._scratch.held_bytes()

    def config(self, qtype: GGMLQuantizationType, forward: bool = True) -> QTiledConfig | PackedConfig:
        """The GEMM configuration used for this format and direction (builds it)."""
        return self._gemm(qtype, forward).cfg

    # -- kernels ----------------------------------------------------------------------------
    def _gemm(self, qtype: GGMLQuantizationType, fwd: bool):
        key = ("gemm", qtype, fwd)
        if key not in self._kernels:
            _check_format(qtype)
            make = _TiledKernel if self.family == "tiled" else _packed_kernel
            self._kernels[key] = make(self, qtype, fwd)
        return self._kernels[key]

    def _gemv(self, qtype: GGMLQuantizationType, M: int):
        key = ("gemv", qtype, M)
        if key not in self._kernels:
            _check_format(qtype)
            given = self._gemv_cfg if isinstance(self._gemv_cfg, QGemvConfig) else None
            cpu = not uses_local_tiles(self.dev)
            # CPUs: one work-item per few outputs (float16 accumulators: M x rows of them in registers)
            cands = (given,) if given else ((QGemvConfig(1, cpu_gemv_rows(qtype, M)),) if cpu else ()) + GEMV_CANDIDATES
            self._kernels[key] = self._first_fitting(cands, given is not None, lambda c: self.dev.kernel(
                "qmatmul", "qmatmul_gemv", (f"-DQTYPE_{Q(qtype).name}", f"-DGEMV_M={M}", f"-DGEMV_WG={c.wg}",
                                            f"-DGEMV_ROWS={c.rows}")))
        return self._kernels[key]

    def _first_fitting(self, cands, forced: bool, build):
        """(kernel, config) of the first candidate fitting the device, ``local_size`` and the built kernel."""
        for cfg in cands:
            if not _fits(self.dev, cfg, self._max_items):
                if forced:
                    raise ValueError(f"{cfg} does not fit {self.dev.info.name} (work-group or local memory)")
                continue
            knl = build(cfg)
            allowed = _kernel_allows(self.dev, knl)
            if allowed >= cfg.items:
                return knl, cfg
            if forced:
                raise ValueError(f"{cfg} needs {cfg.items} work-items; the kernel allows {allowed}")
            log.debug("qmatmul: %s needs %d work-items, the kernel allows %d", cfg, cfg.items, allowed)
        raise ValueError(f"qmatmul: no configuration fits {self.dev.info.name}")


class _TiledKernel:
    """``qmatmul_tiled`` for one format and direction, called like a ``GemmKernel``."""

    def __init__(self, op: QMatmul, qtype: GGMLQuantizationType, fwd: bool):
        self.dev = op.dev
        cands = (op._tiled,) if op._tiled else TILED_CANDIDATES
        opts = (f"-DQTYPE_{Q(qtype).name}", *(("-DFWD",) if fwd else ()))
        self.knl, self.cfg = op._first_fitting(cands, op._tiled is not None, lambda c: op.dev.kernel(
            "qmatmul", "qmatmul_tiled", (*opts, *c.options())))

    def __call__(self, c, a, w, M: int, N: int, K: int, accumulate: bool, a_offset: int, c_offset: int) -> None:
        cfg, i32 = self.cfg, np.int32
        lx, ly = cfg.local
        grid = (-(-N // cfg.tsn) * lx, -(-M // cfg.tsm) * ly)
        self.dev.launch(self.knl, grid, (lx, ly), c, a, w, i32(M), i32(N), i32(K), i32(bool(accumulate)),
                        i32(a_offset), i32(c_offset))


def _packed_kernel(op: QMatmul, qtype: GGMLQuantizationType, fwd: bool):
    """A ``GemmKernel`` of the packed configuration whose B packing dequantizes: ``qmatmul_pack_b``
    takes ``matmul_pack_b``'s place (same arguments, same panels); ``matmul_packed`` (and
    ``matmul_pack_a``) run as for floats."""
    gk = GemmKernel(op.dev, op._packed, trans_a=False, trans_b=fwd, max_items=op._max_items, scratch=op._scratch)
    knl = op.dev.kernel("qmatmul", "qmatmul_pack_b", (*op._packed.options(False, fwd), f"-DQTYPE_{Q(qtype).name}"))

    def pack_b(queue, grid, local, *args) -> None:  # called as matmul_pack_b: grid (kc, panels)
        if fwd:  # a work-item per 32 rows of op(W) (one chunk of each row of W); a whole number of
            # work-groups (NVIDIA's OpenCL has no non-uniform work-groups), items past kc return at once
            lb = local[0] if local else 1
            items = -(-grid[0] // QCH)
            grid = (-(-items // lb) * lb, grid[1])
        op.dev.launch(knl, grid, local, *args)

    gk._pack_b = pack_b

    def call(c, a, w, M: int, N: int, K: int, accumulate: bool, a_offset: int, c_offset: int) -> None:
        gk(c, a, w, M, N, K, accumulate, a_offset, 0, c_offset)

    call.cfg = gk.cfg
    return call


# ----------------------------------------------------------------------------- memory figures

def file_matrices(path: str) -> list[tuple[str, GGMLQuantizationType, tuple[int, ...]]]:
    """(name, GGML type, shape in numpy order) of every tensor of a GGUF file, in file order."""
    from gguf import GGUFReader

    return [(t.name, Q(t.tensor_type), tuple(int(n) for n in reversed(t.shape))) for t in GGUFReader(path).tensors]


def frozen_matrix_bytes(tensors: Iterable[tuple[str, GGMLQuantizationType, tuple[int, ...]]]) -> tuple[int, int]:
    """Device bytes of a model's frozen matrices kept in their GGUF formats, and the same as float32.

    Args:
        tensors: (name, GGML type, numpy shape) of the model's tensors (:func:`file_matrices`); the
            2-D ones are the matrices (1-D norms are not counted: they stay float32 either way).

    Returns:
        (bytes in their formats: :func:`weight_nbytes` rounded up to 4 bytes as :func:`upload_weight`
        holds them, bytes as float32: 4 per element).
    """
    quant = f32 = 0
    for _name, qtype, shape in tensors:
        if len(shape) != 2:
            continue
        quant += -(-weight_nbytes(qtype, (shape[0], shape[1])) // 4) * 4
        f32 += 4 * shape[0] * shape[1]
    return quant, f32
