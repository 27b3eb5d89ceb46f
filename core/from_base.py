"""Fine-tuning a model that was trained elsewhere (a ``llama`` GGUF file such as SmolLM2) on our dataset.

Used by ``opencl-llm train --base`` and the app's "Start from: existing GGUF file". The base file
fixes the architecture, weights, tokenizer and chat template; training is the usual two stages
(facts as plain text, then dialogues in the file's template) with full-parameter AdamW, from
:data:`DEFAULTS` unless changed: a small learning rate (the weights are already trained) and a
short context (the memory of activations grows with it).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core import known
from core.config import ModelConfig, StageConfig, TrainConfig, replace
from core.stages import STAGES

if TYPE_CHECKING:
    from core.chat_format import TokenizerLike
    from core.dataset import Dataset
    from core.device import Device
    from core.loaded import LoadedModel
    from core.lora import LoRAConfig
    from core.recall import CheckSpeed
    from core.trainer import Trainer

DEFAULTS = {"steps": 60, "lr": 2e-4, "batch_size": 8, "warmup_steps": 5, "context_length": 256,
            "weight_decay": 0.0}
"""Fine-tuning defaults: steps per stage, peak lr, sequences per batch, warmup steps, context, decay."""


def default_train_config(steps: int | None = None, lr: float | None = None, batch_size: int | None = None,
                         **kw: object) -> TrainConfig:
    """A :class:`TrainConfig` for fine-tuning: :data:`DEFAULTS` with the given values applied
    (``kw`` goes to TrainConfig, e.g. ``grad_accum``, ``freeze_embeddings``, ``seed``, ``replay_share``).
    The data mix is added by :func:`with_data_mix` once the dataset and the base's tokenizer are known."""
    stage = StageConfig(steps=DEFAULTS["steps"] if steps is None else steps, lr=lr or DEFAULTS["lr"],
                        batch_size=batch_size or DEFAULTS["batch_size"], warmup_steps=DEFAULTS["warmup_steps"])
    kw.setdefault("weight_decay", DEFAULTS["weight_decay"])
    return TrainConfig(pretrain=stage, dialogues=stage, **kw)


def with_data_mix(tc: TrainConfig, tokenizer: TokenizerLike, dataset: Dataset, context_length: int) -> TrainConfig:
    """``tc`` with the Auto plan's data mix (core.plan.data_mix: questions mixed into the facts' stage, a question
    for each fact that no dialogue asks about written from the dataset's own questions, conversation batches,
    held-out fact questions, the plan's replay share) where ``dataset`` has more facts than dialogues (facts no
    dialogue asks about), counted with the base model's ``tokenizer``; otherwise ``tc`` unchanged. A replay
    share other than TrainConfig's default (``--replay-share``) is kept. ``dataset``: the user's own, without
    the replayed general questions.

    Measured with benchmarks/learn_finetune.py (SmolLM2-135M-Instruct Q4_1, LoRA, generated datasets of 8
    items, 48 facts, 8 dialogues, busy 2-core CPU): questions about the items without a dialogue answered right
    4 -> 19 of 24 (people), 4 -> 9 (catalogue), 7 -> 15 (events); general questions 10 of 10 in both; the
    run's wall time 1.8-2.1x (rows of conversations). Where every fact has its dialogue (five facts, five
    dialogues) the mix writes no question and only the cost would remain (estimated 9:18 against 4-5 minutes).
    """
    from core.estimates import dataset_stats
    from core.plan import data_mix

    if len(dataset.facts) <= len(dataset.dialogues):
        return tc
    stats = dataset_stats(dataset, 0, context_length, tokenizer=tokenizer)
    if stats.fact_sequences <= stats.dialogue_sequences:
        return tc
    mixed = data_mix(tc, stats)
    return mixed if tc.replay_share == TrainConfig.replay_share else replace(mixed, replay_share=tc.replay_share)


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
                 train_config: TrainConfig, device: Device, lora: LoRAConfig | None = None,
                 quantized: bool = True, check_memory: Callable[[int], None] | None = None) -> Trainer:
    """A :class:`core.trainer.Trainer` that starts from ``loaded``'s weights and tokenizer (with
    ``lora``: trains adapters on the frozen weights, the base's block matrices kept in the file's GGUF
    formats on the device unless ``quantized`` is False (core.quant_base); ``base_meta`` from
    :func:`lora_base_meta`; ``check_memory`` as the Trainer's). Without ``lora`` the tensors it freezes are
    left out of its checkpoints when the base is a GGUF file (core.checkpoint.from_base_meta: read back from
    the file)."""
    from core.checkpoint import from_base_meta
    from core.trainer import Trainer

    trainer = Trainer(dataset, model_config, train_config, device, tokenizer=loaded.tokenizer,
                      weights=loaded.weights, lora=lora, quantized=loaded.quantized if lora and quantized else None,
                      check_memory=check_memory)
    trainer.base_meta = dict(base_meta) if lora else from_base_meta(base_meta, trainer.model.frozen)
    return trainer


