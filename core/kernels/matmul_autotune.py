"""Matmul auto-tuner: time a compact grid of kernel configurations on the user's device, once.

After CLBlast's tuners (Nugteren 2018): every kernel size is a ``-D`` build option, a small grid of
them is timed at representative shapes on the device itself, and the winner is stored in a
database keyed by the device. Here the database is one JSON file in the user cache folder
(:func:`core.device.user_cache_dir`), keyed by platform, device name, driver version and a hash
of ``matmul.cl``, so a new driver or a changed kernel re-tunes.

:func:`tuned_configs` is what :class:`core.kernels.matmul.Matmul` calls: it returns the cached
winner, or tunes now (reporting through ``progress``) when there is none. The environment variable
``OPENCL_LLM_MATMUL_TUNE`` controls it: ``0`` = never tune and ignore the cache (untuned
defaults; the test suite sets this), ``1`` (default) = use the cache, tune on first use.

Grid (see :func:`candidates`): on CPUs, packed micro-kernels of several register-block shapes
(rows x vectors of the device's vector width) and work-group sizes, timed once for all transpose
cases (:func:`tuned_variants`); on GPUs, per transpose case,
CLBlast-style local-memory tiles (64x64 and 128x128 C tiles, 4x4 to 8x8 per work-item, float4,
padding, two alternating local tiles (ping-pong)), and smaller tiles for the narrow products of LoRA's
adapters (:data:`NARROW_SHAPES`). GEMV: work-group sizes and outputs per work-group. Each candidate is
checked against numpy before it is timed; a wrong or failing one is skipped. The score is the
geometric mean of GFLOP/s over a small-model shape and a large one.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from core.atomic import atomic_write
from core.device import Device, KernelBuildError, KernelLimitError, kernel_source, user_cache_dir
from core.kernels import matmul
from core.kernels._launch import simd_width
from core.kernels.matmul import (GEMV_MAX_M, NARROW_KINDS, GemmKernel, GemvConfig, GemvKernel, PackedConfig,
                                 TiledConfig, config_from_dict, config_to_dict, cpu_group_width, cpu_vector_width,
                                 default_configs, default_narrow, fallback_configs, fits, narrow_kind,
                                 uses_local_tiles)

log = logging.getLogger(__name__)

ENV_VAR = "OPENCL_LLM_MATMUL_TUNE"
CACHE_FILE = "matmul-tuning.json"
TUNER_VERSION = 5  # bump when the grid or the scoring changes
MODEL_VARIANTS = ((False, False), (False, True), (True, False))  # what the model uses; TT takes TN's
RETIME = 3  # leaders timed again, alternating, against a shared machine's noise
Progress = Callable[[float, str], None]
_lock = threading.Lock()


_thread = threading.local()


def enabled() -> bool:
    """False when ``OPENCL_LLM_MATMUL_TUNE`` is 0/off/false/no (tests, reproducible runs), or inside
    :func:`untuned` in this thread."""
    if getattr(_thread, "untuned", False):
        return False
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "off", "false", "no")


@contextlib.contextmanager
def untuned():
    """Within it, in this thread, :func:`tuned_configs` tunes nothing and returns ``{}`` (the defaults):
    core.plan times a step this way before the first tuning, which the plan then announces."""
    before = getattr(_thread, "untuned", False)
    _thread.untuned = True
    try:
        yield
    finally:
        _thread.untuned = before


def is_tuned(dev: Device) -> bool:
    """Whether ``dev`` has a tuning result (this process's or the cache's), or tuning is off."""
    return not enabled() or device_key(dev) in _memo or load_cached(dev) is not None


def cache_path() -> Path:
    """The JSON file holding every device's tuning result."""
    return user_cache_dir() / CACHE_FILE


def device_key(dev: Device, kernel: str = "matmul") -> str:
    """Platform, device name, driver version and the hash of ``<kernel>.cl``: one tuning result per key."""
    src = hashlib.sha256(kernel_source(kernel).encode()).hexdigest()[:16]
    try:
        driver = str(dev.cl_device.driver_version).strip()
    except dev.cl.Error:
        driver = "?"
    # CPUs: the SIMD width the kernels are built for (its rule may change under a cached winner)
    simd = "" if uses_local_tiles(dev) else f" | simd {simd_width(dev)}"
    return (f"{dev.info.platform.strip()} | {dev.info.name.strip()} | driver {driver} | "
            f"{kernel}.cl {src} | v{TUNER_VERSION}{simd}")


