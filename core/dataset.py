"""Training data: facts (plain statements, for pretraining) and dialogues (for tuning the chat turns).

Readers (:func:`load_dataset`), chosen by extension and content:

- the app's JSON file (``.json``)::

      {"format": "opencl-llm-studio-dataset", "version": 1,
       "facts": ["...", ...],
       "dialogues": [{"system": null, "turns": [{"user": "...", "assistant": "..."}]}]}

- plain text (``.txt`` and anything else that is not JSON): each line is a fact, except
  ``User: ...`` / ``Assistant: ...`` lines, which form dialogues (several turns allowed; a blank line or
  a fact line ends a dialogue). An optional ``System: ...`` line may open a dialogue.
- chat JSONL (``.jsonl``): one ``{"messages": [{"role": "system"|"user"|"assistant", "content": ...}]}``
  per line; a ``{"text": "..."}`` line (or a JSON string) is a fact. A ``.json`` file holding a JSON list of such
  records (``["fact", {"messages": [...]}]``) reads the same.

All readers take UTF-8 with or without a byte-order mark and read CRLF and bare CR as LF. Text and
JSONL contents are trimmed of surrounding whitespace. A malformed entry becomes a :class:`Problem`
(``file:line: message``) and is skipped; only a file that cannot be read as a whole raises
:class:`DatasetError`.

Writers (:func:`save_dataset`, :func:`export_text`, :func:`export_jsonl`) replace the file atomically
(:func:`core.atomic.atomic_write`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field, replace
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.atomic import atomic_write
from core.json_text import loads, parse_json
from core.chat_format import SPECIAL_TOKENS, encode_dialogue, encode_fact, plain_text

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FORMAT_NAME = "opencl-llm-studio-dataset"
FORMAT_VERSION = 1

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_VISIBLE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\u200b-\u200d\u2060\ufeff]")

MAX_ENTRY_CHARS = 100_000
"""Longest fact, question or answer read (about 25,000 tokens, 100 context windows of 256): a 5 MB line
peaked at 917 MB while its 1.7 million tokens were counted; a longer one is skipped with its line named."""


def has_text(text: str) -> bool:
    """True when ``text`` has a visible character: not only whitespace, NUL bytes and other control or
    zero-width characters (a line of NUL bytes is no fact)."""
    return _VISIBLE.search(text) is not None


def trainable_turns(dialogue: "Dialogue") -> list[tuple[str, str]]:
    """The turns of ``dialogue`` that training learns: both question and answer have text
    (:func:`has_text`). :meth:`Dataset.validate` reports the others; training skips them."""
    return [(u, a) for u, a in dialogue.turns if has_text(u) and has_text(a)]
_OTHER_ROLE = re.compile(r"^(Q|A|Question|Answer|Human|AI|Bot)\s*:", re.IGNORECASE)
"""Other names for a dialogue's lines that the text format does not read as one (a line starting so is a fact)."""

_ROLE_LINE = re.compile(r"^(user|assistant|system)\s*:\s?(.*)$", re.IGNORECASE | re.DOTALL)


class DatasetError(ValueError):
    """A dataset file that cannot be read at all (not UTF-8, broken JSON, unknown layout)."""


