"""Net change with Arrow: the (unit, table)s whose keys never change, vectorised.

The same net change as netchange.py (read its docstring for lifetimes, kinds and the
COPY lines), for the common case where no UPDATE moves a row to another key. Then every
record touches exactly one key and a row's lifetimes on a key are cut only by DELETEs,
so the whole transform is: parse the images with Arrow's JSON reader (typed by the
target's catalog), sort by (unit, key, seq), cut lifetimes, fold each column to the
last image that carried it, format COPY lines. No Python loop over records, no JVM; it
runs wherever the records are (the driver, or a Spark task through `mapInArrow`).

What it leaves to netpython.py (or, for many records, the Spark transform: records of
those (unit, table)s, in a mask):
key-changing UPDATEs (chains of moved rows), images that do not parse into the target's
JSON kinds, column names whose JSON spelling is not certain (non-ASCII, quotes).

Which columns an UPDATE's after image carries is read from the image text: the pattern
`"name"\\s*:` can only match a key of the image's object (inside a JSON string every quote
is escaped, and a nested object does not parse into the flat schema, so that table goes to
Spark). Lines are byte for byte what `netchange.copy_lines` writes, except for the
spelling of floats (Arrow writes 1e-300 where Java writes 1.0E-300): PostgreSQL reads
both as the same double.
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
RECORDS_SCHEMA = pa.schema([("unit", pa.int64()), ("seq", pa.int64()), ("table", pa.string()), ("op", pa.string()),
                            ("before", pa.string()), ("after", pa.string())])
_REGEX_SPECIAL = set(r".^$*+?()[]{}|\-/")
_ESCAPABLE = tuple(raw.encode() for raw, _ in COPY_ESCAPES)


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


def copy_values(column) -> pa.Array:
    """Values as COPY text (PostgreSQL input forms, escaped); a NULL stays NULL for the
    line's join to write as \\N."""
    text = column.cast(pa.string())
    # Numbers and booleans never need escaping; most text does not either.
    if pa.types.is_string(column.type) and _holds_escapable(text):
        for raw, escaped in COPY_ESCAPES:
            text = pc.replace_substring(text, raw, escaped)
    return text


def _holds_escapable(text) -> bool:
    """Whether any value may hold a character COPY text escapes: a byte search of the
    data buffers (memchr; a regular expression over every value costs 10x, measured).
    Bytes outside an array's slice can only make it say yes needlessly."""
    for chunk in text.chunks if isinstance(text, pa.ChunkedArray) else (text,):
        data = chunk.buffers()[2]
        if data is not None and data.size:
            blob = data.to_pybytes()
            if any(byte in blob for byte in _ESCAPABLE):
                return True
    return False


def _fields(values: list, separator: str = "\t") -> pa.Array:
    """copy_values joined row by row, a NULL written as \\N."""
    return pc.binary_join_element_wise(*values, separator, null_handling="replace", null_replacement=COPY_NULL)


def copy_lines(values: list) -> pa.Array:
    """COPY lines from each column's copy_values: tab-separated, NULL as \\N, each ending
    in a newline (the newline joined to the last column, so the lines are built in one
    pass over the row's text)."""
    *first, last = values
    return _fields([*first, _fields([last, ""], "\n")])


def joined(lines: pa.Array) -> pa.Buffer:
    """The values of a string array concatenated: a slice of its data buffer, no copy."""
    if not len(lines):
        return pa.py_buffer(b"")
    width = np.int64 if pa.types.is_large_string(lines.type) else np.int32
    offsets = np.frombuffer(lines.buffers()[1], dtype=width)[lines.offset:lines.offset + len(lines) + 1]
    return lines.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def parse_images(images, columns: tuple[str, ...], types: tuple[str, ...]) -> pa.Table | None:
    """JSON images (NULL: an empty object) as a table of the target's JSON kinds, one row
    per image; None if any image does not fit (another shape than the catalog implies)."""
    schema = pa.schema([(c, _arrow_type(t)) for c, t in zip(columns, types)])
    if isinstance(images, pa.ChunkedArray):
        images = images.combine_chunks()
    if images.null_count:
        text, concatenated = joined(pc.binary_join_element_wise(images.fill_null("{}"), "", "\n")), False
    else:
        # The images as they lie in the array's buffer, one object after the other: the
        # reader finds where each ends (no copy of them with newlines between).
        text, concatenated = joined(images), True
    try:
        parsed = pj.read_json(pa.BufferReader(text),
                              parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore",
                                                            newlines_in_values=concatenated),
                              read_options=pj.ReadOptions(block_size=1 << 24))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return parsed if len(parsed) == len(images) else None  # an image of two objects, or of none