def shapes(dev: Device) -> dict[tuple[bool, bool], list[tuple[int, int, int]]]:
    """Representative (M, N, K) per tuned variant: a small-model shape and a large one.

    CPUs get shapes of a d_model 128 / ffn 384 model and a d_model 512 / ffn 1536 one at 512 token
    rows (bounded tuning time); GPUs get a d_model 512 / ffn 1536 layer at 2048 token rows and 2048^3
    (a d_model 128 model's products are too small to tell GPU tilings apart: launch overhead).
    """
    if uses_local_tiles(dev):
        big = (2048, 2048, 2048)
        return {(False, True): [(2048, 1536, 512), big], (False, False): [(2048, 512, 1536), big],
                (True, False): [(1536, 512, 2048), big]}
    return {(False, True): [(512, 384, 128), (512, 1536, 512)],
            (False, False): [(512, 128, 384), (512, 512, 1536)],
            (True, False): [(384, 128, 512), (1536, 512, 512)]}


# (tsm, tsn, tsk, wptm, wptn, vw, pad, dbuf): 256x128, 128x128, 128x64 and 64x64 C tiles with 16x8, 8x8, 8x4 or
# 4x4 per work-item (8x16 to 16x16 work-groups), K tiles of 8-32, float4 or float2, padded, single or
# ping-pong buffered (or that with register prefetch) (CLBlast's xgemm search space, pruned to the settings its database keeps for
# NVIDIA/AMD GPUs).
GPU_GRID = tuple(TiledConfig(*p) for p in (
    # the next K tile prefetched into registers (dbuf 2) first: the budget may not reach the end
    (128, 128, 16, 8, 8, 4, 4, 2), (256, 128, 8, 16, 8, 4, 4, 2), (128, 64, 16, 8, 8, 4, 4, 2),
    (64, 128, 16, 8, 8, 4, 4, 2), (128, 64, 16, 8, 4, 4, 4, 2), (64, 128, 16, 4, 8, 4, 4, 2),
    (128, 128, 8, 8, 8, 4, 4, 2), (64, 64, 16, 4, 4, 4, 4, 2), (128, 128, 16, 8, 8, 4, 0, 2),
    (128, 128, 16, 8, 8, 4, 4, 1), (128, 128, 16, 8, 8, 4, 4, 0), (128, 128, 8, 8, 8, 4, 4, 1),
    (128, 128, 32, 8, 8, 4, 4, 1), (128, 64, 16, 8, 4, 4, 4, 1), (64, 128, 16, 4, 8, 4, 4, 1),
    (64, 64, 16, 4, 4, 4, 4, 1), (64, 64, 16, 8, 8, 4, 4, 1), (64, 64, 32, 4, 4, 4, 0, 0),
    (128, 128, 16, 8, 8, 2, 2, 1), (32, 32, 16, 2, 2, 2, 2, 0),
    (128, 64, 16, 8, 8, 4, 4, 1), (64, 128, 16, 8, 8, 4, 4, 1), (64, 64, 32, 8, 8, 4, 4, 1),
    (64, 64, 32, 4, 4, 4, 4, 1), (128, 128, 32, 8, 8, 4, 4, 0)))

# Per-shape candidates (shape_configs), besides the variant's tuned configuration: the H200's fastest over the
# products of SmolLM2's and a d_model 1024 model's steps (8 x 512 tokens) were each of these somewhere: 256x128 on
# wide products, 128x64 / 64x128 of 8x8 where a 576-wide side leaves a 128x128 tiling few tiles
SHAPE_GRID = tuple(TiledConfig(*p) for p in (
    (128, 128, 16, 8, 8, 4, 4, 2), (256, 128, 8, 16, 8, 4, 4, 2), (128, 64, 16, 8, 8, 4, 4, 2),
    (64, 128, 16, 8, 8, 4, 4, 2), (128, 64, 16, 8, 4, 4, 4, 2)))
SHAPE_FILE = "matmul-shapes.json"
SHAPE_BUDGET_S = 30.0
"""Seconds one :func:`shape_configs` call may spend timing (a shape not reached keeps its variant's configuration
and is timed by a later call)."""

GEMV_SHAPES = [(1, 384, 128), (1, 1536, 512)]  # decode: one token row times W (N,K)

# Tiled devices: the narrow products (core.kernels.matmul.NARROW_MAX) of LoRA's adapters at 4096 token rows
# (rank 16, d_model 576: SmolLM2's stacked q/k/v A's, and one adapter's): x A^T (N = P r) and the A gradient
# du^T x (M = P r, K = the tokens), each group timed on its own variant
NARROW_SHAPES = {"narrow_n": ((False, True), [(4096, 48, 576), (4096, 16, 1536)]),
                 "narrow_m": ((True, False), [(48, 576, 4096), (16, 1536, 4096)])}
