"""Small helpers shared by the kernel launchers."""
from __future__ import annotations


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n`` (and >= ``multiple``)."""
    n = max(int(n), 1)
    return ((n + multiple - 1) // multiple) * multiple
