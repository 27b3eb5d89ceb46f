"""Device check: build every kernel, compare the launches training and generation make with their
numpy references, time a matmul; and the installation's self-test built on it.

The GUI's "Test device" button calls :func:`check_device`. Progress and cancellation go through plain
callables, so no Qt is needed here. :func:`run_self_test` is ``opencl-llm-studio --self-test`` (the
bundle's too): it proves an installation (or the packaged executable) works, without a window.
"""
from __future__ import annotations

import importlib
import logging
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from core.device import Device

log = logging.getLogger(__name__)

# (module in core.kernels, launcher class) in the order they are built.
LAUNCHERS = [("embedding", "Embedding"), ("rmsnorm", "RMSNorm"),
             ("matmul", "Matmul"), ("rope", "RoPE"), ("attention", "Attention"), ("swiglu", "SwiGLU"),
             ("cross_entropy", "CrossEntropy"), ("adamw", "AdamW"), ("sums", "Sums"), ("decode", "DecodeLayer")]


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
                from core.kernels import matmul_autotune

                tuned = matmul_autotune.tuned_configs(dev, progress=lambda f, m, i=i: progress(0.8 * (i + f) / n, m))
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


# ------------------------------------------------------------------------------------ self-test
PRETRAIN_STEPS, TUNE_STEPS, BATCH = 6, 4, 4  # the self-test's Tiny training run

Record = Callable[[str, bool, str], None]  # (step name, passed, detail)


def _printer(stream) -> Callable[[str], None]:
    def emit(line: str) -> None:
        if stream is not None:  # a windowed executable on Windows may have no stdout
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass
    return emit


def run_self_test(stream: TextIO | None = None, device: str | int | None = None) -> int:
    """``opencl-llm-studio --self-test``: list devices; check the best device (kernels build, ops match
    numpy, matmul speed); train the Tiny preset for a few steps on the default dataset; generate an
    answer; save a checkpoint and export a GGUF into a temporary folder and read it back. Prints one
    line per step and a summary to ``stream`` (default stdout).

    Returns:
        The exit code: 0 when every step passed, 1 otherwise (a failure is a line, never a bare traceback).
    """
    say = _printer(stream if stream is not None else sys.stdout)
    t_start = time.perf_counter()
    results: list[tuple[str, bool, str]] = []

    def record(name: str, ok: bool, detail: str) -> None:
        results.append((name, ok, detail))
        say(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}")

    try:
        dev = _device_step(record, say, device)
        trainer = _training_step(record, dev)
        from core.chat import ChatSession
        from core.generate import SamplingSettings

        answer = ChatSession(trainer.generator(), trainer.tokenizer).answer(
            "Where is Brindlewick?", SamplingSettings(max_tokens=12))
        record("generation", True, f"answer {answer!r}")
        _export_step(record, trainer)
    except Exception as e:  # report any failure as a line, never a bare traceback
        record("self-test", False, f"{type(e).__name__}: {e}")
        say(traceback.format_exc())

    ok = bool(results) and all(r[1] for r in results)
    say(f"self-test {'passed' if ok else 'FAILED'}: {sum(r[1] for r in results)}/{len(results)} steps ok "
        f"in {time.perf_counter() - t_start:.1f} s")
    return 0 if ok else 1


def _device_step(record: Record, say: Callable[[str], None], device: str | int | None) -> Device:
    """The devices listed, the chosen one opened and checked (:func:`check_device`)."""
    from core.device import list_devices, open_device, select_device

    devices = list_devices()
    for d in devices:
        say(f"  device {d.index}: {d.label}")
    record("devices", True, f"{len(devices)} found")
    info = select_device(device)
    dev = open_device(info)
    check = check_device(dev, matmul_size=256, budget_s=0.3)
    bad = [c.name for c in check.checks if not c.ok] + list(check.build_errors)
    speed = f", matmul {check.matmul_gflops:.1f} GFLOP/s" if check.matmul_gflops else ""
    record("device check", check.ok, f"{info.label}: kernels built in {check.build_s:.1f} s, "
           + (f"failed: {', '.join(bad)}" if bad else f"{len(check.checks)} ops match numpy") + speed)
    return dev


def _training_step(record: Record, dev: Device):
    """The Tiny preset trained PRETRAIN_STEPS + TUNE_STEPS steps on the default dataset; the Trainer."""
    from core.config import PRESETS, replace
    from core.dataset import default_dataset
    from core.trainer import StepReport, Trainer

    mc, tc = PRESETS["Tiny"]
    tc = replace(tc, pretrain=replace(tc.pretrain, steps=PRETRAIN_STEPS, batch_size=BATCH, warmup_steps=2),
                 dialogues=replace(tc.dialogues, steps=TUNE_STEPS, batch_size=BATCH, warmup_steps=1))
    t0 = time.perf_counter()
    trainer = Trainer(default_dataset(), mc, tc, dev)
    losses = [ev.loss for ev in trainer.run(recall=False) if isinstance(ev, StepReport)]
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    record("training", finite and len(losses) == PRETRAIN_STEPS + TUNE_STEPS,
           f"{len(losses)} steps in {time.perf_counter() - t0:.1f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}"
           if losses else "no steps ran")
    return trainer


def _export_step(record: Record, trainer) -> None:
    """A checkpoint saved, loaded and exported as an F16 GGUF, read back with the same shapes."""
    from core.checkpoint import load_model, save_trainer
    from core.gguf_io import export_gguf, import_gguf

    with tempfile.TemporaryDirectory(prefix="opencl-llm-selftest-") as tmp:
        ckpt = save_trainer(trainer, Path(tmp) / "checkpoint")
        res = export_gguf(load_model(ckpt), Path(tmp) / "selftest.gguf", dtype="f16")
        back = import_gguf(res.path)
        same = back.config.n_params() == trainer.model_config.n_params()
        record("GGUF export", same, f"{res.size_bytes / 1e6:.2f} MB F16, read back "
               + ("with the same shapes" if same else "with DIFFERENT shapes"))
