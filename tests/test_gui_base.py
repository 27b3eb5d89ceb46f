"""The app's "Start from: existing GGUF file": the Hyperparameters tab reads the file's header (locked
architecture, fine-tuning defaults, refusals naming the key) and a run fine-tunes it on PoCL."""
from __future__ import annotations

import pytest

from core.finetune import DEFAULTS
from gui.hyper_tab import BAD_STYLE, EXISTING, NEW_MODEL
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
    assert mc.context_length == DEFAULTS["context_length"] and tc.pretrain.lr == DEFAULTS["lr"]
    assert not h.widgets["d_model"].isEnabled() and h.widgets["context_length"].isEnabled()
    h.freeze.setChecked(True)
    h.widgets["grad_accum"].setValue(2)
    mc, tc = h.build()
    assert tc.freeze_embeddings and tc.grad_accum == 2
    state = h.state()
    h.set_base(None)
    assert h.start_from.currentText() == NEW_MODEL and h.base_path() is None and h.widgets["d_model"].isEnabled()
    h.set_state(state)
    assert h.base_path() == str(tiny_base) and h.build()[1].freeze_embeddings


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
    configure_tiny(w, pretrain=2, tune=2, batch=2)
    w.hyper_tab.set_base(str(tiny_base))
    h = w.hyper_tab
    for stage in ("pretrain", "tune"):
        h.widgets[f"{stage}.steps"].setValue(2)
        h.widgets[f"{stage}.batch_size"].setValue(2)
    h.widgets["context_length"].setValue(64)
    assert h.is_valid(), h.error_label.text()
    assert t.start(), t.banner_text.text()
    wait_idle(qtbot, t, timeout=120_000)
    ck = load_checkpoint(w.project.checkpoint_dir)
    assert isinstance(ck.tokenizer, GGUFTokenizer) and ck.config.tie_embeddings and ck.checkpoint.stage_index == 2
    assert ck.meta["base_model"] == str(tiny_base.resolve())

    # before / after: the base model's and the tuned model's answers side by side
    assert not t.compare_button.isHidden() and t.compare_with_base()
    qtbot.waitUntil(lambda: not t.comparing(), timeout=120_000)
    assert not t.compare.isHidden() and t.compare.rowCount() >= 3  # the default dataset's questions + general ones
    assert t.compare.item(0, 2).text() is not None and t.compare.horizontalHeaderItem(3).text() == "Tuned model"
