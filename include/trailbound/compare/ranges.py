"""Key ranges: a table cut into contiguous ranges of its key, planned on the source.

A range is [lower, upper) in the key's order, either end open (None), so that the ranges
of a table cover every possible key: a row the target has beyond the source's last key
still falls in the last range. Boundaries are key values read from the source and handed
back to PostgreSQL as query parameters, so each side compares them with its own types.

A table without a key (keyed by all its columns, REPLICA IDENTITY FULL) is one range:
its rows are compared as a multiset.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg2 import sql

DEFAULT_CHUNK_ROWS = 50_000


@dataclass(frozen=True)
class KeyRange:
    index: int                     # 0, 1, ... in key order
    lower: tuple | None            # inclusive; None: from the first key
    upper: tuple | None            # exclusive; None: through the last key

    def describe(self) -> str:
        def shown(bound):
            return ", ".join(map(str, bound)) if bound is not None else None
        return f"[{shown(self.lower) or '-inf'} .. {shown(self.upper) or '+inf'})"


def key_sql(key: tuple[str, ...]) -> sql.Composable:
    """The key as a row constructor: (k1, k2)."""
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(k) for k in key))


def predicate(key: tuple[str, ...], keyless: bool, bounds: KeyRange) -> tuple[sql.Composable, list]:
    """WHERE text and its parameters for the rows of one range."""
    if keyless:
        return sql.SQL("TRUE"), []
    parts, args = [], []
    row = key_sql(key)
    placeholders = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(key)))
    if bounds.lower is not None:
        parts.append(sql.SQL("{} >= {}").format(row, placeholders))
        args += list(bounds.lower)
    if bounds.upper is not None:
        parts.append(sql.SQL("{} < {}").format(row, placeholders))
        args += list(bounds.upper)
    return (sql.SQL(" AND ").join(parts) if parts else sql.SQL("TRUE")), args


def plan(cur, relation: sql.Identifier, key: tuple[str, ...], keyless: bool,
         chunk_rows: int = DEFAULT_CHUNK_ROWS) -> list[KeyRange]:
    """Ranges of about `chunk_rows` source rows each: every chunk_rows-th key in key
    order is a boundary (one pass over the key's index)."""
    if keyless:
        return [KeyRange(0, None, None)]
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    cur.execute(sql.SQL("SELECT {keys} FROM (SELECT {keys}, row_number() OVER (ORDER BY {keys}) AS n FROM {rel}) s"
                        " WHERE n %% %s = 1 AND n > 1 ORDER BY {keys}").format(keys=keys, rel=relation),
                (chunk_rows,))
    bounds = [tuple(_picklable(v) for v in row) for row in cur.fetchall()]
    edges = [None, *bounds, None]
    return [KeyRange(i, edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _picklable(value):
    """psycopg2 hands bytea back as a memoryview, which Spark cannot ship to a task."""
    return bytes(value) if isinstance(value, memoryview) else value
