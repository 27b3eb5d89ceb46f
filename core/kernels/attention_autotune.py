"""Attention's kernels on GPUs, chosen by measurement at a model's shape.

Forward: the per-row kernel (``attention_forward``: a work-item per query row) or the staged one
(``attention_forward_tiled``: FlashAttention-2's forward, Dao 2023, Algorithm 1, with register micro-tiles).
Backward: the staged kernels (``attention_backward_*_tiled``: 32 x 32 blocks, 2 x 4 micro-tiles) or the blocked
ones (``attention_backward_*_blocked``: the forward's 4 x 4 micro-tiles) or the staged ones storing dS for dQ
(``AttentionTiles.bwd_store``), each also split (one dK/dV work-group per query head under grouped-query attention,
``AttentionTiles.bwd_split``). Which is faster depends on the device
and the shape, so, as the matmul tuner does (core/kernels/matmul_autotune.py), :func:`tiling` times each option
once per device and shape on the device itself, the forward's and the backward's apart, checks every option's
results against the first one's (the per-row forward, the staged backward), and caches the winners in
``attention-kernels.json`` in the user cache folder, keyed by platform, device, driver and the hash of
``attention.cl`` (:func:`core.kernels.matmul_autotune.device_key`). CPUs, and runs with tuning off
(``OPENCL_LLM_MATMUL_TUNE=0``: the test suite), keep the first options.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace

import numpy as np

from core.device import Device, KernelBuildError, KernelLimitError, user_cache_dir
from core.kernels import attention, matmul_autotune

log = logging.getLogger(__name__)

CACHE_FILE = "attention-kernels.json"
FORWARD_CANDIDATES = 3  # staged block shapes timed besides the per-row forward: the largest that fit
FORWARD_ITEM_SHARES = (1, 2)  # each with the staged backward's work-items, and half as many (more micro-tiles each)
_lock = threading.Lock()
_memo: dict[str, dict] = {}  # per process: the cache file's entry of each device


def _name(batch: int, seq: int, n_heads: int, n_kv_heads: int, head_dim: int, backward: bool = True) -> str:
    return f"{batch}x{seq} heads {n_heads}/{n_kv_heads}{'' if backward else ' forward'} head_dim {head_dim}"


def label(option: dict[str, int]) -> str:
    """An option's name: "forward per-row", "forward 64x32w128", "backward staged", "backward 32x32w64",
    "backward staged split", "backward staged store split"."""
    if "fwd_rows" in option:
        return f"forward {option['fwd_rows']}x{option['fwd_keys']}w{option['fwd_items']}" if option["fwd_rows"] \
            else "forward per-row"
    name = f"backward {option['bwd_rows']}x{option['bwd_keys']}w{option['bwd_items']}" if option["bwd_rows"] \
        else "backward staged"
    return name + (" store" if option.get("bwd_store") else "") + (" split" if option.get("bwd_split") else "")


def options(dev: Device, head_dim: int) -> tuple[list[dict], list[dict]]:
    """The forward's and the backward's options on ``dev`` (each the reference first): ``fwd_*`` and ``bwd_*``
    fields of :data:`core.kernels.attention.TUNED_FIELDS`. The per-row forward and up to
    :data:`FORWARD_CANDIDATES` staged block shapes that fit, each with the staged backward's work-items divided by
    each of :data:`FORWARD_ITEM_SHARES`; the staged backward and the blocked ones of
    :data:`core.kernels.attention.BWD_BLOCKS` that fit (those of the staged tile's size also storing dS) and the
    staged one storing dS, each unsplit and split. Only the
    references on CPUs."""
    base = attention.default_tiles(dev, head_dim)
    fwd = [{"fwd_rows": 0, "fwd_keys": 0, "fwd_items": 0}]
    bwd = [{"bwd_rows": 0, "bwd_keys": 0, "bwd_items": 0, "bwd_split": 0, "bwd_store": 0}]
    if not base.bwd_tile:
        return fwd, bwd
    items = base.backward_items
    fwd += [{"fwd_rows": r, "fwd_keys": k, "fwd_items": items // share}
            for r, k in attention.forward_blocks(dev, base, head_dim)[:FORWARD_CANDIDATES]
            for share in FORWARD_ITEM_SHARES if items // share >= 1]
    for r, k, w in attention.BWD_BLOCKS:
        t = replace(base, bwd_rows=r, bwd_keys=k, bwd_items=w)
        if w <= dev.max_work_group_size and t.local_mem_bytes(head_dim) <= dev.local_mem_size:
            bwd.append({"bwd_rows": r, "bwd_keys": k, "bwd_items": w, "bwd_split": 0, "bwd_store": 0})
            if t.stores_blocks:  # blocks of the staged tile: also storing dS
                bwd.append({**bwd[-1], "bwd_store": 1})
    bwd.append({**bwd[0], "bwd_store": 1})
    return fwd, bwd + [{**o, "bwd_split": 1} for o in bwd]


def expected_seconds(dev: Device, build_s: float) -> float:
    """Seconds the first model's timing is expected to take on ``dev`` given ``build_s`` per program build: a
    build of each option besides the references (a split one is its unsplit one's build) and about two seconds
    of timing; 0.0 on CPUs, with tuning off or where this device has timed a shape before."""
    fwd, bwd = options(dev, 64)
    n = len(fwd) + sum(1 for o in bwd if not o["bwd_split"]) - 2
    if not n or not matmul_autotune.enabled() or _entries(dev):
        return 0.0
    return n * build_s + 2.0


def _entries(dev: Device) -> dict:
    """This device's readable cache entries (read once per process)."""
    key = matmul_autotune.device_key(dev, "attention")
    if key not in _memo:
        _memo[key] = _valid(dev, matmul_autotune.read_cache(user_cache_dir() / CACHE_FILE).get(key))
    return _memo[key]


def _valid(dev: Device, entries) -> dict:
    """The entries of one device's part of the cache whose choice is one of its head_dim's options (others:
    untimed, logged)."""
    out = {}
    for name, entry in (entries.items() if isinstance(entries, dict) else ()):
        try:
            choice, head_dim = entry["choice"], int(name.rsplit(" ", 1)[1])
            fwd, bwd = options(dev, head_dim)
            if (all(type(choice[f]) is int for f in attention.TUNED_FIELDS)
                    and {f: choice[f] for f in fwd[0]} in fwd and {f: choice[f] for f in bwd[0]} in bwd):
                out[name] = entry
                continue
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            pass
        log.warning("ignoring the attention cache's entry %r: not an option of this device", name)
    return out


def tiling(dev: Device, batch: int, seq: int, n_heads: int, n_kv_heads: int, head_dim: int,
           backward: bool = True) -> dict[str, int]:
    """The attention kernels measured fastest on ``dev`` for this shape, for
    :meth:`core.kernels.attention.Attention.use_tiling`: the :data:`core.kernels.attention.TUNED_FIELDS` of the
    fastest forward option and the fastest backward option (zeros: the per-row forward, the staged backward).
    Without ``backward`` (a model that never trains) only the forward's options are timed (a training model's
    entry of the shape serves too).

    The first call per device and shape times each of :func:`options` (best of 3 rounds of at least 20 ms) on
    random inputs of a training step's attention at the shape (``seq`` query rows and keys), after checking
    that its results match the reference option's (forward output and log-sum-exp, or dQ, dK and dV, within
    1e-4 relative and absolute; 1e-3 for the gradients); a wrong or failing option is never chosen. The winners
    are cached. ``{}`` without timing on CPUs and with tuning off, and untimed (not cached) when the inputs
    cannot be allocated or the references fail.
    """
    fwd, bwd = options(dev, head_dim)
    bwd = [o for o in bwd if (n_heads > n_kv_heads or not o["bwd_split"])  # split: the same kernel without GQA
           and (attention.Attention.store_floats(batch, seq, n_heads, head_dim) or not o["bwd_store"])]  # too long
    bwd = bwd if backward else bwd[:1]
    if len(fwd) + len(bwd) < 3 or not matmul_autotune.enabled() or min(batch, seq, n_heads, n_kv_heads) < 1:
        return {}
    name = _name(batch, seq, n_heads, n_kv_heads, head_dim, backward)
    key = matmul_autotune.device_key(dev, "attention")
    with _lock:  # one timing at a time (concurrent callers wait, then find their shape timed)
        table = _entries(dev)
        full = _name(batch, seq, n_heads, n_kv_heads, head_dim)
        if not backward and full in table:
            return {**table[full]["choice"], **bwd[0]}
        if name not in table:
            timed = _time(dev, fwd, bwd, batch, seq, n_heads, n_kv_heads, head_dim)
            if timed is None:
                return {}
            table[name] = timed
            matmul_autotune.merge_cache(user_cache_dir() / CACHE_FILE, key, table, lambda part: _valid(dev, part))
        return dict(table[name]["choice"])


class StepBuffers:
    """Random inputs of one training step's attention at a shape, and its outputs' and gradients' buffers."""

    def __init__(self, dev: Device, batch: int, seq: int, n_heads: int, n_kv_heads: int, head_dim: int):
        rng = np.random.default_rng(0)
        self.dev, self.shape = dev, (batch, seq, n_heads, n_kv_heads, head_dim)
        self.q_n, self.kv_n, self.rows = batch * seq * n_heads * head_dim, batch * seq * n_kv_heads * head_dim, \
            batch * n_heads * seq
        self.bufs: list = []
        self.q, self.k, self.v, self.d_out = (self._upload(rng.standard_normal(n).astype(np.float32))
                                              for n in (self.q_n, self.kv_n, self.kv_n, self.q_n))
        self.out, self.lse, self.d_q, self.d_k, self.d_v, self.d_sum, self.scratch = (
            self._alloc(n) for n in (self.q_n, self.rows, self.q_n, self.kv_n, self.kv_n, self.rows,
                                     attention.Attention.scratch_floats(batch, seq, n_heads, n_kv_heads, head_dim)))
        # (the scratch a Model of this shape gives: sized for the largest staged blocks, as core.model does)

    def _upload(self, x):
        self.bufs.append(self.dev.upload(x))
        return self.bufs[-1]

    def _alloc(self, n):
        self.bufs.append(self.dev.alloc(n))
        return self.bufs[-1]

    def forward(self, op) -> None:
        b, s, h, kvh, d = self.shape
        op.forward(self.out, self.lse, self.q, self.k, self.v, b, s, s, 0, h, kvh, d)

    def backward(self, op) -> None:
        b, s, h, kvh, d = self.shape
        op.backward(self.d_q, self.d_k, self.d_v, self.d_sum, self.d_out, self.q, self.k, self.v, self.out, self.lse,
                    b, s, h, kvh, d, scratch=self.scratch)

    def results(self, forward: bool) -> list[np.ndarray]:
        bufs = ((self.out, self.q_n), (self.lse, self.rows)) if forward else \
            ((self.d_q, self.q_n), (self.d_k, self.kv_n), (self.d_v, self.kv_n))
        return [self.dev.download(buf, (n,)) for buf, n in bufs]

    def release(self) -> None:
        for buf in self.bufs:
            buf.release()


def _time(dev: Device, fwd: list, bwd: list, batch: int, seq: int, n_heads: int, n_kv_heads: int,
          head_dim: int) -> dict | None:
    """Time the forward's options, then the backward's, at one shape: the cache entry of the fastest correct
    ones (``choice`` and each option's milliseconds), or None when the inputs or a reference fail."""
    name = _name(batch, seq, n_heads, n_kv_heads, head_dim, len(bwd) > 1)
    try:
        step = StepBuffers(dev, batch, seq, n_heads, n_kv_heads, head_dim)
    except (dev.cl.Error, MemoryError) as e:  # larger than the device allows: left untimed
        log.info("attention timing: %s not timed: %s", name, str(e).splitlines()[0])
        return None
    choice, ms = {}, {}
    try:
        for opts, forward in ((fwd, True), (bwd, False)):
            want, best = None, None
            run = step.forward if forward else step.backward
            if len(opts) == 1:  # the reference alone: nothing to choose
                choice.update(opts[0])
                continue
            if not forward:
                step.forward(attention.Attention(dev))  # the backward's inputs
            for option in opts:
                try:  # as a Model would run it: the device's tiling, with this option where it builds and fits
                    op = attention.Attention(dev)
                    op.use_tiling(head_dim, option)
                    t = op.tiles(head_dim)
                    # its blocks as chosen (work-groups may be smaller where kernels allow fewer work-items: a
                    # Model given this choice builds the same)
                    if any(getattr(t, f) != v for f, v in option.items() if not f.endswith("items")):
                        raise KernelLimitError(f"built as {t}")
                    run(op)
                    got = step.results(forward)
                except (KernelBuildError, KernelLimitError, ValueError, dev.cl.Error) as e:
                    log.info("attention timing: %s skipped: %s", label(option), str(e).splitlines()[0])
                    if want is None:  # the reference itself: nothing to check the others against
                        return None
                    continue
                tol = 1e-4 if forward else 1e-3
                if want is None:
                    want = got
                elif not all(np.allclose(g, w, rtol=tol, atol=tol) for g, w in zip(got, want)):
                    log.warning("attention timing: %s differs from %s; not used", label(option), label(opts[0]))
                    continue
                s = matmul_autotune.best_seconds(dev, lambda: run(op), 0.02)
                ms[label(option)] = float(f"{s * 1e3:.4g}")
                if best is None or s < best[0]:
                    best = (s, option)
            choice.update(best[1])
    finally:
        step.release()
    log.info("attention kernels %s: %s, %s (ms: %s)", name, label({f: choice[f] for f in fwd[0]}),
             label({f: choice[f] for f in bwd[0]}), ms)
    return {"choice": choice, "ms": ms}
