"""Our OpenCL engine next to PyTorch (training) and llama.cpp (chat decode), same shapes. Not a test.

    python benchmarks/compare.py [--device N|NAME] [--shapes default,d512] [--steps 5] [--rounds 3]
                                 [--torch-device cpu|cuda] [--torch-compile] [--profile]
                                 [--no-decode] [--decode-tokens 100] [--decode-gguf FILE [--requantize TYPE]]
                                 [--decode-only]
                                 [--lora RANK [--lora-only]]

Training: a full step (forward, backward, grad-norm clip to 1.0, AdamW; float32) on identical
shapes (batch 16 x 128 tokens unless --batch/--seq), ours and torch alternating in one process run
(ours, torch, ours, torch ... ``--rounds`` times, ``--steps`` timed steps each after warm-up) so
machine noise hits both alike. The table gives the best round of each (on a shared machine the
least disturbed round is the closest to the real speed; the medians follow the table). PyTorch runs the same
llama architecture (benchmarks/torch_llama.py) with ``torch.set_num_threads(os.cpu_count())``.
Before timing, both models get the same weights and their logits are compared (max |diff| printed).

Shapes: ``default`` (core.config ModelConfig defaults), ``d512`` (d_model 512, 4 layers, 8 heads,
ffn 1536), ``d768`` (d_model 768, 12 layers, 12 heads, ffn 2048, vocab 8192, context 512), ``smol135``
(SmolLM2-135M's shape: d_model 576, 30 layers, 9/3 heads, ffn 1536, vocab 49152, tied embeddings) and
``d1024`` (349M: d_model 1024, 24 layers, 16/8 heads, ffn 2816, vocab 32000), both at 8 x 512 tokens.

Decode: the default model (random weights, a BPE tokenizer trained on the default dataset) is
exported as an F32 GGUF (core/gguf_io.py); our Generator (core/generate.py) and llama.cpp
(llama-cpp-python, n_threads = cores) each feed a 16-token prompt and then decode
``--decode-tokens`` tokens one at a time, greedy (argmax on the host for both), alternating.
``--decode-gguf FILE`` adds the same on a GGUF file, e.g. SmolLM2-135M-Instruct.Q4_1.gguf (ours reads
its quantized matrices as stored, as the app's chat does); ``--requantize Q4_K_M`` first has llama.cpp
quantize that file to the given llama.cpp file type (``LLAMA_FTYPE_MOSTLY_<TYPE>``, requantizing allowed;
written beside it, or reused) and decodes that one: SmolLM2's Q4_K_M is mostly Q5_0 (576 is no multiple of
the K-quants' 256), with Q8_0, Q4_K and Q6_K. ``--decode-only`` skips the training rows.

On a GPU machine: ``--device NVIDIA --torch-device cuda [--torch-compile]``; the decode
comparison is a CPU one (llama-cpp-python's CPU build): use ``--no-decode`` there, or a CPU
``--device`` for it.

``--profile`` adds one profiled run of our step per shape (and of decode): device time per kernel
from OpenCL event profiling (sum, launches, share); with ``--torch-device cuda`` also the reference's step's CUDA
kernels (torch.profiler).

``--lora RANK``: LoRA rows first (benchmarks/lora_bench.py): our LoRA step, our full fine-tune step and
torch + peft's LoRA step on the same shape, interleaved; with the memory estimate of both of ours.

Needs the optional ``bench`` extra (torch) and, for decode, llama-cpp-python (the ``test`` extra).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from core.config import ModelConfig  # noqa: E402
from core.device import open_device  # noqa: E402
from core.model import Model  # noqa: E402

SHAPES = {
    "default": ModelConfig(),
    "d512": ModelConfig(d_model=512, n_layers=4, n_heads=8, n_kv_heads=8, ffn_dim=1536),
    "d768": ModelConfig(vocab_size=8192, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_dim=2048,
                        context_length=512),
    # SmolLM2-135M-Instruct's shape, tied as the real model (issue 21)
    "smol135": ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                           context_length=2048, tie_embeddings=True),
    "d1024": ModelConfig(vocab_size=32000, d_model=1024, n_layers=24, n_heads=16, n_kv_heads=8, ffn_dim=2816,
                         context_length=2048),
}
SHAPE_BATCH = {"smol135": (8, 512), "d1024": (8, 512)}
"""(batch, tokens per sequence) of a shape when --batch/--seq are not given; others 16 x 128."""
LR, WD, B1, B2, EPS, CLIP = 1e-3, 0.01, 0.9, 0.98, 1e-8, 1.0


# ---------------------------------------------------------------------------- training
class Ours:
    """Our engine: one step as core/trainer.py takes it (clip factor from the returned grad_norm; the model sized,
    and its GPU kernels chosen, for ``batch`` x ``seq`` tokens, as the trainer's ``max_seq``); with ``lora`` a
    LoRA step (benchmarks/lora_bench.py), ``weight_decay`` AdamW's."""

    def __init__(self, dev, config: ModelConfig, batch: int, weights, seq: int, lora=None, weight_decay: float = WD):
        self.dev = dev
        self.model = Model(dev, config, batch_size=batch, weights=weights, max_seq=seq, lora=lora)
        self.weight_decay = weight_decay

    def step(self, x, y, m) -> None:
        stats = self.model.forward_backward(x, y, m)
        scale = CLIP / (stats.grad_norm + 1e-6) if stats.grad_norm > CLIP else 1.0
        self.model.optimizer_step(LR, self.weight_decay, B1, B2, EPS, scale)

    def sync(self) -> None:
        self.dev.finish()


class Torch:
    """The PyTorch reference model (benchmarks/torch_llama.py) with the same weights."""

    def __init__(self, config: ModelConfig, weights, x, y, device: str, compile_: bool):
        import torch

        from benchmarks.torch_llama import TorchLlama, make_optimizer

        self.torch, self.device = torch, device
        self.model = TorchLlama(config).to(device)
        self.model.load_gguf_weights(weights)
        self.opt = make_optimizer(self.model, LR, WD, B1, B2, EPS)
        self.x = torch.from_numpy(x.astype(np.int64)).to(device)
        self.y = torch.from_numpy(y.astype(np.int64)).to(device)
        self.forward = torch.compile(self.model) if compile_ else None

    def logits(self, x) -> np.ndarray:
        with self.torch.no_grad():
            t = self.torch.from_numpy(np.asarray(x, np.int64)).to(self.device)
            return self.model(t).float().cpu().numpy()

    def step(self, *_ignored) -> None:
        from benchmarks.torch_llama import train_step

        train_step(self.model, self.opt, self.x, self.y, CLIP, self.forward)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()


def timed_round(engine, args_, steps: int) -> float:
    """Seconds per step over ``steps`` steps."""
    engine.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step(*args_)
    engine.sync()
    return (time.perf_counter() - t0) / steps


def profile_steps(dev, build, batch: tuple, steps: int) -> list[tuple[str, float]]:
    """Device.stop_profiling's records of ``steps`` steps on ``batch`` of the engine ``build()`` makes once
    profiling is on (only kernels fetched after it are recorded), after one unrecorded step."""
    dev.start_profiling()
    engine = build()
    engine.step(*batch)
    engine.sync()
    dev.stop_profiling()
    dev.start_profiling()
    for _ in range(steps):
        engine.step(*batch)
    engine.sync()
    return dev.stop_profiling()


def print_profile(title: str, records: list[tuple[str, float]], steps: int) -> None:
    """Per-kernel device time: sum, launches, share (records from Device.stop_profiling)."""
    total = sum(t for _, t in records) or 1e-12
    agg: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, t in records:
        agg[name][0] += t
        agg[name][1] += 1
    print(f"\n  profile: {title} — device time per step {total / steps * 1e3:.2f} ms, "
          f"{len(records) / steps:.0f} launches per step")
    print(f"  {'kernel':32s} {'ms/step':>9s} {'launches':>9s} {'share':>7s}")
    for name, (t, k) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:32s} {t / steps * 1e3:9.3f} {k / steps:9.1f} {100 * t / total:6.1f}%")


