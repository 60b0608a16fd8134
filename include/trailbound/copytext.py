"""COPY text from JSON row images, with Arrow: PostgreSQL's text format, vectorised.

An image (the redo archive contract) is a JSON object whose values are booleans,
integers, floats for float columns, or strings holding PostgreSQL's text input form.
Parsed with Arrow's JSON reader into each column's JSON kind, cast to text and escaped,
a row becomes a COPY line: tab-separated, \\N for NULL, ending in a newline.

Replicat formats the lines it applies with these functions (replicat/net/arrow.py), and
capture writes each INSERT's line into the trail with them (`insert_lines`), so that the
two are the same bytes by construction. A line is written for a table's columns in the
source's order (defs.json) and their JSON kinds: its *layout*, recorded in the trail
file; a reader uses the lines only where its own layout is the same.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

# COPY text format: backslash, newline, carriage return and tab are escaped; \N is NULL.
COPY_ESCAPES = (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
COPY_NULL = "\\N"

# PostgreSQL's names for the types (format_type's) and the aliases it accepts for them.
_INTEGER = {"smallint", "integer", "bigint", "int2", "int4", "int8", "int"}
_FLOAT = {"real", "double precision", "float4", "float8"}
_ESCAPABLE = tuple(raw.encode() for raw, _ in COPY_ESCAPES)
KINDS = {"integer": pa.int64(), "float": pa.float64(), "boolean": pa.bool_(), "text": pa.string()}

# A table's layout: its columns in COPY order, each with the JSON kind of its values.
Layout = tuple[tuple[str, str], ...]


def kind_of(type_name: str) -> str:
    """The JSON kind an image holds for a column of this PostgreSQL type (the redo archive
    contract: booleans, integers, floats for float columns, else text input forms)."""
    if type_name in _INTEGER:
        return "integer"
    if type_name in _FLOAT:
        return "float"
    if type_name in ("boolean", "bool"):
        return "boolean"
    return "text"


def json_kind(type_name: str) -> pa.DataType:
    """The Arrow type an image's value parses into for a column of this type."""
    return KINDS[kind_of(type_name)]


def layout(columns, types) -> Layout:
    return tuple((column, kind_of(type_name)) for column, type_name in zip(columns, types))


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


def fields(values: list, separator: str = "\t") -> pa.Array:
    """copy_values joined row by row, a NULL written as \\N."""
    return pc.binary_join_element_wise(*values, separator, null_handling="replace", null_replacement=COPY_NULL)


def copy_lines(values: list) -> pa.Array:
    """COPY lines from each column's copy_values: tab-separated, NULL as \\N, each ending
    in a newline (the newline joined to the last column, so the lines are built in one
    pass over the row's text)."""
    *first, last = values
    return fields([*first, fields([last, ""], "\n")])


def joined(lines: pa.Array) -> pa.Buffer:
    """The values of a string array concatenated: a slice of its data buffer, no copy."""
    if not len(lines):
        return pa.py_buffer(b"")
    width = np.int64 if pa.types.is_large_string(lines.type) else np.int32
    offsets = np.frombuffer(lines.buffers()[1], dtype=width)[lines.offset:lines.offset + len(lines) + 1]
    return lines.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def parse_images(images, columns: tuple[str, ...], types: tuple[str, ...]) -> pa.Table | None:
    """JSON images (NULL: an empty object) as a table of the columns' JSON kinds, one row
    per image; None if any image does not fit (another shape than the types imply)."""
    return _parse(images, pa.schema([(c, json_kind(t)) for c, t in zip(columns, types)]))


def _parse(images, schema: pa.Schema) -> pa.Table | None:
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


