"""The recall check: which facts and dialogue answers a model reproduces with greedy decoding.

All prompts are decoded together in batches on the device, with the model's own full forward
(``Model.last_logits`` on right-padded ``(batch, seq)`` prompts, one token longer per step; causal attention
makes the padding after a row's last real token invisible to it). No KV cache: a recall prompt plus its
answer is short, and one forward of ``batch`` rows costs about what one row costs on a GPU, so the whole
table takes (prompts / batch) x (answer tokens) forwards instead of prompts x answer tokens decode steps.
Rows that end (EOS, or longer than the expected answer allows) leave the batch; prompts are sorted by
length so a batch pads little.

:func:`recall_check` is a generator: it yields after every batch, so a training loop can report progress
and stop between two batches.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core import chat_format
from core.dataset import has_text, trainable_turns

if TYPE_CHECKING:
    from core.dataset import Dataset
    from core.model import Model
    from core.tokenizer import Tokenizer

KINDS = ("fact", "dialogue", "chat", "heldout", "question")
"""fact: a fact's rest from its first words; dialogue: each dialogue turn after its own earlier turns;
chat: a dialogue's question asked in the middle of a conversation (after other dialogues' turns);
heldout: questions about facts that no trained example asks about (``heldout=`` of the check);
question: the questions written for facts and trained (core.augment.fact_questions; ``questions=``), each as a
new conversation (a new user's run ended "Learned" while 3 of the 6 written for it were answered wrong)."""

ROW_TOKENS = 48
"""Tokens (prompt + answer) per row of a full recall batch; longer prompts go in smaller batches."""
CHAT_PROMPTS = 200
"""About this many dialogues (every one of a smaller dataset, evenly spaced) are also asked in the middle of
a conversation ("chat" kind); the towns data's 200 are all asked."""
CHAT_ROOM = 64
"""Tokens a chat leaves free for the answer (the chat's default max_tokens, core.generate.SamplingSettings):
a "chat" prompt keeps the history core.chat.ChatSession would keep."""
CHAT_BEFORE = 2
"""Dialogues before the one asked in a "chat" prompt (fewer when the context is full, as in core.chat)."""

FULL_CHECK_MAX = 5_000
"""Most prompts of one kind a full check (``sample=0``) asks, evenly spaced: a larger dataset's end-of-stage
table is a sample, and says so (:func:`sampled`)."""

ESTIMATE_MARGIN = 32
"""Tokens by which a chat prompt's history may be shorter than the sum of its turns encoded one by one."""

ANSWER_SLACK = 4
"""Tokens a decoded answer may run beyond the expected answer's token count before it is cut (it is wrong
then anyway; the slack covers a different tokenisation of the same text)."""


@dataclass
class RecallItem:
    """Whether the model reproduces one fact or one dialogue turn (greedy decoding)."""

    kind: str  # one of KINDS
    index: int
    prompt: str
    expected: str
    got: str
    ok: bool


@dataclass
class _Prompt:
    kind: str
    index: int
    prompt: str
    expected: str
    ids: list[int]
    max_new: int


def fact_split(text: str, prompt_words: int | None = None) -> tuple[str, str]:
    """Split a fact into (prompt, expected continuation) at a word boundary: after ``prompt_words`` words
    (:func:`fact_prompt_words`), or about 1/3 in when None. The prompt keeps at least one word and the
    continuation at least one."""
    words = text.split(" ")
    k = round(len(words) / 3) if prompt_words is None else prompt_words
    k = max(1, min(len(words) - 1, k))
    prompt = " ".join(words[:k])
    return prompt, text[len(prompt):]


def fact_prompt_words(facts: list[str]) -> list[int]:
    """Words of each fact that its recall prompt gives: about a third of them, and more until the prompt
    begins no other fact of the list (at most all but the last word).

    A fact is checked from its first words; when other facts begin with the same words ("Ada Stroud
    works as a baker." and "Ada Stroud was born in Oslo." share "Ada Stroud"), those words do not say
    which fact is asked for, and no model could reproduce more than one of them. So the prompt runs to
    the first word that is the fact's own ("Ada Stroud works"), and what is checked is the rest, its
    value included. Linear after one sort: the longest prefix a fact shares with any other is the longest
    it shares with a neighbour in sorted order.

    Returns:
        One word count per fact, in the order of ``facts``.
    """
    split = [f.split(" ") for f in facts]
    order = sorted(range(len(facts)), key=lambda i: split[i])

    def common(a: list[str], b: list[str]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    shared = [0] * len(facts)
    for a, b in zip(order, order[1:]):
        c = common(split[a], split[b])
        shared[a], shared[b] = max(shared[a], c), max(shared[b], c)
    return [max(round(len(w) / 3), shared[i] + 1) for i, w in enumerate(split)]


def chat_every(n_dialogues: int) -> int:
    """Every how many dialogues one is asked in the middle of a conversation: about ``CHAT_PROMPTS``."""
    return max(1, n_dialogues // CHAT_PROMPTS)


def chat_history(dialogues: list, i: int, before: int = CHAT_BEFORE) -> list[tuple[str, str]]:
    """The turns of the ``before`` dialogues preceding dialogue ``i`` (wrapping around), oldest first:
    the conversation a "chat" recall prompt asks dialogue ``i``'s first question in."""
    n = len(dialogues)
    picks = [(i - k) % n for k in range(min(before, n - 1), 0, -1)]
    return [t for j in picks for t in dialogues[j].turns]


TOO_LONG = "too long for the context to check"
ONE_WORD = "of a single word"
"""Why a fact or a dialogue answer is not checked (``left_out=`` of :func:`recall_prompts`): its prompt leaves
no room in the context for the answer; a fact of one word has no rest to reproduce."""


def recall_prompts(tok: Tokenizer, dataset: Dataset, context_length: int, kinds: tuple[str, ...] = KINDS,
                   heldout: list[tuple[str, str]] | tuple = (), sample: int = 0,
                   sizes: dict[str, int] | None = None,
                   left_out: dict[str, dict[str, int]] | None = None,
                   questions: list[tuple[str, str]] | tuple = ()) -> list[_Prompt]:
    """Every recall prompt of ``dataset``: facts (BOS + first words), each dialogue turn (the earlier
    turns and the question), every :func:`chat_every`-th dialogue's first question after the turns of
    other dialogues (oldest turns dropped until the answer fits, as core.chat.ChatSession does), and the
    ``heldout`` (question, answer) pairs. Prompts that leave no room for an answer in ``context_length``
    are left out. ``sample`` > 0 keeps at most that many prompts of each kind, evenly spaced (a quick
    check during training); 0 keeps all of them up to :data:`FULL_CHECK_MAX` per kind (the table at a
    stage's end: 100,000 facts had not been checked after 14 minutes).

    Args:
        tok: the tokenizer; dataset: its facts and dialogues; context_length: the model's.
        kinds: which of :data:`KINDS`; heldout: (question, answer) pairs of the "heldout" kind; questions: of the
            "question" kind.
        sample: prompts per kind (0: all, up to :data:`FULL_CHECK_MAX`).
        sizes: when given, filled with ``{kind: prompts before sampling}`` (for "n of N checked").
        left_out: when given, filled with ``{kind: {why: count}}`` for "fact" and "dialogue": the facts and the
            (trained) dialogue answers that get no prompt, and why (:data:`TOO_LONG`, :data:`ONE_WORD`), so a
            count of checked items can say why it is short of the dataset's.

    Returns:
        The prompts, kinds in :data:`KINDS` order, each in dataset order.
    """
    out = []
    if "fact" in kinds:
        out += _fact_prompts(tok, dataset.facts)
    asked = {p.index for p in out}
    fact_prompts, answers = len(out), 0
    one_word = sum(1 for i, f in enumerate(dataset.facts) if i not in asked and has_text(f)) if "fact" in kinds else 0
    if "dialogue" in kinds:
        for i, dlg in enumerate(dataset.dialogues):
            # linear in the turns; a turn whose prompt leaves no room in the context ends the dialogue's
            # prompts (every later one is longer and would be left out below)
            turns = trainable_turns(dlg)  # as trained: turns without a question or answer are not
            answers += len(turns)
            for (user, answer), ids in zip(turns, chat_format.turn_prompt_ids(tok, turns, dlg.system, context_length)):
                out.append(_Prompt("dialogue", i, user, answer, ids, len(tok.encode(answer)) + ANSWER_SLACK))
    if "chat" in kinds and len(dataset.dialogues) > 1:
        out += _chat_prompts(tok, dataset.dialogues, context_length)
    for kind, pairs in (("heldout", heldout), ("question", questions)):  # each (question, answer) a new conversation
        if kind in kinds:
            for i, (user, answer) in enumerate(pairs):
                ids = chat_format.prompt_ids(tok, [], user)
                out.append(_Prompt(kind, i, user, answer, ids, len(tok.encode(answer)) + ANSWER_SLACK))
    # a prompt must leave room for its answer; a fact must be trained whole (Dataset.validate's rule: BOS, text and
    # EOS at most the context and one more token): one trained in pieces of the context cannot be reproduced from
    # its first words ("not checked for recall", as validate says)
    # (the fact is tokenized whole only where its parts' counts come near the context: prompt and rest apart count
    # it within a token or two, and tokenizing every fact again cost a fifth of this function)
    out = [p for p in out if len(p.ids) < context_length and (
        p.kind != "fact" or len(p.ids) + p.max_new - ANSWER_SLACK < context_length - 8
        or len(chat_format.encode_fact(tok, dataset.facts[p.index])) <= context_length + 1)]
    by_kind = {k: [p for p in out if p.kind == k] for k in KINDS}
    if sizes is not None:
        sizes.update({k: len(v) for k, v in by_kind.items() if v})
    if left_out is not None:
        counts = {"fact": {TOO_LONG: fact_prompts - len(by_kind["fact"]), ONE_WORD: one_word},
                  "dialogue": {TOO_LONG: answers - len(by_kind["dialogue"])}}
        left_out.update({k: {why: n for why, n in v.items() if n} for k, v in counts.items() if k in kinds})
    limit = sample or FULL_CHECK_MAX
    if any(len(v) > limit for v in by_kind.values()):
        out = [p for k in KINDS for p in _spaced(by_kind[k], limit)]
    return out


def _fact_prompts(tok: Tokenizer, facts: list[str]) -> list[_Prompt]:
    """A fact's prompt: BOS + its first words (:func:`fact_prompt_words`), as the fact was trained (a file
    whose ``add_bos_token`` is false: no BOS; core.chat_format.fact_prompt_ids); the rest is expected."""
    out = []
    for i, (fact, k) in enumerate(zip(facts, fact_prompt_words(facts))):
        prompt, expected = fact_split(fact, k)
        if expected and has_text(fact):  # (a fact of spaces or control characters alone is not trained)
            ids = chat_format.fact_prompt_ids(tok, prompt)
            out.append(_Prompt("fact", i, prompt, expected, ids, len(tok.encode(expected)) + ANSWER_SLACK))
    return out


def _chat_prompts(tok: Tokenizer, dialogues: list, context_length: int) -> list[_Prompt]:
    """Every :func:`chat_every`-th dialogue's first question after the turns of the dialogues before it
    (:func:`chat_history`), oldest turns dropped until the answer fits, as core.chat.ChatSession does."""
    out = []
    for i in range(0, len(dialogues), chat_every(len(dialogues))):
        dlg = dialogues[i]
        turns = trainable_turns(dlg)  # (as trained)
        if not turns:
            continue
        user, answer = turns[0]
        max_new = len(tok.encode(answer)) + ANSWER_SLACK
        room = min(max(max_new, CHAT_ROOM), context_length - 1)
        history = _fitting_tail(tok, chat_history(dialogues, i), context_length - room)
        while True:
            ids = chat_format.prompt_ids(tok, history, user, system=dlg.system)
            if len(ids) + room <= context_length or not history:
                break
            history = history[1:]
        out.append(_Prompt("chat", i, user, answer, ids, max_new))
    return out


def sampled(sizes: dict[str, int], items: list[RecallItem]) -> dict[str, tuple[int, int]]:
    """The kinds a check asked only a sample of.

    Args:
        sizes: ``{kind: prompts before sampling}``, as ``sizes=`` of :func:`recall_prompts` filled it.
        items: the check's table.

    Returns:
        ``{kind: (checked, prompts in all)}``; empty when every prompt was checked.
    """
    out = {}
    for k, n in sizes.items():
        checked = tally(items, k)[1]
        if checked < n:
            out[k] = (checked, n)
    return out


def _fitting_tail(tok: Tokenizer, history: list[tuple[str, str]], budget: int) -> list[tuple[str, str]]:
    """``history`` without the oldest turns that certainly do not fit in ``budget`` tokens, counted from each
    turn's ids encoded once (a turn's prompt ids are at least those; ``ESTIMATE_MARGIN`` covers a template
    that joins turns differently). The caller drops more, one turn at a time, re-encoding: without this
    first cut a 10,000-turn history was re-encoded 10,000 times."""
    sizes = [len(tok.encode(f"{chat_format.USER_PREFIX}{u}\n{chat_format.ASSISTANT_HEADER} {a}")) for u, a in history]
    total, start = sum(sizes), 0
    while start < len(history) and total > budget + ESTIMATE_MARGIN:
        total -= sizes[start]
        start += 1
    return history[start:]


def _spaced(items: list, n: int) -> list:
    """At most ``n`` of ``items``, evenly spaced (all when there are no more)."""
    if len(items) <= n:
        return items
    return [items[i * len(items) // n] for i in range(n)]


def greedy_batch(model: Model, prompts: list[list[int]], max_new: list[int], eos_id: int, pad_id: int) -> list[list[int]]:
    """Greedy continuations of up to ``model.batch_size`` prompts decoded together.

    Args:
        model: a :class:`core.model.Model` (its ``last_logits`` on int32 (rows, seq) tokens).
        prompts: token ids per row (each shorter than the model's context_length).
        max_new: most tokens to generate per row; a row also ends at ``eos_id`` (kept in its output)
            or at the context length.

    Returns:
        The generated ids per row, in the order of ``prompts``.
    """
    cl = model.config.context_length
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    active = [r for r in range(len(prompts)) if max_new[r] > 0 and len(seqs[r]) < cl]
    while active:
        t = max(len(seqs[r]) for r in active)
        tokens = np.full((len(active), t), pad_id, np.int32)
        for j, r in enumerate(active):
            tokens[j, :len(seqs[r])] = seqs[r]
        logits = model.last_logits(tokens, [len(seqs[r]) for r in active])  # (rows, vocab_size)
        still = []
        for j, r in enumerate(active):
            nxt = int(np.argmax(logits[j]))
            seqs[r].append(nxt)
            outs[r].append(nxt)
            if nxt != eos_id and len(outs[r]) < max_new[r] and len(seqs[r]) < cl:
                still.append(r)
        active = still
    return outs


def greedy_cached(model: Model, prompts: list[list[int]], max_new: list[int], eos_id: int) -> list[list[int]]:
    """:func:`greedy_batch`'s continuations (the same rule of ending), decoded one prompt at a time with the
    model's K/V buffers as the cache (``Model.next_logits``): one forward of the prompt, then one of each
    new token, as the chat decodes (core.generate.Generator). Fewer tokens computed than by
    :func:`greedy_batch`, in more forwards of fewer rows: :func:`decode_seconds` says which is faster."""
    cl = model.config.context_length
    outs: list[list[int]] = []
    for ids, most in zip(prompts, max_new):
        out: list[int] = []
        if most > 0 and len(ids) < cl:
            logits = model.next_logits(list(ids), 0)
            while True:
                out.append(int(np.argmax(logits)))
                if out[-1] == eos_id or len(out) >= most or len(ids) + len(out) >= cl:
                    break
                logits = model.next_logits(out[-1:], len(ids) + len(out) - 1)
        outs.append(out)
    return outs


@dataclass(frozen=True)
class CheckSpeed:
    """How fast a model decodes, measured (core.from_base.gradient_seconds): ``forward(n)`` seconds of a forward
    of ``n`` tokens whose rows' last logits are read back (``Model.last_logits``; core.from_base.Speed), ``step_s`` seconds of one new token of one
    row over its K/V buffers (``Model.next_logits``)."""

    forward: Callable[[float], float]
    step_s: float


def decode_seconds(prompts: list[_Prompt], context_length: int, speed: CheckSpeed) -> tuple[float, float]:
    """``(together, one by one)``: seconds of decoding ``prompts`` with :func:`greedy_batch` (a forward of the
    active rows per new token) and with :func:`greedy_cached` (a forward of each prompt, then one step per new
    token), every row running to its ``max_new`` (a right answer ends sooner), at ``speed``."""
    together, k = 0.0, 0
    while active := [p for p in prompts if k < p.max_new and len(p.ids) + k < context_length]:
        together += speed.forward(len(active) * max(len(p.ids) + k for p in active))
        k += 1
    alone = sum(speed.forward(len(p.ids)) + (forward_length(p, context_length) - len(p.ids)) * speed.step_s
                for p in prompts if p.max_new > 0 and len(p.ids) < context_length)
    return together, alone


def recall_check(model: Model, tok: Tokenizer, dataset: Dataset, kinds: tuple[str, ...] = KINDS,
                 should_stop: Callable[[], bool] | None = None,
                 heldout: list[tuple[str, str]] | tuple = (),
                 sample: int = 0, sizes: dict[str, int] | None = None,
                 speed: CheckSpeed | None = None,
                 left_out: dict[str, dict[str, int]] | None = None,
                 questions: list[tuple[str, str]] | tuple = ()) -> Iterator[tuple[int, int, list[RecallItem]]]:
    """Run the recall check in batches of ``model.batch_size`` prompts.

    Facts: the model gets BOS + the fact's first words (:func:`core.recall.fact_prompt_words`: enough to
    tell it from every other fact) and must continue with the rest exactly.
    Dialogues: for each turn, the model gets the previous turns and the question and must answer exactly
    (surrounding whitespace ignored). Chat: the same in the middle of a conversation
    (:func:`chat_history`). Held-out: each ``heldout`` (question, answer) as a new conversation; written questions
    (``questions``) the same.
    ``sample``, ``sizes``, ``left_out``: see :func:`recall_prompts` (a full check asks at most :data:`FULL_CHECK_MAX`
    prompts per kind). ``speed``: how fast this model decodes (:class:`CheckSpeed`, measured); a batch then
    decodes its prompts one by one (:func:`greedy_cached`) where :func:`decode_seconds` says that is faster
    (a large model on a CPU), else together (None: always).

    Yields:
        ``(prompts done, prompts in all, items so far)`` once before the first batch (0 done) and after
        every batch (at most ``model.batch_size`` prompts, fewer long ones: ``ROW_TOKENS``, and no more
        tokens a forward than the model holds, ``Model.rows``); the last yield holds the whole table,
        items in the order of :data:`KINDS`, each in dataset order. ``should_stop()``, asked before each
        batch, ends the check early (the last yield then holds a partial table).
    """
    stop = should_stop or (lambda: False)
    prompts = recall_prompts(tok, dataset, model.config.context_length, kinds, heldout, sample, sizes, left_out,
                             questions)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].ids))
    results: dict[int, RecallItem] = {}

    def table():
        return [results[i] for i in sorted(results)]

    yield 0, len(prompts), []
    # batches within the model's tokens (Model.rows); core.trainer.max_seq_of makes room for the longest prompt
    for chunk in _chunks(order, prompts, model.batch_size, model.config.context_length, model.rows):
        if stop():
            return
        ids, most = [prompts[i].ids for i in chunk], [prompts[i].max_new for i in chunk]
        if speed is not None and one_by_one([prompts[i] for i in chunk], model.config.context_length, speed):
            outs = greedy_cached(model, ids, most, tok.eos_id)
        else:
            outs = greedy_batch(model, ids, most, tok.eos_id, tok.pad_id)
        for i, out in zip(chunk, outs):
            p = prompts[i]
            got = tok.decode([t for t in out if t != tok.eos_id])
            if p.kind != "fact":
                got = got.strip()
            results[i] = RecallItem(p.kind, p.index, p.prompt, p.expected, got, got.strip() == p.expected.strip())
        yield len(results), len(prompts), table()


def forward_length(prompt: _Prompt, context_length: int) -> int:
    """Tokens of the longest row :func:`greedy_batch` gives the model for ``prompt``: the prompt and all
    but the last of its ``max_new`` tokens, never ``context_length`` (a row ends one token before)."""
    return min(len(prompt.ids) + prompt.max_new - 1, context_length - 1)


def longest_forward(prompts: list[_Prompt], context_length: int) -> int:
    """The longest row a check of ``prompts`` (or of any sample of them) gives the model (1 without any):
    a model must hold one row that long (:func:`recall_check` puts the others in batches of at most
    the model's ``rows`` tokens)."""
    return max((forward_length(p, context_length) for p in prompts), default=1)


def one_by_one(prompts: list[_Prompt], context_length: int, speed: CheckSpeed) -> bool:
    """Whether a batch of ``prompts`` decodes faster one prompt at a time (:func:`decode_seconds`)."""
    together, alone = decode_seconds(prompts, context_length, speed)
    return alone < together


def check_seconds(prompts: list[_Prompt], batch_size: int, context_length: int, rows: int,
                  speed: CheckSpeed) -> float:
    """Seconds of a :func:`recall_check` of ``prompts`` on a model of ``batch_size`` rows and ``rows`` tokens
    that decodes at ``speed``, each batch decoded as the check decodes it, every answer to its
    ``max_new`` (an upper bound: a right answer ends at its EOS)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].ids))
    return sum(min(decode_seconds([prompts[i] for i in chunk], context_length, speed))
               for chunk in _chunks(order, prompts, batch_size, context_length, rows))


def _chunks(order: list[int], prompts: list[_Prompt], b: int, context_length: int,
            tokens: int | None = None) -> Iterator[list[int]]:
    """Batches of ``order`` (prompts sorted by length): at most ``b`` rows and about ``b`` x
    ``ROW_TOKENS`` tokens of prompt plus answer, so a batch of long conversation prompts takes no longer
    than one of short fact prompts (each batch is one "checking recall" progress event), and no forward
    of more than ``tokens`` (rows x :func:`forward_length` of its longest; None: no limit) unless the
    batch is one prompt."""
    chunk: list[int] = []
    longest = 0
    for i in order:
        rows, longest = len(chunk) + 1, max(longest, forward_length(prompts[i], context_length))
        if chunk and (rows > b or rows * (len(prompts[i].ids) + prompts[i].max_new) > b * ROW_TOKENS
                      or (tokens is not None and rows * longest > tokens)):
            yield chunk
            chunk, longest = [], forward_length(prompts[i], context_length)
        chunk.append(i)
    if chunk:
        yield chunk


def tally(items: list[RecallItem], kind: str) -> tuple[int, int]:
    """(items of ``kind`` reproduced, items of ``kind`` checked)."""
    of = [r for r in items if r.kind == kind]
    return sum(r.ok for r in of), len(of)


__all__ = ["RecallItem", "fact_split", "fact_prompt_words", "recall_prompts", "chat_history", "greedy_batch",
           "recall_check", "forward_length", "longest_forward", "greedy_cached", "CheckSpeed", "decode_seconds",
           "one_by_one", "check_seconds", "tally", "KINDS", "CHAT_PROMPTS", "CHAT_BEFORE", "chat_every", "FULL_CHECK_MAX", "sampled"]
