"""Training tab: replacing a trained model, resuming with changed settings, saying why Start is
disabled, showing a project's saved state. Runs the Tiny preset on the PoCL (CPU) device."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from core.dataset import Dataset
from core.stages import Stage
from gui.events import ComparedAnswer, Comparison, TrainingStep
from tests.test_gui_e2e import configure_tiny, wait_idle


def _meta(folder: Path):
    from core.checkpoint import CheckpointMeta

    return CheckpointMeta.read(folder)


def _run_and_stop(qtbot, t) -> None:
    assert t.start(), t.banner_text.text()
    qtbot.waitUntil(lambda: t._last is not None, timeout=60_000)
    t.stop()
    wait_idle(qtbot, t, timeout=60_000)


def test_a_new_run_asks_and_keeps_the_trained_model_until_its_first_stage_ends(main_window, qtbot, dialogs):
    w, t = main_window, main_window.training_tab
    configure_tiny(w, pretrain=4, dialogues=2, batch=2)
    assert t.start()
    wait_idle(qtbot, t)
    assert not dialogs.asked  # nothing to replace yet
    ckpt = w.project.checkpoint_dir
    assert _meta(ckpt).stage_index == 2
    weights = (ckpt / "weights.npz").read_bytes()

    dialogs.answer = False
    assert not t.start() and not t.is_running()
    assert dialogs.asked[-1][0] == "Replace the trained model?"

    configure_tiny(w, pretrain=300, dialogues=2, batch=2)
    dialogs.answer = True
    _run_and_stop(qtbot, t)
    assert (ckpt / "weights.npz").read_bytes() == weights and _meta(ckpt).stage_index == 2
    assert w.trained_model_path() == ckpt and w.project.has_pending()
    assert t.stage_label.text().startswith("Stopped at stage 1") and "kept" in t.stage_label.text()
    assert t.resume_button.isEnabled()

    # Resume continues the new run; its first stage end makes it the trained model
    # training-only: no question; +5 so the resumed run cannot repeat the first model step for step
    w.hyper_tab.widgets["pretrain.steps"].setValue(t._last.step + 5)
    n_asked = len(dialogs.asked)
    assert t.resume(), t.banner_text.text()
    wait_idle(qtbot, t)
    assert len(dialogs.asked) == n_asked
    assert not w.project.has_pending() and _meta(ckpt).stage_index == 2
    assert (ckpt / "weights.npz").read_bytes() != weights
    # the honest verdict, never "Training finished — try the model" when it was not learned
    verdict = t.stage_label.text()
    assert re.match(r"(Not fully learned|Learned): \d+ of \d+ answers, \d+ of \d+ facts", verdict), verdict
    assert verdict.startswith("Learned") or "to learn the rest:" in verdict


def test_resume_says_what_it_does_not_use_and_applies_training_settings(main_window, qtbot, dialogs):
    from gui.training_tab import validation_interval

    w, t, h = main_window, main_window.training_tab, main_window.hyper_tab
    configure_tiny(w, pretrain=200, dialogues=0, batch=2)
    _run_and_stop(qtbot, t)
    ckpt = w.project.checkpoint_dir
    h.widgets["d_model"].setValue(128)
    w.dataset_tab.add_fact("A fact added after the run.")
    h.widgets["pretrain.steps"].setValue(300)

    dialogs.answer = False
    assert not t.resume() and not t.is_running()
    text = dialogs.asked[-1][1]
    assert "Resume continues the saved model and dataset" in text and "Start a new run" in text
    assert "d_model: 64 in the saved run, 128 in the form" in text and "the dataset" in text
    assert "pretrain.steps: 200 → 300" in text

    dialogs.answer = True
    assert t.resume()
    qtbot.waitUntil(lambda: t._last is not None, timeout=60_000)
    assert t.progress.maximum() == 300
    assert t._worker.val_every == validation_interval(h.build()[1]) == 20
    t.stop()
    wait_idle(qtbot, t, timeout=60_000)
    meta = _meta(ckpt)
    assert meta.model.d_model == 64 and meta.train.pretrain.steps == 300
    assert "since resuming" in t.speed_label.text()


def test_start_says_why_it_is_disabled(main_window):
    t = main_window.training_tab
    main_window.hyper_tab.widgets["n_heads"].setValue(3)
    assert not t.start_button.isEnabled()
    for text in (t.start_button.toolTip(), t.hint_label.text()):
        assert "Attention heads" in text and "n_heads" in text
    assert not t.hint_label.isHidden()
    main_window.hyper_tab.set_preset("Tiny")
    assert t.start_button.isEnabled() and t.hint_label.isHidden()
    assert "from scratch" in t.start_button.toolTip()


def test_a_stopped_run_shows_its_position_after_a_restart(main_window, studio_env, qtbot):
    from gui.main_window import MainWindow

    configure_tiny(main_window, pretrain=200, dialogues=0, batch=2)
    _run_and_stop(qtbot, main_window.training_tab)
    step = _meta(main_window.project.checkpoint_dir).stage_step
    main_window.close()
    again = MainWindow()
    qtbot.addWidget(again)
    try:
        t = again.training_tab
        assert t.stage_label.text() == f"Stopped at stage 1 step {step} of 200 — Resume to continue"
        assert t.resume_button.isEnabled()
        assert t.progress.maximum() == 200 and t.progress.value() == step
    finally:
        again.close()


def test_opening_another_project_clears_the_training_tab(main_window, tmp_path):
    w, t = main_window, main_window.training_tab
    w.save_project_as(tmp_path / "other")
    w.save_project_as(tmp_path / "first")
    w.dataset_tab.set_dataset(Dataset())
    assert not t.start()  # the dataset is empty: banner
    assert not t.banner.isHidden()
    t.append_log("INFO", "a line of the first project")
    t.plots.add_step(TrainingStep(stage="pretrain", step=1, total_steps=1, global_step=1, loss=2.0, grad_norm=1.0,
                                  lr=1e-3, layer_grad_norms=(1.0,)))
    t.speed_label.setText("step 100/100 · loss 0.344")
    w.open_project(tmp_path / "other")
    assert t.banner.isHidden() and t.log.toPlainText() == "" and not t.plots.loss.x
    assert t.speed_label.text() == "" and t.stage_label.text() == "Not started"


def test_a_failed_start_leaves_no_stale_numbers(main_window, qtbot, monkeypatch):
    import core.trainer

    def broken_run(self, recall=True):
        raise RuntimeError("broken on purpose")
        yield  # pragma: no cover - makes this a generator

    configure_tiny(main_window)
    t = main_window.training_tab
    t.speed_label.setText("step 100/100 · loss 0.344")  # what a finished run left
    monkeypatch.setattr(core.trainer.Trainer, "run", broken_run)
    assert t.start()
    wait_idle(qtbot, t, timeout=60_000)
    assert "broken on purpose" in t.banner_text.text()
    assert t.speed_label.text() == "" and t.progress.value() == 0


def test_memory_estimate_above_the_device_memory_is_flagged(main_window):
    h = main_window.hyper_tab
    info = main_window.device_info()
    main_window.device_tab.device_changed.emit(dataclasses.replace(info, global_mem_bytes=2**20, name="Small GPU"))
    assert not h.memory_label.isHidden() and "Small GPU" in h.memory_label.text()
    main_window.device_tab.device_changed.emit(dataclasses.replace(info, global_mem_bytes=2**40))
    assert h.memory_label.isHidden()


def test_the_recall_check_is_shown_and_passes_next_to_steps(main_window, qtbot):
    """Each batch of a recall check updates the stage label ("checking recall…"), so the bar never sits
    silent through a check; steps are shown with passes; after the run no ETA is left standing."""
    w, t = main_window, main_window.training_tab
    configure_tiny(w, pretrain=4, dialogues=2, batch=2)
    labels, speeds = [], []
    assert t.start()
    t._worker.recall_progress.connect(lambda c: labels.append(t.stage_label.text()))
    t._worker.step.connect(lambda d: speeds.append(d.passes))
    wait_idle(qtbot, t)
    assert any("checking recall…" in s and "prompts" in s for s in labels), labels
    assert speeds and speeds[-1] > 0
    assert "passes" in t.speed_label.text() and "ETA" not in t.speed_label.text()


def test_the_before_after_comparison_fills_the_table(main_window):
    """CompareWorker's result (gui.events.Comparison) becomes one row per question; a general question
    has no taught answer."""
    t = main_window.training_tab
    t._on_compare(Comparison((ComparedAnswer("dataset", "Where is Brindlewick?", "In the north.", "Paris", "North"),
                              ComparedAnswer("general", "What is 2 + 2?", None, "4", "4"))))
    assert not t.compare.isHidden() and t.compare.rowCount() == 2
    assert [t.compare.item(0, c).text() for c in range(4)] == ["Where is Brindlewick?", "In the north.", "Paris",
                                                               "North"]
    assert t.compare.item(1, 1).text() == "(general question)"


def test_a_buffer_over_the_device_limit_is_flagged_though_the_memory_would_do(main_window):
    """The Hyperparameters tab applies the Model's one memory rule (core.model.memory_problem): a device
    with memory to spare but a per-buffer limit below the largest buffer is flagged, as Model refuses it."""
    h = main_window.hyper_tab
    info = main_window.device_info()
    main_window.device_tab.device_changed.emit(dataclasses.replace(info, global_mem_bytes=2**40, max_alloc_bytes=2**16,
                                                                   name="Small GPU"))
    assert not h.memory_label.isHidden() and "per buffer" in h.memory_label.text()
    main_window.device_tab.device_changed.emit(dataclasses.replace(info, global_mem_bytes=2**40, max_alloc_bytes=2**40))
    assert h.memory_label.isHidden()


def test_a_run_that_ends_early_because_it_learned_shows_a_full_bar_and_says_why(main_window):
    """Issue 24: "Learned: 16 of 16 answers …" stood beside a bar at 92 % ("step 300/325"): tuning had
    ended at its step 100 of 125 because it had learned. A stage that ends early is complete."""
    from gui.events import RunDone, RunStarted, StageDone

    t = main_window.training_tab
    t._active = True  # as _launch leaves it; the events below are what its TrainWorker sends
    t._new_run()
    t._on_started(RunStarted("PoCL", 1000, 300, (200, 125), 0, 0, False))

    def step(stage, n, total, global_step):
        t._on_step(TrainingStep(stage, n, total, global_step, 1.0, 1.0, (1.0,), 1e-3))
        t._update_labels()

    step("pretrain", 200, 200, 200)
    t._on_stage_done(StageDone("pretrain", 200, False, (), end_reason="steps"))
    assert t.progress.value() == 200 and "stopped early" not in t.log.toPlainText()
    step(Stage.DIALOGUES, 100, 125, 300)
    t._on_stage_done(StageDone(Stage.DIALOGUES, 100, False, (), end_reason="learned"))
    assert t.progress.value() == t.progress.maximum() == 325
    t._on_run_done(RunDone(False, True, "ckpt", 2, 0, True, True, "Learned: 16 of 16 answers, 16 of 16 facts"))
    t._on_finished()
    assert t.progress.value() == t.progress.maximum() == 325  # the last step (300) does not pull it back
    assert t.stage_label.text().startswith("Learned: 16 of 16 answers")
    assert "tuning stopped early: learned at step 100 of 125" in t.stage_label.text()
    assert "step 300/325 (stopped early: learned)" in t.speed_label.text()
    assert "dialogues stopped early: learned at step 100 of 125" in t.log.toPlainText()
    assert t.saved_history()["runs"][-1]["status"] == t.stage_label.text()


def test_the_verdict_stays_when_the_label_timer_fires_before_the_thread_ends(main_window):
    """CI on 5264953: the end-to-end verdict read "Stage 2: tuning on dialogues — step 175/225 …": the 200 ms
    label timer fired after run_done (the verdict) and before the worker's thread ended, and redrew the step.
    The same holds for a failed run's "Failed"."""
    from gui.events import RunDone, RunStarted

    t = main_window.training_tab
    for end in ("verdict", "failed"):
        t._active = True  # as _launch leaves it; the events below are what its TrainWorker sends
        t._new_run()
        t.status.begin(False, 0.0)
        t._on_started(RunStarted("PoCL", 1000, 300, (200, 125), 0, 0, False))
        t._on_step(TrainingStep(Stage.DIALOGUES, 100, 125, 300, 1.0, 1.0, (1.0,), 1e-3))
        t._update_labels()
        assert "step 100/125" in t.stage_label.text()
        if end == "verdict":
            t._on_run_done(RunDone(False, True, "ckpt", 2, 0, True, True, "Learned: 16 of 16 answers, 16 of 16 facts"))
        else:
            t._on_failed("device", "CL_OUT_OF_RESOURCES")
        expected = t.stage_label.text()
        t._update_labels()  # the timer, still running: the thread has not ended yet
        assert t.stage_label.text() == expected, end
        t._on_finished()
        assert t.stage_label.text() == expected, end
        assert "step 300/325" in t.speed_label.text()  # the numbers line still shows where it ended


