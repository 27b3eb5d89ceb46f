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
from core.kernels import (adamw_ref, attention_ref, cross_entropy_ref, embedding_ref, grad_norm_ref, matmul_ref,
                          rmsnorm_ref, rope_ref, swiglu_ref)

log = logging.getLogger(__name__)

# (module in core.kernels, launcher class) in the order they are built.
LAUNCHERS = [("embedding", "Embedding"), ("rmsnorm", "RMSNorm"),
             ("matmul", "Matmul"), ("rope", "RoPE"), ("attention", "Attention"), ("swiglu", "SwiGLU"),
             ("cross_entropy", "CrossEntropy"), ("adamw", "AdamW"), ("grad_norm", "GradNorm")]


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


def _check_ops(dev: Device, ops: dict, rng: np.random.Generator) -> list[OpCheck]:
    """Compare the launches of each available op that training and generation make (``core.model``)
    with its numpy reference (``core/kernels/<op>_ref.py``, the one the tests use) on small random
    inputs of odd sizes."""
    out: list[OpCheck] = []

    def run(name, tol, fn):
        if fn is None:
            return
        try:
            err = float(fn())
            out.append(OpCheck(name, err, tol, bool(np.isfinite(err) and err <= tol)))
        except Exception as e:  # report, keep checking the other ops
            out.append(OpCheck(name, float("nan"), tol, False, f"{type(e).__name__}: {e}"))

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def err(buf, want) -> float:
        return float(np.abs(dev.download(buf, want.shape) - want).max())

    if "embedding" in ops:
        def embedding():
            n, vocab, d = 13, 50, 24
            tokens, w = rng.integers(0, vocab, n).astype(np.int32), f32(vocab, d)
            o = dev.alloc(n * d)
            ops["embedding"].forward(o, dev.upload(tokens), dev.upload(w), n, d, vocab)
            return err(o, embedding_ref.embedding_forward(tokens, w))
        run("embedding", 0.0, embedding)
    if "matmul" in ops:
        def matmul(trans_b):
            M, N, K = 67, 45, 33
            a, b = f32(M, K), f32(N, K) if trans_b else f32(K, N)
            c = dev.alloc(M * N)
            ops["matmul"](c, dev.upload(a), dev.upload(b), M, N, K, trans_b=trans_b)
            return err(c, matmul_ref.matmul_forward(a, b, trans_b=trans_b))
        run("matmul", 1e-4, lambda: matmul(False))
        run("matmul (B transposed)", 1e-4, lambda: matmul(True))
    if "rmsnorm" in ops:
        def rmsnorm():
            rows, dim = 7, 96
            x, w = f32(rows, dim), f32(dim)
            o, rstd = dev.alloc(rows * dim), dev.alloc(rows)
            ops["rmsnorm"].forward(o, rstd, dev.upload(x), dev.upload(w), rows, dim, 1e-5)
            return err(o, rmsnorm_ref.rmsnorm_forward(x, w, 1e-5)[0])

        def rmsnorm_residual():  # x_sum = a + b, then the norm: every layer's two residual adds
            rows, dim = 7, 96
            a, b, w = f32(rows, dim), f32(rows, dim), f32(dim)
            x_sum, o, rstd = dev.alloc(rows * dim), dev.alloc(rows * dim), dev.alloc(rows)
            ops["rmsnorm"].forward_residual(x_sum, o, rstd, dev.upload(a), dev.upload(b), dev.upload(w), rows, dim,
                                            1e-5)
            return max(err(x_sum, a + b), err(o, rmsnorm_ref.rmsnorm_forward(a + b, w, 1e-5)[0]))

        def rmsnorm_backward():  # d_x added to (the residual stream's gradient), d_weight accumulated
            rows, dim = 7, 96
            x, w, d_out, dx0 = f32(rows, dim), f32(dim), f32(rows, dim), f32(rows, dim)
            want_y, want_rstd = rmsnorm_ref.rmsnorm_forward(x, w, 1e-5)
            want_dx, want_dw = rmsnorm_ref.rmsnorm_backward(d_out, x, w, 1e-5)
            dx, dw = dev.upload(dx0), dev.upload(np.zeros(dim, np.float32))
            ops["rmsnorm"].backward(dx, dw, dev.upload(d_out), dev.upload(x), dev.upload(w), dev.upload(want_rstd),
                                    rows, dim, accumulate=True)
            return max(err(dx, dx0 + want_dx), err(dw, want_dw))
        run("RMSNorm", 1e-4, rmsnorm)
        run("RMSNorm after the residual add", 1e-4, rmsnorm_residual)
        run("RMSNorm backward", 1e-4, rmsnorm_backward)
    if "rope" in ops:
        n, h, kvh, d, seq, pos, theta = 10, 3, 1, 16, 5, 2, 10000.0
        qd, kd = h * d, kvh * d

        def rope_split():  # the QKV matmul's rows -> q, k (rotated) and v
            qkv = f32(n, qd + 2 * kd)
            q, k, v = dev.alloc(n * qd), dev.alloc(n * kd), dev.alloc(n * kd)
            ops["rope"].split_qkv(q, k, v, dev.upload(qkv), n, seq, h, kvh, d, pos, theta)
            return max(err(q, rope_ref.rope_forward(qkv[:, :qd].reshape(n, h, d), seq, pos, theta)),
                       err(k, rope_ref.rope_forward(qkv[:, qd:qd + kd].reshape(n, kvh, d), seq, pos, theta)),
                       err(v, qkv[:, qd + kd:]))

        def rope_join():  # the gradients of q, k, v -> rows of the QKV matmul's gradient
            dq, dk, dv = f32(n, h, d), f32(n, kvh, d), f32(n, kd)
            d_qkv = dev.alloc(n * (qd + 2 * kd))
            ops["rope"].join_qkv(d_qkv, dev.upload(dq), dev.upload(dk), dev.upload(dv), n, seq, h, kvh, d, pos,
                                 theta)
            want = np.concatenate([rope_ref.rope_backward(dq, seq, pos, theta).reshape(n, qd),
                                   rope_ref.rope_backward(dk, seq, pos, theta).reshape(n, kd), dv], axis=1)
            return err(d_qkv, want)
        run("RoPE (QKV split)", 1e-5, rope_split)
        run("RoPE backward (QKV join)", 1e-5, rope_join)
    if "swiglu" in ops:
        rows, f = 5, 37

        def swiglu():  # on the [gate | up] rows of the fused matmul
            gu = f32(rows, 2 * f)
            o = dev.alloc(rows * f)
            ops["swiglu"].forward_fused(o, dev.upload(gu), rows, f)
            return err(o, swiglu_ref.swiglu_forward(gu[:, :f], gu[:, f:]))

        def swiglu_backward():
            gu, d_out = f32(rows, 2 * f), f32(rows, f)
            d_gu = dev.alloc(rows * 2 * f)
            ops["swiglu"].backward_fused(d_gu, dev.upload(d_out), dev.upload(gu), rows, f)
            return err(d_gu, np.concatenate(swiglu_ref.swiglu_backward(d_out, gu[:, :f], gu[:, f:]), axis=1))
        run("SwiGLU", 1e-5, swiglu)
        run("SwiGLU backward", 1e-5, swiglu_backward)
    if "attention" in ops:
        def attention():  # builds the kernels for head_dim 32 (the default model's), GQA 2
            s, h, kvh, d = 21, 4, 2, 32
            q, k, v = f32(1, s, h, d), f32(1, s, kvh, d), f32(1, s, kvh, d)
            o, lse = dev.alloc(q.size), dev.alloc(h * s)
            ops["attention"].forward(o, lse, dev.upload(q), dev.upload(k), dev.upload(v), 1, s, s, 0, h, kvh, d)
            return err(o, attention_ref.attention_forward(q, k, v)[0])
        run("attention", 1e-4, attention)
    if "cross_entropy" in ops:
        rows, vocab = 9, 300

        def cross_entropy(backward: bool):  # training: losses and d_logits in one launch
            logits = f32(rows, vocab) * 3
            targets = rng.integers(0, vocab, rows).astype(np.int32)
            mask = (np.arange(rows) % 4 != 3).astype(np.float32)
            losses, d_logits = dev.alloc(rows), dev.alloc(rows * vocab)
            args = (dev.upload(logits), dev.upload(targets), dev.upload(mask), rows, vocab)
            want = cross_entropy_ref.cross_entropy_forward(logits, targets, mask)
            if not backward:
                ops["cross_entropy"].forward(losses, *args)
                return err(losses, want)
            ops["cross_entropy"].forward_backward(losses, d_logits, *args, 0.25)
            return max(err(losses, want),
                       err(d_logits, cross_entropy_ref.cross_entropy_backward(logits, targets, mask, 0.25)))
        run("cross-entropy", 1e-4, lambda: cross_entropy(False))
        run("cross-entropy with its gradient", 1e-4, lambda: cross_entropy(True))
    if "adamw" in ops:
        def adamw():
            n, hp = 300, dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
            p, g, m, v = f32(n), f32(n), f32(n) * 0.1, np.abs(f32(n)) * 0.1
            bufs = [dev.upload(a) for a in (p, g, m, v)]
            ops["adamw"].step(*bufs, n, step=3, grad_scale=0.5, **hp)
            want = adamw_ref.adamw_step(p, g, m, v, step=3, grad_scale=0.5, **hp)[0].astype(np.float32)
            return err(bufs[0], want)
        run("AdamW", 1e-5, adamw)
    if "grad_norm" in ops:
        def grad_norm():
            x = f32(5000)
            o = dev.alloc(1)
            ops["grad_norm"].sum_squares(o, 0, dev.upload(x), x.size)
            want = grad_norm_ref.sum_squares(x)
            return abs(float(dev.download(o, (1,))[0]) - want) / want
        run("gradient norm (relative)", 1e-5, grad_norm)
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
    result.checks = _check_ops(dev, ops, np.random.default_rng(1234))
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