def insert_lines(records: pa.Table, layouts: dict[str, Layout]) -> tuple[pa.Array, dict[str, Layout]]:
    """The COPY line of each INSERT record (columns `op`, `table`, `after`) of a table in
    `layouts`, NULL for every other record; and the layouts of the tables given lines. A
    table any of whose inserted images does not parse into its layout gets none (its
    reader parses the images itself, and meets the same error).

    The cost is per batch of tables, not per table (a batch of hundreds of tables costs
    what a few do): the images of tables whose layouts agree on every shared column's
    kind are parsed in one read of the union of their columns, each column cast to COPY
    text once, and the lines of the tables of one layout joined in one pass. A batch
    whose images do not all parse is parsed again table by table, as each table alone
    would be."""
    n = len(records)
    lines = pa.nulls(n, pa.string())
    if not n or not layouts:
        return lines, {}
    inserted = np.asarray(pc.equal(records.column("op"), "INSERT").to_numpy(zero_copy_only=False), dtype=bool)
    if not inserted.any():
        return lines, {}
    rows = np.flatnonzero(inserted)
    tables = records.column("table").take(pa.array(rows)).combine_chunks().dictionary_encode()
    codes = tables.indices.to_numpy(zero_copy_only=False)
    images = records.column("after").take(pa.array(rows)).combine_chunks()
    order = np.argsort(codes, kind="stable")  # each table's inserts together, in record order
    bounds = np.searchsorted(codes[order], np.arange(len(tables.dictionary) + 1))
    mine = {name: order[bounds[code]:bounds[code + 1]] for code, name in enumerate(tables.dictionary.to_pylist())
            if name in layouts}
    pieces, used = [], {}
    for batch in _compatible_batches({name: layouts[name] for name in mine}):
        made = _batch_lines(images, {name: mine[name] for name in batch}, layouts)
        if made is None:  # an image that does not fit: each table alone decides
            made = [piece for name in batch for piece in _batch_lines(images, {name: mine[name]}, layouts) or []]
        for where, piece, names in made:
            pieces.append((rows[where], piece))
            used.update((name, layouts[name]) for name in names)
    if not pieces:
        return lines, {}
    # Scatter: each line to its record's place, NULL elsewhere.
    at = np.concatenate([where for where, _ in pieces])
    values = pa.concat_arrays([chunk for _, piece in pieces
                               for chunk in (piece.chunks if isinstance(piece, pa.ChunkedArray) else [piece])])
    order = np.full(n, len(values), dtype=np.int64)
    order[at] = np.arange(len(at))
    return pa.concat_arrays([values, pa.nulls(1, pa.string())]).take(pa.array(order)), used


def _compatible_batches(layouts: dict[str, Layout]) -> list[list[str]]:
    """The tables in batches whose layouts give each column name one kind (first fit)."""
    batches: list[tuple[list[str], dict[str, str]]] = []
    for name, columns in layouts.items():
        for names, kinds in batches:
            if all(kinds.get(column, kind) == kind for column, kind in columns):
                names.append(name)
                kinds.update(columns)
                break
        else:
            batches.append(([name], dict(columns)))
    return [names for names, _ in batches]


def _batch_lines(images: pa.Array, rows: dict[str, np.ndarray],
                 layouts: dict[str, Layout]) -> list[tuple[np.ndarray, pa.Array, list[str]]] | None:
    """(positions in `images`, their lines, the tables) per layout of the tables in
    `rows` (name: positions of its images), parsed in one read; None if an image does
    not parse into the union of their layouts."""
    union: dict[str, str] = {}
    for name in rows:
        union.update(layouts[name])
    everything = np.concatenate(list(rows.values()))
    parsed = _parse(images.take(pa.array(everything)), pa.schema([(c, KINDS[k]) for c, k in union.items()]))
    if parsed is None:
        return None
    text = {}  # each column's COPY text, made once for the batch
    by_layout: dict[Layout, list[str]] = {}
    for name in rows:
        by_layout.setdefault(layouts[name], []).append(name)
    starts = np.cumsum([0] + [len(part) for part in rows.values()])
    local = {name: np.arange(starts[i], starts[i + 1]) for i, name in enumerate(rows)}
    made = []
    for layout_, names in by_layout.items():
        at = np.concatenate([local[name] for name in names])
        whole = len(by_layout) == 1
        values = []
        for column, _ in layout_:
            if column not in text:
                text[column] = copy_values(parsed.column(column))
            values.append(text[column] if whole else text[column].take(pa.array(at)))
        made.append((everything[at], copy_lines(values), names))
    return made


def layouts_of(defs: dict) -> dict[str, Layout]:
    """The layout of each table of defs.json (archive.segments.TableDef by name)."""
    return {name: layout([c.name for c in table.columns], [c.type for c in table.columns])
            for name, table in defs.items()}
