"""Fine-tuning a model that was trained elsewhere (a ``llama`` GGUF file such as SmolLM2) on our dataset.

Used by ``opencl-llm train --base`` and the app's "Start from: existing GGUF file". The base file
fixes the architecture, weights, tokenizer and chat template; training is the usual two stages
(facts as plain text, then dialogues in the file's template) with full-parameter AdamW, from
:data:`DEFAULTS` unless changed: a small learning rate (the weights are already trained) and a
short context (the memory of activations grows with it).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from core import known
from core.config import ModelConfig, StageConfig, TrainConfig, replace

if TYPE_CHECKING:
    from core.chat_format import TokenizerLike
    from core.dataset import Dataset
    from core.device import Device
    from core.loaded import LoadedModel
    from core.lora import LoRAConfig
    from core.trainer import Trainer

DEFAULTS = {"steps": 60, "lr": 2e-4, "batch_size": 8, "warmup_steps": 5, "context_length": 256,
            "weight_decay": 0.0}
"""Fine-tuning defaults: steps per stage, peak lr, sequences per batch, warmup steps, context, decay."""


def default_train_config(steps: int | None = None, lr: float | None = None, batch_size: int | None = None,
                         **kw: object) -> TrainConfig:
    """A :class:`TrainConfig` for fine-tuning: :data:`DEFAULTS` with the given values applied
    (``kw`` goes to TrainConfig, e.g. ``grad_accum``, ``freeze_embeddings``, ``seed``)."""
    stage = StageConfig(steps=DEFAULTS["steps"] if steps is None else steps, lr=lr or DEFAULTS["lr"],
                        batch_size=batch_size or DEFAULTS["batch_size"], warmup_steps=DEFAULTS["warmup_steps"])
    kw.setdefault("weight_decay", DEFAULTS["weight_decay"])
    return TrainConfig(pretrain=stage, tune=stage, **kw)


def load_base(path: str | os.PathLike, context_length: int | None = None) -> tuple[LoadedModel, ModelConfig, dict]:
    """Read a base model for fine-tuning.

    Args:
        path: a ``.gguf`` file (any llama-architecture model) or one of our checkpoint folders.
        context_length: training context in tokens (default :data:`DEFAULTS`, at most the model's).

    Returns:
        ``(loaded, model_config, base_meta)``: the :class:`core.loaded.LoadedModel`, its config with
        the training context, and what checkpoints keep of the file for the export
        (``core.checkpoint_meta.BASE_META_KEYS``).

    Raises:
        core.gguf_import.GGUFError / core.checkpoint.CheckpointError: the file cannot be used (named).
    """
    from core.checkpoint import load_model

    loaded = load_model(path)
    ctx = min(loaded.config.context_length, context_length or DEFAULTS["context_length"])
    mc: ModelConfig = replace(loaded.config, context_length=ctx)
    meta = loaded.meta or {}
    base_meta = {"base_model": str(Path(path).resolve()), "name": meta.get("name")}
    for k in ("gguf_general", "gguf_context_length"):
        if meta.get(k) is not None:
            base_meta[k] = meta[k]
    return loaded, mc, base_meta


def base_trainer(loaded: LoadedModel, model_config: ModelConfig, base_meta: dict, dataset: Dataset,
                 train_config: TrainConfig, device: Device, lora: LoRAConfig | None = None) -> Trainer:
    """A :class:`core.trainer.Trainer` that starts from ``loaded``'s weights and tokenizer (with
    ``lora``: trains adapters on the frozen weights; ``base_meta`` from :func:`lora_base_meta`)."""
    from core.trainer import Trainer

    trainer = Trainer(dataset, model_config, train_config, device, tokenizer=loaded.tokenizer,
                      weights=loaded.weights, lora=lora)
    trainer.base_meta = dict(base_meta)
    return trainer


LORA_LR = 1e-3
"""Peak learning rate of LoRA fine-tuning when none is given: the adapters start at B = 0 and learn
from there, so they take a larger rate than the full model (PEFT's examples use 1e-4 to 3e-3)."""


def lora_base_meta(path: str | os.PathLike, base_meta: dict, lora: LoRAConfig) -> dict:
    """``base_meta`` of :func:`load_base` plus what a LoRA checkpoint keeps instead of the weights: the
    settings (``lora``) and the base file's sha256 (``base_sha256``), checked when it is loaded.

    Raises:
        core.lora.LoRAError: the base is not a GGUF file (a LoRA checkpoint refers to one file).
    """
    from core.checkpoint import file_sha256
    from core.lora import LoRAError

    p = Path(path)
    if not p.is_file():
        raise LoRAError(f"{p}: --lora needs a GGUF file as --base (a LoRA checkpoint refers to its base file)")
    return dict(base_meta) | {"lora": lora.to_dict(), "base_sha256": file_sha256(p)}




GENERAL_QUESTIONS = known.GENERAL_QUESTIONS
"""General questions asked before and after fine-tuning, to show what the model may have forgotten (the
ones core.known replays in training)."""


def before_after(device: Device, base_weights: dict, tuned_weights: dict, model_config: ModelConfig,
                 tokenizer: TokenizerLike, dataset: Dataset, general: tuple[str, ...] = GENERAL_QUESTIONS,
                 max_tokens: int = 48) -> list[tuple[str, str, str | None, str, str]]:
    """Greedy answers of the base and the tuned model, side by side.

    Args:
        device: the OpenCL device.
        base_weights, tuned_weights: ``{tensor name: float32 array}`` of the two models (same config).
        model_config: their architecture (the context bounds prompt + answer).
        tokenizer: their tokenizer; dataset: its dialogues' first questions are asked.
        general: extra questions the dataset does not teach.

    Returns:
        ``[(kind, question, expected or None, base answer, tuned answer)]``, kind "dataset" or "general".
    """
    from core.chat import ChatSession
    from core.generate import Generator, SamplingSettings

    # the base's own answers to the general questions, replayed in training (core.known), are not the dataset's
    questions = [("dataset", u, a) for d in dataset.dialogues for u, a in d.turns[:1] if u not in general]
    questions += [("general", q, None) for q in general]
    settings = SamplingSettings(temperature=0.0, max_tokens=max_tokens)
    answers = []
    for weights in (base_weights, tuned_weights):
        session = ChatSession(Generator(device, model_config, weights), tokenizer)
        row = []
        for _kind, q, _a in questions:
            session.clear()
            row.append(session.answer(q, settings))
        answers.append(row)
    return [(k, q, a, before, after) for (k, q, a), before, after in zip(questions, *answers)]


__all__ = ["DEFAULTS", "GENERAL_QUESTIONS", "default_train_config", "load_base", "base_trainer", "before_after",
           "LORA_LR", "lora_base_meta"]
