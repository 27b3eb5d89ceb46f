"""GGUF export/import (core/gguf_io.py): metadata, tensor types, safety, round trips, errors.

Most tests use random weights (fast, no OpenCL); the round trip and the CLI use a tiny model trained
for a few steps on the default dataset (:func:`get_trained`, shared with tests/test_llama_cpp.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest

from core import chat_format
from core.checkpoint import load_model
from core.loaded import LoadedModel
from core.config import ModelConfig, StageConfig, TrainConfig
from core.dataset import Dataset, default_dataset
from core.gguf_io import META_PREFIX, GGUFError, export_gguf, import_gguf
from core.tokenizer import Tokenizer
from tests.artifacts import write_gguf

T = gguf.GGMLQuantizationType
V = gguf.GGUFValueType
K, G, TK = gguf.Keys, gguf.Keys.General, gguf.Keys.Tokenizer


def LLM(key: str) -> str:
    """A ``{arch}`` key of gguf.Keys for the llama architecture."""
    return key.format(arch="llama")


TINY = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, context_length=64)


# ------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(default_dataset().tokenizer_texts(), vocab_size=512)


def random_model(tok: Tokenizer, seed: int = 0, **overrides) -> LoadedModel:
    cfg = ModelConfig(vocab_size=tok.vocab_size, **(TINY | overrides))
    rng = np.random.default_rng(seed)
    w = {n: (rng.standard_normal(s) * 0.1).astype(np.float32) for n, s in cfg.param_shapes()}
    return LoadedModel(cfg, tok, w, {}, Path("random"))


def read_kv(path: Path) -> dict[str, tuple[object, int]]:
    """{key: (value, GGUFValueType)} of a GGUF file."""
    from core.gguf_io import _fields

    return _fields(gguf.GGUFReader(path))


def read_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """{name: (type name, numpy shape, raw bytes)} in file order."""
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, tuple(reversed([int(x) for x in t.shape])), np.asarray(t.data).tobytes())
            for t in r.tensors}


def rewrite(src: Path, dst: Path, arch: str | None = None, drop: tuple[str, ...] = (), tensor_fn=None) -> Path:
    """Copy a GGUF with GGUFWriter, optionally changing the architecture, dropping keys, or changing
    tensors (``tensor_fn(name, data, type) -> (data, raw_dtype) or None`` to drop)."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch or r.fields[G.ARCHITECTURE].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == G.ARCHITECTURE or key in drop:
            continue
        vt = f.types[0]
        w.add_key_value(key, f.contents(), vt, sub_type=f.types[-1] if vt == V.ARRAY else None)
    for t in r.tensors:
        data, qtype = np.array(t.data), t.tensor_type
        if tensor_fn is not None:
            out = tensor_fn(t.name, data, qtype)
            if out is None:
                continue
            data, qtype = out
        w.add_tensor(t.name, data, raw_dtype=qtype if data.dtype == np.uint8 or qtype not in (T.F32, T.F16) else None)
    write_gguf(w)
    return dst


# ------------------------------------------------------------------------------------ trained model
@dataclass
class Trained:
    """A tiny trained model: its checkpoint, the loaded model, and GGUF exports per dtype."""

    dataset: Dataset
    checkpoint: Path
    loaded: LoadedModel
    gguf: dict[str, Path]


_TRAINED: dict[int, Trained] = {}


def get_trained(device, tmp_path_factory) -> Trained:
    """Train (once per device per session) d_model 32, 2 layers, 4 heads / 2 kv heads, 60 steps per stage.

    60 steps per stage (a few seconds on PoCL) is where this model starts to answer some questions right
    and others not: a realistic mix of confident and uncertain predictions for the comparisons.
    """
    key = id(device)
    if key not in _TRAINED:
        from core.checkpoint import load_checkpoint, save_trainer
        from core.trainer import StepReport, Trainer

        ds = default_dataset()
        tc = TrainConfig(pretrain=StageConfig(steps=60, lr=1e-2, batch_size=8, warmup_steps=3),
                         dialogues=StageConfig(steps=60, lr=5e-3, batch_size=8, warmup_steps=3), vocab_size=512, seed=0)
        trainer = Trainer(ds, ModelConfig(**TINY), tc, device)
        steps = [e for e in trainer.run(recall=False) if isinstance(e, StepReport)]
        assert len(steps) == 120 and not any(s.skipped for s in steps)
        root = tmp_path_factory.mktemp("trained")
        ckpt = save_trainer(trainer, root / "ckpt")
        loaded = load_checkpoint(ckpt)
        files = {dt: export_gguf(loaded, root / f"tiny-{dt}.gguf", dtype=dt).path for dt in ("f32", "f16", "q8_0")}
        _TRAINED[key] = Trained(ds, ckpt, loaded, files)
    return _TRAINED[key]


