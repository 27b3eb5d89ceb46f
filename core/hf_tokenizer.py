"""The tokenizer files of a Hugging Face export (core/hf_io.py) and reading them back, for both kinds.

- This app's own byte-level BPE (core/tokenizer.py): its ``tokenizer.json`` with a post-processor that
  prepends ``<|bos|>`` (``add_special_tokens=True``, as llama tokenizers do and as our GGUF says), the
  chat template ``core.chat_format.CHAT_TEMPLATE``.
- The vocabulary of an imported GGUF file (core/gguf_tokenizer.py), in the spirit of transformers'
  GGUF loader (``integrations/gguf/gguf_tokenizer_mapping.py``) but with llama.cpp's own pre-tokenizer
  regexes (transformers' GPT-2 path would not split SmolLM2's digits): the very ``tokenizers`` pipeline
  ``GGUFTokenizer`` encodes with (``GGUFTokenizer.pipeline``), the tokens llama.cpp cuts out of a text
  as added tokens (CONTROL ones special, USER_DEFINED ones not: ``add_gguf_special_tokens``), BOS / EOS
  as the file's ``add_bos_token`` / ``add_eos_token`` say, a decoder, the file's chat template. So
  ``AutoTokenizer.from_pretrained(FOLDER)(text).input_ids`` is llama.cpp's
  ``llama_tokenize(text, add_special=True, parse_special=True)``.

Reading back (:func:`read_tokenizer`) gives a ``Tokenizer`` for the first kind and a ``GGUFTokenizer`` for
a ``tokenizer.json`` of the second's structure; token types come from the added tokens (special:
CONTROL, else USER_DEFINED; SentencePiece ``<0xXX>``: BYTE), SentencePiece scores from the merge ranks
(the same merges, so the same ids), ``tokenizer.ggml.pre`` from the pre-tokenizer's regexes (the first
name of ``PRE_TOKENIZERS`` that splits so), the model name ``phi-3`` where added tokens strip the
whitespace after them (the one thing llama.cpp's tokenizer takes from ``general.name``). A tokenizer
of any other structure is refused by field.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, normalizers, processors

from core import chat_format
from core.gguf_tokenizer import (BPE_MODEL, PRE_TOKENIZERS, SPM_MODEL, TYPE_BYTE, TYPE_CONTROL, TYPE_NORMAL,
                                 TYPE_UNKNOWN, TYPE_USER_DEFINED, GGUFTokenizer, GGUFVocab)
from core.tokenizer import Tokenizer

PROBE_TEXTS = ("Hello world! It's 2024, isn't it?", "  two  spaces,\ttabs\tand\nnew\n\nlines  ",
               "numbers 1234567 3.14159 -42 1e-4", "unicode: café naïve Ünïcödé 日本語 Привет 🙂👍",
               "code: def f(x):\n    return x**2  # ok", "")
"""Texts a written tokenizer must encode as ours (with every special token's text added)."""


class HFError(ValueError):
    """A model cannot be written as, or a folder cannot be read as, a Hugging Face llama checkpoint."""


def _bos_eos(bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> processors.TemplateProcessing | None:
    """A post-processor adding ``bos`` in front and ``eos`` at the end (each ``(text, id)`` or None)."""
    if bos is None and eos is None:
        return None
    pre, post = (["BOS"] if bos else []), (["EOS"] if eos else [])
    # keyed BOS / EOS: a template piece cannot hold a token text with ':' or spaces
    specials = [{"id": key, "ids": [tok[1]], "tokens": [tok[0]]} for key, tok in (("BOS", bos), ("EOS", eos)) if tok]
    return processors.TemplateProcessing(
        single=[*pre, "$A", *post], pair=[*pre, "$A", *post, *(f"{p}:1" for p in pre), "$B:1",
                                          *(f"{p}:1" for p in post)], special_tokens=specials)


# ---------------------------------------------------------------------------------------- writing
def tokenizer_files(tokenizer: Tokenizer | GGUFTokenizer, context_length: int) -> dict[str, str]:
    """``{file name: text}`` of ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``.

    Raises:
        HFError: a GGUF vocabulary a ``tokenizer.json`` cannot hold (the message names the field).
    """
    if isinstance(tokenizer, GGUFTokenizer):
        tk, specials, extra = gguf_hf_tokenizer(tokenizer), _gguf_specials(tokenizer), _gguf_config(tokenizer)
    else:
        tk = _HFTokenizer.from_str(tokenizer.to_json())
        tk.post_processor = _bos_eos((chat_format.BOS_TOKEN, tokenizer.bos_id), None)
        specials = {"bos_token": chat_format.BOS_TOKEN, "eos_token": chat_format.EOS_TOKEN,
                    "pad_token": chat_format.PAD_TOKEN}
        # The chat template writes BOS itself and apply_chat_template adds no special tokens: never doubled.
        extra = {"add_bos_token": True, "add_eos_token": False, "chat_template": chat_format.CHAT_TEMPLATE}
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials, **extra,
                  # decode() must give back the text exactly (no " ." -> "." clean-up)
                  "clean_up_tokenization_spaces": False, "model_max_length": context_length}
    return {"tokenizer.json": tk.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(tok_config, ensure_ascii=False, indent=2),
            "special_tokens_map.json": json.dumps(specials, ensure_ascii=False, indent=2)}


def _gguf_specials(tok: GGUFTokenizer) -> dict[str, str]:
    """bos/eos/unk/pad token texts of a GGUF vocabulary (those it has)."""
    v = tok.vocab
    ids = {"bos_token": v.bos_id, "eos_token": v.eos_id, "unk_token": v.unk_id, "pad_token": v.pad_id}
    return {k: v.tokens[i] for k, i in ids.items() if i is not None}


def _gguf_config(tok: GGUFTokenizer) -> dict[str, Any]:
    v = tok.vocab
    return {"add_bos_token": v.add_bos, "add_eos_token": v.add_eos,
            **({"chat_template": v.chat_template} if v.chat_template else {})}


def check_exportable(vocab: GGUFVocab) -> None:
    """Raise HFError (one line naming the field) for a GGUF vocabulary a ``tokenizer.json`` cannot hold:
    a token text twice (a Hugging Face vocabulary maps each text to one id)."""
    seen: dict[str, int] = {}
    for i, t in enumerate(vocab.tokens):
        if t in seen:
            raise HFError(f"tokenizer.ggml.tokens: token {t!r} appears twice (ids {seen[t]} and {i}); a Hugging Face "
                          "tokenizer.json holds each token text once, so this vocabulary cannot be exported")
        seen[t] = i


def gguf_hf_tokenizer(tok: GGUFTokenizer) -> _HFTokenizer:
    """The standalone ``tokenizers.Tokenizer`` of a GGUF vocabulary (see the module docstring).

    Raises:
        HFError: :func:`check_exportable`.
    """
    v = tok.vocab
    check_exportable(v)
    tk = tok.pipeline()
    if v.model == SPM_MODEL:  # transformers' LlamaConverter; the prefix space on every piece, as llama.cpp
        space = [normalizers.Prepend("\u2581")] if v.add_space_prefix else []
        tk.normalizer = normalizers.Sequence([*space, normalizers.Replace(" ", "\u2581")])
        tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                        *([decoders.Strip(" ", 1, 0)] if v.add_space_prefix else [])])
    else:
        tk.decoder = decoders.ByteLevel()
    splits = sorted(tok.split_tokens(), key=lambda s: s[1])  # id order: a readable added_tokens list
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False, rstrip=r) for t, _i, c, r in splits if c])
    tk.add_tokens([AddedToken(t, special=False, normalized=False, rstrip=r) for t, _i, c, r in splits if not c])
    text = lambda i: None if i is None else (v.tokens[i], i)  # noqa: E731
    tk.post_processor = _bos_eos(text(v.bos_id) if v.add_bos else None, text(v.eos_id) if v.add_eos else None)
    return tk


