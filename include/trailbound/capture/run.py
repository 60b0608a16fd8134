"""One capture (Extract) run: catalog new segments, read from the restart position to the
horizon, assemble transactions, write the trail, commit the checkpoints.

Each run is, in GoldenGate terms, a restart of Extract with normal recovery: it re-reads
each thread from its recovery checkpoint (the start of its oldest open transaction, or
where the last run stopped), rebuilds every open transaction from the log, and drops
transactions already written (CSN at or below the write checkpoint).

Crash safety: trail files are written before the metadata commit and are invisible
until it; a re-run deletes whatever lies past the committed write checkpoint and writes
it again. `crashpoint(name)` lets tests kill the job at each named step.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from trailbound.archive import reader
from trailbound.archive.catalog import AVAILABLE, ArchiveCatalog
from trailbound.capture import checkpoints as ckpt
from trailbound.capture.assemble import OPEN, SKIP, WRITE, Decisions, assemble
from trailbound.capture.begin import resolve_begin
from trailbound.config import Config
from trailbound.crash import crashpoint
from trailbound.errors import ArchiveError, TrailboundError
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn
from trailbound import trail as trails

CRASH_POINTS = ("before_trail_write", "mid_trail_write", "after_trail_write", "after_checkpoint_commit")


class GroupBusy(TrailboundError):
    pass


class group_lock:
    """Holds the group for the whole run (a session advisory lock, released by the server
    if the process dies). `alter extract` takes the same lock and is refused while held."""

    def __init__(self, store: MetadataStore, group: str):
        self.store, self.key = store, f"extract:{group.upper()}"

    def __enter__(self):
        with self.store.transaction() as cur:
            cur.execute("SELECT pg_try_advisory_lock(hashtext(%s)) AS got", (self.key,))
            if not cur.fetchone()["got"]:
                raise GroupBusy(f"{self.key.split(':')[1]} is held by a running capture; try again when it ends")
        return self

    def __exit__(self, *exc):
        if not self.store.connection.closed:
            with self.store.transaction() as cur:
                cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", (self.key,))


class Stopwatch:
    """Seconds spent per phase of a run, for `where the time goes` in benchmarks."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now


@dataclass
class RunResult:
    group: str
    horizon_scn: int | None
    records_read: int = 0
    transactions_written: int = 0
    records_written: int = 0
    files: list[trails.TrailFileInfo] = field(default_factory=list)
    open_transactions: int = 0
    note: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        if self.note:
            return f"Extract {self.group}: {self.note}"
        files = ", ".join(f.path.name for f in self.files) or "no trail file"
        return (f"Extract {self.group}: read {self.records_read} records below scn {self.horizon_scn}, wrote "
                f"{self.transactions_written} transactions ({self.records_written} records) to {files}; "
                f"{self.open_transactions} transaction(s) open")


def _table_spec(tables: list[str]) -> str:
    return ",".join(tables)


def ensure_group(store: MetadataStore, config: Config, group: str, begin: str | None = None) -> ckpt.ExtractState:
    """The group's state, adding it (ADD EXTRACT) with the configured begin point if new."""
    name = config.extract_name(group)
    extract = config.extract(name)
    source = config.source_name(extract.source)
    exttrail = config.path(extract.exttrail)
    with store.transaction() as cur:
        state = ckpt.load(cur, name)
    if state is not None:
        if (state.source, state.exttrail) != (source, exttrail):
            raise TrailboundError(
                f"extract {name} was added reading source {state.source} into trail {state.exttrail}; the "
                f"configuration now says source {source}, trail {exttrail}. Restore the configuration, or "
                f"`trailbound delete extract {name}` and add it again")
        return state
    catalog = ArchiveCatalog(store, source)
    spec = begin or extract.begin
    begin_scn = resolve_begin(spec, catalog.segments())
    with store.transaction() as cur:
        ckpt.add_group(cur, group=name, source=source, exttrail=exttrail, begin_scn=begin_scn,
                       begin_spec=spec, table_spec=_table_spec(extract.table))
        return ckpt.load(cur, name)