def profile_torch(ref: Torch, steps: int) -> list[tuple[str, float]]:
    """The reference's CUDA kernels over ``steps`` steps (torch.profiler): ``[(kernel name, device seconds)]``, as
    Device.stop_profiling's records; empty where the reference runs on the CPU."""
    torch = ref.torch
    if not ref.device.startswith("cuda"):
        return []
    from torch.profiler import ProfilerActivity, profile

    ref.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            ref.step()
        ref.sync()
    return [(e.name, (e.device_time if hasattr(e, "device_time") else e.cuda_time) * 1e-6)  # microseconds
            for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def bench_training(dev, name: str, config: ModelConfig, a) -> dict:
    from core.model import init_weights

    batch, seq = SHAPE_BATCH.get(name, (16, 128))
    batch, seq = a.batch or batch, min(a.seq or seq, config.context_length)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, size=(batch, seq + 1)).astype(np.int32)
    x, y, m = tokens[:, :-1], tokens[:, 1:], np.ones((batch, seq), np.float32)
    weights = init_weights(config, 0)
    ours = Ours(dev, config, batch, weights, seq)
    ref = Torch(config, weights, x, y, a.torch_device, a.torch_compile)
    diff = float(np.abs(ours.model.logits(x[:2]) - ref.logits(x[:2])).max())
    for e in (ours, ref):  # warm-up: compile, caches, allocator
        for _ in range(a.warmup):
            e.step(x, y, m)
        e.sync()
    t_ours, t_ref = [], []
    for _ in range(a.rounds):
        t_ours.append(timed_round(ours, (x, y, m), a.steps))
        t_ref.append(timed_round(ref, (x, y, m), a.steps))
    n_tok = batch * seq
    r = {"shape": name, "params": config.n_params(), "tokens": n_tok, "diff": diff, "batch_seq": f"{batch} x {seq}",
         "ours": n_tok / min(t_ours), "ref": n_tok / min(t_ref),
         "ours_median": n_tok / statistics.median(t_ours), "ref_median": n_tok / statistics.median(t_ref)}
    print(f"{name}: ours {r['ours']:,.0f}, reference {r['ref']:,.0f} tok/s ({r['ours'] / r['ref']:.2f}x; medians "
          f"{r['ours_median'] / r['ref_median']:.2f}x)", flush=True)  # a run cut short keeps its finished shapes
    if a.profile:
        if records := profile_torch(ref, a.steps):
            print_profile(f"{name}, the reference's training step (CUDA kernels; names cut to 32 characters)",
                          [(n[:32], t) for n, t in records], a.steps)
        del ours
        print_profile(f"{name}, our training step",
                      profile_steps(dev, lambda: Ours(dev, config, batch, weights, seq), (x, y, m), a.steps), a.steps)
    return r


