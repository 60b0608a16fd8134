"""Segments and manifests: the file-level half of the archive contract (no Spark here).

A segment exists once its manifest does. This module parses manifests, checks a data
file against its manifest (size, sha256, record count, column types) and checks that a
thread's segments follow each other (no sequence gap, first_scn = previous next_scn,
nothing after a closed segment). The record-level checks need every record and live in
the Spark reader.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from trailbound.archive import contract
from trailbound.durable import file_sha256
from trailbound.errors import ArchiveError


@dataclass(frozen=True)
class Segment:
    """One archived log segment, as its manifest describes it."""

    thread: int
    sequence: int
    first_scn: int
    next_scn: int
    first_time: datetime
    next_time: datetime
    records: int
    bytes: int
    sha256: str
    format: str
    path: Path  # the data file
    closed: bool = False

    @property
    def manifest_path(self) -> Path:
        return self.path.with_name(contract.manifest_name(self.thread, self.sequence))

    @property
    def name(self) -> str:
        return self.path.name


def _utc(value: object, key: str, where: Path) -> datetime:
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise ArchiveError(where, f"{key} {value!r} is not an ISO-8601 time") from None
    if parsed.tzinfo is None:
        raise ArchiveError(where, f"{key} {value!r} has no time zone (the contract says UTC)")
    return parsed.astimezone(timezone.utc)


def _int(document: dict, key: str, where: Path, minimum: int = 0) -> int:
    value = document.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArchiveError(where, f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def read_manifest(manifest: Path) -> Segment:
    """Parse and check one manifest. The data file is not read here."""
    match = contract.SEGMENT_RE.match(manifest.name)
    if not match or match["ext"] != "json":
        raise ArchiveError(manifest, "not a manifest name (arch_<thread>_<9-digit sequence>.json)")
    try:
        document = json.loads(manifest.read_bytes())
    except (OSError, ValueError) as exc:
        raise ArchiveError(manifest, f"unreadable manifest: {exc}") from None
    if not isinstance(document, dict):
        raise ArchiveError(manifest, "a manifest must be a JSON object")
    missing = [key for key in contract.MANIFEST_FIELDS if key not in document]
    if missing:
        raise ArchiveError(manifest, f"manifest lacks {', '.join(missing)}")
    thread = _int(document, "thread", manifest, 1)
    sequence = _int(document, "sequence", manifest, 1)
    if (thread, sequence) != (int(match["thread"]), int(match["sequence"])):
        raise ArchiveError(manifest, f"manifest says thread {thread} sequence {sequence}, its name says otherwise")
    fmt = document["format"]
    if fmt not in contract.FORMATS:
        raise ArchiveError(manifest, f"format must be one of {', '.join(contract.FORMATS)}, got {fmt!r}")
    sha256 = document["sha256"]
    if not isinstance(sha256, str) or len(sha256) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha256):
        raise ArchiveError(manifest, f"sha256 must be 64 hex digits, got {sha256!r}")
    closed = document.get("closed", False)
    if not isinstance(closed, bool):
        raise ArchiveError(manifest, f"closed must be true or false, got {closed!r}")
    segment = Segment(
        thread=thread,
        sequence=sequence,
        first_scn=_int(document, "first_scn", manifest),
        next_scn=_int(document, "next_scn", manifest),
        first_time=_utc(document["first_time"], "first_time", manifest),
        next_time=_utc(document["next_time"], "next_time", manifest),
        records=_int(document, "records", manifest),
        bytes=_int(document, "bytes", manifest),
        sha256=sha256.lower(),
        format=fmt,
        path=manifest.with_name(contract.data_name(thread, sequence, fmt)),
        closed=closed,
    )
    if segment.next_scn < segment.first_scn:
        raise ArchiveError(manifest, f"next_scn {segment.next_scn} is below first_scn {segment.first_scn}")
    if segment.next_time < segment.first_time:
        raise ArchiveError(manifest, "next_time is before first_time")
    return segment


def discover(archive_dir: Path) -> list[Segment]:
    """Every segment whose manifest exists, ordered by (thread, sequence)."""
    if not archive_dir.is_dir():
        raise ArchiveError(archive_dir, "the archive directory does not exist")
    manifests = [p for p in archive_dir.iterdir() if p.suffix == ".json" and contract.SEGMENT_RE.match(p.name)]
    segments = [read_manifest(p) for p in manifests]
    return sorted(segments, key=lambda s: (s.thread, s.sequence))


# Column types a data file may use: the contract's, plus the integer and timestamp
# variants other Parquet writers produce for the same values.
def _compatible(field: pa.Field) -> bool:
    kind = field.type
    if field.name in ("rba", "scn"):
        return pa.types.is_integer(kind)
    if field.name == "ts":
        return pa.types.is_timestamp(kind)
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)


def _check_parquet_columns(segment: Segment) -> int:
    try:
        parquet = pq.ParquetFile(segment.path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ArchiveError(segment.path, f"not a readable Parquet file: {' '.join(str(exc).split())}") from None
    schema = parquet.schema_arrow
    missing = [name for name in contract.RECORD_FIELDS if name not in schema.names and name != "parent_xid"]
    if missing:
        raise ArchiveError(segment.path, f"missing column(s) {', '.join(missing)}")
    for field in schema:
        if field.name in contract.RECORD_FIELDS and not _compatible(field):
            raise ArchiveError(segment.path, f"column {field.name} has type {field.type}, not what the contract says")
    return parquet.metadata.num_rows


def verify_data(segment: Segment) -> None:
    """Check the data file against its manifest: present, size, sha256, record count."""
    path = segment.path
    if not path.exists():
        raise ArchiveError(path, f"data file of {segment.manifest_path.name} is missing")
    size = path.stat().st_size
    if size != segment.bytes:
        raise ArchiveError(path, f"size is {size} bytes, the manifest says {segment.bytes}")
    newlines, last = 0, b"\n"
    # JSON Lines must be UTF-8; Spark's reader would replace bad bytes with U+FFFD and
    # carry on, so the bytes are checked in the same pass as the digest, where the error
    # can name the line.
    text = codecs.getincrementaldecoder("utf-8")() if segment.format == "jsonl" else None
    bad_text: int | None = None

    def each_chunk(chunk: bytes) -> None:  # the same pass counts the records of a JSON-lines segment
        nonlocal newlines, last, bad_text
        if text is not None and bad_text is None:
            try:
                text.decode(chunk)
            except UnicodeDecodeError as exc:
                bad_text = newlines + chunk.count(b"\n", 0, exc.start)
        newlines += chunk.count(b"\n")
        last = chunk[-1:]
    digest = file_sha256(path, each_chunk=each_chunk)
    if text is not None and bad_text is None:
        try:
            text.decode(b"", final=True)
        except UnicodeDecodeError:
            bad_text = newlines - (1 if last == b"\n" else 0)
    if digest != segment.sha256:
        raise ArchiveError(path, f"sha256 is {digest}, the manifest says {segment.sha256}")
    if bad_text is not None:
        raise ArchiveError(path, f"line {bad_text + 1} is not valid UTF-8", rba=bad_text)
    if segment.format == "parquet":
        records = _check_parquet_columns(segment)
    else:
        records = newlines + (0 if last == b"\n" else 1)
    if records != segment.records:
        raise ArchiveError(path, f"holds {records} records, the manifest says {segment.records}",
                           rba=min(records, segment.records))


def check_sequence(segments: Iterable[Segment], known: dict[int, Segment] | None = None) -> None:
    """Check that each thread's segments follow on from each other (and from `known`, the
    last segment already cataloged per thread): sequence +1, first_scn = previous
    next_scn, first_time = previous next_time is not required (clocks may be coarse)."""
    last = dict(known or {})
    for segment in sorted(segments, key=lambda s: (s.thread, s.sequence)):
        previous = last.get(segment.thread)
        if previous is not None:
            if previous.closed:
                raise ArchiveError(segment.manifest_path,
                                   f"thread {segment.thread} was closed by sequence {previous.sequence}, "
                                   f"yet sequence {segment.sequence} follows")
            if segment.sequence != previous.sequence + 1:
                missing = f"{previous.sequence + 1}" if segment.sequence == previous.sequence + 2 else \
                    f"{previous.sequence + 1} to {segment.sequence - 1}"
                raise ArchiveError(segment.manifest_path,
                                   f"sequence gap: thread {segment.thread} goes from sequence {previous.sequence} "
                                   f"to {segment.sequence} (missing {missing})")
            if segment.first_scn != previous.next_scn:
                raise ArchiveError(segment.manifest_path,
                                   f"first_scn {segment.first_scn} does not equal next_scn {previous.next_scn} "
                                   f"of sequence {previous.sequence}", rba=0)
        last[segment.thread] = segment


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool


@dataclass(frozen=True)
class TableDef:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @property
    def effective_key(self) -> tuple[str, ...]:
        """The columns that identify a row: a table with no key is keyed by all columns."""
        return self.key or tuple(column.name for column in self.columns)


def load_defs(archive_dir: Path) -> dict[str, TableDef]:
    """Read defs.json: table name -> definition."""
    path = archive_dir / contract.DEFS_FILE
    try:
        document = json.loads(path.read_bytes())
        tables = document["tables"]
    except FileNotFoundError:
        raise ArchiveError(path, "table definitions are missing") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArchiveError(path, f"unreadable table definitions: {exc}") from None
    defs: dict[str, TableDef] = {}
    for index, table in enumerate(tables):
        try:
            name = table["name"]
            contract.split_table_name(name)
            columns = tuple(Column(c["name"], c["type"], bool(c.get("nullable", True))) for c in table["columns"])
            key = tuple(table.get("key") or ())
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveError(path, f"table #{index + 1}: {exc}") from None
        names = [c.name for c in columns]
        if not columns or len(set(names)) != len(names):
            raise ArchiveError(path, f"table {name!r}: columns must be present and unique")
        unknown = [k for k in key if k not in names]
        if unknown:
            raise ArchiveError(path, f"table {name!r}: key column(s) {unknown} are not among its columns")
        if name in defs:
            raise ArchiveError(path, f"table {name!r} is defined twice")
        defs[name] = TableDef(name, columns, key)
    return defs