NARROW_GRID = tuple(TiledConfig(*p) for p in (
    (64, 32, 16, 4, 4, 4, 4, 1), (32, 64, 16, 4, 4, 4, 4, 1), (64, 64, 16, 4, 4, 4, 4, 1),
    (128, 32, 16, 8, 4, 4, 4, 1), (32, 128, 16, 4, 8, 4, 4, 1), (64, 16, 16, 4, 4, 4, 4, 1),
    (16, 64, 16, 4, 4, 4, 4, 1), (32, 32, 16, 4, 4, 4, 4, 1), (32, 32, 16, 2, 2, 2, 2, 0),
    (128, 16, 16, 8, 4, 4, 4, 1), (16, 128, 16, 4, 8, 4, 4, 1), (64, 32, 16, 4, 4, 4, 4, 2),
    (32, 64, 16, 4, 4, 4, 4, 2), (128, 32, 16, 8, 4, 4, 4, 2)))


def tuned_variants(dev: Device) -> tuple[tuple[bool, bool], ...]:
    """The transpose variants timed separately. GPUs: the three the model uses (the tile loads
    differ). CPUs: only NT; with both operands packed the micro-kernel is the same code for every
    variant (the transposes live in the packing kernels), so its winner serves all four and the
    first-run cost stays low (PoCL compiles each candidate, a few seconds each on 2 cores)."""
    return MODEL_VARIANTS if uses_local_tiles(dev) else ((False, True),)


def candidates(dev: Device, variant: tuple[bool, bool]) -> list:
    """Matrix-matrix configurations to time for ``variant`` on ``dev`` (the default first)."""
    default, _ = default_configs(dev)
    if uses_local_tiles(dev):
        grid = list(GPU_GRID)
    else:
        vw = cpu_vector_width(dev)
        # (rows, vectors): 16-28 of AVX-512's 32 registers, or 12 of AVX2's 16
        blocks = [(6, 4), (8, 3), (8, 2), (12, 1)] if vw == 16 else [(6, 2), (4, 3), (8, 1)]
        grid = [PackedConfig(mr, nb, vw, 1, 16, True) for mr, nb in blocks]
        grid += [PackedConfig(*blocks[0], vw, 4, 64, True), PackedConfig(*blocks[0], vw, 1, 16, True, kc=256)]
        if cpu_group_width(dev) > 1:  # SIMD across work-items (llvmpipe): wider groups
            grid = [PackedConfig(mr, nb, vw, 8, 16, True) for mr, nb in blocks]
            grid.append(PackedConfig(*blocks[0], vw, 32, 32, True))
    out = [default]
    for c in grid:
        if c not in out and fits(dev, c):
            out.append(c)
    return out


def narrow_candidates(dev: Device, kind: str) -> list[TiledConfig]:
    """Tiled configurations to time for the narrow products ``kind`` (:data:`NARROW_SHAPES`; the default
    first); none on devices without local tiles (CPUs narrow their packed panels instead)."""
    default = default_narrow(dev).get(kind)
    if default is None:
        return []
    out = [default]
    for c in NARROW_GRID:
        if c not in out and fits(dev, c):
            out.append(c)
    return out


def gemv_candidates(dev: Device) -> list[GemvConfig]:
    """GEMV configurations to time on ``dev`` (the default first)."""
    _, default = default_configs(dev)
    if uses_local_tiles(dev):
        grid = [GemvConfig(wg, rows, 4) for wg in (32, 64, 128, 256) for rows in (1, 2, 4)]
    else:
        vw = cpu_vector_width(dev)
        grid = [GemvConfig(1, rows, vw) for rows in (2, 4, 8)] + [GemvConfig(4, 4, vw)]
        if cpu_group_width(dev) > 1:
            grid = [GemvConfig(wg, rows, 4) for wg in (8, 32) for rows in (1, 2)]
    out = [default]
    for g in grid:
        if g not in out and fits(dev, g):
            out.append(g)
    return out


def best_seconds(dev: Device, launch: Callable[[], None], min_s: float, rounds: int = 3) -> float:
    """Best time of one ``launch`` over ``rounds`` rounds of at least ``min_s`` each."""
    launch()
    dev.finish()
    t0 = time.perf_counter()
    launch()
    dev.finish()
    reps = max(1, min(50, int(min_s / max(time.perf_counter() - t0, 1e-6))))
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            launch()
        dev.finish()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


class _Operands:
    """Random device operands for one shape and variant, with the float64 numpy result."""

    def __init__(self, dev: Device, shape: tuple[int, int, int], variant: tuple[bool, bool], rng):
        m, n, k = shape
        ta, tb = variant
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        self.shape, self.dev, self._host = shape, dev, (a.T if ta else a, b.T if tb else b)
        self.a, self.b, self.c = dev.upload(a), dev.upload(b), dev.alloc(m * n)

    def run(self, kernel) -> None:
        m, n, k = self.shape
        kernel(self.c, self.a, self.b, m, n, k, False, 0, 0, 0)

    def correct(self, kernel) -> bool:
        """Whether ``kernel`` matches the float64 product (computed on first use: the large
        timing shapes are never checked, only the small one)."""
        if not hasattr(self, "want"):
            a_op, b_op = self._host
            self.want = a_op.astype(np.float64) @ b_op.astype(np.float64)
        self.dev.upload(np.full(self.want.shape, np.nan, np.float32), self.c)
        self.run(kernel)
        got = self.dev.download(self.c, self.want.shape)
        return bool(np.all(np.abs(got - self.want) <= 1e-4 * np.sqrt(self.shape[2]) + 1e-5))


