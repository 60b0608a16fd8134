"""TABLE patterns (`shop.*`, `hr.emp?`), as capture and pump match them and store them.

`*` is any run of characters, `?` one character, everything else literal (names with
dots, quotes or brackets are safe) and case-sensitive; a pattern matches a whole name.
One translation, to Python's `re`: pump filters records on the driver with it, and
capture in its Spark tasks (capture.logread).
`table_spec` is the selection as one comparable text: a capture's BR checkpoint and a
pump's state record the selection they were made with, and a changed selection is
noticed by comparing these texts.
Imports nothing from trailbound; anything may import it.
"""

from __future__ import annotations

import re


def _pieces(pattern: str) -> list[str]:
    return re.split(r"([*?])", pattern)


def _wildcard(piece: str) -> str | None:
    return ".*" if piece == "*" else "." if piece == "?" else None


def python_regex(patterns: list[str]) -> re.Pattern:
    """One compiled regex; use `fullmatch`."""
    def one(pattern: str) -> str:
        return "".join(_wildcard(p) or re.escape(p) for p in _pieces(pattern))
    return re.compile("(?:" + "|".join(one(p) for p in patterns) + ")", re.DOTALL)


def table_spec(patterns: list[str] | None) -> str | None:
    """The TABLE patterns as one comparable text (None: no selection, everything)."""
    return None if patterns is None else ",".join(patterns)
