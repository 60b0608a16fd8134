"""Trail files: committed transactions in commit order, one Parquet file per trail seqno.

A trail is a prefix (`var/dirdat/lt`) plus a 9-digit seqno: `var/dirdat/lt000000001`.
Each file holds whole transactions (rollover happens only between transactions), and a
record's RBA is its ordinal in the file. A file is verifiable on its own: its footer
carries the format version, record count, first and last CSN, and a SHA-256 of its
content, and every Parquet page carries a CRC. Files are immutable once a committed
write checkpoint covers them; a file past the committed checkpoint is invisible and the
next run overwrites it. See docs/trail-format.md.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import queue
import threading
import uuid
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trailbound import copytext
from trailbound.durable import atomic_write, file_sha256, publish, temporary_path
from trailbound.errors import TrailboundError, TrailError
from trailbound.positions import CSN_COLUMNS, Csn, Scn, TRAIL_ORDER, TrailPosition

# Version 2 added `copy_line`, each INSERT's row as a COPY text line; version 3
# `table_version`, the version of its table's definition each DML record was written
# under. Older files read as if those columns were all NULL. Version 4 changed no
# column: its content digest goes row group by row group, and its footer and layouts
# are written once the file's last row group is, so that a writer streams a file of
# any size (one transaction of 10 million records) holding one row group of it.
FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
_METADATA_KEY = b"trailbound.trail"
# The layout of each table whose inserts carry a line: the copy_line field's metadata
# as a reader sees it (and as files of versions 2 and 3 hold it); a version 4 file
# holds it in its footer (the schema's metadata), under the same key.
_LAYOUTS_KEY = b"trailbound.copy_line_layouts"
# Records per Parquet row group. A reader decodes a file a row group at a time
# (read_parts): replicat applies a file's first records before the rest are decoded,
# and the first row group is small, so that its first COPY waits for little decoding.
# Older files (one row group of up to 1M records, or all of 65,536) read the same way.
FIRST_ROW_GROUP_RECORDS = 4_096
ROW_GROUP_RECORDS = 65_536

# Transaction indicator, as GoldenGate's TransInd: where a record sits in its transaction.
BEGIN, MIDDLE, END, WHOLE = 0, 1, 2, 3

SCHEMA = pa.schema([
    ("rba", pa.int64()),
    ("trans_ind", pa.int8()),
    ("csn", pa.int64()),            # commit SCN
    ("csn_thread", pa.int32()),     # ... and the COMMIT record's position, which orders ties
    ("csn_sequence", pa.int64()),
    ("csn_rba", pa.int64()),
    ("xid", pa.string()),
    ("commit_ts", pa.timestamp("us", tz="UTC")),
    ("op", pa.string()),
    ("table", pa.string()),
    ("before", pa.string()),
    ("after", pa.string()),
    ("src_thread", pa.int32()),     # the record's own position in the redo archive
    ("src_sequence", pa.int64()),
    ("src_rba", pa.int64()),
    ("src_scn", pa.int64()),
    ("log_bsn", pa.int64()),        # recovery SCN of the capture run that wrote it
    # The version of the table's definition (the redo archive's defs.json) the record was
    # written under: its images hold that version's columns. NULL for COMMIT and the like,
    # and in files of format 2 and older (read as version 1, the only one they knew).
    ("table_version", pa.int32()),
    # An INSERT's row as a COPY text line (trailbound.copytext), in the source's column
    # order: replicat applies it without parsing the image. NULL for every other record,
    # and for the inserts of a table with no layout in the file's footer.
    ("copy_line", pa.string()),
])
COLUMNS = SCHEMA.names
_SCHEMAS = {4: SCHEMA, 3: SCHEMA, 2: pa.schema([field for field in SCHEMA if field.name != "table_version"]),
            1: pa.schema([field for field in SCHEMA if field.name not in ("copy_line", "table_version")])}


def trail_path(prefix: Path, seqno: int) -> Path:
    return prefix.with_name(f"{prefix.name}{seqno:09d}")


@dataclass(frozen=True)
class TrailFileInfo:
    seqno: int
    path: Path | str       # a local path; a remote trail's file is its location text
    records: int
    bytes: int
    sha256: str        # of the whole file, for shipping checks
    first_csn: Csn
    last_csn: Csn
    log_bsn: Scn

    @property
    def end(self) -> TrailPosition:
        return TrailPosition(self.seqno, self.records)


def row_group_slices(records: int) -> Iterator[tuple[int, int]]:
    """(start, length) of each row group of a file of `records` records, as the writer
    cuts them; a version 4 file's content digest goes by these slices, whatever the
    file's Parquet row groups are."""
    start, length = 0, FIRST_ROW_GROUP_RECORDS
    while start < records:
        yield start, min(length, records - start)
        start, length = start + length, ROW_GROUP_RECORDS


class ContentDigest:
    """A version 4 file's content digest, fed a row group at a time (`update`): the
    SHA-256 of each row group's values column by column (as _content_digest of version
    3 hashes a whole file's), then the record count and the copy lines' layouts, which
    are known only at the end. A writer holds the running hash, never the records."""

    def __init__(self):
        self._sha256 = hashlib.sha256()
        self.records = 0

    def update(self, records: pa.Table) -> None:
        _digest_values(self._sha256, records, SCHEMA)
        self.records += len(records)

    def hexdigest(self, layouts: dict) -> str:
        final = self._sha256.copy()
        final.update(self.records.to_bytes(8, "little"))
        final.update(_layouts_text(layouts))
        return final.hexdigest()


