"""Hyperparameters tab: presets, validation naming the bad field, size estimates."""
from __future__ import annotations

import pytest

from core.config import PRESETS, ModelConfig
from gui.hyper_tab import BAD_STYLE


def shown_text(tab) -> str:
    """The plan as the Hyperparameters tab shows it (its rich text as plain text)."""
    from PySide6.QtGui import QTextDocument

    doc = QTextDocument()
    doc.setHtml(tab.plan_label.text())
    return doc.toPlainText()


@pytest.fixture
def tab(main_window):
    main_window.tabs.setCurrentWidget(main_window.hyper_tab)
    return main_window.hyper_tab


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_build_the_preset_configs(tab, name):
    tab.set_preset(name)
    mc, tc = tab.build()
    want_mc, want_tc = PRESETS[name]
    assert mc == ModelConfig(**{**want_mc.to_dict(), "vocab_size": want_tc.vocab_size})
    assert tc == want_tc
    assert tab.is_valid()
    shown = shown_text(tab)
    assert f"the {name} preset, at most {mc.n_params():,} parameters" in shown
    assert f"{tc.pretrain.steps} steps of pretraining" in shown and f"{tc.dialogues.steps} steps of tuning" in shown


def test_editing_a_value_switches_to_custom(tab):
    tab.set_preset("Tiny")
    tab.widgets["pretrain.steps"].setValue(7)
    assert tab.preset.currentText() == "Custom"
    assert tab.build()[1].pretrain.steps == 7


@pytest.mark.parametrize("key, value, field", [
    ("n_heads", 3, "n_heads"),            # 64 / 3 is not an integer
    ("n_kv_heads", 3, "n_kv_heads"),      # does not divide 4 heads
    ("pretrain.batch_size", 0, "pretrain.batch_size"),
    ("dialogues.lr", "abc", "dialogues.lr"),
    ("pretrain.lr", "-1", "pretrain.lr"),
    ("replay_share", "1.5", "replay_share"),
    ("vocab_size", 100, "vocab_size"),
])
def test_invalid_value_names_and_highlights_the_field(main_window, tab, key, value, field):
    tab.set_preset("Tiny")
    w = tab.widgets[key]
    if isinstance(value, int):
        w.setValue(value)
    else:
        w.setText(value)
    assert not tab.is_valid()
    assert tab.error_field() == field
    assert tab.widgets[field].styleSheet() == BAD_STYLE
    assert field in tab.error_label.text()
    assert not main_window.training_tab.start_button.isEnabled()
    tab.set_preset("Tiny")
    assert tab.is_valid() and tab.error_field() is None
    assert tab.widgets[field].styleSheet() == ""
    assert main_window.training_tab.start_button.isEnabled()


def test_state_round_trip(tab):
    tab.set_preset("Small")
    tab.widgets["seed"].setValue(42)
    state = tab.state()
    tab.set_preset("Tiny")
    tab.set_state(state)
    assert tab.build()[1].seed == 42 and tab.build()[0].d_model == PRESETS["Small"][0].d_model


def test_auto_is_the_default_and_shows_a_plan_with_passes_and_time(tab, main_window, qtbot, wait_plan):
    """Auto (the app's default, as in the CLI) plans from the dataset and the device's measured speed:
    the plan names the model, the passes and the estimated time, and fills the form with it; a time
    budget plans again (still Auto) and fewer steps fit."""
    from core.device import list_devices
    from core.plan import AUTO

    assert tab.preset.currentText() == AUTO
    main_window.state.set_device(list_devices()[0])
    tab.apply_plan()
    wait_plan(tab)
    text = shown_text(tab)
    assert "Model: the Tiny preset" in text and "of pretraining on the facts" in text and "Time: about" in text
    _, tc = tab.build()
    assert tc.check_every > 0 and tc.pretrain.steps == tab.plan.train_config.pretrain.steps
    assert tab.preset.currentText() == AUTO
    full = tab.plan.planned_steps[0]
    tab.widgets["time_budget_s"].setText(f"{tab.plan.total_s / 4:.3f}")
    qtbot.waitUntil(lambda: tab.plan.planned_steps[0] < full, timeout=10_000)
    assert tab.preset.currentText() == AUTO and "time budget" in shown_text(tab)