def probe_texts(tokenizer: Tokenizer | GGUFTokenizer) -> list[str]:
    """:data:`PROBE_TEXTS` and one text around every special token's text (the first 64)."""
    if isinstance(tokenizer, GGUFTokenizer):
        specials = [t for t, *_ in tokenizer.split_tokens()]
    else:
        specials = list(chat_format.SPECIAL_TOKENS)
    return [*PROBE_TEXTS, *(f"a{s} b {s}\n{s}" for s in specials[:64])]


def expected_ids(tokenizer: Tokenizer | GGUFTokenizer, text: str) -> list[int]:
    """The ids the exported ``tokenizer.json`` must give ``text`` (``add_special_tokens=True``)."""
    if isinstance(tokenizer, GGUFTokenizer):
        return tokenizer.encode(text, parse_special=True, add_special=True)
    return [tokenizer.bos_id, *tokenizer.encode(text, parse_special=True)]


def check_tokenizer_file(path: Path, tokenizer: Tokenizer | GGUFTokenizer) -> None:
    """Raise HFError unless ``tokenizers`` reads ``path`` and encodes :func:`probe_texts` as ``tokenizer``."""
    try:
        tk = _HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own Exception type
        raise HFError(f"verification failed: {path} does not load in tokenizers ({e})") from None
    for t in probe_texts(tokenizer):
        got, want = tk.encode(t).ids, expected_ids(tokenizer, t)
        if got != want:
            raise HFError(f"verification failed: {path} encodes {t[:40]!r} as {got[:12]}, ours {want[:12]}")


