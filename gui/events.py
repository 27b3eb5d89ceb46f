"""What the workers report: one small frozen dataclass per kind of event (no Qt here).

A worker (gui.workers) builds these in its thread and emits them through a signal declared
``Signal(object)`` with a comment naming the class; the tabs read the typed fields. A training run's
events are core's own (core/events.py), re-exported here under the names the tabs use.
"""
from __future__ import annotations

from dataclasses import dataclass

# training: core's own events, emitted as the run (core.run.Run) yields them; the names the tabs know
from core.events import RecallProgress as RecallChecking  # noqa: F401
from core.events import RunDone, RunStarted, ValidationLoss  # noqa: F401
from core.events import StageReport as StageDone  # noqa: F401
from core.events import StepReport as TrainingStep  # noqa: F401

# ------------------------------------------------------------------------------------- before / after

@dataclass(frozen=True)
class ComparedAnswer:
    """One question put to the base model and to the model fine-tuned from it (core.from_base.before_after)."""

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
    """A GGUF file (and maybe an Ollama Modelfile) or a Hugging Face folder was written, and/or a LoRA
    checkpoint's adapter (llama.cpp's adapter GGUF or a PEFT folder)."""

    path: str  # the merged model's file or folder; the adapter's when only the adapter was written
    size_bytes: int
    modelfile: str  # its path, "" when none was asked for
    notes: tuple[str, ...]  # what the user should know (e.g. tensors kept in F16)
    adapter: str = ""  # the adapter file or folder written ("" when none; ``path`` when only it was)
    adapter_bytes: int = 0
    adapter_modelfile: str = ""  # the adapter's Ollama Modelfile (FROM the base, ADAPTER the file), "" when none
