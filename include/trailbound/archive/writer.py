"""Write redo archive segments and table definitions exactly as the contract describes.

The writer is deliberately permissive: it writes whatever it is given, including
records that break the contract (a custom rba, a wrong manifest), because tests need
broken archives to prove that readers refuse them. Validation is the reader's job.

Every file is written to a hidden temporary name, fsynced and renamed into place, and a
segment's manifest is written only after its data file is complete: a reader that sees
the manifest can trust the data file next to it.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow.lib import StringBuilder

from trailbound.archive.contract import (
    DEFS_FILE,
    FORMATS,
    MANIFEST_FIELDS,
    RECORD_FIELDS,
    data_name,
    manifest_name,
)
from trailbound.crash import crashpoint
from trailbound.durable import atomic_write
from trailbound.positions import Scn

PARQUET_SCHEMA = pa.schema([
    ("rba", pa.int64()),
    ("scn", pa.int64()),
    ("ts", pa.timestamp("us", tz="UTC")),
    ("xid", pa.string()),
    ("parent_xid", pa.string()),
    ("op", pa.string()),
    ("table", pa.string()),
    ("before", pa.string()),
    ("after", pa.string()),
])
assert tuple(PARQUET_SCHEMA.names) == RECORD_FIELDS
DICTIONARY_COLUMNS = ["parent_xid", "op", "table"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Pass as a value in manifest_overrides to leave that field out of the manifest.
DROP = object()



def _compact_json_encoder():
    """One encoder for every JSON text the archive holds: UTF-8 as is, no whitespace.

    json.dumps with these arguments builds a new encoder on every call, and even a reused
    JSONEncoder.encode spends more time in its Python wrapper than in encoding a small
    object; the simulator encodes millions of them, so use the C encoder directly when
    this Python has it. Both produce the same text."""
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
    make = json.encoder.c_make_encoder
    if make is None:
        return encoder.encode
    iterencode = make(None, encoder.default, json.encoder.encode_basestring, None, ":", ",",
                      False, False, True)

    def encode(value: Any) -> str:
        return "".join(iterencode(value, 0))

    return encode


encode_json = _compact_json_encoder()


def to_micros(moment: datetime) -> int:
    """An aware datetime as microseconds since the Unix epoch."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def from_micros(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def format_time(moment: datetime) -> str:
    """ISO-8601 UTC with microseconds and a Z, e.g. 2026-11-01T00:00:00.123456Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _MicrosFormatter:
    """format_time for microsecond integers, fast for the mostly ascending times of a
    segment: the text up to the second is reused while the second does not change."""

    def __init__(self) -> None:
        self._second = None
        self._prefix = ""

    def __call__(self, micros: int) -> str:
        second, fraction = divmod(micros, 1_000_000)
        if second != self._second:
            self._second = second
            self._prefix = from_micros(second * 1_000_000).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._prefix}.{fraction:06d}Z"


def write_defs(archive_dir: str | os.PathLike, tables: Iterable[Mapping[str, Any]]) -> Path:
    """Write defs.json: `tables` are {"name", "columns": [{"name", "type", "nullable"}],
    "key": [...]} objects, written in the order given."""
    archive = Path(archive_dir)
    archive.mkdir(parents=True, exist_ok=True)
    document = {"tables": [dict(table) for table in tables]}
    path = archive / DEFS_FILE
    atomic_write(path, (json.dumps(document, ensure_ascii=False, indent=2) + "\n").encode("utf-8"))
    return path


def _json_text(value: Any) -> str | None:
    """before/after as stored: None stays None, a str is taken as already serialised."""
    if value is None or isinstance(value, str):
        return value
    return encode_json(value)


def write_segment(
    archive_dir: str | os.PathLike,
    *,
    thread: int,
    sequence: int,
    records: Sequence[Mapping[str, Any]],
    first_scn: Scn,
    next_scn: Scn,
    first_time: datetime,
    next_time: datetime,
    fmt: str,
    closed: bool = False,
    manifest_overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Write one segment from record dicts (scn, ts as an aware datetime, xid, parent_xid,
    op, table, before, after; before/after as dict, JSON text or None). The rba is the
    record's position unless the record carries its own `rba`. Returns the manifest path."""
    columns: dict[str, list] = {name: [] for name in RECORD_FIELDS}
    for position, record in enumerate(records):
        columns["rba"].append(record.get("rba", position))
        columns["scn"].append(record["scn"])
        columns["ts"].append(to_micros(record["ts"]))
        columns["xid"].append(record["xid"])
        columns["parent_xid"].append(record.get("parent_xid"))
        columns["op"].append(record["op"])
        columns["table"].append(record.get("table"))
        columns["before"].append(_json_text(record.get("before")))
        columns["after"].append(_json_text(record.get("after")))
    return write_segment_columns(
        archive_dir, thread=thread, sequence=sequence, columns=columns,
        first_scn=first_scn, next_scn=next_scn, first_time=first_time, next_time=next_time,
        fmt=fmt, closed=closed, manifest_overrides=manifest_overrides,
    )


