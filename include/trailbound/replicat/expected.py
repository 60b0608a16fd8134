"""What a replica should hold, for the replica check (trailbound.quality.validate_replica).

Two sources of truth, best first:
- the source's `truth` file (the simulator writes one): every row of every table, valid
  once the replicat has applied through its `last_csn`;
- the trail itself: folding the records the replicat has applied (up to its checkpoint)
  gives, per key the trail touched, the row it must hold now or the fact that it must be
  gone. Keys the trail never touched (rows older than capture's begin point) are not
  judged, nor the columns of a row the trail only ever updated partially, nor keyless
  tables (their "key" is the whole row). Purged trail files are simply not read: a fold
  over the trail's suffix is still right for the keys it touches, with partial rows
  counted only by presence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from trailbound.archive.segments import TableDef
from trailbound.positions import TrailPosition
from trailbound.trail import format as trails


@dataclass
class ExpectedTable:
    """One source table's expected state. `rows`: full rows the target must hold exactly;
    `present`: keys that must exist (a superset of the rows' keys); `gone`: keys that must
    not exist. `complete`: every row of the table is known (a truth file), so the target
    must hold nothing else."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    rows: list[dict] = field(default_factory=list)
    present: list[tuple] = field(default_factory=list)
    gone: list[tuple] = field(default_factory=list)
    complete: bool = False


def from_truth(truth: dict) -> dict[str, ExpectedTable]:
    return {name: ExpectedTable(name, tuple(table["columns"]), (), table["rows"], complete=True)
            for name, table in truth["tables"].items()}


def from_trail(files: list[tuple[int, str]], upto: TrailPosition, defs: dict[str, TableDef],
               tables: set[str] | None = None) -> dict[str, ExpectedTable]:
    """Fold the records of `files` ((seqno, path) in seqno order) that lie before `upto`
    (a replicat checkpoint: the next record to read) into the expected state of the keyed
    tables among `tables` (default: all in defs)."""
    states: dict[str, dict[tuple, dict]] = {}
    gone: dict[str, set[tuple]] = {}
    keys = {name: d.key for name, d in defs.items() if d.key and (tables is None or name in tables)}
    for seqno, path in files:
        if seqno > upto.seqno or (seqno == upto.seqno and upto.rba == 0):
            break
        data = trails.read_file(path)
        if "table_version" not in data.column_names:  # a trail older than versions: version 1 throughout
            data = data.append_column("table_version", pa.nulls(len(data), pa.int32()))
        data = data.select(["rba", "op", "table", "before", "after", "table_version"])
        if seqno == upto.seqno:
            data = data.filter(pc.less(data["rba"], upto.rba))
        for op, table, before, after, number in zip(*(data[c].to_pylist() for c in ("op", "table", "before", "after",
                                                                                      "table_version"))):
            key = keys.get(table)
            if key is None:
                continue
            state, table_gone = states.setdefault(table, {}), gone.setdefault(table, set())
            if op == "TRUNCATE":
                table_gone.update(state)
                state.clear()
                continue
            if op == "INSERT":
                # a row of an earlier version holds what the source gave it when later
                # versions added columns: their DEFAULT (NULL without one)
                row = {**_added_since(defs[table], number or 1), **json.loads(after)}
                new = tuple(row[c] for c in key)
                state[new] = row
                table_gone.discard(new)
                continue
            old_image = json.loads(before)
            old = tuple(old_image[c] for c in key)
            row = state.pop(old, None) or old_image  # a row from before the fold: what the image shows
            if op == "DELETE":
                table_gone.add(old)
                continue
            row = {**row, **json.loads(after)}  # UPDATE: absent columns keep their value
            new = tuple(row[c] for c in key)
            if new != old:
                table_gone.add(old)
                table_gone.discard(new)
            state[new] = row
    expected = {}
    for name, state in states.items():
        columns = tuple(c.name for c in defs[name].columns)
        full = [row for row in state.values() if all(c in row for c in columns)]
        expected[name] = ExpectedTable(name, columns, keys[name], full, list(state), sorted(gone[name], key=repr))
    return expected


def _added_since(table: TableDef, number: int) -> dict:
    if number >= table.latest.version:
        return {}
    have = set(table.version(number).names)
    return {c.name: c.default for c in table.columns if c.name not in have}


def readable_suffix(rows: list[dict], upto: TrailPosition) -> list[tuple[int, str]]:
    """The files to fold, among a trail's committed-file rows: the longest run of
    consecutive, unpurged, local files ending with the checkpoint's file (folding across
    a gap would miss what the gap changed). A remote trail's files are judged by the
    replicat that reads them, not read again here."""
    readable = {row["seqno"]: row["path"] for row in rows
                if row.get("purged_at") is None and "://" not in row["path"] and Path(row["path"]).exists()}
    last = upto.seqno if upto.rba > 0 else upto.seqno - 1
    suffix = []
    while last in readable:
        suffix.append((last, readable[last]))
        last -= 1
    return suffix[::-1]
