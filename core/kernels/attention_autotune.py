"""Attention's forward on GPUs, chosen by measurement: the per-row kernel or the staged one.

``attention_forward_tiled`` (FlashAttention-2's forward, Dao 2023, Algorithm 1, with register micro-tiles)
computes each block of scores once per work-group; ``attention_forward`` gives each query row its own
work-item. Which is faster depends on the device and the shape, so, as the matmul tuner does
(core/kernels/matmul_autotune.py), :func:`forward_blocks` times both at a model's own shape on the device
itself, once, checks every staged candidate against the per-row result, and caches the winner in
``attention-forward.json`` in the user cache folder, keyed by platform, device, driver and the hash of
``attention.cl`` (:func:`core.kernels.matmul_autotune.device_key`). CPUs, and runs with tuning off
(``OPENCL_LLM_MATMUL_TUNE=0``: the test suite), keep the per-row forward.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace

import numpy as np

from core.atomic import atomic_write
from core.device import Device, KernelBuildError, KernelLimitError, user_cache_dir
from core.kernels import matmul_autotune
from core.kernels import attention

log = logging.getLogger(__name__)

CACHE_FILE = "attention-forward.json"
CANDIDATES = 3  # staged block shapes timed besides the per-row forward: the largest that fit
PER_ROW = (0, 0)
_lock = threading.Lock()
_memo: dict[str, dict] = {}  # per process: the cache file's entry of each device


def _name(batch: int, seq: int, n_heads: int, n_kv_heads: int, head_dim: int) -> str:
    return f"{batch}x{seq} heads {n_heads}/{n_kv_heads} head_dim {head_dim}"


def candidates(dev: Device, head_dim: int) -> list[tuple[int, int]]:
    """``(fwd_rows, fwd_keys)`` timed on ``dev``: the per-row forward and up to :data:`CANDIDATES` staged
    block shapes that fit (none besides the per-row one on CPUs)."""
    return [PER_ROW] + attention.forward_blocks(dev, attention.default_tiles(dev, head_dim), head_dim)[:CANDIDATES]


def expected_seconds(dev: Device, build_s: float) -> float:
    """Seconds the first model's timing is expected to take on ``dev`` given ``build_s`` per program build: a
    build of each staged candidate and about a second of timing; 0.0 on CPUs, with tuning off or where this
    device has timed a shape before."""
    blocks = candidates(dev, 64)
    if len(blocks) < 2 or not matmul_autotune.enabled() or _entries(dev):
        return 0.0
    return (len(blocks) - 1) * build_s + 1.0


def _entries(dev: Device) -> dict:
    """This device's readable cache entries (read once per process)."""
    key = matmul_autotune.device_key(dev, "attention")
    if key not in _memo:
        _memo[key] = _valid(dev, matmul_autotune.read_cache(user_cache_dir() / CACHE_FILE).get(key))
    return _memo[key]


def _valid(dev: Device, entries) -> dict:
    """The entries of one device's part of the cache whose blocks are a candidate of their head_dim (others:
    untimed, logged)."""
    out = {}
    for name, entry in (entries.items() if isinstance(entries, dict) else ()):
        try:
            blocks = (entry["fwd_rows"], entry["fwd_keys"])
            head_dim = int(name.rsplit(" ", 1)[1])
            if all(type(b) is int for b in blocks) and blocks in candidates(dev, head_dim):
                out[name] = {**entry, "fwd_rows": blocks[0], "fwd_keys": blocks[1]}
                continue
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            pass
        log.warning("ignoring the attention cache's entry %r: not a block shape of this device", name)
    return out


