"""Import time, fine-tune throughput and decode speed of a real GGUF model (SmolLM2-135M by default),
next to llama.cpp (llama-cpp-python) decoding the same weights as F32. Not a test.

    python benchmarks/import_finetune.py [--model FILE.gguf] [--device N|NAME] [--steps 3] [--batch 4]
                                         [--context 64] [--decode 32] [--no-llama]

Prints: import seconds; fine-tune seconds per step, tokens/s (all positions) and learned tokens/s,
the memory estimate and the process's peak resident memory (host memory: the device memory on
PoCL); decode tokens/s of our Generator and of llama.cpp on the F32 export (1 and 2 threads). Shared
machines are noisy: compare figures measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402


def main() -> None:
    from core.config import replace
    from core.dataset import default_dataset
    from core.device import open_device
    from core.estimates import training_memory_bytes
    from core.from_base import base_trainer, default_train_config
    from core.generate import Generator, SamplingSettings
    from core.gguf_import import import_gguf
    from tests.artifacts import smollm2_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--device")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--llama-threads", default="1,2", help="llama.cpp thread counts to time (on a loaded "
                    "machine 2 threads can be far slower than 1: its threads spin-wait for each other)")
    a = ap.parse_args()
    path = a.model or str(smollm2_path())

    t = time.perf_counter()
    m = import_gguf(path)
    print(f"import: {time.perf_counter() - t:.2f} s ({m.config.n_params():,} parameters)")
    dev = open_device(a.device)
    print(f"device: {dev.info.label}")

    mc = replace(m.config, context_length=a.context)
    tc = default_train_config(a.steps, None, a.batch)
    tr = base_trainer(m, mc, {}, default_dataset(), tc, dev)
    print(f"memory estimate: {training_memory_bytes(mc, a.batch) / 2**30:.2f} GiB")
    reports = []
    for ev in tr.run(recall=False):
        if type(ev).__name__ == "StepReport":
            reports.append((time.perf_counter(), ev))
            if len(reports) > a.steps:
                break
    times = [b[0] - a_[0] for a_, b in zip(reports, reports[1:])]
    step_s = float(np.median(times)) if times else float("nan")
    positions = float(np.median([tr._batch(0, k)[0].size for k in range(len(reports))]))  # padded batch B x T
    print(f"fine-tune: {step_s:.2f} s/step (median of {len(times)}), {positions / step_s:,.0f} tokens/s "
          f"({positions:.0f} positions per step, batch {a.batch}), learned tokens/s "
          f"{np.median([r.tokens_per_s for _, r in reports]):,.0f}")
    print(f"peak resident memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    del tr

    tok = m.tokenizer
    ids = tok.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
                     parse_special=True) if hasattr(tok, "add_bos") else [tok.bos_id, *tok.encode("User: hi\n")]
    gen = Generator(dev, replace(m.config, context_length=len(ids) + a.decode + 1), m.weights)
    settings = SamplingSettings(temperature=0.0, max_tokens=a.decode)
    list(gen.generate(ids, SamplingSettings(temperature=0.0, max_tokens=2)))  # warm-up (kernel builds)
    t = time.perf_counter()
    n = sum(1 for _ in gen.generate(ids, settings))
    ours = n / (time.perf_counter() - t)
    print(f"decode (ours): {ours:.1f} tokens/s ({n} tokens, prompt {len(ids)})")
    if a.no_llama:
        return
    from core.gguf_io import export_gguf

    with tempfile.TemporaryDirectory() as d:
        f32 = export_gguf(m, os.path.join(d, "f32.gguf"), dtype="f32").path
        import llama_cpp

        from tests.artifacts import no_extra_buffer_types

        for threads in (int(x) for x in a.llama_threads.split(",")):
            with no_extra_buffer_types():
                llm = llama_cpp.Llama(model_path=str(f32), n_ctx=len(ids) + a.decode + 8, n_threads=threads,
                                      n_threads_batch=threads, verbose=False)
            llm.eval(ids)
            t = time.perf_counter()
            for _ in range(a.decode):
                llm.eval([int(np.argmax(llm._scores[-1]))])
            theirs = a.decode / (time.perf_counter() - t)
            llm.close()
            print(f"decode (llama.cpp, F32, {threads} thread{'s' if threads > 1 else ''}): {theirs:.1f} tokens/s")


if __name__ == "__main__":
    main()
