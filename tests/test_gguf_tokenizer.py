"""Tokenizers read from GGUF files tokenize exactly as llama.cpp.

References: llama.cpp's own vocab test files (``ggml-vocab-*.gguf`` with ``.inp``/``.out`` expected ids,
from the llama-cpp-python sdist; tests/artifacts.py downloads them into a cache) and llama-cpp-python's
``Llama(vocab_only=True).tokenize`` on awkward strings.
"""
from __future__ import annotations

import pytest

from core.gguf_import import read_vocab
from core.gguf_tokenizer import GGUFTokenizer, UnsupportedTokenizer, tokenizer_from_json
from tests.artifacts import read_vocab_tests, smollm2_path, vocab_dir

SUPPORTED = ["gpt-2", "llama-spm", "phi-3", "mpt", "starcoder", "refact", "qwen2", "qwen35", "llama-bpe", "command-r"]
"""Every vocab file with .inp/.out whose tokenizer we support (all of them reproduce their .out)."""

REFUSED = {"bert-bge": "'bert'", "nomic-bert-moe": "'t5'", "gemma-4": "'gemma4'",
           "deepseek-coder": "'deepseek-coder'", "falcon": "'falcon'", "aquila": "(none: default)"}

_cache: dict[str, GGUFTokenizer] = {}


def vocab_tokenizer(name: str) -> GGUFTokenizer:
    if name not in _cache:
        _cache[name] = GGUFTokenizer(read_vocab(vocab_dir() / f"ggml-vocab-{name}.gguf"))
    return _cache[name]


@pytest.mark.parametrize("name", SUPPORTED)
def test_vocab_file_reproduces_llama_cpp_ids(name):
    tok = vocab_tokenizer(name)
    cases = read_vocab_tests(vocab_dir() / f"ggml-vocab-{name}.gguf")
    assert len(cases) >= 40
    wrong = [(text, want, tok.encode(text)) for text, want in cases if tok.encode(text) != want]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]!r}"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_vocab_is_refused_by_name(name):
    with pytest.raises(UnsupportedTokenizer) as e:
        read_vocab(vocab_dir() / f"ggml-vocab-{name}.gguf")
    msg = str(e.value)
    assert REFUSED[name] in msg and "\n" not in msg and f"ggml-vocab-{name}.gguf" in msg


AWKWARD = [
    "Hello world", "  leading", "trailing   ", "a\n\n\nb", "\t\ttabs", "12345678901234", "3.14159 1,000,000",
    "café naïve Ünïcödé", "🙂🚀👍🏽", "中文 日本語 한국어", "don't I'M we'VE", "line\r\nline", "a\u00a0b\u2003c",
    "   ", "\n", "x" * 300, "<0x0A>", "\u2581hello", "\u0120world", "",
    "<|im_start|>user\nHi<|im_end|>\n", "<s>[INST] hi [/INST]</s>", "<|endoftext|>x<|endoftext|>",
    "<|begin_of_text|>x<|eot_id|>", "<|im_start|><|im_start|>  <|im_end|>",
]


@pytest.fixture(scope="module", params=["smollm2", "llama-spm", "qwen2", "gpt-2"])
def pair(request):
    import llama_cpp

    path = smollm2_path() if request.param == "smollm2" else vocab_dir() / f"ggml-vocab-{request.param}.gguf"
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    yield GGUFTokenizer(read_vocab(path)), llm
    llm.close()


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("add", [False, True])
def test_matches_llama_cpp_python_on_awkward_text(pair, special, add):
    tok, llm = pair
    for text in AWKWARD:
        want = llm.tokenize(text.encode("utf-8"), add_bos=add, special=special)
        assert tok.encode(text, parse_special=special, add_special=add) == want, repr(text)


