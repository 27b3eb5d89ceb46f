"""Our engine and llama.cpp (through llama-cpp-python) agree on an exported GGUF.

A tiny model (d_model 32, 2 layers, 4 query heads / 2 kv heads, 60 steps per stage on the default
dataset; :func:`tests.test_gguf.get_trained`) is exported as F32, F16 and Q8_0. llama.cpp must then
tokenize like us, compute the same logits at every position (F32), pick the same greedy tokens (all
three types), render our chat template to the same ids, and answer a chat question like ChatSession.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from core import chat_format
from core.chat import ChatSession
from core.checkpoint import load_model
from core.dataset import Dialogue
from core.generate import Generator, SamplingSettings
from core.model import Model
from tests.artifacts import no_extra_buffer_types
from tests.test_gguf import get_trained

N_CTX = 64  # = the model's context_length


@pytest.fixture(scope="module")
def trained(device, tmp_path_factory):
    return get_trained(device, tmp_path_factory)


def open_llama(path, kv_f32: bool = True) -> llama_cpp.Llama:
    # An F32 KV cache keeps llama.cpp's attention in float32 like ours (its default stores K/V as F16).
    kv = dict(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32) if kv_f32 else {}
    with no_extra_buffer_types():  # their AMX/repacked Q8_0 kernels crash on VMs that advertise AMX
        return llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True,
                               n_threads=2, n_threads_batch=2, seed=0, verbose=False, **kv)


@pytest.fixture(scope="module")
def llms(trained):
    out = {dt: open_llama(p) for dt, p in trained.gguf.items()}
    yield out
    for llm in out.values():
        llm.close()


@pytest.fixture(scope="module")
def generator(trained, device):
    """Our generator, on the weights read back from the F32 GGUF (so import is exercised too)."""
    loaded = load_model(trained.gguf["f32"])
    return Generator(device, loaded.config, loaded.weights), loaded.tokenizer


# ------------------------------------------------------------------------------------ tokenizer
TEXTS = [
    "Brindlewick is a small town built beside a slow green river.",
    "Hello world! How are you?",
    "café, naïve, résumé — Ünïcödé Straße",
    "emoji 🙂🚀 and 👍🏽 ok",
    "digits 12345 678 9 and 3.14159",
    "line one\r\nline two\r\n",
    "   leading spaces",
    "multiple    spaces  here  ",
    "tabs\tand\nnew\n\nlines\n",
    "don't you'll we've I'm it's",
    "中文 日本語 한국어",
    "<|eos|> is plain text here <|bos|>",
    "a\u00a0b",
    " ",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenization_matches(llms, trained, text):
    tok = trained.loaded.tokenizer
    got = llms["f32"].tokenize(text.encode("utf-8"), add_bos=False, special=False)
    assert got == tok.encode(text)
    assert llms["f32"].detokenize(got).decode("utf-8") == text


def test_tokenization_of_the_chat_format(llms, trained):
    tok = trained.loaded.tokenizer
    turns = [("Where is Brindlewick?", "Brindlewick is a small town built beside a slow green river."),
             ("And the bakery?", "It sells honey bread every Tuesday morning.")]
    for system, pending in ((None, None), ("Be brief.", "Who is the mayor?")):
        text = chat_format.render_text(turns, system, add_generation_prompt_for=pending)
        ours = tok.encode(text, parse_special=True)
        assert llms["f32"].tokenize(text.encode("utf-8"), add_bos=False, special=True) == ours
        if pending is None:
            assert ours == chat_format.encode_dialogue(tok, Dialogue(turns=turns, system=system))[0]
        else:
            assert ours == chat_format.prompt_ids(tok, turns, pending, system=system)
    # add_bos: the file says True, and llama.cpp adds exactly one BOS
    assert llms["f32"].tokenize(b"Hi", add_bos=True, special=False) == [tok.bos_id, *tok.encode("Hi")]


# ------------------------------------------------------------------------------------ logits
def long_prompt(trained, n: int = 60) -> list[int]:
    tok = trained.loaded.tokenizer
    ids = [tok.bos_id] + tok.encode(" ".join(trained.dataset.facts))
    assert len(ids) >= n
    return ids[:n]


def test_logits_match_every_position_f32(llms, trained, device, generator):
    ids = long_prompt(trained)
    loaded = trained.loaded
    ours = Model(device, loaded.config, batch_size=1, weights=loaded.weights, training=False).logits(np.array([ids]))[0]
    llm = llms["f32"]
    llm.reset()
    llm.eval(ids)
    theirs = np.array(llm.scores[:len(ids)], dtype=np.float32)
    assert theirs.shape == ours.shape
    err = np.abs(theirs - ours).max(axis=1)
    assert err.max() < 1e-3, f"max |diff| per position: {np.round(err, 6).tolist()}"
    assert np.abs(ours).max() > 1.0  # a trained model, not all-zero logits
    # the KV-cache path (prefill, then one token at a time) gives the same rows
    gen, _ = generator
    gen.reset()
    rows = [gen.feed(ids[:20])] + [gen.feed([t]) for t in ids[20:]]
    assert np.abs(np.array(rows) - theirs[19:]).max() < 1e-3


# ------------------------------------------------------------------------------------ greedy decoding
def ours_greedy(generator, prompt, n):
    gen, tok = generator
    toks, margins = [], []
    for t, p in gen.generate(prompt, SamplingSettings(temperature=0.0, max_tokens=n), stop_ids={tok.eos_id}):
        top2 = np.sort(p)[-2:]
        toks.append(t)
        margins.append(float(np.log(top2[1]) - np.log(max(top2[0], 1e-300))))
    return toks, margins


def llama_greedy(llm, prompt, n, eos):
    out = []
    for t in llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(t))
        if t == eos or len(out) == n:
            break
    return out


@pytest.mark.parametrize("dtype, tie_margin", [("f32", 0.0), ("f16", 0.05), ("q8_0", 0.3)])
def test_greedy_generation_matches(llms, trained, generator, dtype, tie_margin):
    """F32 must agree token for token. F16/Q8_0 round the weights, so they must agree up to the first step
    where our two best tokens are within ``tie_margin`` nats of each other (a near tie)."""
    tok = trained.loaded.tokenizer
    compared = 0
    for fact in trained.dataset.facts[:4]:
        prompt = [tok.bos_id] + tok.encode(" ".join(fact.split(" ")[:3]))
        n = 30
        ours, margins = ours_greedy(generator, prompt, n)
        theirs = llama_greedy(llms[dtype], prompt, n, tok.eos_id)
        if dtype == "f32":
            assert theirs == ours, f"prompt {tok.decode(prompt)!r}: ours {tok.decode(ours)!r}, llama.cpp {tok.decode(theirs)!r}"
            compared += len(ours)
            continue
        k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        if k < min(len(ours), len(theirs)):
            assert margins[k] < tie_margin, (f"{dtype}: token {k} differs ({ours[k]} vs {theirs[k]}) although "
                                             f"our margin is {margins[k]:.3f} nats")
        else:
            assert len(ours) == len(theirs)
        compared += k
    assert compared >= 40


# ------------------------------------------------------------------------------------ chat template
CONVERSATIONS = [
    ([{"role": "user", "content": "Where is Brindlewick?"}], True),
    ([{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Who is the mayor?"}], True),
    ([{"role": "user", "content": "Where is Brindlewick?"},
      {"role": "assistant", "content": "Beside a river."}], False),
]


@pytest.mark.parametrize("messages, gen_prompt", CONVERSATIONS)
def test_chat_template_renders_our_ids(llms, trained, messages, gen_prompt):
    llm, tok = llms["f32"], trained.loaded.tokenizer
    assert llm.metadata[gguf.Keys.Tokenizer.CHAT_TEMPLATE] == chat_format.CHAT_TEMPLATE
    assert llm.chat_format == "chat_template.default"  # llama-cpp-python picked up the file's template
    bos = llm._model.token_get_text(llm.token_bos())  # as llama-cpp-python does for the template
    eos = llm._model.token_get_text(llm.token_eos())
    fmt = Jinja2ChatFormatter(template=llm.metadata[gguf.Keys.Tokenizer.CHAT_TEMPLATE], eos_token=eos, bos_token=bos,
                              add_generation_prompt=gen_prompt)
    res = fmt(messages=messages)
    ids = llm.tokenize(res.prompt.encode("utf-8"), add_bos=not res.added_special, special=True)
    turns, system, pending = chat_format.messages_to_turns(messages)
    if gen_prompt:
        assert ids == chat_format.prompt_ids(tok, turns, pending, system=system)
    else:
        assert ids == chat_format.encode_dialogue(tok, Dialogue(turns=turns, system=system))[0]


@pytest.mark.parametrize("index", [0, 5])
def test_chat_completion_answers_like_chat_session(llms, trained, generator, index):
    gen, tok = generator
    question = trained.dataset.dialogues[index].turns[0][0]
    ours = ChatSession(gen, tok).answer(question, SamplingSettings(temperature=0.0, max_tokens=40))
    resp = llms["f32"].create_chat_completion(
        messages=[{"role": "user", "content": question}], temperature=0.0, repeat_penalty=1.0, max_tokens=40,
        stop=["\nUser:", "User:"])
    assert resp["choices"][0]["message"]["content"].strip() == ours
    assert ours  # the model says something