@dataclass(frozen=True)
class Problem:
    """A skipped entry of a file: ``path``, 1-based ``line`` (None when unknown), ``message``."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class EntryProblem:
    """A problem with one entry of a :class:`Dataset`, from :meth:`Dataset.validate`.

    ``kind`` is ``"fact"`` or ``"dialogue"``; ``index`` is 0-based into ``facts``/``dialogues``;
    ``turn`` is the 0-based turn of a dialogue or None. ``str()`` numbers from 1 for people.
    """

    kind: str
    index: int
    turn: int | None
    message: str
    place: str | None = None  # where the entry is in its file ("FILE:LINE"), when the dataset knows (Origin)

    def __str__(self) -> str:
        where = f"{self.kind} {self.index + 1}"
        if self.turn is not None:
            where += f", turn {self.turn + 1}"
        return f"{self.place + ': ' if self.place else ''}{where}: {self.message}"


@dataclass
class Dialogue:
    """A conversation: ``turns`` of ``(user, assistant)`` and an optional ``system`` message."""

    turns: list[tuple[str, str]] = field(default_factory=list)
    system: str | None = None


@dataclass(frozen=True)
class Origin:
    """Where the entries of a dataset read by ``load_dataset(..., located=True)`` are in its file: ``path``, and
    for each fact and each dialogue ``(entry as read, line, name)``: a fact's text or a dialogue's ``(system,
    turns)``, its 1-based line (None: unknown) and its name in a JSON file (``facts[2]``, ``item [4]``; None in
    a text or JSONL file). The entry as read tells an entry edited, added or moved since, which has no place."""

    path: str
    facts: tuple = ()
    dialogues: tuple = ()

    @classmethod
    def of(cls, path: str, dataset: Dataset, facts: list, dialogues: list) -> Origin:
        """The origin of ``dataset`` as just read from ``path``: ``facts`` and ``dialogues`` hold each entry's
        ``(line, name)``."""
        return cls(path, tuple((f, *at) for f, at in zip(dataset.facts, facts)),
                   tuple(((d.system, tuple(d.turns)), *at) for d, at in zip(dataset.dialogues, dialogues)))

    def place(self, dataset: Dataset, kind: str, index: int) -> str | None:
        """``FILE:LINE`` (and ``: NAME`` in a JSON file) of entry ``index`` of ``kind`` ("fact" or "dialogue")
        of ``dataset``; None when it is not the entry read there."""
        read = self.facts if kind == "fact" else self.dialogues
        if index >= len(read):
            return None
        entry, line, name = read[index]
        d = dataset.dialogues[index] if kind == "dialogue" else None
        if entry != (dataset.facts[index] if d is None else (d.system, tuple(d.turns))):
            return None
        return self.path + (f":{line}" if line else "") + (f": {name}" if name else "")


@dataclass
class Dataset:
    """What a model learns from: ``facts`` (pretraining sentences) and ``dialogues`` (chat tuning);
    ``origin``: where a file's entries are in it (read with ``located=True``), for :meth:`validate`'s messages."""

    facts: list[str] = field(default_factory=list)
    dialogues: list[Dialogue] = field(default_factory=list)
    origin: Origin | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-file form (see the module docstring)."""
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "facts": list(self.facts),
            "dialogues": [{"system": d.system, "turns": [{"user": u, "assistant": a} for u, a in d.turns]}
                          for d in self.dialogues],
        }

    def trained_counts(self) -> tuple[int, int]:
        """(facts, dialogues) that training learns from: facts with text (:func:`has_text`) and dialogues with a turn
        of text (:func:`trainable_turns`); the others are reported by :meth:`validate` and skipped."""
        return (sum(1 for f in self.facts if has_text(f)), sum(1 for d in self.dialogues if trainable_turns(d)))

    def tokenizer_texts(self) -> list[str]:
        """Plain texts to train the tokenizer on: the facts and each dialogue as rendered (no specials)."""
        return list(self.facts) + [plain_text(d.turns, d.system) for d in self.dialogues]

    def validate(self, tokenizer: Tokenizer | None = None,
                 max_tokens: int | None = None) -> list[EntryProblem]:
        """Problems that would spoil training, one per entry (or turn) at fault.

        Checks: empty fact, empty question or answer (empty: no visible text, :func:`has_text`; training
        skips these entries and turns), a dialogue without turns, text containing the special token
        strings (``<|bos|>`` ...), and — when both ``tokenizer`` and ``max_tokens`` are given — a fact or
        dialogue longer than ``max_tokens`` tokens (BOS/EOS included), which the trainer would have to cut.

        Args:
            tokenizer: counts the tokens (with ``max_tokens``); max_tokens: the longest entry trained whole.

        Returns:
            One :class:`EntryProblem` per entry or turn at fault, in dataset order; with the entry's place in
            its file (``FILE:LINE: fact 3: ...``) where the dataset has an :class:`Origin` that knows it.
        """
        out: list[EntryProblem] = []
        check_len = tokenizer is not None and max_tokens is not None

        def specials(text: str) -> list[str]:
            return sorted((t for t in SPECIAL_TOKENS if t in text), key=text.find)

        def too_long(n: int, fact: bool) -> str:  # max_tokens: the context's tokens and one more (the last target)
            return (f"too long: {n:,} tokens where the model's context holds {max_tokens - 1:,}: trained in pieces "
                    "of the context" + (", and not checked for recall" if fact else ""))

        for i, fact in enumerate(self.facts):
            if not has_text(fact):
                out.append(EntryProblem("fact", i, None, "empty fact" if not fact.strip() else
                                        "no visible text (only control characters such as NUL bytes)"))
                continue
            if found := specials(fact):
                out.append(EntryProblem("fact", i, None, f"contains the reserved text {found[0]}"))
            if check_len and (n := len(encode_fact(tokenizer, fact))) > max_tokens:
                out.append(EntryProblem("fact", i, None, too_long(n, True)))
        for i, d in enumerate(self.dialogues):
            if not d.turns:
                out.append(EntryProblem("dialogue", i, None, "no turns"))
                continue
            if d.system and (found := specials(d.system)):
                out.append(EntryProblem("dialogue", i, None,
                                        f"system message contains the reserved text {found[0]}"))
            for t, (user, answer) in enumerate(d.turns):
                if not has_text(user):
                    out.append(EntryProblem("dialogue", i, t, "empty question"))
                if not has_text(answer):
                    out.append(EntryProblem("dialogue", i, t, "empty answer"))
                if found := specials(user) + specials(answer):
                    out.append(EntryProblem("dialogue", i, t, f"contains the reserved text {found[0]}"))
            if check_len and (turns := trainable_turns(d)) and \
                    (n := len(encode_dialogue(tokenizer, Dialogue(turns, d.system))[0])) > max_tokens:
                out.append(EntryProblem("dialogue", i, None, too_long(n, False)))
        if self.origin is not None:
            out = [replace(p, place=self.origin.place(self, p.kind, p.index)) for p in out]
        return out