def test_decode_round_trips_and_matches_llama_cpp(pair):
    tok, llm = pair
    for text in AWKWARD:
        ids = tok.encode(text)
        got = tok.decode(ids)
        want = llm.detokenize(ids).decode("utf-8", "replace")
        if tok.vocab.add_space_prefix and want.startswith(" "):
            want = want[1:]  # llama.cpp keeps the SentencePiece prefix space; we drop it as HF does
        assert got == want, repr(text)
        assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", "replace").endswith(got)
        if not (tok.vocab.model == "llama" and "\u2581" in text):  # SentencePiece writes spaces as U+2581
            assert got == text, repr(text)


def test_smollm2_specials_and_flags():
    tok = GGUFTokenizer(read_vocab(smollm2_path()))
    assert tok.vocab_size == 49152 and (tok.bos_id, tok.eos_id) == (1, 2)
    assert not tok.add_bos and not tok.add_eos and tok.chat_template.startswith("{% for message")
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>", parse_special=True)
    assert ids[0] == 1 and ids[-1] == 2 and tok.decode(ids) == "user\nHi"
    assert tok.decode(ids, skip_special=False) == "<|im_start|>user\nHi<|im_end|>"
    plain = tok.encode("<|im_start|>")
    assert 1 not in plain and tok.decode(plain) == "<|im_start|>"
    assert tok.encode("2024") == [tok.token_id(c) for c in "2024"]  # smollm splits digits one by one


def test_json_round_trip():
    tok = vocab_tokenizer("llama-spm")
    back = tokenizer_from_json(tok.to_json())
    assert isinstance(back, GGUFTokenizer) and back.vocab == tok.vocab
    text = "Hello <s> world\n\n 123 🙂"
    assert back.encode(text, parse_special=True, add_special=True) == tok.encode(text, True, True)
    assert tok.encode(text, add_special=True)[0] == tok.bos_id  # llama-spm: add_bos_token true


def test_our_own_tokenizer_json_still_loads():
    from core.tokenizer import Tokenizer

    ours = Tokenizer.train(["hello world hello there"] * 3, vocab_size=300)
    back = tokenizer_from_json(ours.to_json())
    assert isinstance(back, Tokenizer) and back.encode("hello there") == ours.encode("hello there")


# ------------------------------------------------------------------------------ opencl-llm tokenize
def test_cli_tokenize_gguf_matches_llama_cpp(tmp_path, capsys):
    import llama_cpp

    from core.cli import main

    text = "<|im_start|>user\nWhat is 12+30?<|im_end|>\n  café 🙂"
    for path in (smollm2_path(), vocab_dir() / "ggml-vocab-llama-spm.gguf"):
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        want = llm.tokenize(text.encode(), add_bos=True, special=True)  # llama-tokenize's defaults
        llm.close()
        assert main(["tokenize", "--model", str(path), text]) == 0
        assert capsys.readouterr().out == "".join(f"{i}\n" for i in want)
        f = tmp_path / "t.txt"
        f.write_text(text, encoding="utf-8")
        assert main(["tokenize", "--model", str(path), "--file", str(f), "--no-bos", "--no-parse-special"]) == 0
        assert [int(x) for x in capsys.readouterr().out.split()] == GGUFTokenizer(read_vocab(path)).encode(text)


def test_cli_tokenize_our_checkpoint_and_refusals(tmp_path, capsys):
    from core.cli import main
    from core.tokenizer import Tokenizer

    assert main(["tokenize", "--model", str(vocab_dir() / "ggml-vocab-bert-bge.gguf"), "hi"]) == 2
    err = capsys.readouterr().err
    assert "'bert' is not supported" in err and err.count("\n") == 1
    assert main(["train", "--preset", "Tiny", "--d-model", "32", "--ffn-dim", "64", "--context-length", "64",
                 "--batch-size", "2", "--vocab-size", "300", "--pretrain-steps", "1", "--tune-steps", "0", "-q",
                 "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert main(["tokenize", "--model", str(tmp_path / "m"), "Brindlewick <|eos|>"]) == 0
    tok = Tokenizer.load(tmp_path / "m" / "tokenizer.json")
    assert [int(x) for x in capsys.readouterr().out.split()] == [tok.bos_id, *tok.encode("Brindlewick <|eos|>", True)]
