"""What a project remembers of its runs and its chat, beside its dataset (no Qt here).

    DIR/training-history.json  the Training tab: each run's plotted numbers, its recall table, verdict
                               and numbers line, and the log (the latest run last)
    DIR/chat-transcript.json   the Chat tab's transcript

Both are written by the GUI thread only (core.atomic.atomic_write; the training worker writes the
checkpoint folders, never these), and never hold a non-finite number: a plot series keeps finite
points only, and ``json.dumps(allow_nan=False)`` refuses anything else. A file that cannot be read is
moved aside as ``NAME.unreadable`` (nothing is lost) and the project opens without it.

A run begins with Start and continues through every Resume of it. Earlier runs keep only their loss
curve (the Training tab can overlay it faintly); at most :data:`MAX_RUNS` runs are kept.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from core.atomic import atomic_write
from core.json_text import read_format_json
from core.schema import FieldError, flag, items, mapping, number, read
from core.stages import Stage

HISTORY_FILE, CHAT_FILE = "training-history.json", "chat-transcript.json"  # names no other program uses
HISTORY_FORMAT, CHAT_FORMAT = "opencl-llm-studio-history", "opencl-llm-studio-chat"
VERSION = 1
MAX_RUNS = 20  # the latest run plus 19 earlier loss curves
MAX_LOG_LINES = 5000  # what the Training tab's log shows
SERIES = ("loss", "grad", "clip", "lr", "skipped", "val_facts", "val_dialogues")  # gui.plots.TrainingPlots


class HistoryError(ValueError):
    """A history or chat file that cannot be read (the message names the file and the field)."""


# ----------------------------------------------------------------------------------------- checks
# core.schema checks: check(name, value) -> value, raising FieldError(name, problem); the file is named
# once, by parse_history / parse_chat ("PATH: runs[0].series.loss: nan is not a finite number").
def _text(name: str, value) -> str:
    if not isinstance(value, str):
        raise FieldError(name, "not text")
    return value


def _series(name: str, value) -> list[list[float]]:
    """``[xs, ys]``: two lists of finite numbers of one length."""
    if (not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, list) for v in value)
            or len(value[0]) != len(value[1])):
        raise FieldError(name, "not two lists [steps, values] of one length")
    for v in value[0] + value[1]:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise FieldError(name, f"{v!r} is not a finite number")
    return [list(value[0]), list(value[1])]


def _series_table(name: str, value) -> dict:
    out = {}
    for key, s in mapping(name, value).items():
        if key not in SERIES:
            raise FieldError(f"{name}.{key}", f"unknown series (known: {', '.join(SERIES)})")
        out[key] = _series(f"{name}.{key}", s)
    return out


def _marker(name: str, m) -> list:
    if (not isinstance(m, list) or len(m) != 2 or isinstance(m[0], bool) or not isinstance(m[0], (int, float))
            or not math.isfinite(m[0]) or not isinstance(m[1], str)):
        raise FieldError(name, "not [step, label]")
    return [m[0], m[1]]


def _recall_row(name: str, row) -> list:
    if not isinstance(row, list) or len(row) != 6 or not isinstance(row[5], bool):
        raise FieldError(name, "not [stage, kind, prompt, expected, got, ok]")
    texts = [_text(name, v) for v in row[:5]]
    try:  # an older version's name of a stage reads as today's (core.stages.OLD_VALUES)
        texts[0] = Stage.parse(texts[0]).value
    except ValueError as e:
        raise FieldError(f"{name}[0]", str(e)) from None
    return texts + [row[5]]


def _run(name: str, value) -> dict:
    """One run, checked; missing fields get their empty values (a run saved before a field existed)."""
    d, p = mapping(name, value), f"{name}."
    return {"started": read(d, "started", _text, p, ""), "series": read(d, "series", _series_table, p, {}),
            "layers": read(d, "layers", items(_series), p, []), "markers": read(d, "markers", items(_marker), p, []),
            "clip_threshold": float(read(d, "clip_threshold", number(), p, 0.0)),
            "recall": read(d, "recall", items(_recall_row), p, []), "summary": read(d, "summary", items(_text), p, []),
            "status": read(d, "status", _text, p, ""), "speed": read(d, "speed", _text, p, "")}


def _chat_turn(name: str, value) -> dict:
    d, p = mapping(name, value), f"{name}."
    return {"user": read(d, "user", _text, p), "model": read(d, "model", _text, p, ""),
            "note": read(d, "note", _text, p, ""), "remembered": read(d, "remembered", flag, p, False)}


def _read_json(path: Path, fmt: str) -> dict | None:
    if not path.is_file():
        return None
    return read_format_json(path, fmt, HistoryError, f"{fmt.rsplit('-', 1)[-1]} file", max_version=VERSION)


# ----------------------------------------------------------------------------------------- read
def parse_history(data: dict, path: str = HISTORY_FILE) -> dict:
    """``{"runs": [run, ...], "log": [line, ...]}`` from training-history.json's object, checked.

    Raises:
        HistoryError: a field of the wrong type or a non-finite number; the message names it.
    """
    try:
        return {"runs": read(data, "runs", items(_run), default=[]), "log": read(data, "log", items(_text), default=[])}
    except FieldError as e:
        raise HistoryError(f"{path}: {e}") from None


def parse_chat(data: dict, path: str = CHAT_FILE) -> list[dict]:
    """The transcript ``[{"user", "model", "note", "remembered"}, ...]`` from chat-transcript.json's object,
    checked.

    ``remembered``: the turn is part of the model's conversation (an answer that ended by itself; a
    stopped or failed one is shown but not remembered). Raises HistoryError as :func:`parse_history`.
    """
    try:
        return read(data, "turns", items(_chat_turn), default=[])
    except FieldError as e:
        raise HistoryError(f"{path}: {e}") from None


def _set_aside(path: Path) -> str:
    aside = path.with_name(path.name + ".unreadable")
    try:
        os.replace(path, aside)
    except OSError as e:
        return f"it could not be moved aside ({e.strerror or e}) and will be replaced"
    return f"it was kept as {aside.name}"


def load_history(folder: str | Path) -> tuple[dict, list[dict], list[str]]:
    """Read a project's training-history.json and chat-transcript.json (call while holding the project's
    lock).

    Returns:
        (history, chat, warnings): empty ones for a file that is missing; an unreadable file is moved
        aside (``NAME.unreadable``) and named in ``warnings`` (one line each).
    """
    folder = Path(folder)
    history, chat, warnings = {"runs": [], "log": []}, [], []
    for name, fmt in ((HISTORY_FILE, HISTORY_FORMAT), (CHAT_FILE, CHAT_FORMAT)):
        path = folder / name
        try:
            data = _read_json(path, fmt)
            if data is None:
                continue
            if name == HISTORY_FILE:
                history = parse_history(data, str(path))
            else:
                chat = parse_chat(data, str(path))
        except HistoryError as e:
            warnings.append(f"{e}; {_set_aside(path)}")
    return history, chat, warnings


# ----------------------------------------------------------------------------------------- write
def earlier_run(run: dict) -> dict:
    """What an earlier run keeps: its start, loss curve, status line and stage markers."""
    return {"started": run.get("started", ""), "series": {"loss": run.get("series", {}).get("loss", [[], []])},
            "markers": list(run.get("markers", [])), "status": run.get("status", "")}


def history_text(history: dict) -> str:
    """training-history.json's text: the last :data:`MAX_RUNS` runs (all but the latest as
    :func:`earlier_run`), the log's last :data:`MAX_LOG_LINES` lines.

    Raises:
        ValueError: a non-finite number anywhere (json's ``allow_nan=False``; plots never keep one).
    """
    runs = list(history.get("runs", []))[-MAX_RUNS:]
    runs = [earlier_run(r) for r in runs[:-1]] + runs[-1:]
    data = {"format": HISTORY_FORMAT, "version": VERSION, "runs": runs,
            "log": list(history.get("log", []))[-MAX_LOG_LINES:]}
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"


def chat_text(turns: list[dict]) -> str:
    """chat-transcript.json's text for a transcript (see :func:`parse_chat`)."""
    data = {"format": CHAT_FORMAT, "version": VERSION, "turns": list(turns)}
    return json.dumps(data, ensure_ascii=False, allow_nan=False, indent=1) + "\n"


def write_if_changed(path: Path, text: str, written: dict) -> None:
    """Write ``text`` to ``path`` (atomically) unless it is what was last written there.

    ``written`` maps paths to the text last written (the caller keeps it per project). Raises OSError.
    """
    if written.get(str(path)) == text and path.is_file():
        return
    atomic_write(path, text)
    written[str(path)] = text
