"""LoRA rows of benchmarks/compare.py (``--lora RANK``): a LoRA training step of our engine next to our full
fine-tune step and PyTorch + ``peft`` (transformers' LlamaForCausalLM with LoRA on every linear layer of
every block), same shape, same weights, interleaved (ours LoRA, ours full, torch+peft, ... per round).

Each step: forward, mean cross-entropy, backward, grad-norm clip to 1.0, AdamW on the trained tensors
(ours: the adapters only; the base needs only its input gradients). Needs the ``hf`` extra (torch,
transformers, peft).
"""
from __future__ import annotations

import statistics

import numpy as np

from core.config import ModelConfig
from core.lora import LoRAConfig, adapter_params
from core.model import init_weights, memory_bytes

LR, WD, B1, B2, EPS, CLIP = 1e-3, 0.0, 0.9, 0.98, 1e-8, 1.0


def ours_step(dev, config: ModelConfig, batch: int, weights, lora: LoRAConfig | None, seq: int):
    """One step of our engine (full, or LoRA with ``lora``): benchmarks/compare.py's ``Ours`` with this file's
    weight decay."""
    from benchmarks.compare import Ours

    return Ours(dev, config, batch, weights, seq, lora=lora, weight_decay=WD)


class TorchPeftStep:
    """transformers' LlamaForCausalLM with our weights (core.hf_io's names and Q/K rows) and peft LoRA."""

    def __init__(self, config: ModelConfig, weights, lora: LoRAConfig, x, y, device: str):
        import peft
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from core.hf_io import _rope_heads, hf_config, hf_names, to_hf_rows
        from core.lora_io import HF_MODULES

        self.torch, self.device = torch, device
        base = LlamaForCausalLM(LlamaConfig(**hf_config(config, 1, 2, 0), attn_implementation="sdpa"))
        heads = _rope_heads(config)
        state = {t: torch.from_numpy(to_hf_rows(weights[o], heads[o]) if o in heads else np.array(weights[o]))
                 for o, t in hf_names(config).items()}
        base.load_state_dict(state, strict=False)
        cfg = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0, bias="none",
                              target_modules=[HF_MODULES[t] for t in lora.targets])
        self.model = peft.get_peft_model(base.float(), cfg).to(device).train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = params
        self.opt = torch.optim.AdamW(params, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
        self.x = torch.from_numpy(x.astype(np.int64)).to(device)
        self.y = torch.from_numpy(y.astype(np.int64)).to(device)

    def step(self, *_ignored) -> None:
        torch = self.torch
        logits = self.model(input_ids=self.x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, CLIP)
        self.opt.step()

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()


def bench_lora(dev, name: str, config: ModelConfig, a, timed_round) -> dict:
    """Tokens/s of our LoRA step, our full step and torch+peft's LoRA step (best and median rounds),
    and the device memory our estimate gives for each of ours."""
    lora = LoRAConfig(rank=a.lora, alpha=2.0 * a.lora)
    from benchmarks.compare import SHAPE_BATCH

    batch, seq = SHAPE_BATCH.get(name, (16, 128))
    batch, seq = a.batch or batch, min(a.seq or seq, config.context_length)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, size=(batch, seq + 1)).astype(np.int32)
    x, y, m = tokens[:, :-1], tokens[:, 1:], np.ones((batch, seq), np.float32)
    weights = init_weights(config, 0)
    engines = {"lora": ours_step(dev, config, batch, weights, lora, seq),
               "full": ours_step(dev, config, batch, weights, None, seq),
               "peft": TorchPeftStep(config, weights, lora, x, y, a.torch_device)}
    for e in engines.values():
        for _ in range(a.warmup):
            e.step(x, y, m)
        e.sync()
    times = {k: [] for k in engines}
    for _ in range(a.rounds):
        for k, e in engines.items():
            times[k].append(timed_round(e, (x, y, m), a.steps))
    if a.profile:
        from benchmarks.compare import print_profile, profile_steps

        for k in ("lora", "full"):
            records = profile_steps(
                dev, lambda k=k: ours_step(dev, config, batch, weights, lora if k == "lora" else None, seq), (x, y, m),
                a.steps)
            print_profile(f"{name}, our {k} step (rank {lora.rank})" if k == "lora" else f"{name}, our full step",
                          records, a.steps)
    n = batch * seq
    mem = {k: memory_bytes(config, batch, True, lora=lora if k == "lora" else None, max_seq=seq)[0]
           for k in ("lora", "full")}
    return {"shape": name, "rank": lora.rank, "trained": adapter_params(config, lora), "tokens": n,
            **{k: n / min(v) for k, v in times.items()}, **{k + "_median": n / statistics.median(v) for k, v in times.items()},
            "mem_lora": mem["lora"], "mem_full": mem["full"]}


def print_lora_rows(rows: list[dict], ref_name: str) -> None:
    """The LoRA table: ours LoRA vs ours full vs torch+peft (best rounds; medians after)."""
    print(f"\n| shape | LoRA rank | ours LoRA tok/s | ours full tok/s | LoRA/full | {ref_name} + peft tok/s | "
          "ours LoRA/peft | memory LoRA / full (estimate) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['rank']} | {r['lora']:,.0f} | {r['full']:,.0f} | **{r['lora'] / r['full']:.2f}x** | "
              f"{r['peft']:,.0f} | **{r['lora'] / r['peft']:.2f}x** | {r['mem_lora'] / 2**30:.2f} / "
              f"{r['mem_full'] / 2**30:.2f} GiB ({100 * r['mem_lora'] / r['mem_full']:.0f} %) |")
    print("median rounds: " + "; ".join(f"{r['shape']}: LoRA {r['lora_median']:,.0f}, full {r['full_median']:,.0f}, "
                                        f"peft {r['peft_median']:,.0f} tok/s" for r in rows))
