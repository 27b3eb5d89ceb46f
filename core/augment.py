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

MIN_SIMILARITY = 0.6
"""Least :class:`difflib.SequenceMatcher` ratio between the template words of a fact and of a pattern's
fact for the pattern to ask about the fact: facts of one kind share their template words."""

TEMPLATE_MIN = 3
"""A word that occurs in at least sqrt(facts) of the facts (and at least this many) is a template word
("the", "costs", "born"); rarer words are names and values. An item's name occurs in its own few facts,
a template word in a share of every item's: the geometric mean of one fact and all of them lies between
the two from a few dozen facts to many thousands (40 towns of 10 facts: names in 10, threshold 20,
template words in 40; 300 people of 6 facts: names in 6, threshold 42, template words in 300)."""

SUFFIX_MAX = 3
"""Letters by which two forms of a word may differ at their end ("weigh", "weighs", "weighed")."""

_WORD = re.compile(r"([\w'’-]+|[^\w\s])(\s*)", re.UNICODE)
_POSSESSIVE = re.compile(r"['’]s$")
_PUNCT = re.compile(r"[^\w\s]")


@dataclass(frozen=True)
class Pattern:
    """A dataset dialogue linked to the fact its answer states: ``question`` and ``answer`` (texts),
    ``fact`` (the fact's index) and ``dialogue`` (the dialogue's index)."""

    question: str
    answer: str
    fact: int
    dialogue: int


def words(text: str) -> list[str]:
    """Words and punctuation marks of ``text`` (a possessive ``'s`` stays with its word)."""
    return [w for w, _ in _WORD.findall(text)]


def _tokens(text: str) -> list[tuple[str, str]]:
    """(word, whitespace after it) of ``text``: joined back they give the text without leading space."""
    return _WORD.findall(text)


def _key(word: str) -> str:
    """A word as compared between texts: lower case, a possessive ``'s`` cut off."""
    return _POSSESSIVE.sub("", word.lower())


class _Facts:
    """The dataset's facts as word keys, their document frequencies and template words."""

    def __init__(self, facts: list[str]):
        self.tokens = [_tokens(f.strip()) for f in facts]
        self.keys = [[_key(w) for w, _ in t] for t in self.tokens]
        self.key_sets = [set(ks) for ks in self.keys]
        self.df: dict[str, int] = {}
        self.postings: dict[str, list[int]] = {}
        # words some fact writes in lower case ("when" in "... in December when the colonies ..."), and those some
        # fact writes with a capital inside a sentence (names: "Bill" of "Dawn's brother is Bill.")
        self.lower = {_key(w) for t in self.tokens for w, _ in t if w.islower()}
        self.named = {_key(w) for t in self.tokens for n, (w, _) in enumerate(t)
                      if n and w[:1].isupper() and t[n - 1][0] not in (".", "!", "?")}
        for i, ks in enumerate(self.key_sets):
            for k in ks:
                self.df[k] = self.df.get(k, 0) + 1
                self.postings.setdefault(k, []).append(i)
        self.threshold = max(TEMPLATE_MIN, len(facts) ** 0.5)
        self.n = len(facts)

    def rare(self, k: str) -> bool:
        return 0 < self.df.get(k, 0) < self.threshold

    def signature(self, i: int) -> tuple[str, ...]:
        return tuple(k for k in self.keys[i] if not self.rare(k))

    def idf(self, k: str) -> float:
        return float(np.log((self.n + 1) / (self.df.get(k, 0) + 1)))


def knowledge_bits(facts: list[str]) -> float:
    """Bits of knowledge in ``facts``, roughly: each name or value word of a fact (a rare word, see
    :data:`TEMPLATE_MIN`) is one of the dataset's distinct rare words, log2 of their count bits each; the
    template words carry none. (Allen-Zhu & Li 2024, "Physics of Language Models: Part 3.3", measure
    knowledge the same way: the bits needed to tell each stored value among the possible ones.)"""
    fx = _Facts(facts)
    rare = {k for k in fx.df if fx.rare(k)}
    if len(rare) < 2:
        return 0.0
    per_word = float(np.log2(len(rare)))
    return per_word * sum(1 for ks in fx.keys for k in ks if k in rare)


