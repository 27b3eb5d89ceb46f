"""Byte-level BPE tokenizer (GPT-2 style) with BOS/EOS/PAD special tokens, on the `tokenizers` library.

- Pre-tokenizer: ``ByteLevel(add_prefix_space=False, use_regex=True)`` — the GPT-2 regex, which
  llama.cpp calls the ``gpt2`` pre-tokenizer; no normalizer; ``ByteLevel`` decoder.
- Vocabulary: ids 0, 1, 2 are ``<|bos|>``, ``<|eos|>``, ``<|pad|>``; then the 256 byte symbols; then
  merges. Every byte is in the vocabulary, so any UTF-8 text round-trips exactly.
- Token strings (:meth:`Tokenizer.tokens`) are in the byte-level form GPT-2 and GGUF use
  (``"Ġthe"`` for ``" the"``).

``encode(text)`` treats special-token text in ``text`` as plain text (user input cannot inject an EOS);
``encode(text, parse_special=True)`` turns it into special ids.
"""
from __future__ import annotations

import codecs
import json
from functools import cached_property
from os import PathLike
from typing import Iterable, Sequence

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from core.atomic import atomic_write
from core.chat_format import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS

MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (``encoder.py`` of openai/gpt-2), used by ByteLevel."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}


def _configure(tk: _HFTokenizer) -> None:
    tk.normalizer = None
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = None


