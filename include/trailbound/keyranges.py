"""Key ranges: a table cut into ranges of about N rows along its primary key, and a
range as a SQL condition. Shared by the initial load (trailbound.load) and the compare
(trailbound.compare); it reads no log and writes no archive, so it is no source.

Planning: the boundaries are found by walking the primary key's index, N keys at a time
(`... WHERE key >= previous ORDER BY key OFFSET N LIMIT 1`): one pass over the index in
all, no lock, exact on any key type, composite keys included. Boundaries come back in
their PostgreSQL text form (read in a session with TimeZone UTC, DateStyle ISO,
bytea_output hex, extra_float_digits 3, so that they read back as the same value).

The ranges cover the whole key space, whatever the table holds when it is read: the
first is open below, the last open above, each ends where the next begins. A row
inserted after planning still falls in exactly one range.

A range as SQL: `(k1, k2) >= lo AND (k1, k2) < hi`, lo inclusive, hi exclusive, either
end open (None). Bounds are dicts of key column -> value in PostgreSQL text form (or the
archive's JSON value). They are turned into the column's type by the table's own row
type, `jsonb_populate_record(NULL::table, bound)`, so no type name is ever written into
SQL and the same bound works on the source and on a target whose types differ a little.
Each bound column is its own scalar subquery: a constant the planner can match to the
primary key's index.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg2 import sql

from trailbound.errors import TrailboundError

_PRIMARY_KEY = """
SELECT a.attname
  FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, position)
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
 WHERE i.indrelid = %s::regclass AND i.indisprimary
 ORDER BY k.position
"""


@dataclass(frozen=True)
class KeyRange:
    """[lo, hi) along the key; None is open. Bounds map key column -> text form."""

    lo: dict[str, str] | None
    hi: dict[str, str] | None

    def to_json(self) -> dict:
        return {"lo": self.lo, "hi": self.hi}

    def describe(self) -> str:
        show = lambda b: "(" + ", ".join(b.values()) + ")" if b else "open"  # noqa: E731
        return f"[{show(self.lo)}, {show(self.hi)})"


def primary_key(cur, schema: str, name: str) -> list[str]:
    """The table's primary key columns, in index order; refuses a table without one."""
    cur.execute(_PRIMARY_KEY, (sql.Identifier(schema, name).as_string(cur),))
    key = [row[0] for row in cur.fetchall()]
    if not key:
        raise TrailboundError(f"table {schema}.{name} has no primary key: it cannot be cut into key ranges")
    return key


def estimate_rows(cur, schema: str, name: str) -> int:
    """The planner's row estimate (no scan); 0 for a table never analyzed and empty-looking."""
    cur.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %s::regclass",
                (sql.Identifier(schema, name).as_string(cur),))
    return int(cur.fetchone()[0])


def plan(cur, schema: str, name: str, key: list[str], rows_per_range: int) -> list[KeyRange]:
    """Ranges of about `rows_per_range` rows each (the last may hold fewer), in key order."""
    if rows_per_range < 1:
        raise TrailboundError(f"rows per range must be at least 1, not {rows_per_range}")
    table = sql.Identifier(schema, name)
    # aliased: ORDER BY a bare name would sort by the text output column of that name
    texts = sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(sql.Identifier(c), sql.Identifier(f"bound_{i}"))
                               for i, c in enumerate(key))
    boundaries: list[dict[str, str]] = []
    while True:
        condition, params = range_condition(table, key, boundaries[-1] if boundaries else None, None)
        cur.execute(sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} OFFSET %s LIMIT 1").format(
            texts, table, condition, order_by(key)), [*params, rows_per_range])
        row = cur.fetchone()
        if row is None:
            break
        boundaries.append(dict(zip(key, row)))
    edges = [None, *boundaries, None]
    return [KeyRange(lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]


def condition(schema: str, name: str, key: list[str], key_range: KeyRange,
              alias: str | None = None) -> tuple[sql.Composed, list]:
    """The SQL condition selecting one range of the table, and its params."""
    return range_condition(sql.Identifier(schema, name), key, key_range.lo, key_range.hi, alias)


def order_by(key: list[str]) -> sql.Composed:
    """`k1, k2`: the key's order (the primary key's index order)."""
    return sql.SQL(", ").join(map(sql.Identifier, key))

def bound_row(table: sql.Composable, key: Sequence[str], bound: Mapping[str, object]) -> tuple[sql.Composed, list]:
    """`((SELECT r.k1 FROM jsonb_populate_record(NULL::table, %s) r), ...)` and its params."""
    text = json.dumps({column: bound[column] for column in key})
    parts = [sql.SQL("(SELECT r.{} FROM jsonb_populate_record(NULL::{}, %s::jsonb) r)").format(
        sql.Identifier(column), table) for column in key]
    return sql.SQL("({})").format(sql.SQL(", ").join(parts)), [text] * len(key)


def key_row(key: Sequence[str], alias: str | None = None) -> sql.Composed:
    """`(t.k1, t.k2)`: the key columns as a row, to compare with bound_row."""
    columns = [sql.Identifier(alias, c) if alias else sql.Identifier(c) for c in key]
    return sql.SQL("({})").format(sql.SQL(", ").join(columns))


def range_condition(table: sql.Composable, key: Sequence[str], lo: Mapping | None, hi: Mapping | None,
                    alias: str | None = None) -> tuple[sql.Composed, list]:
    """The condition selecting [lo, hi) of `table`'s key, and its params (TRUE: the whole table)."""
    conditions, params = [], []
    for bound, operator in ((lo, ">="), (hi, "<")):
        if bound is None:
            continue
        row, values = bound_row(table, key, bound)
        # ROW(...) even for one column: a one-column row compares like its value.
        conditions.append(sql.SQL("{} {} {}").format(key_row(key, alias), sql.SQL(operator), row))
        params += values
    return (sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("TRUE")), params
