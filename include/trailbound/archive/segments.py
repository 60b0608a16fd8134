"""Segments and manifests: the file-level half of the archive contract (no Spark here).

A segment exists once its manifest does. This module parses manifests, checks a data
file against its manifest (size, sha256, record count, column types) and checks that a
thread's segments follow each other (no sequence gap, first_scn = previous next_scn,
nothing after a closed segment). The record-level checks need every record and live in
the Spark reader.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from trailbound.archive import contract
from trailbound.errors import ArchiveError
from trailbound.positions import Scn


@dataclass(frozen=True)
class Segment:
    """One archived log segment, as its manifest describes it."""

    thread: int
    sequence: int
    first_scn: Scn
    next_scn: Scn
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


# An rba fits 32 bits: capture packs a log position into one long (sequence << 32 | rba).
MAX_RECORDS = 2**32 - 1


def _int(document: dict, key: str, where: Path, minimum: int = 0, maximum: int | None = None) -> int:
    value = document.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArchiveError(where, f"{key} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ArchiveError(where, f"{key} {value} is over {maximum:,}, the most one segment may hold here; "
                                  "cut the log into smaller segments")
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
        first_scn=Scn(_int(document, "first_scn", manifest)),
        next_scn=Scn(_int(document, "next_scn", manifest)),
        first_time=_utc(document["first_time"], "first_time", manifest),
        next_time=_utc(document["next_time"], "next_time", manifest),
        records=_int(document, "records", manifest, maximum=MAX_RECORDS),
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


def threads_short_of(segments: Sequence[Segment], until: datetime) -> list[int] | None:
    """The redo threads whose archived log does not reach `until` yet (a closed thread
    counts as reaching everything); None when nothing is archived at all. An empty list:
    the archive covers everything up to `until`."""
    last: dict[int, Segment] = {}
    for segment in segments:
        last[segment.thread] = segment
    if not last:
        return None
    return [thread for thread, s in sorted(last.items()) if not s.closed and s.next_time < until]


# Column types a data file may use: the contract's, plus the integer and timestamp
# variants other Parquet writers produce for the same values.
def _compatible(field: pa.Field) -> bool:
    kind = field.type
    if field.name in ("rba", "scn"):
        return pa.types.is_integer(kind)
    if field.name == "ts":
        return pa.types.is_timestamp(kind)
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)


def _parquet_file(segment: Segment, data: bytes) -> pq.ParquetFile:
    """The data file's Parquet reader (over bytes already read), its columns checked."""
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ArchiveError(segment.path, f"not a readable Parquet file: {' '.join(str(exc).split())}") from None
    schema = parquet.schema_arrow
    missing = [name for name in contract.RECORD_FIELDS if name not in schema.names and name != "parent_xid"]
    if missing:
        raise ArchiveError(segment.path, f"missing column(s) {', '.join(missing)}")
    for column in schema:
        if column.name in contract.RECORD_FIELDS and not _compatible(column):
            raise ArchiveError(segment.path, f"column {column.name} has type {column.type}, not what the contract says")
    return parquet


def read_verified(segment: Segment) -> tuple[bytes, pq.ParquetFile | None]:
    """The data file's bytes, read once and checked against the manifest: present, size,
    sha256, UTF-8 (JSON Lines), record count; with its Parquet reader for a Parquet file."""
    path = segment.path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ArchiveError(path, f"data file of {segment.manifest_path.name} is missing") from None
    if len(data) != segment.bytes:
        raise ArchiveError(path, f"size is {len(data)} bytes, the manifest says {segment.bytes}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != segment.sha256:
        raise ArchiveError(path, f"sha256 is {digest}, the manifest says {segment.sha256}")
    parquet = None
    if segment.format == "jsonl":
        # Spark's reader would replace bad bytes with U+FFFD and carry on: the bytes are
        # checked here, where the error can name the line.
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start)
            raise ArchiveError(path, f"line {line + 1} is not valid UTF-8", rba=line) from None
        records = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    else:
        parquet = _parquet_file(segment, data)
        records = parquet.metadata.num_rows
    if records != segment.records:
        raise ArchiveError(path, f"holds {records} records, the manifest says {segment.records}",
                           rba=min(records, segment.records))
    return data, parquet


