"""Training sequences and batches: which examples of a dataset make each training step.

Facts become ``BOS + fact + EOS`` with every token learned; dialogues (and conversations of several)
learn only their answer tokens (core.chat_format). :class:`Batches` composes each step's batch from them
in the data mix of a core.config.TrainConfig (questions mixed into pretraining, fact questions from
core.augment, conversation batches, replayed facts) as a pure function of (seed, stage, step), so a
resumed run sees exactly the batches the uninterrupted run would have seen, and core.plan can count the
padded tokens of planned steps without a device.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core import augment, chat_format
from core.config import StageConfig, TrainConfig
from core.dataset import Dataset, Dialogue, has_text, trainable_turns

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

CONVERSATIONS = 1000
"""Most conversations of several dialogues built for tuning (``conversation_every``)."""
CONVERSATION_DIALOGUES = (2, 12)
"""Dialogues drawn for one tuning conversation; those that do not fit the context are dropped from its start,
so most fill it as the chat's history does (core.chat.ChatSession keeps the latest whole turns that fit). With
2-4, the ten questions of one conversation (benchmarks/learn_datasets.py) were answered 9 of 10 on two of the
five generated datasets: the chat held more turns than any conversation trained."""


@dataclass
class Example:
    """One training sequence: ``ids`` (n+1 tokens) and ``mask`` (n+1, 1 where a token is learned)."""

    ids: list[int]
    mask: list[int]


def fact_examples(tok: Tokenizer, facts: list[str], context_length: int) -> list[Example]:
    """BOS + fact + EOS per fact, every token learned; long facts are cut into context windows."""
    out = []
    for text in facts:
        if not has_text(text):  # nothing to learn, e.g. NUL bytes (Dataset.validate reports it)
            continue
        ids = chat_format.encode_fact(tok, text)
        out += _windows(ids, [1] * len(ids), context_length)
    return out


def dialogue_examples(tok: Tokenizer, dialogues: Iterable[Dialogue], context_length: int) -> list[Example]:
    """One example per dialogue (long ones cut into context windows); only assistant answer tokens (and
    their EOS) are learned; turns without a question or an answer (:func:`core.dataset.trainable_turns`) are
    left out, and a dialogue left without turns gives no example."""
    out = []
    for dlg in dialogues:
        turns = trainable_turns(dlg)  # an empty question or answer is skipped (Dataset.validate reports it)
        if len(turns) != len(dlg.turns):
            dlg = Dialogue(turns, dlg.system)
        ids, mask = chat_format.encode_dialogue(tok, dlg)
        if not any(mask):  # no turns: nothing to learn (Dataset.validate reports it)
            continue
        out += _windows(ids, mask, context_length)
    return out


def _windows(ids: list[int], mask: list[int], context_length: int) -> list[Example]:
    n = context_length + 1
    if len(ids) <= n:
        return [Example(ids, mask)]
    return [Example(ids[s:s + n], mask[s:s + n]) for s in range(0, len(ids) - 1, context_length)
            if any(mask[s + 1:s + n])]


def pack(examples: list[Example], context_length: int) -> Example:
    """Examples one after another in one training row (``BOS fact EOS BOS fact EOS ...``), as many of them
    as fit ``context_length + 1`` tokens (the first one always): a row of short facts then costs what a
    row of one question costs in a batch padded to its longest row."""
    ids, mask = list(examples[0].ids), list(examples[0].mask)
    for e in examples[1:]:
        if len(ids) + len(e.ids) > context_length + 1:
            break
        ids += e.ids
        mask += e.mask
    return Example(ids, mask)


def make_batch(examples: list[Example], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad examples into (tokens, targets, mask), each (batch, T) with T = longest example - 1.

    tokens[b, t] = ids[t], targets[b, t] = ids[t + 1], mask[b, t] = mask[t + 1] (0 on padding).
    """
    t = max(len(e.ids) for e in examples) - 1
    b = len(examples)
    tokens = np.full((b, t), pad_id, np.int32)
    targets = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), np.float32)
    for i, e in enumerate(examples):
        n = len(e.ids) - 1
        tokens[i, :n] = e.ids[:-1]
        targets[i, :n] = e.ids[1:]
        mask[i, :n] = e.mask[1:]
    return tokens, targets, mask


def batch_indices(seed: int, stage: int, step: int, n_examples: int, batch_size: int, stream: int = 0) -> list[int]:
    """Indices of the examples in batch ``step`` (0-based): a pure function of its arguments.

    Example order is the concatenation of per-epoch permutations of ``range(n_examples)``.
    """
    out = []
    pos = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(pos, n_examples)
        perm = np.random.default_rng([seed, stage, stream, epoch]).permutation(n_examples)
        take = min(batch_size - len(out), n_examples - offset)
        out += perm[offset:offset + take].tolist()
        pos += take
    return out