# ---------------------------------------------------------------------------------------- reading
def read_tokenizer(folder: Path, d: dict, tok_config: dict) -> Tokenizer | GGUFTokenizer:
    """Our tokenizer of a Hugging Face folder's ``tokenizer.json`` (the parsed ``d``) and
    ``tokenizer_config.json`` (``tok_config``, {} when absent).

    Raises:
        HFError: a tokenizer of another kind or structure (the message names the file and the field).
    """
    path = folder / "tokenizer.json"
    model = d.get("model") or {}
    if model.get("type") != "BPE":
        raise HFError(f"{path}: model.type = {model.get('type')!r} is not supported (only BPE)")
    pre = d.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or model.get("byte_fallback"):
        vocab = _gguf_vocab(path, d, tok_config, folder_chat_template(folder, tok_config))
        try:
            return GGUFTokenizer(vocab, str(folder))
        except ValueError as e:  # UnsupportedTokenizer too
            raise HFError(f"{path}: {e}") from None
    if d.get("normalizer") is not None:
        raise HFError(f"{path}: normalizer = {json.dumps(d['normalizer'])[:60]} is not supported (only none)")
    if pre.get("add_prefix_space") or pre.get("use_regex") is False:
        raise HFError(f"{path}: pre_tokenizer = {json.dumps(pre)[:60]} is not supported (only GPT-2 ByteLevel)")
    d = dict(d, post_processor=None)  # ours adds no specials; the chat format places BOS/EOS itself
    try:
        return Tokenizer.from_json(json.dumps(d))
    except ValueError as e:
        raise HFError(f"{path}: {e}; only tokenizers of this app ({', '.join(chat_format.SPECIAL_TOKENS)}) "
                      "or of a GGUF vocabulary it exported can be used") from None


def folder_chat_template(folder: Path, tok_config: dict) -> str | None:
    """``chat_template.jinja`` (transformers 5 saves the template there), else tokenizer_config's."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text("utf-8")
    return tok_config.get("chat_template")


def _pre_name(path: Path, d: dict) -> str:
    """``tokenizer.ggml.pre`` of a byte-level pipeline: llama.cpp's regexes as ``Split`` then
    ``ByteLevel(use_regex=False)``, as :func:`gguf_hf_tokenizer` writes them; HFError otherwise."""
    pre = d.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers") or [] if pre.get("type") == "Sequence" else []
    last = parts[-1] if parts else {}
    regexes = tuple((p.get("pattern") or {}).get("Regex") for p in parts[:-1]
                    if p.get("type") == "Split" and p.get("behavior") == "Isolated" and not p.get("invert"))
    ignore = bool((d.get("model") or {}).get("ignore_merges"))
    if (last.get("type") == "ByteLevel" and not last.get("add_prefix_space") and last.get("use_regex") is False
            and len(regexes) == len(parts) - 1 and d.get("normalizer") is None):
        for name, p in PRE_TOKENIZERS.items():
            if p.regexes == regexes and p.ignore_merges == ignore:
                return name
    raise HFError(f"{path}: pre_tokenizer = {json.dumps(pre)[:80]} is not supported (only GPT-2 ByteLevel or "
                  "llama.cpp's pre-tokenizers as this app exports them)")


def _space_prefix(path: Path, d: dict) -> bool:
    """SentencePiece's ``add_space_prefix`` from the normalizer :func:`gguf_hf_tokenizer` writes."""
    norm = d.get("normalizer") or {}
    parts = norm.get("normalizers") or [] if norm.get("type") == "Sequence" else []
    kinds = [(p.get("type"), p.get("prepend"), (p.get("pattern") or {}).get("String"), p.get("content"))
             for p in parts]
    replace = ("Replace", None, " ", "\u2581")
    if kinds in ([replace], [("Prepend", "\u2581", None, None), replace]) and not d.get("pre_tokenizer"):
        return len(kinds) == 2
    raise HFError(f"{path}: normalizer = {json.dumps(norm)[:80]} is not supported with byte_fallback (only "
                  "SentencePiece's as this app exports it)")


