"""What the workers report: one small frozen dataclass per kind of event (no Qt here).

A worker (gui.workers) builds these in its thread and emits them through a signal declared
``Signal(object)`` with a comment naming the class; the tabs read the typed fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: importing core.trainer loads the OpenCL engine
    from core.trainer import RecallItem, StageReport, StepReport


# ------------------------------------------------------------------------------------- training

@dataclass(frozen=True)
class RunStarted:
    """A run (new or resumed) has its model and is about to take its first step."""

    device: str  # the device's label
    n_params: int
    vocab_size: int
    stage_steps: tuple[int, int]  # (pretrain steps, tune steps) of the whole run
    stage_index: int  # the stage the run starts in (0 pretrain, 1 tune)
    stage_step: int  # steps already done in that stage (0 unless resumed)
    resumed: bool
    estimated_s: float = 0.0  # seconds the run is expected to take, one-time costs included (0: not estimated)
    first_run_s: float = 0.0  # of those, the one-time tuning and compiling on this device (core.plan.Plan)
    peak_resident_bytes: int = 0  # at most this much resident memory (core.finetune.estimate_resident; 0: unknown)


@dataclass(frozen=True)
class TrainingStep:
    """One optimizer step (or a skipped one), core.trainer.StepReport plus its place in the run."""

    stage: str  # "pretrain" or "tune"
    step: int  # 1-based within the stage
    total_steps: int  # of the stage
    global_step: int  # 1-based over both stages
    loss: float  # nats per learned token (NaN/inf when skipped)
    grad_norm: float  # global L2 norm before clipping
    layer_grad_norms: tuple[float, ...]  # [embedding, block 0..n-1, output]
    lr: float
    clipped: bool = False
    skipped: bool = False  # loss or gradient not finite: the weights were kept
    tokens_per_s: float = 0.0
    elapsed_s: float = 0.0  # since the run started
    passes: float = 0.0  # passes (epochs) over the stage's data so far

    @classmethod
    def from_report(cls, rep: StepReport, global_step: int, passes: float = 0.0) -> TrainingStep:
        return cls(rep.stage, rep.step, rep.total_steps, global_step, rep.loss, rep.grad_norm,
                   tuple(rep.layer_grad_norms), rep.lr, rep.clipped, rep.skipped, rep.tokens_per_s, rep.elapsed_s,
                   passes)


@dataclass(frozen=True)
class RecallChecking:
    """A recall check is running ("checking recall…"): sent before and after each batch of prompts."""

    stage: str
    done: int  # prompts decoded so far
    total: int  # prompts in this check
    final: bool  # the end-of-stage check (False: a check during the stage)


@dataclass(frozen=True)
class ValidationLoss:
    """Held-out loss at a step: per kind of data, None when the dataset has none of that kind."""

    global_step: int
    stage: str
    facts: float | None
    dialogues: float | None


@dataclass(frozen=True)
class StageDone:
    """A stage ended (finished or stopped); the recall table is empty when it was stopped."""

    stage: str
    steps_done: int
    stopped: bool
    recall: tuple[RecallItem, ...]
    facts_recalled: tuple[int, int]  # (reproduced, checked)
    dialogues_recalled: tuple[int, int]  # (reproduced, checked)
    end_reason: str = "steps"  # core.trainer.StageReport.end_reason
    sampled: tuple[tuple[str, int, int], ...] = ()  # (kind, checked, in all) of kinds checked as a sample

    @classmethod
    def from_report(cls, rep: StageReport) -> StageDone:
        return cls(rep.stage, rep.steps_done, rep.stopped, tuple(rep.recall), tuple(rep.facts_recalled),
                   tuple(rep.dialogues_recalled), rep.end_reason,
                   tuple((k, c, n) for k, (c, n) in rep.recall_sampled.items()))


@dataclass(frozen=True)
class RunDone:
    """The run ended without an exception (finished or stopped)."""

    stopped: bool
    finished: bool  # both stages done
    checkpoint: str  # the folder saved last, "" when nothing was saved
    stage_index: int  # where the run ended
    stage_step: int
    replaced: bool  # the run's checkpoint is (now) the project's trained model
    learned: bool = False  # the recall target was met (core.plan.verdict)
    verdict: str = ""  # "Learned: …" / "Not fully learned: 178 of 200 answers, …" ("" when not checked)
    advice: str = ""  # what to do when not learned


# ------------------------------------------------------------------------------------- before / after

@dataclass(frozen=True)
class ComparedAnswer:
    """One question put to the base model and to the model fine-tuned from it (core.finetune.before_after)."""

    kind: str  # "dataset" (a dialogue's first question) or "general" (one the dataset does not teach)
    question: str
    taught: str | None  # the dataset's answer, None for a general question
    before: str  # the base model's greedy answer
    after: str  # the fine-tuned model's greedy answer


@dataclass(frozen=True)
class Comparison:
    """The before/after comparison finished."""

    answers: tuple[ComparedAnswer, ...]


# ------------------------------------------------------------------------------------- chat

@dataclass(frozen=True)
class ModelLoaded:
    """The chat thread loaded a model (checkpoint folder or .gguf file)."""

    path: str
    n_params: int
    context_length: int
    vocab_size: int
    device: str  # the device's label


@dataclass(frozen=True)
class AnswerPiece:
    """One generated token of an answer."""

    text: str  # the visible text it adds (may be "" inside a multi-byte character)
    token: str  # its vocabulary string
    token_id: int  # -1 for trailing bytes flushed at the end
    prob: float  # its probability when it was sampled
    alternatives: tuple[tuple[str, float], ...]  # the most likely tokens at that step, (text, probability)


@dataclass(frozen=True)
class AnswerDone:
    """An answer ended."""

    text: str  # the whole answer
    stopped: bool  # cancelled by the user
    cut: str  # "max_tokens" or "context" when the answer was cut off, else ""


# ------------------------------------------------------------------------------------- export

@dataclass(frozen=True)
class Exported:
    """A GGUF file (and maybe an Ollama Modelfile) or a Hugging Face folder was written."""

    path: str
    size_bytes: int
    modelfile: str  # its path, "" when none was asked for
    notes: tuple[str, ...]  # what the user should know (e.g. tensors kept in F16)
