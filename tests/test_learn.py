"""Train until learned: the batched recall check, checks during a stage, patience, time budget."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from core.config import PRESETS, ModelConfig, StageConfig, TrainConfig, replace
from core.dataset import default_dataset
from core.model import Model
from core.recall import greedy_batch, recall_check
from core.trainer import RecallProgress, StageReport, StepReport, Trainer, recall_table

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, context_length=64)


def _tc(steps, lr=3e-3, **kw):
    return TrainConfig(pretrain=StageConfig(steps=steps, lr=lr, batch_size=8, warmup_steps=2),
                       dialogues=StageConfig(steps=steps, lr=lr, batch_size=8, warmup_steps=2), vocab_size=300, **kw)


def test_batched_greedy_matches_one_row_at_a_time(device):
    """Right padding is invisible to each row (causal attention): prompts of different lengths decoded
    together give what each gives alone."""
    cfg = replace(SMALL, vocab_size=50)
    model = Model(device, cfg, batch_size=5, seed=3, training=False)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 50, n).tolist() for n in (1, 7, 3, 12, 5)]
    max_new = [6, 2, 9, 4, 0]
    together = greedy_batch(model, prompts, max_new, eos_id=0, pad_id=0)
    alone = [greedy_batch(model, [p], [m], eos_id=0, pad_id=0)[0] for p, m in zip(prompts, max_new)]
    assert together == alone
    assert [len(o) for o in together] <= max_new and together[4] == []
    assert all(len(o) == m or o[-1] == 0 for o, m in zip(together, max_new))


def test_cached_greedy_gives_the_batched_tokens_in_rows_within_max_seq(device):
    """Decoding one prompt at a time over the model's own K/V buffers (greedy_cached) gives greedy_batch's
    tokens, with the same rule of ending; a model built for short rows (max_seq 4 x 5 rows) decodes a row of
    up to its 20 tokens; the cost model picks one by one when tokens cost and together when forwards do."""
    from core.from_base import Speed
    from core.recall import CheckSpeed, _Prompt, decode_seconds, greedy_cached, one_by_one

    cfg = replace(SMALL, vocab_size=50)
    model = Model(device, cfg, batch_size=5, seed=3, training=False, max_seq=4)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 50, n).tolist() for n in (1, 7, 3, 12, 5)]
    max_new = [6, 2, 9, 8, 0]
    alone = [greedy_batch(model, [p], [m], eos_id=0, pad_id=0)[0] for p, m in zip(prompts, max_new)]
    assert greedy_cached(model, prompts, max_new, eos_id=0) == alone
    assert [len(o) for o in alone] == [6, 2, 9, 8, 0]  # no EOS drawn: every row ran to its max_new
    eos = alone[2][3]  # a token drawn mid-row ends it, both ways
    assert greedy_cached(model, prompts, max_new, eos_id=eos) == [greedy_batch(model, [p], [m], eos, 0)[0]
                                                                  for p, m in zip(prompts, max_new)]
    asked = [_Prompt("fact", i, "", "", p, m) for i, (p, m) in enumerate(zip(prompts[:4], max_new))]
    per_token = CheckSpeed(Speed(0.0, 1.0), 1.0)  # seconds a token, however many in a forward
    together, one = decode_seconds(asked, cfg.context_length, per_token)
    live = [[p for p in asked if k < p.max_new] for k in range(9)]  # the rows still decoding at step k
    assert together == sum(len(rows) * max(len(p.ids) + k for p in rows) for k, rows in enumerate(live))
    assert one == sum(len(p.ids) + p.max_new - 1 for p in asked)
    assert one_by_one(asked, cfg.context_length, per_token)
    assert not one_by_one(asked, cfg.context_length, CheckSpeed(Speed(1.0, 0.0), 1.0))  # a second a forward


def test_batched_recall_agrees_with_the_per_prompt_check(device):
    """Part-trained (some items right, some wrong): the batched check marks the same items right as the
    chat's one-prompt-at-a-time decoding; a wrong answer is cut a few tokens past the expected length."""
    mc, tc = PRESETS["Tiny"]
    tc = replace(tc, pretrain=replace(tc.pretrain, steps=70), dialogues=replace(tc.dialogues, steps=40))
    tr = Trainer(default_dataset(), mc, tc, device)
    for _ in tr.run(recall=False):
        pass
    batched = tr.recall(("fact", "dialogue"))
    single = recall_table(tr.generator(), tr.tokenizer, tr.dataset)
    assert [(r.kind, r.index, r.ok) for r in batched] == [(r.kind, r.index, r.ok) for r in single]
    assert 0 < sum(r.ok for r in batched) < len(batched)  # a real mix, so the comparison means something
    for b, s in zip(batched, single):
        assert s.got.startswith(b.got.rstrip()), (b.got, s.got)


