"""Two-stage training: pretrain on facts, then tune on User/Assistant dialogues.

The :class:`Trainer` is an iterator API a GUI thread or the CLI drives::

    trainer = Trainer(dataset, model_config, train_config, device)
    for event in trainer.run():          # StepReport, StageReport, LogEvent
        ...
        if user_pressed_stop: trainer.request_stop()   # honoured before the next step

Stage 1 (Stage.PRETRAIN) learns every token of every fact (BOS + fact + EOS), with ``mix_share`` of each
batch from the question-and-answer examples. Stage 2 (Stage.DIALOGUES) learns only the assistant tokens of each
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
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from core import chat_format
from core.batches import (  # noqa: F401
    Batches,
    Example,
    batch_indices,
    dialogue_examples,
    fact_examples,
    make_batch,
)
from core.config import ModelConfig, StageConfig, TrainConfig, lr_at, replace
from core.dataset import Dataset, dataset_hash
from core.device import Device
from core.model import Model
from core.known import as_before, split_replayed
from core.recall import KINDS, RecallItem, fact_prompt_words, fact_split, recall_check, sampled, tally
from core.events import LogEvent, RecallProgress, StageFinished, StageReport, StepReport  # noqa: F401 (re-exported)
from core.stages import STAGES, Stage  # noqa: F401 (STAGES: the run order, for callers)
from core.wording import count_words
from core.tokenizer import Tokenizer

if TYPE_CHECKING:
    from core.lora import LoRAConfig
    from core.quant_base import RawBase
    from core.recall import CheckSpeed
    from core.generate import Generator

log = logging.getLogger(__name__)

FACTS_KEPT = 0.97
"""Share of the facts pretraining's last check reproduced that tuning must keep to end "learned"."""
STAGE_KINDS = (("fact",), ("fact", "dialogue", "chat", "question"))
"""What each stage must reproduce, and so what its checks during the stage look at (tuning replays the
facts, so it must keep them as well as learn the answers, and the questions written for facts that it trains)."""
_NOUN = {"fact": "facts", "dialogue": "dialogue answers", "chat": "answers in a conversation",
         "heldout": "held-out answers", "question": "written questions"}


def stage_line(report: StageReport, replayed_from: int | None = None) -> str:
    """The log line of a stage's end: "pretrain done: facts recalled 9/10, dialogue answers 0/0" and what
    the check left out (stopped early, only a sample). ``replayed_from``: the first dialogue that replays the
    base model's answer to a general question (core.known); those are counted apart, "general questions 9/10"."""
    own, general = (list(report.recall), []) if replayed_from is None else split_replayed(report.recall, replayed_from)
    f_ok, f_n = tally(own, "fact")
    d_ok, d_n = tally(own, "dialogue")
    cut = " (check stopped early)" if report.recall_stopped else ""
    cut += "".join(f" (a sample: {_NOUN[k]} {c:,} of {n:,} checked)" for k, (c, n) in report.recall_sampled.items())
    more = "".join(f", {_NOUN[k]} {o}/{n}" for k in ("question", "chat", "heldout") for o, n in [tally(own, k)] if n)
    more += f", general questions {sum(map(as_before, general))}/{len(general)}" if general else ""
    return f"{report.stage} done: facts recalled {f_ok}/{f_n}, dialogue answers {d_ok}/{d_n}{more}{cut}"


class TrainingDiverged(RuntimeError):
    """Too many consecutive non-finite steps; lower the learning rate."""


DIVERGED_AFTER = 25
"""Non-finite steps in a row after which a run raises :class:`TrainingDiverged`."""


