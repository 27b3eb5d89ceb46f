"""A plan before Start, and an honest verdict after the run.

:func:`make_plan` proposes a model size, passes (epochs) over the facts and the dialogues, and the steps
that make them, for a dataset's token counts (core.estimates.DatasetStats) and the device's measured
training speed; it estimates the time of the whole run, recall checks included. :func:`verdict` says what
a finished run learned and, when it is short of the target, what to do.

The rules are rules of thumb measured on this project's data (not a law):
- capacity: a model learns its facts when it has about ``PARAMS_PER_TOKEN`` parameters per token of
  training text (Allen-Zhu & Li 2024, "Physics of Language Models: Part 3.3", find ~2 bits of knowledge
  per parameter; our invented-town facts of ~15 tokens learned with the Small preset at ~19 parameters
  per token and not with Tiny at ~7);
- exposures: each fact is seen ``PRETRAIN_PASSES`` times in pretraining, as text or as the answer of
  a question (Allen-Zhu & Li 2024, Part 3.3: about 100 exposures store ~1 bit per parameter, 1,000 about
  2; measured on five generated datasets of 1,500-1,800 facts (tests/make_datasets.py): 128 exposures
  reproduced 99.5 % of the facts with Small, 64 exposures 97 % with Larger; on this 2-core CPU four of them
  were learned at about 30 exposures, the events at 48 reproduced 89 %), ``TUNE_PASSES`` over the
  dialogues learn them, with at least ``MIN_STEPS`` per stage (an optimiser needs some steps whatever
  the data size); the plan fits them into ``PLAN_BUDGET_S`` when the user gives no time budget;
- a stage that has not learned by its planned steps may go on to ``MAX_STEPS_FACTOR`` times them
  (train until learned: core.trainer checks recall every ``check_every`` steps and stops early).
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from core.config import PRESETS, ModelConfig, TrainConfig, replace

if TYPE_CHECKING:
    from core.dataset import Dataset
    from core.device import Device, DeviceInfo
    from core.estimates import DatasetStats
    from core.trainer import StageReport

log = logging.getLogger(__name__)

AUTO = "Auto (recommended)"
"""Name of the planned preset in the GUI; the CLI spells it ``--preset Auto``."""

PARAMS_PER_TOKEN = 15
BITS_PER_PARAM = 1.0
"""Bits of knowledge a parameter stores after about 100 exposures (Allen-Zhu & Li 2024, Part 3.3; 2 after
1,000): a model smaller than the facts' bits cannot hold them whatever the passes."""
PRETRAIN_PASSES = 40
"""Times each fact is seen in the planned pretraining steps (as text, ``pack_facts`` to a row, or as a
question's answer); a stage that has not learned by then goes on while it improves (``MAX_STEPS_FACTOR``)."""
MIN_PASSES = 32
"""Fewest exposures a plan cut to a time budget keeps (fewer learn too little to be worth the time)."""
PLAN_BUDGET_S = 12 * 60.0
"""The time an Auto plan's planned steps fit into when the user gives no time budget."""
RUN_BUDGET_S = 15 * 60.0
"""The time budget of an Auto run when the user gives none: going on while recall improves ends there."""
PACK_MAX = 4
"""Most facts in one pretraining row (core.batches.pack)."""
TUNE_PASSES = 12
MIN_STEPS = (100, 150)  # pretrain, tune
MAX_STEPS_FACTOR = (3.6, 1.5)
"""Most steps of (pretraining, tuning) as a multiple of the planned ones. Pretraining runs its planned
steps (tuning replays the facts): on the 2,000-fact towns data the fact count crept up by a few per check
after them, for minutes; answers missing at the planned tuning steps are often learned soon after."""
LEARNED_SHARE = 0.65
"""Share of a stage's planned time it is expected to take when every one of its checks looks at all items
(small datasets: at most ``CHECK_SAMPLE`` of each kind), so that the first check finding everything learned
ends it. Measured 0.50-0.87 on the five generated datasets of tests/make_datasets.py when sampled checks could
end a stage too (benchmarks/learn_datasets.py, the median); the bundled example ends at 0.5. A stage whose
checks sample runs its planned steps and one check interval more (``MIN_GAIN``)."""
MIN_GAIN = 0.01
"""Past its planned steps a stage goes on only while each check (of every item) reproduces at least this share
of the items more than the one before: a gain under 1 % per check interval (a sixth of the planned steps or
less) would need the planned time again to learn a few percent more. On tests/make_datasets.py "events" the
sampled count stayed at 58-63 of 64 for 1,600 steps past the planned ones, and tuning's for 600."""
CHECKS_PER_STAGE = 6
PATIENCE = 4
"""Checks in a row without a better count before a stage gives up (tuning trades facts for answers for a while)."""
TRAINER_OVERHEAD = 1.4
"""A trainer step takes this many times the timed forward/backward/AdamW of :func:`measure_speed`: the
update's guard (its copies and finite check when this was measured; now a check pass on the first update only,
core.kernels.adamw.update_bounds), the gradient norms,
building the batch, batches padded to their longest example (conversations); measured 1.42-1.46 on the towns
data (benchmarks/learn_towns.py)."""
FORWARD_SHARE = 1 / 3
"""A forward pass costs about a third of a training step (forward + backward (2x) + update)."""
REPLAY_SHARE = 0.5
"""Share of each tuning batch (of questions) replayed from the facts in an Auto plan: with a quarter, tuning lost
4 % of the 1,800 historical-event facts pretraining had learned (tests/make_datasets.py "events")."""
MIX_SHARE = 0.5
"""Share of each pretraining batch from questions and answers (Allen-Zhu & Li 2023, Part 3.1: facts mixed
with question-answer data become extractable)."""
FACT_QUESTION_SHARE = 0.5
"""Share of the questions in a batch that are questions written for facts without a dialogue."""
CONVERSATION_EVERY = 2
"""Every this many tuning steps, a batch of conversations of several dialogues (the latest question answered)."""
HELDOUT = 100
"""Fact questions kept out of training to measure answers about facts without a dialogue."""
CHECK_SAMPLE = 64
"""Items of each kind a check during a stage looks at (evenly spaced): 2,000 facts take as long to check
as a few hundred steps to train."""


