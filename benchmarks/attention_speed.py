"""Attention forward+backward speed, new flash-style kernels vs the old row-wise ones, and the
device memory of a long-context training step against ``core.estimates``. Not a test.

    python benchmarks/attention_speed.py [--device N|NAME] [--reps 5] [--shape B,T,H,KVH,D]
    python benchmarks/attention_speed.py --memory [--context 2048 --d-model 512 --layers 2 --batch 1]
    python benchmarks/attention_speed.py --options --shape 8,512,9,3,64 [--reps 15] [--phase backward]
                                         [--torch-device cuda]

Speed: times ``Attention.forward`` + ``Attention.backward`` (core/kernels/attention.cl) and the
row-wise kernels it replaced (benchmarks/attention_rowwise.cl, which store the (B, heads, T, T)
probabilities) on the same inputs in one process run, alternating, and prints the median
milliseconds, GFLOP/s (causal: 2 T^2 H D B for the forward, 2.5x that for the backward) and the
speedup. Default shape: the default training step's (batch 16, T 128, 4 heads, head_dim 32).

Options (``--options``): the forward alone and the backward alone, each kernel option that
``core.kernels.attention_autotune`` times on GPUs (per-row or staged forward, staged or blocked backward) against
the reference option, interleaved, median ms; with ``--torch-device``, then PyTorch's attention of a training step
(``scaled_dot_product_attention`` as benchmarks/torch_llama.py calls it) forward alone and backward alone.

Memory (``--memory``): builds a training ``Model`` at the given size (the trainer allocates nothing more), runs
one training step,
and prints the bytes of the device buffers it allocated (``Device.allocated_bytes``), the
process's resident-memory growth (on a CPU device buffers live in host memory) and
``core.estimates.training_memory_bytes``.
"""
from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from core.device import open_device  # noqa: E402
from core.kernels.attention import Attention  # noqa: E402

HERE = Path(__file__).parent


class RowwiseAttention:
    """The old kernels: one work-group of ``local`` items per query row, probs (B, H, T, T)."""

    def __init__(self, dev, local: int = 64):
        header = (HERE.parent / "core" / "kernels" / "group_reduce.h").read_text()
        src = (HERE / "attention_rowwise.cl").read_text().replace('#include "group_reduce.h"', header)
        prg = dev.build_source("attention_rowwise.cl", src)
        self.dev = dev
        self.fwd, self.bwd_q, self.bwd_kv = prg.attention_forward, prg.attention_backward, prg.attention_backward_kv
        self.local = local

    def forward_backward(self, bufs, b, s, h, kvh, d):
        cl, L, q = self.dev.cl, self.local, self.dev.queue
        lm = lambda n: cl.LocalMemory(4 * max(1, n))  # noqa: E731
        scale = np.float32(1 / math.sqrt(d))
        O, P, DS, Q, K, V, DO, DQ, DK, DV = (bufs[n] for n in ("O", "P", "DS", "Q", "K", "V", "DO", "DQ", "DK", "DV"))
        self.fwd(q, (b * h * s * L,), (L,), O, P, Q, K, V, np.int32(s), np.int32(s), np.int32(0),
                 np.int32(h), np.int32(kvh), np.int32(d), scale, lm(s), lm(d), lm(L))
        self.bwd_q(q, (b * h * s * L,), (L,), DQ, DS, DO, K, V, P, np.int32(s), np.int32(h), np.int32(kvh),
                   np.int32(d), scale, lm(s), lm(d), lm(L))
        L2 = min(L, 1 << (d - 1).bit_length())
        self.bwd_kv(q, (b * kvh * s * L2,), (L2,), DK, DV, DS, P, Q, DO, np.int32(s), np.int32(h),
                    np.int32(kvh), np.int32(d), scale)


