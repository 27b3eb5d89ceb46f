"""The chat format: exact text, loss mask, segment-wise == whole-string tokenization, Jinja template."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError

from core import chat_format as cf
from core.chat_format import BOS_TOKEN, EOS_TOKEN, SPECIAL_TOKENS
from core.dataset import Dialogue, default_dataset
from core.tokenizer import Tokenizer

TRICKY = [
    "", " ", "  x  ", ":", ": colon first", "'s contraction", "'ll", "123 numbers", "\n", "a\nb",
    "line\r\nbreak", "tab\tin", "Assistant: inside", "User: inside\nAssistant:", "🔥 emoji", "Москва",
    "ends with colon:", "ends with newline\n", "  leading", "trailing   ", "?!", "<| almost |>", "<|eos",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(default_dataset().tokenizer_texts(), vocab_size=512)


def test_rendered_text_is_exactly_the_format():
    turns = [("Hi there?", "Hello."), ("Bye", "See you.")]
    assert cf.render_text(turns, system="Be brief.") == (
        "<|bos|>System: Be brief.\nUser: Hi there?\nAssistant: Hello.<|eos|>User: Bye\nAssistant: See you.<|eos|>")
    assert cf.render_text(turns[:1], add_generation_prompt_for="Again?") == (
        "<|bos|>User: Hi there?\nAssistant: Hello.<|eos|>User: Again?\nAssistant:")
    assert cf.render_text([], system="", add_generation_prompt_for="Q") == "<|bos|>User: Q\nAssistant:"


def test_segments_roles_and_specials():
    segs = cf.render_segments([("Q", "A")], system="S")
    assert segs == [
        (BOS_TOKEN, True, "bos"), ("System: S\n", False, "system"), ("User: Q\n", False, "user"),
        ("Assistant:", False, "assistant_header"), (" A", False, "assistant"), (EOS_TOKEN, True, "assistant"),
    ]


def test_loss_mask_covers_answers_and_their_eos(tok):
    d = Dialogue([("Where is Brindlewick?", "Beside a river."), ("Really?", "Yes.")], system="Be brief.")
    ids, mask = cf.encode_dialogue(tok, d)
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    assert ids[0] == tok.bos_id and mask[0] == 0
    assert ids[-1] == tok.eos_id and mask[-1] == 1
    learned = tok.decode([i for i, m in zip(ids, mask) if m], skip_special=False)
    assert learned == " Beside a river.<|eos|> Yes.<|eos|>"
    prompt = tok.decode([i for i, m in zip(ids, mask) if not m], skip_special=False)
    assert prompt == "<|bos|>System: Be brief.\nUser: Where is Brindlewick?\nAssistant:User: Really?\nAssistant:"


def _assert_segmentwise_equals_whole(tok, turns, system):
    ids, mask = cf.encode_dialogue(tok, Dialogue(turns, system))
    assert ids == tok.encode(cf.render_text(turns, system), parse_special=True)
    assert tok.decode(ids, skip_special=False) == cf.render_text(turns, system)
    assert ids.count(tok.eos_id) == len(turns) and ids.count(tok.bos_id) == 1


def test_segmentwise_equals_whole_on_default_dataset(tok):
    for d in default_dataset().dialogues:
        _assert_segmentwise_equals_whole(tok, d.turns, d.system)


@pytest.mark.parametrize("text", TRICKY)
def test_segmentwise_equals_whole_on_tricky_strings(tok, text):
    _assert_segmentwise_equals_whole(tok, [(text, text)], text)
    _assert_segmentwise_equals_whole(tok, [("Q", text), (text, "A")], None)


_no_specials = st.text(alphabet=st.sampled_from(list(" \r\n\t:'<|>eosAU😀é1.?")) | st.characters(codec="utf-8"),
                       max_size=25).filter(lambda s: not any(t in s for t in SPECIAL_TOKENS))
_turns = st.lists(st.tuples(_no_specials, _no_specials), min_size=0, max_size=3)


@settings(max_examples=150, deadline=None)
@given(_turns, st.none() | _no_specials)
def test_segmentwise_equals_whole_any_text(tok, turns, system):
    _assert_segmentwise_equals_whole(tok, turns, system)


def test_special_text_in_content_is_not_special(tok):
    ids, _ = cf.encode_dialogue(tok, Dialogue([("say <|eos|>", "<|bos|> no")]))
    assert ids.count(tok.eos_id) == 1 and ids.count(tok.bos_id) == 1
    p = cf.prompt_ids(tok, [], "<|eos|><|bos|>")
    assert p.count(tok.eos_id) == 0 and p.count(tok.bos_id) == 1


def test_encode_fact(tok):
    assert cf.encode_fact(tok, "Iron is a metal.") == [tok.bos_id, *tok.encode("Iron is a metal."), tok.eos_id]
    assert cf.encode_fact(tok, "") == [tok.bos_id, tok.eos_id]


def test_prompt_plus_answer_equals_training_sequence(tok):
    history = [("Where is Brindlewick?", "Beside a slow green river.")]
    question, answer = "Can penguins fly?", "No, penguins cannot fly."
    p = cf.prompt_ids(tok, history, question, system="Be brief.")
    assert tok.decode(p, skip_special=False) == cf.render_text(history, "Be brief.", add_generation_prompt_for=question)
    assert tok.decode(p[-3:], skip_special=False).endswith("Assistant:")
    full, mask = cf.encode_dialogue(tok, Dialogue(history + [(question, answer)], "Be brief."))
    assert full == p + tok.encode(" " + answer) + [tok.eos_id]
    assert mask[len(p) - 1] == 0 and all(mask[len(p):])


def _messages(turns, system, pending):
    msgs = [{"role": "system", "content": system}] if system is not None else []
    for u, a in turns:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    if pending is not None:
        msgs.append({"role": "user", "content": pending})
    return msgs


@pytest.mark.parametrize("system", [None, "", "Be brief.", "multi\nline"])
@pytest.mark.parametrize("n_turns", [0, 1, 3])
def test_chat_template_matches_renderer(system, n_turns):
    turns = [(f"Question {i}?", f"Answer {i}.") for i in range(n_turns)]
    if n_turns:
        assert cf.render_chat_template(_messages(turns, system, None), False) == cf.render_text(turns, system)
    assert cf.render_chat_template(_messages(turns, system, "Next?"), True) == cf.render_text(
        turns, system, add_generation_prompt_for="Next?")


@settings(max_examples=150, deadline=None)
@given(_turns, st.none() | _no_specials, st.none() | _no_specials)
def test_chat_template_matches_renderer_any_text(turns, system, pending):
    msgs = _messages(turns, system, pending)
    assert cf.messages_to_turns(msgs) == (turns, system, pending)
    expected = cf.render_text(turns, system, add_generation_prompt_for=pending)
    assert cf.render_chat_template(msgs, add_generation_prompt=pending is not None) == expected


def test_chat_template_rejects_unknown_role():
    with pytest.raises(TemplateError, match="Unknown role"):
        cf.render_chat_template([{"role": "narrator", "content": "x"}], False)


@pytest.mark.parametrize("msgs", [
    [{"role": "user", "content": "a"}, {"role": "system", "content": "s"}],
    [{"role": "assistant", "content": "a"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "tool", "content": "a"}],
    [{"role": "user", "content": ["a"]}],
])
def test_messages_to_turns_rejects_bad_lists(msgs):
    with pytest.raises(ValueError):
        cf.messages_to_turns(msgs)


def test_ollama_template_and_stop_strings():
    t = cf.OLLAMA_TEMPLATE
    assert "{{ .System }}" in t and "range .Messages" in t
    assert 'User: {{ .Content }}\nAssistant:' in t and ' {{ .Content }}<|eos|>' in t
    assert t.count("{{") == t.count("}}")
    assert cf.STOP_STRINGS[0] == EOS_TOKEN and "User:" in cf.STOP_STRINGS
