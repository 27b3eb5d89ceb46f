"""Parse a JSON file's text into a one-line error that names the file and line (checkpoints, datasets)."""
from __future__ import annotations

import json
import os
from typing import Any


def parse_json(text: str, path: str | os.PathLike, error: type[Exception], what: str) -> Any:
    """``json.loads(text)``; broken or too deeply nested JSON raises ``error`` with one line:
    ``PATH:LINE: broken JSON (reason)`` or ``PATH: JSON nested too deeply to be WHAT``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}:{e.lineno}: broken JSON ({e.msg})") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to be {what}") from None