@pytest.fixture(scope="module")
def trained(device, tmp_path_factory) -> Trained:
    return get_trained(device, tmp_path_factory)


# ------------------------------------------------------------------------------------ export
def test_export_writes_every_llama_key(tok, tmp_path):
    m = random_model(tok)
    res = export_gguf(m, tmp_path / "m.gguf", name="tiny test", training_meta={"note": "hello", "epochs": 3})
    assert res.path == tmp_path / "m.gguf" and res.size_bytes == res.path.stat().st_size and res.modelfile is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # no temp file left
    kv = read_kv(res.path)
    c = m.config
    expect = {
        G.ARCHITECTURE: ("llama", V.STRING), G.NAME: ("tiny test", V.STRING),
        G.FILE_TYPE: (0, V.UINT32),
        LLM(K.LLM.VOCAB_SIZE): (tok.vocab_size, V.UINT32), LLM(K.LLM.CONTEXT_LENGTH): (64, V.UINT32),
        LLM(K.LLM.EMBEDDING_LENGTH): (32, V.UINT32), LLM(K.LLM.BLOCK_COUNT): (2, V.UINT32),
        LLM(K.LLM.FEED_FORWARD_LENGTH): (64, V.UINT32), LLM(K.Attention.HEAD_COUNT): (4, V.UINT32),
        LLM(K.Attention.HEAD_COUNT_KV): (2, V.UINT32), LLM(K.Rope.DIMENSION_COUNT): (8, V.UINT32),
        LLM(K.Rope.FREQ_BASE): (np.float32(c.rope_theta), V.FLOAT32),
        LLM(K.Attention.LAYERNORM_RMS_EPS): (np.float32(c.norm_eps), V.FLOAT32),
        TK.MODEL: ("gpt2", V.STRING), TK.PRE: ("gpt-2", V.STRING),
        TK.BOS_ID: (tok.bos_id, V.UINT32), TK.EOS_ID: (tok.eos_id, V.UINT32),
        TK.PAD_ID: (tok.pad_id, V.UINT32),
        TK.ADD_BOS: (True, V.BOOL), TK.ADD_EOS: (False, V.BOOL),
        TK.CHAT_TEMPLATE: (chat_format.CHAT_TEMPLATE, V.STRING),
        META_PREFIX + "note": ("hello", V.STRING), META_PREFIX + "epochs": (3, V.INT64),
    }
    for key, (value, vtype) in expect.items():
        assert kv[key][1] == vtype, key
        assert (np.float32(kv[key][0]) == value) if vtype == V.FLOAT32 else (kv[key][0] == value), key
    assert kv[TK.LIST][0] == tok.tokens()
    assert kv[TK.MERGES][0] == tok.merges()
    types = kv[TK.TOKEN_TYPE][0]
    assert [i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL] == sorted(tok.special_ids())
    assert all(t == gguf.TokenType.NORMAL for i, t in enumerate(types) if i not in tok.special_ids())
    assert META_PREFIX + "export_date" in kv and META_PREFIX + "app_version" in kv

    tensors = read_tensors(res.path)
    assert list(tensors)[:2] == ["token_embd.weight", "blk.0.attn_norm.weight"]
    assert set(tensors) == {n for n, _ in c.param_shapes()}
    for name, shape in c.param_shapes():
        ttype, tshape, raw = tensors[name]
        assert (ttype, tshape) == ("F32", shape)
        assert raw == m.weights[name].tobytes()  # exact


