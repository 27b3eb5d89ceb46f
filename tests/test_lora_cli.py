"""LoRA from the command line: ``train --base FILE --lora`` (the checkpoint holds only the adapters and
the base file's sha256), resume, ``export --adapter`` as llama.cpp's adapter GGUF (its logits with the
adapter on the F32 base equal ours), the merged export, the Ollama Modelfile, the PEFT folder (its
logits in transformers equal ours), and bad input refused in one line with nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest

import gguf
from core.checkpoint import load_checkpoint
from core.cli import main
from core.config import ModelConfig
from core.gguf_import import import_gguf, read_vocab
from core.gguf_io import _write_vocab
from core.lora import adapter_shapes
from core.model import Model
from tests.artifacts import add_llama_hparams, open_llama, smollm2_path, write_gguf
from tests.test_finetune import DATA

PROMPT = "<|im_start|>user\nWhere is Brindlewick?<|im_end|>\n<|im_start|>assistant\n"


def write_f32_smol(path, arch="llama", qtype=None):
    """A random tied llama (2 layers, d_model 64) with SmolLM2's tokenizer keys, every tensor F32 (but
    blk.0.attn_q in ``qtype``, as zero blocks), under ``general.architecture`` ``arch``."""
    vocab = read_vocab(smollm2_path())
    c = ModelConfig(vocab_size=len(vocab.tokens), d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                    context_length=2048, rope_theta=100000.0, tie_embeddings=True)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny smol")
    add_llama_hparams(w, c)
    _write_vocab(w, vocab)
    for name, shape in c.param_shapes():
        a = np.ones(shape, np.float32) if len(shape) == 1 else (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if qtype is not None and name == "blk.0.attn_q.weight":  # raw blocks (zeros) of a type we may not read
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            w.add_tensor(name, np.zeros((shape[0], shape[1] // block * size), np.uint8), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)
    write_gguf(w)
    return path


@pytest.fixture(scope="module")
def f32_base(tmp_path_factory):
    return write_f32_smol(tmp_path_factory.mktemp("lora-base") / "tiny-smol-f32.gguf")


@pytest.fixture(scope="module")
def lora_run(f32_base, tmp_path_factory):
    d = tmp_path_factory.mktemp("lora-run")
    data = d / "data.json"
    data.write_text(json.dumps(DATA))
    out = d / "run"
    assert main(["train", "--base", str(f32_base), "--data", str(data), "--out", str(out), "--context-length", "64",
                 "--batch-size", "4", "-q", "--lora", "--lora-rank", "4", "--lora-alpha", "8", "--steps", "3",
                 "--pretrain-lr", "2e-2", "--tune-lr", "2e-2"]) == 0
    return out


def _ours(loaded, ids):
    import core.device

    dev = core.device.open_device(None)
    return Model(dev, loaded.config, batch_size=1, weights=loaded.base_weights, lora=loaded.lora,
                 adapter=loaded.adapter, training=False).logits(np.array([ids]))[0]


def test_lora_checkpoint_holds_only_the_adapters(lora_run, f32_base, capsys):
    meta = json.loads((lora_run / "config.json").read_text())
    assert meta["base"]["lora"] == {"rank": 4, "alpha": 8.0, "targets": ["attn_q", "attn_k", "attn_v", "attn_output",
                                                                         "ffn_gate", "ffn_up", "ffn_down"]}
    import hashlib

    assert meta["base"]["base_sha256"] == hashlib.sha256(f32_base.read_bytes()).hexdigest()
    ck = load_checkpoint(lora_run)
    with np.load(lora_run / "weights.npz") as z:
        assert sorted(z.files) == sorted(n for n, _ in adapter_shapes(ck.config, ck.lora))
    base = import_gguf(f32_base)
    for name, w in base.weights.items():  # the frozen base is the file's, bit for bit
        assert np.array_equal(ck.base_weights[name], w), name
    changed = [n for n in base.weights if not np.array_equal(ck.weights[n], base.weights[n])]
    assert len(changed) == 7 * 2  # every targeted matrix of both layers, nothing else
    assert main(["train", "--resume", str(lora_run), "--tune-steps", "4", "-q"]) == 0
    meta = json.loads((lora_run / "config.json").read_text())
    assert meta["adam_step"] == 7 and meta["base"]["lora"]["rank"] == 4


def test_adapter_gguf_logits_in_llama_cpp_equal_ours(lora_run, f32_base, tmp_path, capsys):
    ad = tmp_path / "adapter.gguf"
    assert main(["export", "--model", str(lora_run), "--adapter", "--modelfile", "--out", str(ad)]) == 0
    r = gguf.GGUFReader(ad)
    assert r.fields["general.type"].contents() == "adapter" and r.fields["adapter.type"].contents() == "lora"
    assert r.fields["adapter.lora.alpha"].contents() == pytest.approx(8.0)
    shapes = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in r.tensors}
    assert shapes["blk.0.attn_k.weight.lora_a"] == (4, 64) and shapes["blk.0.attn_k.weight.lora_b"] == (32, 4)
    assert not any(n.startswith(("output", "token_embd")) for n in shapes)
    del r
    mf = (tmp_path / "adapter.Modelfile").read_text()
    assert f"FROM {f32_base.resolve()}" in mf and "ADAPTER ./adapter.gguf" in mf
    assert "PARAMETER repeat_penalty 1" in mf.splitlines()  # Ollama's default is 1.1; the app's chat has none
    (tmp_path / "adapter.Modelfile").write_text(mf + "# my own line\n")  # an earlier export, edited: kept
    assert main(["export", "--model", str(lora_run), "--adapter", "--modelfile", "--out", str(ad)]) == 2
    assert (tmp_path / "adapter.Modelfile").read_text().endswith("# my own line\n")
    assert main(["export", "--model", str(lora_run), "--adapter", "--modelfile", "--out", str(ad), "--overwrite"]) == 0
    assert (tmp_path / "adapter.Modelfile").read_text() == mf
    into = tmp_path / "exports"  # a folder: the adapter goes inside it, named as the Export tab's "Both" names it
    into.mkdir()
    assert main(["export", "--model", str(lora_run), "--adapter", "--out", str(into)]) == 0
    assert [p.name for p in into.iterdir()] == [f"{lora_run.name}-lora.gguf"]
    capsys.readouterr()
    (tmp_path / "d.txt").write_text("The kettle costs forty dollars.\n")
    for cmd in (["train", "--base", str(ad), "--data", str(tmp_path / "d.txt"), "--out", str(tmp_path / "no")],
                ["chat", "--model", str(ad), "--prompt", "hi"]):  # the adapter given as a model: said so
        assert main(cmd) == 2
        assert "adapter.gguf: a LoRA adapter (general.type 'adapter'), not a model" in capsys.readouterr().err
    ck = load_checkpoint(lora_run)
    ids = ck.tokenizer.encode(PROMPT, parse_special=True)
    ours = _ours(ck, ids)
    llm = open_llama(f32_base, n_ctx=64, lora_path=str(ad))
    llm.eval(ids)
    theirs = np.array(llm.scores[:len(ids)])
    llm.close()
    plain = open_llama(f32_base, n_ctx=64)
    plain.eval(ids)
    base_logits = np.array(plain.scores[:len(ids)])
    plain.close()
    delta = float(np.abs(ours - theirs).max())
    print(f"llama.cpp adapter parity: max |delta| {delta:.2e}; the adapter moves logits by "
          f"{float(np.abs(theirs - base_logits).max()):.3f}")
    assert np.abs(theirs - base_logits).max() > 0.05  # the adapter matters
    assert delta <= 1e-3

    merged = tmp_path / "merged.gguf"
    assert main(["export", "--model", str(lora_run), "--out", str(merged)]) == 0
    llm = open_llama(merged, n_ctx=64)
    llm.eval(ids)
    np.testing.assert_allclose(np.array(llm.scores[:len(ids)]), ours, atol=1e-3, rtol=1e-3)
    llm.close()
    q8 = tmp_path / "merged-q8.gguf"
    assert main(["export", "--model", str(lora_run), "--dtype", "q8_0", "--out", str(q8)]) == 0
    assert {t.tensor_type for t in gguf.GGUFReader(q8).tensors} >= {gguf.GGMLQuantizationType.Q8_0}


def test_peft_folder_logits_in_transformers_equal_ours(lora_run, f32_base, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import LlamaForCausalLM

    pf, hf = tmp_path / "peft", tmp_path / "hf"
    assert main(["export", "--model", str(lora_run), "--adapter", "--format", "hf", "--out", str(pf)]) == 0
    assert main(["export", "--model", str(lora_run), "--adapter", "--format", "hf", "--out", str(pf)]) == 2
    assert main(["export", "--model", str(lora_run), "--adapter", "--format", "hf", "--out", str(pf), "--overwrite"]) == 0
    assert main(["export", "--model", str(f32_base), "--format", "hf", "--out", str(hf)]) == 0  # the base, as HF
    from transformers import AutoTokenizer

    ck = load_checkpoint(lora_run)
    ids = ck.tokenizer.encode(PROMPT, parse_special=True)
    assert AutoTokenizer.from_pretrained(hf)(PROMPT)["input_ids"] == ids  # SmolLM2's tokenizer, no BOS added
    base = LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(torch.tensor([ids])).logits[0].numpy()
        theirs = peft.PeftModel.from_pretrained(base, pf).eval()(torch.tensor([ids])).logits[0].numpy()
    ours = _ours(ck, ids)
    delta = float(np.abs(ours - theirs).max())
    print(f"PEFT parity: max |delta| {delta:.2e}; the adapter moves logits by {np.abs(theirs - plain).max():.3f}")
    assert delta <= 1e-4 and np.abs(theirs - plain).max() > 0.05


def test_bad_lora_input_is_one_line_and_writes_nothing(f32_base, lora_run, tmp_path, capsys):
    data = tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    other = write_f32_smol(tmp_path / "qwen.gguf", arch="qwen2")
    out = tmp_path / "never"
    args = ["--data", str(data), "--out", str(out), "--context-length", "64", "-q", "--lora"]
    assert main(["train", "--base", str(other), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(other) in err and "qwen2" in err
    q81 = write_f32_smol(tmp_path / "q81.gguf", qtype=gguf.GGMLQuantizationType.Q8_1)
    assert main(["train", "--base", str(q81), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(q81) in err and "blk.0.attn_q.weight" in err and "Q8_1" in err
    assert main(["train", "--base", str(f32_base), *args, "--lora-targets", "attn_q,lm_head"]) == 2
    assert "opencl-llm: error: --lora-targets: ['lm_head'] is not a list" in capsys.readouterr().err
    assert main(["train", "--base", str(f32_base), *args, "--lora-rank", "0"]) == 2
    assert "opencl-llm: error: --lora-rank: must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["train", *args]) == 2
    assert "--lora needs --base" in capsys.readouterr().err
    assert not out.exists()
    # an adapter of another base: the base file changed since training
    run = tmp_path / "run-copy"
    import shutil

    shutil.copytree(lora_run, run)
    moved = tmp_path / "base-copy.gguf"
    shutil.copy(f32_base, moved)
    meta = json.loads((run / "config.json").read_text())
    meta["base"]["base_model"] = str(moved)
    (run / "config.json").write_text(json.dumps(meta))
    with open(moved, "r+b") as fh:  # one byte of a tensor
        fh.seek(-5, 2)
        b = fh.read(1)
        fh.seek(-5, 2)
        fh.write(bytes([b[0] ^ 1]))
    target = tmp_path / "ad.gguf"
    assert main(["export", "--model", str(run), "--adapter", "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "base.base_sha256" in err and str(run / "config.json") in err
    assert not target.exists()
    assert main(["export", "--model", str(f32_base), "--adapter", "--out", str(target)]) == 2
    assert "not a LoRA checkpoint" in capsys.readouterr().err and not target.exists()


def test_an_export_never_replaces_the_base_file_the_model_reads(f32_base, lora_run, tmp_path, capsys):
    """`export --model LORA --out base.gguf --overwrite` replaced the base file the LoRA checkpoint reads its
    weights from (an earlier export of the app, so --overwrite allowed it): chat, export and resume of the
    checkpoint then all failed on the base's changed sha256. Refused now, as the adapter export is."""
    import shutil

    run, base = tmp_path / "run", tmp_path / "base.gguf"
    shutil.copytree(lora_run, run)
    shutil.copy(f32_base, base)
    meta = json.loads((run / "config.json").read_text())
    meta["base"]["base_model"] = str(base)
    (run / "config.json").write_text(json.dumps(meta))
    before = base.read_bytes()
    for extra in ([], ["--adapter"]):
        assert main(["export", "--model", str(run), *extra, "--out", str(base), "--overwrite"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is the base model this model was fine-tuned from" in err, err
    assert base.read_bytes() == before
    assert main(["export", "--model", str(run), "--out", str(tmp_path / "merged.gguf")]) == 0
