"""Fine-tuning an imported GGUF model: ``opencl-llm train --base``, checkpoints and resume, gradient
accumulation, frozen embeddings, export back to GGUF (tied stays tied) with llama.cpp logit parity.

By default on a tiny llama written here with SmolLM2's own vocabulary and ChatML template (d_model 64);
the same on SmolLM2-135M itself is a slow test.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import gguf
from core.checkpoint import load_checkpoint
from core.cli import main
from core.config import ModelConfig
from core.from_base import GENERAL_QUESTIONS
from core.gguf_import import import_gguf
from core.gguf_io import _write_vocab
from core.gguf_import import read_vocab
from core.gguf_tokenizer import GGUFTokenizer
from core.model import Model
from tests.artifacts import add_llama_hparams, open_llama, smollm2_path, write_gguf

DATA = {"facts": ["Brindlewick is a small town built beside a slow green river.",
                  "The mayor of Brindlewick keeps forty beehives."],
        "dialogues": [{"turns": [{"user": "Where is Brindlewick?",
                                  "assistant": "Brindlewick is beside a slow green river."}]},
                      {"turns": [{"user": "How many beehives does the mayor keep?", "assistant": "Forty."}]}]}


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return write_tiny_smol(tmp_path_factory.mktemp("base") / "tiny-smol.gguf")


def write_tiny_smol(path):
    """A random tied llama (2 layers, d_model 64) with SmolLM2's tokenizer keys, F32 and Q8_0 tensors."""
    vocab = read_vocab(smollm2_path())
    c = ModelConfig(vocab_size=len(vocab.tokens), d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                    context_length=2048, rope_theta=100000.0, tie_embeddings=True)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny smol")
    add_llama_hparams(w, c)
    w.add_key_value(gguf.Keys.General.LICENSE, "apache-2.0", gguf.GGUFValueType.STRING)
    _write_vocab(w, vocab)
    for name, shape in c.param_shapes():
        if len(shape) == 1:
            w.add_tensor(name, np.ones(shape, np.float32))
        else:
            a = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            q = name.endswith("ffn_up.weight")
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0) if q else a,
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0 if q else None)
    write_gguf(w)
    return path


def train_base(base, out, data_path, *extra):
    return main(["train", "--base", str(base), "--data", str(data_path), "--out", str(out), "--context-length", "64",
                 "--batch-size", "4", "-q", *extra])


def test_finetune_resume_export_and_llama_cpp_parity(tiny_base, tmp_path, capsys):
    data = tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    out = tmp_path / "run"
    assert train_base(tiny_base, out, data, "--steps", "3", "--grad-accum", "2", "--pretrain-lr", "3e-3",
                      "--tune-lr", "3e-3") == 0
    printed = capsys.readouterr().out
    assert "memory: about" in printed and "its own chat template" in printed
    ck = load_checkpoint(out)
    assert isinstance(ck.tokenizer, GGUFTokenizer) and ck.config.tie_embeddings
    assert ck.config.context_length == 64 and "output.weight" not in ck.weights
    meta = json.loads((out / "config.json").read_text())
    assert meta["train"]["grad_accum"] == 2 and meta["base"]["gguf_context_length"] == 2048
    base = import_gguf(tiny_base)
    assert not np.array_equal(ck.weights["token_embd.weight"], base.weights["token_embd.weight"])

    assert main(["train", "--resume", str(out), "-q"]) == 0  # resumes with the GGUF vocabulary and base keys
    meta = json.loads((out / "config.json").read_text())
    assert meta["adam_step"] == 6 and meta["base"]["gguf_context_length"] == 2048
    assert meta["base"]["base_model"].endswith(".gguf")

    gg = tmp_path / "tuned.gguf"
    assert main(["export", "--model", str(out), "--out", str(gg)]) == 0
    r = gguf.GGUFReader(gg)
    names = {t.name for t in r.tensors}
    fields = {k: f for k, f in r.fields.items()}
    assert "output.weight" not in names and "token_embd.weight" in names
    K = gguf.Keys
    assert bytes(fields[K.Tokenizer.PRE].parts[-1]).decode() == "smollm"
    assert int(fields[K.LLM.CONTEXT_LENGTH.format(arch="llama")].parts[-1][0]) == 2048
    assert bytes(fields[K.General.LICENSE].parts[-1]).decode() == "apache-2.0"
    assert "<|im_start|>" in bytes(fields[K.Tokenizer.CHAT_TEMPLATE].parts[-1]).decode()

    back = import_gguf(gg)
    ck = load_checkpoint(out)
    assert all(np.array_equal(back.weights[k], ck.weights[k]) for k in ck.weights)
    tok = back.tokenizer
    ids = tok.encode("<|im_start|>user\nWhere is Brindlewick?<|im_end|>\n<|im_start|>assistant\n", parse_special=True)
    import core.device

    dev = core.device.open_device(None)
    ours = Model(dev, ck.config, batch_size=1, weights=ck.weights, training=False).logits(np.array([ids]))[0]
    llm = open_llama(gg, n_ctx=64)
    llm.eval(ids)
    theirs = np.array(llm.scores[:len(ids)])
    llm.close()
    np.testing.assert_allclose(ours, theirs, atol=1e-3, rtol=1e-3)