def verify_data(segment: Segment) -> None:
    """Check the data file against its manifest: present, size, sha256, record count."""
    read_verified(segment)


# ---------------------------------------------------------------- the scan's record pre-check
#
# Every record of a new segment must pass the contract's checks before the segment is
# cataloged. The Spark reader (archive.reader) is the reference: it names the first bad
# record. Running it over every record of a large archive is slow (a window, joins and a
# JSON parse of every image on the JVM), so a scan first runs the same checks here,
# vectorised over Arrow columns, one task per thread, reading each file once (its bytes
# give the sha256 and then the records). A check here may be stricter than the contract
# (an image with a line break, a file not in rba order): anything it flags goes to the
# Spark reader, which either names the bad record or finds none. It never passes what
# the reader would refuse.

_IMAGE_PARSE = None


def _images_are_objects(images: pa.ChunkedArray | pa.Array) -> bool:
    """Whether every non-null image is JSON object text (one object, nothing else)."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.json as pj

    global _IMAGE_PARSE
    values = pc.drop_null(images)
    if not len(values):
        return True
    if not pc.all(pc.starts_with(pc.utf8_ltrim(values, characters=" "), "{")).as_py():
        return False
    if pc.any(pc.match_substring(values, "\n")).as_py() or pc.any(pc.match_substring(values, "\r")).as_py():
        return False  # one value per line below
    if _IMAGE_PARSE is None:
        _IMAGE_PARSE = pj.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore")
    lines = pc.binary_join_element_wise(values, "", "\n")  # each value, then a line break
    lines = lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
    text = lines.buffers()[2][int(offsets[0]):int(offsets[-1])]
    try:
        parsed = pj.read_json(pa.BufferReader(text), parse_options=_IMAGE_PARSE,
                              read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, text.size + 1)))
    except pa.ArrowInvalid:
        return False
    return parsed.num_rows == len(values)


_TEXT = ("xid", "parent_xid", "op", "table", "before", "after")


def _records_pass(segment: Segment, table: pa.Table) -> bool:
    """The per-record checks of archive.reader._record_violations, vectorised."""
    import numpy as np
    import pyarrow.compute as pc

    n = table.num_rows
    table = table.cast(pa.schema([pa.field(f.name, pa.string()) if f.name in _TEXT else f for f in table.schema]))
    rba, scn = table.column("rba"), table.column("scn")
    if rba.null_count or scn.null_count or table.column("ts").null_count:
        return False
    if not np.array_equal(rba.to_numpy().astype(np.int64), np.arange(n, dtype=np.int64)):
        return False
    scns = scn.to_numpy().astype(np.int64)
    if n and (np.any(np.diff(scns) < 0) or scns[0] < segment.first_scn.value or scns[-1] >= segment.next_scn.value):
        return False
    xid, op, name = table.column("xid"), table.column("op"), table.column("table")
    parent = table.column("parent_xid") if "parent_xid" in table.column_names else pa.nulls(n, pa.string())
    if xid.null_count or op.null_count:
        return False
    length = pc.utf8_length(xid)
    if pc.min(length).as_py() < 1 or pc.max(length).as_py() > contract.MAX_XID_LENGTH:
        return False
    if not pc.all(pc.is_in(op, value_set=pa.array(contract.OPS))).as_py():
        return False
    dml = pc.is_in(op, value_set=pa.array(contract.DML_OPS))
    no_table = pc.or_kleene(pc.is_null(name), pc.equal(pc.fill_null(name, ""), ""))
    if pc.any(pc.and_(dml, no_table)).as_py():
        return False
    if pc.any(pc.and_(pc.equal(op, "COMMIT"), pc.is_valid(parent))).as_py():
        return False
    if pc.any(pc.fill_null(pc.equal(parent, xid), False)).as_py():
        return False
    return _images_are_objects(table.column("before")) and _images_are_objects(table.column("after"))


class _TransactionChecks:
    """The cross-record checks of one thread's new records (archive.reader's
    _records_after_end and _nested_subtransactions), fed a segment at a time in log order:
    nothing of a transaction, or of a subtransaction of it, after its first end; no
    parent_xid naming a subtransaction. It keeps the first end's position of each
    transaction that ended and the distinct subtransaction and parent xids, never the
    records: a thread's new log may be one transaction of millions of records.

    The ends are a dict, looked up with a segment's own few hundred xids: a join of each
    segment against every end so far cost time in the ends seen, 9.7 of a 200,000-record
    scan's 11.4 CPU-s over 528 segments, and grew with the square of the log's size."""

    def __init__(self):
        self.ends: dict[str, int] = {}  # xid: position of its first COMMIT or ROLLBACK
        self.subtransactions: set[str] = set()
        self.parents: set[str] = set()  # parent_xids of records whose xid differs

    def passes(self, xid: pa.Array, parent: pa.Array, op: pa.Array, position: pa.Array) -> bool:
        """Whether a segment's records (in log order, after every segment fed before) pass."""
        import pyarrow.compute as pc

        records = pa.table({"xid": xid, "parent": parent, "pos": position})
        ended = records.filter(pc.is_in(op, value_set=pa.array(contract.END_OPS)))
        if ended.num_rows:
            first = ended.group_by("xid", use_threads=False).aggregate([("pos", "min")])
            for name, at in zip(first.column("xid").to_pylist(), first.column("pos_min").to_pylist()):
                self.ends.setdefault(name, at)  # positions only grow: a known end stays the first
        named = pc.unique(pa.chunked_array([xid, parent.cast(xid.type)]).drop_null()).to_pylist()
        known = [name for name in named if name in self.ends]
        if known:
            # Each record's own transaction's end, and its parent's: a record after either fails.
            names = pa.array(known, xid.type)
            ends = pa.array([self.ends[name] for name in known], pa.int64())
            for owner in (xid, parent):
                end = pc.take(ends, pc.index_in(owner, value_set=names))  # null: no end known
                if pc.any(pc.greater(position, end)).as_py():
                    return False
        with_parent = records.filter(pc.is_valid(parent))
        self.subtransactions.update(pc.unique(with_parent.column("xid")).to_pylist())
        self.parents.update(pc.unique(with_parent.filter(pc.not_equal(with_parent.column("xid"),
                                                                      with_parent.column("parent")))
                                      .column("parent")).to_pylist())
        return not (self.subtransactions & self.parents)


