"""Net change with Arrow: the (unit, table)s whose keys never change, vectorised.

The net change of the contract (net/__init__.py: read its docstring for lifetimes, kinds
and the COPY lines), for the common case where no UPDATE moves a row to another key.
Then every record touches exactly one key and a row's lifetimes on a key are cut only
by DELETEs, so the whole transform is: parse the images with Arrow's JSON reader (typed
by the target's catalog), sort by (unit, key, seq), cut lifetimes, fold each column to
the last image that carried it, format COPY lines. No Python loop over records, no JVM;
it runs wherever the records are (the driver, or a Spark task through `mapInArrow`).

What it leaves to the backend net.backend_for picks (python.py or, for many records,
spark.py: records of those (unit, table)s, in a mask): key-changing UPDATEs (chains of
moved rows), images that do not parse into the target's JSON kinds, column names whose
JSON spelling is not certain (non-ASCII, quotes).

Which columns an UPDATE's after image carries is read from the image text: the pattern
`"name"\\s*:` can only match a key of the image's object (inside a JSON string every quote
is escaped, and a nested object does not parse into the flat schema, so that table is
left to the other backends). Lines are byte for byte what `spark.copy_lines` writes,
except for the spelling of floats (Arrow writes 1e-300 where Java writes 1.0E-300):
PostgreSQL reads both as the same double.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound.copytext import copy_lines, copy_values, fields as _fields, layout, parse_images
from trailbound.replicat.net import LINES_SCHEMA, STEP
from trailbound.replicat.target import TablePlan
from trailbound.trail import format as trails

RECORDS_SCHEMA = pa.schema([("unit", pa.int64()), ("seq", pa.int64()), ("table", pa.string()), ("op", pa.string()),
                            ("before", pa.string()), ("after", pa.string())])
_REGEX_SPECIAL = set(r".^$*+?()[]{}|\-/")


def trusted_lines(part: pa.Table, plans: dict[str, TablePlan | None]) -> pa.Table:
    """Trail records (a part of one file) with the copy lines of the tables whose layout
    in the file is the plan's (the same columns in the same order, of the same JSON
    kinds: then the line is what this module would format from the image); every other
    line NULL, so those records take the image's way. No layouts in the result's schema,
    so parts of different files concatenate."""
    layouts = trails.copy_line_layouts(part)
    trusted = [name for name, lines_layout in layouts.items()
               if plans.get(name) is not None and lines_layout == layout(plans[name].columns, plans[name].types)]
    lines = part.column("copy_line")
    if lines.null_count < len(part):  # every line of another table goes, with a layout or none
        lines = pc.if_else(pc.is_in(part.column("table"), pa.array(trusted, pa.string())), lines,
                           pa.nulls(len(part), pa.string()))
    return part.set_column(part.schema.get_field_index("copy_line"), "copy_line", lines)


class ImagesNeeded(Exception):
    """net_lines met records it can net only from their images, and was given none."""


def needs_images(part: pa.Table, plans: dict[str, TablePlan | None]) -> bool:
    """Whether replicat will need the after images of these records (as trusted_lines
    left them): unless every one is an INSERT carrying its COPY line into a keyed table
    (a keyless table's inserts are compared whole, image by image: compute.py)."""
    if part.column("copy_line").null_count or not pc.all(pc.equal(part.column("op"), "INSERT")).as_py():
        return True
    return any(plans.get(name) is None or plans[name].keyless for name in pc.unique(part.column("table")).to_pylist())


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


def _signature(plan: TablePlan) -> tuple:
    """What the net change reads of a plan: tables that agree on it are netted in one pass."""
    return plan.columns, plan.types, plan.key, plan.keyless


@dataclass(frozen=True)
class _Batch:
    """The records of tables of one signature (`_signature`), in trail order: which of
    them each record belongs to (`which`: an index into `sources`), and the unit they
    are netted in. A (unit, table) is a *group* here: unit * len(sources) + which."""

    records: pa.Table
    rows: np.ndarray         # where the records are in the chunk's data
    units: np.ndarray
    which: np.ndarray
    plan: TablePlan          # any of the tables' plans: they agree on the signature
    sources: tuple[str, ...]

    @property
    def groups(self) -> np.ndarray:
        return self.units * len(self.sources) + self.which

    def tables_of(self, which: np.ndarray) -> pa.Array:
        if len(self.sources) == 1:
            return pa.repeat(pa.scalar(self.sources[0]), len(which))
        return pa.array(self.sources, pa.string()).take(pa.array(which))


def _tables_lines(batch: _Batch) -> tuple[pa.Table | None, np.ndarray | None]:
    """A batch's records -> their net change as COPY lines, and a mask of the records
    left to the other backends (None: all of them)."""
    plan, records, units = batch.plan, batch.records, batch.units
    columns, types = plan.columns, plan.types
    key = tuple(plan.key) or tuple(columns)
    patterns = [key_pattern(c) for c in columns]
    if None in patterns:
        return None, None
    groups = batch.groups
    op = records.column("op")
    inserted = _bools(pc.equal(op, "INSERT"))
    deleted = _bools(pc.equal(op, "DELETE"))
    updated = ~inserted & ~deleted
    after_text = records.column("after").combine_chunks()
    after = parse_images(after_text, columns, types)
    if after is None:
        return None, None
    if inserted.all():
        lines = _own_net_change(batch, after, key)
        if lines is not None:
            return lines, np.zeros(len(records), dtype=bool)
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
    left = np.isin(groups, np.unique(groups[moved])) if moved.any() else np.zeros(len(records), dtype=bool)

    # Sort by (unit, table, key, seq); a lifetime starts at a new key or just after a DELETE.
    frame = pa.table({"group": groups, **{f"k{j}": part for j, part in enumerate(touched)},
                      "seq": records.column("seq"), "row": np.arange(len(records))}).filter(pa.array(~left))
    if not len(frame):
        return LINES_SCHEMA.empty_table(), left
    order = pc.sort_indices(frame, sort_keys=[("group", "ascending"), *[(f"k{j}", "ascending") for j in range(len(key))],
                                              ("seq", "ascending")], null_placement="at_end")
    frame = frame.take(order)
    rows = frame.column("row").to_numpy()
    n = len(rows)
    group_sorted = frame.column("group").to_numpy()
    new_key = np.ones(n, dtype=bool)
    if n > 1:
        same = group_sorted[1:] == group_sorted[:-1]
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
    which = batch.which[rows[starts]]
    out = pa.table({"unit": units[rows[starts]], "table": batch.tables_of(which),
                    "kind": pc.if_else(pa.array(kind == "I"), "I", pc.if_else(pa.array(kind == "D"), "D", "U")),
                    "step": step, "line": lines},
                   schema=LINES_SCHEMA)
    # Each (unit, table, step) contiguous: the group (unit, then table) first.
    out = out.append_column("group", pa.array(group_sorted[starts]))
    return out.take(pc.sort_indices(out, sort_keys=[("group", "ascending"), ("step", "ascending")])) \
        .drop_columns(["group"]), left


def _own_net_change(batch: _Batch, after: pa.Table, key: tuple[str, ...]) -> pa.Table | None:
    """INSERTs only, each key once per (unit, table): the records are their own net
    change, one I line each. None when a key repeats."""
    if not _keys_unique(batch.groups, [after.column(k) for k in key]):
        return None
    return _insert_lines(batch, copy_lines([copy_values(after.column(c)) for c in batch.plan.columns]))


def _lines_net_change(batch: _Batch) -> pa.Table | None:
    """_own_net_change for inserts whose COPY lines the trail carries (capture wrote them
    in the plan's layout: trusted_lines keeps no other). The key's values are the line's
    fields at the key's columns, as COPY text: equal text, equal value. None when a key
    repeats."""
    plan = batch.plan
    lines = batch.records.column("copy_line").combine_chunks()
    if plan.keyless:
        keys = [lines]
    elif tuple(plan.key) == plan.columns[:1] and len(plan.columns) > 1:
        keys = [_first_fields(lines)]
    else:
        at = [plan.columns.index(k) for k in plan.key]
        split = pc.split_pattern(lines, "\t", max_splits=max(at) + 1)
        keys = [pc.list_element(split, i) for i in at]
    if not _keys_unique(batch.groups, keys):
        return None
    return _insert_lines(batch, lines)


def _first_fields(lines: pa.Array) -> pa.Array:
    """Each line's first field (up to its first tab, which every line of two or more
    columns has): its bytes gathered with numpy, a tenth of a split's cost."""
    ends = pc.find_substring(lines, "\t").to_numpy()
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
    new_offsets = np.zeros(len(lines) + 1, dtype=np.int32)
    np.cumsum(ends, out=new_offsets[1:])
    picked = np.arange(new_offsets[-1]) + np.repeat(offsets[:-1] - new_offsets[:-1], ends)
    data = np.frombuffer(lines.buffers()[2], dtype=np.uint8)[picked]
    return pa.Array.from_buffers(pa.string(), len(lines), [None, pa.py_buffer(new_offsets), pa.py_buffer(data)])


def _keys_unique(groups: np.ndarray, keys: list) -> bool:
    """Whether no key (the values of `keys` at one position) repeats in a group (a unit
    of one table). A single column of keys that repeat nowhere (new rows, the usual
    case) needs no grouping. Text keys are checked as one text per record, the group and
    the fields joined at tabs, with a hash of those texts: Table.group_by would import
    Arrow's query engine, and with it pandas (0.17 s on the first chunk's path), for the
    same answer. A COPY line's fields never hold a tab (it is escaped); an image's text
    key that does may look like another key, which only sends its table the slower way
    (None above)."""
    if len(keys) == 1 and len(pc.unique(keys[0])) == len(groups):
        return True
    keys = [key.combine_chunks() if isinstance(key, pa.ChunkedArray) else key for key in keys]
    if all(pa.types.is_string(key.type) for key in keys):
        joined = pc.binary_join_element_wise(pa.array(groups).cast(pa.string()), *keys, "\t")
        return pc.count(joined).as_py() == len(groups) and len(pc.unique(joined)) == len(groups)
    keyed = pa.table({**{f"k{j}": part for j, part in enumerate(keys)}, "__group": groups})
    counts = keyed.group_by(["__group", *keyed.schema.names[:-1]], use_threads=False).aggregate([("__group", "count")])
    return len(counts) == len(groups)


def _insert_lines(batch: _Batch, lines) -> pa.Table:
    """One I line per record, each (unit, table)'s in the records' order."""
    n = len(batch.units)
    lines = lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines
    out = pa.table({"unit": batch.units, "table": batch.tables_of(batch.which), "kind": pa.repeat(pa.scalar("I"), n),
                    "step": np.full(n, STEP["I"], dtype=np.int8), "line": lines}, schema=LINES_SCHEMA)
    if len(batch.sources) == 1:
        return out  # units ascend along the trail
    return out.take(pa.array(np.argsort(batch.groups, kind="stable")))


def net_lines(data: pa.Table, plans: dict[str, TablePlan]) -> tuple[pa.Table, np.ndarray]:
    """data: unit, seq, table, op, before, after (the applied DML records of mapped
    tables, seq in commit order). Returns the COPY lines (LINES_SCHEMA) of every (unit,
    table) this module can net, each (unit, table, step) contiguous, and a mask of the
    records left for the Spark transform.

    The cost is per batch of tables, not per table: the tables whose plans agree on
    columns, types and key (`_signature`; hundreds of tables often come in a few such
    layouts) are netted in one pass, their images parsed in one JSON read, each kernel
    run once over all of them, the (unit, table) taking the place of the unit. A batch
    that one pass cannot take (an image that does not parse, a key repeated in a table's
    lined inserts) is netted again table by table, as each table alone would be."""
    left = np.zeros(len(data), dtype=bool)
    if not len(data):
        return LINES_SCHEMA.empty_table(), left
    tables = data.column("table").combine_chunks().dictionary_encode()
    codes = tables.indices.to_numpy()
    names = tables.dictionary.to_pylist()
    units = data.column("unit").to_numpy()
    # Inserts whose COPY line the trail carries (trusted_lines kept only the plans' layouts).
    lined = _bools(pc.and_(pc.is_valid(data.column("copy_line")), pc.equal(data.column("op"), "INSERT"))) \
        if "copy_line" in data.schema.names else np.zeros(len(data), dtype=bool)
    all_lined = np.bincount(codes, weights=~lined, minlength=len(names)) == 0

    def batch_of(batch_codes: list[int]) -> _Batch:
        mask = np.isin(codes, batch_codes)
        rows = np.flatnonzero(mask)
        which = np.zeros(len(names), dtype=np.int64)
        which[batch_codes] = np.arange(len(batch_codes))
        # filter, not take: a take across the chunks of the file's columns costs 4x (measured)
        return _Batch(data.filter(pa.array(mask)), rows, units[rows], which[codes[rows]], plans[names[batch_codes[0]]],
                      tuple(names[code] for code in batch_codes))

    out, imaged = [], [code for code in range(len(names)) if not all_lined[code]]
    lined_tables = [code for code in range(len(names)) if all_lined[code]]
    for batch_codes, lines in _per_batch(_batches(lined_tables, names, plans),
                                         lambda batch_codes: _lines_net_change(batch_of(batch_codes))):
        if lines is None:
            imaged += batch_codes  # a key repeats in a unit: its images say how
        else:
            out.append(lines)
    if imaged and "after" not in data.schema.names:
        raise ImagesNeeded(names[imaged[0]])

    def net(batch_codes: list[int]):
        batch = batch_of(batch_codes)
        lines, left_rows = _tables_lines(batch)
        return None if lines is None else (batch, lines, left_rows)
    for batch_codes, made in _per_batch(_batches(imaged, names, plans), net):
        if made is None:
            left[np.isin(codes, batch_codes)] = True
            continue
        batch, lines, left_rows = made
        left[batch.rows[left_rows]] = True
        out.append(lines)
    return (pa.concat_tables(out) if out else LINES_SCHEMA.empty_table()), left


def _per_batch(batches: list[list[int]], net):
    """(codes, net(codes)) for each batch; a batch `net` cannot take (None) again table by
    table, as each table alone would be."""
    for batch_codes in batches:
        made = net(batch_codes)
        if made is None and len(batch_codes) > 1:
            for code in batch_codes:
                yield [code], net([code])
        else:
            yield batch_codes, made


def _batches(codes: list[int], names: list[str], plans: dict[str, TablePlan]) -> list[list[int]]:
    """The tables (by code) in batches of one `_signature`."""
    batches: dict[tuple, list[int]] = {}
    for code in codes:
        batches.setdefault(_signature(plans[names[code]]), []).append(code)
    return list(batches.values())
