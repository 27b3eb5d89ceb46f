"""The one chat format, used for training, inference and the GGUF / Ollama chat templates.

A dialogue is rendered as::

    <|bos|>System: {system}\\n          (only when a non-empty system message is given)
    User: {user}\\nAssistant: {answer}<|eos|>
    User: {user}\\nAssistant: {answer}<|eos|>
    ...

written without any newline after ``<|eos|>``: the next ``User:`` follows it directly. So the text of a
two-turn dialogue is ``"<|bos|>User: Hi\\nAssistant: Hello<|eos|>User: Bye\\nAssistant: Bye<|eos|>"``.

- ``<|bos|>`` and ``<|eos|>`` are special tokens (single ids); every assistant answer ends in ``<|eos|>``,
  which is what makes the model stop.
- The prompt for a new turn ends with ``Assistant:`` (no trailing space). The answer is rendered as
  ``" " + answer``: the leading space belongs to the answer. The GPT-2 byte-level pre-tokenizer splits
  ``":"`` from ``" Word"`` in both cases, so training and inference see the same tokens, and the model
  learns to start its answer with a space-prefixed word.
- Contents are rendered verbatim (the dataset readers trim them; the chat UI should trim what the user
  types).
- Loss mask: 1 on the tokens of each answer (``" " + answer``) and on the ``<|eos|>`` after it, 0 on
  everything else (BOS, system line, ``User: ...\\n``, ``Assistant:``).
- A plain fact (pretraining text) is ``<|bos|>{text}<|eos|>``.

:func:`encode_dialogue` tokenizes the rendered text piece by piece — every piece either is a special
token or ends where the mask changes — and concatenates the ids. The only boundary inside plain text is
``Assistant:`` | ``" " + answer``; the GPT-2 regex always splits there (``:`` ends a punctuation run at
a space, and the regex never looks behind), so the ids equal those of tokenizing the whole rendered
string with special tokens parsed (``tests/test_chat_format.py`` checks this).
"""
from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple, Protocol, Sequence

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)

SYSTEM_PREFIX = "System: "
USER_PREFIX = "User: "
ASSISTANT_HEADER = "Assistant:"

# Text-level stops for generation, earliest match wins (the EOS id stops generation first; these
# catch a model that skips EOS and starts the next turn). "\nUser:" comes before "User:" so the
# newline is cut too.
STOP_STRINGS = ["<|eos|>", "\nUser:", "User:"]

# Segment roles. Only "assistant" segments (the answer text and the EOS after it) get loss.
ROLE_BOS = "bos"
ROLE_SYSTEM = "system"
ROLE_USER = "user"
ROLE_HEADER = "assistant_header"  # the "Assistant:" prompt, no loss
ROLE_ASSISTANT = "assistant"


class Segment(NamedTuple):
    """One piece of rendered text: ``text``, ``is_special`` (a single special token), ``role``."""

    text: str
    is_special: bool
    role: str


class TokenizerLike(Protocol):
    """What this module needs from :class:`core.tokenizer.Tokenizer`."""

    bos_id: int
    eos_id: int

    def encode(self, text: str, parse_special: bool = False) -> list[int]: ...


class DialogueLike(Protocol):
    """What this module needs from :class:`core.dataset.Dialogue`."""

    turns: Sequence[tuple[str, str]]
    system: str | None


def render_segments(turns: Iterable[tuple[str, str]], system: str | None = None,
                    add_generation_prompt_for: str | None = None) -> list[Segment]:
    """Render a dialogue as a list of :class:`Segment` ``(text, is_special, role)``.

    Args:
        turns: ``(user, assistant)`` pairs, in order.
        system: optional system message; ``None`` or ``""`` means no ``System:`` line.
        add_generation_prompt_for: if given, a final user message followed by the bare
            ``Assistant:`` header, i.e. the prompt for the model to answer it.

    Returns:
        Segments whose texts concatenate to the rendered dialogue (see the module docstring).
    """
    segs = [Segment(BOS_TOKEN, True, ROLE_BOS)]
    if system:
        segs.append(Segment(f"{SYSTEM_PREFIX}{system}\n", False, ROLE_SYSTEM))
    for user, answer in turns:
        segs.append(Segment(f"{USER_PREFIX}{user}\n", False, ROLE_USER))
        segs.append(Segment(ASSISTANT_HEADER, False, ROLE_HEADER))
        segs.append(Segment(" " + answer, False, ROLE_ASSISTANT))
        segs.append(Segment(EOS_TOKEN, True, ROLE_ASSISTANT))
    if add_generation_prompt_for is not None:
        segs.append(Segment(f"{USER_PREFIX}{add_generation_prompt_for}\n", False, ROLE_USER))
        segs.append(Segment(ASSISTANT_HEADER, False, ROLE_HEADER))
    return segs


