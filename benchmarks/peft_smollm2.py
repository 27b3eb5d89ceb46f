"""Issue 20's PEFT check on a real imported model (SmolLM2-135M-Instruct Q4_1 by default): its Hugging Face
export (float32) in transformers and a LoRA adapter as a PEFT folder on it, against ours. Not a test
(tests/test_hf_gguf_vocab.py holds the assertions; this prints the figures).

    python benchmarks/peft_smollm2.py [--model FILE.gguf] [--checkpoint LORA_DIR | --train] [--device N|NAME]

--checkpoint: a LoRA checkpoint of that file (``opencl-llm train --base FILE --lora``); --train makes one
first (a few steps on benchmarks/five_facts.json); neither: a random rank-16 adapter on every linear layer
with B nonzero. Prints: texts whose ids differ between ours, transformers (AutoTokenizer on the export) and
llama.cpp (vocab only, on the file); max |logit difference| ours vs transformers without and with the
adapter, each against transformers in float64 (what float32 sums lose), and how much the adapter moves
the logits.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def train_lora(model: str, out: Path) -> Path:
    """A short LoRA run of the CLI (rank 16 on every linear layer, 4 + 4 steps at batch 2)."""
    from core.cli import main as cli

    data = Path(__file__).with_name("five_facts.json")
    rc = cli(["train", "--base", model, "--lora", "--data", str(data), "--out", str(out), "--steps", "4",
              "--batch-size", "2", "--context-length", "128", "--no-general-questions", "-q"])
    if rc:
        raise SystemExit(f"train --lora failed ({rc})")
    return out


def main() -> None:
    from core.checkpoint import load_checkpoint
    from core.device import open_device
    from core.gguf_import import import_gguf
    from tests.artifacts import smollm2_path
    from tests.test_hf_gguf_vocab import peft_parity

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--checkpoint")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--device")
    a = ap.parse_args()
    path = a.model or str(smollm2_path())
    dev = open_device(a.device)
    print(f"model: {path}\ndevice: {dev.info.label}")
    with tempfile.TemporaryDirectory() as tmp:
        run = a.checkpoint or (str(train_lora(path, Path(tmp) / "lora")) if a.train else None)
        lora_run = load_checkpoint(run) if run else None
        t = time.perf_counter()
        r = peft_parity(import_gguf(path), dev, Path(tmp), lora_run=lora_run)
        print(f"adapter: {run or 'random, rank 16 on every linear layer, B nonzero'}")
        print(f"tokenizer: ids equal (ours, transformers, llama.cpp) on {r['texts'] - r['tokenizer_mismatches']} "
              f"of {r['texts']} texts")
        print(f"prompt: {r['tokens']} tokens (the file's chat template)")
        print(f"HF export, no adapter: max |ours - transformers| = {r['hf_delta']:.2e}")
        print(f"PEFT folder:           max |ours - transformers+peft| = {r['peft_delta']:.2e} "
              f"(the adapter moves the logits by up to {r['adapter_moves']:.3f})")
        print(f"against float64:       ours {r['ours_vs_float64']:.2e}, transformers float32 "
              f"{r['torch_vs_float64']:.2e}; the adapter's effect differs by {r['adapter_effect_delta']:.2e}")
        print(f"({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
