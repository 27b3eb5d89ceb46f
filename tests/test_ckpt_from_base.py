"""A full fine-tune's checkpoint without a second copy of the tensors it never changed (issue 24): with
``--freeze-embeddings`` and a GGUF base, weights.npz and optimizer.npz leave out ``token_embd.weight``,
config.json names it (``base.from_base``) with the base file's sha256, and every load (chat, resume,
export) reads it back from the base file, as a LoRA checkpoint reads its base.

On the tiny tied llama of tests/test_finetune.py (SmolLM2's vocabulary, d_model 64).
"""
from __future__ import annotations

import json
import re
import shutil
import zipfile

import numpy as np
import pytest

import gguf
from core.checkpoint import (CheckpointError, load_checkpoint, resume_trainer, save_checkpoint, save_trainer)
from core.checkpoint_meta import CheckpointMeta
from core.cli import main
from core.config import replace
from core.dataset import load_dataset
from core.from_base import base_trainer, default_train_config, estimate_resident, load_base
from core.estimates import checkpoint_file_bytes, save_copy_bytes
from core.gguf_import import import_gguf
from core.model import Model
from tests.test_finetune import DATA, write_tiny_smol

EMBD = "token_embd.weight"


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return write_tiny_smol(tmp_path_factory.mktemp("base") / "tiny-smol.gguf")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "data.json"
    path.write_text(json.dumps(DATA))
    return load_dataset(path)[0]


@pytest.fixture(scope="module")
def device():
    import core.device

    return core.device.open_device(None)


def _members(path) -> set[str]:
    with zipfile.ZipFile(path) as zf:
        return {n.removesuffix(".npy") for n in zf.namelist()}


def _ids(tok) -> np.ndarray:
    text = "<|im_start|>user\nWhere is Brindlewick?<|im_end|>\n<|im_start|>assistant\n"
    return np.array([tok.encode(text, parse_special=True)])


def _frozen_trainer(base, device, data, steps: int = 2):
    loaded, mc, meta = load_base(base, 64)
    tc = default_train_config(steps, 3e-3, 4, freeze_embeddings=True)
    return base_trainer(loaded, mc, meta, data, tc, device)


@pytest.fixture(scope="module")
def frozen_run(tiny_base, device, data, tmp_path_factory):
    """(folder, logits and weights of the trained model before its save) of a fine-tune with frozen embeddings."""
    trainer = _frozen_trainer(tiny_base, device, data)
    for _ in trainer.run(recall=False):
        pass
    out = tmp_path_factory.mktemp("frozen") / "run"
    logits = trainer.model.logits(_ids(trainer.tokenizer))
    weights = trainer.model.weights()
    save_trainer(trainer, out)
    return out, logits, weights


def test_frozen_embedding_is_not_saved_and_loads_back_exactly(frozen_run, tiny_base, device):
    out, logits, weights = frozen_run
    assert EMBD not in _members(out / "weights.npz")
    assert not {f"m.{EMBD}", f"v.{EMBD}"} & _members(out / "optimizer.npz")
    assert "blk.0.attn_q.weight" in _members(out / "weights.npz")
    base = json.loads((out / "config.json").read_text())["base"]
    assert base["from_base"] == [EMBD] and base["base_model"] == str(tiny_base.resolve())
    import hashlib

    assert base["base_sha256"] == hashlib.sha256(tiny_base.read_bytes()).hexdigest()
    ck = load_checkpoint(out)
    assert set(ck.weights) == set(weights) and all(np.array_equal(ck.weights[k], weights[k]) for k in weights)
    assert np.array_equal(ck.weights[EMBD], import_gguf(tiny_base).weights[EMBD])
    again = Model(device, ck.config, batch_size=1, weights=ck.weights, training=False).logits(_ids(ck.tokenizer))
    assert np.array_equal(again, logits)


