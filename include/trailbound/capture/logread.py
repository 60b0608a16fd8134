"""The log a capture run reads, read by Spark tasks with pyarrow.

Spark's Parquet reader pays a fixed cost for every file it opens, and an archive is many
small segments: 3,000,000 simulated records in 1,584 segments took Spark 7.8 s to count
and 16.7 s to read in full on 2 cores, where pyarrow read them all in 3.4 s on one
(docs/benchmarks/capture.md). So each task of a run reads a contiguous run of segments
itself, keeps the records of the run's window (`ReadWindow`), and hands Spark only what
the pass needs:

- `summaries()`: per (thread, top-level xid, xid, restored), the aggregates assembly
  rolls up (first and last record, the end, the first ROLLBACK, counts and sizes),
  computed in the task: a row per xid and task crosses into the JVM, not every record;
- `records()`: the records themselves: all of them, only the captured tables' changes
  (the trail), or only some transactions' (Bounded Recovery persists them).

Restored records (persisted transactions' files) are read the same way and bypass the
window. JSON Lines segments are read by Spark's JSON reader (a writer may give before and
after as nested objects, which Spark renders as text) and then go through the same
functions, so there is one implementation of the window and of the summaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from trailbound import heartbeat
from trailbound.archive import contract, reader
from trailbound.archive.segments import Segment
from trailbound.errors import ArchiveError
from trailbound.positions import LogPosition, Scn
from trailbound.spark import numbered, parallelism
from trailbound.trail.format import FIXED_ROW_BYTES

# The records as every pass sees them: the contract's fields, where they were read
# (thread, sequence, file), the top-level transaction (txid) and whether a persisted
# object gave them (restored).
RECORDS = pa.schema([
    ("thread", pa.int32()), ("sequence", pa.int64()), ("rba", pa.int64()), ("scn", pa.int64()),
    ("ts", pa.timestamp("us", "UTC")), ("xid", pa.string()), ("parent_xid", pa.string()), ("op", pa.string()),
    ("table", pa.string()), ("before", pa.string()), ("after", pa.string()), ("file", pa.string()),
    ("txid", pa.string()), ("restored", pa.bool_()),
])

# Per (thread, txid, xid, restored) and part read: the first and last record (position, scn,
# time), the first top-level COMMIT/ROLLBACK (end_committed: a COMMIT), the first
# ROLLBACK (a savepoint's), the record count and size (UTF-8 bytes of the images), the
# captured records and their trail size, the records below the previous run's read SCN,
# the earliest time.
# Positions are packed (`packed`): one long per position, ordered as the position is.
SUMMARIES = pa.schema([
    ("thread", pa.int32()), ("txid", pa.string()), ("xid", pa.string()), ("restored", pa.bool_()),
    ("start_at", pa.int64()), ("start_scn", pa.int64()), ("start_ts", pa.timestamp("us", "UTC")),
    ("last_at", pa.int64()), ("last_scn", pa.int64()), ("last_ts", pa.timestamp("us", "UTC")),
    ("end_at", pa.int64()), ("end_scn", pa.int64()), ("end_ts", pa.timestamp("us", "UTC")),
    ("end_committed", pa.bool_()),
    ("rollback_at", pa.int64()),
    ("records", pa.int64()), ("bytes", pa.int64()), ("kept_records", pa.int64()), ("kept_bytes", pa.int64()),
    ("reread", pa.int64()), ("from_time", pa.timestamp("us", "UTC")),
])
RBA_BITS = 32  # an rba is below the segment's record count, at most 2**32 - 1 (archive.segments)


def packed(sequence, rba):
    """A log position (sequence, rba) as one long that orders as the pair does (a
    sequence has at most 9 digits); works on pyarrow arrays and on Spark columns."""
    if isinstance(sequence, str):
        return F.shiftleft(F.col(sequence).cast("long"), RBA_BITS) + F.col(rba)
    return pc.add(pc.shift_left(sequence, RBA_BITS), rba)


def unpacked(column: str) -> list:
    """The sequence and rba Spark columns of a packed position column."""
    return [F.shiftright(F.col(column), RBA_BITS).alias("sequence"),
            F.col(column).bitwiseAND(2**RBA_BITS - 1).alias("rba")]


# Records a task reads (about 60 MB of narrow rows in a summary task), and how many it
# reads before working on them.
_RECORDS_PER_TASK = 500_000
_RECORDS_PER_PART = 100_000


@dataclass(frozen=True)
class ReadWindow:
    """The log records a run reads: below the horizon; from the restart point on (at or
    above `from_scn`, and on the threads in `starts` from that position; no `from_scn`:
    from the archive's start); not those a persisted object already holds (`held`: per
    (thread, top-level xid), the last position its file has)."""

    horizon_scn: Scn
    from_scn: Scn | None = None
    starts: dict[int, LogPosition] = field(default_factory=dict)
    held: dict[tuple[int, str], LogPosition] = field(default_factory=dict)

    def keep(self, table: pa.Table) -> pa.Array:
        """A mask over `table` (records, txid set): the records in the window, and every
        restored one."""
        keep = pc.less(table["scn"], self.horizon_scn.value)
        if self.from_scn is not None:
            inside = pc.greater_equal(table["scn"], self.from_scn.value)
            for thread, at in self.starts.items():
                same_sequence = pc.equal(table["sequence"], at.sequence)
                later = pc.or_(pc.greater(table["sequence"], at.sequence),
                               pc.and_(same_sequence, pc.greater_equal(table["rba"], at.rba)))
                inside = pc.or_(inside, pc.and_(pc.equal(table["thread"], thread), later))
            keep = pc.and_(keep, inside)
        if self.held:
            candidates = pc.is_in(table["txid"], value_set=pa.array(sorted({x for _, x in self.held}), pa.string()))
            if pc.any(candidates).as_py():
                keep = pc.and_(keep, pc.invert(self._held_by_a_file(table, candidates)))
        return pc.or_(keep, table["restored"])

    def _held_by_a_file(self, table: pa.Table, candidates: pa.Array) -> pa.Array:
        held = [False] * len(table)
        rows = table.filter(candidates).select(["thread", "txid", "sequence", "rba"]).to_pylist()
        for index, row in zip(pc.indices_nonzero(candidates).to_pylist(), rows):
            through = self.held.get((row["thread"], row["txid"]))
            held[index] = through is not None and (row["sequence"], row["rba"]) <= (through.sequence, through.rba)
        return pa.array(held, pa.bool_())


@dataclass(frozen=True)
class _Input:
    """One file a task reads: a segment (Parquet) or a persisted object."""

    path: str
    thread: int
    sequence: int
    records: int
    restored: bool


class LogRead:
    """What one capture run reads: its segments within the window, and the persisted
    objects it restores. Each method is a DataFrame computed by Spark tasks."""

    def __init__(self, spark: SparkSession, segments: Sequence[Segment], restored_files: Sequence[Path],
                 window: ReadWindow):
        self.spark, self.window = spark, window
        self._jsonl = [s for s in segments if s.format == "jsonl" and s.records > 0]
        inputs = [_Input(str(s.path), s.thread, s.sequence, s.records, False)
                  for s in sorted(segments, key=lambda s: (s.thread, s.sequence))
                  if s.format == "parquet" and s.records > 0]
        inputs += [_Input(str(path), 0, 0, 1, True) for path in restored_files]
        self._inputs = inputs

    @property
    def inputs(self) -> list[_Input]:
        """The files the run reads (restored objects last), in log order per thread."""
        return list(self._inputs)

    def summaries(self, tables: list[str], read_scn: Scn | None) -> DataFrame:
        """Per (thread, txid, xid, restored), possibly several rows (one per part a task reads): SUMMARIES."""
        below = read_scn.value if read_scn is not None else None
        return self._map(lambda parts: _summarize(parts, tables, below), SUMMARIES, self._inputs)

    def records(self, *, captured: list[str] | None = None, transactions: Iterable[tuple[int, str]] | None = None,
                starts: dict[int, LogPosition] | None = None, columns: Sequence[str] | None = None) -> DataFrame:
        """The records (RECORDS, or `columns` of it): only the DML of the `captured` table
        patterns, or only those of the `transactions` (thread, txid). With `starts` (per
        thread, the earliest start of those transactions) no other segment is read."""
        wanted = None if transactions is None else sorted(set(transactions))
        inputs = self._inputs
        if starts is not None:
            inputs = [i for i in inputs
                      if i.restored or (i.thread in starts and i.sequence >= starts[i.thread].sequence)]
        names = list(columns or RECORDS.names)
        schema = pa.schema([RECORDS.field(n) for n in names])
        txids = None if wanted is None else pa.array(sorted({x for _, x in wanted}), pa.string())

        def select(parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
            matches = _captured_matcher(captured) if captured is not None else None
            keys = None if wanted is None else {(t, x) for t, x in wanted}
            for part in parts:
                if matches is not None:
                    part = part.filter(matches(part))
                if keys is not None:
                    part = part.filter(pc.is_in(part["txid"], value_set=txids))
                    if len(part):
                        pairs = zip(part["thread"].to_pylist(), part["txid"].to_pylist())
                        part = part.filter(pa.array([pair in keys for pair in pairs], pa.bool_()))
                if len(part):
                    yield part.select(names)
        jsonl = starts is None or any(s.thread in starts for s in self._jsonl)
        return self._map(select, schema, inputs, read_jsonl=jsonl, txids=txids)

    def _map(self, function: Callable[[Iterator[pa.Table]], Iterator[pa.Table]], schema: pa.Schema,
             inputs: list[_Input], read_jsonl: bool = True, txids: pa.Array | None = None) -> DataFrame:
        """`function` over the window's records of `inputs` (and of the JSON Lines
        segments), task by task."""
        output = spark_schema(schema)
        chunks, window = _chunks(inputs, parallelism(self.spark)), self.window

        def read_chunks(batches):
            for batch in batches:
                for number in batch.column(0).to_pylist():
                    parts = _read_parts(chunks[number], window, txids)
                    for table in function(p for p in parts if len(p)):
                        yield from table.to_batches(max_chunksize=65_536)
            # Spark reuses a Python worker for the run's next tasks (the trail write among
            # them): hand back what this one's parts took rather than keep it resident.
            pa.default_memory_pool().release_unused()

        frames = []
        if chunks:
            # One task per chunk. The planner takes this frame for a few bytes: every join of
            # it names its build side (see trailbound.spark.numbered).
            numbers = numbered(self.spark, len(chunks))
            frames.append(numbers.mapInArrow(read_chunks, output))
        if self._jsonl and read_jsonl:
            def from_spark(batches):
                parts = (_prepared([pa.Table.from_batches([b]).cast(_RECORDS_BEFORE_TXID)], window) for b in batches)
                for table in function(p for p in parts if len(p)):
                    yield from table.to_batches(max_chunksize=65_536)
            jsonl = reader.read_records(self.spark, self._jsonl).withColumn("restored", F.lit(False))
            frames.append(jsonl.select(*_RECORDS_BEFORE_TXID.names).mapInArrow(from_spark, output))
        if not frames:
            return self.spark.createDataFrame([], output)
        result = frames[0]
        for frame in frames[1:]:
            result = result.unionByName(frame)
        return result


_RECORDS_BEFORE_TXID = pa.schema([f for f in RECORDS if f.name != "txid"])


def _chunks(inputs: list[_Input], parallelism: int) -> list[list[_Input]]:
    """Contiguous runs of inputs (by thread and sequence), about _RECORDS_PER_TASK
    records each, at least one per core when there are enough files."""
    if not inputs:
        return []
    total = sum(i.records for i in inputs)
    tasks = min(len(inputs), max(parallelism, -(-total // _RECORDS_PER_TASK)))
    size = total / tasks
    chunks: list[list[_Input]] = [[]]
    counted = 0
    for item in inputs:
        if chunks[-1] and counted >= size * len(chunks):
            chunks.append([])
        chunks[-1].append(item)
        counted += item.records
    return chunks


def spark_schema(schema: pa.Schema) -> T.StructType:
    types = {pa.int32(): T.IntegerType(), pa.int64(): T.LongType(), pa.string(): T.StringType(),
             pa.bool_(): T.BooleanType(), pa.timestamp("us", "UTC"): T.TimestampType()}
    return T.StructType([T.StructField(f.name, types[f.type]) for f in schema])


def _read_parts(chunk: list[_Input], window: ReadWindow, txids: pa.Array | None = None) -> Iterator[pa.Table]:
    """A chunk's records in the window (a persisted object's: all of them), about
    _RECORDS_PER_PART at a time: small files are read a few together (each file costs a
    read, and everything else is done once per part: per-file compute calls took longer
    than the reads), a large one a part at a time, so that a task holds one part's
    records whatever the size of a segment or of a transaction. With `txids`, a segment
    none of whose records belongs to one of them is read no further."""
    pending, count = [], 0
    for item in chunk:
        if txids is not None and not item.restored and not _holds_any(item, txids):
            continue
        if item.restored:
            # A persisted transaction may be any size: a row group (a Spark batch when it
            # was persisted) at a time.
            for group in _restored_row_groups(item):
                yield _prepared([group], window)
            continue
        for table in _file_parts(item):
            pending.append(table)
            count += len(table)
            if count >= _RECORDS_PER_PART:
                yield _prepared(pending, window)
                pending, count = [], 0
    if pending:
        yield _prepared(pending, window)


def _holds_any(item: _Input, txids: pa.Array) -> bool:
    """Whether a segment has a record of one of `txids` (its two id columns read alone)."""
    import pyarrow.parquet as pq

    try:
        ids = pq.ParquetFile(item.path).read(columns=["xid", "parent_xid"], use_threads=False)
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise ArchiveError(Path(item.path), f"cannot read it: {exc}") from None
    return pc.any(pc.is_in(pc.coalesce(ids["parent_xid"], ids["xid"]), value_set=txids)).as_py() is True


def _restored_row_groups(item: _Input) -> Iterator[pa.Table]:
    """A persisted object's records as _RECORDS_BEFORE_TXID, one row group at a time."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(item.path)
        for number in range(parquet.num_row_groups):
            table = _cast(parquet.read_row_group(number, columns=reader.RECORD_COLUMNS, use_threads=False),
                          _RECORDS_BEFORE_TXID.names[:-1])
            yield table.append_column("restored", pa.repeat(True, len(table)))
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise ArchiveError(Path(item.path), f"cannot read it: {exc}") from None


