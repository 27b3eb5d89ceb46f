"""Every matmul of one training step of a compare.py shape, ours next to a reference SGEMM in one run,
alternating: cuBLAS (torch, TF32 off) for a GPU device, numpy's BLAS (all cores) for a CPU device
(``--reference`` chooses otherwise). Not a test.

    python benchmarks/matmul_shapes.py [--device NVIDIA] [--shapes d512,d768] [--reps 10]
                                       [--batch 16 --seq 128] [--reference cublas|numpy] [--no-split]

For each distinct (transposes, M, N, K) of the step (forward ``x @ W.T`` = nt, backward
``dy @ W`` = nn and ``dy.T @ x`` = tn) it prints ms per call of each, the ratio, and the step's
matmul total weighted by the calls per step. ``--no-split`` times ours also without split K
(the same tiling in one part), so the effect of splitting shows in the same run. As in a Model, each
product takes the tiling measured fastest for its shape on this device (GPUs: ``shape_configs``, timed once and
cached); ``--no-shapes`` gives every product its transpose variant's tuned tiling instead.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from benchmarks.compare import SHAPES  # noqa: E402
from core.device import open_device  # noqa: E402
from core.kernels import matmul_autotune  # noqa: E402
from core.kernels.matmul import Matmul  # noqa: E402
from core.model import loss_chunks, loss_rows  # noqa: E402


def step_matmuls(c, tokens: int) -> Counter:
    """{(trans_a, trans_b, M, N, K): calls per training step} of core/model.py's forward/backward."""
    n, d, kv, f, v = tokens, c.d_model, c.kv_dim, c.ffn_dim, c.vocab_size
    calls: Counter = Counter()
    for out, inp in ((d + 2 * kv, d), (d, d), (2 * f, d), (d, f)):  # qkv, attn_output, gate_up, down
        calls[(False, True, n, out, inp)] += c.n_layers       # forward  y = x @ W.T
        calls[(False, False, n, inp, out)] += c.n_layers      # backward dx = dy @ W
        calls[(True, False, out, inp, n)] += c.n_layers       # backward dW += dy.T @ x
    for _, rows in loss_chunks(n, loss_rows(c, n)):  # the loss head, in chunks of rows
        calls[(False, True, rows, v, d)] += 1
        calls[(False, False, rows, d, v)] += 1
        calls[(True, False, v, d, rows)] += 1
    return calls


class Reference:
    """The SGEMM ours is compared with: ``cublas`` (torch on the GPU, TF32 off) or ``numpy`` (its BLAS)."""

    def __init__(self, name: str):
        self.name = "cuBLAS" if name == "cublas" else "numpy"
        if name == "cublas":
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False
            self._torch = torch

    def operands(self, a, b, ta, tb):
        if self.name == "cuBLAS":
            a, b = self._torch.from_numpy(a).cuda(), self._torch.from_numpy(b).cuda()
        return (a.T if ta else a), (b.T if tb else b)  # numpy hands the transposes to BLAS, no copy

    def result(self, c) -> np.ndarray:
        return c.cpu().numpy() if self.name == "cuBLAS" else c

    def sync(self) -> None:
        if self.name == "cuBLAS":
            self._torch.cuda.synchronize()


def timed(fn, sync, reps: int, inner: int = 10, settle: float = 0.3) -> float:
    """Best seconds per call over ``reps`` runs of ``inner`` calls, after ``settle`` seconds of rest and
    one untimed call: the other side's threads (a BLAS's spinning workers) are idle and ours awake."""
    time.sleep(settle)
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="NVIDIA")
    ap.add_argument("--shapes", default="d512,d768")
    # best of 10: on a shared 2-core VM best-of-3 read SmolLM2's small products (256 x 576 x 576) at 0.57-0.60
    # of numpy's sgemm, best-of-10 in the same hour 0.84-0.92 (the step's total 0.83 -> 0.93)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--no-split", action="store_true", help="also time ours without split K")
    ap.add_argument("--no-shapes", action="store_true", help="every product with its variant's tuned tiling "
                    "(no per-shape choice, core.kernels.matmul_autotune.shape_configs)")
    ap.add_argument("--reference", choices=("cublas", "numpy"), help="default: numpy on a CPU device, else cublas")
    args = ap.parse_args()
    dev = open_device(args.device)
    ref = Reference(args.reference or ("numpy" if dev.is_cpu else "cublas"))
    mm = Matmul(dev, tuned=matmul_autotune.tuned_configs(dev, progress=lambda f, m: None))
    print(f"device: {dev.info.label}; configs nn {mm.config(False, False)}, nt {mm.config(False, True)}, "
          f"tn {mm.config(True, False)}")
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        cfg = SHAPES[shape]
        calls = step_matmuls(cfg, args.batch * min(args.seq, cfg.context_length))
        # what a Model does: each product with its fastest tiling measured on this device (GPUs; cached)
        mm.use_shape_configs({} if args.no_shapes else matmul_autotune.shape_configs(
            dev, [(M, N, K, ta, tb) for ta, tb, M, N, K in calls]))
        tot = Counter()
        print(f"\n{shape}: {'case':26s} {'calls':>5s} {'ours ms':>8s} {'nosplit':>8s} {ref.name:>8s} "
              f"{'ratio':>6s} {'TFLOP/s':>7s}")
        for (ta, tb, M, N, K), count in sorted(calls.items()):
            a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
            b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
            da, db, dc = dev.upload(a), dev.upload(b), dev.alloc(M * N)
            oa, ob = ref.operands(a, b, ta, tb)
            run = lambda: mm(dc, da, db, M, N, K, trans_a=ta, trans_b=tb, accumulate=ta)  # noqa: E731
            run()
            got = dev.download(dc, (M, N))
            want = ref.result(oa @ ob)
            err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30)) if not ta else 0.0
            ours = timed(run, dev.finish, args.reps)
            theirs = timed(lambda: oa @ ob, ref.sync, args.reps)
            kern, parts = mm._route(M, N, K, ta, tb)
            tiled = hasattr(kern.cfg, "tsm")  # CPUs' packed kernel and GEMV never split K
            nosplit = float("nan")
            if args.no_split:
                nosplit = timed(lambda: kern(dc, da, db, M, N, K, ta, 0, 0, 0, parts=1) if tiled else run(),
                                dev.finish, args.reps)
                tot["nosplit"] += nosplit * count
            tot["ours"] += ours * count
            tot["ref"] += theirs * count
            name = f"{'t' if ta else 'n'}{'t' if tb else 'n'} {M}x{N}x{K}"
            parts = kern.splits(M, N, K, parts)[0] if tiled else 1
            print(f"  {name:26s} {count:5d} {ours * 1e3:8.3f} {nosplit * 1e3:8.3f} {theirs * 1e3:8.3f} "
                  f"{theirs / ours:6.2f} {2 * M * N * K / ours / 1e12:7.1f}  split {parts} {kern.cfg}"
                  + (f" err {err:.0e}" if err > 1e-5 else ""), flush=True)
        print(f"  step total: ours {tot['ours'] * 1e3:.2f} ms (no split {tot['nosplit'] * 1e3:.2f}), {ref.name} "
              f"{tot['ref'] * 1e3:.2f} ms: ratio {tot['ref'] / tot['ours']:.2f}")


if __name__ == "__main__":
    main()
