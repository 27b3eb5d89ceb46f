"""The parts of Trainer.run, each alone: one step (Trainer.step), the early-stopping rule (EarlyStop, no
device) and the end of a stage (Trainer.end_stage); and the run driver's saves (core.run.Run)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from core.config import ModelConfig, StageConfig, TrainConfig
from core.dataset import default_dataset
from core.events import LogEvent, RecallProgress, RunDone, RunStarted, StageFinished, StageReport, StepReport
from core.recall import KINDS
from core.stages import Stage
from core.trainer import EarlyStop, Trainer

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, context_length=64)


def _tc(steps: int = 4, **kw) -> TrainConfig:
    st = StageConfig(steps=steps, lr=3e-3, batch_size=4, warmup_steps=1)
    return TrainConfig(pretrain=st, dialogues=st, vocab_size=300, **kw)


# ----------------------------------------------------------------------------- EarlyStop (no device)
def test_early_stop_checks_every_n_steps_but_never_after_the_last():
    stop = EarlyStop(_tc(check_every=2), StageConfig(steps=6), lambda kind, n: n)
    assert [s for s in range(1, 8) if stop.due(s)] == [2, 4]
    assert not any(EarlyStop(_tc(check_every=0), StageConfig(steps=6), lambda k, n: n).due(s) for s in range(1, 8))


def test_early_stop_ends_learned_once_every_kind_has_what_it_wants():
    wanted = {"fact": 3, "dialogue": 2}
    stop = EarlyStop(_tc(check_every=1, learned_after=0.5), StageConfig(steps=10), lambda kind, n: wanted[kind])
    assert stop.judge(6, {"fact": (3, 4), "dialogue": (1, 2)}) is None  # dialogues short
    assert stop.judge(4, {"fact": (3, 4), "dialogue": (2, 2)}) is None  # all there, but before half the steps
    assert stop.judge(5, {"fact": (3, 4), "dialogue": (2, 2)}) == "learned"


def test_early_stop_ends_after_patience_checks_without_a_better_count_past_the_planned_steps():
    stop = EarlyStop(_tc(check_every=1, patience=2), StageConfig(steps=20, decay_steps=4), lambda k, n: n + 1)
    counts = {"fact": (5, 10)}
    assert stop.judge(2, counts) is None and stop.best == 5
    assert stop.judge(3, counts) is None and stop.since_best == 0  # within the planned steps: no patience yet
    assert stop.judge(5, counts) is None and stop.since_best == 1
    assert stop.judge(6, {"fact": (6, 10)}) is None and (stop.best, stop.since_best) == (6, 0)  # better: again
    assert stop.judge(7, {"fact": (6, 10)}) is None
    assert stop.judge(8, {"fact": (4, 10)}) == "no progress"
    never = EarlyStop(_tc(check_every=1, patience=0), StageConfig(steps=20), lambda k, n: n + 1)
    assert all(never.judge(s, counts) is None for s in range(1, 20))


def test_a_sampled_check_never_ends_a_stage_learned():
    stop = EarlyStop(_tc(check_every=1), StageConfig(steps=10), lambda kind, n: n)
    assert stop.judge(3, {"fact": (64, 64)}, complete=False) is None  # 64 of a sample of 64: not proof
    assert stop.judge(4, {"fact": (64, 64)}, complete=True) == "learned"


def test_past_the_planned_steps_min_gain_goes_on_only_while_a_complete_check_gains_enough():
    stop = EarlyStop(_tc(check_every=3, min_gain=0.01, patience=1), StageConfig(steps=40, decay_steps=10),
                     lambda k, n: n)
    assert [s for s in range(1, 16) if stop.due(s)] == [3, 6, 9, 10, 12, 15]  # one at the planned end too
    assert not stop.complete_due(9) and stop.complete_due(10) and stop.complete_due(12)
    assert stop.judge(9, {"fact": (60, 64)}, complete=False) is None  # within the planned steps
    assert stop.judge(10, {"fact": (900, 1000)}) is None  # the first complete check: the baseline
    assert stop.judge(12, {"fact": (950, 1000)}) is None  # +5 % of the items: go on
    assert stop.judge(15, {"fact": (959, 1000)}) == "no progress" and "+9 of 1,000" in stop.why  # < 1 %
    once = EarlyStop(_tc(check_every=3, min_gain=0.01), StageConfig(steps=40, decay_steps=10), lambda k, n: n)
    assert once.judge(10, {"fact": (900, 1000)}) is None
    assert once.judge(12, {"fact": (905, 1000)}, complete=False) is None  # only complete checks count
    assert once.judge(15, {"fact": (1000, 1000)}) == "learned"


# ----------------------------------------------------------------------------- one step
def test_a_step_updates_the_weights_and_reports_its_place_in_the_run(device):
    tr = Trainer(default_dataset(), SMALL, _tc(4), device)
    before = tr.model.weights()["token_embd.weight"].copy()
    rep, undone = tr.step(Stage.PRETRAIN)
    assert isinstance(rep, StepReport) and not undone and not rep.skipped
    assert (rep.stage, rep.step, rep.total_steps, rep.global_step) == (Stage.PRETRAIN, 1, 4, 1)
    assert tr.stage_step == 1 and math.isfinite(rep.loss) and rep.tokens_per_s > 0
    assert rep.passes == tr.passes(0, 1) > 0
    assert not np.array_equal(before, tr.model.weights()["token_embd.weight"])
    tr.stage_index, tr.stage_step = 1, 2
    rep, _ = tr.step(Stage.DIALOGUES)
    assert (rep.step, rep.global_step) == (3, 4 + 3)  # after the pretraining stage's planned steps


def test_a_step_whose_update_is_not_finite_is_undone(device, monkeypatch):
    import core.trainer

    tr = Trainer(default_dataset(), SMALL, _tc(4), device)
    before = tr.model.weights()["token_embd.weight"].copy()
    monkeypatch.setattr(core.trainer, "lr_at", lambda stage, step: 1e308)
    rep, undone = tr.step(Stage.PRETRAIN)
    assert undone and rep.skipped and tr.stage_step == 1
    np.testing.assert_array_equal(before, tr.model.weights()["token_embd.weight"])


# ----------------------------------------------------------------------------- the end of a stage
def test_the_end_of_a_stage_announces_the_save_then_checks_recall(device):
    tr = Trainer(default_dataset(), SMALL, _tc(4), device)
    tr.stage_step = 3
    events = list(tr.end_stage(Stage.PRETRAIN, "learned"))
    assert events[0] == StageFinished(Stage.PRETRAIN, 3) and (tr.stage_index, tr.stage_step) == (1, 0)
    assert any(isinstance(e, RecallProgress) and e.final for e in events)
    rep = events[-1]
    assert isinstance(rep, StageReport) and (rep.steps_done, rep.end_reason, rep.stopped) == (3, "learned", False)
    assert rep.recall and not rep.recall_stopped
    keys = [(KINDS.index(r.kind), r.index) for r in rep.recall]
    assert keys == sorted(keys)  # by kind, then by item
    line = next(e for e in events if isinstance(e, LogEvent))
    assert line.message.startswith(f"pretrain done: facts recalled {rep.facts_recalled[0]}/{rep.facts_recalled[1]}")


def test_the_end_of_a_stage_without_recall_has_an_empty_table(device):
    tr = Trainer(default_dataset(), SMALL, _tc(4), device)
    tr.stage_index, tr.stage_step = 1, 4
    events = list(tr.end_stage(Stage.DIALOGUES, recall=False))
    assert events == [StageFinished(Stage.DIALOGUES, 4), StageReport(Stage.DIALOGUES, 4, False)]
    assert tr.done


# ----------------------------------------------------------------------------- the run driver
def test_the_run_saves_at_each_stage_end_and_gives_the_verdict(device):
    from core.run import Run, RunHooks, RunRequest

    saves = []
    run = Run(RunRequest(device=device, model_config=SMALL, train_config=_tc(2), val_every=0),
              RunHooks(save=lambda trainer, stage_end: saves.append((trainer.stage_index, stage_end)) or "here"))
    events = list(run.events())
    started = next(e for e in events if isinstance(e, RunStarted))
    assert (started.stage_steps, started.resumed) == ((2, 2), False)
    assert saves == [(1, True), (2, True)]
    done = events[-1]
    assert isinstance(done, RunDone) and done.finished and not done.stopped and done.checkpoint == "here"
    assert done.verdict  # the last stage's table was checked
    assert [e.global_step for e in events if isinstance(e, StepReport)] == [1, 2, 3, 4]


def test_a_new_run_stopped_during_its_setup_saves_nothing(device):
    """`train` (save_at_end) stopped before its first step saved the untrained model: a fresh `train` into that
    folder was then refused as "a trained model", and chat answered garbage. A new model saves only once a
    step trained it; a resumed run stopped before its first new step is saved as before where it changed."""
    from core.run import Run, RunHooks, RunRequest

    saves = []
    run = Run(RunRequest(device=device, model_config=SMALL, train_config=_tc(2), save_at_end=True),
              RunHooks(save=lambda trainer, stage_end: saves.append(trainer.stage_step) or "here"))
    events = []
    for ev in run.events():
        events.append(ev)
        if isinstance(ev, RunStarted):
            run.request_stop()
    done = events[-1]
    assert isinstance(done, RunDone) and done.stopped and not done.checkpoint and saves == []
    assert not any(isinstance(e, StepReport) for e in events)


# ----------------------------------------------------------------------------- the model's rows
def _long_conversation_data():
    """The default dataset's facts and first turns, and one conversation of three of those turns: the
    longest training row, shorter than a context of 256 (the "chat" recall prompts are longer still)."""
    from core.dataset import Dataset, Dialogue

    ds = default_dataset()
    singles = [Dialogue([d.turns[0]]) for d in ds.dialogues]
    return Dataset(list(ds.facts), singles + [Dialogue([d.turns[0] for d in ds.dialogues[:3]])])


def test_the_trainer_builds_its_model_for_the_longest_row_and_a_run_never_exceeds_it(device, monkeypatch):
    """The model is built for the longest row any batch can hold (the long conversation), less than the
    context; a whole run (steps, recall checks at both stage ends, validation loss) gives it nothing it was
    not built for: longer check prompts come in fewer rows, within batch_size x max_seq tokens."""
    from dataclasses import replace

    from core.model import Model
    from core.trainer import max_seq_of

    seen: list[tuple[int, int]] = []
    load = Model._load_batch
    monkeypatch.setattr(Model, "_load_batch", lambda self, tokens, *a: seen.append(np.shape(tokens)) or
                        load(self, tokens, *a))
    cl, ds = 256, _long_conversation_data()
    checked: list[int] = []
    tr = Trainer(ds, replace(SMALL, context_length=cl), _tc(6), device, check_memory=checked.append)
    m, rows = tr.model, [len(e.ids) - 1 for e in tr.dialogues]
    assert checked == [m.max_seq] == [max_seq_of(tr.batches, m.batch_size)]
    assert m.max_seq == max(rows) == len(tr.dialogues[-1].ids) - 1 < cl
    assert max(len(e.ids) - 1 for s in range(6) for e in tr.batches.examples(1, s)) == m.max_seq  # it is trained
    events = list(tr.run())
    assert tr.done and sum(isinstance(e, StageReport) and bool(e.recall) for e in events) == 2
    tr.validation_loss()
    assert seen and all(b * t <= m.rows and t <= cl for b, t in seen), max(seen, key=lambda s: s[0] * s[1])
    assert max(t for _, t in seen) > m.max_seq  # a "chat" prompt, in a smaller batch


def test_no_batch_has_a_row_longer_than_the_batches_longest_row():
    """Batches.longest_row bounds every row of every step, packed facts and conversations included (no
    device: the batches are a pure function of the step)."""
    from core.batches import Batches
    from core.tokenizer import Tokenizer

    ds = _long_conversation_data()
    tok = Tokenizer.train(ds.tokenizer_texts(), vocab_size=300)
    for tc in (_tc(), _tc(pack_facts=3, conversation_every=2, mix_share=0.25)):
        b = Batches(tok, ds, 256, tc)
        longest = max(len(e.ids) - 1 for st in (0, 1) for s in range(40) for e in b.examples(st, s))
        assert longest <= b.longest_row()
        if tc.pack_facts == 1:
            assert longest == b.longest_row()


@pytest.mark.parametrize("n_facts", [1, 2, 3, 5])
@pytest.mark.parametrize("pack_facts", [2, 4])
def test_packed_rows_of_a_few_facts_stay_within_the_longest_row(n_facts, pack_facts):
    """Fewer facts than a row packs (one fact and one dialogue: a new user's first try) put one fact in a row
    several times, and draws across an epoch put one twice: the model was built for 28 tokens and got a
    batch of 31 ("batch of 16 x 31 tokens exceeds the 16 x 28 (max_seq)")."""
    from core.batches import Batches
    from core.dataset import Dataset, Dialogue
    from core.tokenizer import Tokenizer

    facts = [("Quillmere is a town " + "by the river " * i).strip() + "." for i in range(n_facts)]
    ds = Dataset(facts, [Dialogue([("What is Quillmere?", "A town.")])])
    tok = Tokenizer.train(ds.tokenizer_texts(), vocab_size=300)
    b = Batches(tok, ds, 128, _tc(pack_facts=pack_facts))
    longest = max(len(e.ids) - 1 for s in range(60) for e in b.examples(0, s))
    assert longest <= b.longest_row()
