"""Net change: trail records in, one row per surviving change per table and key out, as
COPY lines. This docstring is the contract every backend below keeps; the code here is
what they share (no pyspark: the paths that avoid a JVM import only this and their own
module).

    arrow.py    the (unit, table)s whose keys never change, vectorised with Arrow (nearly all)
    python.py   the rest in plain Python, up to python.LIMIT records a chunk (no JVM)
    spark.py    the rest as DataFrame transforms, past python.LIMIT
    rows.py     `NetRows`: a chunk's lines indexed by (unit, table, step), as apply sends them
    compute.py  `compute_net`: a chunk's lines, arrow.py first, the rest through the
                backend `backend_for` names, and the keyless tables' units to replay

Replicat groups many source transactions into one target transaction and splits each
group into *units* (a TRUNCATE is applied on its own, never inside a unit). Inside a unit
only the net effect on each row matters:

- A row's *lifetime* on a key runs from where it appears (INSERT, an UPDATE that moves a
  row onto the key, or the start of the unit for a row the target already has) to where
  it goes (DELETE, an UPDATE that moves it to another key, or the end of the unit). The
  source's keys are unique at every moment, so the lifetimes on one key follow each
  other; a key inserted, updated and deleted inside the unit leaves nothing.
- Column values fold in commit order. A column absent from every image of a row the
  target already holds keeps the target's value: the row carries which columns are
  present (the mask of its COPY line).
- A primary-key UPDATE ends one lifetime and starts another: the two are *linked*, and a
  chain of linked lifetimes is one row wandering through keys. `resolve_chains` (plain
  Python: key updates are rare, and a chain is a walk, which a join-per-step plan would
  do badly) turns linked lifetimes into net rows.

Net rows, per (unit, table):

| kind | meaning | okey | vals |
|---|---|---|---|
| I | insert a new row | - | every column |
| D | delete the target's row at okey | origin key | - |
| U | update the target's row at okey in place | origin key | present columns |
| M | move the target's row at okey: delete it, insert it merged at its new key | origin key | present columns |
| X | input no source could produce (a broken chain): apply the unit record by record | - | - |

A key is the list of the key columns' values as the images carry them (PostgreSQL text
input forms); a keyless table is keyed by all its columns. Values are the images' JSON
values as text: strings as they are, numbers in the image's own spelling (Java spells
some floats differently, 1.0E-300 for 1e-300: PostgreSQL reads both as the same double),
booleans as true/false.

The lines (LINES_SCHEMA: unit, table, kind, step, line), `format_line` for one row:

- an I line is the row's columns in the table's column order, for COPY straight into
  the target;
- a staged line (D, U, M) is: kind, mask (1/0 per column: carried by the images?), the
  origin key's columns, then every column (\\N where absent), for the staging table;
- an X line is empty: its (unit, table) is replayed record by record.

`STEP` orders them within a unit and table: 0 X (replay), 1 staged D/U/M, 2 I (3 is a
linked lifetime the Spark transform hands back for `resolve_chains`, never applied).

A backend takes records (unit, seq: commit order, table, op: INSERT/UPDATE/DELETE,
before, after: JSON text) and gives these lines, byte for byte the same whichever
backend made them but for the spelling of some floats (arrow.py says which;
tests/test_replicat.py holds them to it), each (unit, table, step) contiguous once
sorted. arrow.py nets only the (unit, table)s without a key-changing UPDATE and hands
back a mask of the rest; the rest goes to the `Backend` that `backend_for` picks by its
size: python.py or spark.py, which net anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from trailbound.copytext import COPY_ESCAPES, COPY_NULL

# Touch roles: what a record does to one key.
NEW, MOVED_IN, MODIFY, DELETED, MOVED_OUT = "new", "moved_in", "modify", "deleted", "moved_out"
ENDS = (DELETED, MOVED_OUT)               # a lifetime ends at these
CARRIES_IMAGE = (NEW, MOVED_IN, MODIFY)   # these fold the record's image into the row

STAGED_KINDS = ("D", "U", "M")
# Order of application within a unit and table: 0 X (replay), 1 staged D/U/M, 2 I; 3 is a
# linked lifetime Spark hands back for `resolve_chains`.
STEP = {"X": 0, "D": 1, "U": 1, "M": 1, "I": 2, "L": 3}

LINES_SCHEMA = pa.schema([("unit", pa.int64()), ("table", pa.string()), ("kind", pa.string()), ("step", pa.int8()),
                          ("line", pa.string())])


@dataclass(frozen=True)
class Shape:
    """A source table as the backends see it: its columns in order and its key (all
    columns when the table has none)."""

    columns: tuple[str, ...]
    key: tuple[str, ...]

    @classmethod
    def of(cls, columns, key) -> "Shape":
        return cls(tuple(columns), tuple(key) or tuple(columns))


Shapes = dict[str, Shape]


@dataclass(frozen=True)
class Backend:
    """A backend for the records arrow.py leaves: `net(records, shapes, start_spark,
    workdir)` gives their lines (LINES_SCHEMA, chains resolved) from `records` (a table
    of unit, seq, table, op, before, after); `start_spark` gives a session and
    `workdir` a scratch directory, for a backend that wants them. `phase` names its time
    in a run's timer."""

    name: str
    phase: str
    net: Callable[[pa.Table, Shapes, Callable, Path], pa.Table]


