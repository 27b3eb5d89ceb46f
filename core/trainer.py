"""Two-stage training: pretrain on facts, then tune on User/Assistant dialogues.

The :class:`Trainer` is an iterator API a GUI thread or the CLI drives::

    trainer = Trainer(dataset, model_config, train_config, device)
    for event in trainer.run():          # StepReport, StageReport, LogEvent
        ...
        if user_pressed_stop: trainer.request_stop()   # honoured before the next step

Stage 1 ("pretrain") learns every token of every fact (BOS + fact + EOS), with ``mix_share`` of each
batch from the question-and-answer examples. Stage 2 ("tune") learns only the assistant tokens of each
dialogue, and mixes ``replay_share`` of each batch from the facts again, because a tiny model otherwise
forgets its facts during tuning. The question-and-answer examples are the dataset's dialogues and, with
``fact_questions``, questions written for the facts that have none (core.augment), ``fact_question_share``
of them; every ``conversation_every``-th tuning batch holds conversations of several unrelated dialogues.

Batches are a pure function of (seed, stage, step): example order is the concatenation of per-epoch
permutations drawn from ``default_rng([seed, stage, epoch])``. So a resumed run sees exactly the
batches the uninterrupted run would have seen.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from core import augment, chat_format
from core.config import ModelConfig, StageConfig, TrainConfig, lr_at, replace
from core.dataset import Dataset, Dialogue, dataset_hash
from core.device import Device
from core.model import Model
from core.recall import KINDS, RecallItem, count, fact_split, recall_check
from core.tokenizer import Tokenizer

log = logging.getLogger(__name__)

STAGES = ("pretrain", "tune")
STAGE_KINDS = (("fact",), ("fact", "dialogue", "chat"))
"""What each stage must reproduce, and so what its checks during the stage look at (tuning replays the
facts, so it must keep them as well as learn the answers)."""
_NOUN = {"fact": "facts", "dialogue": "dialogue answers", "chat": "answers in a conversation",
         "heldout": "held-out answers"}
CONVERSATIONS = 1000
"""Most conversations of several dialogues built for tuning (``conversation_every``)."""


@dataclass
class Example:
    """One training sequence: ``ids`` (n+1 tokens) and ``mask`` (n+1, 1 where a token is learned)."""

    ids: list[int]
    mask: list[int]


@dataclass
class StepReport:
    """Reported after every optimizer step (or skipped step).

    Attributes:
        stage: "pretrain" or "tune"; step: 1-based within the stage; total_steps: of the stage.
        loss: mean cross-entropy in nats per learned token; grad_norm: global L2 norm before
        clipping; layer_grad_norms: [embedding, block 0..n-1, output]; lr: learning rate used;
        clipped: the gradient was scaled down; skipped: loss or gradient was not finite, weights kept;
        tokens_per_s: learned tokens per second over this step; elapsed_s: since the run started.
    """

    stage: str
    step: int
    total_steps: int
    loss: float
    grad_norm: float
    layer_grad_norms: list[float]
    lr: float
    clipped: bool
    skipped: bool
    tokens_per_s: float
    elapsed_s: float


@dataclass
class StageFinished:
    """Reported the moment a stage has run all its steps, before its recall check: save now, so a stop
    (or a crash) during the recall check cannot lose the stage."""

    stage: str
    steps_done: int


@dataclass
class StageReport:
    """Reported when a stage ends: its recall table over every fact and every dialogue turn.

    ``recall_stopped`` is True when a stop request cut the recall check short (the table is partial;
    the stage itself is complete and was announced by :class:`StageFinished`).
    """

    stage: str
    steps_done: int
    stopped: bool
    recall: list[RecallItem] = field(default_factory=list)
    recall_stopped: bool = False
    end_reason: str = "steps"  # "steps" (all run), "learned", "no progress", "time budget", "stopped"

    @property
    def facts_recalled(self) -> tuple[int, int]:
        """(facts reproduced, facts checked)."""
        return count(self.recall, "fact")

    @property
    def dialogues_recalled(self) -> tuple[int, int]:
        """(dialogue answers reproduced, answers checked)."""
        return count(self.recall, "dialogue")

    @property
    def chat_recalled(self) -> tuple[int, int]:
        """(answers reproduced in the middle of a conversation, checked)."""
        return count(self.recall, "chat")

    @property
    def heldout_recalled(self) -> tuple[int, int]:
        """(held-out questions answered, asked): questions about facts no trained example asks about."""
        return count(self.recall, "heldout")


@dataclass
class RecallProgress:
    """Reported before and after every batch of a recall check ("checking recall…").

    ``step`` is the stage step the check is for; ``final`` is True for the end-of-stage check
    (False for a check during the stage, see ``TrainConfig.check_every``)."""

    stage: str
    step: int
    done: int  # prompts decoded so far
    total: int  # prompts in this check
    final: bool


@dataclass
class LogEvent:
    """A line for the log panel (level is a ``logging`` level name)."""

    level: str
    message: str


class TrainingDiverged(RuntimeError):
    """Too many consecutive non-finite steps; lower the learning rate."""


def fact_examples(tok: Tokenizer, facts: list[str], context_length: int) -> list[Example]:
    """BOS + fact + EOS per fact, every token learned; long facts are cut into context windows."""
    out = []
    for text in facts:
        if not text.strip():  # nothing to learn (Dataset.validate reports it)
            continue
        ids = chat_format.encode_fact(tok, text)
        out += _windows(ids, [1] * len(ids), context_length)
    return out


def dialogue_examples(tok: Tokenizer, dialogues, context_length: int) -> list[Example]:
    """One example per dialogue; only assistant answer tokens (and their EOS) are learned."""
    out = []
    for dlg in dialogues:
        ids, mask = chat_format.encode_dialogue(tok, dlg)
        if not any(mask):  # no turns: nothing to learn (Dataset.validate reports it)
            continue
        out += _windows(ids, mask, context_length)
    return out


def _windows(ids: list[int], mask: list[int], context_length: int) -> list[Example]:
    n = context_length + 1
    if len(ids) <= n:
        return [Example(ids, mask)]
    return [Example(ids[s:s + n], mask[s:s + n]) for s in range(0, len(ids) - 1, context_length)
            if any(mask[s + 1:s + n])]


def make_batch(examples: list[Example], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad examples into (tokens, targets, mask), each (batch, T) with T = longest example - 1.

    tokens[b, t] = ids[t], targets[b, t] = ids[t + 1], mask[b, t] = mask[t + 1] (0 on padding).
    """
    t = max(len(e.ids) for e in examples) - 1
    b = len(examples)
    tokens = np.full((b, t), pad_id, np.int32)
    targets = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), np.float32)
    for i, e in enumerate(examples):
        n = len(e.ids) - 1
        tokens[i, :n] = e.ids[:-1]
        targets[i, :n] = e.ids[1:]
        mask[i, :n] = e.mask[1:]
    return tokens, targets, mask


