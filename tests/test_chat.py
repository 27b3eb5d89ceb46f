"""ChatSession: streamed pieces line up with tokens, stop strings are cut, history and context."""
from __future__ import annotations

import numpy as np
import pytest

from core.chat import ChatSession
from core.config import ModelConfig
from core.generate import ContextFullError, SamplingSettings
from core.tokenizer import Tokenizer


class ScriptedGenerator:
    """Test double for core.generate.Generator: yields a fixed token sequence."""

    def __init__(self, script: list[int], vocab: int, context_length: int = 256):
        self.script, self.vocab = script, vocab
        self.config = ModelConfig(vocab_size=vocab, context_length=context_length)
        self.prompts = []

    def generate(self, prompt_ids, settings, stop_ids=None):
        self.prompts.append(list(prompt_ids))
        for t in self.script[: settings.max_tokens]:
            p = np.full(self.vocab, 0.1 / (self.vocab - 1))
            p[t] = 0.9
            yield t, p
            if stop_ids and t in stop_ids:
                return


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(["The heron fishes under the bridge. User: Assistant: café 🔥 ok"] * 3, vocab_size=400)


def run(tok, text, eos=True, **kw):
    script = tok.encode(text) + ([tok.eos_id] if eos else [])
    gen = ScriptedGenerator(script, tok.vocab_size, **kw)
    session = ChatSession(gen, tok)
    return session, gen, list(session.ask("Who fishes?", SamplingSettings(max_tokens=200)))


def test_pieces_are_the_tokens_and_join_to_the_answer(tok):
    session, gen, pieces = run(tok, " The heron fishes under the bridge.")
    assert [p.token_id for p in pieces] == tok.encode(" The heron fishes under the bridge.")
    for p in pieces:
        assert p.text == tok.decode([p.token_id]) and p.prob == pytest.approx(0.9)
        assert p.alternatives[0] == (tok.decode([p.token_id], skip_special=False), pytest.approx(0.9))
    assert "".join(p.text for p in pieces) == " The heron fishes under the bridge."
    assert session.history == [("Who fishes?", "The heron fishes under the bridge.")]


def test_a_new_user_turn_is_cut_and_not_shown(tok):
    session, _, pieces = run(tok, " The heron fishes.\nUser: Assistant:", eos=False)
    assert "".join(p.text for p in pieces) == " The heron fishes."
    assert session.history[-1][1] == "The heron fishes."


def test_multibyte_characters_stream_whole(tok):
    _, _, pieces = run(tok, " café 🔥 ok")
    assert "".join(p.text for p in pieces) == " café 🔥 ok"
    assert all("\ufffd" not in p.text for p in pieces)


def test_history_goes_into_the_next_prompt_and_clear_forgets(tok):
    session, gen, _ = run(tok, " The heron.")
    list(session.ask("And then?", SamplingSettings(max_tokens=5)))
    assert len(gen.prompts[1]) > len(gen.prompts[0])
    session.clear()
    list(session.ask("Who fishes?", SamplingSettings(max_tokens=5)))
    assert gen.prompts[2] == gen.prompts[0]


def test_empty_and_too_long_messages_are_refused(tok):
    session, _, _ = run(tok, " ok", context_length=24)
    with pytest.raises(ValueError, match="empty"):
        list(session.ask("   ", SamplingSettings()))
    with pytest.raises(ContextFullError, match="context_length"):
        list(session.ask("fishes " * 40, SamplingSettings()))


def test_old_turns_slide_out_of_a_full_context(tok):
    session, gen, _ = run(tok, " ok", context_length=40)
    for _ in range(6):
        list(session.ask("The heron fishes under the bridge", SamplingSettings(max_tokens=3)))
    assert max(len(p) for p in gen.prompts) < 40
