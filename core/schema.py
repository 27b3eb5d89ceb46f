"""One way to check what we read: a field's check, and one error naming the field.

A *check* is a function ``check(name, value) -> value`` that returns the value (converted, e.g. an int
to a float) or raises :class:`FieldError`. The checks below cover types and ranges; a reader adds its
own for a shape of its own (any function of that signature). :func:`read` takes a field out of a
parsed JSON object; a dataclass declares each field with its check (:func:`spec`) and runs them all
with :func:`check_dataclass`.

Messages are one line. ``str(FieldError)`` is ``"name: problem"`` (the settings' form; the GUI
highlights ``name``); a file reader names its file with :meth:`FieldError.at`:
``"FILE: field 'name' problem"``. The problem says what was wanted and what was got, e.g.
``must be an integer, got a string``, ``must be within 0..2, got 7``, ``must be >= 1, got 0``, ``must be <= 1, got 5.0``.

This module imports nothing of the project, so every other module may use it.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[str, Any], Any]
MISSING: Any = object()
"""``read``'s default: the field is required."""


class FieldError(ValueError):
    """A value is of the wrong type or out of range. ``field`` names it, ``problem`` says what is wrong."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem

    def at(self, path: object) -> str:
        """The message naming the file: ``"PATH: field 'name' problem"`` (one line)."""
        return f"{path}: field {self.field!r} {self.problem}"


def kind(value: object) -> str:
    """What a JSON value is, in words: ``an object``, ``a list``, ``a string``, ``a number``, ..."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole(minimum: int | None = 0, maximum: int | None = None) -> Check:
    """An integer (not a boolean) within ``minimum..maximum`` (None: unbounded)."""
    def check(name: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise FieldError(name, f"must be an integer, got {kind(value)}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bound = (f">= {minimum}" if maximum is None else f"<= {maximum}" if minimum is None
                     else f"within {minimum}..{maximum}")
            raise FieldError(name, f"must be {bound}, got {value}")
        return value
    return check


def number(minimum: float | None = None, maximum: float | None = None, above: float | None = None,
           below: float | None = None, why: str = "") -> Check:
    """A finite number (an int or a float, not a boolean) ``>= minimum``, ``<= maximum``, ``> above``,
    ``< below`` (each None: no bound), returned as a float. The message names the bound broken first,
    e.g. ``must be <= 1 (why), got 5.0``."""
    bounds = ((minimum, ">=", lambda v, b: v >= b), (above, ">", lambda v, b: v > b),
              (maximum, "<=", lambda v, b: v <= b), (below, "<", lambda v, b: v < b))
    note = f" ({why})" if why else ""

    def check(name: str, value: Any) -> float:
        if not _is_number(value) or not math.isfinite(value):
            raise FieldError(name, f"must be a finite number, got {value!r}")
        for bound, word, ok in bounds:
            if bound is not None and not ok(value, bound):
                raise FieldError(name, f"must be {word} {bound:g}{note}, got {value!r}")
        return float(value)
    return check


def flag(name: str, value: Any) -> bool:
    """``true`` or ``false``."""
    if not isinstance(value, bool):
        raise FieldError(name, f"must be true or false, got {kind(value)}")
    return value


def text(name: str, value: Any) -> str:
    """A string."""
    if not isinstance(value, str):
        raise FieldError(name, f"must be a string, got {kind(value)}")
    return value


def texts(name: str, value: Any) -> list[str]:
    """A list of strings."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FieldError(name, "must be a list of strings")
    return list(value)


def items(check: Check) -> Check:
    """A list whose every item passes ``check`` (the item named ``name[i]``)."""
    def check_list(name: str, value: Any) -> list:
        if not isinstance(value, list):
            raise FieldError(name, f"must be a list, got {kind(value)}")
        return [check(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return check_list


def mapping(name: str, value: Any) -> dict:
    """A JSON object."""
    if not isinstance(value, dict):
        raise FieldError(name, f"must be an object, got {kind(value)}")
    return value


def read(d: Mapping, key: str, check: Check, prefix: str = "", default: Any = MISSING) -> Any:
    """``check(prefix + key, d[key])``; ``default`` when the key is absent (MISSING: ``is missing``)."""
    if key not in d:
        if default is MISSING:
            raise FieldError(prefix + key, "is missing")
        return default
    return check(prefix + key, d[key])


def spec(default: Any, check: Check) -> Any:
    """A dataclass field with its default and its check, declared together (:func:`check_dataclass`)."""
    return dataclasses.field(default=default, metadata={"check": check})


def check_dataclass(obj: object, prefix: str = "") -> None:
    """Run the check of every field of dataclass ``obj`` declared with :func:`spec` (in field order).

    Raises:
        FieldError: the first field whose check fails, named ``prefix + name``.
    """
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        if check is not None:
            check(prefix + f.name, getattr(obj, f.name))


__all__ = ["FieldError", "Check", "MISSING", "kind", "whole", "number", "flag", "text", "texts", "items", "mapping", "read",
           "spec", "check_dataclass"]
