"""Dialogues in an imported model's own chat template (GGUF ``tokenizer.chat_template``, Jinja2).

Rendered as transformers' ``apply_chat_template`` renders it: a sandboxed Jinja2 environment with
``trim_blocks`` and ``lstrip_blocks``, the variables ``messages`` (``[{"role", "content"}]``),
``add_generation_prompt``, ``bos_token`` and ``eos_token``, and ``raise_exception``.

Tokenizing: every message content is replaced by a unique marker before rendering, so the rendered
text splits into template markup and contents. Markup is tokenized with special tokens parsed (its
``<|im_start|>`` is one id, as llama.cpp tokenizes a rendered prompt); contents are tokenized as
plain text (a user cannot inject special tokens). Where a content meets markup at a pre-tokenizer
split (a newline, a special token: ChatML and most templates), the ids equal those of tokenizing
the whole rendered text, which ``tests/test_chat_template.py`` checks against llama.cpp.

Loss mask: 1 on each assistant content and on the markup after it up to and including the first
end-of-generation token (``<|im_end|>``, EOS), 0 elsewhere.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Protocol, Sequence

_MARK = "\ue000{}\ue001"
_MARK_RE = re.compile("\ue000(\\d+)\ue001")


class TemplateError(ValueError):
    """The chat template cannot be rendered (the Jinja2 error, in one line)."""


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateError as JinjaError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except JinjaError as e:
        raise TemplateError(f"the chat template is not valid Jinja2: {e}") from None


def render(template: str, messages: Sequence[dict], add_generation_prompt: bool = False,
           bos_token: str = "", eos_token: str = "") -> str:
    """The template applied to ``messages`` (list of ``{"role": ..., "content": ...}``).

    Raises:
        TemplateError: invalid template or an error while rendering (one line).
    """
    from jinja2 import TemplateError as JinjaError

    try:
        return _compile(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token, eos_token=eos_token)
    except JinjaError as e:
        raise TemplateError(f"the chat template cannot be rendered: {e}") from None


def dialogue_messages(turns: Iterable[tuple[str, str]], system: str | None = None,
                      next_user: str | None = None) -> list[dict]:
    """``[system?] + user/assistant`` messages of ``(user, assistant)`` turns (and a final user message)."""
    msgs = [{"role": "system", "content": system}] if system else []
    for user, answer in turns:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    if next_user is not None:
        msgs.append({"role": "user", "content": next_user})
    return msgs


class TemplateTokenizer(Protocol):
    """What :func:`encode_messages` needs from :class:`core.gguf_tokenizer.GGUFTokenizer`."""

    chat_template: str | None
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    eog_ids: Iterable[int]

    def token_bytes(self, token_id: int) -> bytes: ...

    def encode(self, text: str, parse_special: bool = False) -> list[int]: ...


def encode_messages(tokenizer: TemplateTokenizer, messages: Sequence[dict], add_generation_prompt: bool = False,
                    template: str | None = None) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of ``messages`` in the tokenizer's chat template.

    Args:
        tokenizer: a :class:`core.gguf_tokenizer.GGUFTokenizer` (its ``chat_template``, ``bos_id``,
            ``eos_id``, ``eog_ids``, ``add_bos``, ``encode(text, parse_special)``).
        template: overrides the tokenizer's template.

    Returns:
        ``(ids, mask)`` of equal length (see the module docstring for the mask). BOS is put in front
        when the file says ``add_bos_token`` and the template did not write it.

    Raises:
        TemplateError: no template, or it cannot be rendered.
    """
    template = template or tokenizer.chat_template
    if not template:
        raise TemplateError("the model file has no tokenizer.chat_template")
    token_text = lambda i: "" if i is None else tokenizer.token_bytes(i).decode("utf-8", "replace")  # noqa: E731
    bos_text, eos_text = token_text(tokenizer.bos_id), token_text(tokenizer.eos_id)
    marked = [{**m, "content": _MARK.format(k)} for k, m in enumerate(messages)]
    text = render(template, marked, add_generation_prompt, bos_text, eos_text)
    ids: list[int] = []
    mask: list[int] = []
    if tokenizer.add_bos and not (bos_text and text.startswith(bos_text)):
        ids.append(tokenizer.bos_id)
        mask.append(0)
    eog = set(tokenizer.eog_ids)
    after_answer = False  # markup following an assistant content, until its end-of-generation token
    pos = 0
    for match in [*_MARK_RE.finditer(text), None]:
        markup = text[pos:match.start() if match else len(text)]
        if markup:
            piece = tokenizer.encode(markup, parse_special=True)
            for t in piece:
                ids.append(t)
                mask.append(1 if after_answer else 0)
                if after_answer and t in eog:
                    after_answer = False
            after_answer = False
        if match is None:
            break
        k = int(match.group(1))
        if k >= len(messages):
            raise TemplateError("the chat template wrote a message marker that is not a message")
        content = str(messages[k]["content"])
        piece = tokenizer.encode(content, parse_special=False)
        answer = messages[k]["role"] == "assistant"
        ids.extend(piece)
        mask.extend([1 if answer else 0] * len(piece))
        after_answer = answer
        pos = match.end()
    return ids, mask


__all__ = ["TemplateError", "render", "dialogue_messages", "encode_messages"]
