"""What a base model knew, kept while it is fine-tuned (issue 20, item 4).

Before training from a base model, the base itself answers a small set of general questions greedily
(:data:`GENERAL_QUESTIONS`, plus the user's); no outside data is used. Those answers join the dataset as
one-turn dialogues (:func:`with_replay`), so training replays them beside the new facts and the recall
check checks them word for word like every dialogue answer; :func:`answered_as_before` counts them in a
stage's recall and :func:`verdict_line` says "general questions: n of N answered as before".

An answer the base did not finish within ``max_tokens`` is replayed up to the end of its first
sentence (or not at all when that did not end either). A question counts as answered as before when the
tuned model's greedy answer starts with the replayed text (the check decodes a few tokens past it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.dataset import Dataset, Dialogue

if TYPE_CHECKING:
    from core.chat_format import TokenizerLike
    from core.config import ModelConfig
    from core.device import Device
    from core.recall import RecallItem

GENERAL_QUESTIONS = ("What is the capital of France?", "Who wrote Romeo and Juliet?",
                     "How many legs does a spider have?", "What is 12 plus 30?",
                     "What is the largest planet in our solar system?", "What color is the sky on a clear day?",
                     "At what temperature in degrees Celsius does water boil?", "How many days are in a week?",
                     "What language is spoken in Spain?", "What gas do plants take in from the air?")
"""General questions a base model answers before fine-tuning; its answers are replayed and checked."""

ANSWER_TOKENS = 64
"""Longest base answer replayed, in tokens."""


@dataclass(frozen=True)
class Replay:
    """The base model's answers that a run replays: ``pairs`` of (question, answer), the index of the
    first replayed dialogue in the run's dataset, and the questions left out (answer not finished)."""

    pairs: tuple[tuple[str, str], ...]
    first_dialogue: int
    unfinished: tuple[str, ...] = ()


def base_answers(device: Device, model_config: ModelConfig, weights: dict, tokenizer: TokenizerLike,
                 questions: tuple[str, ...], max_tokens: int = ANSWER_TOKENS) -> tuple[list[tuple[str, str]], list[str]]:
    """Greedy answers of a model (``weights``, float32 arrays by GGUF name) to ``questions``, each in a new
    conversation in the model's chat format.

    Returns:
        ``(pairs, unfinished)``: (question, answer) of every answer that ended (EOS or a stop string)
        within ``max_tokens`` tokens and is not empty, or else its first sentence when that ended
        (:func:`first_sentence`); and the questions left without an answer.
    """
    from core.chat import ChatSession
    from core.generate import Generator, SamplingSettings

    session = ChatSession(Generator(device, model_config, weights), tokenizer)
    settings = SamplingSettings(temperature=0.0, max_tokens=max_tokens)
    pairs, unfinished = [], []
    for q in questions:
        session.clear()
        pieces = list(session.ask(q, settings))
        answer = "".join(p.text for p in pieces).strip()
        if sum(p.token_id >= 0 for p in pieces) >= max_tokens:  # cut: keep its first whole sentence
            answer = first_sentence(answer)
        if answer:
            pairs.append((q, answer))
        else:
            unfinished.append(q)
    return pairs, unfinished


def first_sentence(text: str) -> str:
    """``text`` up to and including its first ``.``, ``!`` or ``?`` that ends a sentence (followed by
    white space), or up to its first line break; ``""`` when neither occurs."""
    import re

    m = re.search(r"[.!?](?=\s)|\n", text)
    return text[:m.start() + (text[m.start()] != "\n")].strip() if m else ""


def with_replay(dataset: Dataset, pairs: list[tuple[str, str]], unfinished: list[str] = ()) -> tuple[Dataset, Replay]:
    """A copy of ``dataset`` with one dialogue per (question, answer) appended, and its :class:`Replay`."""
    out = Dataset(facts=list(dataset.facts), dialogues=list(dataset.dialogues) + [Dialogue(turns=[p]) for p in pairs],
                  origin=dataset.origin)  # the file's entries keep their lines in the trainer's warnings
    return out, Replay(tuple(pairs), len(dataset.dialogues), tuple(unfinished))


def replay_meta(replay: Replay) -> dict:
    """What a checkpoint records of ``replay`` (config.json's ``base.general_replay``, core.checkpoint_meta): the
    index of the first replayed dialogue, the replayed questions and the unfinished ones."""
    return {"first_dialogue": replay.first_dialogue, "questions": [q for q, _ in replay.pairs],
            "unfinished": list(replay.unfinished)}


def replay_of(meta: dict, dataset: Dataset) -> Replay | None:
    """The :class:`Replay` that :func:`replay_meta` recorded, read back from a checkpoint's ``dataset`` (its
    dialogues from ``first_dialogue`` on); None where the dataset no longer ends with those questions (a
    resume on new data)."""
    replays = dataset.dialogues[meta["first_dialogue"]:]
    if [d.turns[0][0] if len(d.turns) == 1 else None for d in replays] != meta["questions"]:
        return None
    return Replay(tuple(d.turns[0] for d in replays), meta["first_dialogue"], tuple(meta["unfinished"]))


def split_replayed(recall, first_dialogue: int) -> tuple[list[RecallItem], list[RecallItem]]:
    """``(the user's items, the replayed general questions)`` of a stage's recall items: the replays are the
    dialogues from ``first_dialogue`` on (:func:`with_replay` appends them), asked alone (kind ``dialogue``;
    their ``chat`` prompts are left out of both)."""
    own = [r for r in recall if r.kind not in ("dialogue", "chat") or r.index < first_dialogue]
    return own, [r for r in recall if r.kind == "dialogue" and r.index >= first_dialogue]


def answered_as_before(recall: list[RecallItem], replay: Replay) -> tuple[int, int]:
    """(replayed general questions answered word for word as the base answered them, those checked) in a
    stage's recall items (kind ``dialogue``, the replay's dialogue indices)."""
    items = split_replayed(recall, replay.first_dialogue)[1]
    return sum(map(as_before, items)), len(items)


def as_before(item: RecallItem) -> bool:
    """Whether a replayed general question got the base's answer: word for word, or a longer answer that
    begins with it (the base's answer was cut at its first sentence)."""
    return item.ok or item.got.strip().startswith(item.expected.strip())


def verdict_line(recall: list[RecallItem], replay: Replay) -> str:
    """``general questions: n of N answered as before`` (and how many were not replayed)."""
    n, total = answered_as_before(recall, replay)
    line = f"general questions: {n} of {total} answered as before"
    if replay.unfinished:
        line += f" ({len(replay.unfinished)} more not checked: the base's answer had no whole sentence within " \
                f"{ANSWER_TOKENS} tokens)"
    return line


def read_questions(path: str) -> tuple[str, ...]:
    """The user's general questions: one per non-empty line of a UTF-8 text file.

    Raises:
        ValueError: the file cannot be read or holds no question (one line naming it).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            questions = tuple(line.strip() for line in fh if line.strip())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the general questions ({getattr(e, 'strerror', None) or e})") from None
    if not questions:
        raise ValueError(f"{path}: holds no question (one per line)")
    return questions


__all__ = ["GENERAL_QUESTIONS", "ANSWER_TOKENS", "Replay", "base_answers", "first_sentence", "with_replay",
           "replay_meta", "replay_of", "answered_as_before",
           "verdict_line", "read_questions"]