class EarlyStop:
    """Whether a stage ends before its last step, judged at each recall check during it (``check_every``).

    A stage ends "learned" once a check that looked at every item of each kind (``complete``) reproduces,
    of every kind it looks at, what ``wanted(kind, n)`` asks (and ``learned_after`` of its planned steps are
    done). A sampled check never ends it: on the 1,800 facts of tests/make_datasets.py "people" a sample of
    64 read 64 of 64 at 60 % of the planned steps, when 1,775 of 1,800 were known at the stage's end.
    Once the planned steps (``decay_steps``) are done, with ``min_gain`` every check looks at all items and
    the stage ends "no progress" when one gains fewer than ``min_gain`` of them over the check before
    (the planned steps' last check included: :meth:`due` runs one there); without ``min_gain``, once
    ``patience`` checks after the planned steps bring no better sum of reproduced items.

    Args:
        train_config: ``check_every``, ``patience``, ``learned_after``, ``min_gain``.
        stage_config: the stage's ``steps`` and ``decay_steps``.
        wanted: ``(kind, n checked) -> items needed`` (Trainer._wanted).
    """

    def __init__(self, train_config: TrainConfig, stage_config: StageConfig,
                 wanted: Callable[[str, int], int]) -> None:
        self.tc, self.cfg, self.wanted = train_config, stage_config, wanted
        self.best, self.since_best = -1, 0
        self.last_complete: int | None = None  # items reproduced by the last complete check after the planned steps
        self.why = ""

    def due(self, step: int) -> bool:
        """Whether a recall check runs after step ``step`` (1-based; never after the stage's last step):
        every ``check_every`` steps, and at the planned steps' end when the stage may go on after it."""
        every, cfg = self.tc.check_every, self.cfg
        planned_end = 0 < cfg.decay_steps < cfg.steps and step == cfg.decay_steps
        return bool(every) and (step % every == 0 or planned_end) and step < cfg.steps

    def complete_due(self, step: int) -> bool:
        """Whether the check after step ``step`` must look at every item (the planned steps done, ``min_gain``)."""
        return bool(self.tc.min_gain and self.cfg.decay_steps) and step >= self.cfg.decay_steps

    def judge(self, step: int, counts: dict[str, tuple[int, int]], complete: bool = True) -> str | None:
        """"learned", "no progress" or None (go on), from one check's ``{kind: (reproduced, checked)}``;
        ``complete``: the check looked at every item of each kind (not a sample)."""
        cfg = self.cfg
        if complete and all(o >= self.wanted(k, n) for k, (o, n) in counts.items()) \
                and step >= self.tc.learned_after * (cfg.decay_steps or cfg.steps):
            return "learned"
        ok = sum(o for o, _ in counts.values())
        if self.complete_due(step):
            if not complete:
                return None
            n = sum(n for _, n in counts.values())
            before, self.last_complete = self.last_complete, ok
            if before is not None and ok - before < self.tc.min_gain * n:
                self.why = (f"{ok - before:+d} of {n:,} items since the check before (less than "
                            f"{self.tc.min_gain:.0%}); stage ends")
                return "no progress"
            return None
        if ok > self.best:
            self.best, self.since_best = ok, 0
        elif step > cfg.decay_steps:  # patience only once the planned steps are done
            self.since_best += 1
            if self.tc.patience and self.since_best >= self.tc.patience:
                self.why = f"no better recall in {self.since_best} checks; stage ends"
                return "no progress"
        return None