def _content_digest(table: pa.Table, version: int = FORMAT_VERSION, layouts: dict | None = None) -> str:
    """SHA-256 of the records themselves (and, from version 2, the copy lines' layouts),
    so a file can be checked without any outside record of it. Computed from values only
    (validity, integers, string bytes), never from Arrow buffers, whose layout depends on
    who built them. Up to version 3 over the whole file column by column; from version 4
    row group by row group (ContentDigest)."""
    if version >= 4:
        running = ContentDigest()
        for start, length in row_group_slices(len(table)):
            running.update(table.slice(start, length))
        return running.hexdigest(layouts or {})
    digest = hashlib.sha256(len(table).to_bytes(8, "little"))
    if version >= 2:
        digest.update(_layouts_text(layouts or {}))
    _digest_values(digest, table, _SCHEMAS[version])
    return digest.hexdigest()


def _digest_values(digest, table: pa.Table, schema: pa.Schema) -> None:
    """Feed `digest` the values of `table`'s columns of `schema`, column by column."""
    table = table.select(schema.names).cast(schema).combine_chunks()
    for field in schema:
        column = table.column(field.name)
        array = column.chunk(0) if column.num_chunks else pa.array([], field.type)
        digest.update(np.packbits(pc.is_valid(array).to_numpy(zero_copy_only=False)).tobytes())
        if pa.types.is_string(field.type):
            filled = array.fill_null("") if array.null_count else array
            offsets = np.frombuffer(filled.buffers()[1], dtype=np.int32)[filled.offset:filled.offset + len(filled) + 1]
            digest.update(np.diff(offsets).astype("<i4").tobytes())
            if len(filled):  # the string bytes in place, not copied out (hashlib reads a buffer)
                digest.update(memoryview(filled.buffers()[2])[offsets[0]:offsets[-1]])
        else:
            digest.update(array.cast(pa.int64()).fill_null(0).to_numpy().astype("<i8").tobytes())


def _layouts_text(layouts: dict) -> bytes:
    return json.dumps({name: [list(column) for column in layout] for name, layout in sorted(layouts.items())},
                      ensure_ascii=False, separators=(",", ":")).encode()


def copy_line_layouts(table: pa.Table) -> dict[str, copytext.Layout]:
    """The layouts of the copy lines of `table` (read from a trail file, or given lines by
    `with_copy_lines`): table name -> ((column, JSON kind), ...)."""
    if "copy_line" not in table.schema.names:
        return {}
    metadata = table.schema.field("copy_line").metadata or {}
    if _LAYOUTS_KEY not in metadata:
        return {}
    return {name: tuple((column, kind) for column, kind in layout)
            for name, layout in json.loads(metadata[_LAYOUTS_KEY]).items()}


def with_copy_lines(table: pa.Table, layouts: dict[str, copytext.Layout]) -> pa.Table:
    """`table` (trail records) with the COPY line of each INSERT of a table in `layouts`
    (see trailbound.copytext), the layouts used kept in the column's metadata."""
    lines, used = copytext.insert_lines(table, layouts)
    return _set_copy_lines(table, lines, used)


def _set_copy_lines(table: pa.Table, lines, layouts: dict) -> pa.Table:
    field = pa.field("copy_line", pa.string(), metadata={_LAYOUTS_KEY: _layouts_text(layouts)} if layouts else None)
    if "copy_line" in table.schema.names:
        return table.set_column(table.schema.get_field_index("copy_line"), field, lines)
    return table.append_column(field, lines)


def write_file(prefix: Path, seqno: int, table: pa.Table, *, group: str, log_bsn: Scn) -> TrailFileInfo:
    """Write one complete trail file (atomically: temporary name, fsync, rename, fsync the
    directory). Its copy lines are `table`'s, with their layouts (a table read from a
    trail file, or given lines by `with_copy_lines`); a table without them gets none."""
    layouts = copy_line_layouts(table)
    writer = _FileWriter(prefix, seqno, group=group, log_bsn=log_bsn)
    with writer.cleanup():
        for start, length in row_group_slices(len(table)):
            writer.write(table.slice(start, length))
        return writer.close(layouts)


def write_streamed_file(prefix: Path, seqno: int, parts: Iterable[pa.Table], *, group: str,
                        log_bsn: Scn) -> TrailFileInfo | None:
    """write_file of records that come a part at a time (their rbas and indicators set,
    the copy lines' layouts on the first part's copy_line field): the writer holds a row
    group, never the file. None, and nothing written, when no record came."""
    row_groups = _cut_row_groups(batch for part in parts for batch in part.to_batches())
    first = next(row_groups, None)
    if first is None:
        return None
    writer = _FileWriter(prefix, seqno, group=group, log_bsn=log_bsn)
    with writer.cleanup():
        for records, _ in itertools.chain([first], row_groups):
            writer.write(records)
        return writer.close(copy_line_layouts(first[0]))