def test_every_invalid_field_is_shown_at_once(main_window, tab):
    """Not one error at a time: three bad fields are all highlighted and listed; a check that reads a
    field replaced meanwhile (n_kv_heads vs n_heads) is not reported with the default's number."""
    from core.config import ConfigError, config_errors

    tab.set_preset("Tiny")
    tab.widgets["n_heads"].setValue(3)  # 64 / 3
    tab.widgets["pretrain.batch_size"].setValue(0)
    tab.widgets["dialogues.lr"].setText("abc")
    tab.widgets["replay_share"].setText("1.5")
    assert not tab.is_valid()
    assert set(tab.error_fields()) == {"n_heads", "pretrain.batch_size", "dialogues.lr", "replay_share"}
    for f in tab.error_fields():
        assert tab.widgets[f].styleSheet() == BAD_STYLE and f"({f})" in tab.error_label.text()
    assert tab.error_label.text().startswith("4 invalid settings:")
    assert all(f in main_window.state.config_error() for f in tab.error_fields())
    tab.widgets["pretrain.batch_size"].setValue(4)
    assert "pretrain.batch_size" not in tab.error_fields() and tab.widgets["pretrain.batch_size"].styleSheet() == ""

    def build(v):
        if v["n_heads"] < 1:
            raise ConfigError("n_heads", "must be >= 1")
        if v["n_heads"] % v["n_kv_heads"]:
            raise ConfigError("n_kv_heads", f"must divide n_heads ({v['n_heads']})")
        if v["seed"] < 0:
            raise ConfigError("seed", "must be >= 0")

    defaults = {"n_heads": 4, "n_kv_heads": 4, "seed": 0}
    errs = config_errors(build, {"n_heads": 0, "n_kv_heads": 3, "seed": -1}, defaults)
    assert [e.field for e in errs] == ["n_heads", "seed"]  # not "must divide n_heads (4)": 4 is not the form's
    errs = config_errors(build, {"n_heads": 8, "n_kv_heads": 3, "seed": -1}, defaults)
    assert [str(e) for e in errs] == ["n_kv_heads: must divide n_heads (8)", "seed: must be >= 0"]
    assert config_errors(build, defaults, defaults) == []


def _numbers(pattern: str, text: str) -> list[str]:
    import re

    return re.findall(pattern, text)


def test_every_number_shown_is_the_plans(tab, main_window, wait_plan):
    """Issue 24: "Parameters: 237,888" stood above "Plan: Tiny model (187,456 parameters)" and "Steps: 100
    pretraining + 225 tuning" above "tune 150 steps". Now each number the tab shows is read back from its
    text and compared with the one core.plan.Plan it shows: parameters, vocabulary, memory, file sizes,
    planned and most steps, passes, exposures, times, checks."""
    from core.device import list_devices
    from core.estimates import gguf_size_bytes, training_memory_bytes
    from core.plan import AUTO, format_duration
    from core.wording import memory_size

    main_window.state.set_device(list_devices()[0])
    tab.set_preset(AUTO)
    p = wait_plan(tab)
    assert p is not None and tab.is_valid(), tab.error_message()
    mc, tc = p.model_config, p.train_config
    text = shown_text(tab)
    assert _numbers(r"([\d,]+) parameters", text) == [f"{mc.n_params():,}"]
    assert _numbers(r"vocabulary of ([\d,]+) tokens", text) == [f"{mc.vocab_size:,}"]
    batch = max(tc.pretrain.batch_size, tc.dialogues.batch_size)
    assert _numbers(r"about ([\d.]+ [MG]iB) of device memory", text) == [
        memory_size(training_memory_bytes(mc, batch, tc.grad_accum, tc.freeze_embeddings))]
    assert _numbers(r"([\d.]+) MB \((F32|F16|Q8_0)\)", text) == [
        (f"{gguf_size_bytes(mc, d) / 1e6:.2f}", d.upper()) for d in ("f32", "f16", "q8_0")]
    assert _numbers(r"(\d+) steps of pretraining", text) == [str(p.planned_steps[0])]
    assert _numbers(r"(\d+) steps of tuning", text) == [str(p.planned_steps[1])]
    assert _numbers(r"to at most ([\d,]+) \+ ([\d,]+) steps", text) == [(f"{tc.pretrain.steps:,}", f"{tc.dialogues.steps:,}")]
    assert _numbers(r"facts \((\d+) passes", text) == [f"{p.pretrain_passes:.0f}"]
    assert _numbers(r"dialogues \((\d+) passes", text) == [f"{p.tune_passes:.0f}"]
    assert _numbers(r"each fact seen (\d+) times", text) == [f"{p.fact_exposures:.0f}"]
    assert _numbers(r"Time: about (\d+:\d\d)", text) == [format_duration(p.run_s)]
    assert _numbers(r"at most (\d+:\d\d) for the planned steps \(checks (\d+:\d\d)\)", text) == [
        (format_duration(p.most_s), format_duration(p.check_s))]
    assert _numbers(r"ends after (\d+:\d\d) at the latest", text) == [format_duration(tc.time_budget_s)]
    assert _numbers(r"every (\d+) steps", text) == [str(tc.check_every)]
    # the form's fields are the plan's too (the vocabulary field is the target the tokenizer may reach)
    v = tab.values()
    assert (v["pretrain.steps"], v["dialogues.steps"]) == (tc.pretrain.steps, tc.dialogues.steps)
    assert (v["pretrain.decay_steps"], v["dialogues.decay_steps"]) == p.planned_steps
    assert (v["d_model"], v["n_layers"], v["check_every"]) == (mc.d_model, mc.n_layers, tc.check_every)


