"""The app's "Start from: existing GGUF file": the Hyperparameters tab reads the file's header (locked
architecture, fine-tuning defaults, refusals naming the key) and a run fine-tunes it on PoCL."""
from __future__ import annotations

import pytest

from core.from_base import DEFAULTS, LORA_LR
from gui.hyper_tab import BAD_STYLE, EXISTING, NEW_MODEL
from gui.lora_choice import FULL
from tests.artifacts import vocab_dir
from tests.test_finetune import write_tiny_smol
from tests.test_gui_e2e import configure_tiny, wait_idle


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return write_tiny_smol(tmp_path_factory.mktemp("base") / "tiny-smol.gguf")


def test_start_from_a_gguf_file_locks_the_architecture(main_window, tiny_base):
    h = main_window.hyper_tab
    h.set_base(str(tiny_base))
    assert h.start_from.currentText() == EXISTING and h.base_path() == str(tiny_base)
    assert h.is_valid(), h.error_label.text()
    mc, tc = h.build()
    assert mc.tie_embeddings and (mc.d_model, mc.n_layers, mc.vocab_size) == (64, 2, 49152)
    # LoRA is the default (core.from_base.LORA_LR, as train --base --lora); a full fine-tune has core.from_base's lr
    assert mc.context_length == DEFAULTS["context_length"] and tc.pretrain.lr == LORA_LR
    h.lora_choice.method.setCurrentText(FULL)
    assert h.build()[1].pretrain.lr == DEFAULTS["lr"] and main_window.state.lora() is None
    assert not h.widgets["d_model"].isEnabled() and h.widgets["context_length"].isEnabled()
    h.freeze.setChecked(True)
    h.widgets["grad_accum"].setValue(2)
    mc, tc = h.build()
    assert tc.freeze_embeddings and tc.grad_accum == 2
    state = h.state()
    h.set_base(None)
    assert h.start_from.currentText() == NEW_MODEL and h.base_path() is None and h.widgets["d_model"].isEnabled()
    h.set_state(state)
    assert h.base_path() == str(tiny_base) and h.build()[1].freeze_embeddings and not h.lora_choice.is_lora()


def test_a_file_the_engine_cannot_use_is_explained(main_window):
    h = main_window.hyper_tab
    h.set_base(str(vocab_dir() / "ggml-vocab-bert-bge.gguf"))
    assert not h.is_valid()
    assert "architecture 'bert' is not supported" in h.error_message()
    assert h.base_edit.styleSheet() == BAD_STYLE
    assert "Fix the hyperparameters first" in main_window.state.train_blocker()


def test_a_run_fine_tunes_the_base_model(main_window, qtbot, tiny_base):
    from core.checkpoint import load_checkpoint
    from core.gguf_tokenizer import GGUFTokenizer

    w, t = main_window, main_window.training_tab
    configure_tiny(w, pretrain=2, dialogues=2, batch=2)
    w.hyper_tab.set_base(str(tiny_base))
    h = w.hyper_tab
    h.lora_choice.method.setCurrentText(FULL)  # every parameter (LoRA runs: tests/test_gui_lora.py)
    for stage in ("pretrain", "dialogues"):
        h.widgets[f"{stage}.steps"].setValue(2)
        h.widgets[f"{stage}.batch_size"].setValue(2)
    h.widgets["context_length"].setValue(64)
    assert h.is_valid(), h.error_label.text()
    assert t.start(), t.banner_text.text()
    wait_idle(qtbot, t, timeout=120_000)
    ck = load_checkpoint(w.project.checkpoint_dir)
    assert isinstance(ck.tokenizer, GGUFTokenizer) and ck.config.tie_embeddings and ck.checkpoint.stage_index == 2
    assert ck.lora is None and ck.meta["base_model"] == str(tiny_base.resolve())
    assert ck.meta["base_model"] == str(tiny_base.resolve())

    # before / after: the base model's and the tuned model's answers side by side
    assert not t.compare_button.isHidden() and t.compare_with_base()
    qtbot.waitUntil(lambda: not t.comparing(), timeout=120_000)
    assert not t.compare.isHidden() and t.compare.rowCount() >= 3  # the default dataset's questions + general ones
    assert t.compare.item(0, 2).text() is not None and t.compare.horizontalHeaderItem(3).text() == "Tuned model"