def _complete(table: pa.Table) -> pa.Table:
    """Trail records in SCHEMA, an absent copy_line or table_version all NULL."""
    for name in ("table_version", "copy_line"):
        if name not in table.schema.names:
            table = table.append_column(name, pa.nulls(len(table), SCHEMA.field(name).type))
    return table.select(COLUMNS).cast(SCHEMA)


_ROW_GROUPS_AHEAD = 2  # row groups a trail file's encoder may have waiting


class _FileWriter:
    """One trail file written a row group at a time, so that its writer holds one row
    group, never the file (a transaction of 10 million records is one file). Under a
    temporary name until `close` writes the footer (record count, first and last CSN,
    the running content digest, the copy lines' layouts: all known only at the end) and
    publishes it; `cleanup` removes the temporary file of a write that failed."""

    def __init__(self, prefix: Path, seqno: int, *, group: str, log_bsn: Scn, claim: str = ""):
        self.prefix, self.seqno, self.group, self.log_bsn = prefix, seqno, group, log_bsn
        self.claim = claim  # the run's claim on the trail (see `claim`), "" for none
        self.path = trail_path(prefix, seqno)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # No Arrow schema in the file: it would be written with the metadata it has now,
        # before the footer's is known. Read without one, the file's columns are SCHEMA's
        # all the same, and its key-value metadata (the footer, added at `close`) is its
        # schema's metadata for every Parquet reader.
        self._parquet = pq.ParquetWriter(temporary_path(self.path, self.claim), SCHEMA, compression="zstd",
                                         write_page_checksum=True, store_schema=False)
        self._digest = ContentDigest()
        self._first: Csn | None = None
        self._last: Csn | None = None
        # Row groups are hashed and encoded by a thread of their own while the caller makes
        # the next one: both release the GIL (hashlib on large buffers, Parquet's C++), so
        # on a second core they cost the caller nothing (a one-pass capture's write task at
        # 1M records: 1.1 of its 2.3 CPU-s). At most _ROW_GROUPS_AHEAD wait: bounded memory.
        self._pending: queue.Queue = queue.Queue(maxsize=_ROW_GROUPS_AHEAD)
        self._failure: BaseException | None = None
        self._abandoned = False  # the write failed on the caller's side: what waits is not encoded
        self._encoder = threading.Thread(target=self._encode, name=f"trail writer {self.path.name}", daemon=True)
        self._encoder.start()

    def write(self, records: pa.Table) -> None:
        """The file's next row group: records with their rbas and indicators."""
        if not len(records):
            return
        records = _complete(records)
        if self._first is None:
            self._first = Csn.from_row(records.slice(0, 1).to_pylist()[0])
        self._last = Csn.from_row(records.slice(len(records) - 1).to_pylist()[0])
        self._raise_failure()
        self._pending.put(records)

    def _encode(self) -> None:
        while (records := self._pending.get()) is not None:
            if self._failure is None and not self._abandoned:  # else only drained
                try:
                    self._digest.update(records)
                    self._parquet.write_table(records, row_group_size=len(records))
                except BaseException as exc:  # given to the caller by its next write or close
                    self._failure = exc

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _encoded(self) -> None:
        """Every row group handed over is in the file (or the encoder's failure is raised)."""
        if self._encoder.is_alive():
            self._pending.put(None)
            self._encoder.join()
        self._raise_failure()

    def close(self, layouts: dict) -> TrailFileInfo:
        self._encoded()
        records = self._digest.records
        meta = {"format_version": FORMAT_VERSION, "group": self.group, "trail": self.prefix.name,
                "seqno": self.seqno, "records": records, "first_csn": str(self._first),
                "last_csn": str(self._last), "log_bsn": self.log_bsn.value,
                "content_sha256": self._digest.hexdigest(layouts)}
        footer = {_METADATA_KEY: json.dumps(meta).encode()}
        if layouts:
            footer[_LAYOUTS_KEY] = _layouts_text(layouts)
        self._parquet.add_key_value_metadata(footer)
        self._parquet.close()
        publish(self.path, writer=self.claim,
                fence=(lambda: check_claim(self.prefix, self.claim, self.group)) if self.claim else None)
        return TrailFileInfo(self.seqno, self.path, records, self.path.stat().st_size, file_sha256(self.path),
                             self._first, self._last, self.log_bsn)

    @contextmanager
    def cleanup(self):
        try:
            yield
        except BaseException:
            self._abandoned = True
            with suppress(BaseException):
                self._encoded()
            self._parquet.close()
            temporary_path(self.path, self.claim).unlink(missing_ok=True)
            raise


# A run's claim on its trail. Capture's files are written by Spark tasks, and a task can
# outlive the run that started it: a Spark Connect client killed mid-write leaves its job
# running on the server, and the run that follows writes the same file numbers (nothing of
# the killed run was committed), from more records perhaps. Each run claims the trail
# before its tasks write (a token in a hidden file beside the trail); a task publishes a
# file only while its run's claim is the trail's, so an abandoned run's late task can
# never rename its file over one a newer run wrote, verified and committed.
def claim_path(prefix: Path) -> Path:
    return prefix.with_name(f".{prefix.name}.claim")


def claim(prefix: Path) -> str:
    """Claims the trail for the calling run (durably, before any of its tasks writes);
    returns the claim's token for the tasks."""
    token = uuid.uuid4().hex
    prefix.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(claim_path(prefix), token.encode())
    return token