def test_a_stage_that_learns_early_in_a_real_run_fills_the_bar(main_window, qtbot, monkeypatch):
    """The same through the TrainWorker: every recall check counts as learned (the target is 0 items),
    so each stage ends at its first check, step 2 of 6 and of 4."""
    from core.trainer import Trainer

    monkeypatch.setattr(Trainer, "_wanted", lambda self, kind, n: 0)
    w, t = main_window, main_window.training_tab
    configure_tiny(w, pretrain=6, dialogues=4, batch=2)
    w.hyper_tab.widgets["check_every"].setValue(2)
    assert w.hyper_tab.is_valid(), w.hyper_tab.error_label.text()
    assert t.start(), t.banner_text.text()
    wait_idle(qtbot, t)
    assert t.progress.value() == t.progress.maximum() == 10
    assert "tuning stopped early: learned at step 2 of 4" in t.stage_label.text(), t.stage_label.text()
    assert "pretraining stopped early: learned at step 2 of 6" in t.stage_label.text()


def test_the_training_tab_shows_the_plans_time_with_the_first_runs_costs(main_window, qtbot, monkeypatch):
    """Issue 24 item 1: the Training tab showed the same too short first-run estimate as the plan. The Auto
    plan's time (Plan.run_s) and its one-time part (Plan.first_run_s, set here; the run itself is a small
    one) go through the TrainWorker's RunStarted to the tab's label, log and ETA."""
    from core.estimates import DatasetStats
    from core.plan import format_duration, make_plan

    w, t = main_window, main_window.training_tab
    configure_tiny(w, pretrain=2, dialogues=2, batch=2)
    plan = dataclasses.replace(make_plan(DatasetStats(600, 470, 400, 25, 13, 51, []), 1e-5), first_run_s=110.0)
    monkeypatch.setattr(w.state, "plan", lambda: plan)
    labels = []  # the stage label after each phase before the first step, and at the start
    for slot in ("_on_phase", "_on_started"):
        monkeypatch.setattr(t, slot, lambda arg, shown=getattr(t, slot): (shown(arg),
                                                                           labels.append(t.stage_label.text())))
    assert t.start(), t.banner_text.text()
    wait_idle(qtbot, t)
    assert t.banner.isHidden(), t.banner_text.text()
    said = f"estimated {format_duration(plan.run_s)} (first run on this device: +1:50 for tuning and compiling)"
    assert f"this run: {said}" in t.log.toPlainText()
    assert labels == ["Preparing: training the tokenizer and building the model (first run on this device: about 1:50 "
                      "for tuning and compiling)…", f"Training on {w.state.device_info().label} — {said}"]
    assert f"(estimated {format_duration(plan.run_s)} in all)" in t.speed_label.text()
