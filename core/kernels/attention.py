"""Launcher for ``attention.cl``: causal multi-head attention with grouped-query attention,
flash-style (online softmax forward, backward recomputing the probabilities from the saved
log-sum-exp), so no (seq x seq) buffer exists (the stored dS below is bounded by a multiple of Q's size) and any
context length runs.

Tile sizes are compile-time (``-D`` build options), chosen here from the device's limits, and
``head_dim`` is compiled in too (one program per head_dim, built on first use):

* CPUs (PoCL): one work-item per work-group, 4 query rows (16 keys, the lanes of a vector, in dK/dV)
  per work-item, keys in chunks of 8, float8 vectors when ``head_dim >= 16`` and the device prefers
  8-wide floats (AVX2); where it prefers 16-wide floats (AVX-512), 8 query rows and the forward's and dQ's
  chunks of 16 keys as the lanes of a float16 too, over K and V transposed once per layer into the caller's
  scratch (``scratch``; ``AttentionTiles.lanes``);
  no local memory and no barriers, so the accumulators stay in registers (see the header of
  ``attention.cl``). Decode (fewer query rows than a work-item holds) uses one row per item.
* GPUs (on-chip local memory): 64 work-items per work-group, one query row per work-item, chunks
  of 16 keys and values staged in local memory in the forward; the backward's staged kernels
  (``*_tiled``): work-groups of 128 work-items over blocks of 32 keys x 32 query rows in local
  memory (smaller blocks where local memory is short), the P and dS tile computed once per block
  (measured on an H200: several times faster than one key or query row per work-item), each work-item
  holding register micro-tiles of it and of dK/dV (dQ) (2.3-2.4x the staged kernels before them). A staged
  forward (``attention_forward_tiled``: blocks of 64 query rows x 32 keys, ``AttentionTiles.fwd_rows``) runs
  where ``core.kernels.attention_autotune`` measured it faster at the model's shape, and a blocked backward
  (``attention_backward_*_blocked``: 32 x 32 blocks with the forward's micro-tiles) likewise (:meth:`Attention.use_tiling`).
  Under grouped-query attention the dK/dV kernel runs one work-group per key block and kv head, each walking all
  query heads of its group; the split backward (``AttentionTiles.bwd_split``, measured likewise) runs one per
  query head into the caller's scratch and adds the group's partials (``attention_backward_kv_sum``): n_heads /
  n_kv_heads times the work-groups, each with that much shorter a loop. The staged backward can also store the dS
  tiles its dK/dV kernel computes (``AttentionTiles.bwd_store``, a build of its own, measured likewise) so that dQ
  is ``scale dS K`` from them (``attention_backward_dq_stored``) instead of recomputing S and dP; only where the
  store is at most :data:`DS_STORE_MAX` floats per element of Q (:meth:`Attention.store_floats`: no O(T^2)
  buffer beyond that bound).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from core.device import Device, KernelBuildError, KernelLimitError
from core.kernels._launch import simd_width

if TYPE_CHECKING:
    import pyopencl as cl

log = logging.getLogger(__name__)

_POW2 = (1, 2, 4, 8, 16)
_FWD_BLOCKS = (4, 8, 16, 32, 64, 128)
TUNED_FIELDS = ("fwd_rows", "fwd_keys", "fwd_items", "bwd_rows", "bwd_keys", "bwd_items",
                "bwd_split", "bwd_store")  # Attention.use_tiling
# the staged forward's (query rows, keys) per block, largest first (64 x 32 needs 44.8 KB at head_dim 64); GPUs use it
# where core.kernels.attention_autotune measured it faster than the per-row forward (Attention.use_tiling)
FWD_TILES = ((64, 32), (32, 32), (32, 16), (16, 16), (16, 8), (8, 8), (4, 4))
# the blocked backward's (query rows, keys, work-items) timed on GPUs: 32 x 32 blocks need 44.3 KB at head_dim 64
BWD_BLOCKS = ((32, 32, 64), (32, 32, 128), (16, 32, 32))
STAGED_TILE_MAX = 32  # the staged backward's largest blocks (default_tiles); the Model's scratch is sized for them
DS_STORE_MAX = 6  # the stored dS (bwd_store) runs where it takes at most this many floats per element of Q
TILED_MIN_ROWS = 2  # the staged forward runs for this many query rows or more (decode's one row: attention_forward)
LANES_MAX = 16  # keys of the transposed K and V are padded to a multiple of this (AttentionTiles.lanes <= it)


@dataclass(frozen=True)
class AttentionTiles:
    """Compile-time tiling of the attention kernels.

    Attributes:
        items: work-items per work-group.
        rows: query rows per work-item (forward and dQ).
        keys: keys per chunk of the online softmax (forward and dQ); 1, 2, 4, 8 or 16.
        kv_rows: keys per work-item in the dK/dV kernel; 1, 2, 4, 8 or 16.
        vector: vector width of the row arithmetic, 4 or 8.
        stage_kv: the forward stages each chunk of keys and values in local memory (GPUs).
        bwd_tile: 0 = the backward's per-work-item kernels (CPUs); else the staged backward
            (``attention_backward_*_tiled``, GPUs): blocks of ``bwd_tile`` keys and query rows in
            local memory, work-groups of ``bwd_items`` work-items.
        bwd_items: work-items per work-group of the staged backward (0 = ``items``).
        lanes: 0, or the keys of a chunk as the lanes of one vector (8 or 16) in the forward and dQ, over
            K and V transposed once per layer (``attention_forward_lanes``, ``attention_backward_dq_lanes``;
            CPUs with 16-float SIMD): used where the caller gives the scratch for them (:meth:`Attention.forward`).
        fwd_rows, fwd_keys: 0, or (with ``bwd_tile``) the staged forward (``attention_forward_tiled``, GPUs) for
            ``seq_q >= TILED_MIN_ROWS``: work-groups of ``fwd_items`` work-items (0: ``bwd_items``) over blocks of
            ``fwd_rows`` query rows, walking their keys in blocks of ``fwd_keys``; both powers of two >= 4.
        bwd_rows, bwd_keys: 0, or (with ``bwd_tile``) the blocked backward (``attention_backward_*_blocked``,
            GPUs) in place of the staged one: blocks of ``bwd_rows`` query rows x ``bwd_keys`` keys, work-groups of
            ``bwd_items``; both powers of two >= 4.
        bwd_split: 0, or 1 (with ``bwd_tile``): under grouped-query attention the staged or blocked dK/dV kernel
            runs one work-group per query head, not per kv head, into the caller's scratch, and
            ``attention_backward_kv_sum`` adds each group's partials (:meth:`Attention.backward`). A launch
            choice: the same build.
        bwd_store: 0, or 1 (with ``bwd_tile``, and without ``bwd_rows`` or with blocks of ``bwd_tile`` x ``bwd_tile``:
            :attr:`stores_blocks`): the backward is built with ``-DDS_STORE``; its dK/dV kernel (staged or blocked)
            stores each dS tile into the caller's scratch and dQ is computed from them
            (``attention_backward_dq_stored``), where the scratch holds :meth:`Attention.store_floats`.
    """

    items: int
    rows: int
    keys: int
    kv_rows: int
    vector: int = 4
    stage_kv: bool = False
    bwd_tile: int = 0
    bwd_items: int = 0
    lanes: int = 0
    fwd_rows: int = 0
    fwd_keys: int = 0
    bwd_rows: int = 0
    bwd_keys: int = 0
    fwd_items: int = 0
    bwd_split: int = 0
    bwd_store: int = 0

    def __post_init__(self) -> None:
        if self.items < 1 or self.rows < 1:
            raise ValueError(f"items and rows must be >= 1: {self}")
        if self.keys not in _POW2 or self.kv_rows not in _POW2:
            raise ValueError(f"keys and kv_rows must be one of {_POW2}: {self}")
        if self.vector not in (4, 8):
            raise ValueError(f"vector must be 4 or 8: {self}")
        if self.bwd_tile < 0 or self.bwd_items < 0 or self.fwd_items < 0:
            raise ValueError(f"bwd_tile, bwd_items and fwd_items must be >= 0: {self}")
        if self.bwd_tile and self.bwd_tile & (self.bwd_tile - 1):
            raise ValueError(f"bwd_tile must be 0 or a power of two: {self}")
        if self.lanes not in (0, 8, 16):
            raise ValueError(f"lanes must be 0, 8 or 16: {self}")
        if (self.fwd_rows or self.fwd_keys) and not (
                self.bwd_tile and self.fwd_rows in _FWD_BLOCKS and self.fwd_keys in _FWD_BLOCKS):
            raise ValueError(f"fwd_rows and fwd_keys must both be 0, or both one of {_FWD_BLOCKS} with bwd_tile: {self}")
        if (self.bwd_rows or self.bwd_keys) and not (
                self.bwd_tile and self.bwd_rows in _FWD_BLOCKS and self.bwd_keys in _FWD_BLOCKS):
            raise ValueError(f"bwd_rows and bwd_keys must both be 0, or both one of {_FWD_BLOCKS} with bwd_tile: {self}")
        if self.bwd_split not in (0, 1) or (self.bwd_split and not self.bwd_tile):
            raise ValueError(f"bwd_split must be 0, or 1 with bwd_tile: {self}")
        if self.bwd_store not in (0, 1) or (self.bwd_store and not self.stores_blocks):
            raise ValueError(f"bwd_store must be 0, or 1 with bwd_tile and without bwd_rows or with bwd_rows = bwd_keys "
                             f"= bwd_tile: {self}")

    @property
    def stores_blocks(self) -> bool:
        """Whether the backward's dK/dV kernel can store its dS blocks for attention_backward_dq_stored (bwd_store):
        the staged one, or the blocked one with blocks of bwd_tile x bwd_tile."""
        return bool(self.bwd_tile) and (not self.bwd_rows or self.bwd_rows == self.bwd_keys == self.bwd_tile)

    @property
    def backward_items(self) -> int:
        """Work-items per work-group of the staged backward."""
        return self.bwd_items or self.items

    @property
    def forward_items(self) -> int:
        """Work-items per work-group of the staged forward."""
        return self.fwd_items or self.backward_items

    def local_mem_bytes(self, head_dim: int) -> int:
        """Local memory the largest kernel declares: the forward's staged key and value chunks; the staged
        forward's (fwd_rows + 2 fwd_keys, row) blocks (rows of head_dim padded to 4, plus 4), its score tile
        (rows of fwd_keys + 4) and three rows; or the staged backward's four (bwd_tile, row) blocks, two tiles
        (rows of bwd_tile + 4; + 1 below 4) and two rows."""
        padded = -(-head_dim // self.vector) * self.vector
        fwd = 2 * self.keys * padded * 4 if self.stage_kv else 0
        row = -(-head_dim // 4) * 4 + 4
        fq, fk = self.fwd_rows, self.fwd_keys
        tiled = 4 * ((fq + 2 * fk) * row + fq * (fk + 4) + 3 * fq)
        br, bc = self.bwd_rows, self.bwd_keys  # the blocked backward's dK/dV (two key-major tiles) and dQ kernels
        blocked = 4 * max((2 * br + 2 * bc) * row + 2 * bc * (br + 4) + 2 * br,
                          (2 * br + 2 * bc) * row + br * (bc + 4) + 2 * br) if br else 0
        t = self.bwd_tile
        return max(fwd, tiled, blocked, 4 * (4 * t * row + 2 * t * (t + (4 if t >= 4 else 1)) + 2 * t))

    def options(self, head_dim: int) -> tuple[str, ...]:
        """Build options for this tiling and ``head_dim``."""
        opts = [f"-DHD={head_dim}", f"-DVW={self.vector}", f"-DWG={self.items}", f"-DBQ={self.rows}",
                f"-DBK={self.keys}", f"-DBKV={self.kv_rows}"]
        if self.stage_kv:
            opts.append("-DSTAGE_KV")
        if self.bwd_tile:
            opts += [f"-DBT={self.bwd_tile}", f"-DBWG={self.backward_items}"]
        if self.lanes:
            opts.append(f"-DBKT={self.lanes}")
        if self.fwd_rows:
            opts += [f"-DFQ={self.fwd_rows}", f"-DFK={self.fwd_keys}", f"-DFWG={self.forward_items}"]
        if self.bwd_rows:
            opts += [f"-DBR={self.bwd_rows}", f"-DBC={self.bwd_keys}"]
        if self.bwd_store:
            opts.append("-DDS_STORE")
        return tuple(opts)


@dataclass(frozen=True)
class _Kernels:
    """One head_dim's tiling and built kernels; the keys-as-lanes ones only where the tiling has ``lanes``."""

    tiles: AttentionTiles
    forward: object
    dsum: object
    dkdv: object
    dq: object
    transpose_kv: object = None
    forward_lanes: object = None
    dq_lanes: object = None
    forward_tiled: object = None
    kv_sum: object = None
    dq_stored: object = None
    dsum_rows: object = None


