"""Training throughput (tokens/s) and matmul GFLOP/s on one OpenCL device. Not a test.

    python benchmarks/train_speed.py [--device N|NAME] [--steps 10] [--batch 16]

Prints, for the default config and a larger one (d_model 512, 4 layers): parameters, seconds per
step and learned tokens per second over timed steps after warm-up steps; then the Matmul kernel's
GFLOP/s next to numpy's (float32, same machine) for the shapes a training step uses.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from core.config import ModelConfig  # noqa: E402
from core.device import open_device  # noqa: E402
from core.kernels import matmul_autotune  # noqa: E402
from core.kernels.matmul import Matmul  # noqa: E402
from core.model import Model  # noqa: E402


def bench_training(dev, config: ModelConfig, batch: int, seq: int, steps: int, warmup: int = 2) -> dict:
    model = Model(dev, config, batch_size=batch, seed=0, max_seq=seq)  # as the trainer sizes it
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, size=(batch, seq + 1)).astype(np.int32)
    x, y, m = tokens[:, :-1], tokens[:, 1:], np.ones((batch, seq), np.float32)
    for _ in range(warmup):
        model.forward_backward(x, y, m)
        model.optimizer_step(1e-3, 0.01, 0.9, 0.98, 1e-8)
    dev.finish()
    t0 = time.perf_counter()
    for _ in range(steps):
        model.forward_backward(x, y, m)
        model.optimizer_step(1e-3, 0.01, 0.9, 0.98, 1e-8)
    dev.finish()
    dt = (time.perf_counter() - t0) / steps
    return {"params": config.n_params(), "s_per_step": dt, "tokens_per_s": batch * seq / dt}


def bench_matmul(dev, m: int, n: int, k: int, reps: int = 5) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    mm = Matmul(dev, tuned=matmul_autotune.tuned_configs(dev))
    A, B, C = dev.upload(a), dev.upload(b), dev.alloc(m * n)
    mm(C, A, B, m, n, k, trans_b=True)
    dev.finish()
    t0 = time.perf_counter()
    for _ in range(reps):
        mm(C, A, B, m, n, k, trans_b=True)
    dev.finish()
    ours = 2 * m * n * k * reps / (time.perf_counter() - t0) / 1e9
    a @ b.T
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b.T
    ref = 2 * m * n * k * reps / (time.perf_counter() - t0) / 1e9
    return ours, ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--skip-large", action="store_true")
    args = ap.parse_args()
    dev = open_device(args.device)
    print(f"device: {dev.info.label}")
    configs = [("default", ModelConfig(vocab_size=1024), 128)]
    if not args.skip_large:
        configs.append(("d_model 512, 4 layers", ModelConfig(vocab_size=1024, d_model=512, n_layers=4, n_heads=8,
                                                              n_kv_heads=8, ffn_dim=1536, context_length=128), 128))
    print(f"{'config':24s} {'params':>10s} {'s/step':>8s} {'tokens/s':>10s}   (batch {args.batch})")
    for name, cfg, seq in configs:
        r = bench_training(dev, cfg, args.batch, seq, args.steps)
        print(f"{name:24s} {r['params']:>10,d} {r['s_per_step']:>8.3f} {r['tokens_per_s']:>10,.0f}")
    print(f"\n{'matmul (M x N x K)':24s} {'ours GFLOP/s':>13s} {'numpy GFLOP/s':>14s}")
    for m, n, k in ((2048, 384, 128), (2048, 128, 384), (2048, 1024, 128), (1024, 1024, 1024)):
        ours, ref = bench_matmul(dev, m, n, k)
        print(f"{f'{m} x {n} x {k}':24s} {ours:>13.1f} {ref:>14.1f}")


if __name__ == "__main__":
    main()
