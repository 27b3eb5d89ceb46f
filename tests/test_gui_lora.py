"""The app's LoRA fine-tune (issue 20, item 6): Hyperparameters ▸ Start from an existing GGUF file ▸ LoRA
(rank, alpha, layers; core.lora's defaults) or a full fine-tune, its memory before Start, a run on PoCL, the
before/after comparison, and the Export tab's merged model, adapter or both — the adapter loaded by
llama.cpp (llama-cpp-python's ``lora_path``) on the base file with our logits."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.lora import TARGETS, LoRAConfig
from gui.lora_choice import FULL, LORA
from tests.test_gui_e2e import configure_tiny, wait_idle
from tests.test_finetune import DATA
from tests.test_gui_hyper import shown_text
from tests.test_lora_cli import PROMPT, write_f32_smol


@pytest.fixture(scope="module")
def f32_base(tmp_path_factory):
    """A random tied llama (2 layers, d_model 64) with SmolLM2's tokenizer, every tensor F32."""
    return write_f32_smol(tmp_path_factory.mktemp("lora-base") / "tiny-smol-f32.gguf")


def test_lora_fields_only_with_a_base_and_core_defaults(main_window, f32_base):
    from core.estimates import training_memory_bytes
    from core.gguf_import import read_tensor_types
    from core.wording import memory_size

    h, state = main_window.hyper_tab, main_window.state
    lc = h.lora_choice
    assert lc.isHidden() and state.lora() is None  # a new model: no LoRA fields
    h.set_base(str(f32_base))
    assert h.is_valid(), h.error_message()
    assert not lc.isHidden() and lc.method.currentText() == LORA
    defaults = LoRAConfig()
    assert (lc.rank.value(), lc.alpha.value()) == (defaults.rank, defaults.alpha)
    assert [n for n, b in lc.targets.items() if b.isChecked()] == list(defaults.targets) == list(TARGETS)
    assert state.lora() == defaults == lc.config()

    # the plan's memory figure is the LoRA run's (core.estimates with the file's formats), beside the full one
    mc, tc = h.build()
    batch = max(tc.pretrain.batch_size, tc.dialogues.batch_size)
    lora_bytes = training_memory_bytes(mc, batch, tc.grad_accum, tc.freeze_embeddings, defaults,
                                       read_tensor_types(f32_base))
    full_bytes = training_memory_bytes(mc, batch, tc.grad_accum, tc.freeze_embeddings)
    assert lora_bytes < full_bytes
    text = shown_text(h)
    assert f"LoRA adapters of rank {defaults.rank} (alpha {defaults.alpha:g})" in text
    assert f"training needs about {memory_size(lora_bytes)} of device memory" in text
    assert f"a full fine-tune: {memory_size(full_bytes)}" in text

    # the last layer cannot be unchecked (LoRA needs one); full hides the LoRA fields and trains everything
    first, *rest = TARGETS
    for name in rest:
        lc.targets[name].setChecked(False)
    assert not lc.targets[first].isEnabled() and state.lora().targets == (first,)
    lc.rank.setValue(4)
    assert state.lora() == LoRAConfig(rank=4, alpha=defaults.alpha, targets=(first,))
    lc.method.setCurrentText(FULL)
    assert state.lora() is None and lc.rank.isHidden() and not lc.isHidden()
    assert f"training needs about {memory_size(full_bytes)} of device memory" in shown_text(h)
    saved = h.state()
    h.set_base(None)
    assert lc.isHidden() and state.lora() is None
    lc.method.setCurrentText(LORA)
    h.set_state(saved)  # a project's method and settings come back
    assert lc.method.currentText() == FULL and lc.rank.value() == 4 and state.lora() is None


def _ours(loaded, ids):
    """Our logits of a loaded LoRA checkpoint (its base and adapters on the device, as the trainer has them)."""
    from core.device import open_device
    from core.model import Model

    return Model(open_device(None), loaded.config, batch_size=1, weights=loaded.base_weights, lora=loaded.lora,
                 adapter=loaded.adapter, training=False).logits(np.array([ids]))[0]


def _llama_logits(path, ids, **kw):
    from tests.artifacts import open_llama

    llm = open_llama(path, n_ctx=64, **kw)
    try:
        llm.eval(ids)
        return np.array(llm.scores[:len(ids)])
    finally:
        llm.close()