def render_text(turns: Iterable[tuple[str, str]], system: str | None = None,
                add_generation_prompt_for: str | None = None) -> str:
    """The rendered dialogue as one string (special tokens written as their text)."""
    return "".join(s.text for s in render_segments(turns, system, add_generation_prompt_for))


def plain_text(turns: Iterable[tuple[str, str]], system: str | None = None) -> str:
    """The dialogue text without special tokens: what the tokenizer is trained on."""
    return "".join(s.text for s in render_segments(turns, system) if not s.is_special)


def _encode_segments(tokenizer: TokenizerLike, segs: Sequence[Segment]) -> tuple[list[int], list[int]]:
    special = {BOS_TOKEN: tokenizer.bos_id, EOS_TOKEN: tokenizer.eos_id}
    ids: list[int] = []
    mask: list[int] = []
    i = 0
    while i < len(segs):
        seg = segs[i]
        m = 1 if seg.role == ROLE_ASSISTANT else 0
        if seg.is_special:
            ids.append(special[seg.text])
            mask.append(m)
            i += 1
            continue
        # Join neighbouring text segments of the same mask value: then the only text boundary left is
        # "Assistant:" | " answer", where the GPT-2 regex splits anyway.
        parts = [seg.text]
        i += 1
        while i < len(segs) and not segs[i].is_special and (segs[i].role == ROLE_ASSISTANT) == bool(m):
            parts.append(segs[i].text)
            i += 1
        piece = tokenizer.encode("".join(parts), parse_special=False)
        ids.extend(piece)
        mask.extend([m] * len(piece))
    return ids, mask