def backend_for(records: int) -> Backend:
    """The backend for a chunk's `records` records that arrow.py leaves (key changes):
    python.py up to python.LIMIT of them (no JVM), spark.py past it (a transaction of
    hundreds of thousands of records, netted without holding them as Python objects)."""
    from trailbound.replicat.net import python

    if records <= python.LIMIT:
        return python.BACKEND
    from trailbound.replicat.net import spark  # pyspark: only when it is chosen

    return spark.BACKEND


def lifetime_of(row: dict, shape: Shape) -> dict:
    """A linked lifetime (kind L, as the Spark transform sends it: JSON) in the form
    `resolve_chains` takes."""
    return {"unit": row["unit"], "table": row["table"], "first_seq": row["first_seq"],
            "first_role": row["first_role"], "last_seq": row["last_seq"], "last_role": row["last_role"],
            "okey": list(row["okey"] or [])[:len(shape.key)],
            "vals": {c: row["v"][i] for i, c in enumerate(shape.columns) if row["p"][i]}}


def resolve_chains(lifetimes: list[dict]) -> list[dict]:
    """Kind L rows (lifetimes linked by key-changing UPDATEs: rare) -> net rows.

    A key-changing UPDATE is the last record of one lifetime (moved out) and the first of
    the next (moved in): follow each chain from its head (a lifetime that was not moved
    in) to its tail, folding the images in order. The result row has the head's origin
    (a new row, or the target's row at the head's key) and the tail's fate. A lifetime
    no chain reaches (input the source could not have produced) becomes kind X."""
    by_unit_table: dict[tuple, list[dict]] = {}
    for row in lifetimes:
        by_unit_table.setdefault((row["unit"], row["table"]), []).append(row)
    out = []
    for (unit, table), rows in by_unit_table.items():
        moved_in = {row["first_seq"]: row for row in rows if row["first_role"] == MOVED_IN}
        reached = 0
        for head in sorted((r for r in rows if r["first_role"] != MOVED_IN), key=lambda r: r["first_seq"]):
            vals, node = dict(head["vals"] or {}), head
            reached += 1
            while node["last_role"] == MOVED_OUT and node["last_seq"] in moved_in:
                node = moved_in.pop(node["last_seq"])
                reached += 1
                vals.update(node["vals"] or {})
            if node["last_role"] == MOVED_OUT:
                kind = "X"
            elif head["first_role"] == NEW:
                kind = None if node["last_role"] == DELETED else "I"
            elif node["last_role"] == DELETED:
                kind = "D"
            else:
                kind = "U" if list(node["okey"]) == list(head["okey"]) else "M"
            if kind is not None:
                out.append({"unit": unit, "table": table, "kind": kind,
                            "okey": list(head["okey"]) if kind in ("D", "U", "M") else None,
                            "vals": vals if kind in ("I", "U", "M") else None})
        if reached < len(rows):
            out.append({"unit": unit, "table": table, "kind": "X", "okey": None, "vals": None})
    return out


def copy_escape(value: str | None) -> str:
    """A value as a field of COPY text (the Spark transform escapes the same in SQL)."""
    if value is None:
        return COPY_NULL
    for raw, escaped in COPY_ESCAPES:
        value = value.replace(raw, escaped)
    return value


def format_line(row: dict, shape: Shape) -> str:
    """A net row (as `resolve_chains` returns it) as its COPY line (see above)."""
    kind, vals = row["kind"], row["vals"] or {}
    values = "\t".join(copy_escape(vals.get(c)) for c in shape.columns)
    if kind == "I":
        return values + "\n"
    if kind == "X":
        return ""
    mask = "".join("1" if c in vals else "0" for c in shape.columns)
    return "\t".join([kind, mask, "\t".join(copy_escape(v) for v in row["okey"]), values]) + "\n"


def lines_of(rows: list[dict], shapes: Shapes) -> pa.Table:
    """Net rows (unit, table, kind, okey, vals: as resolve_chains gives them) as COPY
    lines, LINES_SCHEMA."""
    return pa.table({"unit": [r["unit"] for r in rows], "table": [r["table"] for r in rows],
                     "kind": [r["kind"] for r in rows], "step": [STEP[r["kind"]] for r in rows],
                     "line": [format_line(r, shapes[r["table"]]) for r in rows]}, schema=LINES_SCHEMA)