def bench_speed(dev, b, s, h, kvh, d, reps):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, s, h, d)).astype(np.float32)
    k = rng.standard_normal((b, s, kvh, d)).astype(np.float32)
    v = rng.standard_normal((b, s, kvh, d)).astype(np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    bufs = {"Q": dev.upload(q), "K": dev.upload(k), "V": dev.upload(v), "DO": dev.upload(do),
            "O": dev.alloc(q.size), "DQ": dev.alloc(q.size), "DK": dev.alloc(k.size), "DV": dev.alloc(v.size),
            "P": dev.alloc(b * h * s * s), "DS": dev.alloc(b * h * s * s), "LSE": dev.alloc(b * h * s),
            "DSUM": dev.alloc(b * h * s)}
    new, old = Attention(dev), RowwiseAttention(dev)
    B = bufs

    def run_new():
        new.forward(B["O"], B["LSE"], B["Q"], B["K"], B["V"], b, s, s, 0, h, kvh, d)
        new.backward(B["DQ"], B["DK"], B["DV"], B["DSUM"], B["DO"], B["Q"], B["K"], B["V"], B["O"], B["LSE"],
                     b, s, h, kvh, d)

    def run_old():
        old.forward_backward(B, b, s, h, kvh, d)

    results = {"new": [], "old": []}
    grads = {}
    for name, fn in (("new", run_new), ("old", run_old)):  # warm-up (builds), and the gradients
        fn()
        dev.finish()
        grads[name] = [dev.download(B[n], shp) for n, shp in (("DQ", q.shape), ("DK", k.shape), ("DV", v.shape))]
    diff = max(float(np.abs(a - c).max()) for a, c in zip(grads["new"], grads["old"]))
    for _ in range(reps):
        for name, fn in (("new", run_new), ("old", run_old)):
            t0 = time.perf_counter()
            fn()
            dev.finish()
            results[name].append(time.perf_counter() - t0)
    flop = 2.0 * s * s * h * d * b * 3.5  # causal half of 2 matmuls forward (x2) and 5 backward
    print(f"attention forward+backward  batch {b}, T {s}, heads {h}/{kvh}, head_dim {d}  ({dev.info.label})")
    for name in ("old", "new"):
        t = float(np.median(results[name]))
        print(f"  {name}: {t * 1e3:8.2f} ms  {flop / t / 1e9:6.2f} GFLOP/s  (runs: "
              + " ".join(f"{x * 1e3:.1f}" for x in results[name]) + ")")
    print(f"  speedup new/old: {np.median(results['old']) / np.median(results['new']):.2f}x; "
          f"largest gradient difference {diff:.2g}")


def bench_options(dev, b, s, h, kvh, d, reps, phases=("forward", "backward")):
    """Every forward and backward option core.kernels.attention_autotune times on this device (on a CPU, as a
    dry run, those of a GPU-like tiling), interleaved per round; each against its reference option."""
    from core.kernels import attention, attention_autotune

    if not attention.default_tiles(dev, d).bwd_tile:  # a CPU: the GPU's tiling, to check the path (speed means nothing)
        gpu = attention.AttentionTiles(64, 1, 16, 1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=128)
        attention.default_tiles = lambda dev, head_dim, max_items=None: gpu
    step = attention_autotune.StepBuffers(dev, b, s, h, kvh, d)
    fwd, bwd = attention_autotune.options(dev, d)
    flop = {True: 2.0 * s * s * h * d * b, False: 2.0 * s * s * h * d * b * 2.5}  # causal halves
    print(f"attention options  batch {b}, T {s}, heads {h}/{kvh}, head_dim {d}  ({dev.info.label})")
    for opts, forward in ((fwd, True), (bwd, False)):
        if ("forward" if forward else "backward") not in phases:
            continue
        run = step.forward if forward else step.backward
        if not forward:
            step.forward(Attention(dev))
        ops, want, diff = {}, None, {}
        for option in opts:
            name = attention_autotune.label(option)
            try:  # as core.kernels.attention_autotune builds it (and a Model given that choice)
                op = Attention(dev)
                op.use_tiling(d, option)
                if any(getattr(op.tiles(d), f) != v for f, v in option.items() if not f.endswith("items")):
                    raise ValueError(f"built as {op.tiles(d)}")
                run(op)
            except Exception as e:  # noqa: BLE001  (an option whose compiled kernel does not fit: reported)
                print(f"  {name}: skipped: {str(e).splitlines()[0]}")
                continue
            got = step.results(forward)
            want = got if want is None else want  # (the reference's: it runs first; if it fails, nothing is compared)
            ops[name], diff[name] = op, max(float(np.abs(g - w).max()) for g, w in zip(got, want))
        times = {name: [] for name in ops}
        for _ in range(reps):
            for name, op in ops.items():
                t0 = time.perf_counter()
                run(op)
                dev.finish()
                times[name].append(time.perf_counter() - t0)
        if attention_autotune.label(opts[0]) not in times:
            print(f"  the reference ({attention_autotune.label(opts[0])}) did not run: no comparison")
            continue
        ref = float(np.median(times[attention_autotune.label(opts[0])]))
        for name, ts in times.items():
            t = float(np.median(ts))
            print(f"  {name:>22}: {t * 1e3:8.3f} ms  {flop[forward] / t / 1e9:8.1f} GFLOP/s  {ref / t:5.2f}x the "
                  f"reference  max difference {diff[name]:.2g}")
    step.release()


def bench_torch(b, s, h, kvh, d, reps, device):
    """PyTorch's attention of a training step (benchmarks/torch_llama.py: K and V repeated over each group, then
    ``scaled_dot_product_attention``, causal; float32, TF32 off) on the same shape: forward alone and backward
    alone (gradients of q, k and v from one recorded forward), median ms, as :func:`bench_options` prints ours."""
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, n, s, d, generator=g).to(device).requires_grad_() for n in (h, kvh, kvh))
    d_out = torch.randn(b, h, s, d, generator=g).to(device)
    group = h // kvh

    def forward():
        kk, vv = (k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)) if group > 1 else (k, v)
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, scale=1.0 / math.sqrt(d))

    out = forward()
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    times = {"forward": [], "backward": []}
    for _ in range(reps + 1):
        sync()
        t0 = time.perf_counter()
        forward()
        sync()
        t1 = time.perf_counter()
        torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
        sync()
        times["forward"].append(t1 - t0)
        times["backward"].append(time.perf_counter() - t1)
    flop = {"forward": 2.0 * s * s * h * d * b, "backward": 2.0 * s * s * h * d * b * 2.5}
    for name, ts in times.items():
        t = float(np.median(ts[1:]))  # the first: warm-up
        print(f"  torch {torch.__version__} {name}: {t * 1e3:8.3f} ms  {flop[name] / t / 1e9:8.1f} GFLOP/s")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_memory(dev, context, d_model, layers, heads, batch, vocab):
    from core.config import ModelConfig
    from core.estimates import training_memory_bytes
    from core.model import Model

    cfg = ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=heads, n_kv_heads=heads,
                      ffn_dim=d_model * 3, context_length=context)
    rss0, alloc0 = _rss_bytes(), dev.allocated_bytes
    t0 = time.perf_counter()
    model = Model(dev, cfg, batch_size=batch, seed=0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, size=(batch, context + 1)).astype(np.int32)
    stats = model.forward_backward(tokens[:, :-1], tokens[:, 1:], np.ones((batch, context), np.float32))
    assert model.optimizer_step(1e-3, 0.01, 0.9, 0.98, 1e-8)
    dev.finish()
    dt = time.perf_counter() - t0
    allocated = dev.allocated_bytes - alloc0
    grown = _rss_bytes() - rss0
    est = training_memory_bytes(cfg, batch)
    tt = 4 * batch * heads * context * context
    mib = 2 ** 20
    print(f"training step at context {context}, d_model {d_model}, {layers} layers, {heads} heads, batch {batch}, "
          f"vocab {vocab} ({cfg.n_params() / 1e6:.2f}M params): loss {stats.loss:.3f}, {dt:.1f} s "
          f"(with building the model)")
    print(f"  device buffers allocated: {allocated / mib:8.1f} MiB")
    print(f"  process RSS growth:       {grown / mib:8.1f} MiB   (peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")
    print(f"  estimate (Hyperparameters tab): {est / mib:8.1f} MiB  -> allocated/estimate "
          f"{allocated / est:.3f}, RSS growth/estimate {grown / est:.3f}")
    print(f"  one (T x T) buffer per layer would add {tt * layers / mib:.1f} MiB (probs), "
          f"+{tt / mib:.1f} MiB (d_scores)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shape", default="16,128,4,4,32", help="batch,T,n_heads,n_kv_heads,head_dim")
    ap.add_argument("--memory", action="store_true", help="measure a long-context training step instead")
    ap.add_argument("--options", action="store_true",
                    help="the forward's and the backward's kernel options apart (what GPUs choose from)")
    ap.add_argument("--phase", default="forward,backward", choices=("forward", "backward", "forward,backward"),
                    help="with --options: the forward's options, the backward's, or both")
    ap.add_argument("--torch-device", default=None,
                    help="with --options: also PyTorch's attention (scaled_dot_product_attention) on this device")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=1024)
    a = ap.parse_args(argv)
    dev = open_device(a.device)
    if a.memory:
        bench_memory(dev, a.context, a.d_model, a.layers, a.heads, a.batch, a.vocab)
    elif a.options:
        bench_options(dev, *map(int, a.shape.split(",")), a.reps, a.phase.split(","))
        if a.torch_device:
            bench_torch(*map(int, a.shape.split(",")), a.reps, a.torch_device)
    else:
        bench_speed(dev, *map(int, a.shape.split(",")), a.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