def test_a_resumed_finetune_counts_the_general_questions_apart(tiny_base, tmp_path, capsys):
    """The base's answers to the general questions are dialogues of the saved dataset; a resumed run counted them
    as the user's answers ("8 of 12 answers" for a dataset of 2 dialogues) and said nothing of them. config.json
    now records which they are (base.general_replay), and a resume counts them apart as the run it continues did."""
    data = tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    out = tmp_path / "run"
    assert train_base(tiny_base, out, data, "--steps", "2") == 0
    replay = json.loads((out / "config.json").read_text())["base"]["general_replay"]
    assert replay["first_dialogue"] == 2 and len(replay["questions"]) + len(replay["unfinished"]) == len(GENERAL_QUESTIONS)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--tune-steps", "3"]) == 0
    printed = capsys.readouterr().out
    assert "general questions: " in printed and " of 2 answers" in printed, printed[-600:]
    assert ", general questions " in next(ln for ln in printed.splitlines() if ln.startswith("dialogues done"))


def test_frozen_embeddings_stay_as_the_base(tiny_base, tmp_path, capsys):
    data = tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    out = tmp_path / "frozen"
    assert train_base(tiny_base, out, data, "--steps", "2", "--freeze-embeddings") == 0
    assert "embeddings frozen" in capsys.readouterr().out
    ck, base = load_checkpoint(out), import_gguf(tiny_base)
    assert np.array_equal(ck.weights["token_embd.weight"], base.weights["token_embd.weight"])
    assert not np.array_equal(ck.weights["blk.0.attn_q.weight"], base.weights["blk.0.attn_q.weight"])


def test_a_finetune_stops_at_its_time_budget(tiny_base, tmp_path, capsys):
    """``--time-budget`` with ``--base`` was ignored (a new user's 3 s budget ran all its steps); it now ends
    each stage at its share of the budget, and config.json records it."""
    import time

    out, data = tmp_path / "tuned", tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    t0 = time.perf_counter()
    assert train_base(tiny_base, out, data, "--steps", "100000", "--time-budget", "0.05") == 0
    assert time.perf_counter() - t0 < 120
    meta = json.loads((out / "config.json").read_text())
    assert meta["train"]["time_budget_s"] == pytest.approx(3.0)
    assert 0 < meta["adam_step"] < 1000  # the steps it took (a stage ended early counts as done)


def test_a_finetune_gets_the_auto_data_mix(tiny_base, tmp_path, capsys):
    """A fine-tune used to get none of the Auto plan's data mix, so it learned to answer the dialogues' questions
    and not questions about facts no dialogue asks about (a new user's LoRA answered 1 of 6 such facts; measured
    on generated datasets in benchmarks/learn_finetune.py). Where its facts outnumber its dialogues it now gets
    core.plan.data_mix, counted with the base's tokenizer: questions mixed into the facts' stage, a question
    written for each fact without one; elsewhere nothing changes."""
    facts = [f"{town} has {n} bridges." for town, n in (("Brindlewick", 3), ("Marrowby", 5), ("Tansford", 7))]
    facts += [f"The mayor of {town} keeps {n} beehives." for town, n in (("Brindlewick", 40), ("Marrowby", 12),
                                                                        ("Tansford", 9))]
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"facts": facts, "dialogues": [
        {"turns": [{"user": "How many bridges does Brindlewick have?", "assistant": "Brindlewick has 3 bridges."}]},
        {"turns": [{"user": "How many beehives does the mayor of Marrowby keep?",
                    "assistant": "The mayor of Marrowby keeps 12 beehives."}]}]}))
    for extra, replay in (((), 0.5), (("--replay-share", "0.2"), 0.2)):
        out = tmp_path / f"mixed{replay}"
        assert train_base(tiny_base, out, data, "--steps", "1", *extra) == 0
        train = json.loads((out / "config.json").read_text())["train"]
        assert (train["fact_questions"], train["mix_share"], train["conversation_every"]) == (1, 0.5, 2)
        assert train["replay_share"] == replay  # the user's --replay-share is kept
    # every fact with its dialogue: no mix (it would write no question; only its cost would remain)
    data.write_text(json.dumps(DATA))
    assert train_base(tiny_base, tmp_path / "plain", data, "--steps", "1") == 0
    train = json.loads((tmp_path / "plain" / "config.json").read_text())["train"]
    assert (train["fact_questions"], train["mix_share"], train["conversation_every"], train["replay_share"]) == \
        (0, 0.0, 0, 0.25)
    capsys.readouterr()


