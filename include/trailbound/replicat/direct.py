"""Units that are their own net change: every record an INSERT, every key once.

Such a unit's net change is its records, so Spark has nothing to add: the driver parses
the after images with Arrow's JSON reader (vectorised, typed by the target's catalog)
and formats the COPY lines itself. Everything else (updates, deletes, a key touched
twice, a key update, a value of an unexpected JSON kind) goes to the Spark transform in
netchange.py. Measured (docs/benchmarks/replicat.md): Spark local on this class of
machine parses, shuffles and formats ~40k changes/s, where a plain COPY loads 300-500k
rows/s; insert-heavy work would spend nine tenths of its time in Spark for nothing.

The lines are byte-for-byte what `netchange.copy_lines` writes for an I row, except for
the spelling of floats (Arrow writes 1e-300 where Java writes 1.0E-300): PostgreSQL
reads both as the same double.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from trailbound.replicat.netchange import COPY_ESCAPES, COPY_NULL, STEP
from trailbound.replicat.target import TablePlan

_INTEGER = {"smallint", "integer", "bigint"}
_FLOAT = {"real", "double precision"}
LINES_SCHEMA = pa.schema([("unit", pa.int64()), ("table", pa.string()), ("kind", pa.string()), ("step", pa.int8()),
                          ("line", pa.string())])


def _arrow_type(type_name: str) -> pa.DataType:
    """The JSON kind an image holds for a column of this target type (the redo archive
    contract: booleans, integers, floats for float columns, else text input forms)."""
    if type_name in _INTEGER:
        return pa.int64()
    if type_name in _FLOAT:
        return pa.float64()
    if type_name == "boolean":
        return pa.bool_()
    return pa.string()


def _text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    text = column.cast(pa.string())
    # Numbers and booleans never need escaping; most text does not either (one scan).
    if pa.types.is_string(column.type) and pc.any(pc.match_substring_regex(text, "[\\\\\t\n\r]")).as_py():
        for raw, escaped in COPY_ESCAPES:
            text = pc.replace_substring(text, raw, escaped)
    return text.fill_null(COPY_NULL)


def _parse(images: pa.ChunkedArray, plan: TablePlan) -> pa.Table | None:
    """The images as a table of the target's JSON kinds; None if any image does not fit."""
    schema = pa.schema([(c, _arrow_type(t)) for c, t in zip(plan.columns, plan.types)])
    ndjson = _joined(pc.binary_join_element_wise(images.combine_chunks(), "", "\n"))
    try:
        return pj.read_json(pa.BufferReader(ndjson),
                            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
                            read_options=pj.ReadOptions(block_size=1 << 24))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # an image of another shape than the catalog implies: Spark will say


def _joined(lines: pa.Array) -> pa.Buffer:
    """The values of a string array concatenated: a slice of its data buffer, no copy."""
    if not len(lines):
        return pa.py_buffer(b"")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
    return lines.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def split(data: pa.Table, plans: dict[str, TablePlan]) -> tuple[pa.Table, np.ndarray]:
    """data: unit, seq, table, op, before, after (the applied DML records of mapped
    tables). Returns the COPY lines (LINES_SCHEMA) of every unit that is its own net
    change, and a mask of the records left for Spark."""
    units = data.column("unit").to_numpy()
    inserts = np.asarray(pc.equal(data.column("op"), "INSERT").to_numpy(zero_copy_only=False), dtype=bool)
    order = np.argsort(units, kind="stable")
    unit_sorted = units[order]
    starts = np.flatnonzero(np.r_[True, unit_sorted[1:] != unit_sorted[:-1]])
    all_inserts = np.logical_and.reduceat(inserts[order], starts) if len(order) else np.zeros(0, dtype=bool)
    simple_units = set(unit_sorted[starts][all_inserts].tolist())
    simple = np.isin(units, list(simple_units)) if simple_units else np.zeros(len(units), dtype=bool)

    pieces = []
    tables = data.column("table")
    for name in pc.unique(pc.filter(tables, pa.array(simple))).to_pylist() if simple.any() else []:
        rows = np.flatnonzero(simple & np.asarray(pc.equal(tables, name).to_numpy(zero_copy_only=False), dtype=bool))
        plan = plans[name]
        parsed = _parse(data.column("after").take(pa.array(rows)), plan)
        table_units = units[rows]
        if parsed is None or len(parsed) != len(rows):
            simple[np.isin(units, table_units)] = False
            continue
        keyed = parsed.select(list(plan.key)).append_column("__unit", pa.array(table_units))
        counts = keyed.group_by(["__unit", *plan.key], use_threads=False).aggregate([("__unit", "count")])
        repeated = pc.filter(counts.column("__unit"), pc.greater(counts.column("__unit_count"), 1))
        if len(repeated):
            simple[np.isin(units, repeated.to_numpy())] = False
        pieces.append((name, rows, parsed))
    out = []
    for name, rows, parsed in pieces:
        keep = simple[rows]
        if not keep.any():
            continue
        parsed = parsed.filter(pa.array(keep))
        columns = [_text(parsed.column(c)) for c in plans[name].columns]
        lines = pc.binary_join_element_wise(*columns, "\t")
        lines = pc.binary_join_element_wise(lines, "", "\n")
        n = len(lines)
        out.append(pa.table({"unit": pa.array(units[rows][keep]), "table": pa.array([name] * n, pa.string()),
                             "kind": pa.array(["I"] * n, pa.string()),
                             "step": pa.array(np.full(n, STEP["I"], dtype=np.int8)), "line": lines},
                            schema=LINES_SCHEMA))
    lines = pa.concat_tables(out) if out else LINES_SCHEMA.empty_table()
    return lines, ~simple