def _read_filter(state: ckpt.ExtractState):
    """Which records a run re-reads: per thread, from the start of its oldest open
    transaction (to rebuild it), else from where the last run stopped (read_scn)."""
    if state.read_scn is None:
        return F.lit(True)
    oldest: dict[int, ckpt.ReadCheckpoint] = {}
    for txn in state.open:
        if txn.skip_reason is None:
            current = oldest.get(txn.thread)
            if current is None or txn.start.position < current.position:
                oldest[txn.thread] = txn.start
    condition = F.col("scn") >= F.lit(state.read_scn)
    for thread, start in oldest.items():
        from_start = (F.col("thread") == thread) & (
            (F.col("sequence") > start.sequence) | ((F.col("sequence") == start.sequence) & (F.col("rba") >= start.rba)))
        condition = condition | from_start
    return condition


def _segments_to_read(entries, state: ckpt.ExtractState, horizon_scn: int):
    lower: dict[int, int] = {}
    for txn in state.open:
        if txn.skip_reason is None:
            lower[txn.thread] = min(lower.get(txn.thread, txn.start.scn), txn.start.scn)
    chosen = []
    for entry in entries:
        s = entry.segment
        floor = min(lower.get(s.thread, state.read_scn), state.read_scn) if state.read_scn is not None else None
        if s.first_scn >= horizon_scn or (floor is not None and s.next_scn <= floor) or s.records == 0:
            continue
        if floor is None and entry.state != AVAILABLE and s.next_scn <= state.begin_scn:
            continue  # a first run needs nothing purged below its begin point
        if entry.state != AVAILABLE or not s.path.exists():
            needed = floor if floor is not None else s.first_scn
            raise ArchiveError(s.path, f"missing log segment thread {s.thread} sequence {s.sequence}, needed from "
                                       f"scn {needed} for extract {state.group}; restore it to the archive directory "
                                       f"or alter extract {state.group} begin after it")
        chosen.append(s)
    return chosen


def run_extract(spark, store: MetadataStore, config: Config, group: str, *, until: datetime | None = None) -> RunResult:
    name = config.extract_name(group)
    extract = config.extract(name)
    with group_lock(store, name):
        started_at = datetime.now(timezone.utc)
        watch = Stopwatch()
        source = config.source_name(extract.source)
        catalog = ArchiveCatalog(store, source)
        catalog.scan(config.archive_dir(source), spark)
        watch.lap("scan new segments")
        state = ensure_group(store, config, name)
        state.last_started = started_at
        horizon = catalog.horizon(until)
        if horizon is None or (state.read_scn is not None and horizon.scn.value <= state.read_scn):
            return RunResult(name, horizon.scn.value if horizon else None,
                             note="nothing new below the horizon" + (f" archived by {until:%Y-%m-%d %H:%M:%S}" if until else ""))
        horizon_scn = horizon.scn.value
        segments = _segments_to_read(catalog.entries(), state, horizon_scn)
        log_bsn = state.recovery_scn() if state.read_scn is not None else state.begin_scn
        records = (reader.read_records(spark, segments)
                   .where((F.col("scn") < F.lit(horizon_scn)) & _read_filter(state))
                   .cache())
        try:
            return _assemble_and_commit(spark, store, config, state, extract, records, segments, horizon_scn,
                                        until, started_at, log_bsn, watch)
        finally:
            records.unpersist()