def _score(dev: Device, kernel, operands: list[_Operands], min_s: float, check: bool = True) -> float:
    """Geometric-mean GFLOP/s of ``kernel`` over ``operands``; 0.0 when it is wrong (``check``)."""
    if check and not operands[0].correct(kernel):
        return 0.0
    logs = []
    for op in operands:
        m, n, k = op.shape
        logs.append(math.log(2.0 * m * n * k / best_seconds(dev, lambda: op.run(kernel), min_s) / 1e9))
    return math.exp(sum(logs) / len(logs))


BUDGET_S = {"GPU": 60.0, "CPU": 30.0}
"""Seconds the tuner may take on a device of each kind (others: the CPU's): it never starts a candidate
it expects to end past its group's share of the budget (shares in proportion to the candidates)."""


def budget_seconds(dev: Device) -> float:
    """The tuning time budget of ``dev`` (``BUDGET_S`` by its kind; ``OPENCL_LLM_TUNE_BUDGET_S`` overrides)."""
    try:
        return max(0.0, float(os.environ["OPENCL_LLM_TUNE_BUDGET_S"]))
    except (KeyError, ValueError):
        return BUDGET_S.get(dev.info.kind, BUDGET_S["CPU"])


def expected_seconds(dev: Device, build_s: float) -> float:
    """Seconds a first tuning of ``dev`` is expected to take, given ``build_s`` seconds per matmul program
    build measured on it: each candidate's builds (about two programs) and its timing (about a quarter
    second), at most the budget (:func:`budget_seconds`), and on GPUs the first model's per-shape timing
    (:func:`shape_configs`). 0.0 when tuning is off or already cached."""
    if is_tuned(dev):
        return 0.0
    n = (sum(len(candidates(dev, v)) for v in tuned_variants(dev)) + len(gemv_candidates(dev))
         + sum(len(narrow_candidates(dev, k)) for k in NARROW_KINDS))
    # GPUs: also the per-shape timing of the first model (shape_configs): SHAPE_GRID built for three variants,
    # and about 5 s of timing (a 30-layer model's ~20 products x ~10 candidates x 25 ms), within its budget
    shapes = min(SHAPE_BUDGET_S, 3 * len(SHAPE_GRID) * build_s + 5.0) if uses_local_tiles(dev) else 0.0
    return min(budget_seconds(dev), n * (2.0 * build_s + 0.25)) + shapes


