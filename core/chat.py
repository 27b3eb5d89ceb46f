"""A chat session: history, prompt building in the training chat format, streamed answers.

Used by the CLI's ``chat`` command and the GUI's Chat tab (from its worker thread).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from core import chat_format
from core.generate import ContextFullError, Generator, SamplingSettings
from core.tokenizer import StreamDecoder, Tokenizer


@dataclass
class ChatPiece:
    """One generated token as the user sees it.

    Attributes:
        text: the text this token adds to the answer (its own decoded text; "" while a multi-byte
            character is still incomplete, and cut where a stop string begins). Joining the
            ``text`` of all pieces gives the answer exactly.
        token_id: the sampled id (-1 for trailing bytes flushed at the end).
        prob: its probability (after repetition penalty and temperature).
        alternatives: the 5 most likely tokens at that step as (token text, probability).
    """

    text: str
    token_id: int
    prob: float
    alternatives: list[tuple[str, float]] = field(default_factory=list)


def _stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class ChatSession:
    """Multi-turn chat with a model.

    Args:
        generator: the model on the device.
        tokenizer: its tokenizer.
        system: optional system message (rendered as a ``System:`` line, as in training).
    """

    def __init__(self, generator: Generator, tokenizer: Tokenizer, system: str | None = None):
        self.gen, self.tok, self.system = generator, tokenizer, system
        self.history: list[tuple[str, str]] = []

    def clear(self) -> None:
        """Forget the conversation."""
        self.history.clear()

    def _prompt(self, message: str, answer_room: int = 1) -> list[int]:
        """Prompt ids for ``message``: the oldest whole turns are dropped until the prompt leaves
        ``answer_room`` tokens (the answer's max_tokens) free in the context, or no turn is left."""
        limit = self.gen.config.context_length - 1
        room = max(1, min(int(answer_room), limit))
        history = list(self.history)
        while True:
            ids = chat_format.prompt_ids(self.tok, history, message, system=self.system)
            if len(ids) + room <= self.gen.config.context_length or not history:
                break
            history = history[1:]  # sliding window over whole turns
        if len(ids) >= limit:
            raise ContextFullError(
                f"the message is {len(ids)} tokens long with the chat format; the model's context_length "
                f"is {self.gen.config.context_length} tokens — shorten the message")
        return ids

    def ask(self, message: str, settings: SamplingSettings) -> Iterator[ChatPiece]:
        """Stream the answer to ``message`` token by token; the turn joins the history at the end.

        Generation stops at EOS, at a new ``User:`` turn in the text (not shown), at
        ``settings.max_tokens``, or when the context is full. A piece is held back only while its
        text could still be the start of such a stop string.

        Raises:
            ValueError: the message is empty.
            ContextFullError: the message alone does not fit the context.
        """
        message = message.strip()
        if not message:
            raise ValueError("the message is empty")
        ids = self._prompt(message, settings.max_tokens)
        decoder = StreamDecoder(self.tok)
        stops = chat_format.stop_strings(self.tok)
        end_ids = chat_format.stop_ids(self.tok)
        pending: list[ChatPiece] = []  # generated, not yet released
        text, released = "", 0  # all decoded text; characters of it already released
        cut = -1
        for tok_id, probs in self.gen.generate(ids, settings, stop_ids=end_ids):
            if tok_id in end_ids:
                break
            top = np.argsort(-probs)[:5]
            piece = ChatPiece(decoder.feed(tok_id), tok_id, float(probs[tok_id]),
                              [(self.tok.decode([int(t)], skip_special=False), float(probs[t])) for t in top])
            pending.append(piece)
            text += piece.text
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                break
            safe = len(text) - _stop_prefix_len(text, stops)
            while pending and released + len(pending[0].text) <= safe:
                p = pending.pop(0)
                released += len(p.text)
                yield p
        if cut < 0:
            tail = decoder.flush()
            if tail:
                pending.append(ChatPiece(tail, -1, 1.0, []))
                text += tail
            cut = len(text)
        for p in pending:  # release the rest, cut where the stop string starts
            keep = max(0, min(len(p.text), cut - released))
            released += len(p.text)
            if keep or p.text == "":
                yield ChatPiece(p.text[:keep], p.token_id, p.prob, p.alternatives)
        self.history.append((message, text[:cut].strip()))

    def answer(self, message: str, settings: SamplingSettings) -> str:
        """The whole answer to ``message`` as one string (see :meth:`ask`)."""
        return "".join(p.text for p in self.ask(message, settings)).strip()
