"""Net rows for a chunk: the COPY lines of each unit's net change per table and key.

The (unit, table)s without key-changing UPDATEs are netted with Arrow (netarrow.py); the
rest (rare) in plain Python (netpython.py), or through the Spark transform (netchange.py)
when a chunk holds more of it than netpython.LIMIT records. `NetRows` indexes the lines
so that the lines of one (unit, table, step) are sent to the target as one slice.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trailbound import copytext
from trailbound.replicat import netarrow, netpython
from trailbound.replicat import target as tgt
from trailbound.replicat.chunks import Chunk
from trailbound.replicat.netchange import STEP, Shape, copy_lines, lifetime_of, net_changes, resolve_chains


@dataclass
class UnitTable:
    table: str
    staged: tuple[int, int, int] | None = None       # (part, first line, past the last)
    counts: dict[str, int] = field(default_factory=dict)
    inserts: tuple[int, int, int] | None = None
    unresolved: bool = False


class NetRows:
    """COPY lines for a chunk, as slices: the lines of one (unit, table, step) are one
    contiguous slice of one part's data buffer, sent as is. A part must hold each
    (unit, table, step) contiguously (Arrow-made lines do, table by table); Spark's are
    sorted first."""

    def __init__(self, parts: list[pa.Table]):
        self._buffers: list[tuple[memoryview, np.ndarray]] = []
        self.units: dict[int, list[UnitTable]] = {}
        self.staged: dict[str, memoryview] = {}   # per table: every staged line, led by its unit
        for table in parts:
            if len(table):
                self._add(table)
        self._stage(parts)

    def _stage(self, parts: list[pa.Table]) -> None:
        """The staging table's COPY text per table: the staged lines (step 1) of every
        part, each led by its unit."""
        pieces: dict[str, list[pa.Buffer]] = {}
        for table in parts:
            if not len(table):
                continue
            staged = table.filter(pc.equal(table.column("step"), STEP["D"]))
            for name in pc.unique(staged.column("table")).to_pylist():
                rows = staged.filter(pc.equal(staged.column("table"), name))
                led = pc.binary_join_element_wise(rows.column("unit").cast(pa.string()), rows.column("line"), "\t")
                pieces.setdefault(name, []).append(copytext.joined(led.combine_chunks()))
        self.staged = {name: memoryview(b"".join(buffers) if len(buffers) > 1 else buffers[0])
                       for name, buffers in pieces.items()}

    def _add(self, table: pa.Table) -> None:
        part = len(self._buffers)
        lines = table.column("line").combine_chunks()
        if not pa.types.is_large_string(lines.type):
            lines = lines.cast(pa.large_string())
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
        self._buffers.append((memoryview(lines.buffers()[2]) if lines.buffers()[2] is not None else memoryview(b""),
                              offsets))
        units = table.column("unit").to_numpy()
        steps = table.column("step").to_numpy()
        names = table.column("table").combine_chunks().dictionary_encode()
        codes = names.indices.to_numpy()
        dictionary = names.dictionary.to_pylist()
        # The kinds are counted for staged lines only: an insert-only part converts none.
        kinds = table.column("kind").to_numpy(zero_copy_only=False) if (steps == STEP["D"]).any() else None
        cuts = np.flatnonzero(np.r_[True, (units[1:] != units[:-1]) | (codes[1:] != codes[:-1]) |
                                    (steps[1:] != steps[:-1]), True])
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            unit, name, step = int(units[a]), dictionary[codes[a]], int(steps[a])
            entries = self.units.setdefault(unit, [])
            entry = next((e for e in entries if e.table == name), None)
            if entry is None:
                entry = UnitTable(name)
                entries.append(entry)
            if step == 0:
                entry.unresolved = True
            elif step == 1:
                entry.staged = (part, a, b)
                found, counts = np.unique(kinds[a:b], return_counts=True)
                entry.counts = {str(k): int(c) for k, c in zip(found, counts)}
            else:
                entry.inserts = (part, a, b)

    def tables(self) -> set[str]:
        """The source tables the chunk's net rows touch."""
        return {entry.table for entries in self.units.values() for entry in entries}

    def view(self, span: tuple[int, int, int] | None) -> memoryview | None:
        if span is None:
            return None
        part, a, b = span
        data, offsets = self._buffers[part]
        return data[int(offsets[a]):int(offsets[b])]