def check_claim(prefix: Path, token: str, group: str) -> None:
    """Raises TrailError when the trail is no longer claimed by `token`: a newer run of
    the group took it over, and this write was abandoned."""
    try:
        current = claim_path(prefix).read_text()
    except FileNotFoundError:
        current = ""
    if current != token:
        raise TrailError(prefix, f"a newer run of {group} has claimed this trail; this write was abandoned by its "
                                 "run (a killed client whose Spark job went on) and publishes nothing")


def with_table_versions(table: pa.Table, versions: dict[str, list[tuple[int, int]]]) -> pa.Table:
    """`table` (trail records with `table` and `src_scn`) with each DML record's
    `table_version`: the last of its table's (scn, version) pairs at or below its
    src_scn (archive.segments.versions_of); version 1 for a table without versions."""
    n = len(table)
    result = np.zeros(n, dtype=np.int32)
    valid = np.zeros(n, dtype=bool)
    if n:
        names = table.column("table").combine_chunks().dictionary_encode()
        codes = names.indices.fill_null(0).to_numpy(zero_copy_only=False)  # a NULL name: not `valid`
        valid = ~np.asarray(pc.is_null(names.indices).to_numpy(zero_copy_only=False), dtype=bool)
        scns = table.column("src_scn").to_numpy()
        pairs_of = [versions.get(name) or [(0, 1)] for name in names.dictionary.to_pylist()]
        # A table of one version (most of hundreds) by one lookup for all of them; the
        # others' rows from one sort, not a scan of every row per table.
        first = np.array([pairs[0][1] for pairs in pairs_of], dtype=np.int32)
        result[valid] = first[codes[valid]]
        order = np.flatnonzero(valid)
        order = order[np.argsort(codes[order], kind="stable")]
        bounds = np.searchsorted(codes[order], np.arange(len(pairs_of) + 1))
        for code, pairs in enumerate(pairs_of):
            rows = order[bounds[code]:bounds[code + 1]]
            if len(pairs) == 1 or not len(rows):
                continue
            starts = np.array([scn for scn, _ in pairs], dtype=np.int64)
            numbers = np.array([number for _, number in pairs], dtype=np.int32)
            result[rows] = numbers[np.maximum(np.searchsorted(starts, scns[rows], side="right") - 1, 0)]
    column = pa.array(result, pa.int32(), mask=~valid)
    if "table_version" in table.schema.names:
        return table.set_column(table.schema.get_field_index("table_version"), "table_version", column)
    return table.append_column("table_version", column)


def without_stale_lines(table: pa.Table, versions: dict[str, list[tuple[int, int]]]) -> pa.Table:
    """`table` with no COPY line on a record of an older version than its table's latest:
    the lines' layout (in the footer) is the latest version's."""
    if "copy_line" not in table.schema.names or not len(table) or not versions:
        return table
    latest = {name: pairs[-1][1] for name, pairs in versions.items() if pairs}
    names = table.column("table").combine_chunks().dictionary_encode()
    wanted = np.array([latest.get(name, 1) for name in names.dictionary.to_pylist()] + [0], dtype=np.int32)
    codes = names.indices.fill_null(len(wanted) - 1).to_numpy(zero_copy_only=False)
    own = table.column("table_version").fill_null(0).to_numpy()
    stale = own != wanted[codes]
    if not stale.any():
        return table
    lines = pc.if_else(pa.array(stale), pa.nulls(len(table), pa.string()), table.column("copy_line"))
    field = table.schema.field("copy_line")
    return table.set_column(table.schema.get_field_index("copy_line"), field, lines)


def _check_sorted(keys: list[np.ndarray]) -> None:
    """Raise unless the rows given by `keys` (sort-key columns) are in ascending order.
    Vectorised: a lexicographic "each key >= the previous"."""
    if not len(keys[0]):
        return
    ok = np.zeros(len(keys[0]) - 1, dtype=bool)
    tied = np.ones(len(keys[0]) - 1, dtype=bool)
    for column in keys:
        ok |= tied & (column[1:] > column[:-1])
        tied &= column[1:] == column[:-1]
    ok |= tied
    if not ok.all():
        at = int(np.argmin(ok))
        raise TrailboundError(f"internal error: trail records out of commit order at batch row {at}")


# ---------------------------------------------------------------- files planned ahead, written in parallel
#
# Capture writes a run's trail from many Spark tasks at once, each writing whole files.
# That needs the rollover decided before anything is written: from each record's size,
# which is known from its values alone (the Arrow bytes it takes, validity bits aside),
# transactions in commit order are cut into files the way one sequential writer would
# cut them. File k of the run then gets seqno first + k, whichever task writes it, so the
# trail does not depend on how many tasks there are or where they run.