# ---------------------------------------------------------------------------- decode
def bench_decode(dev, a, gguf_path: str | None = None) -> dict:
    """Our chat decode next to llama.cpp's on the same GGUF file: the default model exported as F32
    (``gguf_path`` None), or the given file (``--decode-gguf``: imported as the app imports it, decoded
    from its quantized bytes as :meth:`core.generate.Generator.for_model` does)."""
    from core.generate import Generator

    with tempfile.TemporaryDirectory() as tmp:
        if gguf_path is None:
            from core.checkpoint import LoadedModel
            from core.dataset import default_dataset
            from core.gguf_io import export_gguf
            from core.model import init_weights
            from core.tokenizer import Tokenizer

            tok = Tokenizer.train(default_dataset().tokenizer_texts(), vocab_size=1024)
            config = ModelConfig(vocab_size=tok.vocab_size)
            weights = init_weights(config, 0)
            path = export_gguf(LoadedModel(config, tok, weights, {}, Path("bench")), Path(tmp) / "bench.gguf").path
            name, make = "default", lambda: Generator(dev, config, weights)
        else:
            from core.gguf_import import import_gguf

            path = Path(gguf_path)
            loaded = import_gguf(path)
            config, name = loaded.config, path.name
            make = lambda: Generator.for_model(dev, loaded)  # noqa: E731
        return _decode_rounds(dev, a, config, path, make, name)