def _train_lora(main_window, qtbot, f32_base, monkeypatch):
    """Start from the file with LoRA rank 4 (alpha 8) on every layer, 2 + 2 steps; returns the RunStarted,
    the run's core.from_base.estimate_resident and the same estimate of a full fine-tune."""
    import core.from_base as finetune
    from core.dataset import Dataset, Dialogue
    from core.estimates import peak_resident_bytes
    from core.model import memory_bytes
    from gui.run_setup import new_run_does

    w, h, t = main_window, main_window.hyper_tab, main_window.training_tab
    configure_tiny(w, pretrain=2, dialogues=2, batch=2)
    # two facts and two dialogues (tests/test_finetune.py's): the recall checks of 49,152 logits stay short
    w.state.set_dataset(Dataset(facts=list(DATA["facts"]), dialogues=[
        Dialogue(turns=[(t["user"], t["assistant"]) for t in d["turns"]]) for d in DATA["dialogues"]]))
    h.set_base(str(f32_base))
    h.lora_choice.rank.setValue(4)
    h.lora_choice.alpha.setValue(8.0)
    for stage in ("pretrain", "dialogues"):
        h.widgets[f"{stage}.steps"].setValue(2)
        h.widgets[f"{stage}.batch_size"].setValue(2)
        h.widgets[f"{stage}.lr"].setText("2e-2")  # large: the adapters must move the logits in 4 steps
    h.widgets["context_length"].setValue(64)
    assert h.is_valid(), h.error_message()
    assert w.state.lora() == LoRAConfig(rank=4, alpha=8.0)
    assert new_run_does(w.state) == f"fine-tunes {f32_base.name} with LoRA adapters of rank 4"
    seen, started = {}, []
    real = finetune.estimate_resident

    def spy(trainer, before, on_host):  # the real estimate, and the one of a full fine-tune of the same run
        seen["lora"] = r = real(trainer, before, on_host)
        rows = finetune.check_rows(trainer)
        full_dev = memory_bytes(trainer.model_config, trainer.model.batch_size, True, max_seq=r.longest)[0]
        seen["full"] = peak_resident_bytes(before, trainer.model_config, full_dev, on_host, False, rows)
        return r

    monkeypatch.setattr(finetune, "estimate_resident", spy)
    shown = t._on_started
    monkeypatch.setattr(t, "_on_started", lambda info: (started.append(info), shown(info)))
    assert t.start(), t.banner_text.text()
    wait_idle(qtbot, t, timeout=240_000)
    assert t.banner.isHidden(), t.banner_text.text()
    return started[0], seen["lora"], seen["full"]