def _link(fx: _Facts, question: str, answer: str) -> int | None:
    """Index of the fact that the dialogue (``question``, ``answer``) asks about: among the facts that
    hold the question's rare words (names), the one sharing the most (idf-weighted) of the answer's other
    words; None when the answer shares none with them (not the answer's alone then: "How long is the warranty on
    the Quaanu M82 scale?" -> "The warranty lasts 3 years." is no question about another item's warranty of 3 years).
    A question with no rare word a fact holds ("When does the club meet?") is linked by its answer alone
    (:func:`_link_by_answer`). A word that starts a sentence of the question is no name where a fact writes it in
    lower case and none with a capital inside a sentence: "When is the honey harvested?" was linked to "Varroa is
    treated ... in December when the colonies have no brood.", the one fact holding "when", not to "We harvest honey
    twice a year, ..." that its answer restates ("Bill does which job?" keeps "Bill" of "Dawn's brother is Bill.", and
    "Bill's job?" its "Bill")."""
    qw = words(question)
    qk = {_key(w) for w in qw}
    starts = {_key(w) for n, w in enumerate(qw)  # (a possessive, "Bill's job?", names its owner)
              if (n == 0 or qw[n - 1] in (".", "!", "?")) and not _POSSESSIVE.search(w)}
    rare = [k for k in qk if fx.rare(k) and not (k in starts and k in fx.lower and k not in fx.named)]
    if not rare:
        return _link_by_answer(fx, answer)
    hits = _hits(fx, rare)
    most = max(hits.values())
    ak = {p for k in {_key(w) for w in words(answer)} - qk for p in _parts(k)}
    best, best_score = None, (0.0, 0.0)
    for i in sorted(i for i, h in hits.items() if h == most):
        shares = [_shares(fx, i, k) for k in ak]
        score = (sum(e for e, _ in shares), sum(f for _, f in shares))
        if score[0] > best_score[0] + 1e-9 or (abs(score[0] - best_score[0]) <= 1e-9 and score[1] > best_score[1] + 1e-9):
            best, best_score = i, score
    return best


def _hits(fx: _Facts, keys) -> dict[int, int]:
    """``{fact index: how many of keys it holds}`` over the facts holding any."""
    hits: dict[int, int] = {}
    for k in keys:
        for i in fx.postings.get(k, ()):
            hits[i] = hits.get(i, 0) + 1
    return hits


def _parts(k: str) -> list[str]:
    """A word key and, when hyphenated, its parts ("2-year": "2-year", "2", "year")."""
    return [k, *k.split("-")] if "-" in k else [k]


def _shares(fx: _Facts, i: int, k: str) -> tuple[float, float]:
    """How much fact ``i`` holding answer word ``k`` says: (the idf of its word that is ``k``, a hyphenated word's parts
    included: "4" and "year" of "4-year"; the same with another form of ``k`` too, :func:`_holds` on words of letters
    only: "years" and "year", "tuesdays" and "tuesday", not "1920" and "19200"), 0.0 where it holds none.
    :func:`_link` compares the exact sums first ("Mark." is the fact of "Mark Ellis", not of "the market"), then the
    others (an answer "2 years." linked nothing where the fact said "a 2-year warranty": 170 of the 4,740 dialogues of
    240 generated datasets)."""
    exact = form = 0.0
    for x in fx.key_sets[i]:
        parts = _parts(x)
        same = k in parts
        if same or (k.isalpha() and _holds([p for p in parts if p.isalpha()], k)):
            form = max(form, fx.idf(x))
            exact = max(exact, fx.idf(x)) if same else exact
    return exact, form


def _link_by_answer(fx: _Facts, answer: str) -> int | None:
    """The fact an answer restates, for a question that names nothing ("When does the club meet?" -> "Every
    Saturday at 8 am outside the Lantern Cafe." for "The club meets every Saturday at 8 am outside the Lantern
    Cafe."; a new user's dialogues were counted as asking about no fact): the one fact holding the most of the
    answer's rare words, at least two of them and at least half; None for an answer of fewer rare words ("Yes.")
    or one that as many facts hold."""
    ak = {k for k in (_key(w) for w in words(answer)) if fx.rare(k)}
    hits = _hits(fx, ak)
    if not hits:
        return None
    most = max(hits.values())
    best = [i for i, h in hits.items() if h == most]
    return best[0] if len(best) == 1 and most >= 2 and 2 * most >= len(ak) else None


