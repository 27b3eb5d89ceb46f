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
import threading
import time
from functools import lru_cache
from typing import Any, Iterable, Protocol, Sequence

_MARK = "\ue000{}\ue001"
_MARK_RE = re.compile("\ue000(\\d+)\ue001")

TEMPLATE_KEY = "tokenizer.chat_template"
# Bounds of one rendering (issue 19: nested range() loops hung, 'x'*300000000 aborted the tokenizer, a
# recursive macro raised RecursionError). Real templates stay far below (see tests/test_break_it_bounds.py:
# SmolLM2's ChatML renders a 10,000-turn dialogue).
MAX_RANGE = 10_000            # items of one range() (jinja2.sandbox allows 100,000)
MAX_TEXT_CHARS = 1_000_000    # characters (or items) of one string or list a template builds
MAX_OUTPUT_CHARS = 8_000_000  # characters of the whole rendered text
MAX_STEPS = 2_000_000         # loop items + calls of one rendering
MAX_SECONDS = 10.0            # wall time of one rendering
MAX_INT_BITS = 100_000        # size of a number a template computes (2 ** 100000000 took minutes)
# Filters whose integer arguments say how much text they make (format: only its result is checked).
_SIZED_FILTERS = ("center", "indent", "wordwrap", "truncate", "batch", "slice", "format")


class TemplateError(ValueError):
    """The chat template cannot be rendered (the Jinja2 error, in one line)."""


class _Budget(threading.local):
    """The running rendering's step count and deadline (per thread: training and chat render at once)."""

    steps = 0
    deadline = float("inf")


_budget = _Budget()


class _OverBudget(Exception):
    """A bound of :data:`MAX_STEPS`, :data:`MAX_SECONDS`, :data:`MAX_TEXT_CHARS` was reached (its text says which)."""


def _step() -> None:
    _budget.steps += 1
    if _budget.steps > MAX_STEPS:
        raise _OverBudget(f"it took more than {MAX_STEPS:,} loop steps and calls")
    if time.monotonic() > _budget.deadline:
        raise _OverBudget(f"it took longer than {MAX_SECONDS:g} s")


def _check_size(value: Any) -> Any:
    if isinstance(value, (str, list, tuple, bytes)) and len(value) > MAX_TEXT_CHARS:
        raise _OverBudget(f"it built a text or list of more than {MAX_TEXT_CHARS:,} items")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _big_ints(args: Sequence[Any]) -> bool:
    return any(_is_int(a) and abs(a) > MAX_TEXT_CHARS for a in args)


def _bounded_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise _OverBudget(f"range() of {len(rng):,} items (at most {MAX_RANGE:,})")
    return rng


def _bounded_iter(iterable: Any):
    """The items of a ``{% for %}`` loop, each one a step (an empty loop body still counts)."""
    for item in iterable:
        _step()
        yield item


def _bounded_concat(*parts: Any) -> str:
    """``a ~ b``: the joined text, refused when longer than :data:`MAX_TEXT_CHARS`."""
    texts = [str(p) for p in parts]
    if sum(map(len, texts)) > MAX_TEXT_CHARS:
        raise _OverBudget(f"it built a text of more than {MAX_TEXT_CHARS:,} characters")
    return "".join(texts)


def _check_operands(operator: str, left: Any, right: Any) -> None:
    """Before ``left operator right`` runs: refuse a text or list repeated (``*``) or joined (``+``)
    past :data:`MAX_TEXT_CHARS` items and a power (``**``) of more than :data:`MAX_INT_BITS` bits."""
    if operator == "*":
        n, seq = (right, left) if isinstance(right, int) else (left, right)
        if isinstance(n, int) and isinstance(seq, (str, list, tuple)) and len(seq) * max(n, 0) > MAX_TEXT_CHARS:
            raise _OverBudget(f"it repeats a text or list to more than {MAX_TEXT_CHARS:,} items")
    elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        if len(left) + len(right) > MAX_TEXT_CHARS:
            raise _OverBudget(f"it built a text or list of more than {MAX_TEXT_CHARS:,} items")
    elif operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1 \
            and abs(left).bit_length() * right > MAX_INT_BITS:
        raise _OverBudget(f"a power with more than {MAX_INT_BITS:,} bits (exponent {right})")


def _environment():
    """The sandboxed Jinja2 environment with every repeated or growing construct bounded."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    class Bound(NodeTransformer):
        """Every ``for`` loop iterates through :func:`_bounded_iter`, every ``~`` is :func:`_bounded_concat`."""

        def visit_For(self, node):
            self.generic_visit(node)
            node.iter = nodes.Call(nodes.EnvironmentAttribute("bounded_iter"), [node.iter], [], None, None,
                                   lineno=node.lineno)
            return node

        def visit_Concat(self, node):
            self.generic_visit(node)
            return nodes.Call(nodes.EnvironmentAttribute("bounded_concat"), node.nodes, [], None, None,
                              lineno=node.lineno)

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Template(self, node, frame=None):
            node = Bound().visit(node)
            node.set_environment(self.environment)
            return super().visit_Template(node, frame)

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """Counts calls and loop items; refuses strings/lists over :data:`MAX_TEXT_CHARS` and numbers over
        :data:`MAX_INT_BITS` from ``* + % ** //``."""

        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset(["*", "+", "%", "**", "//"])
        bounded_iter = staticmethod(_bounded_iter)
        bounded_concat = staticmethod(_bounded_concat)

        def call_binop(self, context, operator, left, right):
            _check_operands(operator, left, right)
            result = super().call_binop(context, operator, left, right)
            if _is_int(result) and result.bit_length() > MAX_INT_BITS:  # e.g. a number squared in a loop
                raise _OverBudget(f"a number of more than {MAX_INT_BITS:,} bits")
            return _check_size(result)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's own signature)
            _step()
            if isinstance(getattr(__obj, "__self__", None), str) and _big_ints([*args, *kwargs.values()]):
                raise _OverBudget(f"a string method with a size over {MAX_TEXT_CHARS:,}")
            return _check_size(super().call(__context, __obj, *args, **kwargs))

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["range"] = _bounded_range
    for name in _SIZED_FILTERS:
        env.filters[name] = _sized_filter(env.filters[name], check_args=name != "format")
    return env