def _assemble_and_commit(spark, store, config, state, extract, records, segments, horizon_scn, until, started_at,
                         log_bsn, watch: Stopwatch) -> RunResult:
    decisions = Decisions(read_scn=state.read_scn, begin_scn=state.begin_scn, last_written=state.write.last_csn,
                          skips=[(t.thread, t.xid, t.skip_reason) for t in state.open if t.skip_reason])
    assembly = assemble(spark, records, decisions, extract.table, log_bsn)
    txns = assembly.transactions.cache()
    broken = assembly.broken.limit(1).count()
    watch.lap("read and group transactions")
    if broken:
        bad = assembly.violations().orderBy("thread", "sequence", "rba").limit(1).collect()[0]
        path = next((s.path for s in segments if s.path.name == bad["file"]), bad["file"])
        raise ArchiveError(path, bad["message"], rba=bad["rba"])

    prefix = state.exttrail
    _remove_uncommitted_files(store, prefix, state.write.seqno)
    staging = prefix.parent / f".staging-{state.group}"
    shutil.rmtree(staging, ignore_errors=True)
    assembly.trail.write.mode("overwrite").parquet(str(staging))
    watch.lap("order committed records (Spark)")
    crashpoint("before_trail_write")
    writer = trails.TrailWriter(prefix, state.write.seqno + 1, max_bytes=int(extract.megabytes * 1024 * 1024),
                                group=state.group, log_bsn=log_bsn)
    for part in sorted(staging.glob("part-*.parquet")):
        for batch in pq.ParquetFile(part).iter_batches(batch_size=65536, columns=[c for c in trails.COLUMNS if c != "rba"]):
            batch = batch.add_column(0, "rba", pa.array([0] * len(batch), pa.int64()))
            writer.add(batch)
            if writer.files:
                crashpoint("mid_trail_write")
    files = writer.close()
    watch.lap("write trail files")
    crashpoint("after_trail_write")

    fates = {row["fate"]: row["n"] for row in txns.groupBy("fate").agg(F.count(F.lit(1)).alias("n")).collect()}
    open_rows = txns.where(F.col("fate").isin(OPEN) | ((F.col("fate") == SKIP) & F.col("end").isNull())).collect()
    per_thread = records.groupBy("thread").agg(
        F.max(F.struct("sequence", "rba", "scn", "ts", "file")).alias("last"),
        F.min(F.struct("sequence", "rba", "scn", "ts", "file")).alias("first"),
        F.count(F.lit(1)).alias("n")).collect()

    # A skipped transaction with no record in this run's range is still open: carry it.
    seen = {(row["thread"], row["txid"]) for row in txns.join(
        spark.createDataFrame(decisions.skips, "thread int, txid string, reason string"), ["thread", "txid"])
        .select("thread", "txid").collect()}
    carried = [t for t in state.open if t.skip_reason and (t.thread, t.xid) not in seen]
    state.open = carried + [ckpt.OpenTransaction(row["txid"], row["thread"],
                                       ckpt.ReadCheckpoint(row["thread"], row["start"]["sequence"], row["start"]["rba"],
                                                           row["start"]["scn"], row["start"]["ts"]),
                                       row["records"], row["bytes"] or 0, row["skip_reason"]) for row in open_rows]
    for row in per_thread:
        last, first = row["last"], row["first"]
        current = ckpt.ReadCheckpoint(row["thread"], last["sequence"], last["rba"], last["scn"], last["ts"], last["file"])
        state.read["current"][row["thread"]] = current
        state.read["startup"].setdefault(row["thread"], ckpt.ReadCheckpoint(
            row["thread"], first["sequence"], first["rba"], first["scn"], first["ts"], first["file"]))
    for thread, current in state.read["current"].items():
        starts = [t.start for t in state.open if t.thread == thread and t.skip_reason is None]
        oldest = min(starts, key=lambda s: s.position) if starts else current
        state.read["recovery"][thread] = ckpt.ReadCheckpoint(thread, oldest.sequence, oldest.rba, oldest.scn,
                                                             oldest.ts, oldest.segment or current.segment)
    if files:
        state.write = ckpt.WriteCheckpoint(files[-1].seqno, files[-1].records, files[-1].last_csn)
    read_from = state.read_scn
    state.read_scn = horizon_scn
    state.table_spec = _table_spec(extract.table)
    records_read = sum(row["n"] for row in per_thread)
    records_written = sum(f.records for f in files)
    with store.transaction() as cur:
        ckpt.commit_run(cur, state, files, {"started_at": started_at, "until": until, "read_from_scn": read_from,
                                            "horizon_scn": horizon_scn, "records_read": records_read,
                                            "transactions": fates.get(WRITE, 0), "records_written": records_written})
    watch.lap("checkpoints")
    crashpoint("after_checkpoint_commit")
    txns.unpersist()
    shutil.rmtree(staging, ignore_errors=True)
    return RunResult(state.group, horizon_scn, records_read, fates.get(WRITE, 0), records_written, files,
                     len(state.open), timings=watch.phases)


def _remove_uncommitted_files(store: MetadataStore, prefix: Path, committed_seqno: int) -> None:
    """Trail files past the committed write checkpoint are leftovers of a run that died
    before its commit: no reader can see them; remove them before writing again."""
    for path in trails.existing_files(prefix):
        if int(path.name[-9:]) > committed_seqno:
            path.unlink()
