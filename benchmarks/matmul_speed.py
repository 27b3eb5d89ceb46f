"""Matmul kernel GFLOP/s next to numpy's (float32, same machine, same run), at the shapes one
training step uses and at decode (GEMV) shapes. Not a test.

    python benchmarks/matmul_speed.py [--device N|NAME] [--models default,d512] [--shapes nt:1x384x128,...]
                                      [--untuned] [--reps 5]

For each model (default: 16 x 128 token rows, d_model 128, ffn_dim 384, vocab 1024, 2 layers;
d512: d_model 512, ffn_dim 1536, 4 layers) prints every distinct product of a training step
(nt = x @ W.T of the forward, nn = dY @ W of the input gradient, tn = dY.T @ X of the weight
gradient) with the best-of-rounds GFLOP/s of our Matmul launcher and of numpy, alternating, then
the matmul time of one whole step (each shape times how often a step runs it). Then the decode
shapes (one token row: the GEMV kernel). The launcher uses this device's tuned configuration (it
tunes now if there is none, showing progress); --untuned uses the untuned defaults.

numpy's OpenBLAS reads OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE at import; a fair reference unsets
them: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/matmul_speed.py``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from core.device import open_device  # noqa: E402
from core.kernels import matmul_autotune  # noqa: E402
from core.kernels.matmul import Matmul  # noqa: E402

VARIANTS = {"nn": (False, False), "nt": (False, True), "tn": (True, False), "tt": (True, True)}
MODELS = {"default": dict(n=16 * 128, d=128, f=384, vocab=1024, layers=2),
          "d512": dict(n=16 * 128, d=512, f=1536, vocab=1024, layers=4)}


def step_shapes(n: int, d: int, f: int, vocab: int, layers: int) -> list[tuple[str, tuple[int, int, int], int]]:
    """(variant, (M, N, K), times per step) of every product in one training step (core/model.py,
    n_kv_heads == n_heads)."""
    return [("nt", (n, d, d), 4 * layers), ("nt", (n, f, d), 2 * layers), ("nt", (n, d, f), layers),
            ("nt", (n, vocab, d), 1),
            ("nn", (n, d, d), 4 * layers), ("nn", (n, f, d), layers), ("nn", (n, d, f), 2 * layers),
            ("nn", (n, d, vocab), 1),
            ("tn", (d, d, n), 4 * layers), ("tn", (d, f, n), layers), ("tn", (f, d, n), 2 * layers),
            ("tn", (vocab, d, n), 1)]


def decode_shapes(d: int, f: int, vocab: int) -> list[tuple[str, tuple[int, int, int], int]]:
    """The products of one decode token (M = 1), once each."""
    return [("nt", (1, d, d), 1), ("nt", (1, f, d), 1), ("nt", (1, d, f), 1), ("nt", (1, vocab, d), 1)]


def best_seconds(fn, finish, rounds: int, min_seconds: float = 0.03) -> float:
    """Best seconds per call over ``rounds`` rounds, each repeating ``fn`` for >= ``min_seconds``."""
    fn()
    finish()
    t0 = time.perf_counter()
    fn()
    finish()
    inner = max(1, int(min_seconds / max(time.perf_counter() - t0, 1e-6)))
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        finish()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def bench(dev, mm: Matmul, variant: str, m: int, n: int, k: int, reps: int) -> tuple[float, float]:
    """(ours, numpy) seconds for one product, alternating rounds; exits on a wrong result."""
    trans_a, trans_b = VARIANTS[variant]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    A, B, C = dev.upload(a), dev.upload(b), dev.alloc(m * n)
    a_op, b_op = (a.T if trans_a else a), (b.T if trans_b else b)

    def ours():
        mm(C, A, B, m, n, k, trans_a=trans_a, trans_b=trans_b)

    ours()
    want = a_op.astype(np.float64) @ b_op
    err = np.abs(dev.download(C, (m, n)) - want).max()
    if err > 1e-3 * np.sqrt(k) * max(1.0, np.abs(want).max()):
        raise SystemExit(f"wrong result for {variant} {m}x{n}x{k}: max error {err}")
    t_ours = t_np = float("inf")
    for _ in range(reps):  # alternate, so both see the same machine load
        t_ours = min(t_ours, best_seconds(ours, dev.finish, 1))
        t_np = min(t_np, best_seconds(lambda: a_op @ b_op, lambda: None, 1))
    return t_ours, t_np


def table(dev, mm, title, shapes, reps) -> None:
    print(f"\n{title}\n{'op':>3s} {'M x N x K':>16s} {'x/step':>6s} {'ours GFLOP/s':>13s} "
          f"{'numpy GFLOP/s':>14s} {'ratio':>6s}")
    total_ours = total_np = 0.0
    for variant, (m, n, k), count in shapes:
        t_ours, t_np = bench(dev, mm, variant, m, n, k, reps)
        f = 2.0 * m * n * k / 1e9
        total_ours += count * t_ours
        total_np += count * t_np
        print(f"{variant:>3s} {f'{m}x{n}x{k}':>16s} {count:>6d} {f / t_ours:>13.1f} {f / t_np:>14.1f} "
              f"{t_np / t_ours:>6.2f}", flush=True)
    print(f"    all of it: ours {total_ours * 1e3:.2f} ms, numpy {total_np * 1e3:.2f} ms, "
          f"ratio {total_np / total_ours:.2f} (numpy time / ours)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="device index or name (default: preferred)")
    ap.add_argument("--models", default="default,d512", help=f"comma-separated, of {','.join(MODELS)}")
    ap.add_argument("--shapes", default=None, help="extra products, comma-separated VARIANT:MxNxK (e.g. nt:1x384x128)")
    ap.add_argument("--untuned", action="store_true", help="use the untuned default configurations")
    ap.add_argument("--reps", type=int, default=5, help="alternating timing rounds per shape")
    args = ap.parse_args()
    if args.untuned:
        os.environ[matmul_autotune.ENV_VAR] = "0"
    dev = open_device(args.device)
    print(f"device: {dev.info.label}")
    t0 = time.perf_counter()
    mm = Matmul(dev, tuned=matmul_autotune.tuned_configs(dev, progress=lambda f, msg: print(f"\r  {msg}", end="", flush=True)))
    print(f"\rconfigurations ({'untuned' if args.untuned else 'tuned'}; set up in {time.perf_counter() - t0:.1f} s):")
    for name in ("nn", "nt", "tn"):
        print(f"  {name}: {mm.config(*VARIANTS[name])}")
    print(f"  gemv (M <= 8, nt): {mm.gemv_config}")
    for name in args.models.split(","):
        shape = MODELS[name]
        table(dev, mm, f"training step, model {name} ({shape})", step_shapes(**shape), args.reps)
        table(dev, mm, f"decode, one token, model {name}",
              decode_shapes(shape["d"], shape["f"], shape["vocab"]), args.reps)
    if args.shapes:
        extra = []
        for spec in args.shapes.split(","):
            variant, size = spec.split(":")
            extra.append((variant, tuple(int(v) for v in size.lower().split("x")), 1))
        table(dev, mm, "extra shapes", extra, args.reps)


if __name__ == "__main__":
    main()
