"""Net rows for a chunk: the COPY lines of each unit's net change per table and key.

The (unit, table)s without key-changing UPDATEs are netted with Arrow (arrow.py); the
rest (rare) by the backend net.backend_for picks: plain Python (python.py), or the Spark
transform (spark.py) when a chunk holds more of it than python.LIMIT records. The lines
come back indexed (rows.py), with the units of keyless tables that must be replayed.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound.replicat import target as tgt
from trailbound.replicat.chunks import Chunk
from trailbound.replicat.net import Shape, arrow, backend_for
from trailbound.replicat.net.rows import NetRows


def _grouped(table: pa.Table) -> pa.Table:
    """Lines sorted so that each (unit, table, step) is contiguous."""
    if not len(table):
        return table
    return table.take(pc.sort_indices(table, sort_keys=[("unit", "ascending"), ("table", "ascending"),
                                                        ("step", "ascending")]))


def compute_net(start_spark, chunk: Chunk, plans: dict[str, tgt.TablePlan | None], workdir: Path,
                timer=None) -> NetRows | None:
    """The COPY lines of the chunk's applied DML records: netted with Arrow (arrow.py)
    where no key changes, the rest by the backend net.backend_for picks: Python
    (python.py) or, past python.LIMIT records, Spark (spark.py; `start_spark` gives the
    session, and is called only then). `timer`, when given, adds each phase's seconds
    (`timer.add(phase, seconds)`)."""
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
    replay = _keyless_to_replay(chosen, chunk, plans)
    if replay:
        # Their records are replayed one statement each (run.apply_units): netting them
        # would be wasted, at a fixed cost per table (hundreds of keyless tables).
        pairs = pa.array([f"{unit}\t{table}" for unit, table in replay], pa.string())
        of_chosen = pc.binary_join_element_wise(pa.array(chunk.unit_of_record[chosen].astype(np.int64)).cast(pa.string()),
                                                records.column("table").take(pa.array(chosen)), "\t")
        chosen = chosen[~np.asarray(pc.is_in(of_chosen, pairs).to_numpy(zero_copy_only=False), dtype=bool)]
    if timer:
        timer.add("prepare: net change (Arrow)", time.perf_counter() - began)
    rows = _net_rows(start_spark, chunk, chosen, plans, mapped_names, workdir, timer) if len(chosen) else NetRows([])
    began = time.perf_counter()
    for unit, table in replay:
        rows.entry(unit, table).unresolved = True
    if timer:
        timer.add("prepare: index the COPY lines", time.perf_counter() - began)
    return rows


def _net_rows(start_spark, chunk: Chunk, chosen: np.ndarray, plans: dict[str, tgt.TablePlan | None],
              mapped_names: list[str], workdir: Path, timer) -> NetRows:
    """The net rows of the `chosen` records: Arrow first, the rest by the backend."""
    began = time.perf_counter()
    records, n = chunk.light, len(chunk.light)
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
        arrow_lines, rest = arrow.net_lines(data, mapped)
    except arrow.ImagesNeeded:
        data = chosen_records(chunk.records)
        arrow_lines, rest = arrow.net_lines(data, mapped)
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
        backend = backend_for(len(data))
        parts.append(_grouped(backend.net(data, shapes, start_spark, workdir)))
        if timer:
            timer.add(backend.phase, time.perf_counter() - began)
    began = time.perf_counter()
    rows = NetRows(parts)
    if timer:
        timer.add("prepare: index the COPY lines", time.perf_counter() - began)
    return rows


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
