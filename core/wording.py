"""Counts in messages: "1 entry was skipped", "2 entries were skipped" (one home for plurals), and
memory sizes ("8.3 GiB").

Used by the CLI and the GUI wherever a count is printed next to its noun.
"""
from __future__ import annotations


def plural(n: int, singular: str, plural_form: str | None = None) -> str:
    """The noun for ``n`` things: ``singular`` for exactly 1, else ``plural_form`` (default: "entry" ->
    "entries" after a consonant, else the singular + "s")."""
    if n == 1:
        return singular
    if plural_form is not None:
        return plural_form
    if singular.endswith("y") and singular[-2:-1] not in ("a", "e", "i", "o", "u"):
        return singular[:-1] + "ies"
    return singular + "s"


def count_words(n: float, singular: str, plural_form: str | None = None, digits: int | None = None) -> str:
    """``n`` with thousands separators and its noun: ``count_words(1, "entry")`` is "1 entry",
    ``count_words(2000, "fact")`` "2,000 facts"; with ``digits`` the number is shown with that many decimals
    and the noun is singular only when it reads "1" (``count_words(1.2, "pass", "passes", 0)`` is "1 pass",
    ``count_words(1.0, "pass", "passes", 1)`` "1.0 passes")."""
    text = f"{n:,}" if digits is None else f"{n:,.{digits}f}"
    return f"{text} {plural(1 if text == '1' else 2, singular, plural_form)}"


def were(n: int) -> str:
    """The verb for ``n`` things: "was" for exactly 1, else "were"."""
    return "was" if n == 1 else "were"


def memory_size(n_bytes: int) -> str:
    """A memory size as the CLI and the GUI show it: "8.3 GiB", or "512 MiB" below 1 GiB."""
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.0f} MiB"