def forward_blocks(dev: Device, batch: int, seq: int, n_heads: int, n_kv_heads: int, head_dim: int) -> tuple[int, int]:
    """The forward measured fastest on ``dev`` for this shape, for :meth:`core.kernels.attention.Attention.use_forward_blocks`:
    ``(fwd_rows, fwd_keys)`` of the staged forward, or ``(0, 0)`` for the per-row one.

    The first call per device and shape times each of :func:`candidates` (best of 3 rounds of at least 20 ms)
    on random inputs of the shape (``seq`` query rows and keys, one training forward), after checking that
    each staged candidate's output and log-sum-exp match the per-row forward's (within 1e-4); a wrong or
    failing candidate is never chosen. The winner is cached. Returns ``(0, 0)`` without timing on CPUs and
    with tuning off, and untimed (not cached) when the inputs cannot be allocated.
    """
    blocks = candidates(dev, head_dim)
    if len(blocks) < 2 or not matmul_autotune.enabled() or min(batch, seq, n_heads, n_kv_heads) < 1:
        return PER_ROW
    name = _name(batch, seq, n_heads, n_kv_heads, head_dim)
    key = matmul_autotune.device_key(dev, "attention")
    with _lock:  # one timing at a time (concurrent callers wait, then find their shape timed)
        table = _entries(dev)
        if name not in table:
            timed = _time(dev, blocks, batch, seq, n_heads, n_kv_heads, head_dim)
            if timed is None:
                return PER_ROW
            table[name] = timed
            data = matmul_autotune.read_cache(user_cache_dir() / CACHE_FILE)
            data[key] = {**_valid(dev, data.get(key)), **table}
            try:
                atomic_write(user_cache_dir() / CACHE_FILE, json.dumps(data, indent=1, sort_keys=True), sync_folder=False)
            except OSError as e:
                log.warning("could not save the attention forward's choice: %s", e)
        return table[name]["fwd_rows"], table[name]["fwd_keys"]


def _time(dev: Device, blocks: list, batch: int, seq: int, n_heads: int, n_kv_heads: int, head_dim: int) -> dict | None:
    """Time ``blocks`` (the per-row forward first) at one shape: the cache entry of the fastest correct one."""
    rng = np.random.default_rng(0)
    q_n, kv_n = batch * seq * n_heads * head_dim, batch * seq * n_kv_heads * head_dim
    try:
        q, k, v = (dev.upload(rng.standard_normal(n).astype(np.float32)) for n in (q_n, kv_n, kv_n))
        out, lse = dev.alloc(q_n), dev.alloc(batch * n_heads * seq)
    except (dev.cl.Error, MemoryError) as e:  # larger than the device allows: left untimed
        log.info("attention timing: %s not timed: %s", _name(batch, seq, n_heads, n_kv_heads, head_dim),
                 str(e).splitlines()[0])
        return None
    base = attention.default_tiles(dev, head_dim)
    want, ms, best = None, {}, None
    try:
        for fwd_rows, fwd_keys in blocks:
            try:
                op = attention.Attention(dev, tiles=replace(base, fwd_rows=fwd_rows, fwd_keys=fwd_keys))
                run = lambda: op.forward(out, lse, q, k, v, batch, seq, seq, 0, n_heads, n_kv_heads, head_dim)  # noqa: E731
                run()
                got = dev.download(out, (q_n,)), dev.download(lse, (batch * n_heads * seq,))
            except (KernelBuildError, KernelLimitError, ValueError, dev.cl.Error) as e:
                log.info("attention timing: blocks %dx%d skipped: %s", fwd_rows, fwd_keys, str(e).splitlines()[0])
                if want is None:  # the per-row forward itself: nothing to check the others against
                    return None
                continue
            if want is None:
                want = got
            elif not all(np.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want)):
                log.warning("attention timing: blocks %dx%d differ from the per-row forward; not used", fwd_rows, fwd_keys)
                continue
            s = matmul_autotune.best_seconds(dev, run, 0.02)
            ms[f"{fwd_rows}x{fwd_keys}"] = float(f"{s * 1e3:.4g}")
            if best is None or s < best[0]:
                best = (s, fwd_rows, fwd_keys)
    finally:
        for buf in (q, k, v, out, lse):
            buf.release()
    if best is None:
        return None
    log.info("attention forward %s: %s (ms: %s)", _name(batch, seq, n_heads, n_kv_heads, head_dim),
             "per-row" if best[1:] == PER_ROW else f"staged {best[1]}x{best[2]}", ms)
    return {"fwd_rows": best[1], "fwd_keys": best[2], "ms": ms}
