"""TABLE selections as text: the form a group's table patterns are stored and compared in.

A capture's BR checkpoint and a pump's state record the selection they were made with;
a changed selection is noticed by comparing these texts.
"""

from __future__ import annotations


def table_spec(patterns: list[str] | None) -> str | None:
    """The TABLE patterns as one comparable text (None: no selection, everything)."""
    return None if patterns is None else ",".join(patterns)