@dataclass
class RunCheck:
    """What checking a run of one thread's consecutive segments found: the first
    file-level error as (path, message, rba), or None; whether every record passed the
    vectorised checks; and, for the checks across runs (`runs_pass`), the xids its records
    name (as xid or parent_xid), the transactions that ended in it, its subtransactions
    and the parents of those: each an Arrow array of distinct xids. (They travel from
    the task to the run's driver: as Python sets of str a 10M-record archive's made the
    capture client's peak RSS 941 MB; as Arrow arrays they are their bytes and offsets.)"""

    error: tuple[str, str, int | None] | None
    passed: bool
    named: pa.Array = field(default_factory=lambda: _distinct([]))
    ended: pa.Array = field(default_factory=lambda: _distinct([]))
    subtransactions: pa.Array = field(default_factory=lambda: _distinct([]))
    parents: pa.Array = field(default_factory=lambda: _distinct([]))


def _distinct(names) -> pa.Array:
    """The distinct xids of `names` (Arrow arrays, or lists of str) as one string array."""
    import pyarrow.compute as pc

    arrays = [part.cast(pa.string()) if isinstance(part, (pa.Array, pa.ChunkedArray)) else pa.array(part, pa.string())
              for part in names]
    if not arrays:
        return pa.array([], pa.string())
    return pc.unique(pa.chunked_array(arrays, pa.string()).combine_chunks().drop_null())