def _token_list(path: Path, model: dict, added: list[dict]) -> list[str]:
    vocab = model.get("vocab") or {}
    tokens: list[str | None] = [None] * len(vocab)
    for t, i in vocab.items():
        if not isinstance(i, int) or not 0 <= i < len(tokens) or tokens[i] is not None:
            raise HFError(f"{path}: model.vocab: id {i!r} of {t!r} is not one of 0..{len(tokens) - 1} once")
        tokens[i] = t
    for a in added:
        if not 0 <= a.get("id", -1) < len(tokens) or tokens[a["id"]] != a.get("content"):
            raise HFError(f"{path}: added_tokens: {a.get('content')!r} (id {a.get('id')}) is not that token of "
                          "model.vocab (an added token beyond the vocabulary is not supported)")
    return tokens  # type: ignore[return-value]


def _spm_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """Scores that rank the SentencePiece merges as ``merges`` does: a merged token scores minus the rank
    of its first merge (GGUFTokenizer ranks by score, so it rebuilds the same merges); others 0."""
    first: dict[str, int] = {}
    for rank, m in enumerate(merges):
        first.setdefault(m.replace(" ", "", 1), rank)
    return [-1.0 - first[t] if t in first else 0.0 for t in tokens]


def _special_id(path: Path, tok_config: dict, key: str, ids: dict[str, int]) -> int | None:
    t = tok_config.get(key)
    t = t.get("content") if isinstance(t, dict) else t
    if t is None:
        return None
    if t not in ids:
        raise HFError(f"{path.with_name('tokenizer_config.json')}: {key} = {t!r} is not a token of tokenizer.json")
    return ids[t]


def _post_added(d: dict) -> tuple[int | None, int | None]:
    """(id added in front, id added at the end) by the post-processor (TemplateProcessing), else None."""
    post = d.get("post_processor") or {}
    if post.get("type") != "TemplateProcessing":
        return None, None
    single, specials = post.get("single") or [], post.get("special_tokens") or {}
    ids = lambda piece: (specials.get(piece["SpecialToken"]["id"], {}).get("ids") or [None])[0]  # noqa: E731
    front = ids(single[0]) if single and "SpecialToken" in single[0] else None
    back = ids(single[-1]) if len(single) > 1 and "SpecialToken" in single[-1] else None
    return front, back


def _gguf_vocab(path: Path, d: dict, tok_config: dict, template: str | None) -> GGUFVocab:
    """The GGUFVocab of a ``tokenizer.json`` that :func:`gguf_hf_tokenizer` wrote (or transformers saved)."""
    model, added = d["model"], d.get("added_tokens") or []
    spm = bool(model.get("byte_fallback"))
    tokens = _token_list(path, model, added)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    ids = {t: i for i, t in enumerate(tokens)}
    unk = _special_id(path, tok_config, "unk_token", ids)
    types = [TYPE_NORMAL] * len(tokens)
    for a in added:
        types[a["id"]] = TYPE_CONTROL if a.get("special") else TYPE_USER_DEFINED
    if spm:
        for i, t in enumerate(tokens):
            if re.fullmatch(r"<0x[0-9A-F]{2}>", t):
                types[i] = TYPE_BYTE
        if unk is not None:
            types[unk] = TYPE_UNKNOWN
    bos, eos = _special_id(path, tok_config, "bos_token", ids), _special_id(path, tok_config, "eos_token", ids)
    front, back = _post_added(d)
    pad = _special_id(path, tok_config, "pad_token", ids)
    return GGUFVocab(model=SPM_MODEL if spm else BPE_MODEL, pre="" if spm else _pre_name(path, d),
                     tokens=tuple(tokens), types=tuple(types),
                     scores=tuple(_spm_scores(tokens, merges)) if spm else (), merges=() if spm else tuple(merges),
                     bos_id=bos if bos is not None else front, eos_id=eos if eos is not None else back,
                     unk_id=unk, pad_id=pad, add_bos=front is not None, add_eos=back is not None,
                     add_space_prefix=spm and _space_prefix(path, d), chat_template=template,
                     name="phi-3" if any(a.get("rstrip") for a in added) else "")


__all__ = ["HFError", "tokenizer_files", "folder_chat_template", "gguf_hf_tokenizer", "check_exportable",
           "check_tokenizer_file", "read_tokenizer", "probe_texts", "expected_ids", "PROBE_TEXTS"]