@pytest.mark.parametrize("dtype, file_type, mat_type, rtol", [("f16", 1, "F16", 1e-3), ("q8_0", 7, "Q8_0", 2e-2)])
def test_export_f16_q8_0_keeps_norms_f32(tok, tmp_path, dtype, file_type, mat_type, rtol):
    m = random_model(tok)
    f32 = export_gguf(m, tmp_path / "a.gguf")
    res = export_gguf(m, tmp_path / "b.gguf", dtype=dtype)
    assert res.size_bytes < 0.6 * f32.size_bytes and res.notes == ()
    assert read_kv(res.path)[G.FILE_TYPE][0] == file_type
    for name, (ttype, shape, _) in read_tensors(res.path).items():
        assert ttype == ("F32" if len(shape) == 1 else mat_type), name
    back = import_gguf(res.path)
    for name, w in m.weights.items():
        scale = np.abs(w).max()
        assert np.abs(back.weights[name] - w).max() <= rtol * scale, name
    assert back.meta["tensor_types"]["blk.0.attn_q.weight"] == mat_type


def test_q8_0_falls_back_for_rows_not_multiple_of_32(tok, tmp_path):
    m = random_model(tok, d_model=48, n_heads=4, n_kv_heads=2, ffn_dim=64)
    res = export_gguf(m, tmp_path / "m.gguf", dtype="q8_0")
    types = {n: t for n, (t, _, _) in read_tensors(res.path).items()}
    assert types["blk.0.ffn_down.weight"] == "Q8_0"  # rows of ffn_dim = 64 values
    for n in ("token_embd.weight", "output.weight", "blk.1.attn_q.weight", "blk.1.ffn_gate.weight"):
        assert types[n] == "F16"  # rows of d_model = 48 values
    assert types["output_norm.weight"] == "F32"
    assert any("blk.0.attn_k.weight" in n and "F16" in n and "32" in n for n in res.notes)
    assert not any("ffn_down" in n for n in res.notes)
    back = import_gguf(res.path)
    assert back.config == m.config


def test_refuses_nan_and_leaves_old_file_untouched(tok, tmp_path):
    m = random_model(tok)
    good = export_gguf(m, tmp_path / "m.gguf").path
    before = good.read_bytes()
    m.weights["blk.1.ffn_up.weight"][3, 5] = np.nan
    with pytest.raises(GGUFError, match=r"blk\.1\.ffn_up\.weight.*NaN"):
        export_gguf(m, good, dtype="q8_0")
    m.weights["blk.1.ffn_up.weight"][3, 5] = np.inf
    with pytest.raises(GGUFError, match="infinite"):
        export_gguf(m, tmp_path / "new.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"] and good.read_bytes() == before


def test_refuses_vocab_mismatch(tok, tmp_path):
    m = random_model(tok)
    cfg = ModelConfig(**(m.config.to_dict() | {"vocab_size": tok.vocab_size + 1}))
    w = dict(m.weights)
    for n in ("token_embd.weight", "output.weight"):
        w[n] = np.zeros((tok.vocab_size + 1, cfg.d_model), np.float32)
    with pytest.raises(GGUFError, match="vocabulary size mismatch"):
        export_gguf(LoadedModel(cfg, tok, w, {}, Path("x")), tmp_path / "m.gguf")
    with pytest.raises(GGUFError, match="unknown dtype"):
        export_gguf(m, tmp_path / "m.gguf", dtype="q2_k")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stage", ["write", "verify"])
def test_failed_export_leaves_no_partial_file(tok, tmp_path, monkeypatch, stage):
    m = random_model(tok)
    if stage == "write":
        real = gguf.GGUFWriter.write_tensors_to_file

        def half_then_fail(self, *a, **k):
            real(self, *a, **k)
            self.fout[0].truncate(1000)
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", half_then_fail)
        err = OSError
    else:
        # a tensor whose bytes come back different must fail verification
        real = gguf.GGUFWriter.write_tensors_to_file

        def corrupt(self, *a, **k):
            real(self, *a, **k)
            self.fout[0].seek(-8, 2)
            self.fout[0].write(b"\x7f" * 8)
        monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", corrupt)
        err = GGUFError
    with pytest.raises(err):
        export_gguf(m, tmp_path / "m.gguf", modelfile=True)
    assert list(tmp_path.iterdir()) == []


def test_modelfile(tok, tmp_path):
    m = random_model(tok)
    res = export_gguf(m, tmp_path / "my model.gguf", dtype="q8_0", modelfile=True)
    assert res.modelfile == tmp_path / "my model.Modelfile"
    text = res.modelfile.read_text("utf-8")
    lines = text.splitlines()
    assert "FROM ./my model.gguf" in lines
    assert f'TEMPLATE """{chat_format.OLLAMA_TEMPLATE}"""' in text
    assert 'PARAMETER stop "<|eos|>"' in lines and 'PARAMETER stop "User:"' in lines
    assert "PARAMETER temperature 0" in lines and "PARAMETER num_ctx 64" in lines
    # the name the app and the CLI give (core.gguf_io.ollama_name), not another one
    assert "# ollama create my-model -f 'my model.Modelfile' && ollama run my-model" in lines