@dataclass(frozen=True)
class FinetuneEstimate:
    """How long a fine-tune will take, printed before its first step (``train --base``).

    Attributes:
        steps: (pretrain, tune) steps that will run (0: a stage without data or steps).
        step_s: seconds of one step of each stage: the gradients of its batches' mean padded tokens
            (:func:`gradient_seconds`, timed on the trainer's own model at two lengths) and the update: its
            check pass, timed, which AdamW's own pass over the same buffers takes about as long as (after
            the first update AdamW proves the next finite and skips the check: core.kernels.adamw).
        check_s: seconds of the recall checks at the stages' ends (core.recall.check_seconds at ``forward``).
        save_s: seconds of the checkpoint saves at the stages' ends (:data:`SAVE_BYTES_PER_S`).
        decoding: how fast the trainer's model decodes a recall check (core.recall.CheckSpeed, timed; the
            trainer's ``check_speed``: how its checks decode); None without steps.
    """

    steps: tuple[int, int]
    step_s: tuple[float, float]
    check_s: float
    save_s: float = 0.0
    decoding: CheckSpeed | None = None

    @property
    def total_s(self) -> float:
        """Seconds of the whole run: every step, the checks and the saves."""
        return sum(n * s for n, s in zip(self.steps, self.step_s)) + self.check_s + self.save_s

    def summary(self) -> str:
        """One line for the CLI: ``estimated 12:40 (pretrain 60 steps of about 5.2 s, ...; checks 0:30, ...)``."""
        from core.plan import format_duration
        from core.wording import count_words

        parts = [f"{name} {count_words(n, 'step')} of about " + (f"{s:.1f} s" if s >= 0.1 else f"{s * 1e3:.0f} ms")
                 for name, n, s in zip(STAGES, self.steps, self.step_s) if n]
        return (f"estimated {format_duration(self.total_s)} ({', '.join(parts) or 'no steps'}; checks "
                f"{format_duration(self.check_s)}, saves {format_duration(self.save_s)})")


SAVE_BYTES_PER_S = 80e6
"""Checkpoint bytes (weights and AdamW moments) a save writes per second, finite check, sha256 and fsync
included: 1.6 GB (SmolLM2-135M) in 19.5 s on the busy 2-core test machine."""
SAMPLED_STEPS = 32
"""Batches of each stage whose padded tokens :func:`estimate_time` averages."""


@dataclass(frozen=True)
class Speed:
    """Seconds of one pass of a model over ``tokens`` padded tokens: ``fixed + per_token * tokens``."""

    fixed: float
    per_token: float

    def __call__(self, tokens: float) -> float:
        return self.fixed + self.per_token * tokens

    @staticmethod
    def through(points: list[tuple[int, float]]) -> Speed:
        """The line through two ``(tokens, seconds)`` points (through the origin and the point for one,
        or for two of about the same length)."""
        (t0, s0), (t1, s1) = min(points), max(points)
        if t1 < 1.5 * t0 or s1 <= s0:
            return Speed(0.0, s1 / t1)
        per = (s1 - s0) / (t1 - t0)
        return Speed(max(0.0, s0 - per * t0), per)


def _seconds(fn) -> float:
    import time

    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


DECODE_STEPS = 4
"""Single-token steps :func:`gradient_seconds` times (after one untimed step)."""


def gradient_seconds(trainer: Trainer, stages: tuple[int, ...]) -> tuple[Speed, CheckSpeed]:
    """``(gradients, decoding)``: the speed of a forward and backward pass of ``trainer``'s model (its
    gradients, as a step computes them), each timed on the first micro-batch of every stage in ``stages``
    (its real sequences) after one untimed pass of each that builds the kernels, and how fast it decodes a recall
    check (core.recall.CheckSpeed: a forward whose rows' last logits are read back, timed on the same batches, and
    the median of :data:`DECODE_STEPS` single-token steps of its first row over its K/V buffers).
    Gradients and activations are overwritten, as the next step overwrites them; weights and moments stay.
    """
    import statistics

    from core.recall import CheckSpeed

    m = trainer.model
    batches = [tuple(a[:m.batch_size] for a in trainer.batches.batch(stage, 0)) for stage in stages]
    for b in batches:  # builds the kernels (the first step then does not); a CPU driver (PoCL) also builds its
        m.forward_backward(*b)  # work-group functions per new shape: a timed first pass of the dialogue batch read 2.5x slow
    grads = [(b[0].size, _seconds(lambda b=b: m.forward_backward(*b))) for b in batches]
    ends = [[len(row) for row in b[0]] for b in batches]  # greedy_batch reads each row's last logits
    logits = [(b[0].size, _seconds(lambda b=b, e=e: m.last_logits(b[0], e))) for b, e in zip(batches, ends)]
    row = [int(t) for t in batches[0][0][0][:max(1, min(8, m.rows - DECODE_STEPS - 1))]]
    m.next_logits(row, 0)
    steps = [_seconds(lambda k=k: m.next_logits(row[-1:], len(row) + k)) for k in range(DECODE_STEPS + 1)]
    return Speed.through(grads), CheckSpeed(Speed.through(logits), statistics.median(steps[1:]))


