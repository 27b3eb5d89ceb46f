"""Our quantized matmul (core/kernels/qmatmul.py) next to our float32 matmul on the same shapes, in one
run, interleaved (float, quantized, float, ... best of --reps); and the device memory of SmolLM2's
frozen base in its formats, LoRA against a full fine-tune. Not a test.

    python benchmarks/qmatmul_speed.py [--device N] [--formats Q4_1,Q8_0] [--ms 256,1] [--reps 5]
                                       [--shapes 1536x576,576x1536,576x576] [--tune] [--memory FILE]

Shapes are W's (n_out, n_in) (SmolLM2-135M: q/o 576x576, k/v 192x576, gate/up 1536x576, down
576x1536). For each shape, M (rows of x: 256 = a training micro-batch, 1 = decode) and format it prints
ms per call of the forward ``x @ W.T`` and the input gradient ``dy @ W``, float and quantized, and the
ratio float / quantized (> 1: the quantized one is faster). ``--tune`` runs the float matmul's tuner
first (its tuned configuration; the quantized kernels have no tuner yet).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

from core.device import open_device  # noqa: E402
from core.kernels.matmul import Matmul  # noqa: E402
from core.kernels.qmatmul import QMatmul, QTiledConfig, file_matrices, frozen_matrix_bytes, upload_weight  # noqa: E402


def lora_memory(path: str, batch: int, seq: int, rank: int) -> dict[str, int]:
    """Device bytes of training a GGUF model: a full float32 fine-tune with AdamW vs LoRA of ``rank`` on
    every linear layer of every block over the base's matrices kept in their formats.

    Full: ``core.model.memory_bytes`` (weights, gradients, two moments and the update guard's copies:
    28 bytes a parameter; activations of ``batch`` x ``seq`` tokens; matmul scratch). LoRA: the frozen
    matrices' bytes (:func:`core.kernels.qmatmul.frozen_matrix_bytes`), the 1-D tensors in float32, 28
    bytes per adapter parameter (A (r, n_in) and B (n_out, r) of each target), the same activations
    and scratch plus the adapters' x @ A.T rows (batch * seq * r per target). Returns bytes by name.
    """
    from core.gguf_import import read_config
    from core.model import activation_sizes, memory_bytes
    from core.kernels.matmul import scratch_bound_floats
    from core.model import step_matmuls

    cfg, _notes, _kv = read_config(path)
    cfg = type(cfg)(**{**cfg.to_dict(), "context_length": seq})
    full, _largest = memory_bytes(cfg, batch)
    tensors = file_matrices(path)
    quant, f32 = frozen_matrix_bytes(tensors)
    vectors = 4 * sum(int(np.prod(s)) for _n, _q, s in tensors if len(s) == 1)
    targets = [(n, s) for n, _q, s in tensors if len(s) == 2 and n.startswith("blk.")]
    adapter = sum(rank * (s[0] + s[1]) for _n, s in targets)
    acts = 4 * sum(sum(v) for v in activation_sizes(cfg, batch, seq, True).values())
    scratch = 4 * scratch_bound_floats(step_matmuls(cfg, batch * seq, True))
    lora = quant + vectors + 28 * adapter + acts + scratch + 4 * batch * seq * rank * len(targets)
    return {"full": full, "lora": lora, "frozen_quant": quant, "frozen_f32": f32, "adapter_params": adapter,
            "activations": acts, "scratch": scratch}


def best_ms(fn, finish, inner: int) -> float:
    finish()
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    finish()
    return (time.perf_counter() - t0) / inner * 1e3


def weight(rng, qtype, n_out: int, n_in: int) -> np.ndarray:
    w = rng.standard_normal((n_out, n_in)).astype(np.float32) * 0.05
    if qtype == Q.F16:
        return w.astype(np.float16)
    if qtype == Q.F32:
        return w
    return quants.quantize(w, qtype)  # Q8_0, Q4_0, Q4_1, BF16 (gguf-py has no K-quant quantizer)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--formats", default="Q4_1,Q8_0")
    ap.add_argument("--ms", default="256,1")
    ap.add_argument("--shapes", default="1536x576,576x1536,576x576")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--family", default=None, help="tiled or packed (default: the device's)")
    ap.add_argument("--tiled", default=None, help="TSM,TSN,TSK,WPTM,WPTN of the tiled family, e.g. 128,128,16,8,8")
    ap.add_argument("--memory", default=None, help="a GGUF file: print the LoRA vs full memory figure")
    args = ap.parse_args()
    if args.memory:
        for batch in (1, 4, 8):
            m = lora_memory(args.memory, batch=batch, seq=256, rank=16)
            if batch == 1:
                print(f"{args.memory}: frozen matrices {m['frozen_quant'] / 2**20:.1f} MiB in their formats, "
                      f"{m['frozen_f32'] / 2**20:.1f} MiB as float32 ({m['frozen_quant'] / m['frozen_f32']:.1%}); "
                      f"LoRA r=16 adapter {m['adapter_params']} parameters")
            print(f"batch {batch} x 256: full fine-tune {m['full'] / 2**20:.0f} MiB, LoRA {m['lora'] / 2**20:.0f} MiB "
                  f"({m['lora'] / m['full']:.1%}); activations {m['activations'] / 2**20:.0f} MiB in both")
    dev = open_device(args.device)
    tuned = None
    if args.tune:
        from core.kernels import matmul_autotune
        tuned = matmul_autotune.tuned_configs(dev, progress=lambda f, m: None)
    tiled = QTiledConfig(*map(int, args.tiled.split(","))) if args.tiled else None
    mm, qm = Matmul(dev, tuned=tuned), QMatmul(dev, family=args.family, tiled=tiled)
    print(f"device: {dev.info.label}; float nt {mm.config(False, True)}, nn {mm.config(False, False)}; "
          f"quantized {qm.family} {qm.config(Q[args.formats.split(',')[0]])}")
    print(f"{'shape':>10s} {'M':>4s} {'fmt':>5s} {'fwd f32':>8s} {'fwd q':>8s} {'ratio':>6s} "
          f"{'dx f32':>8s} {'dx q':>8s} {'ratio':>6s}")
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        n_out, n_in = map(int, shape.split("x"))
        for M in map(int, args.ms.split(",")):
            x, dy = (rng.standard_normal((M, k)).astype(np.float32) for k in (n_in, n_out))
            X, DY, Y, DX = dev.upload(x), dev.upload(dy), dev.alloc(M * n_out), dev.alloc(M * n_in)
            for name in args.formats.split(","):
                qtype = Q[name]
                data = weight(rng, qtype, n_out, n_in)
                w = upload_weight(dev, data, qtype, (n_out, n_in))
                W = dev.upload(quants.dequantize(np.ascontiguousarray(data).view(np.uint8).reshape(n_out, -1), qtype)
                               .astype(np.float32))
                runs = {"ff": lambda: mm(Y, X, W, M, n_out, n_in, trans_b=True),
                        "fq": lambda: qm.forward(Y, X, w, M),
                        "bf": lambda: mm(DX, DY, W, M, n_in, n_out),
                        "bq": lambda: qm.input_grad(DX, DY, w, M)}
                inner = 3 if M > 8 else 50
                for fn in runs.values():  # warm-up: builds
                    fn()
                best = {k: float("inf") for k in runs}
                for _ in range(args.reps):  # interleaved
                    for k, fn in runs.items():
                        best[k] = min(best[k], best_ms(fn, dev.finish, inner))
                print(f"{shape:>10s} {M:4d} {name:>5s} {best['ff']:8.3f} {best['fq']:8.3f} "
                      f"{best['ff'] / best['fq']:6.2f} {best['bf']:8.3f} {best['bq']:8.3f} "
                      f"{best['bf'] / best['bq']:6.2f}", flush=True)


if __name__ == "__main__":
    main()