def key_pattern(column: str) -> str | None:
    """A regular expression (RE2) matching `"column":` as a JSON object key, however the
    writer spelled its characters (literally or as \\u escapes); None for a name with
    control or astral characters (left to Spark)."""
    parts = []
    for ch in column:
        if ord(ch) < 0x20 or ord(ch) > 0xFFFF:
            return None
        if ch in ('"', "\\"):
            parts.append("\\\\" + ("\\" if ch == "\\" else "") + ch)
        elif ord(ch) > 0x7E:
            parts.append(f"(?:{ch}|\\\\u(?i:{ord(ch):04x}))")
        else:
            parts.append("\\" + ch if ch in _REGEX_SPECIAL else ch)
    return '"' + "".join(parts) + '"\\s*:'


def _carries(images: pa.Array, pattern: str) -> np.ndarray:
    """Whether each JSON object text has the key `pattern` matches."""
    found = pc.match_substring_regex(images, pattern)
    return np.asarray(found.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _same(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Element-wise equality where NULL equals NULL."""
    equal = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return np.asarray(pc.or_(equal, both_null).to_numpy(zero_copy_only=False), dtype=bool)


def _bools(array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


def _table_lines(records: pa.Table, plan: TablePlan) -> tuple[pa.Table | None, np.ndarray]:
    """One table's records -> its net change as COPY lines, and the units left to Spark
    (None: all of them)."""
    columns, types = plan.columns, plan.types
    key = tuple(plan.key) or tuple(columns)
    patterns = [key_pattern(c) for c in columns]
    if None in patterns:
        return None, None
    units = records.column("unit").to_numpy()
    op = records.column("op")
    inserted = _bools(pc.equal(op, "INSERT"))
    deleted = _bools(pc.equal(op, "DELETE"))
    updated = ~inserted & ~deleted
    after_text = records.column("after").combine_chunks()
    after = parse_images(after_text, columns, types)
    if after is None:
        return None, None
    if inserted.all():
        lines = _own_net_change(units, after, plan, key)
        if lines is not None:
            return lines, np.zeros(0, dtype=units.dtype)
    key_types = tuple(types[columns.index(k)] for k in key)
    before = parse_images(records.column("before"), key, key_types)
    if before is None:
        return None, None
    # An INSERT's image is the whole row; only UPDATE images are searched for their keys.
    update_rows = np.flatnonzero(updated)
    update_text = after_text.take(pa.array(update_rows)) if len(update_rows) else None
    carried = {}
    for c, p in zip(columns, patterns):
        carried[c] = inserted.copy()
        if update_text is not None:
            carried[c][update_rows] = _carries(update_text, p)
    # The key each record touches: an UPDATE's after image holds the key, a key column it
    # leaves out keeps its value; a DELETE names it in its before image.
    touched, moved = [], np.zeros(len(records), dtype=bool)
    for k in key:
        old, new = before.column(k).combine_chunks(), after.column(k).combine_chunks()
        new = pc.if_else(pa.array(inserted | carried[k]), new, old)
        moved |= updated & ~_same(old, new)
        touched.append(pc.if_else(pa.array(deleted), old, new))
    left = np.unique(units[moved])
    keep = ~np.isin(units, left) if len(left) else np.ones(len(records), dtype=bool)

    # Sort by (unit, key, seq); a lifetime starts at a new key or just after a DELETE.
    frame = pa.table({"unit": units, **{f"k{j}": part for j, part in enumerate(touched)},
                      "seq": records.column("seq"), "row": np.arange(len(records))}).filter(pa.array(keep))
    if not len(frame):
        return LINES_SCHEMA.empty_table(), left
    order = pc.sort_indices(frame, sort_keys=[("unit", "ascending"), *[(f"k{j}", "ascending") for j in range(len(key))],
                                              ("seq", "ascending")], null_placement="at_end")
    frame = frame.take(order)
    rows = frame.column("row").to_numpy()
    n = len(rows)
    unit_sorted = frame.column("unit").to_numpy()
    new_key = np.ones(n, dtype=bool)
    if n > 1:
        same = unit_sorted[1:] == unit_sorted[:-1]
        for j in range(len(key)):
            part = frame.column(f"k{j}").combine_chunks()
            same &= _same(part.slice(1), part.slice(0, n - 1))
        new_key[1:] = ~same
    role_new, role_gone = inserted[rows], deleted[rows]
    starts_life = new_key.copy()
    starts_life[1:] |= role_gone[:-1]
    starts = np.flatnonzero(starts_life)
    ends = np.append(starts[1:], n) - 1
    first_new, last_gone = role_new[starts], role_gone[ends]
    kind = np.where(first_new, np.where(last_gone, "", "I"), np.where(last_gone, "D", "U"))
    survives = kind != ""
    if not survives.any():
        return LINES_SCHEMA.empty_table(), left

    # Each column folds to the last image of the lifetime that carried it.
    keeps_values = kind[survives] != "D"
    position = np.arange(n)
    values, present = [], []
    for c in columns:
        carried_sorted = carried[c][rows]
        last = np.maximum.reduceat(np.where(carried_sorted, position, -1), starts)[survives]
        has = (last >= 0) & keeps_values
        picked = after.column(c).take(pa.array(rows[np.where(has, last, 0)]))
        values.append(copy_values(pc.if_else(pa.array(has), picked, pa.nulls(len(has), picked.type))))
        present.append(has)
    starts, kind = starts[survives], kind[survives]
    value_text = _fields(values)
    insert_lines = pc.binary_join_element_wise(value_text, "", "\n")
    staged = kind != "I"
    if staged.any():
        okey = _fields([copy_values(frame.column(f"k{j}").take(pa.array(starts))) for j in range(len(key))])
        flags = [pc.if_else(pa.array(p), "1", "0") for p in present]
        mask = pc.binary_join_element_wise(*flags, "") if len(flags) > 1 else flags[0]
        kinds = pc.if_else(pa.array(kind == "D"), "D", "U")
        staged_lines = pc.binary_join_element_wise(kinds, mask, okey, value_text, "\t")
        staged_lines = pc.binary_join_element_wise(staged_lines, "", "\n")
        lines = pc.if_else(pa.array(staged), staged_lines, insert_lines)
    else:
        lines = insert_lines
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    step = np.where(staged, STEP["D"], STEP["I"]).astype(np.int8)
    out = pa.table({"unit": unit_sorted[starts], "table": pa.repeat(pa.scalar(plan.source), len(starts)),
                    "kind": pc.if_else(pa.array(kind == "I"), "I", pc.if_else(pa.array(kind == "D"), "D", "U")),
                    "step": step, "line": lines},
                   schema=LINES_SCHEMA)
    return out.take(pc.sort_indices(out, sort_keys=[("unit", "ascending"), ("step", "ascending")])), left


def _own_net_change(units: np.ndarray, after: pa.Table, plan: TablePlan, key: tuple[str, ...]) -> pa.Table | None:
    """INSERTs only, each key once per unit: the records are their own net change, in
    order (units ascend along the trail), one I line each. None when a key repeats."""
    keyed = after.select(list(key)).append_column("__unit", pa.array(units))
    counts = keyed.group_by(["__unit", *key], use_threads=False).aggregate([("__unit", "count")])
    if len(counts) != len(units):
        return None
    lines = copy_lines([copy_values(after.column(c)) for c in plan.columns])
    n = len(units)
    return pa.table({"unit": units, "table": pa.repeat(pa.scalar(plan.source), n), "kind": pa.repeat(pa.scalar("I"), n),
                     "step": np.full(n, STEP["I"], dtype=np.int8),
                     "line": lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines},
                    schema=LINES_SCHEMA)


def net_lines(data: pa.Table, plans: dict[str, TablePlan]) -> tuple[pa.Table, np.ndarray]:
    """data: unit, seq, table, op, before, after (the applied DML records of mapped
    tables, seq in commit order). Returns the COPY lines (LINES_SCHEMA) of every (unit,
    table) this module can net, each (unit, table, step) contiguous, and a mask of the
    records left for the Spark transform."""
    left = np.zeros(len(data), dtype=bool)
    if not len(data):
        return LINES_SCHEMA.empty_table(), left
    tables = data.column("table").combine_chunks().dictionary_encode()
    codes = tables.indices.to_numpy()
    units = data.column("unit").to_numpy()
    out = []
    for code, name in enumerate(tables.dictionary.to_pylist()):
        mask = codes == code
        rows = np.flatnonzero(mask)
        # filter, not take: a take across the chunks of the file's columns costs 4x (measured)
        lines, left_units = _table_lines(data.filter(pa.array(mask)), plans[name])
        if lines is None:
            left[rows] = True
            continue
        if len(left_units):
            left[rows[np.isin(units[rows], left_units)]] = True
        out.append(lines)
    return (pa.concat_tables(out) if out else LINES_SCHEMA.empty_table()), left