class _Clock:
    """The tuner's budget: each group of candidates may run until its share of it is spent; a candidate
    whose expected cost (the mean of those so far) would pass that point is not started."""

    def __init__(self, budget_s: float, total: int):
        self.start, self.budget_s, self.total = time.perf_counter(), budget_s, max(total, 1)
        self.given, self.costs = 0, []

    def group(self, n: int) -> float:
        """The deadline (perf_counter seconds) of the next group of ``n`` candidates."""
        self.given += n
        return self.start + self.budget_s * self.given / self.total

    def allows(self, deadline: float, expected: float | None = None) -> bool:
        """Whether a step expected to take ``expected`` seconds (default: the dearest of the last three
        candidates, a compile included) ends by ``deadline``."""
        if expected is None:
            expected = max(self.costs[-3:], default=0.0)
        return time.perf_counter() + expected <= deadline

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def tune(dev: Device, progress: Progress | None = None, budget_s: float | None = None,
         grid: dict | None = None, shape_table: dict | None = None,
         gemv_grid: list[GemvConfig] | None = None, gemv_shapes: list | None = None,
         narrow_grid: dict[str, list[TiledConfig]] | None = None, min_s: float | None = None) -> dict:
    """Time the candidate grid on ``dev`` and return the winners (does not touch the cache).

    Args:
        dev: the device.
        progress: ``progress(fraction 0..1, message)`` after each candidate.
        budget_s: time limit (default :func:`budget_seconds`): each group (a transpose variant, GEMV)
            gets its share; a candidate expected to end past it is skipped. The first candidate of
            each group (the default) always runs.
        grid, shape_table: ``{variant: [configs]}`` / ``{variant: [(M, N, K), ...]}`` overrides
            (tests use a tiny grid); default :func:`candidates` / :func:`shapes`.
        gemv_grid, gemv_shapes: the same for the GEMV kernel (shapes with M <= GEMV_MAX_M).
        narrow_grid: ``{"narrow_n" / "narrow_m": [configs]}`` override of :func:`narrow_candidates` (timed at
            :data:`NARROW_SHAPES`; ``{}``: none; default: none when ``grid`` is given).
        min_s: seconds per timing round (default 0.02 on CPUs, 0.01 on GPUs).

    Returns:
        ``{variant: config, ..., "gemv": GemvConfig, "narrow_n"/"narrow_m": TiledConfig (tiled devices),
        "gflops": {name: GFLOP/s}, "seconds": s,
        "skipped": n, "defaulted": [names]}`` with variant keys for all four transpose cases (untimed
        ones: see :func:`tuned_variants`). A wrong or failing candidate is never kept: a group where
        none was right and fast gets the first fallback configuration that builds (named in
        ``"defaulted"``, no GFLOP/s); ``"skipped"`` counts candidates the budget left out.
    """
    progress = progress or (lambda f, m: None)
    given_grid = grid
    shape_table = shape_table or shapes(dev)
    grid = grid or {v: candidates(dev, v) for v in tuned_variants(dev)}
    gemv_grid = gemv_grid or gemv_candidates(dev)
    gemv_shapes = gemv_shapes or GEMV_SHAPES
    if narrow_grid is None:  # a given grid (tests) times only what it names
        narrow_grid = {k: narrow_candidates(dev, k) for k in NARROW_KINDS} if given_grid is None else {}
    min_s = min_s if min_s is not None else (0.01 if uses_local_tiles(dev) else 0.02)
    budget_s = budget_seconds(dev) if budget_s is None else budget_s
    rng = np.random.default_rng(0)
    clock = _Clock(budget_s, sum(len(g) for g in grid.values()) + len(gemv_grid)
                   + sum(len(g) for g in narrow_grid.values()))
    result: dict = {"gflops": {}, "skipped": 0, "defaulted": []}
    state = {"done": 0}

    for variant, configs in grid.items():
        name = "nt" if variant == (False, True) else "".join("t" if t else "n" for t in variant)
        operands = [_Operands(dev, s, variant, rng) for s in shape_table[variant]]
        make = lambda c, v=variant: GemmKernel(dev, c, *v)  # noqa: E731
        result[variant] = _pick(dev, name, configs, make, operands, min_s, clock, progress, state, result,
                                fallback_configs(dev)[0])
    # untimed variants: TT takes TN's winner, the rest the NT winner (CPUs) or the default
    fallback = result.get((False, True), default_configs(dev)[0])
    for variant in MODEL_VARIANTS:
        result.setdefault(variant, fallback)
    result[(True, True)] = result[(True, False)]
    gemv_ops = [_Operands(dev, s, (False, True), rng) for s in gemv_shapes if s[0] <= GEMV_MAX_M]
    result["gemv"] = _pick(dev, "gemv", gemv_grid, lambda g: GemvKernel(dev, g), gemv_ops, min_s, clock, progress,
                           state, result, fallback_configs(dev)[1])
    for kind, configs in narrow_grid.items():
        if configs:
            variant, table = NARROW_SHAPES[kind]
            operands = [_Operands(dev, s, variant, rng) for s in table]
            try:
                result[kind] = _pick(dev, kind, configs, lambda c, v=variant: GemmKernel(dev, c, *v), operands,
                                     min_s, clock, progress, state, result, configs[:1])
            except RuntimeError as e:  # none right: narrow products take the variant's configuration
                log.warning("matmul tuning %s: %s", kind, e)
                result["defaulted"].remove(kind)
    result["seconds"] = round(clock.elapsed(), 2)
    return result


