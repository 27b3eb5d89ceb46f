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
        text: new text this token completes (may be "" while a multi-byte character is incomplete).
        token_id: the sampled id.
        prob: its probability (after repetition penalty and temperature).
        alternatives: the 5 most likely tokens at that step as (token text, probability).
    """

    text: str
    token_id: int
    prob: float
    alternatives: list[tuple[str, float]] = field(default_factory=list)


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

    def _prompt(self, message: str) -> list[int]:
        limit = self.gen.config.context_length - 1
        history = list(self.history)
        while True:
            ids = chat_format.prompt_ids(self.tok, history, message, system=self.system)
            if len(ids) < limit or not history:
                break
            history = history[1:]  # sliding window over whole turns
        if len(ids) >= limit:
            raise ContextFullError(
                f"the message is {len(ids)} tokens long with the chat format; the model's context_length "
                f"is {self.gen.config.context_length} tokens — shorten the message")
        return ids

    def ask(self, message: str, settings: SamplingSettings) -> Iterator[ChatPiece]:
        """Stream the answer to ``message``; the turn is added to the history when it ends.

        Generation stops at EOS, at a new ``User:`` turn in the text, at ``settings.max_tokens``, or
        when the context is full.

        Raises:
            ContextFullError: the message alone does not fit the context.
        """
        message = message.strip()
        ids = self._prompt(message)
        decoder = StreamDecoder(self.tok)
        text = ""
        shown = 0
        stop_text = [s for s in chat_format.STOP_STRINGS if s != chat_format.EOS_TOKEN]
        hold = max(len(s) for s in stop_text)
        stopped_by_text = False
        for tok_id, probs in self.gen.generate(ids, settings, stop_ids={self.tok.eos_id}):
            if tok_id == self.tok.eos_id:
                break
            text += decoder.feed(tok_id)
            cut = min((text.find(s) for s in stop_text if s in text), default=-1)
            if cut >= 0:
                text, stopped_by_text = text[:cut], True
                break
            # hold back a tail that could be the start of a stop string
            safe = max(shown, len(text) - hold)
            top = np.argsort(-probs)[:5]
            yield ChatPiece(text[shown:safe], tok_id, float(probs[tok_id]),
                            [(self.tok.decode([int(t)], skip_special=False), float(probs[t])) for t in top])
            shown = safe
        if not stopped_by_text:
            text += decoder.flush()
        if len(text) > shown:
            yield ChatPiece(text[shown:], -1, 1.0, [])
        answer = text.strip()
        self.history.append((message, answer))

    def answer(self, message: str, settings: SamplingSettings) -> str:
        """The whole answer to ``message`` as one string (see :meth:`ask`)."""
        return "".join(p.text for p in self.ask(message, settings)).strip()