STRING_COLUMNS = tuple(f.name for f in SCHEMA if pa.types.is_string(f.type))
# Every record's fixed-width values, plus a 4-byte offset per string value.
FIXED_ROW_BYTES = sum(f.type.bit_width // 8 for f in SCHEMA if not pa.types.is_string(f.type)) + 4 * len(STRING_COLUMNS)


def plan_rollover(transaction_bytes: np.ndarray, max_bytes: int) -> np.ndarray:
    """The file number (0, 1, ...) of each transaction, given their sizes in commit order:
    a file takes transactions until one brings it to `max_bytes` or more, and rolls over
    after that one (never inside a transaction)."""
    ends = np.cumsum(np.asarray(transaction_bytes, dtype=np.int64))
    files = np.empty(len(ends), dtype=np.int64)
    start, base, number = 0, 0, 0
    while start < len(ends):
        stop = min(len(ends), int(np.searchsorted(ends, base + max_bytes, side="left")) + 1)
        files[start:stop] = number
        base, start, number = int(ends[stop - 1]), stop, number + 1
    return files


def transaction_indicators(csn_keys: list[np.ndarray], previous: tuple | None = None,
                           following: tuple | None = None) -> np.ndarray:
    """TransInd of each record of commit-ordered whole transactions: a transaction is a
    run of records with one CSN (the CSN columns, given as arrays). `previous` and
    `following` are the CSNs of the records just before and after these (None: there
    are none), for records cut out of a longer run."""
    n = len(csn_keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int8)
    changes = np.zeros(n - 1, dtype=bool)
    for column in csn_keys:
        changes |= column[1:] != column[:-1]
    first = np.concatenate([[previous is None or previous != tuple(column[0] for column in csn_keys)], changes])
    last = np.concatenate([changes, [following is None or following != tuple(column[-1] for column in csn_keys)]])
    return np.where(first & last, WHOLE, np.where(first, BEGIN, np.where(last, END, MIDDLE))).astype(np.int8)


def write_planned_files(prefix: Path, first_seqno: int, batches: Iterable[pa.RecordBatch], *, group: str,
                        log_bsn: Scn, between_files=None, layouts: dict | None = None,
                        versions: dict | None = None, claim: str = "") -> Iterator[TrailFileInfo]:
    """Write the files of a stream of record batches sorted by (`file_no`, commit order):
    the records of file number k become trail file `first_seqno + k`, with their rbas,
    transaction indicators, table versions (`versions`: with_table_versions) and the
    copy lines of the tables in `layouts`. `claim`: the writing run's claim on the trail
    (`claim`), checked before each file is published. `between_files`
    runs after each file but the last (a crash point). Yields each file's TrailFileInfo
    as it is written.

    Each file is written as its records come, a row group at a time: the writer holds a
    row group and the batch it is cut from, never a file or a transaction, however big.
    The copy lines are made per row group (a table whose inserted images do not all
    parse gets no lines in that row group), so a file's lines depend on its records
    alone, not on the batches they came in."""
    layouts = layouts or {}
    by_file = itertools.groupby(_split_by_file(batches), key=lambda numbered: numbered[0])
    for index, (number, parts) in enumerate(by_file):
        if index and between_files is not None:
            between_files()
        writer = _FileWriter(prefix, first_seqno + number, group=group, log_bsn=log_bsn, claim=claim)
        named: dict = {}
        with writer.cleanup():
            rba, previous = 0, None
            for records, following in _cut_row_groups(part for _, part in parts):
                keys = [records.column(name).to_numpy() for name in TRAIL_ORDER]
                # Cheap insurance that the stream really is in commit order: the trail's
                # whole contract rests on it.
                _check_sorted(keys if previous is None else
                              [np.concatenate([[before], column]) for before, column in zip(previous, keys)])
                csn_keys = keys[:len(CSN_COLUMNS)]
                indicators = transaction_indicators(
                    csn_keys, previous and previous[:len(CSN_COLUMNS)], following)
                previous = tuple(column[-1] for column in keys)
                records = records.drop_columns(["file_no"])
                records = records.append_column("trans_ind", pa.array(indicators, pa.int8()))
                records = records.append_column("rba", pa.array(np.arange(rba, rba + len(records), dtype=np.int64)))
                records = records.select([name for name in COLUMNS if name not in ("copy_line", "table_version")])
                if versions is not None:
                    records = with_table_versions(records, versions)
                lines, used = copytext.insert_lines(records, layouts)
                named.update(used)
                records = without_stale_lines(_set_copy_lines(records, lines, used), versions or {})
                writer.write(records)
                rba += len(records)
            yield writer.close(named)


def _split_by_file(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Each batch's runs of one `file_no`, with that number."""
    for batch in batches:
        numbers = batch.column("file_no").to_numpy()
        cuts = np.flatnonzero(numbers[1:] != numbers[:-1]) + 1
        for start, stop in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(batch)]])):
            yield int(numbers[start]), batch.slice(start, stop - start)


def _cut_row_groups(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[pa.Table, tuple | None]]:
    """The records of one file re-cut into its row groups (row_group_slices), each with
    the CSN of the record after it (None after the file's last): its last record's
    transaction indicator depends on it. Holds at most a row group and a batch."""
    lengths = (length for _, length in row_group_slices(1 << 62))
    pending: list[pa.RecordBatch] = []
    held, length = 0, next(lengths)
    for batch in batches:
        if not len(batch):
            continue
        pending.append(batch)
        held += len(batch)
        while held > length:  # a record past the row group: its CSN is known
            table = pa.Table.from_batches(pending)
            after = table.slice(length, 1).select(list(CSN_COLUMNS)).to_pylist()[0]
            yield table.slice(0, length), tuple(after[name] for name in CSN_COLUMNS)
            pending, held = table.slice(length).to_batches(), held - length
            length = next(lengths)
    if held:
        yield pa.Table.from_batches(pending), None