def patterns(dataset: Dataset) -> list[Pattern]:
    """The dataset's single-turn dialogues (no system message) linked to the fact each one asks about
    (:func:`_link`): the question shares a name with the fact and the answer states its value, in any
    wording ("How much is the X?" -> "It costs $42." for "The X costs $42.")."""
    fx = _Facts(dataset.facts)
    return _patterns(dataset, fx)


def asked_facts(dataset: Dataset) -> set[int]:
    """Indices of the facts that a turn of one of the dataset's dialogues asks about (:func:`_link`: its question
    names the fact's item and its answer states the fact's value), in dialogues of any length."""
    fx = _Facts(dataset.facts)
    return {j for d in dataset.dialogues for q, a in d.turns for j in [_link(fx, q, a)] if j is not None}


def _patterns(dataset: Dataset, fx: _Facts) -> list[Pattern]:
    out = []
    for i, d in enumerate(dataset.dialogues):
        if len(d.turns) != 1 or d.system:
            continue
        q, a = d.turns[0]
        j = _link(fx, q, a)
        if j is not None:
            out.append(Pattern(q.strip(), a.strip(), j, i))
    return out


def _substitute(text: str, subs: list[tuple[list[str], list[tuple[str, str]]]]) -> tuple[str, set[int]]:
    """``text`` with every span of words whose keys equal a substitution's old keys replaced by its new
    words (each with the spacing of the fact it came from; a possessive ``'s`` of the text kept).
    Returns (new text, indices in ``subs`` of the substitutions made)."""
    toks = _tokens(text.strip())
    keys = [_key(w) for w, _ in toks]
    out: list[tuple[str, str]] = []
    done: set[int] = set()
    i = 0
    while i < len(toks):
        for s, (old, new) in enumerate(subs):
            n = len(old)
            if n and keys[i:i + n] == old:
                last_word, last_space = toks[i + n - 1]
                new_toks = [(w, s) for w, s in new]
                start = i == 0 or toks[i - 1][0] in (".", "!", "?")  # a sentence's start, not a name inside one
                if new_toks and start and toks[i][0][:1].isupper() and new_toks[0][0][:1].islower():
                    new_toks[0] = (new_toks[0][0][:1].upper() + new_toks[0][0][1:], new_toks[0][1])
                if new_toks:
                    w, _ = new_toks[-1]
                    base = _POSSESSIVE.sub("", w)
                    suffix = last_word[len(_POSSESSIVE.sub("", last_word)):]
                    new_toks[-1] = (base + suffix, last_space)
                out += new_toks
                i += n
                done.add(s)
                break
        else:
            out.append(toks[i])
            i += 1
    return "".join(w + s for w, s in out).strip(), done


