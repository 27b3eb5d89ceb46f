"""What a training run reports, one frozen dataclass per kind of event (no device, no Qt).

:class:`core.trainer.Trainer` yields the first five as it trains; :class:`core.run.Run`, the one driver of
a run that ``opencl-llm train`` and the app's TrainWorker both call, adds the rest around them (its
setup's :class:`Phase` and :class:`LogEvent` lines, :class:`RunStarted`, :class:`ValidationLoss`,
:class:`RunDone`). The app's worker emits these objects as they are (gui/events.py re-exports them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from core.recall import RecallItem, tally
from core.stages import Stage


@dataclass(frozen=True)
class StepReport:
    """Reported after every optimizer step (or skipped step); the app plots it as it is.

    Attributes:
        stage: the :class:`core.stages.Stage`; step: 1-based within the stage; total_steps: of the stage;
        global_step: 1-based over the run (the pretraining stage's planned steps, then the tuning steps).
        loss: mean cross-entropy in nats per learned token; grad_norm: global L2 norm before
        clipping; layer_grad_norms: [embedding, block 0..n-1, output]; lr: learning rate used;
        clipped: the gradient was scaled down; skipped: loss or gradient was not finite, weights kept;
        tokens_per_s: learned tokens per second over this step; elapsed_s: since the run started;
        passes: passes (epochs) over the stage's data so far (core.batches.stage_passes).
    """

    stage: Stage
    step: int
    total_steps: int
    global_step: int
    loss: float
    grad_norm: float
    layer_grad_norms: tuple[float, ...]
    lr: float
    clipped: bool = False
    skipped: bool = False
    tokens_per_s: float = 0.0
    elapsed_s: float = 0.0
    passes: float = 0.0


@dataclass(frozen=True)
class StageFinished:
    """Reported the moment a stage has run all its steps, before its recall check: save now, so a stop
    (or a crash) during the recall check cannot lose the stage."""

    stage: Stage
    steps_done: int


@dataclass(frozen=True)
class StageReport:
    """Reported when a stage ends: its recall table over every fact and every dialogue turn.

    ``recall_stopped`` is True when a stop request cut the recall check short (the table is partial;
    the stage itself is complete and was announced by :class:`StageFinished`). ``recall_sampled`` names the
    kinds of which a huge dataset had only an evenly spaced sample checked
    (:data:`core.recall.FULL_CHECK_MAX`), ``{kind: (checked, prompts in all)}``. ``recall_left_out``: the facts
    and dialogue answers that got no prompt, ``{kind: {why: count}}`` (``left_out=`` of core.recall.recall_prompts).
    """

    stage: Stage
    steps_done: int
    stopped: bool
    recall: tuple[RecallItem, ...] = ()
    recall_stopped: bool = False
    recall_sampled: dict = field(default_factory=dict)  # {kind: (checked, in all)}: kinds only sampled
    end_reason: str = "steps"  # "steps" (all run), "learned", "no progress", "time budget", "stopped"
    recall_left_out: dict = field(default_factory=dict)  # {kind: {why: n}}: facts / answers the check could not ask

    @property
    def facts_recalled(self) -> tuple[int, int]:
        """(facts reproduced, facts checked)."""
        return tally(self.recall, "fact")

    @property
    def dialogues_recalled(self) -> tuple[int, int]:
        """(dialogue answers reproduced, answers checked)."""
        return tally(self.recall, "dialogue")

    @property
    def chat_recalled(self) -> tuple[int, int]:
        """(answers reproduced in the middle of a conversation, checked)."""
        return tally(self.recall, "chat")

    @property
    def questions_recalled(self) -> tuple[int, int]:
        """(questions written for facts and trained that were answered, asked): core.recall's "question" kind."""
        return tally(self.recall, "question")

    @property
    def heldout_recalled(self) -> tuple[int, int]:
        """(held-out questions answered, asked): questions about facts no trained example asks about."""
        return tally(self.recall, "heldout")

    @property
    def sampled(self) -> tuple[tuple[str, int, int], ...]:
        """``recall_sampled`` as ``(kind, checked, in all)`` rows (the Training tab's note)."""
        return tuple((k, c, n) for k, (c, n) in self.recall_sampled.items())


@dataclass(frozen=True)
class RecallProgress:
    """Reported before and after every batch of a recall check ("checking recall…").

    ``step`` is the stage step the check is for; ``final`` is True for the end-of-stage check
    (False for a check during the stage, see ``TrainConfig.check_every``)."""

    stage: Stage
    step: int
    done: int  # prompts decoded so far
    total: int  # prompts in this check
    final: bool


@dataclass(frozen=True)
class LogEvent:
    """A line for the log panel (level is a ``logging`` level name)."""

    level: str
    message: str


@dataclass(frozen=True)
class Phase:
    """What a run does before its first step (``name``: "read", "plan", "ask", "build" or "estimate")."""

    name: str
    text: str  # e.g. "reading base.gguf", "training the tokenizer and building the model"


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
    peak_resident_bytes: int = 0  # at most this much resident memory (core.from_base.estimate_resident; 0: unknown)


@dataclass(frozen=True)
class ValidationLoss:
    """Loss (nats per token, no gradients) over all facts and all dialogues at a step; None when the
    dataset has none of that kind (core.trainer.Trainer.validation_loss)."""

    global_step: int
    stage: Stage
    facts: float | None
    dialogues: float | None


@dataclass(frozen=True)
class RunDone:
    """The run ended without an exception (finished or stopped)."""

    stopped: bool
    finished: bool  # both stages done
    checkpoint: str  # the folder saved last, "" when nothing was saved
    stage_index: int  # where the run ended
    stage_step: int
    replaced: bool  # the run's checkpoint is (now) the trained model the caller keeps (core.run.RunHooks)
    learned: bool = False  # the recall target was met (core.plan.verdict)
    verdict: str = ""  # "Learned: …" / "Not fully learned: 178 of 200 answers, …" ("" when not checked)
    advice: str = ""  # what to do when not learned
    general: str = ""  # a fine-tune's "general questions: n of N answered as before" (core.known.verdict_line)
