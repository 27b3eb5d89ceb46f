"""Hugging Face folders: transformers computes our logits, tokenizes and templates like us; the round trip
ours -> HF -> ours -> GGUF is bit-exact and llama.cpp agrees; the accelerate example trains on 2 CPU
processes and its result comes back into the app.

Models are tiny (d_model 32, 2 layers) with random weights scaled so that logits are O(1..10): a wrong
Q/K permutation, a lost rope_theta or an untied projection changes them by far more than 1e-4.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from core import chat_format
from core.checkpoint import load_model, save_trainer
from core.loaded import LoadedModel
from core.cli import main
from core.config import ModelConfig, StageConfig, TrainConfig
from core.dataset import Dialogue, default_dataset, save_dataset
from core.generate import Generator
from core.gguf_io import export_gguf, import_gguf
from core.hf_io import HFError, export_hf, from_hf_rows, load_hf, load_hf_model, to_hf_rows
from core.model import Model
from core.tokenizer import Tokenizer
from tests.test_llama_cpp import CONVERSATIONS, TEXTS, open_llama
from tests.test_tokenizer import TRICKY

ROOT = Path(__file__).resolve().parent.parent
GQA = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, context_length=64, rope_theta=500.0)
TIED = dict(GQA, n_kv_heads=1, rope_theta=10000.0, tie_embeddings=True)
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(default_dataset().tokenizer_texts(), vocab_size=400)


def random_model(tok, seed: int = 0, **kw) -> LoadedModel:
    c = ModelConfig(vocab_size=tok.vocab_size, **kw)
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in c.param_shapes():
        if name.endswith("norm.weight"):
            w[name] = 1 + 0.1 * rng.standard_normal(shape)
        elif name == "token_embd.weight":
            w[name] = 0.5 * rng.standard_normal(shape)
        else:
            w[name] = 1.5 / np.sqrt(shape[1]) * rng.standard_normal(shape)
    return LoadedModel(c, tok, {k: v.astype(np.float32) for k, v in w.items()}, {}, Path("random"))


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(f"{record.name}: {record.getMessage()}")


def from_pretrained(folder):
    """Model and tokenizer through Auto*; returns them with every warning transformers logged or raised."""
    rec = Records()
    logger = logging.getLogger("transformers")  # transformers' loggers do not propagate to the root
    logger.addHandler(rec)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    finally:
        logger.removeHandler(rec)
    return model, hf_tok, rec.messages + [str(w.message) for w in caught]


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def prompt(tok, n: int = 60) -> list[int]:
    ids = [tok.bos_id] + tok.encode(" ".join(default_dataset().facts))
    return ids[:n]


# ------------------------------------------------------------------------------------ RoPE layout
def test_row_permutation_turns_adjacent_pairs_into_rotate_half(rng):
    """Our RoPE (adjacent pairs) on W x equals HF's rotate_half RoPE on to_hf_rows(W) x, rows permuted."""
    n_heads, hd, d, theta = 3, 8, 5, 500.0
    w = rng.standard_normal((n_heads * hd, d)).astype(np.float32)
    assert np.array_equal(from_hf_rows(to_hf_rows(w, n_heads), n_heads), w)
    x = rng.standard_normal(d)
    pos = 7
    ang = pos * theta ** (-np.arange(0, hd, 2) / hd)  # (hd/2,)
    cos, sin = np.cos(ang), np.sin(ang)
    q = (w @ x).reshape(n_heads, hd // 2, 2)  # ours: pairs (2i, 2i+1)
    ours = np.stack([q[..., 0] * cos - q[..., 1] * sin, q[..., 0] * sin + q[..., 1] * cos], -1).reshape(n_heads, hd)
    h = (to_hf_rows(w, n_heads) @ x).reshape(n_heads, hd)  # HF: q * cos + rotate_half(q) * sin
    c2, s2 = np.concatenate([cos, cos]), np.concatenate([sin, sin])
    theirs = h * c2 + np.concatenate([-h[:, hd // 2:], h[:, :hd // 2]], -1) * s2
    assert np.allclose(from_hf_rows(theirs.reshape(-1, 1), n_heads).reshape(n_heads, hd), ours, atol=1e-5)
    assert not np.allclose(theirs, ours, atol=1e-2)  # the permutation matters


# ------------------------------------------------------------------------------------ transformers
@pytest.mark.parametrize("kind", ["gqa", "tied"])
def test_transformers_logits_equal_ours(tok, device, tmp_path, kind):
    m = random_model(tok, **(GQA if kind == "gqa" else TIED))
    folder = export_hf(m, tmp_path / "hf")
    names = set(load_file(str(folder / "model.safetensors")))
    assert ("lm_head.weight" in names) == (kind == "gqa")
    hf, _, logged = from_pretrained(folder)
    assert logged == [], logged  # no missing / unexpected / newly initialised weights, no deprecations
    assert hf.config.tie_word_embeddings == (kind == "tied")
    ids = prompt(tok)
    ours = Model(device, m.config, batch_size=1, weights=m.weights, training=False).logits(np.array([ids]))[0]
    theirs = hf_logits(hf, ids)
    err = np.abs(ours - theirs).max(axis=1)
    print(f"{kind}: max |ours - transformers| = {err.max():.3g} (max |logit| {np.abs(ours).max():.3g})")
    assert err.max() <= 1e-4, f"max |diff| per position: {np.round(err, 7).tolist()}"
    assert ours.std() > 1.0
    gen = Generator(device, m.config, m.weights)  # the KV-cache path computes the same (tied too)
    rows = [gen.feed(ids[:30])] + [gen.feed([t]) for t in ids[30:]]
    assert np.abs(np.array(rows) - theirs[29:]).max() <= 1e-4


@pytest.fixture(scope="module")
def hf_folder(tok, tmp_path_factory):
    return export_hf(random_model(tok, **GQA), tmp_path_factory.mktemp("hf") / "model")


@pytest.fixture(scope="module")
def hf_tok(hf_folder):
    return transformers.AutoTokenizer.from_pretrained(hf_folder)


@pytest.mark.parametrize("text", TRICKY + TEXTS)
def test_autotokenizer_ids_equal_ours(tok, hf_tok, text):
    ours = tok.encode(text)
    assert hf_tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] == ours
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == tok.encode(text, parse_special=True)
    assert hf_tok(text)["input_ids"][:1] == [tok.bos_id]  # like llama.cpp's add_bos_token
    assert hf_tok.decode(ours) == tok.decode(ours)


@pytest.mark.parametrize("messages, gen_prompt", CONVERSATIONS + [
    ([{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}], True)])
def test_apply_chat_template_gives_our_chat_format(tok, hf_tok, messages, gen_prompt):
    got = hf_tok.apply_chat_template(messages, add_generation_prompt=gen_prompt, tokenize=True)
    got = got["input_ids"] if hasattr(got, "keys") else got  # transformers 5 returns a BatchEncoding
    turns, system, pending = chat_format.messages_to_turns(messages)
    if gen_prompt:
        assert got == chat_format.prompt_ids(tok, turns, pending, system=system)
    else:
        assert got == chat_format.encode_dialogue(tok, Dialogue(turns=turns, system=system))[0]


# ------------------------------------------------------------------------------------ round trip
@pytest.fixture(scope="module")
def ckpt(tok, device, tmp_path_factory):
    """A real checkpoint folder (save_checkpoint of a Trainer) holding the GQA random model."""
    from core.trainer import Trainer

    m = random_model(tok, seed=3, **GQA)
    tc = TrainConfig(pretrain=StageConfig(steps=1, batch_size=2, warmup_steps=0),
                     dialogues=StageConfig(steps=1, batch_size=2, warmup_steps=0))
    trainer = Trainer(default_dataset(), m.config, tc, device, tokenizer=tok, weights=m.weights)
    return save_trainer(trainer, tmp_path_factory.mktemp("ckpt") / "model"), m


@pytest.mark.parametrize("kind", ["checkpoint", "tied"])
def test_round_trip_is_bit_identical_and_llama_cpp_agrees(tok, ckpt, device, tmp_path, kind):
    if kind == "checkpoint":
        source, m = ckpt
    else:
        source = m = random_model(tok, seed=5, **TIED)
    folder = export_hf(load_model(source) if isinstance(source, Path) else source, tmp_path / "hf")
    config, weights, tok2 = load_hf(folder)
    assert config == m.config
    assert tok2.tokens() == tok.tokens() and tok2.merges() == tok.merges() and tok2.to_json() == tok.to_json()
    assert sorted(weights) == sorted(m.weights)
    for name, w in m.weights.items():
        assert weights[name].tobytes() == w.tobytes(), name
    back = load_model(folder)  # the app's loader recognises the folder
    assert back.meta["format"] == "hf" and back.meta["chat_template"] == chat_format.CHAT_TEMPLATE
    gguf = export_gguf(back, tmp_path / "m.gguf").path
    g = import_gguf(gguf)
    for name, w in m.weights.items():
        assert g.weights[name].tobytes() == w.tobytes(), name
    if kind == "tied":  # no output.weight in the file: it reads back tied (llama.cpp uses token_embd, as we do)
        assert g.config.tie_embeddings and "output.weight" not in g.weights
    ids = prompt(tok)
    ours = Model(device, m.config, batch_size=1, weights=m.weights, training=False).logits(np.array([ids]))[0]
    llm = open_llama(gguf)
    try:
        llm.eval(ids)
        theirs = np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()
    err = np.abs(theirs - ours).max()
    print(f"{kind}: max |ours - llama.cpp| = {err:.3g}")
    assert err < 1e-3


def test_cli_export_chat_and_back_to_gguf(ckpt, tmp_path, capsys):
    folder = tmp_path / "hf"
    assert main(["export", "--format", "hf", "--model", str(ckpt[0]), "--out", str(folder)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["export", "--format", "hf", "--model", str(ckpt[0]), "--out", str(folder)]) == 2  # asks first
    assert "hf: holds an earlier export; give --overwrite to replace it" in capsys.readouterr().err
    assert main(["export", "--format", "hf", "--model", str(ckpt[0]), "--out", str(folder), "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temp or old folder left
    capsys.readouterr()
    answers = []
    for model in (ckpt[0], folder):
        assert main(["chat", "--model", str(model), "--prompt", "Where is Brindlewick?", "--max-tokens", "6"]) == 0
        answers.append(capsys.readouterr().out)
    assert answers[0] == answers[1] and answers[0].strip()
    assert main(["export", "--model", str(folder), "--out", str(tmp_path / "m.gguf")]) == 0
    capsys.readouterr()
    g = import_gguf(tmp_path / "m.gguf")
    assert all(g.weights[n].tobytes() == w.tobytes() for n, w in ckpt[1].weights.items())
    # refusals are one line: a GGUF-only option, a folder with someone else's files
    assert main(["export", "--format", "hf", "--dtype", "q8_0", "--model", str(ckpt[0]), "--out", str(folder)]) == 2
    assert "--dtype" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main(["export", "--format", "hf", "--model", str(ckpt[0]), "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and err.count("\n") == 1
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("changes, field", [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_parameters"),
    ({"architectures": ["MistralForCausalLM"]}, "architectures"),
    ({"model_type": "qwen2"}, "model_type"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"head_dim": 16}, "head_dim"),
    ({"vocab_size": 512}, "vocab_size"),
    ({"max_position_embeddings": 131072}, "max_position_embeddings"),
])
def test_load_hf_refuses_what_we_do_not_compute(hf_folder, tmp_path, changes, field):
    import shutil

    folder = Path(shutil.copytree(hf_folder, tmp_path / "m"))
    _edit_config(folder, **changes)
    with pytest.raises(HFError) as e:
        load_hf(folder)
    assert field in str(e.value) and "config.json" in str(e.value) and "\n" not in str(e.value)


def test_load_hf_refuses_extra_tensors_and_reads_bf16(hf_folder, tmp_path):
    import shutil

    folder = Path(shutil.copytree(hf_folder, tmp_path / "m"))
    tensors = load_file(str(folder / "model.safetensors"))
    save_file(tensors | {"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(HFError, match="q_proj.bias"):
        load_hf(folder)
    # bfloat16 weights (as mixed-precision runs may save them) are read as their float32 values
    _, ref, _ = load_hf(hf_folder)
    bf16 = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()}
    import safetensors.torch

    safetensors.torch.save_file(bf16, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _, got, _ = load_hf(folder)
    for name, w in got.items():
        assert np.abs(w - ref[name]).max() <= np.abs(ref[name]).max() / 128, name


# ------------------------------------------------------------------------------------ accelerate
def test_accelerate_example_trains_on_two_processes_and_comes_back(tok, device, tmp_path):
    start = export_hf(random_model(tok, seed=7, **dict(GQA, rope_theta=10000.0)), tmp_path / "start")
    data = tmp_path / "data.json"
    save_dataset(default_dataset(), data)
    out = tmp_path / "tuned"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), ACCELERATE_DISABLE_RICH="1")
    with socket.socket() as s:  # a free port for the rendezvous: other test runs may share the machine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # accelerate's multi-process launcher (torchrun underneath), as on GPUs; --cpu makes it gloo on CPUs
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1",
           "--main_process_port", str(port), str(ROOT / "examples" / "train_accelerate.py"), "--cpu",
           "--model", str(start), "--data", str(data), "--out", str(out), "--steps", "10", "--batch-size", "8",
           "--lr", "1e-2", "--warmup-steps", "1", "--seed", "0"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines[0]["processes"] == 2 and "MULTI_CPU" in lines[0]["distributed"]
    losses = [ln["loss"] for ln in lines[1:]]
    print("accelerate losses:", losses)
    assert len(losses) == 10 and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3
    # back into the app: same logits as transformers, chat, export to GGUF
    back = load_hf_model(out)
    hf, _, logged = from_pretrained(out)
    assert logged == [], logged
    ids = prompt(tok)
    ours = Model(device, back.config, batch_size=1, weights=back.weights, training=False).logits(np.array([ids]))[0]
    assert np.abs(ours - hf_logits(hf, ids)).max() <= 1e-4
    _, before, _ = load_hf(start)
    assert not np.array_equal(before["blk.0.attn_q.weight"], back.weights["blk.0.attn_q.weight"])  # it trained
    assert main(["chat", "--model", str(out), "--prompt", "Where is Brindlewick?", "--max-tokens", "4"]) == 0
    assert main(["export", "--model", str(out), "--out", str(tmp_path / "tuned.gguf")]) == 0
    assert import_gguf(tmp_path / "tuned.gguf").config == back.config


# ------------------------------------------------------------------------------------ GUI
def test_export_tab_writes_a_hugging_face_folder(ckpt, studio_env, qtbot, tmp_path):
    from gui.app_state import AppState
    from gui.export_tab import ExportTab

    class State(AppState):
        def trained_model_path(self):
            return ckpt[0]

    tab = ExportTab(State())
    qtbot.addWidget(tab)
    tab.path.setText(str(tmp_path / "out" / "tiny.gguf"))
    tab.set_format("hf")
    assert not tab.dtype.isEnabled() and not tab.modelfile.isEnabled()
    assert tab.path.text() == str(tmp_path / "out" / "tiny")  # a folder name, not a .gguf
    assert "from_pretrained" in tab.hint.text() and "train_accelerate.py" in tab.hint.text()
    assert tab.export()
    qtbot.waitUntil(lambda: not tab.is_exporting(), timeout=60_000)
    assert tab.last_result is not None, tab.status.text()
    assert tab.last_result.path == str(tmp_path / "out" / "tiny")
    _, weights, _ = load_hf(tmp_path / "out" / "tiny")
    assert all(weights[n].tobytes() == w.tobytes() for n, w in ckpt[1].weights.items())
    tab.set_format("gguf")
    assert tab.dtype.isEnabled() and tab.path.text().endswith("tiny.gguf")


def test_train_base_takes_a_hugging_face_folder(ckpt, tmp_path):
    """A model that comes back from a cluster as an HF folder is fine-tuned further on the desktop."""
    folder = export_hf(load_model(ckpt[0]), tmp_path / "hf")
    out = tmp_path / "tuned"
    assert main(["train", "--base", str(folder), "--steps", "2", "--batch-size", "2", "--out", str(out), "-q"]) == 0
    tuned = load_model(out)
    assert tuned.config == ckpt[1].config and tuned.checkpoint.adam_step == 4  # 2 pretrain + 2 tune steps
    assert any(not np.array_equal(tuned.weights[n], w) for n, w in ckpt[1].weights.items())