def _differing_spans(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> list[tuple[list[str], list]]:
    """Where the words of fact ``a`` and fact ``b`` (``_tokens``) differ, as ``(old keys of a, new tokens of
    b)``, longest first: each :class:`difflib.SequenceMatcher` replacement, and a run of changes joined by
    punctuation inside a word ("42" "." "50": no space around it) as one span, so that a value of another
    length is put in whole ("$42.50" for "$7", not "$7.50" or "$42."). A change whose old or new side is
    empty (a word only one fact has) cannot be found or put in a text and is left out."""
    ka, kb = [_key(w) for w, _ in a], [_key(w) for w, _ in b]
    ops = difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes()
    spans = [[i1, i2, j1, j2] for op, i1, i2, j1, j2 in ops if op == "replace"]
    run: list[int] | None = None
    for op, i1, i2, j1, j2 in ops:
        inside = op == "equal" and run is not None and all(_PUNCT.fullmatch(k) for k in ka[i1:i2]) \
            and not any(s for _, s in a[i1 - 1:i2]) and not any(s for _, s in b[j1 - 1:j2])
        if op != "equal":
            run = [run[0], i2, run[2], j2] if run else [i1, i2, j1, j2]
        elif not inside:
            if run and run not in spans:
                spans.append(run)
            run = None
    if run and run not in spans:
        spans.append(run)
    out = []
    for i1, i2, j1, j2 in spans:
        while i2 > i1 and j2 > j1 and ka[i2 - 1] == kb[j2 - 1]:  # a span ends where both facts agree again
            i2, j2 = i2 - 1, j2 - 1
        if i2 > i1 and j2 > j1 and (ka[i1:i2], b[j1:j2]) not in out:
            out.append((ka[i1:i2], b[j1:j2]))
    return sorted(out, key=lambda s: (-len(s[0]), -len(s[1])))  # the longest first (a name before its words)


def _dropped(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> set[str]:
    """Keys of the words of fact ``a`` (``_tokens``) that the alignment with fact ``b`` (as
    :func:`_differing_spans`') drops: those of a :class:`difflib.SequenceMatcher` deletion, punctuation left out."""
    ka, kb = [_key(w) for w, _ in a], [_key(w) for w, _ in b]
    ops = difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes()
    return {k for op, i1, i2, _, _ in ops if op == "delete" for k in ka[i1:i2] if not _PUNCT.fullmatch(k)}


def _analogy(fx: _Facts, p: Pattern, j: int, question: str, answer: str) -> tuple[str, str] | None:
    """The question and answer that pattern ``p`` gives fact ``j``: the words in which fact ``j`` differs
    from the pattern's fact (the item, the values; aligned with :class:`difflib.SequenceMatcher`) put into
    the pattern's question and answer. None when the question would not name fact ``j``'s item (no rare
    word of the question that its fact holds was replaced), or when the facts differ in more than the
    question and answer state: a difference that neither holds is another kind of fact ("The weight of the
    X is 600 grams." against "The price of the Y is $290.": "How heavy is the Y?" -> "About $290." would be
    wrong; an answer that is the fact itself states them all); or when the new question or answer holds a word of
    the pattern's fact (or another form of it, :func:`_holds`) that fact ``j`` lacks ("What does the Y weigh?" for
    "The Y went on sale in 2018."). A question whose relation word is put in with the item ("What price is the
    Y?" -> "In $12." from "What colour is the X?" -> "In white.") is kept: it asks for fact ``j``'s value."""
    a_keys, b_keys = fx.keys[p.fact], fx.keys[j]
    subs = _differing_spans(fx.tokens[p.fact], fx.tokens[j])
    # a word where the other fact has only punctuation ("does" and ","): the facts are worded differently, not
    # two of one kind ("The warranty does not cover crash damage." against "Parts are covered by ..., not by us."
    # wrote ", the warranty by us?" -> "No, the warranty , not by us.")
    if any(_only_punctuation(old) != _only_punctuation([_key(w) for w, _ in new]) for old, new in subs):
        return None  # ("." against "!" is a difference of punctuation only: facts of one kind)
    q_keys = [_key(w) for w in words(question)]
    item = {k for k in q_keys if fx.rare(k) and k in a_keys}
    changed = {k for old, _ in subs for k in old}
    if not item & changed:
        return None
    # the pattern's value (its answer's words the question lacks) must have a counterpart in fact j: where the
    # alignment drops it, fact j states no such value ("The club workshop is open on Wednesday evenings." against
    # "Marta Kowal is the club captain.": "Who is the club workshop is open on Wednesday evenings?", a new user)
    value = {_key(w) for w in words(answer)} - set(q_keys)
    if value & (_dropped(fx.tokens[p.fact], fx.tokens[j]) - changed):  # (not the "50" of "$42.50" for "$7")
        return None
    q, in_q = _substitute(question, subs)
    if not in_q:
        return None
    # the item's span took the relation along: its words before its first name or number (a word some fact writes
    # with a capital inside a sentence, or a digit: relation words are as rare as names in a small dataset) that the
    # question holds outside the span ("The colour of the Y is white." gave "What colour is the colour of the Y?", a
    # break-it helper; an item's own name, "the Book of Hours", is put in whole)
    for s in in_q:
        old, new = subs[s]
        n = next((n for n, (w, _) in enumerate(new) if _key(w) in fx.named or w[:1].isdigit()), 0)  # (0: no name, a
        # relation or value put in for another: "bakery cat" for "head baker" of "... of Marrowby Bakery?")
        if any(not _PUNCT.fullmatch(k) and q_keys.count(k) > old.count(k) for k in (_key(w) for w, _ in new[:n])):
            return None
    if answer.strip() == " ".join(_fact_text(fx, p.fact).split()):
        a = _fact_text(fx, j)
    else:
        a, in_a = _substitute(answer, subs)
        if _left_out(subs, in_q | in_a):
            return None
    # every name and value the new question and answer state must be fact j's own
    if any(fx.rare(k) and k not in b_keys for k in (_key(w) for w in words(q) + words(a))):
        return None
    # and every word of theirs that the pattern's fact holds ("weigh" of "weighs", "room"): the question asks
    # for what the pattern's fact says ("What does the X weigh?" is not a question for "The Y went on sale in 2018.")
    if any(_holds(a_keys, k) and not _holds(b_keys, k) for k in (_key(w) for w in words(q) + words(a))):
        return None
    return q, a


def _only_punctuation(keys: list[str]) -> bool:
    return all(_PUNCT.fullmatch(k) for k in keys)


def _holds(keys: list[str], k: str) -> bool:
    """Whether ``keys`` hold word key ``k`` or another form of it (one of them the other plus at most
    :data:`SUFFIX_MAX` letters, both at least 4 long: "weigh" and "weighs", "cost" and "costs")."""
    return any(k == x or (min(len(k), len(x)) >= 4 and abs(len(k) - len(x)) <= SUFFIX_MAX
                          and (k.startswith(x) or x.startswith(k))) for x in keys)


def _left_out(subs: list[tuple[list[str], list]], used: set[int]) -> list[int]:
    """Indices of the substitutions (:func:`_differing_spans`) neither made (``used``) nor inside one made (the
    "2" of "2,200")."""
    def inside(a: list[str], b: list[str]) -> bool:
        return any(b[i:i + len(a)] == a for i in range(len(b) - len(a) + 1))
    return [s for s in range(len(subs)) if s not in used and not any(inside(subs[s][0], subs[u][0]) for u in used)]


def _fact_text(fx: _Facts, i: int) -> str:
    return "".join(w + s for w, s in fx.tokens[i]).strip()


def fact_questions(dataset: Dataset, per_fact: int = 1, seed: int = 0) -> list[tuple[int, str, str]]:
    """Questions and answers for the facts that no dialogue asks about, made by analogy with the dataset's
    own dialogues.

    Each dialogue linked to its fact (:func:`patterns`) is a pattern. A fact without a dialogue takes the
    patterns whose fact has the most similar template words (:data:`MIN_SIMILARITY` at least; e.g. "The
    X costs $42." and "The Y costs $7."), and each pattern's question and answer with the words in which
    the two facts differ put in (:func:`_analogy`): "How much is the X?" -> "It costs $42." gives "How
    much is the Y?" -> "It costs $7.". A dialogue whose answer is its fact word for word gives the fact
    itself as the answer. (Allen-Zhu & Li 2023, "Physics of Language Models: Part 3.1": knowledge is
    extractable when the facts were seen asked about while they were learned.)

    Args:
        dataset: a core.dataset.Dataset.
        per_fact: questions per fact (different patterns of the most similar kind, when it has several).
        seed: picks among equally similar patterns.

    Returns:
        ``(fact index, question, answer)`` per question, in fact order. Empty when no dialogue can be
        linked to a fact (nothing to learn the patterns from).
    """
    fx = _Facts(dataset.facts)
    pats = _patterns(dataset, fx)
    if not pats:
        return []
    linked = {p.fact for p in pats}
    rng = np.random.default_rng([seed, 9])
    by_sig: dict[tuple[str, ...], list[int]] = {}
    for k, p in enumerate(pats):
        by_sig.setdefault(fx.signature(p.fact), []).append(k)
    ratio_cache: dict[tuple, list[tuple[float, tuple[str, ...]]]] = {}
    out = []
    for j in range(len(dataset.facts)):
        if j in linked or not dataset.facts[j].strip():
            continue
        sig = fx.signature(j)
        if sig not in ratio_cache:
            scored = [(difflib.SequenceMatcher(None, sig, s, autojunk=False).ratio(), s) for s in by_sig]
            ratio_cache[sig] = sorted((r, s) for r, s in scored if r >= MIN_SIMILARITY)[::-1]
        made: list[tuple[str, str]] = []
        for _r, s in ratio_cache[sig]:
            group = by_sig[s]
            for k in rng.permutation(len(group)):
                p = pats[group[k]]
                qa = _analogy(fx, p, j, p.question, p.answer)
                if qa is not None and qa[0] not in {m[0] for m in made}:
                    made.append(qa)
                    if len(made) >= per_fact:
                        break
            if made:  # the most similar kind that gives a question is the fact's kind
                break
        out += [(j, q, a) for q, a in made]
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


__all__ = ["Pattern", "patterns", "asked_facts", "fact_questions", "knowledge_bits", "conversations", "words", "MIN_SIMILARITY"]