class Batches:
    """The training examples of a dataset and which of them make each batch: a pure function of
    (dataset, tokenizer, context length, train config, stage, step), needing no device (core.plan
    counts the padded tokens of planned steps with it).

    Attributes:
        facts, dialogues: examples of the dataset's facts and dialogues.
        questions: examples of the trained fact questions (``fact_questions``, core.augment).
        heldout_pairs: (question, answer) of the fact questions kept out of training (``heldout``).
        question_pairs: (question, answer) of the trained fact questions (the recall check's "question" kind).
        conversations: examples of several dialogues one after another (``conversation_every``).
        unasked: indices of the facts no question asks about: no dialogue's turn (core.augment.asked_facts) and no
            fact question, trained or held out. The model learns them as text only and may not answer
            questions about them (Allen-Zhu & Li 2023, see core.augment).
    """

    def __init__(self, tokenizer: Tokenizer, dataset: Dataset, context_length: int, train_config: TrainConfig):
        self.tokenizer, self.dataset, self.train_config = tokenizer, dataset, train_config
        self.context_length = cl = context_length
        self.facts = fact_examples(tokenizer, dataset.facts, cl)
        self.dialogues = dialogue_examples(tokenizer, dataset.dialogues, cl)
        self._asked: list[tuple[int, str, str]] = []
        self.question_pairs: list[tuple[str, str]] = []
        self.questions, self.heldout_pairs = self._fact_questions(cl)
        self.conversations = self._conversations(cl)
        asked = augment.asked_facts(dataset) | {i for i, _, _ in self._asked}
        self.unasked = [i for i, f in enumerate(dataset.facts) if has_text(f) and i not in asked]

    def stage_config(self, index: int) -> StageConfig:
        return self.train_config.pretrain if index == 0 else self.train_config.dialogues

    def _fact_questions(self, cl: int) -> tuple[list[Example], list[tuple[str, str]]]:
        """Training examples of the fact questions (core.augment) and the held-out (question, answer)
        pairs: all questions of ``heldout`` facts drawn with ``default_rng([seed, 7])``."""
        tc = self.train_config
        if not tc.fact_questions or not self.dialogues:
            return [], []
        qs = self._asked = augment.fact_questions(self.dataset, tc.fact_questions, tc.seed)
        facts = sorted({i for i, _, _ in qs})
        n_out = min(tc.heldout, len(facts) // 2)  # most facts with a question stay trained
        out = set(np.random.default_rng([tc.seed, 7]).choice(facts, n_out, replace=False).tolist()) if n_out else set()
        heldout = [(q, a) for i, q, a in qs if i in out]
        self.question_pairs = [(q, a) for i, q, a in qs if i not in out]
        return dialogue_examples(self.tokenizer, [Dialogue([qa]) for qa in self.question_pairs], cl), heldout

    def _conversations(self, cl: int) -> list[Example]:
        """Conversations of 2-4 unrelated dialogues: the dataset's dialogues and as many trained fact
        questions (drawn with ``default_rng([seed, 6])``), so a conversation mostly asks what the user's
        chat will ask."""
        tc = self.train_config
        if not tc.conversation_every or not self.dialogues:
            return []
        singles = [d if len(t) == len(d.turns) else Dialogue(t, d.system)  # turns without text left out
                   for d in self.dataset.dialogues for t in [trainable_turns(d)]]
        if self.questions:
            held = set(self.heldout_pairs)
            asked = [Dialogue([(q, a)]) for _, q, a in self._asked if (q, a) not in held]
            pick = np.random.default_rng([tc.seed, 6]).permutation(len(asked))[:len(singles)]
            singles += [asked[i] for i in sorted(pick)]

        if chat_format.uses_file_template(self.tokenizer):
            def fits(turns) -> bool:
                return len(chat_format.encode_dialogue(self.tokenizer, Dialogue(turns))[0]) <= cl + 1
        else:  # our format tokenizes each turn on its own (its EOS ends a text run): BOS + the turns' tokens
            turn_tokens = {t: len(chat_format.encode_dialogue(self.tokenizer, Dialogue([t]))[0]) - 1
                           for d in singles for t in d.turns}

            def fits(turns) -> bool:
                return 1 + sum(turn_tokens[t] for t in turns) <= cl + 1

        convs = augment.conversations(singles, CONVERSATIONS, CONVERSATION_DIALOGUES, seed=tc.seed, fits=fits)
        return dialogue_examples(self.tokenizer, [Dialogue(t) for t in convs], cl)

    def _questions_part(self, stage: int, step: int, n: int) -> list[Example]:
        """``n`` question-and-answer examples of batch ``step``: dataset dialogues and, with
        ``fact_question_share``, fact questions (each from its own stream of epochs)."""
        tc, seed = self.train_config, self.train_config.seed
        n_q = min(n, int(round(n * tc.fact_question_share))) if self.questions else 0
        if not self.dialogues:
            n_q = n if self.questions else 0
        out = [self.dialogues[i] for i in batch_indices(seed, stage, step, len(self.dialogues), n - n_q)] \
            if n - n_q and self.dialogues else []
        if n_q:
            out += [self.questions[i] for i in batch_indices(seed, stage, step, len(self.questions), n_q, stream=3)]
        return out

    def conversation_step(self, step: int) -> bool:
        """Whether tuning batch ``step`` (0-based) is a batch of conversations."""
        k = self.train_config.conversation_every
        return bool(k and self.conversations and step % k == k - 1)

    def batch(self, stage: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, targets, mask) of batch ``step`` (0-based) of ``stage`` (core.trainer.make_batch)."""
        return make_batch(self.examples(stage, step), self.tokenizer.pad_id)

    def examples(self, stage: int, step: int) -> list[Example]:
        """The examples of batch ``step`` of ``stage``."""
        tc = self.train_config
        cfg, seed = self.stage_config(stage), tc.seed
        b = cfg.batch_size
        if stage == 0:
            n_mix = min(b - 1, int(round(b * tc.mix_share))) if (self.dialogues or self.questions) else 0
            k = tc.pack_facts
            drawn = [self.facts[i] for i in batch_indices(seed, 0, step, len(self.facts), (b - n_mix) * k)]
            pool = [pack(drawn[r * k:(r + 1) * k], self.context_length) for r in range(b - n_mix)]
            pool += self._questions_part(0, step, n_mix) if n_mix else []
        elif self.conversation_step(step):
            pool = [self.conversations[i] for i in batch_indices(seed, 1, step // tc.conversation_every,
                                                                 len(self.conversations), b, stream=2)]
        else:
            n_replay = int(round(b * tc.replay_share)) if self.facts else 0
            n_replay = min(n_replay, b - 1)  # at least one dialogue per tuning batch
            if not self.dialogues:
                n_replay = b
            pool = self._questions_part(1, step, b - n_replay) if b - n_replay else []
            if n_replay:
                pool += [self.facts[i] for i in batch_indices(seed, 1, step, len(self.facts), n_replay, stream=1)]
        return pool

    def passes(self, stage: int, steps: int) -> float:
        """Passes (epochs) that ``steps`` steps of ``stage`` make over this data (:func:`stage_passes`)."""
        return stage_passes(self.train_config, stage, steps, len(self.facts), len(self.dialogues),
                            bool(self.questions), bool(self.conversations))

    def longest_row(self) -> int:
        """The most tokens a row of any batch of any step can hold (an example's ``len(ids) - 1``): the
        longest dialogue, fact question or conversation, and the longest row of ``pack_facts`` facts (at
        most ``pack_facts`` times the longest fact: a row's facts are consecutive draws of per-epoch
        permutations, so one fact comes twice where the draws cross an epoch, and every time in a dataset
        of fewer facts than ``pack_facts``; :func:`pack` never fills a row past ``context_length + 1``);
        1 without examples. Exact for ``pack_facts`` 1, an upper bound above."""
        singles = self.dialogues + self.questions + self.conversations
        longest = max((len(e.ids) for e in singles), default=2)
        longest_fact = max((len(e.ids) for e in self.facts), default=0)
        packed = min(self.train_config.pack_facts * longest_fact, max(self.context_length + 1, longest_fact))
        return max(longest, packed) - 1

    def padded_tokens(self, stage: int, step: int) -> int:
        """Tokens (rows x padded length) of batch ``step`` of ``stage``: what the step costs."""
        exs = self.examples(stage, step)
        return len(exs) * (max(len(e.ids) for e in exs) - 1)


def stage_passes(tc: TrainConfig, stage: int, steps: int, n_facts: int, n_dialogues: int,
                 questions: bool, conversations: bool) -> float:
    """Passes (epochs) over the facts (``stage`` 0: as text or as fact questions' answers) or the
    dataset's dialogues (1) that ``steps`` steps make: steps x the batch's rows of them / their count,
    in the data mix of ``tc`` (``mix_share``, ``fact_question_share``, ``replay_share``,
    ``conversation_every``). ``questions``/``conversations``: the mix has fact questions / conversation
    batches. 0.0 without facts (stage 0) or dialogues (stage 1). The Hyperparameters tab and the
    training progress both show this number."""
    b = (tc.pretrain if stage == 0 else tc.dialogues).batch_size
    if stage == 0:  # a fact as text (``pack_facts`` of them a row) or as the answer of a fact question
        mix = min(b - 1, int(round(b * tc.mix_share))) if (n_dialogues or questions) else 0
        asked = min(mix, int(round(mix * tc.fact_question_share))) if questions and mix else 0
        return steps * ((b - mix) * tc.pack_facts + asked) / n_facts if n_facts else 0.0
    if not n_dialogues:
        return 0.0
    n_replay = min(b - 1, int(round(b * tc.replay_share))) if n_facts else 0
    n = b - n_replay
    n_d = n - (min(n, int(round(n * tc.fact_question_share))) if questions else 0)
    if tc.conversation_every and conversations:
        steps -= steps // tc.conversation_every
    return steps * n_d / n_dialogues


__all__ = ["Example", "Batches", "stage_passes", "pack", "fact_examples", "dialogue_examples", "make_batch", "batch_indices", "CONVERSATIONS"]
