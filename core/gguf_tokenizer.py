"""Tokenizers read from a GGUF file's ``tokenizer.ggml.*`` keys, tokenizing exactly as llama.cpp does.

Two vocabulary types (llama.cpp ``src/llama-vocab.cpp``):

- ``gpt2`` (byte-level BPE): the text is split by the pre-tokenizer's regexes, one after the other
  (each splits the pieces of the previous one and keeps the text between matches as pieces:
  ``tokenizers``' ``Split(..., "isolated")``), each piece is byte-level encoded (GPT-2's byte table)
  and merged by the ranks of ``tokenizer.ggml.merges``. The regexes per ``tokenizer.ggml.pre`` are
  copied from ``llm_tokenizer_bpe``'s constructor; ``llama-bpe`` (Llama 3) also uses a whole piece
  that is a token as it is (``ignore_merges``).
- ``llama`` (SentencePiece BPE, ``llama-spm``: TinyLlama, Llama 2): spaces become ``▁``, a space is
  put in front of the text and after every special token (``add_space_prefix``, default true), the
  pieces are merged by the score of the merged token (highest first), and a character not in the
  vocabulary becomes its UTF-8 bytes as ``<0xXX>`` tokens. Built as a ``tokenizers`` BPE whose merge
  ranks are the merged tokens' scores, with ``byte_fallback``.

Special tokens (``tokenizer_st_partition``): tokens of type CONTROL, USER_DEFINED or UNKNOWN are cut out
of the text first, longest first; with ``parse_special=False`` CONTROL and UNKNOWN tokens are left as
text, USER_DEFINED ones are still cut out (as llama.cpp and ``tokenizers`` do). ``add_bos_token`` /
``add_eos_token`` decide what :meth:`GGUFTokenizer.encode` adds with ``add_special=True``.

Anything else (``bert``, ``t5``, ``rwkv``, an unknown pre-tokenizer) is refused by name
(:class:`UnsupportedTokenizer`).
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from functools import cached_property
from os import PathLike
from typing import Any, Iterable

from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from core.tokenizer import Tokenizer, bytes_to_unicode

log = logging.getLogger(__name__)

# llama_token_type (gguf.TokenType)
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = range(7)

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class _Pre:
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default before tokenizer.ggml.add_bos_token is read


_PRE_GPT2 = _Pre((_GPT2,))
_PRE_SMOLLM = _Pre((r"\p{N}", _GPT2))
_PRE_LLAMA3 = _Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
_PRE_QWEN2 = _Pre((_QWEN2,))
_PRE_QWEN35 = _Pre((r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",))

PRE_TOKENIZERS: dict[str, _Pre] = {
    # LLAMA_VOCAB_PRE_TYPE_GPT2 (and MPT, OLMO: the same regex)
    "gpt-2": _PRE_GPT2, "phi-2": _PRE_GPT2, "mpt": _PRE_GPT2, "olmo": _PRE_GPT2,
    # LLAMA_VOCAB_PRE_TYPE_SMOLLM, STARCODER, REFACT, COMMAND_R: digits one by one, then the GPT-2 regex
    "smollm": _PRE_SMOLLM, "starcoder": _PRE_SMOLLM, "refact": _PRE_SMOLLM, "command-r": _PRE_SMOLLM,
    # LLAMA_VOCAB_PRE_TYPE_LLAMA3
    "llama-bpe": _PRE_LLAMA3, "llama3": _PRE_LLAMA3, "llama-v3": _PRE_LLAMA3,
    # LLAMA_VOCAB_PRE_TYPE_QWEN2
    "qwen2": _PRE_QWEN2, "deepseek-r1-qwen": _PRE_QWEN2, "qwen35": _PRE_QWEN35,
}
"""``tokenizer.ggml.pre`` values of ``gpt2`` vocabularies we tokenize exactly as llama.cpp."""

# llama.cpp (llama_vocab::impl::load, "auto-detect special tokens by text"): tokens with these texts
# are end-of-generation / FIM markers and are made CONTROL even when the file says otherwise.
_CONTROL_LOOKING = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "[EOS]", "<｜end▁of▁sentence｜>", "<end_of_utterance>", "<|eom_id|>",
    "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "<eos>", "<turn|>", "<|tool_response>", "[e~[",
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>",
    "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
])

# llama.cpp's end-of-generation tokens by text (special_eog_ids), besides EOS.
_EOG = frozenset(["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
                  "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>", "<eos>"])

SPM_MODEL = "llama"
BPE_MODEL = "gpt2"


class UnsupportedTokenizer(ValueError):
    """The file's tokenizer type or pre-tokenizer is one we do not tokenize (the message names it)."""


_BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}



def _model_and_pre(kv: dict[str, Any], source: str) -> tuple[str, str]:
    """(tokenizer.ggml.model, tokenizer.ggml.pre) of a vocabulary we tokenize, else an error naming the key."""
    import gguf

    K = gguf.Keys.Tokenizer
    model = kv.get(K.MODEL)
    if model is None:
        raise ValueError(f"{source}: key {K.MODEL} is missing (the file has no tokenizer)")
    pre = kv.get(K.PRE) or ""
    if model == BPE_MODEL:
        if pre not in PRE_TOKENIZERS:
            raise UnsupportedTokenizer(
                f"{source}: pre-tokenizer {K.PRE} = {pre or '(none: default)'!r} is not supported; supported: "
                f"{', '.join(sorted(PRE_TOKENIZERS))}")
    elif model != SPM_MODEL:
        raise UnsupportedTokenizer(f"{source}: tokenizer {K.MODEL} = {model!r} is not supported; supported: "
                                   f"'{BPE_MODEL}' (byte-level BPE) and '{SPM_MODEL}' (SentencePiece BPE)")
    return model, pre


def _added_tokens(kv: dict[str, Any], source: str, model: str, pre: str) -> tuple[bool, bool, bool]:
    """(add_bos, add_eos, add_space_prefix): the file's keys, else llama.cpp's defaults for the model
    and pre-tokenizer; what we do not tokenize (a space prefix with gpt2, extra-space removal) is refused."""
    import gguf

    K = gguf.Keys.Tokenizer
    if model == SPM_MODEL:
        add_bos, add_eos, add_space = True, False, True
    else:
        add_bos, add_eos, add_space = PRE_TOKENIZERS[pre].add_bos, False, False
    add_bos = bool(kv.get(K.ADD_BOS, add_bos))
    add_eos = bool(kv.get(K.ADD_EOS, add_eos))
    add_space = bool(kv.get(K.ADD_PREFIX, add_space))
    if model == BPE_MODEL and add_space:
        raise UnsupportedTokenizer(f"{source}: {K.ADD_PREFIX} = true with a gpt2 vocabulary is not supported")
    if kv.get(K.REMOVE_EXTRA_WS):
        raise UnsupportedTokenizer(f"{source}: {K.REMOVE_EXTRA_WS} = true is not supported")
    return add_bos, add_eos, add_space


def _token_id(kv: dict[str, Any], source: str, key: str, n: int) -> int | None:
    """The token id at ``key`` (None when absent); not an id in 0..n-1: ValueError naming the key."""
    v = kv.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or not 0 <= v < n:
        raise ValueError(f"{source}: {key} = {v!r} is not a token id (0..{n - 1})")
    return int(v)