@dataclass(frozen=True)
class Plan:
    """What an Auto run will do, and how long it should take.

    Attributes:
        preset: the model preset chosen ("Tiny", "Small", "Larger").
        model_config, train_config: ready for core.trainer.Trainer (train until learned: steps are the
            maxima, ``check_every`` set, ``time_budget_s`` as given).
        planned_steps: (pretrain, tune) steps expected to learn the data (the estimate's basis).
        pretrain_passes, tune_passes: passes over facts / dialogues of the planned steps.
        train_s, check_s: estimated seconds of training steps and of recall checks; total_s their sum.
        seconds_per_token: the training speed used (seconds per padded token of a step).
        notes: what the user should know (budget too small, biggest model still small, ...).
        fact_exposures: times each fact is seen in the planned steps of both stages (as text, as a
            question's answer, replayed in tuning).
    """

    preset: str
    model_config: ModelConfig
    train_config: TrainConfig
    planned_steps: tuple[int, int]
    pretrain_passes: float
    tune_passes: float
    train_s: float
    check_s: float
    seconds_per_token: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    fact_exposures: float = 0.0
    expected_run_s: float = 0.0
    """Seconds the run's stages and checks are expected to take (:meth:`_RunCost.expected`); 0: ``total_s``."""
    first_run_s: float = 0.0
    """One-time costs of this device in this run (:func:`first_run_seconds`): kernel compilation (also what the
    planning itself spent on it: the estimate counts from the start of planning) and the first matmul tuning;
    0 once both are cached."""

    @property
    def total_s(self) -> float:
        """Seconds of the planned steps and their checks."""
        return self.train_s + self.check_s

    @property
    def expected_s(self) -> float:
        """Seconds the run is expected to take: a stage whose checks look at every item ends at the first that
        finds everything learned (``LEARNED_SHARE`` of its planned time), one whose checks sample runs its
        planned steps and one check interval after them (``MIN_GAIN``)."""
        return self.expected_run_s or self.total_s

    @property
    def most_s(self) -> float:
        """Seconds the run takes if every planned step runs (:attr:`total_s`), with the one-time :attr:`first_run_s`
        as :attr:`run_s` has them (a first run's plan said "estimated 0:25 (first run: +0:21 ...; at most 0:06 ...)")."""
        return self.total_s + self.first_run_s

    @property
    def run_s(self) -> float:
        """Seconds the run is expected to take on this device: :attr:`expected_s` and the one-time
        :attr:`first_run_s`."""
        return self.expected_s + self.first_run_s

    def first_run_note(self) -> str:
        """"first run on this device: +1:50 for tuning and compiling", or "" when that is under half a second
        (cached)."""
        if self.first_run_s < 0.5:
            return ""
        return f"first run on this device: +{format_duration(self.first_run_s)} for tuning and compiling"

    def summary(self) -> str:
        """One line for the CLI and the Hyperparameters tab."""
        p, t = self.planned_steps
        seen = f", each fact seen {self.fact_exposures:.0f} times" if self.fact_exposures else ""
        most = (f"; at most {format_duration(self.most_s)} for the planned steps, it stops once learned"
                if self.expected_s < self.total_s else "")
        first = f"{self.first_run_note()}; " if self.first_run_note() else ""
        return (f"{self.preset} model ({self.model_config.n_params():,} parameters); pretrain {p} steps "
                f"({self.pretrain_passes:.0f} passes over the facts{seen}), tune {t} steps ({self.tune_passes:.0f} "
                f"passes over the dialogues); estimated {format_duration(self.run_s)} "
                f"({first}checks {format_duration(self.check_s)}{most})")


def format_duration(seconds: float) -> str:
    """``m:ss`` (or ``h:mm:ss``) of a duration in seconds."""
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def padded_length(lengths: list[int], batch_size: int, seed: int = 0, draws: int = 64) -> float:
    """Mean padded sequence length (tokens) of a random batch of ``batch_size`` of ``lengths`` (each
    example's ids, input = length - 1): batches pad to their longest example."""
    if not lengths:
        return 0.0
    arr = np.asarray(lengths) - 1
    rng = np.random.default_rng(seed)
    k = min(batch_size, len(arr))
    return float(np.mean([arr[rng.choice(len(arr), k, replace=False)].max() for _ in range(draws)]))


