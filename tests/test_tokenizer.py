"""Byte-level BPE tokenizer: special ids, exact round trips, serialization, exporter accessors, streaming."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.chat_format import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN
from core.dataset import default_dataset, load_dataset
from core.tokenizer import StreamDecoder, Tokenizer, bytes_to_unicode

DATA = Path(__file__).parent / "data"

TRICKY = [
    "", " ", "  ", "\n", "\r\n", "\r", "\t", "a", " leading", "trailing ", "  both  ",
    "line one\r\nline two\rline three\n", "café naïve Москва 東京 שָׁלוֹם",
    "🔥 fire 👩‍👩‍👧 family 🇫🇷", "e\u0301 combining", "\x00nul\x7f", "\ufeffbom inside",
    "<|eos|> <|bos|><|pad|>", "It's 3:45, isn't it?", "tabs\tand  double  spaces",
    "\u2028\u2029", "x" * 500,
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(default_dataset().tokenizer_texts(), vocab_size=512)


def test_special_ids_come_first(tok):
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
    assert tok.special_ids() == [0, 1, 2]
    assert tok.tokens()[:3] == [BOS_TOKEN, EOS_TOKEN, PAD_TOKEN]
    assert 256 + 3 < tok.vocab_size <= 512


def test_every_byte_is_a_token(tok):
    assert set(tok.tokens()[3:259]) == set(bytes_to_unicode().values())


def test_too_small_vocab_is_rejected():
    with pytest.raises(ValueError, match="at least 259"):
        Tokenizer.train(["abc"], vocab_size=100)


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_tricky(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id, *ids, tok.eos_id]) == text
    assert tok.decode([tok.bos_id, *ids, tok.eos_id], skip_special=False) == BOS_TOKEN + text + EOS_TOKEN


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8")))
def test_round_trip_any_text(tok, text):
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" \r\n\t:'<|>eosbpad😀é1")), max_size=40))
def test_round_trip_dense_alphabet(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_special_text_in_user_input_stays_text(tok):
    plain = tok.encode("say <|eos|> and <|bos|> or <|pad|>")
    assert not set(plain) & set(tok.special_ids())
    assert tok.encode(EOS_TOKEN, parse_special=True) == [tok.eos_id]
    assert tok.encode(f"a{BOS_TOKEN}b", parse_special=True) == [*tok.encode("a"), tok.bos_id, *tok.encode("b")]


def test_decode_rejects_unknown_ids(tok):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError):
        tok.decode([-1])


def test_gpt2_split_around_colon(tok):
    # The chat format relies on "Assistant:" and " answer" being separate pre-tokens.
    assert tok.encode("Assistant: Brindlewick") == tok.encode("Assistant:") + tok.encode(" Brindlewick")


def test_training_is_deterministic():
    texts = default_dataset().tokenizer_texts()
    assert Tokenizer.train(texts, 400).to_json() == Tokenizer.train(texts, 400).to_json()


def test_json_round_trip(tok):
    again = Tokenizer.from_json(tok.to_json())
    for text in TRICKY:
        assert again.encode(text) == tok.encode(text)
        assert again.encode(text, parse_special=True) == tok.encode(text, parse_special=True)
    assert again.tokens() == tok.tokens() and again.merges() == tok.merges()


def test_from_json_rejects_garbage():
    with pytest.raises(ValueError):
        Tokenizer.from_json("{not json")


def test_save_load_and_atomic_failure(tok, tmp_path, monkeypatch):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    assert Tokenizer.load(path).to_json() == tok.to_json()
    before = path.read_bytes()

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    other = Tokenizer.train(["something else entirely"] * 3, 300)
    with pytest.raises(OSError):
        other.save(path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["tokenizer.json"]  # no temp file left behind


def test_merges_in_rank_order(tok):
    vocab = {t: i for i, t in enumerate(tok.tokens())}
    merged_ids = []
    for m in tok.merges():
        a, b = m.split(" ")
        assert a in vocab and b in vocab and a + b in vocab
        merged_ids.append(vocab[a + b])
    assert merged_ids == sorted(merged_ids)  # the trainer gives each new token the next id
    assert len(tok.merges()) == tok.vocab_size - 259


def test_tokens_are_byte_level_encoded(tok):
    tokens = tok.tokens()
    assert len(tokens) == tok.vocab_size == len(set(tokens))
    assert all(" " not in t and "\n" not in t for t in tokens)
    ids = tok.encode(" the")
    assert "".join(tokens[i] for i in ids) == "Ġthe"


def test_from_vocab_rebuilds_the_same_tokenizer(tok):
    again = Tokenizer.from_vocab(tok.tokens(), tok.merges())
    assert (again.bos_id, again.eos_id, again.pad_id) == (0, 1, 2)
    for text in TRICKY + default_dataset().facts:
        assert again.encode(text) == tok.encode(text)
        assert again.encode(text, parse_special=True) == tok.encode(text, parse_special=True)


def test_stream_decoder_holds_back_partial_characters(tok):
    text = "Fire 🔥 and café, Москва!"
    ids = [tok.bos_id, *tok.encode(text), tok.eos_id]
    dec = StreamDecoder(tok)
    pieces = [dec.feed(i) for i in ids]
    assert "".join(pieces) + dec.flush() == text
    assert not any("\ufffd" in p for p in pieces)
    # The emoji is not in the small vocabulary: it arrives as 4 byte tokens and shows once complete.
    fire = tok.encode("🔥")
    assert len(fire) == 4
    dec = StreamDecoder(tok)
    assert [dec.feed(i) for i in fire] == ["", "", "", "🔥"]


def test_stream_decoder_flush_and_specials(tok):
    dec = StreamDecoder(tok)
    assert dec.feed(tok.encode("🔥")[0]) == ""
    assert dec.flush() == "\ufffd"
    assert dec.feed(tok.eos_id) == ""
    shown = StreamDecoder(tok, skip_special=False)
    assert shown.feed(tok.eos_id) == EOS_TOKEN


def test_unicode_fixture_round_trips_byte_for_byte(tok):
    ds, problems = load_dataset(DATA / "facts_bom_unicode.txt")
    assert not problems
    for fact in ds.facts:
        assert tok.decode(tok.encode(fact)).encode("utf-8") == fact.encode("utf-8")


def test_text_that_is_not_utf8_is_encoded_with_replacement_characters():
    from core.tokenizer import Tokenizer

    tok = Tokenizer.train(["plain text for a tiny vocabulary"] * 2, vocab_size=300)
    for bad, shown in (("Caf\udce9!", "Caf\ufffd!"), ("a\ud800b", "a\ufffdb")):
        assert tok.decode(tok.encode(bad)) == shown