def encode_dialogue(tokenizer: TokenizerLike, dialogue: DialogueLike) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of a dialogue.

    Args:
        tokenizer: a :class:`core.tokenizer.Tokenizer` (anything with ``encode(text, parse_special)``,
            ``bos_id``, ``eos_id``).
        dialogue: an object with ``turns`` (list of ``(user, assistant)``) and ``system`` (str or None),
            e.g. :class:`core.dataset.Dialogue`.

    Returns:
        ``(ids, loss_mask)``, equal lengths; the mask is 1 on answer tokens and the EOS after each answer.
        Special-token text inside the contents is tokenized as plain text, never as special ids.
    """
    if uses_file_template(tokenizer):
        from core.chat_template import dialogue_messages, encode_messages

        return encode_messages(tokenizer, dialogue_messages(dialogue.turns, getattr(dialogue, "system", None)))
    return _encode_segments(tokenizer, render_segments(dialogue.turns, getattr(dialogue, "system", None)))


def encode_fact(tokenizer: TokenizerLike, text: str) -> list[int]:
    """``[BOS] + encode(text) + [EOS]`` for a pretraining fact (special-token text stays plain text).

    A model imported from a GGUF file (``tokenizer.add_bos`` exists) gets BOS as its file's
    ``add_bos_token`` says, as llama.cpp tokenizes plain text, and always ends with the file's EOS: a fact is
    a document, and without its end a taught fact runs on into made-up text (SmolLM2-135M-Instruct, whose
    file sets ``add_eos_token`` false, reproduced 0 of 5 taught facts at a pretraining loss of 0.07, each
    continued past its end: " ...named Pim.\n\nVester"), so a check never saw it learned.
    """
    if hasattr(tokenizer, "add_bos"):
        ids = tokenizer.encode(text, parse_special=False, add_special=True)
        return ids if ids and ids[-1] == tokenizer.eos_id else [*ids, tokenizer.eos_id]
    return [tokenizer.bos_id, *tokenizer.encode(text, parse_special=False), tokenizer.eos_id]


def fact_prompt_ids(tokenizer: TokenizerLike, prefix: str) -> list[int]:
    """Ids that start a fact (``[BOS] + encode(prefix)``, or as the imported file says), for recall."""
    if hasattr(tokenizer, "add_bos"):
        return ([tokenizer.bos_id] if tokenizer.add_bos else []) + tokenizer.encode(prefix, parse_special=False)
    return [tokenizer.bos_id, *tokenizer.encode(prefix, parse_special=False)]


def prompt_ids(tokenizer: TokenizerLike, history: Iterable[tuple[str, str]], user_message: str,
               system: str | None = None) -> list[int]:
    """Ids of the prompt for answering ``user_message`` after ``history``; ends with ``Assistant:``.

    Args:
        history: earlier ``(user, assistant)`` turns, answers without their leading space (as shown).
        user_message: the new user message.
        system: optional system message.
    """
    if uses_file_template(tokenizer):
        from core.chat_template import dialogue_messages, encode_messages

        return encode_messages(tokenizer, dialogue_messages(history, system, user_message), True)[0]
    segs = render_segments(history, system, add_generation_prompt_for=user_message)
    ids, _ = _encode_segments(tokenizer, segs)
    return ids


def turn_prompt_ids(tokenizer: TokenizerLike, turns: Sequence[tuple[str, str]], system: str | None = None,
                    max_len: int | None = None) -> Iterator[list[int]]:
    """The prompt ids of each turn of a dialogue (its earlier turns and its question), in linear time.

    Prompt ``k`` equals ``prompt_ids(tokenizer, turns[:k], turns[k][0], system)``. In our format each turn
    ends in the special ``<|eos|>``, where tokenizing splits anyway, so the ids of the dialogue so far are
    kept and each turn is encoded once (a 1,000-turn dialogue took 91 s when every prompt re-encoded its
    history). An imported model's own template may join turns differently, so each of its prompts is
    rendered whole, but only until the prompts reach ``max_len``.

    Args:
        turns: ``(user, assistant)`` pairs; system: optional system message.
        max_len: stop once a prompt has ``max_len`` ids or more (later ones only get longer: in our
            format the dialogue's ids only grow; the last prompt yielded is the first that long).

    Yields:
        One id list per turn, in order (fewer than ``len(turns)`` when ``max_len`` stopped it).
    """
    limit = max_len if max_len is not None else float("inf")
    if uses_file_template(tokenizer):
        for k, (user, _answer) in enumerate(turns):
            ids = prompt_ids(tokenizer, turns[:k], user, system=system)
            yield ids
            if len(ids) >= limit:
                return
        return
    so_far = [tokenizer.bos_id]
    head = f"{SYSTEM_PREFIX}{system}\n" if system else ""  # joined with the first question, as _encode_segments does
    for user, answer in turns:
        question = tokenizer.encode(f"{head}{USER_PREFIX}{user}\n{ASSISTANT_HEADER}", parse_special=False)
        ids = so_far + question
        yield ids
        if len(ids) >= limit:
            return
        so_far = ids + tokenizer.encode(" " + answer, parse_special=False) + [tokenizer.eos_id]
        head = ""


def uses_file_template(tokenizer: TokenizerLike) -> bool:
    """True for a model imported from a GGUF file that has its own ``tokenizer.chat_template``: its
    dialogues are rendered with that template (core.chat_template), not with this module's format."""
    return bool(getattr(tokenizer, "chat_template", None))


def stop_ids(tokenizer: TokenizerLike) -> set[int]:
    """Token ids that end an answer: EOS, and for an imported model every end-of-generation token."""
    return set(getattr(tokenizer, "eog_ids", ())) | {tokenizer.eos_id}


def stop_strings(tokenizer: TokenizerLike) -> list[str]:
    """Texts that end an answer besides the stop ids (this format's next ``User:`` turn; none for a
    model with its own template, whose turns end with a token)."""
    if uses_file_template(tokenizer):
        return []
    return [s for s in STOP_STRINGS if s != EOS_TOKEN]


# HF / llama.cpp chat template (Jinja2). Renders exactly what render_text() renders for
# [system?] + (user, assistant)* messages; add_generation_prompt appends the bare "Assistant:" header.
# Only plain Jinja (no filters beyond the basics) so that llama.cpp's minja renders it too.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- if message['content'] -%}{{- 'System: ' + message['content'] + '\\n' -}}{%- endif -%}"
    "{%- elif message['role'] == 'user' -%}"
    "{{- 'User: ' + message['content'] + '\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- 'Assistant: ' + message['content'] + eos_token -}}"
    "{%- else -%}"
    "{{- raise_exception('Unknown role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)
"""Jinja2 chat template (HF ``tokenizer.chat_template`` / GGUF ``tokenizer.chat_template``).

Variables: ``messages`` (dicts with ``role`` and ``content``), ``bos_token``, ``eos_token``,
``add_generation_prompt``. Emits ``bos_token`` once at the start, as HF templates do (a runtime that
also adds BOS when tokenizing must not add a second one). An empty system message writes no
``System:`` line, as :func:`render_segments` does.
"""

OLLAMA_TEMPLATE = (
    '{{- if .System }}System: {{ .System }}\n{{ end }}'
    '{{- range .Messages }}'
    '{{- if eq .Role "user" }}User: {{ .Content }}\nAssistant:'
    '{{- else if eq .Role "assistant" }} {{ .Content }}<|eos|>'
    '{{- end }}'
    '{{- end }}'
)
"""Go template for an Ollama Modelfile ``TEMPLATE``, the same format as above.

System messages come in through ``.System`` (Ollama's own templates do the same) and are skipped in
the ``.Messages`` loop. Each user message is written together with the ``Assistant:`` header, so a
prompt ending in a user message ends in ``Assistant:`` as the model was trained. BOS is not written:
Ollama adds it when tokenizing (``tokenizer.ggml.add_bos_token``). The legacy ``.Prompt``/``.Response``
form is not used because it cannot put the answer's leading space on the answer's side. Pair it with
``PARAMETER stop "<|eos|>"`` and ``PARAMETER stop "User:"``.
"""


def messages_to_turns(messages: Sequence[dict]) -> tuple[list[tuple[str, str]], str | None, str | None]:
    """Split an HF-style message list into ``(turns, system, pending_user)``.

    Accepts an optional leading system message, then alternating user/assistant messages, optionally
    ending with a user message (returned as ``pending_user``).

    Raises:
        ValueError: for an unknown role, a misplaced system message, or two messages of the same role
            in a row.
    """
    turns: list[tuple[str, str]] = []
    system = None
    pending: str | None = None
    for i, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(content, str):
            raise ValueError(f"message {i}: content must be text")
        if role == "system":
            if i != 0:
                raise ValueError(f"message {i}: a system message must come first")
            system = content
        elif role == "user":
            if pending is not None:
                raise ValueError(f"message {i}: two user messages in a row")
            pending = content
        elif role == "assistant":
            if pending is None:
                raise ValueError(f"message {i}: an assistant message must follow a user message")
            turns.append((pending, content))
            pending = None
        else:
            raise ValueError(f"message {i}: unknown role {role!r}")
    return turns, system, pending


def render_chat_template(messages: Sequence[dict], add_generation_prompt: bool,
                         template: str = CHAT_TEMPLATE) -> str:
    """Render ``messages`` with a Jinja2 chat template the way HF ``transformers`` does.

    Uses ``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with
    ``bos_token``/``eos_token`` set to this format's special tokens.

    Raises:
        jinja2.TemplateError: when the template fails (for CHAT_TEMPLATE: an unknown role).
    """
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=list(messages), bos_token=BOS_TOKEN, eos_token=EOS_TOKEN,
        add_generation_prompt=add_generation_prompt)