def choose_preset(stats: DatasetStats, knowledge_bits: float = 0.0) -> tuple[str, list[str]]:
    """Smallest preset with ``PARAMS_PER_TOKEN`` parameters per training token and room for the facts'
    ``knowledge_bits`` (core.augment.knowledge_bits) at ``BITS_PER_PARAM`` (``Larger`` at most)."""
    tokens = stats.fact_tokens + stats.dialogue_tokens
    need = max(PARAMS_PER_TOKEN * tokens, knowledge_bits / BITS_PER_PARAM)
    for name in ("Tiny", "Small", "Larger"):
        mc = replace(PRESETS[name][0], vocab_size=stats.vocab_size)
        if mc.n_params() >= need:
            return name, []
    return "Larger", [f"the dataset ({tokens:,} tokens, about {knowledge_bits / 1000:,.0f} kbit of facts) is large "
                      f"for the biggest preset ({mc.n_params():,} parameters): it may not learn everything"]


def _check_kinds(recall_prompts: tuple[int, int] | dict,
                 answer_tokens: tuple[float, float]) -> dict[str, tuple[int, float, float]]:
    """{kind: (prompts, mean prompt tokens, mean answer tokens)}; (facts, dialogues) tuples accepted."""
    if isinstance(recall_prompts, dict):
        return dict(recall_prompts)
    return {"fact": (recall_prompts[0], 0.0, answer_tokens[0]), "dialogue": (recall_prompts[1], 0.0, answer_tokens[1])}


def make_plan(stats: DatasetStats, seconds_per_token: float, lengths: tuple[list[int], list[int]] | None = None,
              recall_prompts: tuple[int, int] | dict = (0, 0), answer_tokens: tuple[float, float] = (12.0, 12.0),
              time_budget_s: float = 0.0, preset: str | None = None,
              step_tokens: tuple[float, float] | None = None, tune_seconds_per_token: float | None = None) -> Plan:
    """Plan a run.

    Args:
        stats: core.estimates.DatasetStats of the dataset.
        seconds_per_token: measured seconds per padded token of a training step of the chosen model
            (see :func:`measure_speed`); with ``preset=None`` the speed of that preset is needed, so
            call :func:`choose_preset` first.
        lengths: token counts of the (fact, dialogue) training sequences (padding estimate); when None,
            the mean from ``stats``.
        recall_prompts: ``{kind: (prompts, mean prompt tokens, mean answer tokens)}`` of a recall check
            (core.recall.KINDS), or (fact prompts, dialogue turns) with ``answer_tokens`` their mean
            answer tokens.
        time_budget_s: the user's limit for the whole run (0: none); the planned steps are cut to fit.
        preset: force a preset (None: :func:`choose_preset`).
        step_tokens: mean padded tokens of a (pretraining, tuning) step as the planned data mix makes
            them (core.trainer.Batches.padded_tokens); when None, estimated from ``lengths``.
        tune_seconds_per_token: the speed of a tuning step (measured at its rows, longer than
            pretraining's); None: ``seconds_per_token``.

    Returns:
        A :class:`Plan`.

    Raises:
        ValueError: ``seconds_per_token`` is not a positive finite number.
    """
    if not (seconds_per_token > 0 and math.isfinite(seconds_per_token)):
        raise ValueError(f"seconds_per_token must be > 0, got {seconds_per_token!r}")
    notes: list[str] = []
    if preset is None:
        preset, notes = choose_preset(stats)
    mc, tc = PRESETS[preset]
    mc = replace(mc, vocab_size=stats.vocab_size)
    tc = data_mix(tc, stats)
    b = tc.pretrain.batch_size
    n_f, n_d = stats.fact_sequences, stats.dialogue_sequences
    rows = step_rows(tc, stats)
    steps = [max(MIN_STEPS[0], math.ceil(PRETRAIN_PASSES * n_f / rows[0])) if n_f else 0,
             max(MIN_STEPS[1], math.ceil(TUNE_PASSES * n_d / rows[1])) if n_d else 0]
    t_f, t_d = _padded_lengths(stats, mc.context_length, b, lengths)
    if step_tokens is None:
        step_tokens = (b * (max(t_f, t_d) if tc.mix_share and n_d else t_f), b * max(t_d, t_f))
    spts = (seconds_per_token, tune_seconds_per_token or seconds_per_token)
    cost = _RunCost([t * v * TRAINER_OVERHEAD for t, v in zip(step_tokens, spts)],
                    **_check_seconds(_check_kinds(recall_prompts, answer_tokens), (t_f, t_d), b, seconds_per_token,
                                     n_d))
    steps, (train_s, check_s, every) = _fit_budget(steps, cost, time_budget_s, n_f, rows[0], notes)
    max_steps = [math.ceil(s * f) for s, f in zip(steps, MAX_STEPS_FACTOR)]
    tc = replace(tc, pretrain=replace(tc.pretrain, steps=max_steps[0], decay_steps=steps[0]),
                 dialogues=replace(tc.dialogues, steps=max_steps[1], decay_steps=steps[1]),
                 check_every=max(1, min(e for e in every if e) if any(every) else 25),
                 patience=PATIENCE, time_budget_s=float(time_budget_s or max(RUN_BUDGET_S, 1.25 * (train_s + check_s))),
                 check_sample=CHECK_SAMPLE, min_gain=MIN_GAIN)
    fact_passes = steps[0] * rows[0] / n_f if n_f else 0.0
    return Plan(preset, mc, tc, (steps[0], steps[1]), fact_passes, steps[1] * rows[1] / n_d if n_d else 0.0,
                train_s, check_s, seconds_per_token, tuple(notes), fact_passes + _replayed(tc, steps[1], n_f, n_d),
                cost.expected(steps))


