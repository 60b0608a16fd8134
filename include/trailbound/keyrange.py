"""A key range as a SQL condition: `(k1, k2) >= lo AND (k1, k2) < hi`, lo inclusive, hi
exclusive, either end open (None).

Bounds are dicts of key column -> value in PostgreSQL text form (or the archive's JSON
value). They are turned into the column's type by the table's own row type,
`jsonb_populate_record(NULL::table, bound)`, so no type name is ever written into SQL
and the same bound works on the source and on a target whose types differ a little.
Each bound column is its own scalar subquery: a constant the planner can match to the
primary key's index.

Used by the initial load's copy (load/copy.py), the source's key-range planner
(sources/postgres/keyranges.py, through load/keys.py), replicat applying a load's
window (replicat/windows.py) and the compare (compare/sides.py). Imports nothing from
trailbound; anything may import it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from psycopg2 import sql


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