def _pick(dev: Device, name: str, configs: list, make: Callable, operands: list, min_s: float, clock: _Clock,
          progress: Progress, state: dict, result: dict, fallbacks: list):
    """The fastest right configuration of ``configs`` within the clock's share for this group (see :func:`tune`)."""
    scores, kernels, timing_s = {}, {}, {}
    deadline = clock.group(len(configs))
    for i, cfg in enumerate(configs):
        over = i > 0 and not clock.allows(deadline)
        if over:
            result["skipped"] += 1
        else:
            t0 = time.perf_counter()
            try:
                kernel = make(cfg)
                multiple = getattr(kernel, "limits", None) and kernel.limits.preferred_multiple
                if i > 0 and isinstance(cfg, TiledConfig) and multiple and cfg.items % multiple:
                    raise KernelLimitError(f"{cfg.items} work-items per group are no multiple of the kernel's "
                                           f"preferred {multiple} (idle SIMD lanes)")
                t1 = time.perf_counter()
                score = _score(dev, kernel, operands, min_s)
                timing_s[cfg] = time.perf_counter() - t1
                if score > 0.0:
                    kernels[cfg], scores[cfg] = kernel, score
                else:
                    log.warning("matmul tuning %s: %s gave wrong results on %s; skipped", name, cfg, dev.info.name)
            except (ValueError, KernelBuildError, dev.cl.Error) as e:
                log.info("matmul tuning %s: %s skipped: %s", name, cfg, str(e).splitlines()[0])
            clock.costs.append(time.perf_counter() - t0)
        state["done"] += 1
        best = f"best {max(scores.values()):.3g} GFLOP/s" if scores else "none right yet"  # llvmpipe's GEMV: 0.03
        progress(state["done"] / clock.total, f"matmul tuning {name}: {state['done']}/{clock.total}, {best}, "
                 f"{clock.elapsed():.0f} s of at most {clock.budget_s:.0f} s"
                 + (" (budget spent: skipped)" if over else ""))
    # a shared machine is noisy: re-time the leaders, alternating, and keep each one's best (within the budget)
    leaders = sorted(scores, key=scores.get, reverse=True)[:RETIME]
    for _ in range(2 if len(leaders) > 1 else 0):
        if not clock.allows(deadline, sum(timing_s[c] for c in leaders)):
            break
        for cfg in leaders:
            scores[cfg] = max(scores[cfg], _score(dev, kernels[cfg], operands, min_s, check=False))
    if not scores:  # nothing right in time: the first safe default that builds and is right
        result["defaulted"].append(name)
        for cfg in fallbacks:
            try:
                if operands[0].correct(make(cfg)):
                    log.warning("matmul tuning %s: no candidate right in time; using the default %s", name, cfg)
                    return cfg
            except (ValueError, KernelBuildError, dev.cl.Error) as e:
                log.info("matmul tuning %s: fallback %s skipped: %s", name, cfg, str(e).splitlines()[0])
        raise RuntimeError(f"no matmul configuration for {name} gives right results on {dev.info.name}")
    best = max(scores, key=scores.get)
    log.info("matmul tuning %s: %s at %.1f GFLOP/s", name, best, scores[best])
    result["gflops"][name] = float(f"{scores[best]:.3g}")
    return best


def _encode(result: dict) -> dict:
    out = {"seconds": result.get("seconds"), "gflops": result.get("gflops", {}),
           "skipped": result.get("skipped", 0), "defaulted": result.get("defaulted", [])}
    for key, value in result.items():
        if isinstance(key, tuple):
            out["".join("t" if t else "n" for t in key)] = config_to_dict(value)
    out["gemv"] = config_to_dict(result["gemv"])
    for kind in NARROW_KINDS:
        if kind in result:
            out[kind] = config_to_dict(result[kind])
    return out


def _decode(entry: dict) -> dict:
    out: dict = {}
    for name in ("nn", "nt", "tn", "tt"):
        out[(name[0] == "t", name[1] == "t")] = config_from_dict(entry[name])
    out["gemv"] = config_from_dict(entry["gemv"])
    for kind in NARROW_KINDS:
        if kind in entry:
            out[kind] = config_from_dict(entry[kind])
    out["skipped"], out["defaulted"] = int(entry.get("skipped", 0)), list(entry.get("defaulted", []))
    return out


def read_cache(path: Path) -> dict:
    """The JSON object in one of the tuner's cache files (every device's entries); ``{}`` when the file is
    missing, unreadable or no JSON object (logged)."""
    try:
        data = json.loads(path.read_text("utf-8"))
        if isinstance(data, dict):
            return data
        log.warning("ignoring the matmul cache %s: not a JSON object", path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, RecursionError) as e:  # (RecursionError: JSON nested too deeply)
        log.warning("ignoring the matmul cache %s: %s", path, type(e).__name__ if isinstance(e, RecursionError) else e)
    return {}


def merge_cache(path: Path, key: str, entries: dict, valid: Callable[[Any], dict]) -> None:
    """Write ``entries`` into ``key``'s part of the cache file at ``path`` (atomic replace) over that part's
    ``valid(part)`` entries, other keys kept; a file that cannot be written is logged (the entries then serve this
    process only)."""
    data = read_cache(path)
    data[key] = {**valid(data.get(key)), **entries}
    try:
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True), sync_folder=False)
    except OSError as e:
        log.warning("could not save %s: %s", path.name, e)


def load_cached(dev: Device) -> dict | None:
    """This device's cached tuning result (as :func:`tune` returns it, without timings), or None
    when there is none or the cache file is unreadable."""
    entry = read_cache(cache_path()).get(device_key(dev))
    try:
        return _decode(entry) if entry else None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("ignoring the matmul tuning cache %s: %s", cache_path(), e)
        return None


def save(dev: Device, result: dict) -> Path:
    """Store ``result`` for this device in the cache file (atomic replace; other devices kept)."""
    data = read_cache(cache_path())
    data[device_key(dev)] = _encode(result)
    return atomic_write(cache_path(), json.dumps(data, indent=1, sort_keys=True), sync_folder=False)