def _replayed(tc: TrainConfig, tune_steps: int, n_f: int, n_d: int) -> float:
    """Exposures of each fact replayed in tuning's batches of questions (not its conversation batches)."""
    if not (n_f and n_d):
        return 0.0
    bt = tc.dialogues.batch_size
    q_steps = tune_steps - (tune_steps // tc.conversation_every if tc.conversation_every else 0)
    return q_steps * min(bt - 1, round(bt * tc.replay_share)) / n_f


def _padded_lengths(stats: DatasetStats, context_length: int, b: int,
                    lengths: tuple[list[int], list[int]] | None) -> tuple[float, float]:
    """Mean padded (fact, dialogue) sequence length of a batch of ``b`` (:func:`padded_length`), at most
    the context; without ``lengths``, every sequence is taken to have the dataset's mean length."""
    n_f, n_d = stats.fact_sequences, stats.dialogue_sequences
    if lengths is None:
        lengths = ([round(stats.fact_tokens / max(n_f, 1))] * n_f, [round(stats.dialogue_tokens / max(n_d, 1))] * n_d)
    return min(context_length, padded_length(lengths[0], b)), min(context_length, padded_length(lengths[1], b))


def _check_seconds(kinds: dict[str, tuple[int, float, float]], padded: tuple[float, float], b: int,
                   seconds_per_token: float, n_d: int) -> dict:
    """Seconds of the recall checks, as :class:`_RunCost`'s fields: ``during`` (a sampled check during
    pretraining, during tuning), ``full`` (the check at the run's end), ``pre_end`` (the check that ends
    pretraining: sampled when tuning follows), ``complete`` (a check of every item of each stage's kinds,
    core.trainer.STAGE_KINDS) and ``sampled`` (whether a stage's checks sample).

    One check of kind k: ceil(prompts / batch) batches x answer tokens forwards of (batch, seq);
    ``padded`` is (fact, dialogue) sequence length where a kind's mean prompt length is unknown."""
    check_one, sampled = {}, {}  # seconds of a full / a sampled (CHECK_SAMPLE per kind) check of each kind
    for k, (n, prompt, answer) in kinds.items():
        t = prompt + answer / 2 if prompt else (padded[0] if k == "fact" else padded[1])
        for out, m in ((check_one, n), (sampled, min(n, CHECK_SAMPLE))):
            out[k] = math.ceil(m / b) * answer * b * t * seconds_per_token * FORWARD_SHARE if m else 0.0
    from core.trainer import STAGE_KINDS as stage_kinds  # what each stage's checks look at
    return dict(during=[sum(sampled.get(k, 0.0) for k in ks) for ks in stage_kinds],
                full=sum(check_one.values()),
                pre_end=sum(sampled.values()) if n_d else sum(check_one.values()),
                complete=[sum(check_one.get(k, 0.0) for k in ks) for ks in stage_kinds],
                sampled=[any(kinds.get(k, (0,))[0] > CHECK_SAMPLE for k in ks) for ks in stage_kinds])


@dataclass(frozen=True)
class _RunCost:
    """``cost(steps)``: (training seconds, check seconds, check_every per stage) of (pretrain, tune) steps;
    :meth:`expected` the seconds the run is expected to take."""

    step_s: list[float]
    during: list[float]
    full: float
    pre_end: float
    complete: list[float] = field(default_factory=lambda: [0.0, 0.0])
    sampled: list[bool] = field(default_factory=lambda: [False, False])

    def __call__(self, st: list[int]) -> tuple[float, float, list[int]]:
        every = [max(25, math.ceil(s / CHECKS_PER_STAGE)) if s else 0 for s in st]
        every_all = min((e for e in every if e), default=25)  # one check_every for both stages
        train = st[0] * self.step_s[0] + st[1] * self.step_s[1]
        checks = sum(((st[i] - 1) // every_all) * self.during[i] for i in range(2) if st[i])
        checks += (self.pre_end if st[0] else 0.0) + (self.full if st[1] else 0.0)
        return train, checks, every

    def expected(self, st: list[int]) -> float:
        """Seconds the run of planned steps ``st`` is expected to take (core.trainer.EarlyStop): a stage whose
        checks look at every item, ``LEARNED_SHARE`` of its steps and checks; one whose checks sample, its
        planned steps, a check of every item at their end and one check interval later (``MIN_GAIN``), and
        the steps between; then the end-of-stage checks."""
        every_all = min((max(25, math.ceil(s / CHECKS_PER_STAGE)) for s in st if s), default=25)
        total = (self.pre_end if st[0] else 0.0) + (self.full if st[1] else 0.0)
        for i in range(2):
            if not st[i]:
                continue
            stage = st[i] * self.step_s[i] + ((st[i] - 1) // every_all) * self.during[i]
            if self.sampled[i]:
                total += stage + every_all * self.step_s[i] + 2 * self.complete[i]
            else:
                total += LEARNED_SHARE * stage
        return total


def _fit_budget(steps: list[int], cost: _RunCost, time_budget_s: float, n_f: int, fact_rows: int,
                notes: list[str]) -> tuple[list[int], tuple[float, float, list[int]]]:
    """The steps cut to the run's time: without a budget, fewer exposures of each fact (not below
    MIN_PASSES) so that the run takes PLAN_BUDGET_S; with one, all steps scaled to it. Says so in
    ``notes``. Returns (steps, cost(steps))."""
    train_s, check_s, every = cost(steps)
    if not time_budget_s and n_f and train_s + check_s > PLAN_BUDGET_S:
        floor = max(MIN_STEPS[0], math.ceil(MIN_PASSES * n_f / fact_rows))
        while steps[0] > floor and train_s + check_s > PLAN_BUDGET_S:
            steps[0] = max(floor, int(steps[0] * 0.95))
            train_s, check_s, every = cost(steps)
        notes.append(f"each fact is seen {steps[0] * fact_rows / n_f:.0f} times (not {PRETRAIN_PASSES}) so that the run "
                     f"takes about {format_duration(PLAN_BUDGET_S)}; give a time budget to learn more")
    if time_budget_s and train_s + check_s > time_budget_s:
        scale = max(0.05, (time_budget_s - cost.pre_end - cost.full) / max(train_s + check_s, 1e-9))
        steps = [max(1, int(s * scale)) if s else 0 for s in steps]
        train_s, check_s, every = cost(steps)
        notes.append(f"the time budget ({format_duration(time_budget_s)}) allows about {scale:.0%} of the "
                     "planned steps: the model may not learn everything; give more time")
    return steps, (train_s, check_s, every)


def data_mix(tc: TrainConfig, stats: DatasetStats) -> TrainConfig:
    """The Auto plan's data mix on ``tc``: questions in pretraining (``MIX_SHARE``), a question for each
    fact without a dialogue (``FACT_QUESTION_SHARE`` of the questions), conversation batches every
    ``CONVERSATION_EVERY`` tuning steps and ``HELDOUT`` held-out fact questions (at most a twentieth of
    the facts). Without dialogues there is nothing to mix: ``tc`` as it is."""
    if not stats.dialogue_sequences:
        return tc
    # facts that no dialogue asks about, and questions for them can be written (none: no fact question rows in
    # the batches, so the plan counts none either: its passes are then the ones the run makes)
    many = stats.fact_sequences > stats.dialogue_sequences and stats.fact_questions != 0
    fact_len = stats.fact_tokens / max(stats.fact_sequences, 1)
    question_len = stats.dialogue_tokens / max(stats.dialogue_sequences, 1)
    pack = max(1, min(PACK_MAX, round(question_len / max(fact_len, 1.0)))) if stats.fact_sequences else 1
    return replace(tc, mix_share=MIX_SHARE, fact_questions=1 if many else 0,
                   fact_question_share=FACT_QUESTION_SHARE if many else 0.0, conversation_every=CONVERSATION_EVERY,
                   heldout=min(HELDOUT, stats.fact_sequences // 20) if many else 0, pack_facts=pack,
                   replay_share=REPLAY_SHARE if stats.fact_sequences else tc.replay_share)


def with_heldout_trained(tc: TrainConfig) -> TrainConfig:
    """``tc`` of a run whose held-out fact questions are to be trained too (``train --resume DIR
    --learn-heldout``, the Training tab's "Learn held-out questions"): ``heldout`` 0, and tuning a third of
    its planned steps longer (at least 50) so that a finished run goes on to learn them. Unchanged when
    nothing was held out or the run has no tuning stage (0 steps)."""
    if not tc.heldout or not tc.dialogues.steps:  # nothing held out, or no tuning stage to go on with
        return tc
    tune = tc.dialogues
    return replace(tc, heldout=0, dialogues=replace(tune, steps=tune.steps + max(50, (tune.decay_steps or tune.steps) // 3)))


def step_rows(tc: TrainConfig, stats: DatasetStats) -> tuple[float, float]:
    """Rows per step of the stage's own data: facts per pretraining step (as text, or as the answer of a
    fact question), dataset dialogues per tuning step (conversation batches counted as none), under
    ``tc``'s data mix."""
    b = tc.pretrain.batch_size
    mix = min(b - 1, round(b * tc.mix_share)) if stats.dialogue_sequences else 0
    asked = min(mix, round(mix * tc.fact_question_share)) if tc.fact_questions else 0  # a fact as an answer
    bt = tc.dialogues.batch_size
    q = bt - (min(bt - 1, round(bt * tc.replay_share)) if stats.fact_sequences else 0)
    d = q - min(q, round(q * tc.fact_question_share)) if tc.fact_questions else q
    if tc.conversation_every:
        d *= 1 - 1 / tc.conversation_every
    return float((b - mix) * tc.pack_facts + asked), float(d)


# ----------------------------------------------------------------------------- speed

def _speed_file():
    from core.device import user_cache_dir

    return user_cache_dir() / "train_speed.json"


def speed_key(device_label: str, mc: ModelConfig, batch_size: int, seq: int) -> str:
    """Cache key of a measured speed: the device and the shape of the step (``seq``: tokens a row)."""
    return (f"{device_label}|d{mc.d_model}|l{mc.n_layers}|h{mc.n_heads}/{mc.n_kv_heads}|f{mc.ffn_dim}"
            f"|v{mc.vocab_size}|b{batch_size}|s{seq}")


SPEED_SEQ_STEP = 8
"""Row lengths a speed is measured at are rounded up to a multiple of this (fewer measurements to cache)."""


def cached_speed(key: str) -> float | None:
    """Seconds per token cached for ``key`` (None when not measured on this machine)."""
    try:
        v = json.loads(_speed_file().read_text()).get(key)
    except (OSError, ValueError):
        return None
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def store_speed(key: str, seconds_per_token: float) -> None:
    """Remember a measured speed in the user cache folder (atomic write)."""
    from core.atomic import atomic_write

    path = _speed_file()
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[key] = seconds_per_token
    atomic_write(path, json.dumps(data, indent=1).encode(), sync_folder=False)


SPEED_STEPS = 5
"""Training steps :func:`measure_speed` times (after one warm-up step)."""


def measure_speed(dev: Device, mc: ModelConfig, batch_size: int, seq: int, steps: int = SPEED_STEPS,
                  use_cache: bool = True) -> float:
    """Seconds per padded token of a training step (forward, backward, AdamW) of ``mc`` at
    (``batch_size``, ``seq`` rounded up to ``SPEED_SEQ_STEP``) on ``dev``: the median of ``steps`` timed steps
    after one warm-up step. Cached per device and shape (:func:`cached_speed`). A token of a short row costs
    more (the step's fixed launches): on the 2-core Xeon VM the Small preset measured 5.6e-5 s a token at rows
    of 24, 3.5-4.3e-5 at 48-128, so a plan times each stage at its own rows."""
    from core.model import Model

    seq = max(2, min(-(-seq // SPEED_SEQ_STEP) * SPEED_SEQ_STEP, mc.context_length))
    key = speed_key(dev.info.label, mc, batch_size, seq)
    if use_cache and (v := cached_speed(key)) is not None:
        return v
    model = Model(dev, mc, batch_size=batch_size, seed=0, max_seq=seq)  # buffers for the timed rows only
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, mc.vocab_size, (batch_size, seq), dtype=np.int32)
    mask = np.ones((batch_size, seq), np.float32)
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        model.forward_backward(tokens, tokens, mask)
        model.optimizer_step(1e-4, 0.0, 0.9, 0.98, 1e-8, 1.0)
        dev.finish()
        if i:
            times.append(time.perf_counter() - t0)
    v = float(np.median(times)) / (batch_size * seq)  # the median: a shared machine has slow moments too
    try:
        store_speed(key, v)
    except OSError as e:  # a full disk: the cache is a convenience, the run goes on (it measures again next time)
        log.warning("could not save the measured speed to %s: %s", _speed_file(), e.strerror or e)
    return v


BUILD_S_GUESS = 2.0
"""Seconds per program (build and first launch) assumed when planning built none (the step's speed was cached)."""
LATER_PROGRAMS = 7
"""Programs a run builds and first launches after its plan's speed measurement: the tuned matmul's other
transpose variants (3), its GEMV row counts 2, 4 and 8 (3) and the decode attention (1) of the recall checks."""


def first_run_seconds(dev: Device, programs: int, compile_s: float) -> float:
    """One-time seconds of a run on ``dev`` given the ``programs`` that planning built and first launched in
    ``compile_s`` seconds (PoCL and llvmpipe compile a kernel for its work-group size at its first launch, so
    this is the speed measurement's time beyond its steps): those seconds, the first matmul tuning
    (core.kernels.matmul_autotune.expected_seconds), on GPUs the first timing of the attention forward
    (core.kernels.attention_autotune.expected_seconds) and ``LATER_PROGRAMS`` more; 0.0 when the tuning is cached
    and planning found its programs cached (< 0.2 s each) or built none (the speed was cached too)."""
    from core.kernels import attention_autotune, matmul_autotune

    per_program = compile_s / programs if programs else BUILD_S_GUESS
    tuning = matmul_autotune.expected_seconds(dev, per_program) + attention_autotune.expected_seconds(dev, per_program)
    if not tuning and (not programs or per_program < 0.2):  # tuned, and the kernels cached (or not looked at)
        return 0.0
    return compile_s + tuning + LATER_PROGRAMS * per_program


def plan_on(dataset: Dataset, info: DeviceInfo, time_budget_s: float = 0.0) -> Plan:
    """:func:`plan_for` on the device ``info`` describes, opened here: what the app's Auto preset calls
    in a worker thread, or for a large dataset in a child process (``gui.workers.call_worker``), which
    cannot be handed an open device.

    Raises:
        as :func:`core.device.open_device` and :func:`plan_for`.
    """
    from core.device import open_device

    return plan_for(dataset, open_device(info), time_budget_s)[0]


def plan_for(dataset: Dataset, dev: Device, time_budget_s: float = 0.0,
             vocab_size: int = ModelConfig.vocab_size) -> tuple[Plan, DatasetStats]:
    """Plan a run of ``dataset`` on ``dev``: token counts, a speed measurement (cached) of the chosen
    preset, the padded tokens of the planned data mix's batches (core.trainer.Batches) and the recall
    prompts of every kind, :func:`make_plan`. Returns (plan, DatasetStats)."""
    from core.batches import Batches
    from core.estimates import dataset_stats
    from core.recall import ANSWER_SLACK, KINDS, recall_prompts
    from core.tokenizer import Tokenizer

    cl = PRESETS["Small"][0].context_length
    from core.augment import knowledge_bits

    stats = dataset_stats(dataset, vocab_size, cl)
    preset, _ = choose_preset(stats, knowledge_bits(dataset.facts))
    mc = replace(PRESETS[preset][0], vocab_size=stats.vocab_size)
    tc = data_mix(PRESETS[preset][1], stats)
    tok = Tokenizer.train(dataset.tokenizer_texts(), vocab_size=vocab_size)
    batches = Batches(tok, dataset, mc.context_length, tc)
    f_len = [len(e.ids) for e in batches.facts]
    d_len = [len(e.ids) for e in batches.dialogues]
    sampled = 64  # steps whose padded tokens are counted (a multiple of CONVERSATION_EVERY)
    step_tokens = tuple(float(np.mean([batches.padded_tokens(st, k) for k in range(sampled)]))
                        if (batches.facts if st == 0 else batches.dialogues) else 0.0 for st in (0, 1))
    prompts = recall_prompts(tok, dataset, mc.context_length, KINDS, batches.heldout_pairs,
                             questions=batches.question_pairs)
    kinds = {}
    for k in KINDS:
        ps = [p for p in prompts if p.kind == k]
        if ps:  # a right answer ends after its tokens and EOS
            kinds[k] = (len(ps), float(np.mean([len(p.ids) for p in ps])),
                        float(np.mean([p.max_new - ANSWER_SLACK + 1 for p in ps])))
    b = PRESETS[preset][1].pretrain.batch_size
    from core.kernels import matmul_autotune

    builds, t0 = dev.builds, time.perf_counter()
    # timed at the padded length of a planned pretraining batch (questions mixed in make it longer), with the
    # default matmul kernels before the first tuning (which the plan announces: first_run_s)
    seq = round(step_tokens[0] / b) if step_tokens[0] else int(padded_length(f_len or d_len, b)) or 16
    b_tune = PRESETS[preset][1].dialogues.batch_size
    seq_tune = round(step_tokens[1] / b_tune) if step_tokens[1] else 0
    with matmul_autotune.untuned():
        spt = measure_speed(dev, mc, b, seq)
        spt_tune = measure_speed(dev, mc, b_tune, seq_tune) if seq_tune else spt  # each stage at its own rows
    steps_s = (SPEED_STEPS + 1) * (spt * b * max(2, min(seq, mc.context_length))
                                   + (spt_tune * b_tune * min(seq_tune, mc.context_length) if seq_tune else 0.0)) \
        if dev.builds > builds else 0.0
    first = first_run_seconds(dev, dev.builds - builds, max(0.0, time.perf_counter() - t0 - steps_s))
    plan = make_plan(stats, spt, (f_len, d_len), kinds, time_budget_s=time_budget_s, preset=preset,
                     step_tokens=step_tokens, tune_seconds_per_token=spt_tune)
    return replace(plan, first_run_s=first), stats


# ----------------------------------------------------------------------------- verdict

@dataclass(frozen=True)
class Verdict:
    """What a run learned. ``learned``: the target was met; ``text``: the line to show; ``advice``: what to
    do when it was not ("" when it was)."""

    learned: bool
    text: str
    advice: str
    answers: tuple[int, int]
    facts: tuple[int, int]
    chat: tuple[int, int] = (0, 0)
    heldout: tuple[int, int] = (0, 0)


def verdict(facts: tuple[int, int], answers: tuple[int, int], target: float = 1.0, end_reason: str = "steps",
            preset: str | None = None, chat: tuple[int, int] = (0, 0),
            heldout: tuple[int, int] = (0, 0), left_out: dict | None = None, unasked: int = 0,
            fixed_steps: bool = False, questions: tuple[int, int] = (0, 0)) -> Verdict:
    """The honest end of a run from its final recall counts ((reproduced, checked) of facts, dialogue
    answers, answers in the middle of a conversation and held-out questions), the recall target (share
    of each but the held-out ones, which are reported, not required) and why the last stage ended
    ("steps", "learned", "no progress", "time budget", "stopped"). ``left_out``: ``{kind: {why: n}}`` of the
    facts and answers the check could not ask ("0 of 2 facts checked (1 too long for the context to check)":
    the dataset's count is not the checked one). ``unasked``: the checked facts no question asks about
    (core.batches.Batches.unasked): "28 of 28 facts (24 as text only: no question asks about them, so the model may
    not answer questions about them)". ``fixed_steps``: a new model trained for set steps (a named preset, no
    recall checks during the stages): the advice also names Auto, which plans the run and trains until learned.
    ``questions``: the questions written for facts and trained (core.recall's "question" kind), required as the
    answers are ("6 of 6 written questions"; a run said "Learned" while 3 of them were answered wrong)."""
    def met(ok_n):
        ok, n = ok_n
        return n == 0 or ok >= math.ceil(target * n - 1e-9)

    def count(ok_n: tuple[int, int], kind: str, noun: str, extra: str = "") -> str:
        why = (left_out or {}).get(kind)
        notes = [", ".join(f"{n:,} {reason}" for reason, n in why.items())] if why else []
        notes += [extra] if extra else []
        head = f"{ok_n[0]:,} of {ok_n[1]:,} {noun}{' checked' if why else ''}"
        return head + (f" ({'; '.join(notes)})" if notes else "")

    parts = []
    if answers[1] or (left_out or {}).get("dialogue"):
        parts.append(count(answers, "dialogue", "answers"))
    if facts[1] or (left_out or {}).get("fact"):
        them = "it" if unasked == 1 else "them"
        parts.append(count(facts, "fact", "facts", f"{unasked:,} as text only: no question asks about {them}, so the "
                                                   f"model may not answer questions about {them}" if unasked else ""))
    if questions[1]:
        parts.append(f"{questions[0]:,} of {questions[1]:,} written questions")
    if chat[1]:
        parts.append(f"{chat[0]:,} of {chat[1]:,} in a conversation")
    learned = met(facts) and met(answers) and met(chat) and met(questions)
    what = ", ".join(parts) or "nothing to check"
    if not (facts[1] or answers[1] or chat[1] or questions[1]) and any((left_out or {}).values()):  # all there is was left out
        return Verdict(False, f"Nothing could be checked: {what}",
                       "recall asks facts of two words or more and answers whose question fits the model's context",
                       answers, facts, chat, heldout)
    if heldout[1]:
        what += (f"; questions about facts without a dialogue (held out of training): {heldout[0]:,} of "
                 f"{heldout[1]:,} answered")
    if learned:
        return Verdict(True, f"Learned: {what} — try the model on the Chat tab", "", answers, facts, chat, heldout)
    bigger = "" if preset == "Larger" else " or a bigger model"
    if end_reason == "no progress":
        advice = f"recall stopped improving: choose a bigger model{'' if bigger else ' (or less data)'}"
    elif end_reason == "time budget":
        advice = f"the time budget ran out: give more time{bigger}"
    elif end_reason == "stopped":
        advice = "the run was stopped: resume it to learn the rest"
    else:
        advice = f"train longer (more steps or passes){bigger}"
    if fixed_steps and end_reason != "stopped":
        advice += ", or train a new run with the Auto preset (the default: it plans the run and trains until learned)"
    return Verdict(False, f"Not fully learned: {what}", advice, answers, facts, chat, heldout)


def verdict_of(report: StageReport, target: float = 1.0, preset: str | None = None, unasked: int = 0,
               fixed_steps: bool = False) -> Verdict:
    """:func:`verdict` of a finished run's last core.trainer.StageReport (its recall table) and its count of
    facts no question asks about (and ``fixed_steps``, as there); a table of a huge dataset that was only sampled
    (``report.recall_sampled``) says so."""
    v = verdict(report.facts_recalled, report.dialogues_recalled, target, report.end_reason, preset,
                report.chat_recalled, report.heldout_recalled, getattr(report, "recall_left_out", None), unasked,
                fixed_steps, report.questions_recalled)
    sampled = getattr(report, "recall_sampled", None) or {}
    if sampled:
        note = ", ".join(f"{c:,} of {n:,} {KIND_NOUN[k]}" for k, (c, n) in sampled.items())
        v = replace(v, text=f"{v.text} (checked a sample: {note})")
    return v


KIND_NOUN = {"fact": "facts", "dialogue": "answers", "chat": "conversation questions", "heldout": "held-out questions",
             "question": "written questions"}
"""What the verdict's sample note and `opencl-llm recall` call the items of each recall kind (core.recall.KINDS)."""


__all__ = ["KIND_NOUN", "AUTO", "Plan", "Verdict", "make_plan", "plan_for", "choose_preset", "verdict", "verdict_of", "with_heldout_trained",
           "measure_speed", "cached_speed", "plan_on", "store_speed", "speed_key", "format_duration", "padded_length"]
