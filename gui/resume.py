"""What Resume continues with: the checkpoint's model, tokenizer and dataset, and the form's
training-only settings (the CLI's ``train --resume`` does the same). No Qt here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from core.checkpoint_meta import CheckpointMeta
from core.config import ModelConfig, StageConfig, TrainConfig, replace
from core.dataset import Dataset, dataset_hash
from core.stages import STAGES

STAGE_KEYS = ("steps", "lr", "batch_size", "warmup_steps", "min_lr_ratio")
# Settings a resumed run takes from the form; everything else comes from the checkpoint.
TRAINING_ONLY = ("grad_clip", "weight_decay", "replay_share", "beta1", "beta2", "adam_eps")
MODEL_KEYS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "context_length", "rope_theta", "norm_eps")


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass
class ResumePlan:
    """Attributes:
        train_config: the saved TrainConfig with the form's training-only settings.
        applied: form settings that differ from the saved run and are used, "key: old → new".
        ignored: form settings (and the dataset) that differ from the saved run but cannot change
            on resume, "key: saved value, form value".
    """

    train_config: TrainConfig
    applied: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def resume_plan(meta: CheckpointMeta, form_model: ModelConfig, form_train: TrainConfig,
                dataset: Dataset) -> ResumePlan:
    """Compare the form with a checkpoint's :class:`core.checkpoint.CheckpointMeta`."""
    saved_model, saved = meta.model, meta.train
    plan = ResumePlan(saved)
    for key in MODEL_KEYS:
        a, b = getattr(saved_model, key), getattr(form_model, key)
        if a != b:
            plan.ignored.append(f"{key}: {_fmt(a)} in the saved run, {_fmt(b)} in the form")
    for key in ("vocab_size", "seed"):
        a, b = getattr(saved, key), getattr(form_train, key)
        if a != b:
            plan.ignored.append(f"{key}: {_fmt(a)} in the saved run, {_fmt(b)} in the form")
    if meta.dataset_hash != dataset_hash(dataset):
        plan.ignored.append("the dataset: edited since the run started")

    stages = {}
    for stage in (s.value for s in STAGES):
        old, new = getattr(saved, stage), getattr(form_train, stage)
        for key in STAGE_KEYS:
            if getattr(old, key) != getattr(new, key):
                plan.applied.append(f"{stage}.{key}: {_fmt(getattr(old, key))} → {_fmt(getattr(new, key))}")
        stages[stage] = StageConfig(**{k: getattr(new, k) for k in STAGE_KEYS})
    extra = {}
    for key in TRAINING_ONLY:
        old, new = getattr(saved, key), getattr(form_train, key)
        if old != new:
            plan.applied.append(f"{key}: {_fmt(old)} → {_fmt(new)}")
        extra[key] = new
    plan.train_config = replace(saved, **stages, **extra)
    return plan
