"""Hyperparameters tab: presets, validation naming the bad field, size estimates."""
from __future__ import annotations

import pytest

from core.config import PRESETS, ModelConfig
from gui.hyper_tab import BAD_STYLE


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
    assert f"{mc.n_params():,}" in tab.info_label.text()


def test_editing_a_value_switches_to_custom(tab):
    tab.set_preset("Tiny")
    tab.widgets["pretrain.steps"].setValue(7)
    assert tab.preset.currentText() == "Custom"
    assert tab.build()[1].pretrain.steps == 7


@pytest.mark.parametrize("key, value, field", [
    ("n_heads", 3, "n_heads"),            # 64 / 3 is not an integer
    ("n_kv_heads", 3, "n_kv_heads"),      # does not divide 4 heads
    ("pretrain.batch_size", 0, "pretrain.batch_size"),
    ("tune.lr", "abc", "tune.lr"),
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


def test_auto_is_the_default_and_shows_a_plan_with_passes_and_time(tab, main_window, qtbot):
    """Auto (the app's default, as in the CLI) plans from the dataset and the device's measured speed:
    the plan names the model, the passes and the estimated time, and fills the form with it; a time
    budget plans again (still Auto) and fewer steps fit."""
    from core.device import list_devices
    from core.plan import AUTO

    assert tab.preset.currentText() == AUTO
    main_window.state.set_device(list_devices()[0])
    tab.apply_plan()
    text = tab.plan_label.text()
    assert "Plan: Tiny model" in text and "passes over the facts" in text and "estimated" in text
    _, tc = tab.build()
    assert tc.check_every > 0 and tc.pretrain.steps == tab.plan.train_config.pretrain.steps
    assert "passes over the facts" in tab.info_label.text() and tab.preset.currentText() == AUTO
    full = tab.plan.planned_steps[0]
    tab.widgets["time_budget_s"].setText(f"{tab.plan.total_s / 4:.3f}")
    qtbot.waitUntil(lambda: tab.plan.planned_steps[0] < full, timeout=10_000)
    assert tab.preset.currentText() == AUTO and "time budget" in tab.plan_label.text()


def test_every_invalid_field_is_shown_at_once(main_window, tab):
    """Not one error at a time: three bad fields are all highlighted and listed; a check that reads a
    field replaced meanwhile (n_kv_heads vs n_heads) is not reported with the default's number."""
    from core.config import ConfigError, config_errors

    tab.set_preset("Tiny")
    tab.widgets["n_heads"].setValue(3)  # 64 / 3
    tab.widgets["pretrain.batch_size"].setValue(0)
    tab.widgets["tune.lr"].setText("abc")
    tab.widgets["replay_share"].setText("1.5")
    assert not tab.is_valid()
    assert set(tab.error_fields()) == {"n_heads", "pretrain.batch_size", "tune.lr", "replay_share"}
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