def _is_cpu(dev: Device) -> bool:
    return bool(int(dev.cl_device.type) & dev.cl.device_type.CPU)


def default_tiles(dev: Device, head_dim: int, max_items: int | None = None) -> AttentionTiles:
    """The tiling for this device and head_dim (see the module docstring).

    On a GPU the work-group has ``min(64, max_items)`` work-items (``max_items`` defaults to the
    device's maximum work-group size), and the staged chunk shrinks until it fits local memory.
    """
    if _is_cpu(dev):
        # measured on PoCL (2-core Xeons, AVX2 and AVX-512): 4 rows x 8 keys per work-item, one
        # per group; float8 where the device's SIMD is at least that wide and rows are long enough
        # (float16 on AVX-512 measured no faster); dK/dV: 16 keys as the lanes of a float16 (8 on narrower
        # SIMD; measured on the AVX-512 Xeon: SmolLM2's shape 2.6 -> 1.4 ms a layer, d512's 10.8 -> 6.7)
        # With 16-float SIMD (AVX-512) the forward and dQ take a chunk's 16 keys as the lanes of a float16 over K
        # and V transposed (lanes), 8 rows per work-item: attention's device time in a training step on the
        # AVX-512 Xeon (PoCL profile, transposition included) 120.8 -> 94.9 ms at SmolLM2's shape (1 x 256; 9/3
        # heads), 72.9 -> 68.9 at d512 (16 x 128; 8/8 heads: twice the keys to transpose per query head).
        # Narrower SIMD (AVX2) keeps the kernels above: lanes there are unmeasured.
        width = simd_width(dev)
        wide = width >= 8
        if width >= 16:
            return AttentionTiles(1, 8, 8, 16, vector=8 if head_dim >= 16 else 4, lanes=16)
        return AttentionTiles(1, 4, 8, 16 if wide else 8, vector=8 if wide and head_dim >= 16 else 4)
    items = 1
    while items * 2 <= min(64, max_items or dev.max_work_group_size):
        items *= 2
    bwd_items = 1
    while bwd_items * 2 <= min(128, max_items or dev.max_work_group_size):
        bwd_items *= 2
    for keys in (16, 8, 4, 2, 1):
        t = AttentionTiles(items, 1, keys, 1, vector=4, stage_kv=True)
        if t.local_mem_bytes(head_dim) <= dev.local_mem_size:
            break
    else:
        t = AttentionTiles(items, 1, 16, 1, vector=4)  # head_dim too long to stage: read global
    for tile in (32, 16, 8, 4, 2, 1):  # the staged backward's blocks, as large as local memory holds
        staged = replace(t, bwd_tile=tile, bwd_items=bwd_items)
        if staged.local_mem_bytes(head_dim) <= dev.local_mem_size:
            return staged
    return t