def _file_parts(item: _Input) -> Iterator[pa.Table]:
    """A segment's records as _RECORDS_BEFORE_TXID, at most _RECORDS_PER_PART at a time."""
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(item.path).iter_batches(batch_size=_RECORDS_PER_PART,
                                                         columns=list(contract.RECORD_FIELDS), use_threads=False)
        for batch in batches:
            table = _cast(pa.Table.from_batches([batch]), contract.RECORD_FIELDS)
            n = len(table)
            yield pa.Table.from_arrays(
                [pa.repeat(pa.scalar(item.thread, pa.int32()), n), pa.repeat(pa.scalar(item.sequence, pa.int64()), n),
                 *table.columns, pa.repeat(Path(item.path).name, n), pa.repeat(False, n)],
                schema=_RECORDS_BEFORE_TXID)
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise ArchiveError(Path(item.path), f"cannot read it: {exc}") from None


def _cast(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """The columns `names` in RECORDS' types (another writer's int32 or nanoseconds are
    widened or truncated as Spark's reader would)."""
    table = table.select(list(names))
    wanted = pa.schema([RECORDS.field(n) for n in names])
    if table.schema.equals(wanted):
        return table
    return pa.table({f.name: table[f.name].cast(f.type, safe=f.name != "ts") for f in wanted})


def _prepared(tables: list[pa.Table], window: ReadWindow) -> pa.Table:
    table = _with_txid(pa.concat_tables(tables))
    return table.filter(window.keep(table))


def _with_txid(table: pa.Table) -> pa.Table:
    txid = pc.coalesce(table["parent_xid"], table["xid"])
    return table.add_column(RECORDS.get_field_index("txid"), "txid", txid)


def _captured_matcher(patterns: list[str]) -> Callable[[pa.Table], pa.Array]:
    """A mask: DML records of a table the patterns match, or of a heartbeat table
    (heartbeat.selection; the distinct names of a batch are matched once each)."""
    pattern = heartbeat.selection(patterns)
    dml = pa.array(contract.DML_OPS, pa.string())

    def matches(table: pa.Table) -> pa.Array:
        names = [n for n in pc.unique(table["table"]).to_pylist() if n is not None and pattern.fullmatch(n)]
        return pc.and_(pc.is_in(table["op"], value_set=dml),
                       pc.is_in(table["table"], value_set=pa.array(names, pa.string())))
    return matches


def _octets(column) -> pa.Array:
    return pc.fill_null(pc.binary_length(column), 0).cast(pa.int64())


def _summarize(parts: Iterator[pa.Table], tables: list[str], below: int | None) -> Iterator[pa.Table]:
    """SUMMARIES rows for one task's records (see SUMMARIES), part by part: a task holds
    one part's records, never its whole chunk of the log (assembly rolls up the rows of
    a transaction however many there are)."""
    captured = _captured_matcher(tables)
    for part in parts:
        kept = captured(part)
        size = pc.add(_octets(part["before"]), _octets(part["after"]))
        row_bytes = FIXED_ROW_BYTES
        for name in ("txid", "op", "table", "before", "after"):
            row_bytes = pc.add(row_bytes, _octets(part[name]))
        reread = pc.less(part["scn"], below) if below is not None else pa.repeat(False, len(part))
        yield _summary(pa.table({
            "thread": part["thread"], "txid": part["txid"], "xid": part["xid"], "restored": part["restored"],
            "at": packed(part["sequence"], part["rba"]), "scn": part["scn"], "ts": part["ts"], "op": part["op"],
            "top_level": pc.is_null(part["parent_xid"]), "size": size.cast(pa.int64()), "kept": kept.cast(pa.int64()),
            "kept_bytes": pc.if_else(kept, row_bytes, 0).cast(pa.int64()),
            "reread": pc.and_(reread, pc.invert(part["restored"])).cast(pa.int64())}))


def _summary(table: pa.Table) -> pa.Table:
    """SUMMARIES rows of one part's records, narrowed to what they need."""
    # Log order within each thread: the first and last aggregates below follow it.
    table = table.take(pc.sort_indices(table, [("thread", "ascending"), ("at", "ascending")]))
    keys = ["thread", "txid", "xid", "restored"]
    at = ["at", "scn", "ts"]
    whole = table.group_by(keys, use_threads=False).aggregate(
        [(c, "first") for c in at] + [(c, "last") for c in at]
        + [([], "count_all"), ("size", "sum"), ("kept", "sum"), ("kept_bytes", "sum"), ("reread", "sum"),
           ("ts", "min")])
    whole = whole.rename_columns(keys + [f"start_{c}" for c in at] + [f"last_{c}" for c in at]
                                 + ["records", "bytes", "kept_records", "kept_bytes", "reread", "from_time"])
    top_level_end = pc.and_(pc.is_in(table["op"], value_set=pa.array(contract.END_OPS, pa.string())),
                            table["top_level"])
    ends = table.filter(top_level_end)
    ends = ends.append_column("committed", pc.equal(ends["op"], "COMMIT"))
    ends = ends.group_by(keys, use_threads=False).aggregate([(c, "first") for c in ("at", "scn", "ts", "committed")])
    ends = ends.rename_columns(keys + ["end_at", "end_scn", "end_ts", "end_committed"])
    rollbacks = table.filter(pc.equal(table["op"], "ROLLBACK")).group_by(keys, use_threads=False).aggregate(
        [("at", "first")])
    rollbacks = rollbacks.rename_columns(keys + ["rollback_at"])
    result = whole.join(ends, keys, join_type="left outer").join(rollbacks, keys, join_type="left outer")
    return result.select(SUMMARIES.names).cast(SUMMARIES)