@dataclass(frozen=True)
class GGUFVocab:
    """The ``tokenizer.ggml.*`` keys of a GGUF file (plain data: saved in checkpoints as JSON).

    Attributes:
        model: ``tokenizer.ggml.model`` (``gpt2`` or ``llama``).
        pre: ``tokenizer.ggml.pre`` (``""`` when absent).
        tokens: token strings, id order; types: llama_token_type per token; scores: per token (SPM).
        merges: ``"a b"`` merge rules in rank order (BPE).
        bos_id, eos_id, unk_id, pad_id: special ids (None when the file has none).
        add_bos, add_eos: whether a tokenized text gets BOS / EOS (llama.cpp's defaults when absent).
        add_space_prefix: SPM puts a space in front of the text.
        name: ``general.name`` (llama.cpp sets token attributes by model name, e.g. phi-3).
        chat_template: ``tokenizer.chat_template`` or None.
    """

    model: str
    pre: str
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    scores: tuple[float, ...] = ()
    merges: tuple[str, ...] = ()
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    name: str = ""
    chat_template: str | None = None

    @classmethod
    def from_fields(cls, kv: dict[str, Any], source: str = "GGUF") -> "GGUFVocab":
        """Build from ``{key: value}`` of a GGUF file (see ``core.gguf_import.read_fields``; ``core.gguf_import.read_vocab`` reads a file).

        Raises:
            UnsupportedTokenizer: a tokenizer model or pre-tokenizer we do not tokenize (named).
            ValueError: keys missing or inconsistent (named).
        """
        import gguf

        K = gguf.Keys.Tokenizer
        model, pre = _model_and_pre(kv, source)
        tokens = kv.get(K.LIST)
        if not tokens:
            raise ValueError(f"{source}: key {K.LIST} is missing or empty")
        n = len(tokens)
        types = list(kv.get(K.TOKEN_TYPE) or [TYPE_NORMAL] * n)
        scores = list(kv.get(K.SCORES) or [])
        if len(types) < n or (scores and len(scores) < n):
            raise ValueError(f"{source}: {K.TOKEN_TYPE} or {K.SCORES} has fewer entries than {K.LIST} ({n})")
        merges = list(kv.get(K.MERGES) or [])
        if model == BPE_MODEL and not merges:
            raise ValueError(f"{source}: key {K.MERGES} is missing (a gpt2 BPE vocabulary needs its merges)")
        add_bos, add_eos, add_space = _added_tokens(kv, source, model, pre)

        def tid(key: str) -> int | None:
            return _token_id(kv, source, key, n)

        vocab = cls(model=model, pre=pre, tokens=tuple(tokens), types=tuple(int(t) for t in types[:n]),
                    scores=tuple(float(s) for s in scores[:n]), merges=tuple(merges),
                    bos_id=tid(K.BOS_ID), eos_id=tid(K.EOS_ID), unk_id=tid(K.UNK_ID), pad_id=tid(K.PAD_ID),
                    add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space,
                    name=str(kv.get(gguf.Keys.General.NAME) or ""), chat_template=kv.get(K.CHAT_TEMPLATE))
        if add_bos and vocab.bos_id is None:
            raise ValueError(f"{source}: {K.ADD_BOS} is true but {K.BOS_ID} is missing")
        if add_eos and vocab.eos_id is None:
            raise ValueError(f"{source}: {K.ADD_EOS} is true but {K.EOS_ID} is missing")
        return vocab

    def to_dict(self) -> dict:
        """JSON-serialisable dict (lists for the tuples)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GGUFVocab":
        """Inverse of :meth:`to_dict`. Raises KeyError/TypeError for a malformed dict."""
        d = dict(d)
        for k in ("tokens", "types", "scores", "merges"):
            d[k] = tuple(d.get(k) or ())
        return cls(**d)




class GGUFTokenizer:
    """A tokenizer built from a :class:`GGUFVocab`, with the interface of :class:`core.tokenizer.Tokenizer`.

    ``encode(text)`` gives the ids llama.cpp's ``llama_tokenize(..., add_special=False,
    parse_special=False)`` gives; ``encode(text, parse_special=True, add_special=True)`` those of
    ``llama-tokenize`` with its defaults.
    """

    def __init__(self, vocab: GGUFVocab, source: str = ""):
        """Build the ``tokenizers`` pipeline for ``vocab``.

        Args:
            vocab: the file's tokenizer keys.
            source: the file it came from, named in chat template errors ("" when unknown).

        Raises:
            UnsupportedTokenizer: model or pre-tokenizer not supported.
            ValueError: the vocabulary or merges are inconsistent.
        """
        self.vocab = vocab
        self.source = source
        self._n = len(vocab.tokens)
        self._spm = vocab.model == SPM_MODEL
        # llama.cpp: token_to_id[word] = i, so the last of duplicate strings wins.
        self._token_to_id = {t: i for i, t in enumerate(vocab.tokens)}
        try:
            self._tk = self._build_spm() if self._spm else self._build_bpe()
        except (UnsupportedTokenizer, ValueError):
            raise
        except Exception as e:  # tokenizers raises its own Exception type for bad tables
            raise ValueError(f"invalid vocabulary or merges: {e}") from e
        # llama.cpp makes "control-looking" tokens (end-of-turn, FIM) CONTROL whatever their type.
        self._control_ids = frozenset(
            i for i, (tok, typ) in enumerate(zip(vocab.tokens, vocab.types))
            if typ in (TYPE_CONTROL, TYPE_UNKNOWN) or (tok in _CONTROL_LOOKING and self._token_to_id[tok] == i))
        special_mask = (TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNKNOWN)
        specials = [i for i, t in enumerate(vocab.types) if t in special_mask or i in self._control_ids]
        specials.sort(key=lambda i: -len(vocab.tokens[i].encode("utf-8")))  # longest first, as llama.cpp
        rstrip = set()
        if "phi-3" in vocab.name.lower() or "phi3" in vocab.name.lower():  # llama.cpp's per-model attributes
            rstrip = set(specials) | {self._token_to_id.get("</s>")}
            rstrip -= {self._token_to_id.get(t) for t in ("<unk>", "<s>", "<|endoftext|>")}
        self._specials = [(vocab.tokens[i], i, i in self._control_ids, i in rstrip) for i in specials]

    # ---- construction of the tokenizers pipeline ----------------------------------------------
    def _build_bpe(self) -> _HFTokenizer:
        v = self.vocab
        pre = PRE_TOKENIZERS.get(v.pre)
        if pre is None:
            raise UnsupportedTokenizer(f"pre-tokenizer {v.pre!r} is not supported")
        merges = []
        for m in v.merges:
            a, sep, b = m.partition(" ")
            if not sep or not a or not b or " " in b:
                raise ValueError(f"merge {m!r} is not two tokens separated by one space")
            if a in self._token_to_id and b in self._token_to_id and a + b in self._token_to_id:
                merges.append((a, b))
        model = models.BPE(vocab=dict(self._token_to_id), merges=merges, ignore_merges=pre.ignore_merges)
        tk = _HFTokenizer(model)
        tk.normalizer = None
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tk.post_processor = None
        tk.decoder = None
        return tk

    def _build_spm(self) -> _HFTokenizer:
        v = self.vocab
        if not v.scores:
            raise ValueError("a SentencePiece ('llama') vocabulary needs tokenizer.ggml.scores")
        # llama.cpp merges the adjacent pair whose concatenation is a token of the highest score
        # (llm_tokenizer_spm_session::try_add_bigram). As BPE merge ranks: every split of every token
        # into two tokens, ranked by the token's score (higher first; ties by id).
        tid = self._token_to_id
        ranked = sorted(tid.items(), key=lambda kv: (-v.scores[kv[1]], kv[1]))
        merges = []
        for tok, _i in ranked:
            for k in range(1, len(tok)):
                a, b = tok[:k], tok[k:]
                if a in tid and b in tid:
                    merges.append((a, b))
        unk = v.tokens[v.unk_id] if v.unk_id is not None else None
        model = models.BPE(vocab=dict(tid), merges=merges, byte_fallback=True, unk_token=unk, fuse_unk=False)
        tk = _HFTokenizer(model)
        tk.normalizer = normalizers.Replace(" ", "\u2581")
        tk.pre_tokenizer = None
        tk.post_processor = None
        tk.decoder = None
        return tk

    # ---- what a Hugging Face tokenizer.json of this vocabulary is made of (core/hf_tokenizer.py) ----
    def pipeline(self) -> _HFTokenizer:
        """A copy of the ``tokenizers`` pipeline that encodes one text fragment as llama.cpp does (the
        vocabulary, merges, normalizer and pre-tokenizer; no special tokens, BOS/EOS or decoder)."""
        return _HFTokenizer.from_str(self._tk.to_str())

    def split_tokens(self) -> list[tuple[str, int, bool, bool]]:
        """The tokens cut out of a text before :meth:`pipeline` (llama.cpp's ``tokenizer_st_partition``),
        longest first, as ``(text, id, control, rstrip)``: ``control`` ones only with ``parse_special``;
        ``rstrip``: the whitespace after the token is dropped (phi-3)."""
        return list(self._specials)

    def bpe_merges(self) -> list[str]:
        """The merges :meth:`pipeline` applies, in rank order (``"a b"``): the file's merges whose two parts
        and result are tokens (gpt2); SentencePiece's from the scores (see ``_build_spm``)."""
        merges = json.loads(self._tk.to_str())["model"]["merges"]
        return [m if isinstance(m, str) else " ".join(m) for m in merges]

    # ---- serialisation (checkpoints) ------------------------------------------------------------
    FORMAT = "opencl-llm-studio-gguf-vocab"

    def to_json(self) -> str:
        """JSON text holding the :class:`GGUFVocab` (read back by :meth:`from_json`)."""
        return json.dumps({"format": self.FORMAT, "vocab": self.vocab.to_dict()}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "GGUFTokenizer":
        """Inverse of :meth:`to_json`. Raises ValueError for other JSON."""
        try:
            d = json.loads(text)
            if d.get("format") != cls.FORMAT:
                raise ValueError(f"format is {d.get('format')!r}, expected {cls.FORMAT!r}")
            return cls(GGUFVocab.from_dict(d["vocab"]))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a GGUF vocabulary JSON: {e}") from None

    def save(self, path: str | PathLike) -> None:
        """Write :meth:`to_json` to ``path`` atomically. Raises OSError."""
        from core.atomic import atomic_write

        atomic_write(path, self.to_json())

    # ---- encode / decode ------------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """llama.cpp's ``tokenizer_st_partition``: text fragments (str) and special ids (int)."""
        frags: list[str | int] = [text] if text else []
        for tok_text, tok_id, control, rstrip in self._specials:
            if control and not parse_special:
                continue
            if tok_text not in text:
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok_text not in f:
                    out.append(f)
                    continue
                parts = f.split(tok_text)
                for k, part in enumerate(parts):
                    if k > 0:
                        out.append(tok_id)
                        if rstrip:
                            part = part.lstrip(" \t\n\v\f\r")
                    if part:
                        out.append(part)
            frags = out
        return frags

    def _encode_fragment(self, text: str) -> list[int]:
        try:
            return self._tk.encode(text, add_special_tokens=False).ids
        except TypeError:
            from core.tokenizer import _valid_unicode

            return self._tk.encode(_valid_unicode(text), add_special_tokens=False).ids

    def encode(self, text: str, parse_special: bool = False, add_special: bool = False) -> list[int]:
        """Token ids of ``text`` exactly as llama.cpp's ``llama_tokenize(text, add_special, parse_special)``.

        Args:
            parse_special: cut CONTROL tokens (``<|im_start|>``, ``<s>``) out of the text; when False
                they are tokenized as plain text (user input cannot inject them).
            add_special: add BOS / EOS as the file's ``add_bos_token`` / ``add_eos_token`` say.
        """
        ids: list[int] = []
        if add_special and self.vocab.add_bos:
            ids.append(self.vocab.bos_id)
        prev_special = True
        for f in self._partition(text, parse_special):
            if isinstance(f, int):
                ids.append(f)
                prev_special = True
                continue
            if self._spm and self.vocab.add_space_prefix and prev_special:
                f = " " + f
            ids.extend(self._encode_fragment(f))
            prev_special = False
        if add_special and self.vocab.add_eos:
            ids.append(self.vocab.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids`` (llama.cpp's ``token_to_piece`` of each, concatenated; CONTROL tokens dropped
        when ``skip_special``). Incomplete UTF-8 decodes to U+FFFD.

        Raises:
            ValueError: an id outside the vocabulary.
        """
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self._n]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the vocabulary (size {self._n})")
        skip = self._control if skip_special else frozenset()
        data = b"".join(self._token_bytes[i] for i in ids if i not in skip)
        text = data.decode("utf-8", "replace")
        if self._spm and self.vocab.add_space_prefix and text.startswith(" "):
            text = text[1:]  # the space the tokenizer put in front
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (llama.cpp's ``token_to_piece`` with ``special=True``)."""
        return self._token_bytes[token_id]

    @property
    def _control(self) -> frozenset[int]:
        return self._control_ids

    @cached_property
    def _token_bytes(self) -> list[bytes]:
        out = []
        for tok, typ in zip(self.vocab.tokens, self.vocab.types):
            if typ in (TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNKNOWN, TYPE_UNUSED):
                out.append(tok.encode("utf-8"))
            elif self._spm:
                if typ == TYPE_BYTE and len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
                    out.append(bytes([int(tok[3:5], 16)]))
                else:
                    out.append(tok.replace("\u2581", " ").encode("utf-8"))
            else:
                try:
                    out.append(bytes(_BYTE_DECODER[c] for c in tok))
                except KeyError:
                    out.append(tok.encode("utf-8"))
        return out

    # ---- properties (the interface of core.tokenizer.Tokenizer) ---------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of tokens (ids ``0 .. vocab_size-1``)."""
        return self._n

    @property
    def bos_id(self) -> int | None:
        """``tokenizer.ggml.bos_token_id`` (None when the file has none)."""
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        """``tokenizer.ggml.eos_token_id``: the end of a text or answer (None when absent)."""
        return self.vocab.eos_id

    @property
    def pad_id(self) -> int:
        """Padding id for batches: ``padding_token_id``, else EOS, else 0 (padding never gets loss)."""
        for i in (self.vocab.pad_id, self.vocab.eos_id):
            if i is not None:
                return i
        return 0

    @property
    def add_bos(self) -> bool:
        """Whether a text starts with BOS (``tokenizer.ggml.add_bos_token``)."""
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        """Whether a text ends with EOS (``tokenizer.ggml.add_eos_token``)."""
        return self.vocab.add_eos

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end an answer (llama.cpp's end-of-generation set): EOS and control tokens such as
        ``<|im_end|>``, ``<|eot_id|>``, ``<|endoftext|>``."""
        ids = {i for i in self._control_ids if self.vocab.tokens[i] in _EOG}
        if self.vocab.eos_id is not None:
            ids.add(self.vocab.eos_id)
        return frozenset(ids)

    @property
    def chat_template(self) -> str | None:
        """The file's ``tokenizer.chat_template`` (Jinja2), or None."""
        return self.vocab.chat_template

    def token_id(self, token: str) -> int | None:
        """Id of a token string (as stored in the file), or None."""
        return self._token_to_id.get(token)

    def tokens(self) -> list[str]:
        """All token strings in id order (GGUF ``tokenizer.ggml.tokens``)."""
        return list(self.vocab.tokens)

    def merges(self) -> list[str]:
        """Merge rules (GGUF ``tokenizer.ggml.merges``; empty for SentencePiece)."""
        return list(self.vocab.merges)

    def special_ids(self) -> list[int]:
        """Ids of the CONTROL tokens (never shown in decoded text)."""
        return sorted(self._control)


def tokenizer_from_json(text: str) -> GGUFTokenizer | Tokenizer:
    """A :class:`GGUFTokenizer` for text written by :meth:`GGUFTokenizer.to_json`, else a
    :class:`core.tokenizer.Tokenizer` (our own ``tokenizer.json``). Raises ValueError."""
    if text.lstrip().startswith("{") and f'"format": "{GGUFTokenizer.FORMAT}"' in text[:200]:
        return GGUFTokenizer.from_json(text)
    return Tokenizer.from_json(text)


__all__ = ["GGUFTokenizer", "GGUFVocab", "UnsupportedTokenizer", "PRE_TOKENIZERS",
           "tokenizer_from_json"]
