"""Device memory of a LoRA fine-tune on a quantized GGUF base against the full float32 fine-tune: the
estimate (core.model.memory_bytes) at several shapes and, with --measure, the bytes the Model really
allocates (Device.allocated_bytes) with the base kept in its GGUF formats and dequantized. Not a test.

    python benchmarks/qlora_memory.py [--model FILE.gguf] [--rank 16] [--batch 8] [--measure] [--device N]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    from core.from_base import DEFAULTS, load_base
    from core.lora import LoRAConfig
    from core.model import Model, activation_sizes, memory_bytes, quantized_plan
    from core.quant_base import device_bytes
    from tests.artifacts import smollm2_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=DEFAULTS["batch_size"])
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--device")
    a = ap.parse_args()
    base, mc, _ = load_base(a.model or smollm2_path())
    lora = LoRAConfig(rank=a.rank, alpha=2.0 * a.rank)
    planned, mib = quantized_plan(mc, lora, base.quantized), 2 ** 20
    quant, floats = device_bytes(mc, planned)
    print(f"block matrices: {quant / mib:.1f} MiB in their formats, {4 * floats / mib:.1f} MiB as float32")
    for b, t in ((a.batch, mc.context_length), (4, 256), (1, 256), (8, 128)):
        c = dataclasses.replace(mc, context_length=t)
        full = memory_bytes(c, b, True)[0]
        lf, lq = memory_bytes(c, b, True, lora=lora)[0], memory_bytes(c, b, True, lora=lora, quantized=planned)[0]
        acts = 4 * sum(sum(v) for v in activation_sizes(c, b, t, True).values())
        print(f"{b} x {t}: full {full / mib:.0f} MiB; LoRA, float32 base {lf / mib:.0f} MiB ({lf / full:.1%}); "
              f"quantized base {lq / mib:.0f} MiB ({lq / full:.1%}); activations {acts / mib:.0f} MiB")
    if a.measure:
        from core.device import open_device

        dev = open_device(a.device)
        full = memory_bytes(mc, a.batch, True)[0]
        for quantized in (base.quantized, None):
            before = dev.allocated_bytes
            m = Model(dev, mc, batch_size=a.batch, weights=base.weights, lora=lora, quantized=quantized)
            got = dev.allocated_bytes - before
            est = memory_bytes(mc, a.batch, True, lora=lora, quantized=planned if quantized else None)[0]
            print(f"measured, {'quantized' if quantized else 'float32'} base: {got / mib:.0f} MiB allocated "
                  f"(estimate {est / mib:.0f} MiB): {got / full:.1%} of the full fine-tune's estimate")
            del m


if __name__ == "__main__":
    main()