def max_seq_of(batches: Batches, micro_batch: int) -> int:
    """The ``max_seq`` of a trainer's :class:`core.model.Model` of ``micro_batch`` rows: the longest row of
    any training batch (``Batches.longest_row``), or more where a recall check's longest row
    (core.recall.longest_forward of every prompt of every kind) needs ``micro_batch x max_seq`` tokens for
    itself; at most the context. Every batch the run gives the model then fits its buffers."""
    from core.recall import longest_forward, recall_prompts

    cl = batches.context_length
    # every prompt (no FULL_CHECK_MAX cap: a sampled check during a stage draws from all of them)
    prompts = recall_prompts(batches.tokenizer, batches.dataset, cl, KINDS, batches.heldout_pairs, sample=sys.maxsize,
                             questions=batches.question_pairs)
    return min(cl, max(batches.longest_row(), -(-longest_forward(prompts, cl) // micro_batch)))


class Trainer:
    """Trains a model on a dataset in two stages on one OpenCL device.

    Args:
        dataset: facts and dialogues.
        model_config: architecture; its ``vocab_size`` is replaced by the tokenizer's.
        train_config: stages, optimizer and seed.
        device: the OpenCL device (or an index / name / DeviceInfo to open).
        tokenizer: reuse a trained tokenizer (resume); trained on the dataset when None.
        weights: start from these weights (resume); random when None.
        lora: train low-rank adapters on the frozen ``weights`` instead of every parameter (core/lora.py).
        adapter: the adapters to start from (resume of a LoRA run); new ones (B = 0) when None.
        check_memory: called with the model's ``max_seq`` (:func:`max_seq_of` the data) before the model is
            built; raises to refuse the run (the CLI's memory line, core.run.RunHooks.check_memory).

    The model's buffers are sized for the longest batch the run can make (``Model.max_seq``, at most the
    context): every training batch and every recall check fits them.

    Raises:
        ValueError: the dataset is empty or has nothing to learn; ConfigError: the model does not
            fit the device (see core.model.check_fits).
    """

    def __init__(self, dataset: Dataset, model_config: ModelConfig, train_config: TrainConfig,
                 device: Device, tokenizer: Tokenizer | None = None,
                 weights: dict[str, np.ndarray] | None = None, lora: LoRAConfig | None = None,
                 adapter: dict[str, np.ndarray] | None = None, quantized: RawBase | None = None,
                 check_memory: Callable[[int], None] | None = None):
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
        self.question_pairs = self.batches.question_pairs
        if not self.facts and not self.dialogues:
            raise ValueError("the dataset has nothing to learn: every fact and dialogue is empty")
        batch = max(train_config.pretrain.batch_size, train_config.dialogues.batch_size)
        micro = -(-batch // train_config.grad_accum)  # sequences per forward/backward
        max_seq = max_seq_of(self.batches, micro)
        if check_memory is not None:
            check_memory(max_seq)
        self.model = Model(device, self.model_config, batch_size=micro, weights=weights, seed=train_config.seed,
                           freeze_embeddings=train_config.freeze_embeddings, lora=lora, adapter=adapter,
                           quantized=quantized, max_seq=max_seq)
        self.base_meta: dict = {}  # what a model imported from a GGUF file keeps for its export
        self.stage_index = 0  # next stage to run
        self.stage_step = 0  # steps done in the current stage
        self.stages_run: list[int] = []  # steps each finished stage ran (CheckpointMeta.stages_run)
        self.dataset_hash = dataset_hash(dataset)
        self.previous_dataset_hashes: tuple[str, ...] = ()  # earlier datasets of a resumed run
        self.replayed_from: int | None = None  # a fine-tune's first replayed general question (core.run; stage_line)
        self._stop = False
        self._check_s = 0.0  # seconds the last recall check took
        # how fast the model decodes (core.recall.CheckSpeed, measured by core.from_base.estimate_time): the
        # recall checks then decode each batch together or one prompt at a time, whichever is faster (core.recall)
        self.check_speed: CheckSpeed | None = None
        self._check_sizes: dict[str, int] = {}  # prompts per kind before sampling (core.recall.recall_prompts)
        self._check_left_out: dict[str, dict[str, int]] = {}  # {kind: {why: n}} not asked (recall_prompts)
        self._facts_kept: tuple[int, int] | None = None  # facts of pretraining's end (tuning keeps them)
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
        """The settings of stage ``index`` (``Stage.at(index)``: 0 pretraining, 1 the dialogues)."""
        return self.train_config.pretrain if index == 0 else self.train_config.dialogues

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
        better count (:class:`EarlyStop`), or at its share of ``time_budget_s`` (``StageReport.end_reason``
        says which).

        Stops early, with a StageReport whose ``stopped`` is True, when :meth:`request_stop` was
        called (between two steps; during a recall check the check is cut short and the run stops
        after its StageReport). A step whose loss or gradient is not finite is skipped, and one whose
        AdamW update would make any weight or moment non-finite is not applied (Model.optimizer_step checks
        it first). Raises
        TrainingDiverged after 25 such steps in a row (weights are kept from the last good step).
        """
        self._stop = False
        t_start = time.perf_counter()
        if self.stage_index == 0 and self.stage_step == 0:
            for msg in self.warnings():
                yield LogEvent("WARNING", msg)
        while self.stage_index < len(STAGES):
            stage, cfg = Stage.at(self.stage_index), self.stage_config(self.stage_index)
            if not self._stage_has_data(stage.index) or cfg.steps == 0:
                yield LogEvent("INFO", f"{stage}: skipped ({'no steps' if cfg.steps == 0 else 'no data for this stage'})")
                self._ran(self.stage_index, 0)
                self.stage_index, self.stage_step = self.stage_index + 1, 0
                continue
            if self.stage_step == 0:
                planned = (f"{count_words(cfg.decay_steps, 'step')} planned, at most {cfg.steps:,}"
                           if 0 < cfg.decay_steps < cfg.steps else count_words(cfg.steps, "step"))
                yield LogEvent("INFO", f"{stage}: {planned}, lr {cfg.lr:g}, batch {cfg.batch_size}")
            ended = yield from self._stage_steps(stage, cfg, t_start)
            if ended is None:  # stopped between two steps
                return
            yield from self.end_stage(stage, *ended, recall=recall)
            if self._stop:
                return

    def _stage_steps(self, stage: Stage, cfg: StageConfig, t_start: float):
        """The steps of ``stage`` from ``stage_step`` on, with its checks during the stage, as a sub-generator.

        Returns ``(end_reason, last_check)`` (``last_check``: ``(step, kinds, items, complete)`` of the last check
        during the stage, or None), or None when a stop request ended it (its StageReport yielded)."""
        early = EarlyStop(self.train_config, cfg, self._wanted)
        deadline = self._deadline(stage.index, t_start)
        bad_in_a_row, last_check = 0, None
        while self.stage_step < cfg.steps:
            if self._stop:
                yield StageReport(stage, self.stage_step, stopped=True, end_reason="stopped")
                return None
            if deadline is not None and time.perf_counter() + self._check_s >= deadline:
                yield LogEvent("INFO", f"{stage}: time budget reached at step {self.stage_step}")
                return "time budget", last_check
            rep, undone = self.step(stage, t_start)
            bad_in_a_row = bad_in_a_row + 1 if rep.skipped else 0
            yield rep
            if undone:
                yield LogEvent("WARNING", f"{stage} step {rep.step}: the update at lr {rep.lr:g} made "
                                          "weights non-finite; step not applied, weights kept")
            elif rep.skipped:
                yield LogEvent("WARNING", f"{stage} step {rep.step}: loss {rep.loss} / grad norm "
                                          f"{rep.grad_norm} not finite; step skipped, weights kept")
            if rep.skipped and bad_in_a_row >= DIVERGED_AFTER:
                raise TrainingDiverged(
                    f"{bad_in_a_row} steps in a row had a non-finite loss, gradient or update at lr {rep.lr:g}; "
                    "lower the learning rate (the weights of the last good step are kept)")
            if not early.due(self.stage_step) or self._stop:
                continue
            kinds = STAGE_KINDS[stage.index]
            items = yield from self._check(stage, kinds, final=False,
                                           sample=0 if early.complete_due(self.stage_step) else None)
            if self._stop:
                continue  # the stop is reported at the top of the loop
            complete = not set(sampled(self._check_sizes, items)) & set(kinds)  # sizes: every kind seen so far
            last_check = (self.stage_step, kinds, items, complete)
            counts = {k: tally(items, k) for k in kinds}
            yield LogEvent("INFO", f"{stage} step {self.stage_step}: " + ", ".join(
                f"{o:,} of {n:,} {_NOUN[k]}" for k, (o, n) in counts.items()) + " reproduced")
            reason = early.judge(self.stage_step, counts, complete)
            if reason == "no progress":
                yield LogEvent("INFO", f"{stage}: {early.why}")
            if reason is not None:
                return reason, last_check
        return "steps", last_check

    def step(self, stage: Stage, t_start: float | None = None) -> tuple[StepReport, bool]:
        """One optimizer step of ``stage`` at ``stage_step`` (which it advances): gradients of the step's
        batch, clipping to ``grad_clip``, the AdamW update (not applied when it would make a weight non-finite).

        Returns ``(report, undone)``: ``report.skipped`` when the loss, the gradient or the update was not
        finite (the weights are those before the step); ``undone`` when it was the update. ``t_start``:
        the run's start (perf_counter seconds) for ``elapsed_s`` (None: this step's start)."""
        tc, cfg, step = self.train_config, self.stage_config(stage.index), self.stage_step
        t0 = time.perf_counter()
        stats = self._forward_backward(*self._batch(stage.index, step))
        lr = lr_at(cfg, step)
        finite = math.isfinite(stats.loss) and math.isfinite(stats.grad_norm)
        clipped = undone = False
        if finite:
            scale = 1.0
            if tc.grad_clip > 0 and stats.grad_norm > tc.grad_clip:
                scale, clipped = tc.grad_clip / (stats.grad_norm + 1e-6), True
            if self.model.optimizer_step(lr, tc.weight_decay, tc.beta1, tc.beta2, tc.adam_eps, scale):
                self.last_loss = stats.loss
            else:  # the update itself would have overflowed: not applied, like a non-finite gradient step
                finite, undone = False, True
        self.stage_step += 1  # the step is taken: count it before anything can interrupt
        self.dev.finish()
        now = time.perf_counter()
        offset = 0 if stage is Stage.PRETRAIN else tc.pretrain.steps
        rep = StepReport(stage, self.stage_step, cfg.steps, offset + self.stage_step, stats.loss, stats.grad_norm,
                         tuple(stats.layer_grad_norms), lr, clipped, not finite, stats.tokens / max(now - t0, 1e-9),
                         now - (t0 if t_start is None else t_start), self.passes(stage.index, self.stage_step))
        return rep, undone

    def _ran(self, si: int, steps: int) -> None:
        """Record that stage ``si`` ran ``steps`` steps (:attr:`stages_run`; a checkpoint from before that field
        leaves the earlier stages at their most steps)."""
        earlier = [*self.stages_run[:si], *(self.stage_config(k).steps for k in range(len(self.stages_run), si))]
        self.stages_run = [*earlier, steps]

    def end_stage(self, stage: Stage, end_reason: str = "steps", last_check: tuple | None = None,
                  recall: bool = True):
        """End ``stage`` (its steps done, ``stage_index`` moves on): yields :class:`StageFinished` (save
        then), the end-of-stage recall check (RecallProgress, skipped with ``recall=False``; the kinds the
        ``last_check`` during the stage covered at this very step are reused), its LogEvent line and the
        :class:`StageReport`."""
        si = stage.index
        if si == 0 and last_check is not None:
            self._facts_kept = tally(last_check[2], "fact")
        steps_done = self.stage_step
        self.stage_index, self.stage_step = si + 1, 0
        self._ran(si, steps_done)
        yield StageFinished(stage, steps_done)
        if not recall or self._stop:
            yield StageReport(stage, steps_done, stopped=False, recall_stopped=recall, end_reason=end_reason)
            return
        kinds, reuse = KINDS, []
        if last_check is not None and last_check[0] == steps_done and last_check[3]:
            # checked (all items) at this very step
            kinds = tuple(k for k in KINDS if k not in last_check[1])
            reuse = last_check[2]
        last = si == len(STAGES) - 1 or not self._stage_has_data(si + 1) or self.stage_config(si + 1).steps == 0
        items = yield from self._check(stage, kinds, final=True, sample=0 if last else None)
        table = tuple(sorted(reuse + items, key=lambda r: (KINDS.index(r.kind), r.index)))
        report = StageReport(stage, steps_done, False, table, self._stop, sampled(self._check_sizes, table),
                             end_reason, {k: v for k, v in self._check_left_out.items() if v})
        if si == 0 and not self._stop and tally(table, "fact")[1]:
            self._facts_kept = tally(table, "fact")  # what pretraining ended with
        yield LogEvent("INFO", stage_line(report, self.replayed_from))
        yield report

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
    def generator(self) -> Generator:
        """A :class:`core.generate.Generator` with a snapshot of the current weights."""
        from core.generate import Generator

        return Generator(self.dev, self.model_config, self.model.inference_weights())

    def recall(self, kinds: tuple[str, ...] = KINDS) -> list[RecallItem]:
        """Greedy recall of every fact (its rest from its first words) and every dialogue turn, decoded
        in batches on the device (core.recall); cut short (a partial table) when :meth:`request_stop`
        is called."""
        items = []
        for _done, _total, items in recall_check(self.model, self.tokenizer, self.dataset, kinds,
                                                 should_stop=lambda: self._stop, heldout=self.heldout_pairs,
                                                 speed=self.check_speed, questions=self.question_pairs):
            pass
        return items

    def _wanted(self, kind: str, n: int) -> int:
        """Items of ``kind`` (of ``n`` checked) a check during a stage needs for "learned": ``recall_target``
        of them; for facts during tuning, what pretraining's last check reproduced is enough (tuning
        teaches answers and must keep the facts (``FACTS_KEPT`` of them: the count dips when tuning starts
        and comes back slowly), not learn the ones pretraining could not). When pretraining reached the
        target, tuning must keep it: the run can then still end "Learned", and a stage never ends
        "learned" on a table the verdict calls short."""
        want = math.ceil(self.train_config.recall_target * n - 1e-9)
        kept = self._facts_kept
        if kind == "fact" and self.stage_index == 1 and kept and kept[1] == n and kept[0] < want:
            want = min(want, math.floor(FACTS_KEPT * kept[0]))
        return want

    def _check(self, stage: Stage, kinds: tuple[str, ...], final: bool, sample: int | None = None):
        """Recall check of ``kinds`` as a sub-generator: yields RecallProgress per batch, returns the items.
        Its duration is kept (``_check_s``) so a time budget leaves room for the next check. ``sample``:
        items per kind (core.recall.recall_prompts; None: ``check_sample``, 0: all)."""
        t0 = time.perf_counter()
        items: list[RecallItem] = []
        sample = self.train_config.check_sample if sample is None else sample
        for done, total, items in recall_check(self.model, self.tokenizer, self.dataset, kinds,
                                               should_stop=lambda: self._stop, heldout=self.heldout_pairs,
                                               sample=sample, sizes=self._check_sizes, speed=self.check_speed,
                                               left_out=self._check_left_out, questions=self.question_pairs):
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
        steps = [tc.pretrain.steps if self.facts else 0, tc.dialogues.steps if self.dialogues else 0]
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


def recall_table(gen: Generator, tok: Tokenizer, dataset: Dataset, max_tokens: int | None = None,
                 should_stop: Callable[[], bool] | None = None) -> list[RecallItem]:
    """Check, with greedy decoding, which facts and dialogue answers the model reproduces, one prompt at a
    time through a :class:`core.generate.Generator` (the chat's decoding path). Training uses the batched
    :func:`core.recall.recall_check`; this is its reference.

    Facts: the model gets BOS + the fact's first words (:func:`core.recall.fact_prompt_words`: enough to
    tell it from every other fact) and must continue with the rest exactly.
    Dialogues: for each turn, the model gets the previous turns and the question and must answer
    exactly (surrounding whitespace ignored). ``should_stop()``, checked before each prompt, ends the
    check early (the items so far are returned).
    """
    stop = should_stop or (lambda: False)
    from core.generate import SamplingSettings

    items = []
    limit = max_tokens or gen.config.context_length
    stops = chat_format.stop_ids(tok)
    for i, (fact, k) in enumerate(zip(dataset.facts, fact_prompt_words(dataset.facts))):
        if stop():
            return items
        prompt, expected = fact_split(fact, k)
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