def test_recall_check_reports_every_batch_and_stops_between_batches(device):
    tr = Trainer(default_dataset(), SMALL, _tc(1), device)
    seen = list(recall_check(tr.model, tr.tokenizer, tr.dataset))
    total = seen[0][1]
    assert seen[0][0] == 0 and seen[-1][0] == total == len(seen[-1][2])
    steps = [b[0] - a[0] for a, b in zip(seen, seen[1:])]
    assert len(seen) >= 1 + -(-total // tr.model.batch_size) and all(0 < s <= tr.model.batch_size for s in steps)
    asked = []
    partial = list(recall_check(tr.model, tr.tokenizer, tr.dataset, should_stop=lambda: len(asked.append(1) or asked) > 2))
    assert len(partial) == 3 and len(partial[-1][2]) == 2 * tr.model.batch_size


def test_a_stage_ends_when_its_facts_are_learned(device):
    """check_every: pretraining stops well before its maximum once every fact is reproduced; the
    end-of-stage table agrees, and the checks were reported as RecallProgress events."""
    mc, tc = PRESETS["Tiny"]
    tc = replace(tc, pretrain=replace(tc.pretrain, steps=600), dialogues=StageConfig(steps=0), check_every=25, patience=0)
    tr = Trainer(default_dataset(), mc, tc, device)
    events = list(tr.run())
    rep = next(e for e in events if isinstance(e, StageReport) and e.stage == "pretrain")
    assert rep.end_reason == "learned" and rep.steps_done < 600 and rep.steps_done % 25 == 0
    # what ran is recorded, and a GGUF export says it (it said 600: the stage's most steps); tuning had none
    from core.checkpoint import trainer_meta
    from core.checkpoint_meta import CheckpointMeta, TrainingKeys

    meta = CheckpointMeta.from_json(trainer_meta(tr).to_json())
    assert tr.stages_run == [rep.steps_done, 0] and meta.stages_run == (rep.steps_done, 0)
    summary = meta.training_summary()
    assert summary[TrainingKeys.PRETRAIN_STEPS] == rep.steps_done and summary[TrainingKeys.DIALOGUES_STEPS] == 0
    assert meta.stage_steps_done() == (600, 0)  # a resume still counts the stage as all its steps done
    ok, n = rep.facts_recalled
    assert ok == n == len(default_dataset().facts)
    checks = [e for e in events if isinstance(e, RecallProgress)]
    assert any(not e.final for e in checks) and checks[-1].final and checks[-1].done == checks[-1].total
    assert sum(isinstance(e, StepReport) for e in events) == rep.steps_done


def test_a_resume_that_extends_a_stage_that_ended_early_says_so(device, tmp_path, capsys):
    """A tuning stage that ended early (learned) and is given more steps resumes after all its planned steps (they
    count as done), and the resume line says how many ran (it said only 'step 150')."""
    from core.checkpoint import save_trainer
    from core.cli import main

    mc, tc = PRESETS["Tiny"]
    tc = replace(tc, pretrain=replace(tc.pretrain, steps=360, decay_steps=100),  # as Auto plans the bundled dataset
                 dialogues=replace(tc.dialogues, steps=150, decay_steps=150), replay_share=0.5, check_every=25,
                 patience=4, mix_share=0.5, conversation_every=2, pack_facts=2)
    tr = Trainer(default_dataset(), mc, tc, device)
    rep = [e for e in tr.run() if isinstance(e, StageReport)][-1]
    assert rep.stage == "dialogues" and rep.end_reason == "learned" and rep.steps_done < 150
    save_trainer(tr, tmp_path / "run")
    assert main(["train", "--resume", str(tmp_path / "run"), "--tune-steps", "151", "-q"]) == 0
    assert (f"resuming {tmp_path / 'run'} at stage 2 of 2, step 150 (the stage had ended after {rep.steps_done} "
            f"steps; its steps up to 150 count as done)") in capsys.readouterr().out


def test_a_stage_is_not_learned_before_its_learned_after_share_of_steps(device):
    """learned_after: a check that finds every fact before that share of the stage's planned steps does
    not end the stage; the first one after it does."""
    mc, tc = PRESETS["Tiny"]
    tc = replace(tc, pretrain=replace(tc.pretrain, steps=600), dialogues=StageConfig(steps=0), check_every=25, patience=0)

    def pretrain_report(t):
        return next(e for e in Trainer(default_dataset(), mc, t, device).run(recall=False)
                    if isinstance(e, StageReport) and e.stage == "pretrain")
    early = pretrain_report(tc)
    assert early.end_reason == "learned" and early.steps_done <= 300
    late = pretrain_report(replace(tc, learned_after=(early.steps_done + 50) / 600))
    assert late.end_reason == "learned" and early.steps_done + 50 <= late.steps_done < 600


def test_patience_ends_a_stage_that_does_not_improve(device):
    tc = replace(_tc(200, lr=1e-7, check_every=5, patience=2), dialogues=StageConfig(steps=0))
    tr = Trainer(default_dataset(), SMALL, tc, device)
    rep = next(e for e in tr.run(recall=False) if isinstance(e, StageReport))
    assert rep.end_reason == "no progress" and rep.steps_done == 15  # best at 5, no better at 10 and 15


def test_min_gain_ends_a_stage_one_complete_check_after_its_planned_steps(device):
    """min_gain (an Auto plan's rule): past the planned steps every check looks at all items, and a stage ends
    "no progress" at the first that gains too little: here nothing can gain 99 %, so both stages end one
    check interval after their planned steps, tuning too (whose checks leave out the held-out kind, which the
    end-of-stage table of pretraining asked a sample of)."""
    st = StageConfig(steps=80, decay_steps=20, lr=1e-7, batch_size=4, warmup_steps=1)
    tc = TrainConfig(pretrain=st, dialogues=st, vocab_size=300, check_every=10, check_sample=4, min_gain=0.99,
                     heldout=8, fact_questions=1, patience=0)
    from core.dataset import Dataset, Dialogue
    from tests.make_datasets import make_dataset

    g = make_dataset("people", items=20, dialogues=30)
    ds = Dataset(list(g.facts), [Dialogue([qa]) for qa in g.dialogues])
    tr = Trainer(ds, SMALL, tc, device)
    assert len(tr.heldout_pairs) > tc.check_sample  # the held-out kind is sampled at pretraining's end
    reps = [e for e in tr.run() if isinstance(e, StageReport)]
    assert [(r.stage, r.end_reason, r.steps_done) for r in reps] == [
        ("pretrain", "no progress", 30), ("dialogues", "no progress", 30)]


def test_time_budget_ends_the_run(device):
    tc = _tc(100000, time_budget_s=1.5)
    tr = Trainer(default_dataset(), SMALL, tc, device)
    reps = [e for e in tr.run(recall=False) if isinstance(e, StageReport)]
    assert [r.end_reason for r in reps] == ["time budget", "time budget"] and tr.done
    assert all(0 < r.steps_done < 100000 for r in reps)


# ----------------------------------------------------------------------------- plan and verdict

def test_verdict_says_what_was_learned_and_what_to_do():
    from core.plan import verdict

    v = verdict((1950, 2000), (178, 200), end_reason="time budget", preset="Small")
    assert not v.learned and v.text == "Not fully learned: 178 of 200 answers, 1,950 of 2,000 facts"
    assert "more time" in v.advice and "bigger model" in v.advice
    assert "bigger model" in verdict((1, 2), (2, 2), end_reason="no progress").advice
    assert "bigger" not in verdict((1, 2), (2, 2), end_reason="steps", preset="Larger").advice
    # a named preset's set steps: the advice names Auto too (a new user's Tiny run took 'train longer', got worse)
    fixed = verdict((1, 2), (2, 2), end_reason="steps", preset="Tiny", fixed_steps=True).advice
    assert fixed == ("train longer (more steps or passes) or a bigger model, or train a new run with the Auto preset "
                     "(the default: it plans the run and trains until learned)")
    assert "Auto" not in verdict((1, 2), (2, 2), end_reason="steps", preset="Tiny").advice
    ok = verdict((2000, 2000), (200, 200), end_reason="learned")
    assert ok.learned and ok.advice == "" and ok.text.startswith("Learned: 200 of 200 answers, 2,000 of 2,000 facts")
    assert verdict((1900, 2000), (190, 200), target=0.95).learned


def test_the_verdict_says_why_it_checked_fewer_facts_than_the_dataset_has():
    """A fact whose prompt leaves no room in the context, or of a single word, is not checked: the verdict says so
    where its count would otherwise fall short of the dataset's ("0 of 2 facts" of a dataset of 3 facts). From a
    new user's trial."""
    from core.plan import verdict_of
    from core.dataset import Dataset, Dialogue
    from core.recall import ONE_WORD, TOO_LONG, RecallItem, recall_prompts
    from core.chat_format import encode_fact
    from core.tokenizer import Tokenizer

    tok = Tokenizer.train(default_dataset().tokenizer_texts(), 300)
    data = Dataset(["The cat is black.", "Hello.", "word " * 200, "Paris is in France."],
                   [Dialogue([("Q?", "A."), ("word " * 100, "A."), ("", "skipped: not trained")])])
    left_out = {}
    prompts = recall_prompts(tok, data, 64, left_out=left_out)
    assert left_out == {"fact": {TOO_LONG: 1, ONE_WORD: 1}, "dialogue": {TOO_LONG: 1}}
    assert sum(p.kind == "fact" for p in prompts) == 2 and sum(p.kind == "dialogue" for p in prompts) == 1
    table = tuple(RecallItem(p.kind, p.index, p.prompt, p.expected, "", False) for p in prompts)
    report = StageReport("pretrain", 3, False, table, recall_left_out=left_out)
    assert verdict_of(report).text == ("Not fully learned: 0 of 1 answers checked (1 too long for the context to "
                                       "check), 0 of 2 facts checked (1 too long for the context to check, 1 of a "
                                       "single word)")
    left_out.clear()
    assert recall_prompts(tok, Dataset(["The cat is black."]), 64, left_out=left_out) and left_out == {"fact": {}, "dialogue": {}}
    ok = RecallItem("fact", 0, "The cat", " is black.", " is black.", True)
    assert verdict_of(StageReport("pretrain", 3, False, (ok,), recall_left_out={})).text == \
        "Learned: 1 of 1 facts — try the model on the Chat tab"  # nothing left out: no note
    left_out.clear()  # a fact longer than the context whose first words fit: left out too (trained in pieces)
    long_fact = "Paris is in France and " + "it is a city of many old streets and " * 8
    n = len(tok.encode(long_fact))
    assert 2 * 128 > n > 128 and not recall_prompts(tok, Dataset([long_fact]), 128, left_out=left_out) and \
        left_out == {"fact": {TOO_LONG: 1}, "dialogue": {}}
    assert [p.kind for p in recall_prompts(tok, Dataset([long_fact]), n + 2)] == ["fact"]  # it fits: checked
    fits = next(f for f in (" ".join(["Paris is a city"] * n) for n in range(2, 40))
                if len(encode_fact(tok, f)) > 40)  # Dataset.validate's rule at the boundary: whole at context + 1
    ctx = len(encode_fact(tok, fits)) - 1
    assert not Dataset([fits]).validate(tok, ctx + 1) and [p.index for p in recall_prompts(tok, Dataset([fits]), ctx)] == [0]
    assert Dataset([fits]).validate(tok, ctx) and not recall_prompts(tok, Dataset([fits]), ctx - 1)
    left_out.clear()  # empty facts are no facts of a single word
    assert [p.index for p in recall_prompts(tok, Dataset(["", "Hello.", "The cat sleeps."]), 64, left_out=left_out)] \
        == [2] and left_out == {"fact": {ONE_WORD: 1}, "dialogue": {}}
    none = verdict_of(StageReport("pretrain", 3, False, (), recall_left_out={"fact": {TOO_LONG: 2}}))
    assert not none.learned and none.text == "Nothing could be checked: 0 of 0 facts checked (2 too long for the " \
                                             "context to check)"  # not "Learned" when every fact was left out


def test_plan_scales_with_the_data_and_fits_a_time_budget():
    from core.estimates import DatasetStats
    from core.plan import make_plan

    small = DatasetStats(600, 470, 400, 25, 13, 51, [])
    big = DatasetStats(1024, 30000, 8000, 2000, 200, 60, [])
    p1, p2 = make_plan(small, 1e-5), make_plan(big, 1e-5)
    assert p1.preset == "Tiny" and p2.preset == "Small"
    from core.plan import PRETRAIN_PASSES, TUNE_PASSES, step_rows

    rows = step_rows(p2.train_config, big)
    assert p2.planned_steps[0] == math.ceil(PRETRAIN_PASSES * 2000 / rows[0])
    assert round(p2.pretrain_passes) == PRETRAIN_PASSES and round(p2.tune_passes) == TUNE_PASSES
    assert p2.train_config.dialogues.steps > p2.planned_steps[1] and p2.train_config.check_every > 0
    assert p2.total_s > p1.total_s > 0
    fit = make_plan(big, 1e-5, time_budget_s=p2.total_s / 3)
    assert fit.total_s <= p2.total_s / 3 * 1.05 and fit.notes and fit.train_config.time_budget_s == p2.total_s / 3


def test_the_estimate_runs_the_planned_steps_when_checks_sample_and_less_when_they_see_everything():
    """A stage whose checks sample cannot end "learned" on them (core.trainer.EarlyStop): it is expected to
    run its planned steps, a check interval more and two complete checks; a small one ends early."""
    from core.estimates import DatasetStats
    from core.plan import LEARNED_SHARE, MIN_GAIN, make_plan

    small = make_plan(DatasetStats(600, 470, 400, 25, 13, 51, []), 1e-5, recall_prompts=(25, 13))
    big = make_plan(DatasetStats(1024, 30000, 8000, 2000, 200, 60, []), 1e-5, recall_prompts=(2000, 200))
    assert small.expected_s == pytest.approx(LEARNED_SHARE * (small.total_s - small.check_s), rel=0.3)
    assert small.expected_s < small.total_s
    tc = big.train_config
    every = tc.check_every
    steps_s = big.train_s / sum(big.planned_steps)
    assert big.expected_s > big.total_s + every * steps_s * 0.5  # the planned steps and one interval after them
    assert tc.min_gain == MIN_GAIN and tc.pretrain.steps > tc.pretrain.decay_steps == big.planned_steps[0]


def test_a_plan_times_each_stage_at_its_own_speed():
    """Tuning's rows are longer than pretraining's, and a token of a long row costs less: its measured speed
    (tune_seconds_per_token) times the tuning steps, the pretraining speed the rest."""
    from core.estimates import DatasetStats
    from core.plan import make_plan

    stats = DatasetStats(1024, 30000, 8000, 2000, 200, 60, [])
    same, faster = make_plan(stats, 1e-5), make_plan(stats, 1e-5, tune_seconds_per_token=0.5e-5)
    assert same.planned_steps == faster.planned_steps and faster.train_s < same.train_s
    assert make_plan(stats, 1e-5, tune_seconds_per_token=1e-5).train_s == pytest.approx(same.train_s)


def test_speed_is_measured_once_and_cached(device, tmp_path, monkeypatch):
    from core import plan

    monkeypatch.setenv("OPENCL_LLM_CACHE_DIR", str(tmp_path))
    mc = replace(SMALL, vocab_size=300)
    v = plan.measure_speed(device, mc, 4, 16, steps=2)
    assert v > 0 and plan.cached_speed(plan.speed_key(device.info.label, mc, 4, 16)) == v
    assert plan.measure_speed(device, mc, 4, 16) == v  # from the cache, not measured again


def test_cli_auto_plans_trains_until_learned_and_gives_a_verdict(tmp_path, capsys, device):
    from core.cli import main

    out = tmp_path / "m"
    # steps far beyond what 0.6 s allows, so the budget (not the plan's step count) ends the run
    assert main(["train", "--out", str(out), "--device", str(device.info.index), "-q", "--time-budget", "0.01",
                 "--pretrain-steps", "3000", "--tune-steps", "3000"]) == 0
    text = capsys.readouterr().out
    assert "plan: Tiny model" in text and "passes over the facts" in text
    # the steps given replace the plan's, and the output says so (a new user saw "pretrain 124 steps" planned, then
    # 50 steps run, with no word on why)
    assert "note: as you asked, pretrain 3,000 steps (planned " in text and "and tune 3,000 steps (planned " in text
    assert "Not fully learned:" in text and "to learn the rest: the time budget ran out: give more time" in text


def test_an_auto_run_of_another_shape_names_the_size_trained(tmp_path, capsys, device):
    """Auto with --d-model: the plan's line names the plan's model, so a note names the shape asked for and the
    size of the model trained (it printed only the plan's size, 185,792 parameters for a model of 303,264)."""
    import re

    from core.checkpoint import load_model
    from core.cli import main

    out = tmp_path / "m"
    assert main(["train", "--out", str(out), "--device", str(device.info.index), "-q", "--d-model", "96",
                 "--pretrain-steps", "2", "--tune-steps", "2"]) == 0
    text = capsys.readouterr().out
    note = re.search(r"note: as you asked, d_model 96 \(planned (\d+)\): ([\d,]+) parameters \(planned ([\d,]+)\); "
                     r"pretrain 2 steps \(planned [\d,]+\) and tune 2 steps", text)
    assert note, text
    planned_d, trained, planned = int(note[1]), int(note[2].replace(",", "")), int(note[3].replace(",", ""))
    assert planned_d != 96 and trained != planned
    assert trained == load_model(str(out)).config.n_params()
    # a float as given (not 1e+06), and no size where the shape asked for has the plan's parameter count
    assert main(["train", "--out", str(tmp_path / "r"), "--device", str(device.info.index), "-q", "--rope-theta",
                 "1000000", "--pretrain-steps", "1", "--tune-steps", "1"]) == 0
    text = capsys.readouterr().out
    assert "note: as you asked, rope_theta 1000000 (planned 10000); pretrain 1 step" in text, text


@pytest.mark.parametrize("seed", [0, 2])  # seed 2: pretraining runs all its steps, its last check short of the end's
def test_the_bundled_example_is_learned_whole_with_default_settings(tmp_path, capsys, device, seed):
    """`opencl-llm train` with no options (Auto): every fact, every answer and every answer in the middle
    of a conversation, so the verdict is "Learned" (tuning may not end "learned" after losing facts that
    pretraining had: the verdict would then call the run short)."""
    from core.cli import main

    assert main(["train", "--out", str(tmp_path / "m"), "--device", str(device.info.index), "-q",
                 "--seed", str(seed)]) == 0
    text = capsys.readouterr().out
    # 11 of its facts no dialogue asks about (the otters, the wolves, ...): learned as text, and said so
    assert ("questions: no dialogue asks about 11 of 25 facts (such as \"The Brindlewick library keeps a map drawn by the "
            "town found…\") and no question was written for them") in text
    assert ("Learned: 15 of 15 answers, 25 of 25 facts (11 as text only: no question asks about them, so the model "
            "may not answer questions about them), "
            "13 of 13 in a conversation") in text, text[-600:]


def test_cli_recall_checks_a_dataset_file_against_a_model(tmp_path, capsys, device):
    """``opencl-llm recall`` counts what the batched check counts, and agrees with the chat's decoding."""
    from pathlib import Path

    from core.checkpoint import load_model
    from core.cli import main
    from core.dataset import load_dataset
    from core.generate import Generator

    model = Path(__file__).parent / "data" / "checkpoint_v1"
    loaded = load_model(model)
    ds, _ = load_dataset(model / "dataset.json")
    data = tmp_path / "ask.txt"
    data.write_text("".join(f"User: {q}\nAssistant: {a}\n\n" for d in ds.dialogues for q, a in d.turns[:1]))
    assert main(["recall", "--model", str(model), "--data", str(data), "--device", str(device.info.index),
                 "--show-wrong"]) == 0
    out = capsys.readouterr().out
    asked, _ = load_dataset(data)
    ref = recall_table(Generator(device, loaded.config, loaded.weights), loaded.tokenizer, asked)
    ok, n = sum(r.ok for r in ref), len(ref)
    assert f"{ok:,} of {n:,} answers" in out and "facts" not in out.splitlines()[-1]
    assert out.count("got ") == n - ok
    data.write_text("The cat is black.\n" + "word " * 400 + "\n")  # the second longer than the model's context
    assert main(["recall", "--model", str(model), "--data", str(data), "--device", str(device.info.index)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]  # (whether the model knows the cat does not matter here)
    assert re.fullmatch(r"[01] of 1 facts \([0-9.]+ %\); not checked: 1 too long for the context to check", last), last
    # without --data a checkpoint folder is checked on the dataset it was trained on; a .gguf has none
    assert main(["recall", "--model", str(model), "--device", str(device.info.index)]) == 0
    out = capsys.readouterr().out
    assert f"({model / 'dataset.json'})" in out.splitlines()[0]
    assert main(["recall", "--model", str(model), "--data", str(model / "dataset.json"),
                 "--device", str(device.info.index)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == out.splitlines()[-2:]
    gguf = tmp_path / "m.gguf"
    assert main(["export", "--model", str(model), "--out", str(gguf)]) == 0
    capsys.readouterr()
    assert main(["recall", "--model", str(gguf)]) == 2
    assert "m.gguf: has no dataset of its own" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_text("User: a question with no answer\n")  # printed nothing and exited 0
    assert main(["recall", "--model", str(model), "--data", str(tmp_path / "empty.txt")]) == 2
    assert "empty.txt: no facts or dialogues with text could be read, so there is nothing to check" in capsys.readouterr().err


def test_patience_waits_for_the_planned_steps(device):
    """With ``decay_steps`` (the Auto plan's planned steps), checks before it never end a stage."""
    tc = _tc(200, lr=1e-7, check_every=5, patience=2)
    tc = replace(tc, pretrain=replace(tc.pretrain, decay_steps=10), dialogues=StageConfig(steps=0))
    tr = Trainer(default_dataset(), SMALL, tc, device)
    rep = next(e for e in tr.run(recall=False) if isinstance(e, StageReport))
    assert rep.end_reason == "no progress" and rep.steps_done == 20  # 15 and 20 count, 5 and 10 do not


def test_the_cosine_decay_ends_at_decay_steps():
    from core.config import lr_at

    st = StageConfig(steps=300, lr=1e-2, warmup_steps=10, min_lr_ratio=0.1, decay_steps=100)
    assert lr_at(st, 9) == 1e-2 and abs(lr_at(st, 100) - 1e-3) < 1e-12 and lr_at(st, 250) == lr_at(st, 100)
    assert 1e-3 < lr_at(st, 55) < lr_at(replace(st, decay_steps=0), 55) < 1e-2
    assert lr_at(replace(st, decay_steps=0), 100) > 5e-3  # without it the decay spans all 300 steps


def test_dataset_stats_counts_each_entry_as_training_encodes_it():
    """core.estimates.dataset_stats (each distinct text encoded once) against counts made here entry by entry
    with the same trained tokenizer: tokens, windows, the longest entry and the too-long ones, on two
    generated datasets and one with a fact longer than the context and a repeated fact."""
    from core.batches import dialogue_examples, fact_examples
    from core.chat_format import encode_dialogue, encode_fact
    from core.dataset import Dataset, Dialogue
    from core.estimates import dataset_stats
    from core.tokenizer import Tokenizer
    from tests.make_datasets import make_dataset

    long_fact = " ".join(f"word{i}" for i in range(300))
    sets = [make_dataset(n, items=40, dialogues=12) for n in ("people", "catalogue")]
    sets = [Dataset(list(g.facts), [Dialogue([qa]) for qa in g.dialogues]) for g in sets]
    sets.append(Dataset(["The heron is grey.", long_fact, "The heron is grey."],
                        [Dialogue([("Colour of the heron?", "Grey."), ("And the miller?", "Tall.")])]))
    for ds in sets:
        s = dataset_stats(ds, 512, 64)
        tok = Tokenizer.train(ds.tokenizer_texts(), vocab_size=512)
        fact_lens = [len(encode_fact(tok, f)) for f in ds.facts]
        dlg_lens = [len(encode_dialogue(tok, d)[0]) for d in ds.dialogues]
        assert (s.vocab_size, s.fact_tokens, s.dialogue_tokens, s.longest) == \
            (tok.vocab_size, sum(fact_lens), sum(dlg_lens), max(fact_lens + dlg_lens))
        assert (s.fact_sequences, s.dialogue_sequences) == \
            (len(fact_examples(tok, ds.facts, 64)), len(dialogue_examples(tok, ds.dialogues, 64)))
        assert [p.index for p in s.too_long] == [i for i, n in enumerate(fact_lens) if n > 65]
    assert [p.index for p in s.too_long] == [1]
