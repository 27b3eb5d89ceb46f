"""Our Matmul kernel next to cuBLAS SGEMM (torch, float32, TF32 off) on square products, in one run,
alternating. Not a test; for a machine with an NVIDIA GPU and its OpenCL driver.

    python benchmarks/matmul_vs_cublas.py [--device NVIDIA] [--sizes 1024,2048,4096] [--reps 5] [--no-shapes]

Prints GFLOP/s of each (best of --reps rounds of 10 products) and the ratio ours / cuBLAS for the
NT case (``x @ W.T``, the forward of a linear layer) and NN. As in a Model, each product takes the tiling
measured fastest for its shape (``matmul_autotune.shape_configs``: timed now if not cached), else the
tuned configuration of its variant (tuned now if the device has none); ``--no-shapes``: always the latter.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="NVIDIA")
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-shapes", action="store_true", help="the variants' tuned tilings, no per-shape choice")
    args = ap.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = open_device(args.device)
    mm = Matmul(dev, tuned=matmul_autotune.tuned_configs(dev, progress=lambda f, m: print(f"  {m}", flush=True)))
    print(f"device: {dev.info.label}; tiled config NT: {mm.config(False, True)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    if not args.no_shapes:  # as a Model does: each product's fastest tiling on this device (timed once, cached)
        mm.use_shape_configs(matmul_autotune.shape_configs(dev, [(n, n, n, False, tb) for n in sizes
                                                                 for tb in (True, False)]))
    rng = np.random.default_rng(0)
    for n in sizes:
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        da, db, dc = dev.upload(a), dev.upload(b), dev.alloc(n * n)
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        for name, tb_ in (("nt", True), ("nn", False)):
            mm(dc, da, db, n, n, n, trans_b=tb_)
            got = dev.download(dc, (n, n))
            ref = (ta @ (tb.T if tb_ else tb)).cpu().numpy()
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            ours, theirs = [], []
            for _ in range(args.reps):
                dev.finish()
                t0 = time.perf_counter()
                for _ in range(10):
                    mm(dc, da, db, n, n, n, trans_b=tb_)
                dev.finish()
                ours.append((time.perf_counter() - t0) / 10)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(10):
                    (ta @ (tb.T if tb_ else tb))
                torch.cuda.synchronize()
                theirs.append((time.perf_counter() - t0) / 10)
            flop = 2.0 * n ** 3
            g1, g2 = flop / min(ours) / 1e9, flop / min(theirs) / 1e9
            print(f"{name} {n}^3: ours {g1:8.0f} GFLOP/s  cuBLAS {g2:8.0f} GFLOP/s  ratio {g1 / g2:.2f}  "
                  f"(rel. err {err:.1e}) {mm.shape_config(n, n, n, False, tb_) or mm.config(False, tb_)}", flush=True)


if __name__ == "__main__":
    main()
