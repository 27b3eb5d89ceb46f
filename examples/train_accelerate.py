"""Continue training an exported model on several GPUs (or CPU processes) with Hugging Face accelerate.

The model is a folder written by ``opencl-llm export --format hf``; the data is any dataset file the app
reads (its JSON, plain text, chat JSONL — through ``core.dataset``). Dialogues are rendered with the
chat template that came with the tokenizer (``apply_chat_template``) and learn only from the assistant
tokens (each answer and the ``<|eos|>`` after it); facts are ``<|bos|>text<|eos|>`` and learn from every
token, as in the app. The result is saved with ``save_pretrained`` and can go back into the app::

    opencl-llm export --format hf --model opencl-llm-model --out hf-model
    accelerate launch --num_processes 8 examples/train_accelerate.py \\
        --model hf-model --data dataset.json --out hf-model-tuned --steps 1000
    opencl-llm chat --model hf-model-tuned
    opencl-llm export --model hf-model-tuned --out tuned.gguf

On one machine without GPUs, 2 CPU processes talking through gloo (what tests/test_hf.py runs)::

    accelerate launch --multi_gpu --num_processes 2 examples/train_accelerate.py --cpu --model ...
    torchrun --standalone --nproc_per_node 2 examples/train_accelerate.py --cpu --model ...   # the same

(``accelerate launch --cpu`` alone starts one process unless MPI is set up.) All distribution is
accelerate's (DDP; FSDP or DeepSpeed with ``accelerate config``): each process
sees its own shard of every batch, gradients are averaged over processes. One line of JSON per
optimizer step goes to stdout: ``{"step": n, "loss": mean loss over processes, "lr": lr}``.
See docs/scale-out.md.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from core.config import StageConfig, lr_at  # noqa: E402  (the app's warmup + cosine schedule)
from core.dataset import load_dataset  # noqa: E402

IGNORE = -100  # label ignored by transformers' cross-entropy


def chat_example(tokenizer, dialogue, max_length: int) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a dialogue: labels are -100 except on the assistant tokens.

    The assistant tokens of turn k are what the template adds between the prompt ending in the
    generation header (``messages[:user k]`` with ``add_generation_prompt``) and the conversation
    up to and including answer k; the prompt must tokenize to a prefix of it (checked).
    """
    messages = [{"role": "system", "content": dialogue.system}] if dialogue.system else []

    def ids(msgs, gen_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen_prompt)
        return tokenizer(text, add_special_tokens=False)["input_ids"]  # the template writes BOS itself

    input_ids: list[int] = []
    labels: list[int] = []
    for user, answer in dialogue.turns:
        messages.append({"role": "user", "content": user})
        prompt = ids(messages, True)
        messages.append({"role": "assistant", "content": answer})
        full = ids(messages, False)
        if full[:len(prompt)] != prompt or prompt[:len(input_ids)] != input_ids:
            raise ValueError("the chat template does not tokenize to growing prefixes; cannot mask the answers")
        labels += [IGNORE] * (len(prompt) - len(input_ids)) + full[len(prompt):]
        input_ids = full
    return input_ids[:max_length], labels[:max_length]


def fact_example(tokenizer, text: str, max_length: int) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a fact ``<|bos|>text<|eos|>``: every token is learned."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = [tokenizer.bos_token_id, *ids, tokenizer.eos_token_id][:max_length]
    return ids, list(ids)


def collate(batch, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of (input_ids, labels) to the longest; padding has attention 0 and label -100."""
    n = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), n), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(batch), n), dtype=torch.long)
    for i, (ids, lab) in enumerate(batch):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, :len(lab)] = torch.tensor(lab)
        attention[i, :len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="folder written by `opencl-llm export --format hf`")
    p.add_argument("--data", required=True, help="dataset file: the app's .json, plain text, or chat .jsonl")
    p.add_argument("--out", required=True, help="folder to save the trained model into (save_pretrained)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step on each process")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (linear warmup, then cosine decay "
                   "to a tenth, as in the app)")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0, help="max global gradient L2 norm")
    p.add_argument("--no-facts", action="store_true", help="train on the dialogues only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="train on CPU processes (gloo) even where GPUs exist")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    accelerator = Accelerator(cpu=args.cpu)
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    max_length = model.config.max_position_embeddings

    dataset, problems = load_dataset(args.data)
    for problem in problems:
        accelerator.print(f"skipped: {problem}", file=sys.stderr)
    examples = [chat_example(tokenizer, d, max_length) for d in dataset.dialogues]
    if not args.no_facts:
        examples += [fact_example(tokenizer, f, max_length) for f in dataset.facts]
    examples = [e for e in examples if any(label != IGNORE for label in e[1][1:])]
    if not examples:
        raise SystemExit(f"{args.data}: nothing to train on")
    random.Random(args.seed).shuffle(examples)

    loader = DataLoader(examples, batch_size=args.batch_size, shuffle=True, drop_last=len(examples) > args.batch_size,
                        collate_fn=lambda b: collate(b, tokenizer.pad_token_id))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=args.weight_decay)
    stage = StageConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size, warmup_steps=args.warmup_steps)
    # Not given to accelerator.prepare, which would step it once per process: one step per optimizer step.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(stage, s) / args.lr)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    accelerator.print(json.dumps({"processes": accelerator.num_processes, "distributed": str(accelerator.distributed_type),
                                  "examples": len(examples)}), flush=True)
    model.train()
    step = 0
    while step < args.steps:
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            if args.grad_clip > 0:
                accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            mean_loss = accelerator.gather(loss.detach().reshape(1)).mean().item()
            if not math.isfinite(mean_loss):
                raise SystemExit(f"step {step}: the loss is {mean_loss}; lower --lr")
            accelerator.print(json.dumps({"step": step, "loss": round(mean_loss, 6),
                                          "lr": lr}), flush=True)
            if step >= args.steps:
                break

    accelerator.wait_for_everyone()
    accelerator.unwrap_model(model).save_pretrained(
        args.out, is_main_process=accelerator.is_main_process, save_function=accelerator.save,
        state_dict=accelerator.get_state_dict(model))
    if accelerator.is_main_process:
        tokenizer.save_pretrained(args.out)
        accelerator.print(f"saved {args.out}", file=sys.stderr)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