def forward_blocks(dev: Device, tiles: AttentionTiles, head_dim: int) -> list[tuple[int, int]]:
    """The staged forward's blocks ``(fwd_rows, fwd_keys)`` of :data:`FWD_TILES` that fit ``dev``'s local memory
    with ``tiles`` (largest first); none where ``tiles`` has no staged backward (CPUs)."""
    if not tiles.bwd_tile:
        return []
    return [(r, k) for r, k in FWD_TILES
            if replace(tiles, fwd_rows=r, fwd_keys=k).local_mem_bytes(head_dim) <= dev.local_mem_size]


class Attention:
    """Causal softmax attention ``O = softmax(scale * Q K^T + mask) V`` and its backward.

    Vaswani et al. 2017 ("Attention Is All You Need", eq. 1); the online softmax and the backward
    from the saved log-sum-exp after Dao et al. 2022 ("FlashAttention") and Dao 2023
    ("FlashAttention-2"). ``scale = 1 / sqrt(head_dim)``. Query ``i`` (absolute position
    ``q_pos_start + i``) attends key ``j`` iff ``j <= q_pos_start + i``. Query head ``h`` uses kv
    head ``h // (n_heads // n_kv_heads)`` (grouped-query attention). Deterministic (no atomics);
    memory beyond the inputs and outputs is ``lse`` and ``d_sum``, one float per query row, and the caller's
    ``scratch`` (:meth:`scratch_floats`; none given: the kernels that need none): K and V transposed where the
    tiling has ``lanes``, the dK/dV partials where it has ``bwd_split`` and the dS tiles where it has ``bwd_store``.

    Args:
        dev: the device.
        local_size: largest work-group (work-items) to use; default the device's maximum.
        tiles: override the tiling for every head_dim (tests use this).
    """

    def __init__(self, dev: Device, local_size: int | None = None, tiles: AttentionTiles | None = None):
        self.dev = dev
        self._local_size = local_size
        self._forced = tiles
        self._built: dict[int, _Kernels] = {}
        self._decode: dict[int, tuple[AttentionTiles, object]] = {}
        self._choices: dict[int, dict[str, int]] = {}

    def use_tiling(self, head_dim: int, choice: dict[str, int]) -> None:
        """Run ``head_dim``'s attention with the staged forward's and the blocked backward's sizes in ``choice``
        (:data:`TUNED_FIELDS`; ``{}`` or zeros: the per-row forward and the staged backward), as
        ``core.kernels.attention_autotune.tiling`` measured; ignored with a forced tiling, on devices without
        the staged kernels (CPUs), and where the sizes do not fit or build (logged); ``*_items`` apply with their
        blocks only. Call it before the head_dim's first use (a built tiling is rebuilt).

        Raises:
            ValueError: ``choice`` is no dict, or a size in it is no whole number >= 0.
        """
        if not isinstance(choice, dict):
            raise ValueError(f"attention tiling choice: a dict of {TUNED_FIELDS} expected, not {choice!r}")
        for f in TUNED_FIELDS:
            if type(choice.get(f, 0)) is not int or choice.get(f, 0) < 0:
                raise ValueError(f"attention tiling choice: {f} must be a whole number >= 0, not {choice[f]!r}")
        choice = {f: choice.get(f, 0) for f in TUNED_FIELDS}
        if self._forced is None and choice != self._choices.get(head_dim, {f: 0 for f in TUNED_FIELDS}):
            self._choices[head_dim] = choice
            self._built.pop(head_dim, None)

    def tiles(self, head_dim: int) -> AttentionTiles:
        """The tiling used for ``head_dim`` (building its kernels on first use)."""
        return self._kernels(head_dim).tiles

    def _kernels(self, head_dim: int) -> _Kernels:
        built = self._built.get(head_dim)
        if built is not None:
            return built
        t = self._forced or default_tiles(self.dev, head_dim, self._local_size)
        plain = t
        if self._forced is None and head_dim in self._choices:
            t = self._chosen(t, head_dim, self._choices[head_dim])
        if t.local_mem_bytes(head_dim) > self.dev.local_mem_size:
            raise KernelLimitError(f"{t} needs {t.local_mem_bytes(head_dim)} bytes of local memory for "
                             f"head_dim {head_dim}; {self.dev.info.name} has {self.dev.local_mem_size}")
        while True:
            opts = t.options(head_dim)
            staged = ("_blocked" if t.bwd_rows else "_tiled") if t.bwd_tile else ""
            lanes = ("attention_transpose_kv", "attention_forward_lanes", "attention_backward_dq_lanes") if t.lanes else ()
            lanes += ("attention_backward_kv_sum",) if staged else ()
            lanes += ("attention_backward_dq_stored",) if t.bwd_store else ()
            try:
                knls = [self.dev.kernel("attention", n, opts) for n in
                        ("attention_forward", "attention_backward_dsum", "attention_backward_dkdv" + staged,
                         "attention_backward_dq" + staged) + lanes]
                fwd_tiled = self.dev.kernel("attention", "attention_forward_tiled", opts) if t.fwd_rows else None
                dsum_rows = self.dev.kernel("attention", "attention_backward_dsum_rows", opts) if staged else None
                # a kernel can allow fewer work-items than the device (registers): then use fewer
                allowed = min(self.dev.work_group_size(kn) for kn in (knls[:2] + knls[4:5] if staged else knls))
                allowed_bwd = min(self.dev.work_group_size(kn) for kn in knls[2:4] + knls[5:6] + [dsum_rows]) \
                    if staged else t.items
                allowed_fwd = self.dev.work_group_size(fwd_tiled) if fwd_tiled is not None else t.forward_items
            except (KernelLimitError, KernelBuildError) as e:
                dropped = t if self._forced is not None else self._without_failed(t, plain, head_dim, e)
                if dropped == t:  # nothing chosen failed (or the tiling is forced): the device cannot run it
                    raise
                t = dropped
                continue
            if allowed >= t.items and allowed_bwd >= t.backward_items and allowed_fwd >= t.forward_items:
                break
            if self._forced is not None:
                raise KernelLimitError(f"{t} needs {t.items} (backward {t.backward_items}, staged forward "
                                       f"{t.forward_items}) work-items per group; {self.dev.info.name} allows "
                                       f"{allowed} ({allowed_bwd}, {allowed_fwd}) for these kernels")
            t = replace(t, items=min(allowed, t.items),
                        bwd_items=min(allowed_bwd, t.backward_items) if staged else 0,
                        fwd_items=min(allowed_fwd, t.forward_items) if t.fwd_rows else 0)
        log.debug("attention head_dim=%d: %s", head_dim, t)
        extra = dict(zip(("transpose_kv", "forward_lanes", "dq_lanes") if t.lanes else ("kv_sum", "dq_stored"), knls[4:]))
        built = self._built[head_dim] = _Kernels(t, *knls[:4], forward_tiled=fwd_tiled, dsum_rows=dsum_rows, **extra)
        return built

    def _chosen(self, t: AttentionTiles, head_dim: int, choice: dict[str, int]) -> AttentionTiles:
        """``t`` with ``choice``'s staged forward and blocked backward, each left out where it is no tiling or does
        not fit the device's local memory and work-group limits (and ``local_size``)."""
        if not t.bwd_tile:
            return t
        t = replace(t, bwd_split=1 if choice.get("bwd_split") else 0, bwd_store=0)
        most = min(self.dev.max_work_group_size, self._local_size or self.dev.max_work_group_size)
        for kind, on in (("fwd", choice["fwd_rows"]), ("bwd", choice["bwd_rows"])):
            if not on:
                continue
            part = {f"{kind}_{f}": choice[f"{kind}_{f}"] for f in ("rows", "keys", "items") if choice[f"{kind}_{f}"]}
            try:
                tried = replace(t, **part)
            except ValueError:
                log.warning("attention head_dim=%d: ignoring %s: no tiling", head_dim, part)
                continue
            if tried.local_mem_bytes(head_dim) <= self.dev.local_mem_size and \
                    max(tried.forward_items, tried.backward_items) <= most:
                t = tried
        return replace(t, bwd_store=1) if choice.get("bwd_store") and t.stores_blocks else t

    def _without_failed(self, t: AttentionTiles, plain: AttentionTiles, head_dim: int, e: Exception) -> AttentionTiles:
        """``t`` without the chosen part that failed with ``e``: the staged forward or the blocked backward that its
        message names, else both (a failed build of the whole program); logged. ``t`` itself where neither is
        chosen or the kernel named is another (the caller raises ``e``)."""
        msg = str(e)
        fwd = bool(t.fwd_rows) and ("attention_forward_tiled" in msg or "attention_backward" not in msg)
        bwd = bool(t.bwd_rows) and ("attention_backward" in msg or "attention_forward_tiled" not in msg)
        if t.bwd_store and "attention_forward_tiled" not in msg:  # the store's build: without it
            log.warning("attention head_dim=%d: the stored dS does not build (%s); recomputing it", head_dim,
                        msg.splitlines()[0] if msg else type(e).__name__)
            return replace(t, bwd_store=0)
        if not (fwd or bwd):
            return t
        log.warning("attention head_dim=%d: %s does not fit (%s); using %s", head_dim,
                    " and ".join(n for n, on in (("the staged forward", fwd), ("the blocked backward", bwd)) if on),
                    msg.splitlines()[0] if msg else type(e).__name__,
                    " and ".join(n for n, on in (("the per-row forward", fwd), ("the staged backward", bwd)) if on))
        if fwd:
            t = replace(t, fwd_rows=0, fwd_keys=0, fwd_items=0)
        if bwd:
            t = replace(t, bwd_rows=0, bwd_keys=0, bwd_items=plain.bwd_items)
        return t

    @staticmethod
    def transposed_floats(batch: int, seq: int, n_kv_heads: int, head_dim: int) -> int:
        """Floats of K and V transposed (in the ``scratch`` of :meth:`forward` and :meth:`backward`) for ``batch``
        rows of ``seq`` keys: two (batch, n_kv_heads, head_dim, seq rounded up to LANES_MAX)."""
        return 2 * batch * n_kv_heads * head_dim * -(-seq // LANES_MAX) * LANES_MAX

    @staticmethod
    def split_floats(batch: int, seq: int, n_heads: int, n_kv_heads: int, head_dim: int) -> int:
        """Floats of the split backward's dK and dV partials (in the ``scratch`` of :meth:`backward`):
        (batch, seq, n_heads, 2 head_dim); 0 without grouped-query heads (nothing to split)."""
        return 2 * batch * seq * n_heads * head_dim if n_heads > n_kv_heads else 0

    @staticmethod
    def store_floats(batch: int, seq: int, n_heads: int, head_dim: int, tile: int = STAGED_TILE_MAX) -> int:
        """Floats of the stored dS (``bwd_store``, in the ``scratch`` of :meth:`backward` after the split partials):
        every (tile x tile) block of query rows x keys with a visible key of each (batch, head), where that is at most
        :data:`DS_STORE_MAX` per element of Q; else 0 (it does not run: longer contexts keep no O(T^2) buffer)."""
        nb = -(-seq // tile)
        floats = batch * n_heads * nb * (nb + 1) // 2 * tile * tile
        return floats if floats <= DS_STORE_MAX * batch * seq * n_heads * head_dim else 0

    @classmethod
    def scratch_floats(cls, batch: int, seq: int, n_heads: int, n_kv_heads: int, head_dim: int,
                       tile: int = STAGED_TILE_MAX) -> int:
        """Floats of the ``scratch`` that :meth:`forward` and :meth:`backward` of ``batch`` rows of ``seq`` tokens
        use where their tiling asks: the larger of :meth:`transposed_floats` and :meth:`split_floats` plus
        :meth:`store_floats` (of staged blocks of ``tile``)."""
        return max(cls.transposed_floats(batch, seq, n_kv_heads, head_dim),
                   cls.split_floats(batch, seq, n_heads, n_kv_heads, head_dim)
                   + cls.store_floats(batch, seq, n_heads, head_dim, tile))

    def _transpose(self, kn: _Kernels, kv_t, k, v, batch: int, seq_k: int, n_kv_heads: int, head_dim: int,
                   both: bool) -> int | None:
        """K (and V) transposed into ``kv_t`` (the scratch) for the lanes kernels; their padded length S, or None
        where they do not run (no lanes tiling, or no scratch large enough given)."""
        t = kn.tiles
        if (not t.lanes or kv_t is None or seq_k < 1
                or kv_t.size < 4 * self.transposed_floats(batch, seq_k, n_kv_heads, head_dim)):
            return None
        S = -(-seq_k // LANES_MAX) * LANES_MAX
        self.dev.launch(kn.transpose_kv, self._grid(S, 16, t.items, batch * n_kv_heads), (t.items, 1), kv_t, k, v,
                        np.int32(seq_k), np.int32(S), np.int32(n_kv_heads), np.int32(1 if both else 0))
        return S

    def _decode_forward(self, head_dim: int, t: AttentionTiles):
        """The forward kernel with one query row per work-item (built on first use)."""
        if head_dim not in self._decode:
            one = replace(t, rows=1, lanes=0)  # (no lanes kernels built for it)
            self._decode[head_dim] = (one, self.dev.kernel("attention", "attention_forward", one.options(head_dim)))
        return self._decode[head_dim]

    @staticmethod
    def _dsum_lanes(head_dim: int, items: int) -> int:
        """Work-items a row of attention_backward_dsum_rows (its DRL): float4s of a row rounded up to a power of two
        (at most 32), at most the largest power of two <= ``items``."""
        need = 1
        while need < min(-(-head_dim // 4), 32):
            need *= 2
        most = 1
        while most * 2 <= min(items, 32):
            most *= 2
        return min(need, most)

    @staticmethod
    def _check_heads(n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads or head_dim < 1:
            raise ValueError(f"attention needs n_kv_heads ({n_kv_heads}) dividing n_heads "
                             f"({n_heads}) and head_dim >= 1 (got {head_dim})")

    @staticmethod
    def _grid(n: int, per_item: int, items: int, groups: int) -> tuple[int, int]:
        blocks = -(-n // per_item)
        return -(-blocks // items) * items, groups

    def forward(self, out: cl.Buffer, lse: cl.Buffer, q: cl.Buffer, k: cl.Buffer, v: cl.Buffer,
                batch: int, seq_q: int, seq_k: int, q_pos_start: int,
                n_heads: int, n_kv_heads: int, head_dim: int, scratch: cl.Buffer | None = None) -> None:
        """Causal attention forward (training and KV-cache generation).

        Args:
            out: float32 ``(batch, seq_q, n_heads, head_dim)``, overwritten.
            lse: float32 ``(batch, n_heads, seq_q)``, overwritten with each row's log-sum-exp of
                the scaled scores (natural log); :meth:`backward` reads it. A row that sees no
                key gets ``out`` 0 and ``lse`` -inf.
            q: float32 ``(batch, seq_q, n_heads, head_dim)``.
            k, v: float32 ``(batch, seq_k, n_kv_heads, head_dim)``; with ``batch == 1`` the
                buffers may hold more keys (a KV cache of larger capacity): only the first
                ``seq_k`` are read.
            q_pos_start: absolute position of query 0; key ``j`` has position ``j``. Training:
                0 with ``seq_q = seq_k``; generation: the number of cached tokens, with
                ``seq_k = q_pos_start + seq_q``.
            scratch: float32 scratch of at least :meth:`transposed_floats` ``(batch, seq_k, ...)`` floats, or None:
                where the tiling has ``lanes`` the forward transposes K into it and runs with keys as lanes.

        Raises:
            ValueError: ``n_kv_heads`` does not divide ``n_heads``, or a forced tiling does not
                fit the device.
        """
        self._check_heads(n_heads, n_kv_heads, head_dim)
        if batch * n_heads * seq_q == 0:
            return
        kn = self._kernels(head_dim)
        t, fwd = kn.tiles, kn.forward
        grid = self._grid(seq_q, t.rows, t.items, batch * n_heads)
        heads = (np.int32(q_pos_start), np.int32(n_heads), np.int32(n_kv_heads), np.float32(1.0 / math.sqrt(head_dim)))
        if kn.forward_tiled is not None and seq_q >= TILED_MIN_ROWS:  # one work-group per block of fwd_rows rows
            self.dev.launch(kn.forward_tiled, (-(-seq_q // t.fwd_rows) * t.forward_items, batch * n_heads),
                            (t.forward_items, 1), out, lse, q, k, v, np.int32(seq_q), np.int32(seq_k), *heads)
            return
        if seq_q >= t.rows and (S := self._transpose(kn, scratch, k, v, batch, seq_k, n_kv_heads, head_dim, False)):
            self.dev.launch(kn.forward_lanes, grid, (t.items, 1), out, lse, q, scratch, v, np.int32(seq_q), np.int32(seq_k),
                            np.int32(S), *heads)
            return
        if seq_q < t.rows:  # decode: a work-item of t.rows rows would compute t.rows - seq_q for nothing
            t, fwd = self._decode_forward(head_dim, t)
            grid = self._grid(seq_q, t.rows, t.items, batch * n_heads)
        self.dev.launch(fwd, grid, (t.items, 1), out, lse, q, k, v, np.int32(seq_q), np.int32(seq_k), *heads)

    def backward(self, d_q: cl.Buffer, d_k: cl.Buffer, d_v: cl.Buffer, d_sum: cl.Buffer, d_out: cl.Buffer,
                 q: cl.Buffer, k: cl.Buffer, v: cl.Buffer, out: cl.Buffer, lse: cl.Buffer, batch: int,
                 seq: int, n_heads: int, n_kv_heads: int, head_dim: int, scratch: cl.Buffer | None = None) -> None:
        """Gradients of :meth:`forward` for training (``q_pos_start = 0``, ``seq_q = seq_k = seq``).

        ``P = exp(scale Q K^T - lse)``, ``D = rowsum(dO * O)``, ``dV = P^T dO``,
        ``dS = P * (dO V^T - D)``, ``dQ = scale dS K``, ``dK = scale dS^T Q`` (Dao 2023,
        "FlashAttention-2", Algorithm 2); a kv head's dK and dV sum over its group of query heads.

        Args:
            d_q: float32 ``(batch, seq, n_heads, head_dim)``, overwritten.
            d_k, d_v: float32 ``(batch, seq, n_kv_heads, head_dim)``, overwritten.
            d_sum: float32 scratch ``(batch, n_heads, seq)``, overwritten with ``D``.
            d_out: float32 ``(batch, seq, n_heads, head_dim)``, gradient of ``out``.
            q, k, v, out, lse: the forward's inputs, output and saved ``lse``.
            scratch: float32 scratch of at least :meth:`scratch_floats` floats, or None: K and V are transposed
                into it for dQ where the tiling has ``lanes``; the dK/dV partials go there where it has
                ``bwd_split`` and ``n_kv_heads < n_heads`` (none given or too small: the unsplit kernel), and the
                dS tiles after them where it has ``bwd_store`` (none given or too small: dQ recomputes them).

        Raises:
            ValueError: as :meth:`forward`.
        """
        self._check_heads(n_heads, n_kv_heads, head_dim)
        if batch * seq == 0:
            return
        kn = self._kernels(head_dim)
        t, dsum, dkdv, dq = kn.tiles, kn.dsum, kn.dkdv, kn.dq
        queue, L = self.dev.queue, (t.items, 1)
        sizes = (np.int32(seq), np.int32(n_heads), np.int32(n_kv_heads),
                 np.float32(1.0 / math.sqrt(head_dim)))
        if t.bwd_tile:  # one work-group per block of keys (dK, dV) or query rows (dQ)
            keys, rows = (t.bwd_keys, t.bwd_rows) if t.bwd_rows else (t.bwd_tile, t.bwd_tile)
            n, LB = t.backward_items, (t.backward_items, 1)
            lanes = self._dsum_lanes(head_dim, n)  # D: rows in memory order, lanes work-items each
            kn.dsum_rows(queue, (-(-batch * seq * n_heads // (n // lanes)) * n,), (n,), d_sum, d_out, out,
                         np.int32(seq), np.int32(n_heads), np.int32(batch * seq * n_heads))
            parts = self.split_floats(batch, seq, n_heads, n_kv_heads, head_dim)
            room = scratch.size // 4 if scratch is not None else 0
            ds = self.store_floats(batch, seq, n_heads, head_dim, t.bwd_tile) if t.bwd_store else 0
            ds_off = parts if ds and parts + ds <= min(room, 2**31 - 1) else -1  # the stored dS: after the partials
            store = (scratch if ds_off >= 0 else d_k, np.int32(ds_off))
            split = bool(t.bwd_split and parts and room >= parts)  # partials into the scratch, then their sums
            dkdv(queue, (-(-seq // keys) * n, batch * (n_heads if split else n_kv_heads)), LB,
                 *((scratch, scratch) if split else (d_k, d_v)), np.int32(split), *store, q, k, v, d_out, lse, d_sum,
                 *sizes)
            if split:
                kn.kv_sum(queue, self._grid(batch * seq * n_kv_heads * head_dim, 4 if head_dim % 4 == 0 else 1,
                                            t.items, 1), L, d_k, d_v,
                          scratch, np.int32(batch * seq), np.int32(n_heads), np.int32(n_kv_heads))
            if ds_off >= 0:
                blocks = -(-seq // rows)  # a work-group per two query blocks
                kn.dq_stored(queue, (-(-blocks // 2) * n, batch * n_heads), LB, d_q, scratch, np.int32(ds_off), k,
                             *sizes)
                return
            dq(queue, (-(-seq // rows) * n, batch * n_heads), LB, d_q, q, k, v, d_out, lse, d_sum, *sizes)
            return
        dsum(queue, self._grid(seq, t.rows, t.items, batch * n_heads), L, d_sum, d_out, out,
             np.int32(seq), np.int32(n_heads))
        dkdv(queue, self._grid(seq, t.kv_rows, t.items, batch * n_kv_heads), L, d_k, d_v, q, k, v, d_out,
             lse, d_sum, *sizes)
        if S := self._transpose(kn, scratch, k, v, batch, seq, n_kv_heads, head_dim, True):
            kn.dq_lanes(queue, self._grid(seq, t.rows, t.items, batch * n_heads), L, d_q, scratch, np.int32(S), q, k, v,
                    d_out, lse, d_sum, *sizes)
            return
        dq(queue, self._grid(seq, t.rows, t.items, batch * n_heads), L, d_q, q, k, v, d_out, lse, d_sum,
           *sizes)