def _decode_rounds(dev, a, config: ModelConfig, path: Path, make, name: str) -> dict:
    import llama_cpp

    from tests.artifacts import no_extra_buffer_types

    n_prompt = 16
    n_new = min(a.decode_tokens, config.context_length - n_prompt)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, config.vocab_size, n_prompt)]
    threads = os.cpu_count() or 1
    with no_extra_buffer_types():  # llama.cpp's repacked CPU buffers crash on VMs that advertise AMX
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_prompt + n_new, n_batch=n_prompt + n_new,
                              n_threads=threads, n_threads_batch=threads, seed=0, verbose=False)
    gen = make()

    def ours_run() -> float:
        gen.reset()
        tok_id = int(np.argmax(gen.feed(prompt)))
        t0 = time.perf_counter()
        for _ in range(n_new):
            tok_id = int(np.argmax(gen.feed([tok_id])))
        return n_new / (time.perf_counter() - t0)

    def llama_run() -> float:
        llm.reset()
        llm.eval(prompt)
        tok_id = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t0 = time.perf_counter()
        for _ in range(n_new):
            llm.eval([tok_id])
            tok_id = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return n_new / (time.perf_counter() - t0)

    ours_run(), llama_run()  # warm-up
    r_ours, r_ref = [], []
    for _ in range(a.rounds):
        r_ours.append(ours_run())
        r_ref.append(llama_run())
    llm.close()
    if a.profile:
        dev.start_profiling()
        pgen = make()
        pgen.feed(prompt)
        dev.stop_profiling()
        dev.start_profiling()
        t = 0
        for _ in range(n_new):
            t = int(np.argmax(pgen.feed([t])))
        print_profile(f"{name}, our chat decode (per token)", dev.stop_profiling(), n_new)
    return {"shape": f"chat decode, {name} ({n_new} tokens)", "params": config.n_params(), "tokens": 1,
            "diff": float("nan"), "ours": max(r_ours), "ref": max(r_ref), "file": path.name,
            "ours_median": statistics.median(r_ours), "ref_median": statistics.median(r_ref)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="OpenCL device index or name (default: the preferred one)")
    ap.add_argument("--shapes", default=None, help=f"comma-separated of {', '.join(SHAPES)} "
                                                   "(default: all on cuda, default,d512 on cpu)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default 16; smol135, d1024: 8)")
    ap.add_argument("--seq", type=int, default=None,
                    help="tokens per sequence, at most the shape's context (default 128; smol135, d1024: 512)")
    ap.add_argument("--torch-device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--torch-compile", action="store_true", help="torch.compile the reference model")
    ap.add_argument("--profile", action="store_true", help="print device time per kernel of our engine")
    ap.add_argument("--no-decode", action="store_true", help="skip the chat-decode comparison")
    ap.add_argument("--decode-tokens", type=int, default=100)
    ap.add_argument("--decode-gguf", default=None, metavar="FILE",
                    help="also a decode row on this GGUF file (e.g. SmolLM2-135M-Instruct.Q4_1.gguf), ours vs llama.cpp")
    ap.add_argument("--requantize", default=None, metavar="TYPE",
                    help="with --decode-gguf: decode llama.cpp's TYPE (e.g. Q4_K_M) quantization of that file")
    ap.add_argument("--decode-only", action="store_true", help="only the decode rows")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK", help="also LoRA rows (benchmarks/lora_bench.py): "
                    "our LoRA step vs our full step vs torch + peft, rank RANK on every linear layer")
    ap.add_argument("--lora-only", action="store_true", help="with --lora: only the LoRA rows")
    a = ap.parse_args()
    if a.requantize and not a.decode_gguf:
        ap.error("--requantize needs --decode-gguf FILE (the file to requantize)")
    shapes = (a.shapes or ("default,d512,d768" if a.torch_device == "cuda" else "default,d512")).split(",")
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r}; choose from {', '.join(SHAPES)}")

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    torch.set_float32_matmul_precision("highest")  # true float32 on GPUs too (no TF32), like ours
    dev = open_device(a.device)
    ref_name = f"torch {torch.__version__} {a.torch_device}" + (" compile" if a.torch_compile else " eager")
    print(f"ours: {dev.info.label}; reference: {ref_name}, {torch.get_num_threads()} threads; "
          f"{a.rounds} rounds x {a.steps} steps, float32")
    if a.lora:
        from benchmarks.lora_bench import bench_lora, print_lora_rows

        print_lora_rows([bench_lora(dev, s, SHAPES[s], a, timed_round) for s in shapes], ref_name)
        if a.lora_only:
            return
    rows = [] if a.decode_only else [bench_training(dev, s, SHAPES[s], a) for s in shapes]
    if not a.no_decode:
        rows.append(bench_decode(dev, a))
        if a.decode_gguf:
            path = a.decode_gguf
            if a.requantize:
                from tests.artifacts import llama_quantize

                path = str(llama_quantize(Path(path), a.requantize))
            rows.append(bench_decode(dev, a, path))
    print("\n| shape | params | batch x seq | ours tok/s | reference tok/s | ours/reference | max logit diff |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ref = ref_name if r["tokens"] > 1 else f"llama.cpp on {r['file']}, {os.cpu_count()} threads"
        diff = "" if r["diff"] != r["diff"] else f"{r['diff']:.1e}"
        print(f"| {r['shape']} | {r['params'] / 1e6:.2f}M | {r.get('batch_seq', '1')} | {r['ours']:,.0f} | {r['ref']:,.0f} ({ref}) | "
              f"**{r['ours'] / r['ref']:.2f}x** | {diff} |")
    print("\nmedian rounds: " + "; ".join(f"{r['shape']}: ours {r['ours_median']:,.0f}, reference "
                                          f"{r['ref_median']:,.0f} tok/s ({r['ours_median'] / r['ref_median']:.2f}x)"
                                          for r in rows))


if __name__ == "__main__":
    main()