def dataset_hash(dataset: Dataset) -> str:
    """sha256 hex digest of the canonical JSON (sorted keys, no spaces, UTF-8) of ``dataset``."""
    text = json.dumps(dataset.to_dict(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def save_dataset(dataset: Dataset, path: str | PathLike, sync_folder: bool = True) -> None:
    """Write ``dataset`` in the app's JSON format, atomically (:func:`core.atomic.atomic_write`;
    ``sync_folder`` as there). Raises OSError."""
    atomic_write(path, json.dumps(dataset.to_dict(), ensure_ascii=False, indent=1) + "\n", sync_folder=sync_folder)


def _one_line(text: str) -> str:
    return " ".join(_LINE_BREAK.split(text))


def export_text(dataset: Dataset, path: str | PathLike) -> list[EntryProblem]:
    """Write the plain-text format (facts, a blank line, then dialogues separated by blank lines).

    The format is line based and has no escapes, so two things cannot survive it: a line break
    inside an entry (written as a space) and a fact that begins like a role line (``User:``,
    ``Assistant:``, ``System:``), which would read back as part of a dialogue. Such facts are
    written as they are and reported.

    Returns:
        One :class:`EntryProblem` per entry that will not read back exactly (empty when the export
        is lossless); the JSON and JSONL formats keep everything.

    Raises:
        OSError: the file cannot be written (the old file, if any, is untouched).
    """
    lossy: list[EntryProblem] = []
    for i, f in enumerate(dataset.facts):
        if _ROLE_LINE.match(f.strip()):
            lossy.append(EntryProblem("fact", i, None, "starts like a role line and will read back as a dialogue line"))
        elif _one_line(f) != f:
            lossy.append(EntryProblem("fact", i, None, "has a line break, written as a space"))
    for i, d in enumerate(dataset.dialogues):
        texts = [d.system or ""] + [t for turn in d.turns for t in turn]
        if any(_one_line(t) != t for t in texts):
            lossy.append(EntryProblem("dialogue", i, None, "has a line break, written as a space"))
    lines = [_one_line(f) for f in dataset.facts]
    for d in dataset.dialogues:
        if lines:
            lines.append("")
        if d.system:
            lines.append(f"System: {_one_line(d.system)}")
        for user, answer in d.turns:
            lines += [f"User: {_one_line(user)}", f"Assistant: {_one_line(answer)}"]
    atomic_write(path, "".join(line + "\n" for line in lines))
    return lossy


def export_jsonl(dataset: Dataset, path: str | PathLike) -> None:
    """Write chat JSONL: ``{"text": fact}`` lines, then ``{"messages": [...]}`` lines. Raises OSError."""
    rows: list[dict[str, Any]] = [{"text": f} for f in dataset.facts]
    for d in dataset.dialogues:
        msgs = [{"role": "system", "content": d.system}] if d.system else []
        for user, answer in d.turns:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        rows.append({"messages": msgs})
    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


# ---- reading ----------------------------------------------------------------------------------

MAX_DATASET_BYTES = 1 << 30
"""Largest dataset file read (1 GiB): a bigger one, or an endless one such as /dev/zero, is refused."""


def _read_text(path: Path) -> str:
    if path.exists() and not path.is_dir() and not path.is_file():  # a device, a pipe: never read endlessly
        raise DatasetError(f"{path}: not a regular file; give a dataset file (.json, .jsonl or .txt)")
    try:
        with open(path, "rb") as fh:  # read(n) allocates n bytes first: ask for the file's size, not 1 GiB
            head = fh.read(8)  # a model file given as the data (a new user's --data model.gguf): GGUF's magic and
            if head[:4] == b"GGUF" and 1 <= int.from_bytes(head[4:], "little") <= 3:  # a version (1-3), not a text
                raise DatasetError(f"{path}: a GGUF model file, not a dataset; to teach it your data, give it as the "
                                   "base model (train --base FILE.gguf --data DATASET, or the Hyperparameters tab)")
            fh.seek(0)
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(min(size, MAX_DATASET_BYTES) + 1)
            if len(data) > size:  # grew meanwhile, or a /proc-like file that says 0
                data += fh.read(MAX_DATASET_BYTES + 1 - len(data))
    except IsADirectoryError:
        raise DatasetError(f"{path}: is a folder; give a dataset file (.json, .jsonl or .txt)") from None
    if len(data) > MAX_DATASET_BYTES:
        raise DatasetError(f"{path}: larger than {MAX_DATASET_BYTES >> 30} GiB; split it or use a smaller file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = len(_LINE_BREAK.findall(data[:e.start].decode("latin-1"))) + 1
        raise DatasetError(f"{path}:{line}: the file is not UTF-8 text (byte 0x{data[e.start]:02x}); "
                           "save it as UTF-8 and load it again") from e
    return "\n".join(_LINE_BREAK.split(text))


def load_dataset(path: str | PathLike, notes: list[str] | None = None,
                 located: bool = False) -> tuple[Dataset, list[Problem]]:
    """Read a dataset file in any of the supported formats (see the module docstring).

    Args:
        notes: when given, gets a line for the user where the file's name says nothing of how it was read (a
            name not ending in .json, .jsonl or .txt, e.g. a .csv of questions and answers, read as plain text),
            and one where a JSON object gives a name twice (JSON keeps the last value; the first is not read).
        located: keep where each entry is in the file (``Dataset.origin``), so that :meth:`Dataset.validate`
            names it ``FILE:LINE`` (the CLI; the app's lists name entries by their row).

    Returns:
        ``(dataset, problems)``: the entries that could be read and one :class:`Problem` per skipped
        entry.

    Raises:
        DatasetError: (a ValueError) the file is not UTF-8, is JSON of an unknown layout or a newer
            version, or is broken JSON where the whole file is one JSON document.
        OSError: the file cannot be read.
    """
    path = Path(path)
    if path.is_dir():
        raise DatasetError(f"{path}: is a folder; give a dataset file (.json, .jsonl or .txt)")
    text = _read_text(path)
    ext = path.suffix.lower()
    first = next((ln.strip() for ln in text.split("\n") if ln.strip()), "")
    # JSONL is recognised by its first line too: chat datasets often ship as JSONL named *.json
    if ext == ".jsonl" or _looks_like_jsonl_line(first):
        return _parse_jsonl(text, str(path), located, notes)
    if ext == ".json" or (first.startswith(("{", "[")) and _is_json_document(text)):
        return _parse_json(text, str(path), located, notes)
    if notes is not None and ext not in (".txt", ".json", ".jsonl"):
        notes.append(f"{path}: read as plain text (each line a fact, 'User:' / 'Assistant:' lines dialogues); "
                     "the dataset formats are .json, .jsonl and .txt")
    return _parse_text(text, str(path), located)


def default_dataset() -> Dataset:
    """The small example dataset shipped in ``resources/default_dataset.json``.

    Raises:
        DatasetError: if the packaged file is damaged.
    """
    from importlib.resources import files

    text = files("resources").joinpath("default_dataset.json").read_text(encoding="utf-8")
    dataset, problems = _parse_json(text, "default_dataset.json")
    if problems:
        raise DatasetError("; ".join(map(str, problems)))
    return dataset


def _is_json_document(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _looks_like_jsonl_line(line: str) -> bool:
    if not line.startswith("{"):
        return False
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and ("messages" in obj or "text" in obj)


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _array_items(text: str, i: int) -> tuple[list[int], int]:
    """Offsets of the items of the JSON array that opens at ``text[i]``, and the offset past its ``]``."""
    starts = []
    i = _JSON_SPACE.match(text, i + 1).end()
    while text[i] != "]":
        starts.append(i)
        i = _JSON_SPACE.match(text, _DECODER.raw_decode(text, i)[1]).end()
        if text[i] == ",":
            i = _JSON_SPACE.match(text, i + 1).end()
    return starts, i + 1


def _item_lines(text: str) -> dict[str | None, list[int]]:
    """1-based line of each item of a JSON dataset's lists: of the top-level list (key None), or of the
    top-level object's "facts" and "dialogues" lists (of a repeated name the last, as json.loads keeps).
    A second parse of the text (json's raw_decode, item by item); empty for text that is not such JSON."""
    starts: dict[str | None, list[int]] = {}
    try:
        i = _JSON_SPACE.match(text).end()
        if text[i] == "[":
            starts[None] = _array_items(text, i)[0]
        elif text[i] == "{":
            i = _JSON_SPACE.match(text, i + 1).end()
            while text[i] != "}":
                name, i = _DECODER.raw_decode(text, i)
                i = _JSON_SPACE.match(text, _JSON_SPACE.match(text, i).end() + 1).end()  # past the ":"
                if name in ("facts", "dialogues") and text[i] == "[":
                    starts[name], i = _array_items(text, i)
                else:
                    starts.pop(name, None)
                    i = _DECODER.raw_decode(text, i)[1]
                i = _JSON_SPACE.match(text, i).end()
                if text[i] == ",":
                    i = _JSON_SPACE.match(text, i + 1).end()
    except (ValueError, IndexError, RecursionError):
        return {}
    out = {}
    for key, offsets in starts.items():
        out[key], line, at = [], 1, 0
        for o in offsets:  # in order: the text is counted once
            line, at = line + text.count("\n", at, o), o
            out[key].append(line)
    return out


class _JsonLines:
    """The lines of a JSON dataset's list items (:func:`_item_lines`), found when first asked: only a file
    with a problem to report pays for the second parse."""

    def __init__(self, text: str) -> None:
        self._text, self._lines = text, None

    def of(self, key: str | None, i: int) -> int | None:
        """The line of item ``i`` of the top-level list (``key`` None) or of its ``key`` list; None if unknown."""
        if self._lines is None:
            self._lines = _item_lines(self._text)
        items = self._lines.get(key, [])
        return items[i] if i < len(items) else None


def _lone_surrogate(*texts: str | None) -> bool:
    """Whether a text holds a lone UTF-16 surrogate (JSON's "\\ud800" alone): no UTF-8 encodes it, so the
    tokenizer, a save and every export would fail on it."""
    for t in texts:
        if t and not t.isascii():
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


_SURROGATE = "holds an invalid character (a lone UTF-16 surrogate such as \\ud800), skipped"


def _parse_json(text: str, path: str, located: bool = False,
                notes: list[str] | None = None) -> tuple[Dataset, list[Problem]]:
    repeated: list[str] = []
    doc = parse_json(text, path, DatasetError, "a dataset", repeated if notes is not None else None)
    if repeated:  # json keeps the last value of a name given twice: say that one was not read
        notes.append(f"{path}: {_repeated_message(repeated)}")
    return _parse_json_doc(doc, text, path, located)


def _repeated_message(repeated: list[str]) -> str:
    """'"text" given twice in an object; only its last value is read' (each name once, as written)."""
    names = list(dict.fromkeys(repeated))
    return (f"{', '.join(json.dumps(k, ensure_ascii=False) for k in names)} given twice in an object; only "
            f"{'its last value is' if len(names) == 1 else 'the last value of each is'} read")


def _parse_json_doc(doc, text: str, path: str, located: bool) -> tuple[Dataset, list[Problem]]:
    lines = _JsonLines(text)
    if isinstance(doc, list):  # a JSON array of chat records, as some tools write: name the item and its line
        return _parse_records(doc, path, lambda i: lines.of(None, i), lambda i: f"item [{i}]: ", located)
    if not isinstance(doc, dict) or not ({"format", "facts", "dialogues"} & doc.keys()):
        raise DatasetError(f"{path}: not an OpenCL LLM Studio dataset (no \"facts\" or \"dialogues\")")
    if doc.get("format", FORMAT_NAME) != FORMAT_NAME:
        raise DatasetError(f"{path}: unknown format {doc.get('format')!r}")
    version = doc.get("version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DatasetError(f"{path}: field 'version' must be a whole number 1 or more, got {json.dumps(version)}")
    if version > FORMAT_VERSION:
        raise DatasetError(f"{path}: dataset version {version!r} is newer than this app reads "
                           f"({FORMAT_VERSION})")

    ds, problems = Dataset(), []
    read: dict[str, list[int]] = {"facts": [], "dialogues": []}  # each entry's index in its list

    def bad(msg: str, key: str | None = None, i: int = 0) -> None:  # key: the list of item i at fault
        problems.append(Problem(path, lines.of(key, i) if key else None, msg))

    facts = doc.get("facts", [])
    if not isinstance(facts, list):
        bad("\"facts\" must be a list")
        facts = []
    for i, f in enumerate(facts):
        if isinstance(f, str) and len(f) > MAX_ENTRY_CHARS:
            bad(f"facts[{i}]: {_too_long(len(f))}", "facts", i)
        elif isinstance(f, str) and _lone_surrogate(f):
            bad(f"facts[{i}]: {_SURROGATE}", "facts", i)
        elif isinstance(f, str):
            ds.facts.append(f)
            read["facts"].append(i)
        else:
            bad(f"facts[{i}]: not text, skipped", "facts", i)
    dialogues = doc.get("dialogues", [])
    if not isinstance(dialogues, list):
        bad("\"dialogues\" must be a list")
        dialogues = []
    for i, d in enumerate(dialogues):
        turns = d.get("turns") if isinstance(d, dict) else None
        system = d.get("system") if isinstance(d, dict) else None
        if not isinstance(turns, list) or not (system is None or isinstance(system, str)):
            bad(f"dialogues[{i}]: needs a \"turns\" list and a text or null \"system\", skipped", "dialogues", i)
            continue
        pairs = []
        for t in turns:
            if not (isinstance(t, dict) and isinstance(t.get("user"), str)
                    and isinstance(t.get("assistant"), str)):
                pairs = None
                break
            pairs.append((t["user"], t["assistant"]))
        if pairs is None:
            bad(f"dialogues[{i}]: each turn needs text \"user\" and \"assistant\", skipped", "dialogues", i)
            continue
        longest = max(len(x) for x in [system or "", *(x for p in pairs for x in p)])
        if longest > MAX_ENTRY_CHARS:
            bad(f"dialogues[{i}]: a message of {_too_long(longest)}", "dialogues", i)
            continue
        if _lone_surrogate(system, *(x for p in pairs for x in p)):
            bad(f"dialogues[{i}]: a message {_SURROGATE}", "dialogues", i)
            continue
        ds.dialogues.append(Dialogue(pairs, system))
        read["dialogues"].append(i)
    if located:
        at = {k: [(lines.of(k, i), f"{k}[{i}]") for i in read[k]] for k in read}
        ds.origin = Origin.of(path, ds, at["facts"], at["dialogues"])
    return ds, problems


def _parse_jsonl(text: str, path: str, located: bool = False,
                 notes: list[str] | None = None) -> tuple[Dataset, list[Problem]]:
    records, lines, problems = [], [], []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            repeated: list[str] = []
            records.append(loads(line, repeated if notes is not None else None))
            lines.append(n)
            if repeated:
                notes.append(f"{path}:{n}: {_repeated_message(repeated)}")
        except json.JSONDecodeError as e:
            problems.append(Problem(path, n, f"not valid JSON ({e.msg}), skipped"))
        except RecursionError:
            problems.append(Problem(path, n, "JSON nested too deeply, skipped"))
    ds, more = _parse_records(records, path, lambda i: lines[i], located=located)
    return ds, problems + more


def _parse_records(records: list, path: str, line_of, name=lambda i: "",
                   located: bool = False) -> tuple[Dataset, list[Problem]]:
    """Chat records (JSONL lines, a JSON list's items): ``line_of(i)`` the line of record ``i``, ``name(i)``
    what a problem's message begins with (a JSON list's "item [i]: ")."""
    ds, problems = Dataset(), []
    facts, dialogues = [], []  # the record of each entry

    def bad(i: int, msg: str) -> None:
        problems.append(Problem(path, line_of(i), name(i) + msg))

    for i, rec in enumerate(records):
        err = None
        # a fact: {"text": "..."}, or the text alone (a JSON list of strings, the first thing a user writes)
        text = rec if isinstance(rec, str) else rec.get("text") if isinstance(rec, dict) and "messages" not in rec \
            else None
        if isinstance(rec, dict) and "text" in rec and "messages" not in rec and not isinstance(text, str):
            kind = {bool: "true or false", int: "a number", float: "a number", list: "a list", dict: "an object"}
            bad(i, f"\"text\" must be a string, not {kind.get(type(text), 'null')}, skipped")
            continue
        if isinstance(text, str):
            text = text.strip()
            if len(text) > MAX_ENTRY_CHARS:
                bad(i, _too_long(len(text)))
            elif _lone_surrogate(text):
                bad(i, _SURROGATE)
            elif has_text(text):
                ds.facts.append(text)
                facts.append(i)
            else:
                bad(i, "no visible text (only control characters), skipped" if text else "empty text, skipped")
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list):
            err = "expected {\"messages\": [...]}, {\"text\": ...} or a string"
        else:
            dialogue, err = _messages_to_dialogue(rec["messages"])
            if dialogue is not None:
                ds.dialogues.append(dialogue)
                dialogues.append(i)
        if err:
            bad(i, f"{err}, skipped")
    if located:
        def at(which: list[int]) -> list:  # (line, name) of each of these records
            return [(line_of(i), name(i).removesuffix(": ") or None) for i in which]
        ds.origin = Origin.of(path, ds, at(facts), at(dialogues))
    return ds, problems


def _messages_to_dialogue(messages: list) -> tuple[Dialogue | None, str | None]:
    system, turns, pending = None, [], None
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            return None, f"message {k + 1} is not an object"
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant"):
            return None, f"message {k + 1} has unknown role {role!r} (expected system, user or assistant)"
        if not isinstance(content, str):
            return None, f"message {k + 1} has no text content"
        if _lone_surrogate(content):
            return None, f"message {k + 1} {_SURROGATE.removesuffix(', skipped')}"
        content = content.strip()
        if len(content) > MAX_ENTRY_CHARS:
            return None, f"message {k + 1}: {_too_long(len(content)).removesuffix(', skipped (split it into shorter facts)')}"
        if not has_text(content):
            content = ""
        if role == "system":
            if k != 0:
                return None, f"message {k + 1}: a system message must come first"
            system = content or None
        elif role == "user":
            if pending is not None:
                return None, f"message {k + 1}: two user messages in a row"
            if not content:
                return None, f"message {k + 1}: empty user message"
            pending = content
        else:
            if pending is None:
                return None, f"message {k + 1}: an assistant message must follow a user message"
            if not content:
                return None, f"message {k + 1}: empty assistant message"
            turns.append((pending, content))
            pending = None
    if pending is not None:
        return None, "the last user message has no assistant answer"
    if not turns:
        return None, "no user/assistant messages"
    return Dialogue(turns, system), None


def _too_long(n: int) -> str:
    return (f"{n:,} characters, longer than the {MAX_ENTRY_CHARS:,} an entry may have, skipped "
            "(split it into shorter facts)")


_NO_ANSWER = "'User:' line without an 'Assistant:' answer, skipped"


def _parse_text(text: str, path: str, located: bool = False) -> tuple[Dataset, list[Problem]]:
    ds, problems = Dataset(), []
    fact_lines, dialogue_lines = [], []  # each entry's (first) line
    turns: list[tuple[str, str]] = []
    system: str | None = None
    system_line = 0  # line of a pending "System:" line, 0 when there is none
    question: str | None = None
    question_line = first_line = 0  # first_line: of the dialogue's first turn
    answer_line = 0  # the line of the last 'Assistant:' answer
    other_roles = False  # a line like "Q: ..." was named

    def end_dialogue() -> None:
        nonlocal turns, system, system_line, question
        if question is not None:
            problems.append(Problem(path, question_line, _NO_ANSWER))
        if turns:
            ds.dialogues.append(Dialogue(turns, system))
            dialogue_lines.append((system_line or first_line, None))
        elif system_line:
            problems.append(Problem(path, system_line, "'System:' line without a dialogue after it, skipped"))
        turns, system, system_line, question = [], None, 0, None

    for n, raw in enumerate(text.split("\n"), 1):
        if len(raw) > MAX_ENTRY_CHARS:
            end_dialogue()
            problems.append(Problem(path, n, _too_long(len(raw))))
            continue
        line = raw.strip()
        if line and not has_text(line):
            end_dialogue()
            problems.append(Problem(path, n, "no visible text (only control characters such as NUL bytes), skipped"))
            continue
        m = _ROLE_LINE.match(line)
        if not line or not m:
            if line and turns and question is None and answer_line == n - 1:  # a wrapped answer, likely
                problems.append(Problem(path, n, f"text right after the answer on line {n - 1} is read as a fact, "
                                                 "not as more of that answer (an answer is one line; leave a blank "
                                                 "line before a fact)"))
            end_dialogue()
            if line and not other_roles and (other := _OTHER_ROLE.match(line)):  # "Q: ..." / "A: ...": said once
                other_roles = True
                problems.append(Problem(path, n, f"'{other.group(1)}:' is read as a fact, not as a dialogue's line "
                                                 "(nor is any later line like it); a dialogue's lines begin 'User:' "
                                                 "and 'Assistant:'"))
            if line:
                ds.facts.append(line)
                fact_lines.append((n, None))
            continue
        role, content = m.group(1).lower(), m.group(2).strip()
        if not has_text(content):  # "Assistant: " followed by NUL bytes is an empty answer
            content = ""
        if role == "system":
            end_dialogue()
            system, system_line = content or None, n
        elif role == "user":
            if question is not None:
                problems.append(Problem(path, question_line, _NO_ANSWER))
            if content:
                question, question_line = content, n
            else:
                question = None
                problems.append(Problem(path, n, "empty 'User:' line, skipped"))
        else:
            if question is None:
                problems.append(Problem(path, n, "'Assistant:' line without a 'User:' line before it, skipped"))
            elif not content:
                problems.append(Problem(path, n, "empty 'Assistant:' answer, skipped with its question"))
                question = None
            else:
                first_line = first_line if turns else question_line
                turns.append((question, content))
                question, answer_line = None, n
    end_dialogue()
    if located:
        ds.origin = Origin.of(path, ds, fact_lines, dialogue_lines)
    return ds, problems
