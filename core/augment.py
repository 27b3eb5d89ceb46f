"""More ways to see each fact, made from the dataset itself (issue 9, items 4 and 5).

Small transformers answer questions about a fact only when they saw facts of that kind asked about in
the form of questions and answers while they learned the facts (Allen-Zhu & Li 2023, "Physics of
Language Models: Part 3.1, Knowledge Storage and Extraction": knowledge becomes extractable when it is
seen in varied forms and mixed with question-answer data). So tuning gets, besides the dataset's own
dialogues and the replayed facts:

- :func:`fact_questions`: questions for facts that have no dialogue, written with the dataset's own
  question patterns. A dialogue whose answer is one of the facts gives a pattern: the proper name they
  share (e.g. a town) is its slot, the question with the slot is the pattern, the fact with the slot
  is its shape. A fact without a dialogue gets the question of the dialogue whose fact shape it matches
  best (word order compared with :class:`difflib.SequenceMatcher`), the proper name of that fact in
  the slot, and itself as the answer.
- :func:`conversations`: several unrelated dialogues one after another as one conversation, so the
  model answers the latest question whatever came before it (a chat rarely holds one question only).

Both are pure functions of the dataset and a seed (a resumed run sees the same examples).
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.dataset import Dataset, Dialogue

SLOT = "\x00"
"""Stands for the proper name in a pattern (a character no dataset text contains)."""

MIN_SIMILARITY = 0.6
"""Least :class:`difflib.SequenceMatcher` ratio between a fact and a pattern's fact shape (words) for the
pattern to ask about the fact: facts of one kind share their words except the values."""

_WORD = re.compile(r"[\w'’-]+|[^\w\s]", re.UNICODE)


@dataclass(frozen=True)
class Pattern:
    """A question pattern: ``question`` (text) and ``shape`` (its answer, a fact, as words) with ``SLOT`` for
    the proper name they share; ``dialogue`` the dataset dialogue it came from."""

    question: str
    shape: tuple[str, ...]
    dialogue: int


def words(text: str) -> list[str]:
    """Words and punctuation marks of ``text`` (a possessive ``'s`` stays with its word)."""
    return _WORD.findall(text)


def _names(ws: list[str]) -> list[str]:
    """Candidate proper names of a sentence: capitalised words (a possessive ``'s`` cut off)."""
    out = []
    for w in ws:
        base = re.sub(r"['’]s$", "", w)
        if base[:1].isupper() and base[1:].islower() and len(base) > 1 and base not in out:
            out.append(base)
    return out


def _slotted(ws: list[str], name: str) -> tuple[str, ...]:
    return tuple(SLOT + w[len(name):] if re.sub(r"['’]s$", "", w) == name else w for w in ws)


def patterns(dataset: Dataset) -> list[Pattern]:
    """Question patterns of the dataset's single-turn dialogues whose answer is one of its facts and
    shares a proper name with the question (the longest shared name is the slot)."""
    facts = {f.strip() for f in dataset.facts}
    out = []
    for i, d in enumerate(dataset.dialogues):
        if len(d.turns) != 1 or d.system:
            continue
        q, a = d.turns[0]
        if a.strip() not in facts:
            continue
        qw, aw = words(q), words(a)
        shared = [n for n in _names(aw) if n in _names(qw)]
        if not shared:
            continue
        name = max(shared, key=len)
        question = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", SLOT, q.strip())
        out.append(Pattern(question, _slotted(aw, name), i))
    return out


class _Index:
    """Word-set overlap (Jaccard) of a shape with every pattern's shape, as one matrix product."""

    def __init__(self, pats: list[Pattern]):
        self.vocab = {w: k for k, w in enumerate(sorted({w for p in pats for w in p.shape}))}
        self.sets = np.zeros((len(pats), len(self.vocab)), np.float32)
        for r, p in enumerate(pats):
            self.sets[r, [self.vocab[w] for w in set(p.shape)]] = 1.0
        self.sizes = self.sets.sum(axis=1)

    def closest(self, shape: tuple[str, ...], n: int) -> list[int]:
        have = {self.vocab[w] for w in shape if w in self.vocab}
        if not have:
            return []
        inter = self.sets[:, sorted(have)].sum(axis=1)
        jaccard = inter / (self.sizes + len(set(shape)) - inter)
        return np.argsort(-jaccard, kind="stable")[:n].tolist()


def _matches(fact_words: list[str], pats: list[Pattern], index: _Index, closest: int = 4) -> list[tuple[float, int, str]]:
    """(ratio, pattern index, proper name) of the ``closest`` patterns (by word-set overlap) for each
    candidate proper name of the fact, best first."""
    out = []
    for name in _names(fact_words):
        shape = _slotted(fact_words, name)
        # cheap word-set overlap first; the order-aware ratio for the closest few
        out += [(difflib.SequenceMatcher(None, shape, pats[k].shape, autojunk=False).ratio(), k, name)
                for k in index.closest(shape, closest)]
    return sorted(out, key=lambda m: -m[0])


def fact_questions(dataset: Dataset, per_fact: int = 1, seed: int = 0) -> list[tuple[int, str, str]]:
    """Questions for the facts that no dialogue answers, in the dataset's own question patterns.

    Args:
        dataset: a core.dataset.Dataset.
        per_fact: questions per fact (different patterns of the best-matching kind, when it has several).
        seed: picks among equally good patterns.

    Returns:
        ``(fact index, question, answer)`` per question, in fact order; the answer is the fact itself.
        Empty when no dialogue answers with a fact (nothing to learn the patterns from).
    """
    pats = patterns(dataset)
    if not pats:
        return []
    answered = {d.turns[0][1].strip() for d in dataset.dialogues if len(d.turns) == 1}
    index = _Index(pats)
    rng = np.random.default_rng([seed, 9])
    out = []
    for i, fact in enumerate(dataset.facts):
        if fact.strip() in answered or not fact.strip():
            continue
        found = _matches(words(fact), pats, index)
        if not found or found[0][0] < MIN_SIMILARITY:
            continue
        best, _, name = found[0]
        # the patterns of the same kind (nearly as close as the best one) give the different wordings
        questions = list(dict.fromkeys(pats[k].question for r, k, n in found
                                       if n == name and r >= max(MIN_SIMILARITY, best - 0.15)))
        for k in rng.permutation(len(questions))[:per_fact]:
            out.append((i, questions[k].replace(SLOT, name), fact.strip()))
    return out


def conversations(dialogues: list[Dialogue], count: int, length: tuple[int, int] = (2, 4), seed: int = 0,
                  fits: Callable[[list[tuple[str, str]]], bool] | None = None) -> list[list[tuple[str, str]]]:
    """``count`` conversations, each the turns of ``length[0]..length[1]`` different dialogues (drawn
    with ``default_rng([seed, 5])``) one after another.

    Args:
        dialogues: core.dataset.Dialogue objects (their turns; system messages are left out).
        fits: ``fits(turns) -> bool``, e.g. "fits the context"; a conversation that does not fit loses its
            first dialogues until it does (one dialogue is always kept).

    Returns:
        Lists of ``(user, assistant)`` turns; empty when there are fewer than two dialogues.
    """
    usable = [d for d in dialogues if d.turns]
    if len(usable) < 2 or count <= 0:
        return []
    rng = np.random.default_rng([seed, 5])
    out = []
    for _ in range(count):
        k = int(rng.integers(length[0], length[1] + 1))
        picked = rng.choice(len(usable), size=min(k, len(usable)), replace=False)
        parts = [list(usable[j].turns) for j in picked]
        while len(parts) > 1 and fits is not None and not fits([t for p in parts for t in p]):
            parts = parts[1:]
        out.append([t for p in parts for t in p])
    return out


__all__ = ["Pattern", "patterns", "fact_questions", "conversations", "words", "SLOT", "MIN_SIMILARITY"]