class TrailWriter:
    """Writes a commit-ordered stream of record batches into trail files from
    `start_seqno` on, rolling over between transactions once a file reaches `max_bytes`
    (measured as Arrow bytes; the file on disk is smaller, compressed), with the copy
    lines of the tables in `layouts`."""

    def __init__(self, prefix: Path, start_seqno: int, *, max_bytes: int, group: str, log_bsn: Scn,
                 layouts: dict | None = None, versions: dict | None = None):
        self.prefix, self.seqno, self.max_bytes = prefix, start_seqno, max_bytes
        self.group, self.log_bsn, self.layouts, self.versions = group, log_bsn, layouts or {}, versions
        self.files: list[TrailFileInfo] = []
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._last_key: tuple | None = None

    def _check_order(self, batch: pa.RecordBatch) -> None:
        # Cheap insurance that the stream really is in commit order: the trail's whole
        # contract rests on it.
        if not len(batch):
            return
        keys = [batch.column(name).to_numpy(zero_copy_only=False) for name in TRAIL_ORDER]
        if self._last_key is not None:
            keys = [np.concatenate([[previous], column]) for previous, column in zip(self._last_key, keys)]
        _check_sorted(keys)
        self._last_key = tuple(column[-1] for column in keys)

    def add(self, batch: pa.RecordBatch) -> None:
        self._check_order(batch)
        while len(batch):
            row_bytes = max(1, batch.nbytes // len(batch))
            room = max(0, self.max_bytes - self._pending_bytes)
            ends = pc.indices_nonzero(pc.is_in(batch.column("trans_ind"), pa.array([END, WHOLE], pa.int8())))
            ends = ends.to_numpy()
            past_limit = ends[(ends + 1) * row_bytes >= room]
            if not len(past_limit):  # no transaction ends past the limit in this batch: keep it all
                self._pending.append(batch)
                self._pending_bytes += batch.nbytes
                return
            cut = int(past_limit[0])
            self._pending.append(batch.slice(0, cut + 1))
            self._flush()
            batch = batch.slice(cut + 1)

    def _flush(self) -> None:
        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending)
        self._pending, self._pending_bytes = [], 0
        if len(table) == 0:
            return
        table = table.set_column(table.schema.get_field_index("rba"), "rba", pa.array(range(len(table)), pa.int64()))
        if self.versions is not None:
            table = with_table_versions(table, self.versions)
        if self.layouts:
            table = without_stale_lines(with_copy_lines(table, self.layouts), self.versions or {})
        self.files.append(write_file(self.prefix, self.seqno, table, group=self.group, log_bsn=self.log_bsn))
        self.seqno += 1

    def close(self) -> list[TrailFileInfo]:
        self._flush()
        return self.files


def transactions_in(table: pa.Table) -> int:
    """How many transactions a trail file's records hold: those that end in it (END or
    WHOLE). Files are cut between transactions, so every stage counts the same ones."""
    return int(pc.sum(pc.is_in(table.column("trans_ind"), pa.array([END, WHOLE], pa.int8()))).as_py() or 0)


def count_transactions(path: Path) -> int:
    """transactions_in of a local trail file, reading its indicator column only."""
    return transactions_in(pq.read_table(path, columns=["trans_ind"]))


def read_metadata(path: Path, *, source=None) -> dict:
    """The footer's trail metadata; `source` (bytes already read) stands for the file."""
    try:
        metadata = pq.read_schema(path if source is None else pa.BufferReader(source)).metadata
    except (OSError, pa.ArrowInvalid) as exc:
        raise TrailError(path, f"not a readable trail file: {_one_line(exc)}", rba=0) from None
    return _trail_metadata(path, metadata)


def _trail_metadata(path, metadata: dict | None) -> dict:
    if _METADATA_KEY not in (metadata or {}):
        raise TrailError(path, "not a trailbound trail file (no trail metadata)", rba=0)
    try:
        meta = json.loads(metadata[_METADATA_KEY])
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or not all(key in meta for key in ("records", "content_sha256", "seqno")):
        raise TrailError(path, "its trail metadata is not readable", rba=0)
    return meta


def _one_line(exc: Exception) -> str:
    """A library's error text on one line: the command line prints one ERROR line."""
    return " ".join(str(exc).split())


class Checksum:
    """A committed trail file's SHA-256, checked in a thread of its own once the file's
    first row group is decoded (read_parts_deferring_images(checksum=...)), so that the
    reader's first records wait neither for the whole file to be hashed (about 11 ms for
    a 14 MB file) nor for a CPU the hash holds. Until `verify()` has returned, the
    records are not known to be the committed ones: the reader calls it before anything
    it does with them lasts (a commit), and before it reports an error they led to (a
    damaged file's garbage is no error of its own)."""

    def __init__(self):
        self._pending: tuple[str, bytes, str] | None = None   # (path, the file's bytes, the recorded SHA-256)
        self._thread: threading.Thread | None = None
        self._mismatch: tuple[str, str] | None = None        # (path, message)
        self._lock = threading.Lock()

    def _hold(self, path: Path | str, data: bytes, expected: str) -> None:
        """The file's bytes as read, to check once the first row group is decoded."""
        self._pending = (str(path), data, expected)

    def _start(self) -> None:
        with self._lock:
            if self._pending is None or self._thread is not None:
                return
            path, data, expected = self._pending
            self._pending = None

            def check() -> None:
                actual = hashlib.sha256(data).hexdigest()  # releases the GIL
                if actual != expected:
                    self._mismatch = (path, _checksum_mismatch(actual, expected))
            self._thread = threading.Thread(target=check, name="trail-checksum", daemon=True)
            self._thread.start()

    def error(self) -> TrailError | None:
        """The file's error once its check is done, or None: it is the committed file, or
        was never read (nothing of it can have been used)."""
        self._start()  # if its reader stopped before starting it
        if self._thread is None:
            return None
        self._thread.join()
        return TrailError(self._mismatch[0], self._mismatch[1], rba=0) if self._mismatch else None

    def verify(self) -> None:
        if (error := self.error()) is not None:
            raise error