def test_the_ollama_name_keeps_to_ollamas_name_rule():
    """Ollama takes ASCII letters, digits, '_', '-', '.' in a model name, beginning with a letter or digit
    (types/model/name.go, isValidPart); "modèle été" was suggested as "modèle-été"."""
    from core.gguf_io import ollama_name

    assert ollama_name("modèle été.gguf") == "modele-ete"
    assert ollama_name("/x/.Notes..v2.gguf") == "notes.v2"
    assert ollama_name("日本語.gguf") == ollama_name("a.gguf") == "mymodel"
    for stem in ("Ωmega 1", "Crème brûlée", "x" * 200, "--a", "über"):
        name = ollama_name(stem + ".gguf")
        assert re.fullmatch(r"[a-z0-9][a-z0-9_.-]{1,79}", name) and ".." not in name, name


def test_export_replaces_only_files_this_app_wrote(tok, tmp_path):
    """An export over its own earlier file (GGUF and Modelfile) replaces it; over a user's file, another
    program's GGUF or a Modelfile of the user's it is refused in one line naming the file, before anything is
    written, and the file is left as it was."""
    from core.checkpoint import CheckpointError

    m = random_model(tok)
    ours = export_gguf(m, tmp_path / "m.gguf", modelfile=True)
    export_gguf(m, ours.path, dtype="q8_0", modelfile=True)  # our own files: replaced
    assert read_kv(ours.path)["general.file_type"][0] == 7  # MOSTLY_Q8_0
    notes, theirs = tmp_path / "notes.gguf", tmp_path / "theirs.gguf"
    notes.write_text("my notes\n")
    rewrite(ours.path, theirs, drop=tuple(k for k in read_kv(ours.path) if k.startswith("opencl_llm_studio.")))
    for target in (notes, theirs):
        before = target.read_bytes()
        with pytest.raises(CheckpointError, match=f"{target.name}: exists and was not written by this app"):
            export_gguf(m, target)
        assert target.read_bytes() == before
    (tmp_path / "mine.Modelfile").write_text("FROM llama3\n")
    with pytest.raises(CheckpointError, match="mine.Modelfile: exists and was not written by this app"):
        export_gguf(m, tmp_path / "mine.gguf", modelfile=True)
    assert not (tmp_path / "mine.gguf").exists() and (tmp_path / "mine.Modelfile").read_text() == "FROM llama3\n"