def _sized_filter(f, check_args: bool = True):
    """``f`` refusing integer arguments over :data:`MAX_TEXT_CHARS` (a width: ``center(10**9)``) and results
    longer than that (``format``'s arguments are values, not sizes: only its result is checked)."""
    def bounded(*args, **kwargs):
        if check_args and _big_ints([*args[1:], *kwargs.values()]):
            raise _OverBudget(f"a filter asked for a size over {MAX_TEXT_CHARS:,}")
        return _check_size(f(*args, **kwargs))

    for attr in ("jinja_pass_arg",):  # keep pass_context / pass_environment / pass_eval_context
        if hasattr(f, attr):
            setattr(bounded, attr, getattr(f, attr))
    return bounded


@lru_cache(maxsize=1)
def _env():
    env = _environment()

    def raise_exception(message):
        raise TemplateError(f"the chat template refused the messages: {message}")

    env.globals["raise_exception"] = raise_exception
    return env


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateError as JinjaError

    try:
        return _env().from_string(template)
    except JinjaError as e:
        raise TemplateError(f"not valid Jinja2: {_one_line(e)}") from None
    except RecursionError:
        raise TemplateError("not valid Jinja2: nested too deeply") from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(e).__name__


def render(template: str, messages: Sequence[dict], add_generation_prompt: bool = False,
           bos_token: str = "", eos_token: str = "", source: str = "the model") -> str:
    """The template applied to ``messages`` (list of ``{"role": ..., "content": ...}``), within bounds.

    Rendering runs through ``Template.generate`` counting output characters, loop items and calls
    (:data:`MAX_OUTPUT_CHARS`, :data:`MAX_STEPS`) and time (:data:`MAX_SECONDS`); ``range()`` gives at most
    :data:`MAX_RANGE` items and no string or list the template builds (``*``, ``+``, ``~``, string
    methods, sizing filters) may exceed :data:`MAX_TEXT_CHARS`.

    Args:
        template: the Jinja2 source (``tokenizer.chat_template``).
        messages: the messages; bos_token, eos_token: the texts of those tokens.
        add_generation_prompt: end with the assistant's header.
        source: the model file, named in errors.

    Returns:
        The rendered text.

    Raises:
        TemplateError: ``"<source>: tokenizer.chat_template: ..."`` (one line) for an invalid template, an
        error while rendering (including too deep recursion and running out of memory), or a bound exceeded.
    """
    from jinja2 import TemplateError as JinjaError

    where = f"{source}: {TEMPLATE_KEY}"
    try:
        compiled = _compile(template)
    except TemplateError as e:
        raise TemplateError(f"{where}: {e}") from None
    outer = (_budget.steps, _budget.deadline)  # a template rendering inside a rendering (none today) keeps its own
    _budget.steps, _budget.deadline = 0, time.monotonic() + MAX_SECONDS
    parts: list[str] = []
    size = 0
    try:
        for chunk in compiled.generate(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                       bos_token=bos_token, eos_token=eos_token):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise _OverBudget(f"its output exceeds {MAX_OUTPUT_CHARS:,} characters")
            parts.append(chunk)
            _step()
    except _OverBudget as e:
        raise TemplateError(f"{where}: rendering stopped: {e}") from None
    except TemplateError as e:  # raise_exception
        raise TemplateError(f"{where}: {e}") from None
    except RecursionError:
        raise TemplateError(f"{where}: rendering stopped: it recurses too deeply (a macro calling itself?)") from None
    except MemoryError:
        raise TemplateError(f"{where}: rendering stopped: out of memory") from None
    except (JinjaError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as e:
        # ValueError / TypeError ...: the template's own Python errors (1 / 0, 'a' + 1), not a traceback
        raise TemplateError(f"{where}: cannot be rendered: {_one_line(e)}") from None
    finally:
        _budget.steps, _budget.deadline = outer
    return "".join(parts)


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
    source: str  # the model file, named in errors (may be absent: "the model")

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
    source = getattr(tokenizer, "source", "") or "the model"
    if not template:
        raise TemplateError(f"{source} has no {TEMPLATE_KEY}")
    token_text = lambda i: "" if i is None else tokenizer.token_bytes(i).decode("utf-8", "replace")  # noqa: E731
    bos_text, eos_text = token_text(tokenizer.bos_id), token_text(tokenizer.eos_id)
    marked = [{**m, "content": _MARK.format(k)} for k, m in enumerate(messages)]
    text = render(template, marked, add_generation_prompt, bos_text, eos_text, source)
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
            raise TemplateError(f"{source}: {TEMPLATE_KEY}: it wrote a message marker that is not a message")
        content = str(messages[k]["content"])
        piece = tokenizer.encode(content, parse_special=False)
        answer = messages[k]["role"] == "assistant"
        ids.extend(piece)
        mask.extend([1 if answer else 0] * len(piece))
        after_answer = answer
        pos = match.end()
    return ids, mask


__all__ = ["TemplateError", "TEMPLATE_KEY", "MAX_RANGE", "MAX_TEXT_CHARS", "MAX_OUTPUT_CHARS", "MAX_STEPS",
           "MAX_SECONDS", "render", "dialogue_messages", "encode_messages"]