def _grouped(table: pa.Table) -> pa.Table:
    """Lines sorted so that each (unit, table, step) is contiguous."""
    if not len(table):
        return table
    return table.take(pc.sort_indices(table, sort_keys=[("unit", "ascending"), ("table", "ascending"),
                                                        ("step", "ascending")]))


def compute_net(start_spark, chunk: Chunk, plans: dict[str, tgt.TablePlan | None], workdir: Path,
                timer=None) -> NetRows | None:
    """The COPY lines of the chunk's applied DML records: netted with Arrow (netarrow.py)
    where no key changes, the rest in Python (netpython.py) or, past netpython.LIMIT
    records, by Spark (netchange.py; `start_spark` gives the session, and is called only
    then). `timer`, when given, adds each phase's seconds (`timer.add(phase, seconds)`)."""
    records = chunk.light  # the after images only where needed (see below)
    n = len(records)
    if not chunk.groups:
        return None
    began = time.perf_counter()
    applied = np.repeat(chunk.group_of_txn >= 0, np.diff(np.append(chunk.txn_starts, n)))
    dml = applied & ~np.asarray(pc.equal(records.column("op"), "TRUNCATE").to_numpy(zero_copy_only=False), dtype=bool)
    mapped_names = [name for name, plan in plans.items() if plan is not None]
    dml &= np.asarray(pc.is_in(records.column("table"), pa.array(mapped_names, pa.string()))
                      .to_numpy(zero_copy_only=False), dtype=bool)
    chosen = np.flatnonzero(dml)
    if not len(chosen):
        return NetRows([])
    mapped = {name: plans[name] for name in mapped_names}

    def chosen_records(columns: pa.Table) -> pa.Table:
        selected = columns if len(chosen) == n else columns.take(pa.array(chosen))
        return pa.table({"unit": pa.array(chunk.unit_of_record[chosen].astype(np.int64)),
                         "seq": pa.array(chosen.astype(np.int64)),
                         **{name: selected.column(name) for name in ("table", "op", "before", "after", "copy_line")
                            if name in selected.schema.names}})
    # Without the images when the trail was read without them: lined inserts need none.
    # (Records left for the transforms below were netted from their images, so `data`
    # has them whenever `rest` names any.)
    data = chosen_records(records)
    try:
        arrow_lines, rest = netarrow.net_lines(data, mapped)
    except netarrow.ImagesNeeded:
        data = chosen_records(chunk.records)
        arrow_lines, rest = netarrow.net_lines(data, mapped)
    parts = [arrow_lines]
    if timer:
        timer.add("prepare: net change (Arrow)", time.perf_counter() - began)
    if rest.any():
        began = time.perf_counter()
        data = data.filter(pa.array(rest))
        if "copy_line" in data.schema.names:  # the transforms below take the images
            data = data.drop_columns(["copy_line"])
        shapes = {name: Shape.of(plans[name].columns, plans[name].key)
                  for name in sorted(pc.unique(data.column("table")).to_pylist())}
        if len(data) <= netpython.LIMIT:
            parts.append(_grouped(netpython.net_lines(data.to_pylist(), shapes)))
            if timer:
                timer.add("prepare: net change (key changes, Python)", time.perf_counter() - began)
        else:
            parts.append(_grouped(_net_with_spark(start_spark(), data, shapes, workdir)))
            if timer:
                timer.add("prepare: net change (Spark)", time.perf_counter() - began)
    began = time.perf_counter()
    rows = NetRows(parts)
    for unit, table in _keyless_to_replay(chosen, chunk, plans):
        entries = rows.units.setdefault(unit, [])
        entry = next((e for e in entries if e.table == table), None)
        if entry is None:
            entries.append(entry := UnitTable(table))
        entry.unresolved = True
    if timer:
        timer.add("prepare: index the COPY lines", time.perf_counter() - began)
    return rows


