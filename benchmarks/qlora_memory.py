"""Device memory of a LoRA fine-tune on a quantized GGUF base against the full float32 fine-tune of the same
data (issue 20: at most 35 %): the estimate (core.model.memory_bytes) at the rows the trainer builds its
model for (core.trainer.max_seq_of the run's data: benchmarks/five_facts.json and the base's answers to the
general questions, replayed as ``train --base`` replays them) and at a few fixed shapes; with --measure the
bytes the Models really allocate (Device.allocated_bytes). Not a test.

    python benchmarks/qlora_memory.py [--model FILE.gguf] [--data FILE] [--rank 16] [--batch 8] [--measure]
                                      [--no-general-questions] [--device N]

Both figures of the ratio are of the same rows (the same data, so the same longest row): a full fine-tune
of these five facts builds its model for the same ``max_seq``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2 ** 20


def run_rows(dev, base, mc, data_path: str, batch: int, general: bool) -> tuple[int, int]:
    """``(max_seq, longest training row)`` of ``train --base FILE --lora --data data_path`` with defaults."""
    from core import known
    from core.batches import Batches
    from core.dataset import load_dataset
    from core.from_base import default_train_config
    from core.trainer import max_seq_of

    dataset, _ = load_dataset(data_path)
    if general:  # the replayed answers are training rows too (the longest here)
        pairs, unfinished = known.base_answers(dev, mc, base.weights, base.tokenizer, known.GENERAL_QUESTIONS)
        dataset, _ = known.with_replay(dataset, pairs, unfinished)
    batches = Batches(base.tokenizer, dataset, mc.context_length, default_train_config(batch_size=batch))
    return max_seq_of(batches, batch), batches.longest_row()


def shapes_table(mc, lora, planned, shapes) -> None:
    from core.model import activation_sizes, memory_bytes

    for b, t in shapes:
        c = dataclasses.replace(mc, context_length=max(t, mc.context_length))
        full = memory_bytes(c, b, True, max_seq=t)[0]
        lf = memory_bytes(c, b, True, lora=lora, max_seq=t)[0]
        lq = memory_bytes(c, b, True, lora=lora, quantized=planned, max_seq=t)[0]
        acts = 4 * sum(sum(v) for v in activation_sizes(c, b, t, True).values())
        print(f"{b} x {t}: full {full / MIB:.0f} MiB; LoRA, float32 base {lf / MIB:.0f} MiB ({lf / full:.1%}); "
              f"quantized base {lq / MIB:.0f} MiB ({lq / full:.1%}); activations {acts / MIB:.0f} MiB")


def measure(dev, base, mc, lora, batch: int, max_seq: int) -> None:
    """Allocate each model as the trainer does (its Model) and print bytes against the estimate."""
    from core.model import Model

    got = {}
    for name, kw in (("LoRA, quantized base", dict(lora=lora, quantized=base.quantized)),
                     ("LoRA, float32 base", dict(lora=lora)), ("full fine-tune", {})):
        before = dev.allocated_bytes
        m = Model(dev, mc, batch_size=batch, weights=base.weights, max_seq=max_seq, **kw)
        got[name] = (dev.allocated_bytes - before, m.memory_estimate())
        del m
    full = got["full fine-tune"]
    for name, (alloc, est) in got.items():
        print(f"measured, {name}: {alloc / MIB:.0f} MiB allocated (estimate {est / MIB:.0f} MiB): "
              f"{alloc / full[0]:.1%} of the full fine-tune's allocation, estimate {est / full[1]:.1%}")


def main() -> None:
    from core.device import open_device
    from core.from_base import DEFAULTS, load_base
    from core.lora import LoRAConfig
    from core.model import memory_bytes, quantized_plan
    from core.quant_base import device_bytes
    from tests.artifacts import smollm2_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--data", default=os.path.join(HERE, "five_facts.json"))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=DEFAULTS["batch_size"])
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--no-general-questions", action="store_true")
    ap.add_argument("--device")
    a = ap.parse_args()
    base, mc, _ = load_base(a.model or smollm2_path())
    lora = LoRAConfig(rank=a.rank, alpha=2.0 * a.rank)
    planned = quantized_plan(mc, lora, base.quantized)
    quant, floats = device_bytes(mc, planned)
    print(f"block matrices: {quant / MIB:.1f} MiB in their formats, {4 * floats / MIB:.1f} MiB as float32")
    dev = open_device(a.device)
    max_seq, longest = run_rows(dev, base, mc, a.data, a.batch, not a.no_general_questions)
    print(f"{os.path.basename(a.data)}: longest training row {longest} tokens; the model is built for "
          f"{a.batch} x {max_seq} (context {mc.context_length})")
    need = memory_bytes(mc, a.batch, True, lora=lora, quantized=planned, max_seq=max_seq)[0]
    full = memory_bytes(mc, a.batch, True, max_seq=max_seq)[0]
    print(f"estimate at the run's rows: LoRA rank {a.rank} on the quantized base {need / MIB:.0f} MiB, full "
          f"fine-tune of the same rows {full / MIB:.0f} MiB: {need / full:.1%}")
    shapes_table(mc, lora, planned, ((a.batch, max_seq), (a.batch, mc.context_length), (a.batch, 512), (4, 256), (1, 256)))
    if a.measure:
        measure(dev, base, mc, lora, a.batch, max_seq)


if __name__ == "__main__":
    main()