def write_segment_columns(
    archive_dir: str | os.PathLike,
    *,
    thread: int,
    sequence: int,
    columns: Mapping[str, Sequence],
    first_scn: Scn,
    next_scn: Scn,
    first_time: datetime,
    next_time: datetime,
    fmt: str,
    closed: bool = False,
    manifest_overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Write one segment from columns, the fast path for bulk writers.

    `columns` maps each record field to a list: "ts" holds integer microseconds since the
    Unix epoch (UTC), "before"/"after" JSON text or None, "rba" may be left out (0..n-1).
    Returns the manifest path."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown segment format {fmt!r}")
    archive = Path(archive_dir)
    archive.mkdir(parents=True, exist_ok=True)
    count = len(columns["scn"])
    rba = columns.get("rba")
    if rba is None:
        rba = range(count)

    if fmt == "parquet":
        data = _parquet_bytes(columns, rba)
    else:
        data = _jsonl_bytes(columns, rba)
    atomic_write(archive / data_name(thread, sequence, fmt), data)
    crashpoint("after_segment_before_manifest")  # a writer killed here leaves an invisible data file

    manifest = {
        "thread": thread,
        "sequence": sequence,
        "first_scn": first_scn.value,
        "next_scn": next_scn.value,
        "first_time": format_time(first_time),
        "next_time": format_time(next_time),
        "records": count,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "format": fmt,
    }
    assert tuple(manifest) == MANIFEST_FIELDS
    if closed:
        manifest["closed"] = True
    for field, value in (manifest_overrides or {}).items():
        if value is DROP:
            manifest.pop(field, None)
        else:
            manifest[field] = value
    path = archive / manifest_name(thread, sequence)
    atomic_write(path, (encode_json(manifest) + "\n").encode("utf-8"))
    return path


def _parquet_bytes(columns: Mapping[str, Sequence], rba: Sequence[int]) -> pa.Buffer:
    arrays = [
        _int64_array(rba, pa.int64()),
        _int64_array(columns["scn"], pa.int64()),
        _int64_array(columns["ts"], PARQUET_SCHEMA.field("ts").type),
    ] + [_string_array(columns[name]) for name in RECORD_FIELDS[3:]]
    table = pa.Table.from_arrays(arrays, schema=PARQUET_SCHEMA)
    sink = pa.BufferOutputStream()
    # zstd, and dictionaries only where values repeat: smaller and faster than the defaults
    pq.write_table(table, sink, compression="zstd", use_dictionary=DICTIONARY_COLUMNS)
    return sink.getvalue()


# Arrow arrays made without pa.array: on a Python list pa.array first asks whether it is a
# pandas object, which imports pandas (0.6 CPU-s, a tenth of a 200,000-change pull). The
# arrays, and so the Parquet bytes, are the same.
def _int64_array(values: Sequence[int], kind: pa.DataType) -> pa.Array:
    data = array.array("q", values)  # int64 in the machine's order, Arrow's too
    return pa.Array.from_buffers(kind, len(data), [None, pa.py_buffer(data)])


def _string_array(values: Sequence[str | None]) -> pa.Array:
    buffers = _arrow_c.string_buffers(values if isinstance(values, list) else list(values)) if _arrow_c else None
    if buffers is None:
        builder = StringBuilder()
        builder.append_values(values)
        return builder.finish()
    validity, offsets, data, nulls = buffers
    return pa.Array.from_buffers(pa.string(), len(values), [validity and pa.py_buffer(validity),
                                                           pa.py_buffer(offsets), pa.py_buffer(data)], nulls)


# The column's buffers written in C when it was built (make; setup.py): a third of a
# segment's writing was StringBuilder's appends.
try:
    from trailbound.archive import _arrow_c
except ImportError:
    _arrow_c = None


def _jsonl_bytes(columns: Mapping[str, Sequence], rba: Sequence[int]) -> bytes:
    format_micros = _MicrosFormatter()
    lines = []
    for position, (scn, ts, xid, parent, op, table, before, after) in enumerate(zip(
        columns["scn"], columns["ts"], columns["xid"], columns["parent_xid"], columns["op"],
        columns["table"], columns["before"], columns["after"],
    )):
        lines.append(encode_json({
            "rba": rba[position], "scn": scn, "ts": format_micros(ts), "xid": xid,
            "parent_xid": parent, "op": op, "table": table, "before": before, "after": after,
        }))
    lines.append("")  # every line, the last one included, ends with a newline
    return "\n".join(lines).encode("utf-8") if len(lines) > 1 else b""
