"""An independent, deliberately simple model of applying changes: used by tests to check
the simulator's truth against its archive, and capture's trail against that truth."""

from __future__ import annotations

import json


def row_identity(table_key: list[str], columns: list[str], image: dict) -> tuple:
    """Keyed tables by their key; a keyless table by all its columns. The type is part of
    the identity so that 1, 1.0 and True stay different values."""
    return tuple((type(image[c]).__name__, image[c]) for c in (table_key or columns))


def apply_change(state: dict[str, dict[tuple, dict]], keys: dict, columns: dict, change: dict) -> None:
    """Apply one INSERT/UPDATE/DELETE/TRUNCATE (before/after as JSON text) to `state`."""
    name = change["table"]
    rows, key, cols = state[name], keys[name], columns[name]
    if change["op"] == "TRUNCATE":
        rows.clear()
    elif change["op"] == "INSERT":
        row = json.loads(change["after"])
        assert list(row) == cols, "INSERT carries the whole row"
        identity = row_identity(key, cols, row)
        assert identity not in rows, f"INSERT of an existing row in {name}"
        rows[identity] = row
    elif change["op"] == "UPDATE":
        before, after = json.loads(change["before"]), json.loads(change["after"])
        old = rows.pop(row_identity(key, cols, before))
        new = {**old, **after}  # absent columns keep their old value
        identity = row_identity(key, cols, new)
        assert identity not in rows, f"UPDATE onto an existing row in {name}"
        rows[identity] = new
    elif change["op"] == "DELETE":
        del rows[row_identity(key, cols, json.loads(change["before"]))]


def canonical(rows: list[dict]) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True, ensure_ascii=False) for row in rows)