def test_the_first_run_on_this_device_is_in_the_plans_time(tab, main_window, qtbot, wait_plan):
    """Issue 24 item 1: the first run's estimate was eight times too short (tuning and compiling were not in
    it). The plan's one-time cost (core.plan.Plan.first_run_s, set here) is in the Time line and its total,
    and the Auto plan goes to the Training tab (AppState.plan) only while the form shows it."""
    import dataclasses

    from core.device import list_devices
    from core.plan import AUTO, format_duration

    main_window.state.set_device(list_devices()[0])
    tab.set_preset(AUTO)
    tab.plan = dataclasses.replace(wait_plan(tab), first_run_s=110.0)
    assert tab.validate()
    text = shown_text(tab)
    assert _numbers(r"Time: about (\d+:\d\d) \(first run on this device: \+(\d+:\d\d) for tuning and compiling\)",
                    text) == [(format_duration(tab.plan.expected_s + 110.0), "1:50")]
    assert main_window.state.plan() is tab.plan
    main_window.state.set_training(True)
    main_window.state.set_training(False)  # a run paid those costs: Auto plans again
    qtbot.waitUntil(lambda: tab.plan.first_run_s != 110.0, timeout=60_000)
    tab.plan = dataclasses.replace(tab.plan, first_run_s=0.0)  # all cached: nothing to say
    assert tab.validate() and "first run" not in shown_text(tab)
    tab.set_preset("Tiny")
    assert main_window.state.plan() is None


def _page_fits(main_window, tab) -> None:
    """Nothing of the tab is cut off: every word-wrapped label has the height its text needs, and the
    page fits in its scroll area's viewport (no scrolling needed)."""
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QLabel

    area = main_window.tabs.currentWidget()
    viewport = area.viewport()
    assert area.verticalScrollBar().maximum() == 0, "the page needs scrolling at the default size"
    for label in tab.findChildren(QLabel):
        if not label.isVisible() or not label.text():
            continue
        if label.wordWrap():
            assert label.height() >= label.heightForWidth(label.width()), label.text()[:60]
        bottom = label.mapTo(viewport, QPoint(0, label.height())).y()
        assert bottom <= viewport.height(), f"{label.text()[:60]!r} ends below the window"


def test_advanced_is_folded_and_everything_fits_at_the_default_size(tab, main_window, qtbot, wait_plan):
    """With Auto, the plan comes first and the expert fields are folded under Advanced (collapsed by
    default); at the window's default size nothing is cut off, folded or not (open, the tab scrolls
    rather than squeeze the fields)."""
    from core.device import list_devices
    from core.plan import AUTO

    w = main_window
    w.show()
    qtbot.waitExposed(w)
    assert (w.width(), w.height()) == (1200, 860)  # the default size
    w.state.set_device(list_devices()[0])
    tab.set_preset(AUTO)
    wait_plan(tab)
    qtbot.wait(50)
    assert not tab.advanced.isExpanded() and tab.advanced.content().height() == 0
    assert tab.widgets["adam_eps"].visibleRegion().isEmpty() and not tab.plan_label.visibleRegion().isEmpty()
    _page_fits(w, tab)
    tab.advanced.expand(animate=False)
    qtbot.waitUntil(lambda: tab.advanced.content().height() > 0)
    qtbot.wait(50)
    for key, field in tab.widgets.items():  # open: every field at least its minimum height, not squeezed
        assert field.height() >= field.minimumSizeHint().height(), key
    tab.advanced.collapse(animate=False)
    qtbot.wait(50)
    _page_fits(w, tab)