def test_base_refuses_architecture_options(tiny_base, tmp_path, capsys):
    data = tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    assert train_base(tiny_base, tmp_path / "x", data, "--d-model", "128") == 2
    assert "--d-model: the --base model fixes the architecture" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_learns_a_fact_it_cannot_know(tmp_path, capsys):
    """End to end on SmolLM2-135M (about 9 minutes on 2 PoCL cores): before, it does not know where
    Brindlewick is; after 20 + 20 steps it answers in our chat and, from the exported file, in llama.cpp
    with the same template and the same words."""
    import core.device
    from core.chat import ChatSession
    from core.generate import Generator, SamplingSettings
    from core.gguf_io import export_gguf
    from tests.artifacts import llama_greedy
    from tests.test_chat_template import llama_cpp_prompt

    question = "Where is Brindlewick?"
    settings = SamplingSettings(temperature=0.0, max_tokens=24)
    dev = core.device.open_device(None)
    base = import_gguf(smollm2_path())
    before = ChatSession(Generator(dev, base.config, base.weights), base.tokenizer).answer(question, settings)
    assert "green river" not in before.lower()

    data = tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    out = tmp_path / "smol"
    assert train_base(smollm2_path(), out, data, "--steps", "20", "--pretrain-lr", "3e-4", "--tune-lr", "3e-4") == 0
    ck = load_checkpoint(out)
    after = ChatSession(Generator(dev, ck.config, ck.weights), ck.tokenizer).answer(question, settings)
    print(f"before: {before!r}\nafter: {after!r}")
    assert "green river" in after.lower()

    gg = export_gguf(ck, tmp_path / "smol-tuned.gguf", dtype="f32").path
    tok = ck.tokenizer
    llm = open_llama(gg, n_ctx=128)
    prompt = llama_cpp_prompt(tok, [{"role": "user", "content": question}])
    ids = llama_greedy(llm, llm.tokenize(prompt.encode(), add_bos=False, special=True), 24)
    llm.close()
    end = ids.index(tok.eos_id) if tok.eos_id in ids else len(ids)
    assert tok.decode(ids[:end]).strip() == after


def test_compare_shows_base_and_tuned_answers(tiny_base, tmp_path, capsys):
    data = tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    out = tmp_path / "cmp"
    assert train_base(tiny_base, out, data, "--steps", "2") == 0
    capsys.readouterr()
    assert main(["compare", "--model", str(out), "--max-tokens", "4"]) == 0
    text = capsys.readouterr().out
    # 2 dataset questions, the general ones (replayed in training too: listed once, as general)
    assert text.count("  before: ") == text.count("  after:  ") == 2 + len(GENERAL_QUESTIONS)
    assert "[dataset] Where is Brindlewick?  (taught: Brindlewick is beside a slow green river.)" in text


def test_fact_recall_prompts_begin_as_the_facts_were_trained(tiny_base):
    """SmolLM2's file adds no BOS: a fact is trained without one, so its recall prompt has none either
    (core.chat_format.fact_prompt_ids); the prompt is the start of the trained row."""
    from core import chat_format
    from core.dataset import Dataset
    from core.recall import recall_prompts

    tok = import_gguf(tiny_base).tokenizer
    assert not tok.add_bos
    facts = DATA["facts"]
    prompts = recall_prompts(tok, Dataset(facts=facts), 64, ("fact",))
    assert len(prompts) == len(facts)
    for p in prompts:
        assert p.ids[0] != tok.bos_id and chat_format.encode_fact(tok, facts[p.index])[:len(p.ids)] == p.ids


def test_a_fact_of_an_imported_model_ends_with_its_eos(tiny_base):
    """A file that adds no EOS to plain text (SmolLM2's) still trains each fact with its end: without it the
    model ran every taught fact on into made-up text and the pretraining check read 0 of 5 facts."""
    from core import chat_format

    tok = import_gguf(tiny_base).tokenizer
    assert not tok.add_eos
    for fact in DATA["facts"]:
        ids = chat_format.encode_fact(tok, fact)
        assert ids[-1] == tok.eos_id and ids.count(tok.eos_id) == 1
        assert ids[:-1] == tok.encode(fact, parse_special=False, add_special=True)