# ------------------------------------------------------------------------------------ import
def test_import_roundtrip_random(tok, tmp_path):
    m = random_model(tok)
    res = export_gguf(m, tmp_path / "m.gguf")
    back = load_model(res.path)  # checkpoint.load_model dispatches .gguf to import_gguf
    assert back.config == m.config
    assert back.tokenizer.tokens() == tok.tokens() and back.tokenizer.merges() == tok.merges()
    assert (back.tokenizer.bos_id, back.tokenizer.eos_id, back.tokenizer.pad_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    text = "<|bos|>User: Where is Brindlewick? Ünïcode 🙂 12345\r\nAssistant: here<|eos|>"
    for special in (False, True):
        assert back.tokenizer.encode(text, parse_special=special) == tok.encode(text, parse_special=special)
    for n, w in m.weights.items():
        assert back.weights[n].dtype == np.float32 and np.array_equal(back.weights[n], w)
    assert back.meta["format"] == "gguf" and back.meta["chat_template"] == chat_format.CHAT_TEMPLATE


@pytest.fixture
def good_file(tok, tmp_path) -> Path:
    return export_gguf(random_model(tok), tmp_path / "good.gguf", dtype="q8_0").path


def test_import_rejects_other_architecture(good_file, tmp_path):
    bad = rewrite(good_file, tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(GGUFError, match="architecture 'gpt2' is not supported"):
        import_gguf(bad)
    with pytest.raises(GGUFError):
        load_model(bad)


def test_import_rejects_missing_key(good_file, tmp_path):
    bad = rewrite(good_file, tmp_path / "nokey.gguf", drop=(LLM(K.LLM.CONTEXT_LENGTH),))
    with pytest.raises(GGUFError, match=LLM(K.LLM.CONTEXT_LENGTH) + " is missing"):
        import_gguf(bad)
    bad = rewrite(good_file, tmp_path / "nopre.gguf", drop=(TK.PRE,))
    with pytest.raises(GGUFError, match=re.escape(TK.PRE) + r" = '\(none: default\)' is not supported"):
        import_gguf(bad)
    bad = rewrite(good_file, tmp_path / "notok.gguf", drop=(TK.LIST,))
    with pytest.raises(GGUFError, match=TK.LIST):
        import_gguf(bad)


def test_import_rejects_unknown_tensor_type_and_tensors(good_file, tmp_path):
    def to_int32(name, data, qtype):
        if name == "blk.0.attn_q.weight":
            return np.zeros((32, 32), np.int32), None
        return data, qtype
    with pytest.raises(GGUFError, match="blk.0.attn_q.weight has type I32"):
        import_gguf(rewrite(good_file, tmp_path / "i32.gguf", tensor_fn=to_int32))

    def drop_q(name, data, qtype):
        return None if name == "blk.1.attn_v.weight" else (data, qtype)
    with pytest.raises(GGUFError, match="blk.1.attn_v.weight"):
        import_gguf(rewrite(good_file, tmp_path / "missing.gguf", tensor_fn=drop_q))


def test_import_rejects_non_gguf(tmp_path, good_file):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a model" * 10)
    with pytest.raises(GGUFError, match="not a readable GGUF"):
        import_gguf(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good_file.read_bytes()[:5000])
    with pytest.raises(GGUFError):
        import_gguf(cut)
    with pytest.raises(GGUFError, match="no such file"):
        import_gguf(tmp_path / "missing.gguf")


# ------------------------------------------------------------------------------------ trained model
@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_export_import_export_is_identical(trained, tmp_path, dtype):
    first = trained.gguf[dtype]
    back = import_gguf(first)
    second = export_gguf(back, tmp_path / "again.gguf", dtype=dtype).path
    assert read_tensors(first) == read_tensors(second)
    kv1, kv2 = read_kv(first), read_kv(second)
    for k in (META_PREFIX + "export_date",):  # the one value that differs between two exports
        assert kv1.pop(k)[0] and kv2.pop(k)[0]
    assert kv1 == kv2
    meta = trained.loaded.checkpoint
    assert kv1[META_PREFIX + "training.steps"][0] == meta.adam_step == 120
    assert kv1[META_PREFIX + "training.pretrain_steps"][0] == 60 and kv1[META_PREFIX + "training.tune_steps"][0] == 60
    assert kv1[META_PREFIX + "training.dataset_sha256"][0] == meta.dataset_hash
    assert kv1[META_PREFIX + "training.final_loss"][0] == pytest.approx(meta.last_loss)
    assert json.loads(kv1[META_PREFIX + "training.config"][0])["dialogues"]["steps"] == 60
    assert back.meta["dataset_hash"] == meta.dataset_hash and back.meta["name"] == first.stem
    if dtype == "f32":
        for n, w in trained.loaded.weights.items():
            assert np.array_equal(back.weights[n], w)


def test_cli_export_and_chat_with_gguf(trained, device, tmp_path, capsys):
    from core.chat import ChatSession
    from core.cli import main
    from core.generate import Generator, SamplingSettings

    out = tmp_path / "cli.gguf"
    assert main(["export", "--model", str(trained.checkpoint), "--out", str(out), "--dtype", "f16", "--modelfile"]) == 0
    printed = capsys.readouterr().out
    assert "cli.gguf" in printed and "cli.Modelfile" in printed
    assert import_gguf(out).config == trained.loaded.config
    assert main(["export", "--model", str(out), "--out", str(tmp_path / "again.gguf"), "--dtype", "f16"]) == 0
    assert read_tensors(out) == read_tensors(tmp_path / "again.gguf")
    capsys.readouterr()
    question = trained.dataset.dialogues[0].turns[0][0]
    assert main(["chat", "--model", str(out), "--device", str(device.info.index), "--prompt", question]) == 0
    loaded = load_model(out)
    expected = ChatSession(Generator(device, loaded.config, loaded.weights), loaded.tokenizer).answer(
        question, SamplingSettings(temperature=0.0, max_tokens=64))
    assert capsys.readouterr().out.strip() == expected and expected