def _net_with_spark(spark, data: pa.Table, shapes: dict[str, Shape], workdir: Path) -> pa.Table:
    """The Spark transform over `data`'s records (through Parquet files in `workdir`),
    its chains resolved."""
    inputs, outputs = workdir / "in", workdir / "out"
    shutil.rmtree(workdir, ignore_errors=True)
    inputs.mkdir(parents=True)
    # Several files, so that Spark reads (and parses the images) in parallel.
    pieces = max(1, min(spark.sparkContext.defaultParallelism, len(data) // 20_000))
    step = -(-len(data) // pieces)
    for number, offset in enumerate(range(0, len(data), step)):
        pq.write_table(data.slice(offset, step), inputs / f"part-{number:05d}.parquet", compression="lz4")
    net = net_changes(spark.read.parquet(str(inputs)), shapes)
    copy_lines(net, shapes).write.mode("overwrite").parquet(str(outputs))
    lines = _with_chains_resolved(pq.read_table(outputs, schema=netarrow.LINES_SCHEMA), shapes)
    shutil.rmtree(workdir, ignore_errors=True)
    return lines


def _keyless_to_replay(chosen: np.ndarray, chunk: Chunk,
                       plans: dict[str, tgt.TablePlan | None]) -> set[tuple[int, str]]:
    """The (unit, table) pairs of keyless tables that the set-based fast path would get
    wrong, so they are replayed one statement each (which touches exactly one of
    identical rows, as PostgreSQL's own apply does for REPLICA IDENTITY FULL): a net
    change keyed by all columns folds two identical INSERTs into one, and a DELETE or
    UPDATE matched on all columns hits every identical row in the target. Found with
    Arrow over the keyless tables' records only (a Python loop over every record of a
    chunk took 2 s per million)."""
    keyless = [name for name, plan in plans.items() if plan is not None and plan.keyless]
    if not keyless or not len(chosen):
        return set()
    tables = chunk.light.column("table").take(pa.array(chosen))
    picked = chosen[np.asarray(pc.is_in(tables, pa.array(keyless, pa.string())).to_numpy(zero_copy_only=False),
                               dtype=bool)]
    if not len(picked):
        return set()
    rows = chunk.records.select(["table", "op", "after"]).take(pa.array(picked)).append_column(
        "unit", pa.array(chunk.unit_of_record[picked].astype(np.int64)))
    inserts = pc.equal(rows.column("op"), "INSERT")
    # A DELETE or UPDATE, or an INSERT of a row inserted before in the same unit.
    changed = rows.filter(pc.invert(inserts)).select(["unit", "table"])
    repeated = (rows.filter(inserts).group_by(["unit", "table", "after"]).aggregate([("unit", "count")])
                .filter(pc.greater(pc.field("unit_count"), 1)).select(["unit", "table"]))
    return {(int(unit), table) for part in (changed, repeated)
            for unit, table in zip(part.column("unit").to_pylist(), part.column("table").to_pylist())}


def _with_chains_resolved(lines: pa.Table, shapes: dict[str, Shape]) -> pa.Table:
    """Replace Spark's linked lifetimes (kind L: rows moved by key updates) with the net
    rows their chains come to."""
    linked = pc.equal(lines.column("kind"), "L")
    if not pc.any(linked).as_py():
        return lines
    lifetimes = [lifetime_of(json.loads(text) | {"unit": unit, "table": table}, shapes[table])
                 for unit, table, text in zip(*(lines.filter(linked).column(c).to_pylist()
                                                for c in ("unit", "table", "line")))]
    return pa.concat_tables([lines.filter(pc.invert(linked)), netpython.lines_of(resolve_chains(lifetimes), shapes)])