def test_a_fine_tune_is_estimated_before_its_first_step(main_window, qtbot, tiny_base, monkeypatch):
    """Issue 24 item 6: the Training tab said nothing of a fine-tune's time or memory until its steps were
    timed. Now the TrainWorker estimates both before the first step with what ``train --base`` prints
    (core.from_base.estimate_time and estimate_resident, spied on here, not replaced) and the tab shows them."""
    import core.from_base as from_base
    from core.plan import format_duration
    from core.wording import memory_size
    from gui.training_tab import estimate_text

    seen = {}

    def spy(name):
        real = getattr(from_base, name)

        def called(*args, **kwargs):
            seen[name] = real(*args, **kwargs)
            return seen[name]
        monkeypatch.setattr(from_base, name, called)

    spy("estimate_time")
    spy("estimate_resident")
    w, t = main_window, main_window.training_tab
    started, phases = [], []
    shown, phase = t._on_started, t._on_phase
    monkeypatch.setattr(t, "_on_started", lambda info: (started.append(info), shown(info)))
    monkeypatch.setattr(t, "_on_phase", lambda what: (phase(what), phases.append(t.stage_label.text())))
    configure_tiny(w, pretrain=2, dialogues=2, batch=2)
    h = w.hyper_tab
    h.set_base(str(tiny_base))
    for stage in ("pretrain", "dialogues"):
        h.widgets[f"{stage}.steps"].setValue(2)
        h.widgets[f"{stage}.batch_size"].setValue(2)
    h.widgets["context_length"].setValue(64)
    assert h.is_valid(), h.error_label.text()
    assert w.state.plan() is None  # a fine-tune follows no Auto plan
    assert t.start(), t.banner_text.text()
    wait_idle(qtbot, t, timeout=120_000)
    assert t.banner.isHidden(), t.banner_text.text()
    est, mem = seen["estimate_time"], seen["estimate_resident"]
    assert est.steps == (2, 2) and est.total_s > 0 and mem.device_on_host and mem.longest <= 64
    [info] = started
    assert info.estimated_s == est.total_s and info.first_run_s == 0.0  # its one-time costs are paid by then
    assert info.peak_resident_bytes == mem.peak_bytes > mem.save_bytes
    text = estimate_text(info)
    assert text == (f"estimated {format_duration(est.total_s)}, resident memory at most "
                    f"{memory_size(mem.peak_bytes)}")
    assert f"this run: {text}" in t.log.toPlainText() and f"plan: {est.summary()}" in t.log.toPlainText()
    assert f"(estimated {format_duration(est.total_s)} in all)" in t.speed_label.text()
    assert phases == [f"Preparing: reading {tiny_base}…",
                      "Preparing: asking the base model 10 general questions (its answers are replayed and checked, "
                      "so it keeps what it knew)…",
                      "Preparing: estimating the fine-tune: timing a few passes of the base model…"]


def test_the_plan_and_schedule_follow_a_chosen_base(main_window, tiny_base, dialogs, monkeypatch, wait_plan):
    """Issue 24: with SmolLM2 chosen the Plan line still said "Tiny model (187,456 parameters)…
    estimated 0:41", "Decay ends at step" stayed at 100/150 for 60 steps and the confirmation said the
    run "trains one from scratch". Now the plan describes the fine-tune of the file (its parameters and
    vocabulary, core.from_base's steps), the decay ends at each stage's last step, the model presets are
    off, and Start asks about fine-tuning it; back to a new model, Auto plans again."""
    from core.device import list_devices
    from core.config import PRESETS
    from core.plan import AUTO
    from tests.test_gui_hyper import shown_text

    w, h = main_window, main_window.hyper_tab
    w.state.set_device(list_devices()[0])
    h.set_preset(AUTO)
    auto = wait_plan(h)
    assert auto is not None and f"{auto.model_config.n_params():,} parameters" in shown_text(h)
    h.set_base(str(tiny_base))
    assert h.is_valid(), h.error_message()
    mc, tc = h.build()
    text = shown_text(h)
    assert f"{auto.model_config.n_params():,}" not in text and "Tiny" not in text and "about 0:" not in text
    assert f"fine-tunes tiny smol: {mc.n_params():,} parameters" in text
    assert f"vocabulary of {mc.vocab_size:,} tokens" in text and "Time: timed when the run starts" in text
    steps = DEFAULTS["steps"]
    assert f"{steps} steps of pretraining" in text and f"{steps} steps of tuning" in text
    for stage in ("pretrain", "dialogues"):
        field = h.widgets[f"{stage}.decay_steps"]
        assert field.value() == 0 and field.text() == "the last step"  # it follows the stage's steps
        assert getattr(tc, stage).steps == steps and getattr(tc, stage).decay_steps == 0
    assert tc.check_every == 0 and tc.heldout == 0 and tc.time_budget_s == 0  # core.from_base's, not Auto's
    model = h.preset.model()
    assert not any(model.item(h.preset.findText(n)).isEnabled() for n in PRESETS)

    t = w.training_tab
    monkeypatch.setattr(w.state, "trained_model_path", lambda: w.project.checkpoint_dir)
    dialogs.answer = False
    assert not t.start()
    title, question = dialogs.asked[-1]
    assert "fine-tunes tiny-smol.gguf" in question and "from scratch" not in question
    assert "Fine-tunes tiny-smol.gguf" in t.start_button.toolTip()

    h.set_base(None)
    assert h.preset.currentText() == AUTO and wait_plan(h) is not None
    assert f"the Tiny preset, {h.plan.model_config.n_params():,} parameters" in shown_text(h)
    assert all(model.item(h.preset.findText(n)).isEnabled() for n in PRESETS)
