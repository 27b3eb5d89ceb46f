"""Parse a JSON file's text into a one-line error that names the file and line (checkpoints, datasets,
the app's project and history files)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from core.schema import FieldError, read, whole


def repeated_keys(repeated: list[str]):
    """A ``json.loads`` ``object_pairs_hook`` that builds each object as json.loads does (of a name given twice, the
    last value) and appends each name given twice in one object to ``repeated``, so a reader can say that a value
    was dropped."""
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            seen: set[str] = set()
            repeated.extend(k for k, _ in pairs if k in seen or seen.add(k))
        return obj
    return hook


def loads(text: str, repeated: list[str] | None = None) -> Any:
    """``json.loads(text)``; with ``repeated``, also the names given twice in one object (:func:`repeated_keys`)."""
    return json.loads(text) if repeated is None else json.loads(text, object_pairs_hook=repeated_keys(repeated))


def parse_json(text: str, path: str | os.PathLike, error: type[Exception], what: str,
               repeated: list[str] | None = None) -> Any:
    """``json.loads(text)``; broken or too deeply nested JSON raises ``error`` with one line:
    ``PATH:LINE: broken JSON (reason)`` or ``PATH: JSON nested too deeply to be WHAT``. ``repeated``: filled with
    the names given twice in one object (:func:`repeated_keys`)."""
    try:
        return loads(text, repeated)
    except json.JSONDecodeError as e:
        raise error(f"{path}:{e.lineno}: broken JSON ({e.msg})") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to be {what}") from None


def read_format_json(path: str | os.PathLike, fmt: str, error: type[Exception], what: str,
                     max_version: int | None = None) -> dict:
    """The object of a JSON file of ours: ``{"format": fmt, "version": int, ...}``.

    Args:
        path: the file (UTF-8 JSON).
        fmt: the value its "format" field must have.
        error: the exception class raised, with one line naming the file.
        what: what the file is, for the message ("project", "history file").
        max_version: the newest "version" this build reads; None: any (or none).

    Raises:
        error: unreadable or broken JSON, not an object of ``fmt``, a "version" that is no integer >= 1
            (a string, a boolean) or newer than ``max_version``.
    """
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except (OSError, ValueError) as e:
        raise error(f"{path}: unreadable ({e})") from None
    data = parse_json(text, path, error, what)
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise error(f"{path}: not an OpenCL LLM Studio {what}")
    if max_version is not None:
        try:
            v = read(data, "version", whole(1))
        except FieldError as e:
            raise error(e.at(path)) from None
        if v > max_version:
            raise error(f"{path}: field 'version' is {v}: written by a newer app version (this one reads up to "
                        f"{max_version}); not opened, so that it is not rewritten without what it adds")
    return data