def batch_indices(seed: int, stage: int, step: int, n_examples: int, batch_size: int, stream: int = 0) -> list[int]:
    """Indices of the examples in batch ``step`` (0-based): a pure function of its arguments.

    Example order is the concatenation of per-epoch permutations of ``range(n_examples)``.
    """
    out = []
    pos = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(pos, n_examples)
        perm = np.random.default_rng([seed, stage, stream, epoch]).permutation(n_examples)
        take = min(batch_size - len(out), n_examples - offset)
        out += perm[offset:offset + take].tolist()
        pos += take
    return out


class Batches:
    """The training examples of a dataset and which of them make each batch: a pure function of
    (dataset, tokenizer, context length, train config, stage, step), needing no device (core.plan
    counts the padded tokens of planned steps with it).

    Attributes:
        facts, dialogues: examples of the dataset's facts and dialogues.
        questions: examples of the trained fact questions (``fact_questions``, core.augment).
        heldout_pairs: (question, answer) of the fact questions kept out of training (``heldout``).
        conversations: examples of several dialogues one after another (``conversation_every``).
    """

    def __init__(self, tokenizer, dataset: Dataset, context_length: int, train_config: TrainConfig):
        self.tokenizer, self.dataset, self.train_config = tokenizer, dataset, train_config
        cl = context_length
        self.facts = fact_examples(tokenizer, dataset.facts, cl)
        self.dialogues = dialogue_examples(tokenizer, dataset.dialogues, cl)
        self._asked: list[tuple[int, str, str]] = []
        self.questions, self.heldout_pairs = self._fact_questions(cl)
        self.conversations = self._conversations(cl)

    def stage_config(self, index: int) -> StageConfig:
        return self.train_config.pretrain if index == 0 else self.train_config.tune

    def _fact_questions(self, cl: int) -> tuple[list[Example], list[tuple[str, str]]]:
        """Training examples of the fact questions (core.augment) and the held-out (question, answer)
        pairs: all questions of ``heldout`` facts drawn with ``default_rng([seed, 7])``."""
        tc = self.train_config
        if not tc.fact_questions or not self.dialogues:
            return [], []
        qs = self._asked = augment.fact_questions(self.dataset, tc.fact_questions, tc.seed)
        facts = sorted({i for i, _, _ in qs})
        n_out = min(tc.heldout, len(facts) // 2)  # most facts with a question stay trained
        out = set(np.random.default_rng([tc.seed, 7]).choice(facts, n_out, replace=False).tolist()) if n_out else set()
        trained = [Dialogue([(q, a)]) for i, q, a in qs if i not in out]
        heldout = [(q, a) for i, q, a in qs if i in out]
        return dialogue_examples(self.tokenizer, trained, cl), heldout

    def _conversations(self, cl: int) -> list[Example]:
        """Conversations of 2-4 unrelated dialogues: the dataset's dialogues and as many trained fact
        questions (drawn with ``default_rng([seed, 6])``), so a conversation mostly asks what the user's
        chat will ask."""
        tc = self.train_config
        if not tc.conversation_every or not self.dialogues:
            return []
        singles = list(self.dataset.dialogues)
        if self.questions:
            held = set(self.heldout_pairs)
            asked = [Dialogue([(q, a)]) for _, q, a in self._asked if (q, a) not in held]
            pick = np.random.default_rng([tc.seed, 6]).permutation(len(asked))[:len(singles)]
            singles += [asked[i] for i in sorted(pick)]

        if chat_format.uses_file_template(self.tokenizer):
            def fits(turns) -> bool:
                return len(chat_format.encode_dialogue(self.tokenizer, Dialogue(turns))[0]) <= cl + 1
        else:  # our format tokenizes each turn on its own (its EOS ends a text run): BOS + the turns' tokens
            turn_tokens = {t: len(chat_format.encode_dialogue(self.tokenizer, Dialogue([t]))[0]) - 1
                           for d in singles for t in d.turns}

            def fits(turns) -> bool:
                return 1 + sum(turn_tokens[t] for t in turns) <= cl + 1

        convs = augment.conversations(singles, min(CONVERSATIONS, 2 * len(singles)), seed=tc.seed, fits=fits)
        return dialogue_examples(self.tokenizer, [Dialogue(t) for t in convs], cl)

    def _questions_part(self, stage: int, step: int, n: int) -> list[Example]:
        """``n`` question-and-answer examples of batch ``step``: dataset dialogues and, with
        ``fact_question_share``, fact questions (each from its own stream of epochs)."""
        tc, seed = self.train_config, self.train_config.seed
        n_q = min(n, int(round(n * tc.fact_question_share))) if self.questions else 0
        if not self.dialogues:
            n_q = n if self.questions else 0
        out = [self.dialogues[i] for i in batch_indices(seed, stage, step, len(self.dialogues), n - n_q)] \
            if n - n_q and self.dialogues else []
        if n_q:
            out += [self.questions[i] for i in batch_indices(seed, stage, step, len(self.questions), n_q, stream=3)]
        return out

    def conversation_step(self, step: int) -> bool:
        """Whether tuning batch ``step`` (0-based) is a batch of conversations."""
        k = self.train_config.conversation_every
        return bool(k and self.conversations and step % k == k - 1)

    def batch(self, stage: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, targets, mask) of batch ``step`` (0-based) of ``stage`` (core.trainer.make_batch)."""
        return make_batch(self.examples(stage, step), self.tokenizer.pad_id)

    def examples(self, stage: int, step: int) -> list[Example]:
        """The examples of batch ``step`` of ``stage``."""
        tc = self.train_config
        cfg, seed = self.stage_config(stage), tc.seed
        b = cfg.batch_size
        if stage == 0:
            n_mix = min(b - 1, int(round(b * tc.mix_share))) if (self.dialogues or self.questions) else 0
            pool = [self.facts[i] for i in batch_indices(seed, 0, step, len(self.facts), b - n_mix)]
            pool += self._questions_part(0, step, n_mix) if n_mix else []
        elif self.conversation_step(step):
            pool = [self.conversations[i] for i in batch_indices(seed, 1, step // tc.conversation_every,
                                                                 len(self.conversations), b, stream=2)]
        else:
            n_replay = int(round(b * tc.replay_share)) if self.facts else 0
            n_replay = min(n_replay, b - 1)  # at least one dialogue per tuning batch
            if not self.dialogues:
                n_replay = b
            pool = self._questions_part(1, step, b - n_replay) if b - n_replay else []
            if n_replay:
                pool += [self.facts[i] for i in batch_indices(seed, 1, step, len(self.facts), n_replay, stream=1)]
        return pool

    def passes(self, stage: int, steps: int) -> float:
        """Passes (epochs) over the facts (``stage`` 0) or the dataset's dialogues (1) that ``steps`` steps
        make (core.plan.passes: steps x the batch's share of them / their count)."""
        tc, cfg = self.train_config, self.stage_config(stage)
        b = cfg.batch_size
        if stage == 0:
            mix = min(b - 1, int(round(b * tc.mix_share))) if (self.dialogues or self.questions) else 0
            return steps * (b - mix) / len(self.facts) if self.facts else 0.0
        if not self.dialogues:
            return 0.0
        n_replay = min(b - 1, int(round(b * tc.replay_share))) if self.facts else 0
        n = b - n_replay
        n_d = n - (min(n, int(round(n * tc.fact_question_share))) if self.questions else 0)
        if tc.conversation_every and self.conversations:
            steps -= steps // tc.conversation_every
        return steps * n_d / len(self.dialogues)

    def padded_tokens(self, stage: int, step: int) -> int:
        """Tokens (rows x padded length) of batch ``step`` of ``stage``: what the step costs."""
        exs = self.examples(stage, step)
        return len(exs) * (max(len(e.ids) for e in exs) - 1)


class Trainer:
    """Trains a model on a dataset in two stages on one OpenCL device.

    Args:
        dataset: facts and dialogues.
        model_config: architecture; its ``vocab_size`` is replaced by the tokenizer's.
        train_config: stages, optimizer and seed.
        device: the OpenCL device (or an index / name / DeviceInfo to open).
        tokenizer: reuse a trained tokenizer (resume); trained on the dataset when None.
        weights: start from these weights (resume); random when None.

    Raises:
        ValueError: the dataset is empty or has nothing to learn; ConfigError: the model does not
            fit the device (see core.model.check_fits).
    """

    def __init__(self, dataset: Dataset, model_config: ModelConfig, train_config: TrainConfig,
                 device: Device, tokenizer: Tokenizer | None = None,
                 weights: dict[str, np.ndarray] | None = None):
        if not dataset.facts and not dataset.dialogues:
            raise ValueError("the dataset has no facts and no dialogues")
        if not isinstance(device, Device):
            from core.device import open_device

            device = open_device(device)  # an index, a name or a DeviceInfo
        self.dataset, self.train_config, self.dev = dataset, train_config, device
        if tokenizer is None:
            tokenizer = Tokenizer.train(dataset.tokenizer_texts(), vocab_size=train_config.vocab_size)
        self.tokenizer = tokenizer
        self.model_config = replace(model_config, vocab_size=tokenizer.vocab_size)
        cl = self.model_config.context_length
        self.batches = Batches(tokenizer, dataset, cl, train_config)
        self.facts, self.dialogues = self.batches.facts, self.batches.dialogues
        self.heldout_pairs = self.batches.heldout_pairs
        if not self.facts and not self.dialogues:
            raise ValueError("the dataset has nothing to learn: every fact and dialogue is empty")
        batch = max(train_config.pretrain.batch_size, train_config.tune.batch_size)
        micro = -(-batch // train_config.grad_accum)  # sequences per forward/backward
        self.model = Model(device, self.model_config, batch_size=micro, weights=weights, seed=train_config.seed,
                           freeze_embeddings=train_config.freeze_embeddings)
        self.base_meta: dict = {}  # what a model imported from a GGUF file keeps for its export
        self.stage_index = 0  # next stage to run
        self.stage_step = 0  # steps done in the current stage
        self.dataset_hash = dataset_hash(dataset)
        self.previous_dataset_hashes: tuple[str, ...] = ()  # earlier datasets of a resumed run
        self._guard = _UpdateGuard(self.model)
        self._stop = False
        self._check_s = 0.0  # seconds the last recall check took
        self._facts_kept: tuple[int, int] | None = None  # facts of pretraining's last check (tuning keeps them)
        self.last_loss = float("nan")

    # ------------------------------------------------------------------ control
    def request_stop(self) -> None:
        """Ask the run to stop; honoured before the next step starts and before the next recall prompt
        (thread-safe flag)."""
        self._stop = True

    @property
    def done(self) -> bool:
        """True when both stages have run all their steps."""
        return self.stage_index >= len(STAGES)

    def stage_config(self, index: int) -> StageConfig:
        """The settings of stage ``index`` (0 = pretrain, 1 = tune)."""
        return self.train_config.pretrain if index == 0 else self.train_config.tune

    # ------------------------------------------------------------------ batches
    def _batch(self, stage: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.batches.batch(stage, step)

    def passes(self, stage: int, steps: int) -> float:
        """Passes (epochs) over the facts (``stage`` 0) or the dialogues (1) that ``steps`` steps make."""
        return self.batches.passes(stage, steps)

    def _stage_has_data(self, stage: int) -> bool:
        return bool(self.facts) if stage == 0 else bool(self.dialogues)

    # ------------------------------------------------------------------ the loop
    def run(self, recall: bool = True) -> Iterator[StepReport | StageFinished | StageReport | RecallProgress | LogEvent]:
        """Run (or continue) training; yields a StepReport per step, a StageReport per stage end.

        Yields :class:`StageFinished` when a stage's steps are done (save then), then runs the
        recall check (a :class:`RecallProgress` before and after each batch of prompts) and yields the
        :class:`StageReport`. With ``check_every``, a stage also checks recall of what it teaches every
        ``check_every`` steps and ends early when it is learned, when ``patience`` checks bring no
        better count, or at its share of ``time_budget_s`` (``StageReport.end_reason`` says which).

        Stops early, with a StageReport whose ``stopped`` is True, when :meth:`request_stop` was
        called (between two steps; during a recall check the check is cut short and the run stops
        after its StageReport). A step whose loss or gradient is not finite is skipped, and one whose
        AdamW update makes any weight non-finite is undone (weights and moments restored). Raises
        TrainingDiverged after 25 such steps in a row (weights are kept from the last good step).
        """
        self._stop = False
        t_start = time.perf_counter()
        tc = self.train_config
        if self.stage_index == 0 and self.stage_step == 0:
            for msg in self.warnings():
                yield LogEvent("WARNING", msg)
        while self.stage_index < len(STAGES):
            si = self.stage_index
            cfg, name = self.stage_config(si), STAGES[si]
            if not self._stage_has_data(si) or cfg.steps == 0:
                yield LogEvent("INFO", f"{name}: skipped ({'no steps' if cfg.steps == 0 else 'no data for this stage'})")
                self.stage_index += 1
                self.stage_step = 0
                continue
            if self.stage_step == 0:
                yield LogEvent("INFO", f"{name}: {cfg.steps} steps, lr {cfg.lr:g}, batch {cfg.batch_size}")
            bad_in_a_row = 0
            deadline = self._deadline(si, t_start)
            end_reason, best, since_best, last_check = "steps", -1, 0, None
            while self.stage_step < cfg.steps:
                if self._stop:
                    yield StageReport(name, self.stage_step, stopped=True, end_reason="stopped")
                    return
                if deadline is not None and time.perf_counter() + self._check_s >= deadline:
                    end_reason = "time budget"
                    yield LogEvent("INFO", f"{name}: time budget reached at step {self.stage_step}")
                    break
                step = self.stage_step
                t0 = time.perf_counter()
                tokens, targets, mask = self._batch(si, step)
                stats = self._forward_backward(tokens, targets, mask)
                lr = lr_at(cfg, step)
                finite = math.isfinite(stats.loss) and math.isfinite(stats.grad_norm)
                clipped = undone = False
                if finite:
                    scale = 1.0
                    if tc.grad_clip > 0 and stats.grad_norm > tc.grad_clip:
                        scale, clipped = tc.grad_clip / (stats.grad_norm + 1e-6), True
                    self._guard.save()
                    self.model.optimizer_step(lr, tc.weight_decay, tc.beta1, tc.beta2, tc.adam_eps, scale)
                    if self._guard.finite():
                        self.last_loss = stats.loss
                        bad_in_a_row = 0
                    else:  # the update itself overflowed: undo it, like a non-finite gradient step
                        self._guard.restore()
                        finite, undone = False, True
                if not finite:
                    bad_in_a_row += 1
                self.stage_step += 1  # the step is taken: count it before anything can interrupt
                self.dev.finish()
                dt = time.perf_counter() - t0
                rep = StepReport(name, self.stage_step, cfg.steps, stats.loss, stats.grad_norm,
                                 stats.layer_grad_norms, lr, clipped, not finite,
                                 stats.tokens / max(dt, 1e-9), time.perf_counter() - t_start)
                yield rep
                if undone:
                    yield LogEvent("WARNING", f"{name} step {self.stage_step}: the update at lr {lr:g} made "
                                              "weights non-finite; step undone, weights kept")
                elif not finite:
                    yield LogEvent("WARNING", f"{name} step {self.stage_step}: loss {stats.loss} / grad norm "
                                              f"{stats.grad_norm} not finite; step skipped, weights kept")
                if not finite and bad_in_a_row >= 25:
                    raise TrainingDiverged(
                        f"{bad_in_a_row} steps in a row had a non-finite loss, gradient or update at lr {lr:g}; "
                        "lower the learning rate (the weights of the last good step are kept)")
                if tc.check_every and self.stage_step % tc.check_every == 0 and self.stage_step < cfg.steps \
                        and not self._stop:
                    kinds = STAGE_KINDS[si]
                    items = yield from self._check(name, kinds, final=False)
                    if self._stop:
                        continue  # the stop is reported at the top of the loop
                    last_check = (self.stage_step, kinds, items)
                    counts = {k: count(items, k) for k in kinds}
                    yield LogEvent("INFO", f"{name} step {self.stage_step}: " + ", ".join(
                        f"{o} of {n} {_NOUN[k]}" for k, (o, n) in counts.items()) + " reproduced")
                    ok = sum(o for o, _ in counts.values())
                    if all(o >= self._wanted(k, n) for k, (o, n) in counts.items()):
                        end_reason = "learned"
                        break
                    if ok > best:
                        best, since_best = ok, 0
                    elif self.stage_step > cfg.decay_steps:  # patience only once the planned steps are done
                        since_best += 1
                        if tc.patience and since_best >= tc.patience:
                            end_reason = "no progress"
                            yield LogEvent("INFO", f"{name}: no better recall in {since_best} checks; stage ends")
                            break
            if si == 0 and last_check is not None:
                self._facts_kept = count(last_check[2], "fact")
            report = StageReport(name, self.stage_step, stopped=False, end_reason=end_reason)
            self.stage_index += 1
            self.stage_step = 0
            yield StageFinished(name, report.steps_done)
            if recall and not self._stop:
                kinds, reuse = KINDS, []
                if last_check is not None and last_check[0] == report.steps_done and not tc.check_sample:
                    # checked (all items) at this very step
                    kinds = tuple(k for k in KINDS if k not in last_check[1])
                    reuse = last_check[2]
                last = si == len(STAGES) - 1 or not self._stage_has_data(si + 1) or self.stage_config(si + 1).steps == 0
                items = yield from self._check(name, kinds, final=True, sample=0 if last else None)
                report.recall = sorted(reuse + items, key=lambda r: (KINDS.index(r.kind), r.index))
                report.recall_stopped = self._stop
                f_ok, f_n = report.facts_recalled
                d_ok, d_n = report.dialogues_recalled
                cut = " (check stopped early)" if report.recall_stopped else ""
                more = "".join(f", {_NOUN[k]} {o}/{n}" for k in ("chat", "heldout")
                               for o, n in [count(report.recall, k)] if n)
                yield LogEvent("INFO", f"{name} done: facts recalled {f_ok}/{f_n}, dialogue answers {d_ok}/{d_n}"
                                       f"{more}{cut}")
            else:
                report.recall_stopped = recall
            yield report
            if self._stop:
                return

    def _forward_backward(self, tokens, targets, mask):
        """Gradients of one batch, in ``grad_accum`` micro-batches when it is set (same result)."""
        k = self.train_config.grad_accum
        if k <= 1:
            return self.model.forward_backward(tokens, targets, mask)
        total = float(np.asarray(mask).sum())
        micro = self.model.batch_size
        stats, loss_sum, started = None, 0.0, False
        for s in range(0, len(tokens), micro):
            m = mask[s:s + micro]
            if not m.any():
                continue
            stats = self.model.forward_backward(tokens[s:s + micro], targets[s:s + micro], m,
                                                accumulate=started, total_count=total)
            loss_sum += stats.loss * stats.tokens
            started = True
        stats.loss, stats.tokens = loss_sum / total, int(total)
        return stats

    def warnings(self) -> list[str]:
        """What the user should know before training: dataset problems (special-token text,
        entries longer than the context, empty entries) and a vocabulary llama.cpp cannot load."""
        out = [str(p) for p in self.dataset.validate(self.tokenizer, self.model_config.context_length + 1)]
        if not self.tokenizer.merges() and isinstance(self.tokenizer, Tokenizer):
            out.append("the dataset is too small to learn any word pieces (the vocabulary has no merges): "
                       "the model trains, but llama.cpp cannot load its GGUF export; add more text")
        return out

    # ------------------------------------------------------------------ evaluation
    def generator(self):
        """A :class:`core.generate.Generator` with a snapshot of the current weights."""
        from core.generate import Generator

        return Generator(self.dev, self.model_config, self.model.params)

    def recall(self, kinds: tuple[str, ...] = KINDS) -> list[RecallItem]:
        """Greedy recall of every fact (its rest from its first words) and every dialogue turn, decoded
        in batches on the device (core.recall); cut short (a partial table) when :meth:`request_stop`
        is called."""
        items = []
        for _done, _total, items in recall_check(self.model, self.tokenizer, self.dataset, kinds,
                                                 should_stop=lambda: self._stop, heldout=self.heldout_pairs):
            pass
        return items

    def _wanted(self, kind: str, n: int) -> int:
        """Items of ``kind`` (of ``n`` checked) a check during a stage needs for "learned": ``recall_target``
        of them; for facts during tuning, what pretraining's last check reproduced is enough (tuning
        teaches answers and must keep the facts, not learn the ones pretraining could not)."""
        want = math.ceil(self.train_config.recall_target * n - 1e-9)
        if kind == "fact" and self.stage_index == 1 and self._facts_kept and self._facts_kept[1] == n:
            want = min(want, self._facts_kept[0])
        return want

    def _check(self, stage: str, kinds: tuple[str, ...], final: bool, sample: int | None = None):
        """Recall check of ``kinds`` as a sub-generator: yields RecallProgress per batch, returns the items.
        Its duration is kept (``_check_s``) so a time budget leaves room for the next check. ``sample``:
        items per kind (core.recall.recall_prompts; None: ``check_sample``, 0: all)."""
        t0 = time.perf_counter()
        items: list[RecallItem] = []
        sample = self.train_config.check_sample if sample is None else sample
        for done, total, items in recall_check(self.model, self.tokenizer, self.dataset, kinds,
                                               should_stop=lambda: self._stop, heldout=self.heldout_pairs,
                                               sample=sample):
            yield RecallProgress(stage, self.stage_step if not final else 0, done, total, final)
        self._check_s = time.perf_counter() - t0
        return items

    def _deadline(self, stage: int, t_start: float) -> float | None:
        """perf_counter time at which stage ``stage`` must end under ``time_budget_s`` (None: no budget).

        Pretraining gets the share of the budget its steps have of both stages' steps; tuning gets the
        rest of the budget (what pretraining did not use included)."""
        tc = self.train_config
        if not tc.time_budget_s:
            return None
        if stage == 1:
            return t_start + tc.time_budget_s
        steps = [tc.pretrain.steps if self.facts else 0, tc.tune.steps if self.dialogues else 0]
        return t_start + tc.time_budget_s * steps[0] / max(1, sum(steps))

    def validation_loss(self) -> dict[str, float]:
        """Mean loss (nats/token) over all fact examples and all dialogue examples, no gradients."""
        out = {}
        for name, exs in (("facts", self.facts), ("dialogues", self.dialogues)):
            if not exs:
                continue
            total, count = 0.0, 0.0
            b = self.model.batch_size
            for s in range(0, len(exs), b):
                loss, n = self.model.loss(*make_batch(exs[s:s + b], self.tokenizer.pad_id))
                total, count = total + loss * n, count + n
            out[name] = total / max(count, 1.0)
        return out


def recall_table(gen, tok: Tokenizer, dataset: Dataset, max_tokens: int | None = None,
                 should_stop=None) -> list[RecallItem]:
    """Check, with greedy decoding, which facts and dialogue answers the model reproduces, one prompt at a
    time through a :class:`core.generate.Generator` (the chat's decoding path). Training uses the batched
    :func:`core.recall.recall_check`; this is its reference.

    Facts: the model gets BOS + the fact's first words and must continue with the rest exactly.
    Dialogues: for each turn, the model gets the previous turns and the question and must answer
    exactly (surrounding whitespace ignored). ``should_stop()``, checked before each prompt, ends the
    check early (the items so far are returned).
    """
    stop = should_stop or (lambda: False)
    from core.generate import SamplingSettings

    items = []
    limit = max_tokens or gen.config.context_length
    stops = chat_format.stop_ids(tok)
    for i, fact in enumerate(dataset.facts):
        if stop():
            return items
        prompt, expected = fact_split(fact)
        if not expected:
            continue
        ids = chat_format.fact_prompt_ids(tok, prompt)
        if len(ids) >= gen.config.context_length:
            continue
        n = min(limit, len(tok.encode(expected)) + 8)  # an exact answer needs no more
        settings = SamplingSettings(temperature=0.0, max_tokens=min(n, gen.config.context_length - len(ids)))
        out = [t for t, _ in gen.generate(ids, settings, stop_ids=stops)]
        got = tok.decode([t for t in out if t not in stops])
        items.append(RecallItem("fact", i, prompt, expected, got, got.strip() == expected.strip()))
    for i, dlg in enumerate(dataset.dialogues):
        history = []
        for user, answer in dlg.turns:
            if stop():
                return items
            ids = chat_format.prompt_ids(tok, history, user, system=dlg.system)
            history.append((user, answer))
            if len(ids) >= gen.config.context_length:
                continue
            n = min(limit, len(tok.encode(answer)) + 8)
            settings = SamplingSettings(temperature=0.0, max_tokens=min(n, gen.config.context_length - len(ids)))
            out = [t for t, _ in gen.generate(ids, settings, stop_ids=stops)]
            got = tok.decode([t for t in out if t not in stops])
            items.append(RecallItem("dialogue", i, user, answer, got.strip(), got.strip() == answer.strip()))
    return items


class _UpdateGuard:
    """Undo an AdamW update that made a weight non-finite: device copies of weights and moments are
    taken before the update, and one device sum of squares over all weights (NaN or inf if any weight
    is, or is so large, above about 1.8e19, that its square overflows float32: no model survives such
    weights either) tells whether to put them back."""

    def __init__(self, model: Model):
        from core.params import TensorStore

        self.model = model
        self.copies = [TensorStore(model.dev, s.layout) for s in self._stores()]
        self._sum = model.dev.zeros(1)
        self._adam_step = 0

    def _stores(self):
        m = self.model
        return (m.params, m.m, m.v)

    def save(self) -> None:
        """Copy weights and moments (device to device) before an update."""
        for dst, src in zip(self.copies, self._stores()):
            dst.copy_from(src)
        self._adam_step = self.model.adam_step

    def finite(self) -> bool:
        """Whether every weight is finite (one reduction and one float downloaded)."""
        m = self.model
        m.ops.reduce.sum_squares(self._sum, 0, m.params.flat, m.layout.total)
        return bool(np.isfinite(m.dev.download(self._sum, (1,))[0]))

    def restore(self) -> None:
        """Put back what :meth:`save` copied (weights, moments, step counter)."""
        for src, dst in zip(self.copies, self._stores()):
            dst.copy_from(src)
        self.model.adam_step = self._adam_step