def check_run(segments: list[Segment]) -> RunCheck:
    """A run of one thread's new segments, in sequence order, each file read once. Runs in
    a Spark task; a JSON Lines segment is left to the reader. The task holds one segment
    and what _TransactionChecks keeps, whatever the log's size."""
    import numpy as np

    passed = True
    checks = _TransactionChecks()
    named: list = []
    for segment in segments:
        try:
            _, parquet = read_verified(segment)
        except ArchiveError as exc:
            return RunCheck((exc.path, exc.message, exc.rba), passed)
        if parquet is None:
            passed = False
            continue
        if not passed or not segment.records:
            continue
        table = parquet.read()
        if "parent_xid" not in table.column_names:
            table = table.append_column("parent_xid", pa.nulls(table.num_rows, pa.string()))
        xid, parent, op = (table.column(name).cast(pa.string()).combine_chunks() for name in ("xid", "parent_xid", "op"))
        passed = _records_pass(segment, table) and checks.passes(
            xid, parent, op, pa.array((segment.sequence << 32) + np.arange(table.num_rows, dtype=np.int64)))
        del table
        if passed:
            named += [_distinct([xid, parent])]
            if len(named) > 64:  # a long run: its names so far made distinct, not every segment's kept
                named = [_distinct(named)]
    return RunCheck(None, passed, _distinct(named), _distinct([list(checks.ends)]),
                    _distinct([list(checks.subtransactions)]), _distinct([list(checks.parents)]))


def runs_pass(runs: list[RunCheck]) -> bool:
    """Whether one thread's runs of segments (in log order, each passed on its own) pass
    the checks across them: nothing of a transaction in a run after the one it ended in,
    no parent_xid naming a subtransaction anywhere in the thread."""
    import pyarrow.compute as pc

    ended: list = []
    for run in runs:
        if ended and pc.any(pc.is_in(run.named, value_set=_distinct(ended))).as_py():
            return False
        ended.append(run.ended)
    subtransactions = _distinct([run.subtransactions for run in runs])
    parents = _distinct([run.parents for run in runs])
    return not pc.any(pc.is_in(subtransactions, value_set=parents)).as_py()


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
    # The value (PostgreSQL text input form) the rows that existed before the column was
    # added hold in it: PostgreSQL's attmissingval. None: NULL, or not known.
    default: str | None = None