def _valid_unicode(text: str) -> str:
    """``text`` with lone surrogates replaced: bytes Python escaped on input (surrogateescape) are
    decoded again with U+FFFD for what is not UTF-8; any other lone surrogate becomes U+FFFD."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)


class Tokenizer:
    """A trained byte-level BPE tokenizer. Build with :meth:`train`, :meth:`from_json` or :meth:`load`."""

    def __init__(self, tk: _HFTokenizer):
        """Wrap a ``tokenizers.Tokenizer``.

        Raises:
            ValueError: if it lacks one of the special tokens ``<|bos|>``, ``<|eos|>``, ``<|pad|>``.
        """
        missing = [t for t in SPECIAL_TOKENS if tk.token_to_id(t) is None]
        if missing:
            raise ValueError(f"tokenizer lacks the special tokens {missing}")
        self._tk = tk
        # A second instance that reads special-token text as plain text. Kept separate (not toggled)
        # so that encode() is safe to call from two threads.
        self._tk_plain = _HFTokenizer.from_str(tk.to_str())
        self._tk_plain.encode_special_tokens = True
        self._bos = tk.token_to_id(BOS_TOKEN)
        self._eos = tk.token_to_id(EOS_TOKEN)
        self._pad = tk.token_to_id(PAD_TOKEN)
        self._n = tk.get_vocab_size(with_added_tokens=True)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 1024) -> "Tokenizer":
        """Train on ``texts`` (plain text, without special tokens).

        The result may have fewer than ``vocab_size`` tokens when the text is small (a merge needs a
        pair seen at least twice); read :attr:`vocab_size` for the real size.

        Raises:
            ValueError: if ``vocab_size`` < 259 (256 bytes + 3 specials).
        """
        if vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE}, got {vocab_size}")
        tk = _HFTokenizer(models.BPE())
        _configure(tk)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2, show_progress=False)
        tk.train_from_iterator(list(texts), trainer)
        return cls(tk)

    @classmethod
    def from_vocab(cls, tokens: Sequence[str], merges: Sequence[str]) -> "Tokenizer":
        """Rebuild from :meth:`tokens` and :meth:`merges` (e.g. read back from a GGUF file).

        Raises:
            ValueError: if the special tokens are missing or the table is inconsistent.
        """
        vocab = {t: i for i, t in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise ValueError("duplicate token strings in the vocabulary")
        pairs = [tuple(m.split(" ")) for m in merges]
        if any(len(p) != 2 for p in pairs):
            raise ValueError("each merge must be two tokens separated by one space")
        try:
            tk = _HFTokenizer(models.BPE(vocab=vocab, merges=pairs))
        except Exception as e:  # tokenizers raises its own Exception type for bad tables
            raise ValueError(f"invalid vocabulary or merges: {e}") from e
        _configure(tk)
        tk.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])
        return cls(tk)

    @classmethod
    def from_json(cls, text: str) -> "Tokenizer":
        """Load from a ``tokenizer.json`` string as written by :meth:`to_json`.

        Raises:
            ValueError: if the text is not a tokenizer or lacks the special tokens.
        """
        try:
            tk = _HFTokenizer.from_str(text)
        except Exception as e:
            raise ValueError(f"not a tokenizer.json: {e}") from e
        return cls(tk)

    def to_json(self) -> str:
        """The HF ``tokenizer.json`` text (loadable by ``tokenizers`` and ``transformers``)."""
        return self._tk.to_str()

    def save(self, path: str | PathLike) -> None:
        """Write :meth:`to_json` to ``path`` atomically (temp file + ``os.replace``). Raises OSError."""
        atomic_write(path, self.to_json())

    @classmethod
    def load(cls, path: str | PathLike) -> "Tokenizer":
        """Read a file written by :meth:`save`. Raises OSError, ValueError."""
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    # ---- encode / decode ----------------------------------------------------------------------
    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``; no BOS/EOS are added.

        Args:
            parse_special: if True, the texts ``<|bos|>``, ``<|eos|>``, ``<|pad|>`` become their special
                ids; if False (the default, for user input) they are tokenized as ordinary text.

        Text that cannot be UTF-8 (lone surrogates, as Python makes of undecodable terminal bytes)
        is encoded with U+FFFD in their place.
        """
        tk = self._tk if parse_special else self._tk_plain
        try:
            return tk.encode(text, add_special_tokens=False).ids
        except TypeError:
            if not isinstance(text, str):
                raise
            return tk.encode(_valid_unicode(text), add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``; special tokens are dropped when ``skip_special``.

        Incomplete UTF-8 sequences decode to U+FFFD. Raises ValueError for an id outside the vocabulary.
        """
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self._n]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the vocabulary (size {self._n})")
        return self._tk.decode(ids, skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (a special token gives its text in UTF-8)."""
        return self._token_bytes[token_id]

    @cached_property
    def _token_bytes(self) -> list[bytes]:
        special = set(self.special_ids())
        out = []
        for i, t in enumerate(self.tokens()):
            out.append(t.encode("utf-8") if i in special else bytes(_BYTE_DECODER[c] for c in t))
        return out

    # ---- properties and exporter accessors ----------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of tokens, specials included (ids are ``0 .. vocab_size-1``)."""
        return self._n

    @property
    def bos_id(self) -> int:
        """Id of the beginning-of-sequence special token."""
        return self._bos

    @property
    def eos_id(self) -> int:
        """Id of the end-of-sequence (end of an answer) special token."""
        return self._eos

    @property
    def pad_id(self) -> int:
        """Id of the padding special token."""
        return self._pad

    def tokens(self) -> list[str]:
        """All token strings in id order, byte-level encoded (GGUF ``tokenizer.ggml.tokens``)."""
        vocab = self._tk.get_vocab(with_added_tokens=True)
        out: list[str | None] = [None] * self._n
        for t, i in vocab.items():
            out[i] = t
        if any(t is None for t in out):
            raise ValueError("token ids are not contiguous")
        return out  # type: ignore[return-value]

    def merges(self) -> list[str]:
        """Merge rules ``"a b"`` in rank order (GGUF ``tokenizer.ggml.merges``)."""
        merges = json.loads(self._tk.to_str())["model"]["merges"]
        # tokenizers < 0.20 writes "a b" strings, newer versions [a, b] pairs.
        return [m if isinstance(m, str) else " ".join(m) for m in merges]

    def special_ids(self) -> list[int]:
        """Ids of the special (control) tokens: ``[bos_id, eos_id, pad_id]``."""
        return [self._bos, self._eos, self._pad]


class StreamDecoder:
    """Turns ids, fed one at a time, into text that is safe to show.

    A token can end in the middle of a multi-byte UTF-8 character (emoji, accents): those bytes are
    held back until the character is complete. Call :meth:`flush` at the end.

    Example::

        dec = StreamDecoder(tok)
        for i in ids:
            print(dec.feed(i), end="")
        print(dec.flush())
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tok = tokenizer
        self._skip = set(tokenizer.special_ids()) if skip_special else set()
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Add one id; return the text it completes (possibly ``""``). Raises IndexError for a bad id."""
        token_id = int(token_id)
        if token_id in self._skip:
            return ""
        if not 0 <= token_id < self._tok.vocab_size:
            raise IndexError(f"token id {token_id} outside the vocabulary")
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """Return what is still held back (an incomplete character becomes U+FFFD) and reset."""
        text = self._dec.decode(b"", final=True)
        self._dec.reset()
        return text
