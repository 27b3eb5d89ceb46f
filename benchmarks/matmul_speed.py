"""Matmul kernel GFLOP/s next to numpy's (float32, same machine), per shape and transpose. Not a test.

    python benchmarks/matmul_speed.py [--device N|NAME] [--sizes 1024x384x128,...] [--trans nn,nt,tn]

For each M x N x K and transpose variant (nn: C = A @ B, nt: A @ B.T as in a linear layer's
forward, tn: A.T @ B as in its weight gradient, tt: A.T @ B.T) prints the best of --reps timed
rounds for the Matmul launcher (with the tiling it chose for this device) and for numpy on the
same operands. Shared machines are noisy: the best round is the figure to compare.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from core.device import open_device  # noqa: E402
from core.kernels.matmul import Matmul  # noqa: E402

DEFAULT_SIZES = "1024x384x128,2048x384x384,2048x1536x384,2048x384x1536,1024x1024x1024,1x4096x384"
VARIANTS = {"nn": (False, False), "nt": (False, True), "tn": (True, False), "tt": (True, True)}


def best_gflops(fn, flops: float, reps: int, min_seconds: float = 0.05) -> float:
    """Best GFLOP/s over ``reps`` rounds; each round repeats ``fn`` for at least ``min_seconds``."""
    fn()
    t0 = time.perf_counter()
    fn()
    inner = max(1, int(min_seconds / max(time.perf_counter() - t0, 1e-6)))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return flops / best / 1e9


def bench(dev, mm: Matmul, m: int, n: int, k: int, trans_a: bool, trans_b: bool,
          reps: int) -> tuple[float, float]:
    """(ours, numpy) GFLOP/s for one shape and transpose variant."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    A, B, C = dev.upload(a), dev.upload(b), dev.alloc(m * n)

    def ours():
        mm(C, A, B, m, n, k, trans_a=trans_a, trans_b=trans_b)
        dev.finish()

    ours()
    want = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    err = np.abs(dev.download(C, (m, n)) - want).max()
    if err > 1e-3 * np.sqrt(k) * max(1.0, np.abs(want).max()):
        raise SystemExit(f"wrong result for {m}x{n}x{k} trans_a={trans_a} trans_b={trans_b}: {err}")
    a_op, b_op = (a.T if trans_a else a), (b.T if trans_b else b)
    flops = 2.0 * m * n * k
    return best_gflops(ours, flops, reps), best_gflops(lambda: a_op @ b_op, flops, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="device index or name (default: preferred)")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated MxNxK")
    ap.add_argument("--trans", default="nn,nt,tn", help=f"comma-separated, of {','.join(VARIANTS)}")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    dev = open_device(args.device)
    mm = Matmul(dev)
    print(f"device: {dev.info.label}")
    for name in args.trans.split(","):
        t = mm.tiles(*VARIANTS[name])
        print(f"  {name}: {t.kernel} C tile {t.tsm}x{t.tsn}, {t.wptm}x{t.wptn} per work-item, "
              f"work-group {t.local[0]}x{t.local[1]}" + (f", K tile {t.tsk}" if t.kernel == "matmul_tiled" else ""))
    print(f"\n{'M x N x K':>18s} {'op':>3s} {'ours GFLOP/s':>13s} {'numpy GFLOP/s':>14s} {'ratio':>6s}")
    for size in args.sizes.split(","):
        m, n, k = (int(v) for v in size.lower().split("x"))
        for name in args.trans.split(","):
            ours, ref = bench(dev, mm, m, n, k, *VARIANTS[name], reps=args.reps)
            print(f"{size:>18s} {name:>3s} {ours:>13.1f} {ref:>14.1f} {ours / ref:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