def _checksum_mismatch(actual: str, recorded: str) -> str:
    return (f"file checksum {actual} does not match the recorded {recorded}: the file is damaged or is not the one "
            "that was committed")


def _open(path: Path | str, *, fs, sha256: str | None,
          checksum: Checksum | None = None) -> tuple[pq.ParquetFile, dict]:
    """A trail file opened for reading, its footer parsed once and checked: format
    version, seqno against its name, and `sha256` (the whole file's, as recorded in
    trailbound.trail_file) before anything is decoded, or with `checksum`, beside."""
    source = None
    if fs is not None or sha256 is not None:
        from trailbound import files as trailfs

        source = (fs or trailfs.LOCAL).read_bytes(str(path))
        if sha256 is not None and checksum is not None:
            checksum._hold(path, source, sha256)
        elif sha256 is not None and (actual := hashlib.sha256(source).hexdigest()) != sha256:
            raise TrailError(path, _checksum_mismatch(actual, sha256), rba=0)
    try:
        # ParquetFile, not read_table: it reads a row group at a time (read_parts) and needs
        # no pyarrow.dataset. A file whose SHA-256 is the one recorded at commit is, byte
        # for byte, the file its writer checked: its page checksums cannot tell anything more.
        parquet = pq.ParquetFile(path if source is None else pa.BufferReader(source),
                                 page_checksum_verification=sha256 is None)
    except (OSError, pa.ArrowInvalid) as exc:
        raise TrailError(path, f"not a readable trail file: {_one_line(exc)}", rba=0) from None
    meta = _trail_metadata(path, parquet.schema_arrow.metadata)
    if meta.get("format_version") not in READABLE_VERSIONS:
        raise TrailError(path, f"trail format version {meta.get('format_version')} is not one of "
                               f"{', '.join(map(str, READABLE_VERSIONS))}", rba=0)
    name = str(path).rsplit("/", 1)[-1]
    seqno = name[-9:]
    # A pump's unfiltered copy keeps the source trail's footer, so only a file under its
    # own trail's name can be told to be in the wrong place.
    if seqno.isdigit() and name[:-9] == meta.get("trail") and meta["seqno"] != int(seqno):
        raise TrailError(path, f"its footer says trail seqno {meta['seqno']}, its name {int(seqno)}: a file copied "
                               "or renamed into the wrong place", rba=0)
    return parquet, meta


def _check_count(path, records: int, meta: dict) -> None:
    if records != meta["records"]:
        raise TrailError(path, f"holds {records} records, its metadata says {meta['records']}",
                         rba=min(records, meta["records"]))


def _check_rbas(path, table: pa.Table, first: int) -> None:
    """rbas count from 0 without a gap; `table` holds the records from rba `first` on."""
    rbas = table.column("rba").to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(rbas != np.arange(first, first + len(rbas)))
    if len(wrong):
        at = first + int(wrong[0])
        raise TrailError(path, f"record {at} carries rba {rbas[wrong[0]]}: rbas must count from 0 without a gap",
                         rba=at)


def read_file(path: Path | str, *, verify: bool = True, fs=None, sha256: str | None = None) -> pa.Table:
    """The records of a trail file; with `verify`, checked against its own metadata.

    `path` may be a trail location on another filesystem (an s3a:// or hdfs:// URI) read
    through `fs`, a `trailbound.files` file system. `sha256`, the whole file's SHA-256 as recorded in
    trailbound.trail_file, is checked before anything is decoded: a remote copy that is
    not the file that was committed stops the reader with the file's name."""
    parquet, meta = _open(path, fs=fs, sha256=sha256)
    try:
        table = _current(parquet.read(), parquet)
    except (OSError, pa.ArrowInvalid) as exc:
        raise TrailError(path, f"damaged trail file: {_one_line(exc)}", rba=0) from None
    if verify:
        _check_count(path, len(table), meta)
        # A committed file (its SHA-256 as recorded) needs no content digest: 0.08 s per
        # 300,000 records a replicat or pump run does not spend.
        if sha256 is None and _content_digest(table, meta["format_version"], copy_line_layouts(table)) \
                != meta["content_sha256"]:
            raise TrailError(path, "content checksum does not match its metadata", rba=0)
        _check_rbas(path, table, 0)
    return table