def test_the_estimate_counts_what_a_save_writes(tiny_base, device, data, frozen_run):
    trainer = _frozen_trainer(tiny_base, device, data, steps=1)
    mc = trainer.model_config
    written = sum((frozen_run[0] / f).stat().st_size for f in ("weights.npz", "optimizer.npz"))
    headers = 3 * len(mc.param_shapes()) * 320  # each member's .npy header (128) and zip entries (2 x ~30 + 2 names)
    assert checkpoint_file_bytes(mc, (EMBD,)) <= written <= checkpoint_file_bytes(mc, (EMBD,)) + headers
    embd = mc.vocab_size * mc.d_model
    assert checkpoint_file_bytes(mc) - checkpoint_file_bytes(mc, (EMBD,)) == 12 * embd
    r = estimate_resident(trainer, 0, True)
    assert r.save_bytes == save_copy_bytes(mc, True, (EMBD,)) == save_copy_bytes(mc, True) - 16 * embd


def test_resume_reads_the_base_and_keeps_leaving_it_out(frozen_run, tiny_base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(frozen_run[0], run)
    assert main(["train", "--resume", str(run), "--tune-steps", "4", "-q"]) == 0
    meta = json.loads((run / "config.json").read_text())
    assert meta["adam_step"] > json.loads((frozen_run[0] / "config.json").read_text())["adam_step"]
    assert meta["base"]["from_base"] == [EMBD] and EMBD not in _members(run / "weights.npz")
    ck = load_checkpoint(run)
    assert np.array_equal(ck.weights[EMBD], import_gguf(tiny_base).weights[EMBD])
    assert not np.array_equal(ck.weights["blk.0.attn_q.weight"], frozen_run[2]["blk.0.attn_q.weight"])
    mixed = tmp_path / "mixed"  # the weights of one save beside the config of another: refused (format 3's sha256)
    shutil.copytree(frozen_run[0], mixed)
    shutil.copy(run / "weights.npz", mixed / "weights.npz")
    with pytest.raises(CheckpointError, match="weights_sha256"):
        load_checkpoint(mixed)


def test_resumed_unfrozen_the_embedding_is_trained_and_saved(frozen_run, tiny_base, device, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(frozen_run[0], run)
    saved = CheckpointMeta.read(run)
    tc = replace(saved.train, freeze_embeddings=False, dialogues=replace(saved.train.dialogues, steps=3))
    trainer = resume_trainer(run, device, train_config=tc)
    for _ in trainer.run(recall=False):
        pass
    save_trainer(trainer, run)
    meta = CheckpointMeta.read(run)
    assert meta.from_base == () and meta.base["base_sha256"] == saved.base["base_sha256"]
    assert EMBD in _members(run / "weights.npz") and f"m.{EMBD}" in _members(run / "optimizer.npz")
    trained = load_checkpoint(run).weights[EMBD]
    assert not np.array_equal(trained, import_gguf(tiny_base).weights[EMBD])
    frozen_again = resume_trainer(run, device)  # saved whole from now on, even when frozen again
    save_trainer(frozen_again, run)
    assert CheckpointMeta.read(run).from_base == () and np.array_equal(load_checkpoint(run).weights[EMBD], trained)


def _old_layout(folder, into):
    """The checkpoint as this app wrote it before: every tensor and moment in the .npz files, no from_base."""
    ck = load_checkpoint(folder)
    meta = ck.checkpoint
    base = {k: v for k, v in meta.base.items() if k not in ("from_base", "base_sha256")}
    from core.checkpoint import _read_moments

    m, v = _read_moments(folder / "optimizer.npz", meta, ck.config)
    data = load_dataset(folder / "dataset.json")[0]
    save_checkpoint(into, ck.weights, {"m": m, "v": v, "step": meta.adam_step}, replace(meta, base=base),
                    ck.tokenizer, data)
    return into


def test_export_equals_the_old_layouts_and_the_old_layout_still_loads(frozen_run, tmp_path, capsys):
    old = _old_layout(frozen_run[0], tmp_path / "old")
    assert EMBD in _members(old / "weights.npz") and "from_base" not in CheckpointMeta.read(old).base
    ck_old = load_checkpoint(old)
    assert all(np.array_equal(ck_old.weights[k], w) for k, w in frozen_run[2].items())
    files = []
    for folder in (frozen_run[0], old):
        gg = tmp_path / f"{folder.name}.gguf"
        assert main(["export", "--model", str(folder), "--out", str(gg)]) == 0
        files.append(gguf.GGUFReader(gg))
    a, b = ({t.name: (t.tensor_type, np.asarray(t.data)) for t in r.tensors} for r in files)
    assert a.keys() == b.keys() and EMBD in a
    assert all(a[k][0] == b[k][0] and np.array_equal(a[k][1], b[k][1]) for k in a)
    assert main(["train", "--resume", str(old), "--tune-steps", "4", "-q"]) == 0  # an old checkpoint resumes as before
    assert EMBD in _members(old / "weights.npz") and "from_base" not in CheckpointMeta.read(old).base


def _folder_bytes(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_missing_or_changed_base_is_one_line_and_writes_nothing(frozen_run, tiny_base, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(frozen_run[0], run)
    moved = tmp_path / "base-copy.gguf"
    meta = json.loads((run / "config.json").read_text())
    meta["base"]["base_model"] = str(moved)
    (run / "config.json").write_text(json.dumps(meta))
    before = _folder_bytes(run)
    target = tmp_path / "out.gguf"
    for field, make in (("base.base_model", lambda: None), ("base.base_sha256", lambda: _changed_copy(tiny_base, moved))):
        make()
        for args in (["export", "--model", str(run), "--out", str(target)], ["train", "--resume", str(run), "-q"],
                     ["chat", "--model", str(run), "--prompt", "hi"]):
            assert main(args) == 2, args
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and f"field '{field}'" in err and str(run / "config.json") in err, err
            assert EMBD in err
        assert not target.exists() and _folder_bytes(run) == before
        with pytest.raises(CheckpointError, match=field):
            load_checkpoint(run)


def _changed_copy(src, dst):
    shutil.copy(src, dst)
    with open(dst, "r+b") as fh:  # one byte of the last tensor's data
        fh.seek(-5, 2)
        b = fh.read(1)
        fh.seek(-5, 2)
        fh.write(bytes([b[0] ^ 1]))


@pytest.mark.parametrize("edit, field", [
    (lambda b: b.update(from_base=["nope.weight"]), "base.from_base[0]"),
    (lambda b: b.update(from_base=[EMBD, EMBD]), "base.from_base[1]"),
    (lambda b: b.update(from_base="token_embd.weight"), "base.from_base"),
    (lambda b: b.pop("base_sha256"), "base.base_sha256"),
    (lambda b: b.update(lora={"rank": 4, "alpha": 8.0, "targets": ["attn_q"]}), "base.from_base"),
])
def test_a_bad_from_base_field_is_named(frozen_run, edit, field):
    d = json.loads((frozen_run[0] / "config.json").read_text())
    edit(d["base"])
    with pytest.raises(CheckpointError, match=re.escape(f"x/config.json: field '{field}' ")):
        CheckpointMeta.from_dict(d, "x/config.json")


def test_a_scratch_run_and_a_folder_base_save_every_tensor(tmp_path, frozen_run, device, data):
    from core.config import ModelConfig
    from core.trainer import Trainer

    mc = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, context_length=32)
    tc = default_train_config(1, 1e-3, 2, freeze_embeddings=True)
    save_trainer(Trainer(data, mc, tc, device), tmp_path / "scratch")
    assert EMBD in _members(tmp_path / "scratch" / "weights.npz")
    loaded, mc, meta = load_base(frozen_run[0], 64)  # our checkpoint folder as the base: no single file to name
    trainer = base_trainer(loaded, mc, meta, data, tc, device)
    save_trainer(trainer, tmp_path / "from-folder")
    assert EMBD in _members(tmp_path / "from-folder" / "weights.npz")
    assert "from_base" not in CheckpointMeta.read(tmp_path / "from-folder").base
