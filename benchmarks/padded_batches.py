"""Steps of batches padded shorter than the longest one, with the nearest measured shape's matmul tilings and
without. Not a test.

    python benchmarks/padded_batches.py [--device N|NAME] [--shape smol135] [--lengths 512,448,384,320,256]
                                        [--steps 5] [--rounds 3]

The app's trainer sizes its model for its longest batch (``Model.max_seq``) and pads each batch to its own
longest row, so most steps multiply the same weights over fewer rows than the model was sized for. On GPUs
each product of the full-size step runs the tiling measured fastest for its shape
(``core.kernels.matmul_autotune.shape_configs``); a shorter step's products take the choice of the nearest
measured shape (``Matmul.near_shape_ratio``, default ``NEAR_SHAPE_RATIO``) or, with the ratio 1.0, their
transpose variant's tiling. Two models of ``--shape`` (``benchmarks/compare.py``'s shapes; batch and longest
row from there) share the weights, one of each rule; at each length both take ``--steps`` full steps
(forward, backward, clip, AdamW), alternating ``--rounds`` times. Printed: tokens/s of each (best round; the
medians follow) and how many of the step's products each ran with a measured tiling. On CPUs nothing is
measured per shape and both rows are the same code.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from benchmarks.compare import SHAPE_BATCH, SHAPES, Ours, timed_round  # noqa: E402
from core.device import open_device  # noqa: E402
from core.model import init_weights, step_matmuls  # noqa: E402


def measured_products(model, rows: int) -> int:
    """How many of a step's products over ``rows`` tokens run a per-shape tiling (exact or nearest)."""
    mm = model.ops.matmul
    return sum(mm.shape_config(M, N, K, ta, tb) is not None
               for M, N, K, ta, tb in step_matmuls(model.config, rows, True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--shape", default="smol135", choices=sorted(SHAPES))
    ap.add_argument("--lengths", default=None, help="padded lengths (default: the longest, then 7/8 .. 1/2 of it)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    dev = open_device(a.device)
    config = SHAPES[a.shape]
    batch, seq = SHAPE_BATCH.get(a.shape, (16, 128))
    lengths = [int(s) for s in a.lengths.split(",")] if a.lengths else [seq * k // 8 for k in (8, 7, 6, 5, 4)]
    weights = init_weights(config, 0)
    near, exact = Ours(dev, config, batch, weights, seq), Ours(dev, config, batch, weights, seq)
    exact.model.ops.matmul.near_shape_ratio = 1.0
    print(f"{dev.info.label}: {a.shape}, batch {batch}, model sized for {seq} tokens a row")
    rng = np.random.default_rng(0)
    for t in lengths:
        tokens = rng.integers(0, config.vocab_size, size=(batch, t + 1)).astype(np.int32)
        args = (tokens[:, :-1], tokens[:, 1:], np.ones((batch, t), np.float32))
        for e in (near, exact):  # warm-up: kernels of these shapes built
            e.step(*args)
            e.sync()
        times = {"near": [], "exact": []}
        for _ in range(a.rounds):
            times["near"].append(timed_round(near, args, a.steps))
            times["exact"].append(timed_round(exact, args, a.steps))
        n_tok = batch * t
        counts = [measured_products(e.model, n_tok) for e in (near, exact)]
        total = len(step_matmuls(config, n_tok, True))
        best = {k: n_tok / min(v) for k, v in times.items()}
        med = {k: n_tok / statistics.median(v) for k, v in times.items()}
        print(f"length {t}: nearest {best['near']:,.0f} tok/s ({counts[0]}/{total} products measured), "
              f"exact only {best['exact']:,.0f} ({counts[1]}/{total}): {best['near'] / best['exact']:.3f}x "
              f"(medians {med['near'] / med['exact']:.3f}x)", flush=True)


if __name__ == "__main__":
    main()