def tuned_configs(dev: Device, progress: Progress | None = None, **tune_args: Any) -> dict:
    """The tuned configurations of ``dev``: cached, or measured now and cached (first use).

    Returns ``{}`` when tuning is disabled (``OPENCL_LLM_MATMUL_TUNE=0``), else the dict of
    :func:`tune` (variant keys and ``"gemv"``). Thread-safe: concurrent callers wait for one run.
    A cache that cannot be written is logged and the result used for this process only.
    """
    if not enabled():
        return {}
    with _lock:
        cached = _memo.get(device_key(dev)) or load_cached(dev)
        if cached is None:
            log.info("tuning matmul for %s (once per device and driver)", dev.info.name)
            if progress:
                progress(0.0, f"tuning matmul kernels for {dev.info.name} (first use only)")
            cached = tune(dev, progress=progress, **tune_args)
            try:
                log.info("matmul tuning took %.1f s; saved to %s", cached["seconds"], save(dev, cached))
            except OSError as e:
                log.warning("could not save the matmul tuning result: %s", e)
        _memo[device_key(dev)] = cached
        return cached


_memo: dict[str, dict] = {}  # per process: the cache file is read once per device


def _shape_name(M: int, N: int, K: int, trans_a: bool, trans_b: bool) -> str:
    return f"{'t' if trans_a else 'n'}{'t' if trans_b else 'n'} {M}x{N}x{K}"


def shape_candidates(dev: Device, variant: tuple[bool, bool]) -> list[TiledConfig]:
    """Tiled configurations :func:`shape_configs` times for one product of ``variant``: the variant's tuned one
    first, then :data:`SHAPE_GRID`'s that fit the device."""
    own = tuned_configs(dev).get(variant)
    out = [own] if isinstance(own, TiledConfig) else []
    return out + [c for c in SHAPE_GRID if c not in out and fits(dev, c)]


def shape_configs(dev: Device, shapes, budget_s: float | None = None) -> dict:
    """The fastest ``(configuration, parts)`` measured on ``dev`` for each matrix-matrix product in ``shapes``
    (``(M, N, K, trans_a, trans_b)``, e.g. ``core.model.step_matmuls``), for ``Matmul.use_shape_configs``.

    On devices with local tiles (GPUs) every product that is neither GEMV nor narrow (``narrow_kind``) is
    timed with each of :func:`shape_candidates`, unsplit and, where C has few tiles per compute unit
    (:func:`_part_counts`), with K in the launcher's rule's parts and in each of :data:`SPLIT_PARTS` (whether C's
    tiles then spread evenly over the compute units is measured, not computed), on zero operands of
    its size (one product's at a time: a model of those shapes holds buffers as large), and the winner is
    cached per device key in ``SHAPE_FILE``, so each shape is timed once per device and driver. Candidates
    are checked against numpy on a small product first; a wrong one is never chosen. Timing stops after
    ``budget_s`` (default :data:`SHAPE_BUDGET_S`); untimed shapes are left out of the result.

    Returns:
        ``{(M, N, K, trans_a, trans_b): (TiledConfig, parts)}`` (``parts`` as in ``GemmKernel.splits``: the
        number of K parts measured fastest, 1 unsplit); ``{}`` on CPUs or with tuning off.
    """
    if not enabled() or not uses_local_tiles(dev):
        return {}
    wanted = sorted({(int(M), int(N), int(K), bool(ta), bool(tb)) for M, N, K, ta, tb in shapes
                     if M > 0 and N > 0 and K > 0 and not (tb and not ta and M <= GEMV_MAX_M)
                     and narrow_kind(M, N) is None})
    key = device_key(dev)
    with _shape_lock:  # one timing at a time (concurrent callers wait, then find their shapes timed)
        with _lock:
            if key not in _shape_memo:  # a hand-edited cache's unreadable entries count as untimed
                _shape_memo[key] = _valid_entries(read_cache(user_cache_dir() / SHAPE_FILE).get(key))
            table = _shape_memo[key]
            missing = [s for s in wanted if _shape_name(*s) not in table]
        if missing:
            _time_shapes(dev, missing, table, SHAPE_BUDGET_S if budget_s is None else budget_s)
            with _lock:
                merge_cache(user_cache_dir() / SHAPE_FILE, key, table, _valid_entries)
    return {s: _shape_entry(_shape_name(*s), table[_shape_name(*s)]) for s in wanted if _shape_name(*s) in table}


def _valid_entries(entries) -> dict:
    """The readable entries of one device's part of the shape cache (none when it is no dict)."""
    return {k: v for k, v in entries.items() if _shape_entry(k, v)} if isinstance(entries, dict) else {}


