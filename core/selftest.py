"""Device check: build every kernel, compare the launches training and generation make with their
numpy references, time a matmul.

The GUI's "Test device" button and ``gui.selftest`` (the bundle's ``--self-test``) call
:func:`check_device`. Progress and cancellation go through plain callables, so no Qt is needed here.
"""
from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from core.device import Device

log = logging.getLogger(__name__)

# (module in core.kernels, launcher class) in the order they are built.
LAUNCHERS = [("embedding", "Embedding"), ("rmsnorm", "RMSNorm"),
             ("matmul", "Matmul"), ("rope", "RoPE"), ("attention", "Attention"), ("swiglu", "SwiGLU"),
             ("cross_entropy", "CrossEntropy"), ("adamw", "AdamW"), ("sums", "Sums")]


class CheckCancelled(Exception):
    """``should_stop`` returned True between two steps of the check."""


@dataclass
class OpCheck:
    """One op compared with numpy: largest absolute error and the tolerance it had to meet."""

    name: str
    max_abs_err: float
    tolerance: float
    ok: bool
    error: str = ""


@dataclass
class DeviceCheck:
    """What :func:`check_device` found.

    Attributes:
        device: the device label.
        build_s: seconds spent building (or loading from the cache) every kernel.
        build_errors: ``{launcher: message}`` of kernels that failed to build or import.
        checks: numpy comparisons.
        matmul_gflops: measured float32 matmul speed (None when the matmul kernel is unusable).
    """

    device: str
    build_s: float = 0.0
    build_errors: dict[str, str] = field(default_factory=dict)
    checks: list[OpCheck] = field(default_factory=list)
    matmul_gflops: float | None = None

    @property
    def ok(self) -> bool:
        return not self.build_errors and bool(self.checks) and all(c.ok for c in self.checks)


def _check_ops(dev: Device, ops: dict) -> list[OpCheck]:
    """Each built op's ``selfcheck`` (``core/kernels/<op>_ref.py``, the one its test calls too): the
    launches training and generation make (``core.model``) against the numpy reference on small
    random inputs of odd sizes. An op whose check raises is reported by its module name."""
    out: list[OpCheck] = []
    for module, op in ops.items():
        ref = importlib.import_module(f"core.kernels.{module}_ref")
        try:
            out += [OpCheck(c.name, c.max_abs_err, c.tolerance, c.ok) for c in ref.selfcheck(dev, op)]
        except Exception as e:  # report, keep checking the other ops
            out.append(OpCheck(module, float("nan"), 0.0, False, f"{type(e).__name__}: {e}"))
    return out


def _matmul_gflops(dev: Device, matmul, size: int, budget_s: float,
                   should_stop: Callable[[], bool]) -> float:
    """float32 GFLOP/s of ``size`` x ``size`` x ``size`` matmuls, timed for about ``budget_s``."""
    rng = np.random.default_rng(0)
    a = dev.upload(rng.standard_normal((size, size)).astype(np.float32))
    b = dev.upload(rng.standard_normal((size, size)).astype(np.float32))
    c = dev.alloc(size * size)
    matmul(c, a, b, size, size, size)  # warm-up (first launch may finish compiling)
    dev.finish()
    reps, t0 = 0, time.perf_counter()
    while reps < 200 and not should_stop():
        matmul(c, a, b, size, size, size)
        dev.finish()
        reps += 1
        if time.perf_counter() - t0 >= budget_s:
            break
    dt = time.perf_counter() - t0
    return 2.0 * size ** 3 * reps / max(dt, 1e-9) / 1e9


def check_device(dev: Device, progress: Callable[[float, str], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, matmul_size: int = 512,
                 budget_s: float = 1.0) -> DeviceCheck:
    """Build every kernel on ``dev``, check ops against numpy, and measure matmul speed.

    Args:
        dev: the opened device.
        progress: called with (fraction 0..1, message) before each step.
        should_stop: polled between steps; when it returns True, :class:`CheckCancelled` is raised.
        matmul_size: side of the square matrices timed.
        budget_s: roughly how long to time the matmul.

    Returns:
        A :class:`DeviceCheck`; build failures and wrong results are reported in it, not raised.
    """
    progress = progress or (lambda f, m: None)
    should_stop = should_stop or (lambda: False)
    result = DeviceCheck(dev.info.label)
    ops: dict = {}
    n = len(LAUNCHERS)
    t0 = time.perf_counter()
    for i, (module, cls) in enumerate(LAUNCHERS):
        if should_stop():
            raise CheckCancelled()
        progress(0.8 * i / n, f"building {module}.cl ({i + 1}/{n})")
        try:
            launcher = getattr(importlib.import_module(f"core.kernels.{module}"), cls)
            if module == "matmul":  # its first use on a device tunes it (cached): show that
                from core.kernels import matmul_tune

                tuned = matmul_tune.tuned_configs(dev, progress=lambda f, m, i=i: progress(0.8 * (i + f) / n, m))
                ops[module] = launcher(dev, tuned=tuned)
            else:
                ops[module] = launcher(dev)
        except Exception as e:  # a missing module or a build log: report it per kernel
            log.warning("kernel %s unusable on %s: %s", module, dev.info.label, e)
            result.build_errors[module] = f"{type(e).__name__}: {e}"
    result.build_s = time.perf_counter() - t0
    if should_stop():
        raise CheckCancelled()
    progress(0.8, "comparing results with numpy")
    result.checks = _check_ops(dev, ops)
    if "matmul" in ops and should_stop() is False:
        progress(0.9, f"timing a {matmul_size}x{matmul_size} matmul")
        try:
            result.matmul_gflops = _matmul_gflops(dev, ops["matmul"], matmul_size, budget_s, should_stop)
        except Exception as e:
            result.checks.append(OpCheck("matmul timing", float("nan"), 0.0, False, f"{type(e).__name__}: {e}"))
    if should_stop():
        raise CheckCancelled()
    progress(1.0, "done")
    return result