def _current(table: pa.Table, parquet: pq.ParquetFile) -> pa.Table:
    """Records read from `parquet` in this version's columns (an older version's file
    has no table_version, or no copy_line either), with the copy lines' layouts on the
    copy_line field, where every reader looks for them (copy_line_layouts): a version 4
    file has them in its footer, an older one on the field already."""
    table = table.replace_schema_metadata(None)
    if "table_version" not in table.schema.names:
        at = table.schema.get_field_index("copy_line") if "copy_line" in table.schema.names else table.num_columns
        table = table.add_column(at, "table_version", pa.nulls(len(table), pa.int32()))
    if "copy_line" not in table.schema.names:
        return table.append_column("copy_line", pa.nulls(len(table), pa.string()))
    field = table.schema.field("copy_line")
    footer = (parquet.schema_arrow.metadata or {}).get(_LAYOUTS_KEY)
    if footer is None or _LAYOUTS_KEY in (field.metadata or {}):
        return table
    return table.cast(table.schema.set(table.schema.get_field_index("copy_line"),
                                       field.with_metadata({_LAYOUTS_KEY: footer})))


def read_parts(path: Path | str, *, sha256: str, records: int, fs=None) -> Iterator[pa.Table]:
    """The records of a committed trail file, one Parquet row group at a time, so that
    the first records are used before the rest are decoded. Checked before the first
    part: the file's SHA-256 (`sha256`, as recorded), its footer, and its count against
    both the footer and `records` (as recorded); each part's rbas as it comes. So a wrong
    rba in a later part stops the reader after the earlier parts were used: only a
    writer can have put it there (the bytes are the committed ones), and what was used
    before it is correct."""
    for part, _ in _row_groups(path, sha256=sha256, records=records, fs=fs, images=True):
        yield part


def read_parts_deferring_images(path: Path | str, *, sha256: str, records: int, fs=None,
                                checksum: Checksum | None = None
                                ) -> Iterator[tuple[pa.Table, Callable[[], pa.ChunkedArray]]]:
    """read_parts without the after images: each part with a function that decodes them
    (from the bytes already read), for a reader that often needs none of them
    (replicat, for inserts that carry COPY lines) and decodes them only when it does.
    With `checksum`, the file's SHA-256 is checked there, beside the decoding, and the
    reader verifies it before its records lead to anything lasting (see Checksum)."""
    return _row_groups(path, sha256=sha256, records=records, fs=fs, images=False, checksum=checksum)


def _row_groups(path: Path | str, *, sha256: str, records: int, fs, images: bool,
                checksum: Checksum | None = None) -> Iterator[tuple[pa.Table, Callable[[], pa.ChunkedArray]]]:
    try:
        parquet, meta = _open(path, fs=fs, sha256=sha256, checksum=checksum)
        _check_count(path, parquet.metadata.num_rows, meta)
        if records != meta["records"]:
            raise TrailError(path, f"holds {meta['records']} records; the trail lists {records}",
                             rba=min(records, meta["records"]))
        columns = None if images else [name for name in parquet.schema_arrow.names if name != "after"]
        first = 0
        for number in range(parquet.num_row_groups):
            try:
                part = _current(parquet.read_row_group(number, columns=columns), parquet)
            except (OSError, pa.ArrowInvalid) as exc:
                raise TrailError(path, f"damaged trail file: {_one_line(exc)}", rba=first) from None
            if checksum is not None:
                checksum._start()
            _check_rbas(path, part, first)
            yield part, _image_decoder(parquet, number, path, first)
            first += len(part)
    finally:
        if checksum is not None:
            checksum._start()  # a reader that stops early still learns whether the file was the committed one


def _image_decoder(parquet: pq.ParquetFile, number: int, path, first: int) -> Callable[[], pa.ChunkedArray]:
    def decode() -> pa.ChunkedArray:
        try:
            return parquet.read_row_group(number, columns=["after"]).column("after")
        except (OSError, pa.ArrowInvalid) as exc:
            raise TrailError(path, f"damaged trail file: {_one_line(exc)}", rba=first) from None
    return decode


def read_columns(path: Path | str, columns: list[str], *, fs=None) -> Iterator[pa.Table]:
    """Some columns of a trail file, a row group at a time, for a reader that has already
    checked the file's bytes against its recorded SHA-256 (a pump counting its copy): no
    other check here, and memory bounded by a row group of those columns, not the file. A
    local file is read from disk as it goes; another filesystem's bytes are fetched whole."""
    from trailbound import files as trailfs

    location = str(path)
    source = trailfs.local_path(location) if trailfs.is_local(location) else pa.BufferReader(fs.read_bytes(location))
    try:
        parquet = pq.ParquetFile(source)
        for number in range(parquet.num_row_groups):
            yield parquet.read_row_group(number, columns=columns)
    except (OSError, pa.ArrowInvalid) as exc:
        raise TrailError(path, f"damaged trail file: {_one_line(exc)}", rba=0) from None


def iter_records(path: Path, from_rba: int = 0, count: int | None = None) -> Iterator[dict]:
    table = read_file(path)
    end = len(table) if count is None else min(len(table), from_rba + count)
    yield from table.slice(from_rba, max(0, end - from_rba)).to_pylist()


def existing_files(prefix: Path) -> Iterable[Path]:
    if not prefix.parent.is_dir():
        return []
    width = len(prefix.name) + 9
    return sorted(p for p in prefix.parent.iterdir()
                  if p.name.startswith(prefix.name) and len(p.name) == width and p.name[-9:].isdigit())