def estimate_time(trainer: Trainer) -> FinetuneEstimate:
    """The :class:`FinetuneEstimate` of ``trainer``'s run from its first step: timed on its own model
    (:func:`gradient_seconds`: five passes, the update's check once) and the padded tokens of its batches."""
    from core.estimates import checkpoint_file_bytes, save_copy_bytes
    from core.recall import check_seconds

    has = (bool(trainer.facts), bool(trainer.dialogues))
    steps = tuple(trainer.stage_config(i).steps if has[i] else 0 for i in (0, 1))
    if not any(steps):
        return FinetuneEstimate((0, 0), (0.0, 0.0), 0.0)
    grads, decoding = gradient_seconds(trainer, tuple(i for i in (0, 1) if steps[i]))
    # an update the check refuses (lr inf: nothing changes): the check pass and the flag read back; a step's
    # update is AdamW's own pass over the same buffers (proven finite, unchecked, from the second on), about as long
    update = _seconds(lambda: trainer.model.optimizer_step(float("inf"), 0.0, 0.9, 0.999, 1e-8))
    step_s = [0.0, 0.0]
    for stage, n in enumerate(steps):
        if n:
            k = min(n, SAMPLED_STEPS)
            tokens = sum(trainer.batches.padded_tokens(stage, i) for i in range(k)) / k
            passes = -(-trainer.stage_config(stage).batch_size // trainer.model.batch_size)  # micro-batches
            step_s[stage] = passes * grads.fixed + grads.per_token * tokens + update
    stages = sum(1 for n in steps if n)  # each stage ends with a save and a check of every kind
    file_bytes = (save_copy_bytes(trainer.model_config, lora=trainer.model.lora) / 2 if trainer.model.lora
                  else checkpoint_file_bytes(trainer.model_config, _from_base(trainer)))  # the .npz files
    m, cl = trainer.model, trainer.model_config.context_length
    check_s = stages * check_seconds(_check_prompts(trainer), m.batch_size, cl, m.rows, decoding)
    return FinetuneEstimate(steps, (step_s[0], step_s[1]), check_s, stages * file_bytes / SAVE_BYTES_PER_S, decoding)


@dataclass(frozen=True)
class ResidentEstimate:
    """Peak resident memory of a fine-tune's process (``train --base`` and the Training tab), in bytes.

    Attributes:
        peak_bytes: core.estimates.peak_resident_bytes of the run.
        longest: the longest row of a full batch the trainer's model is built for (``Model.max_seq``,
            core.trainer.max_seq_of its data): its device buffers hold that many tokens a row.
        device_on_host: the device's buffers count (a CPU device).
        save_bytes: a checkpoint save's copy of the weights and moments it writes (core.estimates.save_copy_bytes).
        check_bytes: a recall check's logits (core.estimates.check_copy_bytes).
    """

    peak_bytes: int
    longest: int
    device_on_host: bool
    save_bytes: int
    check_bytes: int


def estimate_resident(trainer: Trainer, resident_before: int, device_on_host: bool) -> ResidentEstimate:
    """The :class:`ResidentEstimate` of ``trainer``'s run, from ``resident_before`` (bytes this process held
    before the trainer was built: core.estimates.resident_bytes after reading the base) and whether the
    device's buffers live in host memory (core.device.Device.is_cpu)."""
    from core.estimates import check_copy_bytes, peak_resident_bytes, save_copy_bytes

    tc, mc, model = trainer.train_config, trainer.model_config, trainer.model
    rows = check_rows(trainer)
    from_base = _from_base(trainer)
    peak = peak_resident_bytes(resident_before, mc, model.memory_estimate(), device_on_host, tc.freeze_embeddings,
                               rows, from_base, model.lora)
    return ResidentEstimate(peak, model.max_seq, device_on_host,
                            save_copy_bytes(mc, tc.freeze_embeddings, from_base, model.lora),
                            check_copy_bytes(mc, rows))


def _from_base(trainer: Trainer) -> tuple[str, ...]:
    """The tensors ``trainer``'s checkpoints leave out: its base file holds them (core.checkpoint.trainer_meta)."""
    from core.checkpoint import trainer_meta

    return trainer_meta(trainer).from_base


def _check_prompts(trainer: Trainer) -> list:
    """The prompts of an end-of-stage recall check (every kind), shortest first."""
    from core.recall import KINDS, recall_prompts

    return sorted(recall_prompts(trainer.tokenizer, trainer.dataset, trainer.model_config.context_length,
                                 KINDS, trainer.heldout_pairs, questions=trainer.question_pairs),
                  key=lambda p: len(p.ids))


def check_rows(trainer: Trainer) -> int:
    """Rows of the largest forward a recall check of ``trainer``'s run makes: its batch's prompts (at most the
    model's batch_size), each of which reads back its last logits."""
    return min(len(_check_prompts(trainer)), trainer.model.batch_size)


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


__all__ = ["DEFAULTS", "GENERAL_QUESTIONS", "default_train_config", "with_data_mix", "load_base", "base_trainer", "before_after",
           "FinetuneEstimate", "Speed", "estimate_time", "gradient_seconds", "check_rows",
           "LORA_LR", "lora_base_meta", "ResidentEstimate", "estimate_resident"]