def test_lora_run_compare_export_and_llama_cpp_loads_the_adapter(main_window, qtbot, f32_base, tmp_path,
                                                                 monkeypatch):
    import gguf

    from core.checkpoint import load_checkpoint

    w, t = main_window, main_window.training_tab
    info, resident, full = _train_lora(main_window, qtbot, f32_base, monkeypatch)
    meta = json.loads((w.project.checkpoint_dir / "config.json").read_text())
    assert meta["base"]["lora"] == {"rank": 4, "alpha": 8.0, "targets": list(TARGETS)}  # what train --lora saves
    assert "asking the base model 10 general questions" in t.log.toPlainText()  # replayed, as train --base does
    # the Training tab's estimate is the LoRA run's: less than the same run's full fine-tune
    assert 0 < info.peak_resident_bytes == resident.peak_bytes < full

    # before / after: the base (the checkpoint's own, checked by sha256) and the merged model
    assert not t.compare_button.isHidden() and t.compare_with_base()
    qtbot.waitUntil(lambda: not t.comparing(), timeout=120_000)
    assert not t.compare.isHidden() and t.compare.rowCount() == 2 + 10  # the dialogues', the general questions

    # Export: merged, adapter or both (only for a LoRA checkpoint); both, with their Modelfiles
    e = w.export_tab
    e.refresh()
    assert e.is_lora() and not e.what.isHidden()
    e.what.setCurrentIndex(e.what.findData("both"))
    assert e.exports() == "both"
    out = tmp_path / "exported" / "tuned.gguf"
    e.path.setText(str(out))
    e.modelfile.setChecked(True)
    e.set_dtype("f32")  # the merged model as exact as the adapter on the F32 base (the tab's default is F16)
    assert e.export()
    qtbot.waitUntil(lambda: not e.is_exporting(), timeout=120_000)
    d = e.last_result
    assert d is not None, e.status.text()
    adapter = tmp_path / "exported" / "tuned-lora.gguf"
    assert (d.path, d.adapter) == (str(out), str(adapter)) and d.adapter_bytes == adapter.stat().st_size
    assert f"ADAPTER ./{adapter.name}" in (adapter.with_suffix(".Modelfile")).read_text()
    r = gguf.GGUFReader(adapter)
    assert r.fields["general.type"].contents() == "adapter" and r.fields["adapter.lora.alpha"].contents() == 8.0
    del r

    # llama.cpp loads the adapter on the base file: our logits (the CLI test's tolerance), not the base's
    ck = load_checkpoint(w.project.checkpoint_dir)
    ids = ck.tokenizer.encode(PROMPT, parse_special=True)
    ours = _ours(ck, ids)
    theirs = _llama_logits(f32_base, ids, lora_path=str(adapter))
    base_logits = _llama_logits(f32_base, ids)
    assert np.abs(theirs - base_logits).max() > 0.05  # the adapter matters
    assert np.abs(ours - theirs).max() <= 1e-3
    np.testing.assert_allclose(_llama_logits(out, ids), ours, atol=1e-3, rtol=1e-3)  # the merged file

    # the adapter alone (llama.cpp's line runs it on its base), and as a PEFT folder
    e.what.setCurrentIndex(e.what.findData("adapter"))
    only = tmp_path / "only" / "adapter.gguf"
    e.path.setText(str(only))
    assert not e.dtype.isEnabled() and f"--lora {only.name}" in e.hint.text()
    assert _export(qtbot, e).path == str(only) == e.last_result.adapter
    assert set(only.parent.iterdir()) == {only, only.with_suffix(".Modelfile")}  # no merged model
    e.set_format("hf")
    assert "PeftModel.from_pretrained" in e.hint.text()
    d = _export(qtbot, e)
    assert d.path == d.adapter == str(only.with_suffix(""))
    assert sorted(p.name for p in Path(d.path).iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    # both as Hugging Face folders: the merged model (with the base file's own tokenizer) and its PEFT folder beside
    e.what.setCurrentIndex(e.what.findData("both"))
    merged_hf = tmp_path / "hf" / "tuned"
    e.path.setText(str(merged_hf))
    d = _export(qtbot, e)
    assert (d.path, d.adapter) == (str(merged_hf), str(merged_hf.with_name("tuned-lora")))
    tok_config = json.loads((merged_hf / "tokenizer_config.json").read_text())
    assert tok_config["bos_token"] == ck.tokenizer.vocab.tokens[ck.tokenizer.bos_id]
    assert (merged_hf.with_name("tuned-lora") / "adapter_model.safetensors").is_file()


def _export(qtbot, e):
    """Run the Export tab's export; its gui.events.Exported."""
    assert e.export(), e.status.text()
    qtbot.waitUntil(lambda: not e.is_exporting(), timeout=120_000)
    assert e.last_result is not None, e.status.text()
    return e.last_result


def test_a_model_without_adapters_exports_merged_only(studio_env, qtbot, tmp_path):
    from gui.app_state import AppState
    from gui.export_tab import ExportTab
    from tests.test_gui_e2e import save_tiny_checkpoint

    folder = tmp_path / "model"
    save_tiny_checkpoint(folder)

    class State(AppState):
        def trained_model_path(self):
            return folder

    tab = ExportTab(State())
    qtbot.addWidget(tab)
    tab.what.setCurrentIndex(tab.what.findData("adapter"))  # not offered: the choice has no effect
    assert tab.what.isHidden() and not tab.is_lora() and tab.exports() == "merged" and "--lora" not in tab.hint.text()
    tab.path.setText(str(tmp_path / "out" / "tiny.gguf"))
    d = _export(qtbot, tab)
    assert d.path == str(tmp_path / "out" / "tiny.gguf") and not d.adapter
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tiny.gguf"]


def test_the_verdict_says_how_many_general_questions_were_answered_as_before(main_window):
    from core.events import RunDone

    t = main_window.training_tab
    t.status.run_done(RunDone(False, True, "folder", 2, 0, True, True, "Learned: 5 of 5 answers",
                              general="general questions: 9 of 10 answered as before"))
    assert t.stage_label.text() == "Learned: 5 of 5 answers; general questions: 9 of 10 answered as before"