@dataclass(frozen=True)
class TableVersion:
    """One definition of a table and the SCN from which it holds: a record of the table
    with `scn >= self.scn` (and below the next version's) was written under it."""

    version: int
    scn: int
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    time: str | None = None   # the log time of its first record (ISO 8601, UTC), when the writer knew it

    @property
    def effective_key(self) -> tuple[str, ...]:
        return self.key or tuple(column.name for column in self.columns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def as_json(self) -> dict:
        document = {"version": self.version, "scn": self.scn, "columns": [_column_json(c) for c in self.columns],
                    "key": list(self.key)}
        if self.time is not None:
            document["time"] = self.time
        return document

    def since(self) -> str:
        """Where it holds from, for INFO: `scn N (time)`."""
        return f"scn {self.scn}" + (f" ({self.time})" if self.time else "")


def _column_json(column: Column) -> dict:
    document = {"name": column.name, "type": column.type, "nullable": column.nullable}
    if column.default is not None:
        document["default"] = column.default
    return document


@dataclass(frozen=True)
class TableDef:
    """A table's latest definition (`columns`, `key`) and every version of it, oldest
    first (an archive without versions: one, version 1 from SCN 0)."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    versions: tuple[TableVersion, ...] = ()

    def __post_init__(self) -> None:
        if not self.versions:
            object.__setattr__(self, "versions", (TableVersion(1, 0, self.columns, self.key),))

    @property
    def effective_key(self) -> tuple[str, ...]:
        """The columns that identify a row: a table with no key is keyed by all columns."""
        return self.key or tuple(column.name for column in self.columns)

    @property
    def latest(self) -> TableVersion:
        return self.versions[-1]

    def version(self, number: int) -> TableVersion:
        for version in self.versions:
            if version.version == number:
                return version
        raise KeyError(f"table {self.name} has no version {number}")

    def version_at(self, scn: int) -> TableVersion:
        """The version a record of this table at `scn` was written under."""
        chosen = self.versions[0]
        for version in self.versions:
            if version.scn <= scn:
                chosen = version
        return chosen

    def with_version(self, columns: tuple[Column, ...], key: tuple[str, ...], scn: int,
                     time: str | None = None) -> "TableDef":
        added = TableVersion(self.latest.version + 1, scn, columns, key, time)
        return TableDef(self.name, columns, key, self.versions + (added,))

    def as_json(self) -> dict:
        """defs.json's entry: the latest definition at the top (what a reader without
        versions reads), and the versions when there is more than the first."""
        document = {"name": self.name, "columns": [_column_json(c) for c in self.columns], "key": list(self.key)}
        if len(self.versions) > 1 or self.versions[0].scn:
            document["versions"] = [version.as_json() for version in self.versions]
        return document


def _columns(path: Path, name, documents) -> tuple[Column, ...]:
    columns = tuple(Column(c["name"], c["type"], bool(c.get("nullable", True)),
                           None if c.get("default") is None else str(c["default"])) for c in documents)
    names = [c.name for c in columns]
    if not columns or len(set(names)) != len(names):
        raise ArchiveError(path, f"table {name!r}: columns must be present and unique")
    return columns


def _check_key(path: Path, name, key, columns) -> None:
    unknown = [k for k in key if k not in [c.name for c in columns]]
    if unknown:
        raise ArchiveError(path, f"table {name!r}: key column(s) {unknown} are not among its columns")


def load_defs(archive_dir: Path) -> dict[str, TableDef]:
    """Read defs.json: table name -> definition (with its versions)."""
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
            columns = _columns(path, name, table["columns"])
            key = tuple(table.get("key") or ())
            versions = tuple(TableVersion(int(v["version"]), int(v["scn"]), _columns(path, name, v["columns"]),
                                          tuple(v.get("key") or ()), None if v.get("time") is None else str(v["time"]))
                             for v in table.get("versions") or ())
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveError(path, f"table #{index + 1}: {exc}") from None
        _check_key(path, name, key, columns)
        for position, version in enumerate(versions):
            _check_key(path, name, version.key, version.columns)
            if version.version != position + 1 or (position and version.scn <= versions[position - 1].scn):
                raise ArchiveError(path, f"table {name!r}: versions must be numbered 1, 2, ... with increasing scn "
                                         f"(version #{position + 1} is {version.version} at scn {version.scn})")
        if versions and (versions[-1].columns, versions[-1].key) != (columns, key):
            raise ArchiveError(path, f"table {name!r}: its columns and key must be those of its last version")
        if name in defs:
            raise ArchiveError(path, f"table {name!r} is defined twice")
        defs[name] = TableDef(name, columns, key, versions)
    return defs


def describe_versions(defs: dict[str, TableDef]) -> list[str]:
    """For INFO: a line per table whose definition changed, or that entered the archive,
    while the archive was written: its current version and where it holds from."""
    return [f"  Table {name}: version {table.latest.version} since {table.latest.since()}"
            for name, table in defs.items() if len(table.versions) > 1 or table.latest.scn]


def versions_of(defs: dict[str, TableDef]) -> dict[str, list[tuple[int, int]]]:
    """Each table's (scn, version) pairs, for a reader that numbers records by version."""
    return {name: [(v.scn, v.version) for v in table.versions] for name, table in defs.items()}