def _shape_entry(name: str, entry) -> tuple[TiledConfig, int] | None:
    """``(configuration, parts)`` of a shape cache entry, or None (logged) when it is not one. An entry of
    before the K parts were timed (a ``"split"`` flag) counts as untimed, silently."""
    if isinstance(entry, dict) and "split" in entry and "parts" not in entry:
        return None
    try:
        cfg = config_from_dict(entry["config"])
        if (not isinstance(cfg, TiledConfig) or type(entry["parts"]) is not int or entry["parts"] < 1
                or not all(type(v) is int for v in vars(cfg).values())):
            raise TypeError("not a tiled configuration of integers and a count of K parts")
        return cfg, entry["parts"]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        log.warning("ignoring the matmul shape cache's entry %r: %s", name, e)
        return None


SPLIT_PARTS = (2, 3, 4, 6, 8)
"""K parts :func:`shape_configs` times a product in besides 1 and the launcher's rule, where C has fewer than
``2 * SPLIT_WAVES`` tiles per compute unit. Measured on an H100 at d1024's weight gradients (8 x 512 tokens:
``benchmarks/matmul_shapes.py``): 1024x2816x4096 in 3 parts 43.6 TFLOP/s, where the rule's 2 gave 30.5 and one
part 31.2 (256x128 tiles); 5632x1024x4096 with 128x64 tiles in 2 parts 42.5, where the rule kept one (39.7):
how evenly C's tiles fill the compute units depends on how many of them fit at once, which only timing tells."""


def _part_counts(kernel: GemmKernel, M: int, N: int, K: int) -> list[int]:
    """The distinct counts of K parts to time a tiled product in: 1, and where C has fewer than
    ``2 * SPLIT_WAVES`` tiles per compute unit also the launcher's rule's and :data:`SPLIT_PARTS` (each as
    ``GemmKernel.splits`` rounds it: parts at least ``SPLIT_MIN_K`` deep, partial products within
    ``SCRATCH_FLOATS``)."""
    cfg = kernel.cfg
    tiles = -(-M // cfg.tsm) * -(-N // cfg.tsn)
    if tiles >= 2 * matmul.SPLIT_WAVES * kernel.dev.info.compute_units:
        return [1]
    return sorted({1, kernel.splits(M, N, K)[0], *(kernel.splits(M, N, K, p)[0] for p in SPLIT_PARTS)})


def _time_shapes(dev: Device, shapes: list, table: dict, budget_s: float) -> None:
    """Time :func:`shape_candidates` on each of ``shapes`` into ``table`` (see :func:`shape_configs`)."""
    from core.kernels.matmul import _Scratch

    t0, rng, scratch = time.perf_counter(), np.random.default_rng(0), _Scratch(dev)
    kernels: dict = {}
    for M, N, K, ta, tb in shapes:
        if time.perf_counter() - t0 > budget_s:
            log.info("matmul shape timing: budget of %.0f s spent; %dx%dx%d and later untimed", budget_s, M, N, K)
            break
        try:
            a, b, c = dev.zeros(M * K), dev.zeros(N * K), dev.zeros(M * N)
        except (dev.cl.Error, MemoryError) as e:  # e.g. larger than the device's largest buffer: left untimed
            log.info("matmul shape timing: %dx%dx%d not timed: %s", M, N, K, str(e).splitlines()[0])
            continue
        best = None
        for cfg in shape_candidates(dev, (ta, tb)):
            if (cfg, ta, tb) not in kernels:
                try:
                    k = GemmKernel(dev, cfg, ta, tb, scratch=scratch)
                    ok = _Operands(dev, (68, 44, 84), (ta, tb), rng).correct(k)
                except (ValueError, KernelBuildError, dev.cl.Error) as e:
                    log.info("matmul shape timing: %s skipped: %s", cfg, str(e).splitlines()[0])
                    ok = False
                kernels[(cfg, ta, tb)] = k if ok else None
            k = kernels[(cfg, ta, tb)]
            if k is None:
                continue
            for parts in _part_counts(k, M, N, K):
                s = best_seconds(dev, lambda: k(c, a, b, M, N, K, False, 0, 0, 0, parts), 0.005)
                log.debug("matmul shape timing %s: %s in %d parts at %.0f GFLOP/s", _shape_name(M, N, K, ta, tb),
                          cfg, parts, 2.0 * M * N * K / s / 1e9)
                if best is None or s < best[0]:
                    best = (s, cfg, parts)
        for buf in (a, b, c):
            buf.release()
        if best is not None:
            table[_shape_name(M, N, K, ta, tb)] = {"config": config_to_dict(best[1]), "parts": best[2],
                                                    "gflops": float(f"{2.0 * M * N * K / best[0] / 1e9:.3g}")}
            log.info("matmul %s: %s%s at %.0f GFLOP/s", _shape_name(M, N, K, ta, tb), best[1],
                     f" in {best[2]} K parts" if best[2] > 1 else "", 2.0 * M * N * K / best[0] / 1e9)


_shape_memo: dict[str, dict] = {}  # per process: the shape cache's entry of each device
_shape_lock = threading.Lock()