def test_a_project_saved_with_the_old_stage_keys_fills_the_dialogue_stage(tab):
    """A project an earlier version saved names the dialogue stage's fields "tune.*" (core.stages.OLD_VALUES)."""
    tab.set_preset("Tiny")
    old = {(f"tune.{k.split('.', 1)[1]}" if k.startswith("dialogues.") else k): v for k, v in tab.values().items()}
    assert "tune.steps" in old and not any(k.startswith("dialogues.") for k in old)
    old["tune.steps"] = 17
    tab.set_state({"preset": "Custom", "values": old})
    assert tab.build()[1].dialogues.steps == 17 and tab.is_valid()


def test_auto_plans_in_a_worker_and_shows_only_the_current_datasets_plan(tab, main_window, qtbot, wait_plan):
    """The Auto plan (a tokenizer trained, every entry counted, a speed measurement: about 7 s with 20,000
    facts on a 2-core CPU) is made in a worker thread, so the window never waits for it; training waits,
    saying why; a dataset edited while it is made is planned again, and the plan applied is the edited
    dataset's (the same as core.plan.plan_for's for it), never the older one's."""
    from core.dataset import Dataset, Dialogue
    from core.device import list_devices, open_device
    from core.plan import AUTO, plan_for
    from tests.make_datasets import make_dataset

    g = make_dataset("people", items=30, dialogues=10)
    state = main_window.state
    state.set_device(list_devices()[0])
    tab.set_preset("Tiny")
    main_window.dataset_tab.set_dataset(Dataset(list(g.facts[:12]), [Dialogue([qa]) for qa in g.dialogues]))
    tab.set_preset(AUTO)
    assert tab.planning() and tab.plan is None
    assert "Auto is still planning" in state.train_blocker()
    assert not main_window.training_tab.start_button.isEnabled()
    assert "Auto is planning the run" in shown_text(tab)
    state.dataset().facts.extend(g.facts[12:])  # an edit while the plan of 12 facts is being made
    state.mark_dataset_edited()
    plan = wait_plan(tab)
    assert plan is not None, tab._no_plan
    assert state.train_blocker() is None and "planning" not in shown_text(tab)
    again, _ = plan_for(state.dataset_copy(), open_device(list_devices()[0]))
    assert (plan.planned_steps, plan.pretrain_passes, plan.fact_exposures) == \
        (again.planned_steps, again.pretrain_passes, again.fact_exposures)
    assert tab.build()[1].pretrain.steps == plan.train_config.pretrain.steps and state.plan() is plan


def test_no_plan_starts_after_the_window_closes(tab, main_window, qtbot):
    """A plan that ends as the window closes, made for a dataset edited since, asks for another plan from its
    queued signals; after HyperTab.stop() none starts (CI once saw "the test left QThreads running:
    CallWorker" after a Dataset tab test)."""
    from core.device import list_devices
    from core.plan import AUTO

    main_window.state.set_device(list_devices()[0])
    tab.set_preset(AUTO)
    assert tab.planning()
    main_window.state.mark_dataset_edited()  # the plan being made is now of an older version
    worker = tab.plan_worker
    worker.wait()  # its thread has ended; its done and finished signals wait in the queue
    tab.stop()
    qtbot.wait(100)  # they are handled now
    assert tab.plan_worker is worker and not tab.planning()


def test_training_waits_from_the_edit_not_from_the_replan(tab, main_window, qtbot, wait_plan):
    """Auto plans again 400 ms after the last edit (a burst of edits plans once); the old dataset's plan must
    not train meanwhile: Start and Resume are off, and a start asked for in code is refused, from the moment
    of the edit (a new user's import and click within 400 ms trained the Small fallback before)."""
    from core.dataset import Dataset
    from core.device import list_devices
    from core.plan import AUTO
    from gui.run_setup import NotStarted, prepare_launch

    state, training = main_window.state, main_window.training_tab
    state.set_device(list_devices()[0])
    tab.set_preset(AUTO)
    main_window.dataset_tab.set_dataset(Dataset([f"Fact {i}: the heron of pier {i} is grey." for i in range(8)], []))
    old = wait_plan(tab)
    assert old is not None and training.start_button.isEnabled()
    main_window.dataset_tab.set_dataset(Dataset([f"Fact {i}: the lamp of street {i} is blue." for i in range(20)],
                                                []))  # an import: the replan is 400 ms away
    assert tab._replan_timer.isActive() and tab.planning()
    assert not training.start_button.isEnabled() and "Auto is still planning" in state.train_blocker()
    with pytest.raises(NotStarted, match="still planning"):
        prepare_launch(state, main_window, resume=False)
    new = wait_plan(tab)
    assert new is not None and new is not old and state.plan() is new
    assert training.start_button.isEnabled() and state.train_blocker() is None
