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

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pyspark.sql import functions as F

from trailbound import copytext, runcounts
from trailbound.archive.catalog import AVAILABLE, ArchiveCatalog, Horizon, PendingScan, compute_horizon
from trailbound.archive.segments import Segment, load_defs, versions_of
from trailbound.capture import bounded
from trailbound.capture import checkpoints as ckpt
from trailbound.capture import onetask, recovery, trailwrite
from trailbound.capture.assemble import OPEN, SKIP, Decisions, assemble
from trailbound.capture.begin import resolve_begin
from trailbound.capture.logread import LogRead, ReadWindow
from trailbound.config import Config, ExtractConfig
from trailbound.crash import crashpoint
from trailbound.durable import atomic_write
from trailbound.errors import ArchiveError, changed_since_added
from trailbound.ggsci import utc
from trailbound.grouplock import GroupLock
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, LogPosition, Scn, TrailPosition
from trailbound.spark import run_tasks
from trailbound.tables import table_spec
from trailbound.trail import format as trails

CRASH_POINTS = ("before_trail_write", "mid_trail_write", "after_trail_write", "after_br_persist",
                "after_checkpoint_commit", "before_new_version_write", "after_new_version_write")


def group_lock(store: MetadataStore, group: str) -> GroupLock:
    """Holds the extract group for the whole run; `alter extract` and `delete extract`
    take it too and are refused while a capture holds it."""
    return GroupLock(store, "extract", group)


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
    horizon_scn: Scn | None
    records_read: int = 0
    transactions_written: int = 0
    records_written: int = 0
    files: list[trails.TrailFileInfo] = field(default_factory=list)
    open_transactions: int = 0
    note: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    recovery: str = ""
    restart: str = ""
    br_checkpoint: bool = False
    assembly: str = ""  # how the records became the trail: by one task (capture.onetask), or grouped, and why

    def describe(self) -> str:
        if self.note:
            return f"Extract {self.group}: {self.note}"
        files = ", ".join(f.path.name for f in self.files) or "no trail file"
        return (f"Extract {self.group}: {self.recovery} recovery, {self.restart}: read {self.records_read} records below scn "
                f"{self.horizon_scn}, wrote {self.transactions_written} transactions ({self.records_written} records) "
                f"to {files}; {self.open_transactions} transaction(s) open"
                + ("; BR checkpoint taken" if self.br_checkpoint else "")
                + (f"; records {self.assembly}" if self.assembly else ""))


def _utc(value: datetime | None) -> datetime | None:
    """Spark hands timestamps back naive (in the session's UTC zone); make them aware."""
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


def _read_checkpoint(thread: int, at, segment: str | None = None) -> ckpt.ReadCheckpoint:
    """A read checkpoint from a Spark struct of the record there (sequence, rba, scn, ts)."""
    return ckpt.ReadCheckpoint(LogPosition(thread, at["sequence"], at["rba"]), Scn(at["scn"]), _utc(at["ts"]), segment)


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
            raise changed_since_added(f"extract {name}", f"reading source {state.source} into trail {state.exttrail}",
                                      f"source {source}, trail {exttrail}",
                                      f"`trailbound delete extract {name}` and add it again")
        return state
    catalog = ArchiveCatalog(store, source)
    spec = begin or extract.begin
    begin_scn = resolve_begin(spec, catalog.segments())
    with store.transaction() as cur:
        ckpt.add_group(cur, group=name, source=source, exttrail=exttrail, begin_scn=begin_scn,
                       begin_spec=spec, table_spec=table_spec(extract.table))
        return ckpt.load(cur, name)


def _read_window(restart: recovery.RestartPoint, horizon_scn: Scn, plan: recovery.RecoveryPlan) -> ReadWindow:
    """The records a run reads: below the horizon, at or above the restart SCN (and on the
    threads with an earlier start, from that position on), except those a persisted
    object it restores already holds."""
    return ReadWindow(horizon_scn, restart.from_scn,
                      {thread: start.position for thread, start in restart.starts.items()},
                      {(t.thread, t.xid): t.persisted.through for t in plan.restored})


def _segments_to_read(entries, state: ckpt.ExtractState, restart: recovery.RestartPoint, horizon_scn: Scn):
    chosen = []
    for entry in entries:
        s = entry.segment
        floor = restart.floor(s.thread)
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


def _directive_targets(state: ckpt.ExtractState, kind: str) -> list[tuple[ckpt.Directive, int]]:
    """(directive, thread) for pending skiptrans/forcetrans directives."""
    targets = []
    for directive in state.directives:
        if directive.kind == kind:
            thread = directive.thread
            if thread is None:
                thread = next((t.thread for t in state.open if t.xid == directive.xid), 0)
            targets.append((directive, thread))
    return targets


def run_extract(spark, store: MetadataStore, config: Config, group: str, *, until: datetime | None = None,
                brreset: bool = False, one_task: bool = True, cache_bytes: int = onetask.CACHE_BYTES) -> RunResult:
    """One capture run of `group` up to the archive's horizon (or what was archived by
    `until`). `one_task=False` always groups the records by transaction (see
    capture.onetask; tests and benchmarks compare the two paths); `cache_bytes` sets the
    one task's budget of decoded segments (tests: a tiny one makes it read them again)."""
    name = config.extract_name(group)
    extract = config.extract(name)
    with group_lock(store, name):
        started_at = datetime.now(timezone.utc)
        watch = Stopwatch()
        source = config.source_name(extract.source)
        catalog = ArchiveCatalog(store, source)
        # The new segments' checks can run in the one task's job (capture.onetask): a
        # group already added, written by the one task, checks them there, and nothing
        # is cataloged or committed unless they pass. Otherwise they are checked first.
        scan = catalog.begin_scan(config.archive_dir(source))
        with store.transaction() as cur:
            known_group = ckpt.load(cur, name) is not None
        if not (known_group and one_task and scan.files_present()):
            scan.finish(spark)
            watch.lap("scan new segments")
        state = ensure_group(store, config, name)
        state.last_started = started_at
        entries = scan.entries()
        horizon = compute_horizon([entry.segment for entry in entries], until)
        if horizon is None or (state.read_scn is not None and horizon.scn <= state.read_scn):
            scan.finish(spark)
            return RunResult(name, horizon.scn if horizon else None,
                             note="nothing new below the horizon" + (f" archived by {utc(until)}" if until else ""))
        horizon_scn = horizon.scn
        brreset = brreset or recovery.brreset_pending(state)
        plan = recovery.plan(state, extract, brreset=brreset)
        restart = recovery.restart_point(state, plan)
        segments = _segments_to_read(entries, state, restart, horizon_scn)
        log_bsn = recovery.normal_restart_scn(state)
        log = LogRead(spark, segments, [t.persisted.file for t in plan.restored],
                      _read_window(restart, horizon_scn, plan))
        run = _Run(state=state, extract=extract, plan=plan, restart=restart, brreset=brreset, log=log,
                   segments=segments, horizon=horizon, until=until, log_bsn=log_bsn, started_at=started_at,
                   watch=watch, scan=scan, assembly_note="" if one_task else "one task turned off",
                   cache_bytes=cache_bytes)
        return _assemble_and_commit(spark, store, config, run)


@dataclass
class _Run:
    """What a run has settled before it reads: the group's state, its recovery (plan,
    restart point, whether brreset applies), the log to read (segments, window, up to
    which horizon) and the run's own bookkeeping."""

    state: ckpt.ExtractState
    extract: ExtractConfig
    plan: recovery.RecoveryPlan
    restart: recovery.RestartPoint
    brreset: bool
    log: LogRead
    segments: list[Segment]
    horizon: Horizon
    until: datetime | None
    log_bsn: Scn
    started_at: datetime
    watch: Stopwatch
    scan: PendingScan               # the new segments, cataloged once their checks pass
    assembly_note: str = ""  # why the run was not written by one task (capture.onetask)
    cache_bytes: int = onetask.CACHE_BYTES  # the one task's budget of decoded segments


@dataclass
class _Outcome:
    """What the driver needs of a run's assembly, collected in one Spark action (each
    action over the cached roll-up costs its planning and generated code): whether the log breaks the
    contract, the trail files to write, the transactions still open (with the forced
    ones) and what was read per thread."""

    broken: bool
    files: dict[int, dict]
    open_rows: list
    log_reads: list

    @classmethod
    def collect(cls, assembly, max_bytes: int) -> "_Outcome":
        txns = assembly.transactions
        parts = {
            "broken": assembly.broken.limit(1).select(),
            "file": trailwrite.file_plan(assembly.written, max_bytes),
            "open": txns.where(F.col("fate").isin(OPEN) | ((F.col("fate") == SKIP) & F.col("end").isNull())
                               | F.col("forced")).select("thread", "txid", "start", "end", "records", "bytes",
                                                         "skip_reason", "forced"),
            "read": assembly.log_reads,
        }
        frames = [frame.withColumn("part", F.lit(part)) for part, frame in parts.items()]
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame, allowMissingColumns=True)
        rows: dict[str, list] = {part: [] for part in parts}
        for row in union.collect():
            rows[row["part"]].append(row)
        return cls(bool(rows["broken"]), trailwrite.planned_files(rows["file"]), rows["open"], rows["read"])


@dataclass
class _Trail:
    """What writing a run's trail leaves for its commit: the files and their operations per
    table, the transactions written, the transactions still open, what was read per thread,
    which carried skips were seen again, and how the records were assembled."""

    files: list[trails.TrailFileInfo]
    counts: runcounts.TableCounts
    transactions: int
    open_rows: list
    log_reads: list
    seen: set
    assembly: str


def _assemble_and_write(spark, store: MetadataStore, config: Config, run: _Run, decisions: Decisions) -> _Trail:
    """The general path: records grouped by transaction (capture.assemble), the trail
    planned and written by Spark tasks (capture.trailwrite)."""
    state, extract, watch = run.state, run.extract, run.watch
    run.scan.finish(spark)
    assembly = assemble(spark, run.log, decisions, extract.table, run.log_bsn)
    # On a Spark Connect server the cache outlives the session: a run that fails must
    # still give back what it cached (one killed leaves it until the server restarts).
    try:
        outcome = _Outcome.collect(assembly, int(extract.megabytes * 1024 * 1024))
        watch.lap("read and group transactions, plan trail files (Spark)")
        if outcome.broken:
            bad = assembly.violations().orderBy("thread", "sequence", "rba").limit(1).collect()[0]
            path = next((s.path for s in run.segments if s.path.name == bad["file"]), bad["file"])
            raise ArchiveError(path, bad["message"], rba=bad["rba"])

        prefix = state.exttrail
        _remove_uncommitted_files(store, prefix, state.write.position.seqno)
        expected = outcome.files
        crashpoint("before_trail_write")
        # defs.json read after the segments were cataloged: it holds every version they use
        layouts, versions = _copy_line_layouts(config, extract)
        # A run whose trail holds the first transactions of a table version (a crash test's
        # steps around them; a kill anywhere here leaves nothing committed).
        new_version = _writes_a_new_version(versions, state.write.last_csn, expected)
        if new_version:
            crashpoint("before_new_version_write")
        trail = assembly.trail(trailwrite.file_number(expected)) if expected else None
        files, counts = trailwrite.write_files(spark, trail, expected, prefix, state.write.position.seqno + 1,
                                               group=state.group, log_bsn=run.log_bsn, layouts=layouts,
                                               versions=versions)
        watch.lap("write trail files (Spark tasks)")
        if new_version:
            crashpoint("after_new_version_write")
        crashpoint("after_trail_write")

        # Carried skips seen again this run. (No join without skips: Spark answers a join
        # with an empty side at once but leaves the other side's stage running, a second of
        # both cores at 1M records.)
        seen = {(row["thread"], row["txid"]) for row in assembly.transactions.join(
            F.broadcast(spark.createDataFrame(decisions.skips, "thread int, txid string, reason string")),
            ["thread", "txid"])
            .select("thread", "txid").collect()} if decisions.skips else set()
        # Transactions written: those that reached the trail, i.e. with a record of a captured
        # table. A committed transaction that touched only other tables is read but writes
        # nothing; counting it made "wrote N transactions" exceed what pump and replicat count
        # on the same trail (issue 41).
        return _Trail(files, counts, sum(plan["transactions"] for plan in expected.values()), outcome.open_rows,
                      outcome.log_reads, seen, "grouped by transaction")
    finally:
        for frame in assembly.cached:
            # Best effort: a server gone (the run's own error) must not be hidden by this.
            with contextlib.suppress(Exception):
                frame.unpersist()


class _ClaimBefore:
    """The trail's claim (trail.format.claim) as it was before a run claimed it, put back
    when the run's new segments turn out to break the contract: the run then leaves
    nothing behind. (The old token active again is harmless: no run writes the trail until
    the next one claims it anew, and that one removes whatever is past its checkpoint.)"""

    def __init__(self, prefix: Path):
        self.path = trails.claim_path(prefix)
        self.content = self.path.read_bytes() if self.path.exists() else None

    def put_back(self) -> None:
        if self.content is None:
            self.path.unlink(missing_ok=True)
        else:
            atomic_write(self.path, self.content)


def _write_by_one_task(spark, store: MetadataStore, config: Config, run: _Run, decisions: Decisions,
                       directives: list) -> _Trail | None:
    """The run's trail written by one task (capture.onetask), or None (nothing written)
    when that task does not handle the run: `run.assembly_note` then says why."""
    state, extract, plan = run.state, run.extract, run.plan
    if run.assembly_note:
        return None
    reason = onetask.reason_not_to(run.segments, plan.restored, run.log.window, state.open, directives)
    if reason is not None:
        run.assembly_note = reason
        return None
    prefix = state.exttrail
    _remove_uncommitted_files(store, prefix, state.write.position.seqno)
    crashpoint("before_trail_write")
    layouts, versions = _copy_line_layouts(config, extract)
    first_seqno = state.write.position.seqno + 1
    claim_before = _ClaimBefore(prefix)
    task = onetask.Task(
        inputs=run.log.inputs, window=run.log.window, tables=list(extract.table), read_scn=None
        if decisions.read_scn is None else decisions.read_scn.value, begin_scn=decisions.begin_scn.value,
        last_written=decisions.last_written, prefix=str(prefix), first_seqno=first_seqno,
        max_bytes=int(extract.megabytes * 1024 * 1024), group=state.group, log_bsn=run.log_bsn.value,
        layouts=layouts, versions=versions, claim=trails.claim(prefix), cache_bytes=run.cache_bytes)
    # The new segments' checks (a task per run of segments) in the same job as the write,
    # the write first: Spark starts tasks in order, and the write is the longest (on 2
    # cores the checks after it shared the other core: 6.7 -> 4.9 s at 1M records).
    checks = [] if run.scan.done else run.scan.runs(spark)
    try:
        written, *checked = run_tasks(spark, onetask.check_or_write, [("write", task)] + [("check", c) for c in checks])
    except Exception:
        # A write that failed on a segment that breaks the contract: the checks say which
        # (ArchiveError naming the file and record); else the failure stands.
        _remove_uncommitted_files(store, prefix, state.write.position.seqno)
        claim_before.put_back()
        run.scan.finish(spark)
        raise
    finally:
        crashpoint("mid_trail_write")
    try:
        run.scan.finish(spark, checked if checks else None)
    except Exception:  # bad input: what was written from it goes, the trail is left as it was
        _remove_uncommitted_files(store, prefix, state.write.position.seqno)
        claim_before.put_back()
        raise
    run.watch.lap("check new segments, read the log, write trail files by one task (one Spark job)")
    if written.reason is not None:  # nothing written: the grouping takes the run (and claims the trail if it writes)
        claim_before.put_back()
        run.assembly_note = written.reason
        return None
    expected = {row["file_no"]: {"records": row["records"], "transactions": row["transactions"],
                                 "first_csn": Csn.parse(row["first_csn"]), "last_csn": Csn.parse(row["last_csn"])}
                for row in written.files}
    files = trailwrite.verify(written.files, expected, first_seqno, run.log_bsn, spark)
    if _writes_a_new_version(versions, state.write.last_csn, expected):
        crashpoint("before_new_version_write")  # written in the one task: both points stand after it
        crashpoint("after_new_version_write")
    crashpoint("after_trail_write")
    counts = runcounts.TableCounts()
    for row in written.files:
        counts.add_rows(json.loads(row["op_counts"]))
    return _Trail(files, counts, sum(row["transactions"] for row in written.files), written.open, written.reads,
                  set(), written.how)


def _assemble_and_commit(spark, store: MetadataStore, config: Config, run: _Run) -> RunResult:
    state, extract, log, segments, plan, watch = run.state, run.extract, run.log, run.segments, run.plan, run.watch
    horizon_scn = run.horizon.scn
    read_time = run.horizon.time
    skip_targets = _directive_targets(state, "skiptrans")
    force_targets = _directive_targets(state, "forcetrans")
    decisions = Decisions(read_scn=state.read_scn, begin_scn=state.begin_scn, last_written=state.write.last_csn,
                          skips=[(t.thread, t.xid, t.skip_reason) for t in state.open if t.skip_reason]
                          + [(thread, d.xid, "skiptrans") for d, thread in skip_targets],
                          forced=[(thread, d.xid, k) for k, (d, thread) in enumerate(force_targets)],
                          horizon_scn=horizon_scn, read_time=read_time)
    trail = _write_by_one_task(spark, store, config, run, decisions, skip_targets + force_targets)
    if trail is None:
        trail = _assemble_and_write(spark, store, config, run, decisions)
    files, counts, open_rows, per_thread, seen = trail.files, trail.counts, trail.open_rows, trail.log_reads, trail.seen
    written_transactions = trail.transactions
    carried = [t for t in state.open if t.skip_reason and (t.thread, t.xid) not in seen]
    previous = {(t.thread, t.xid): t for t in state.open}
    still_persisted = {(t.thread, t.xid): t.persisted for t in plan.restored}
    forced_csn = {}
    state.open = carried
    for row in open_rows:
        key = (row["thread"], row["txid"])
        reason = row["skip_reason"]
        if row["forced"]:
            forced_csn[key] = Csn.forced(horizon_scn, row["end"]["rba"])
            reason = f"forcetrans: written as committed at CSN {forced_csn[key]}"
        start = _read_checkpoint(row["thread"], row["start"])
        if key in previous and previous[key].start.position < start.position:
            start = previous[key].start  # a skipped transaction re-read only in part keeps its start
        state.open.append(ckpt.OpenTransaction(row["txid"], row["thread"], start, row["records"], row["bytes"] or 0,
                                               reason, None if reason else still_persisted.get(key)))

    # A read checkpoint's redo file is its own sequence's (for a recovery checkpoint, a
    # transaction's start, usually not the current file).
    redo_files = {(g.thread, g.sequence): g.path.name for g in segments}
    for row in per_thread:
        thread, last, first = row["thread"], row["last"], row["first"]
        state.read["current"][thread] = _read_checkpoint(thread, last, redo_files[(thread, last["sequence"])])
        state.read["startup"].setdefault(thread, _read_checkpoint(thread, first,
                                                                  redo_files[(thread, first["sequence"])]))
    for thread, current in state.read["current"].items():
        starts = [t.start for t in state.open
                  if t.thread == thread and t.skip_reason is None and t.persisted is None]
        oldest = min(starts, key=lambda s: s.position) if starts else current
        state.read["recovery"][thread] = dataclasses.replace(
            oldest, segment=oldest.segment or redo_files.get((thread, oldest.position.sequence)))

    warnings = []
    if plan.reason:
        warnings.append({"kind": "br_fallback", "detail": {"reason": plan.reason, "recovery": "normal"}})
        failure = "missing" in plan.reason or "corrupt" in plan.reason
        if failure and extract.br.broffonfailure:
            state.br_suspended = plan.reason
    if run.brreset:
        state.br_suspended = None
    warnings += _long_transaction_warnings(state, extract, read_time)
    br_checkpoint = _bounded_recovery_checkpoint(spark, config, extract, state, log, horizon_scn, read_time)
    watch.lap("bounded recovery")
    crashpoint("after_br_persist")

    if files:
        state.write = ckpt.WriteCheckpoint(TrailPosition(files[-1].seqno, files[-1].records), files[-1].last_csn)
    read_from = state.read_scn
    state.read_scn, state.read_time = horizon_scn, read_time
    state.table_spec = table_spec(extract.table)
    records_read = sum(row["n"] for row in per_thread)
    records_written = sum(f.records for f in files)
    done = [(d.directive_id, "applied: brreset, normal recovery this run") for d in state.directives
            if d.kind == "brreset"]
    done += [(d.directive_id, f"applied: transaction {d.xid} skipped; it never reaches the trail")
             for d, _ in skip_targets]
    done += [(d.directive_id, f"applied: transaction {d.xid} written at CSN {forced_csn[(thread, d.xid)]}"
              if (thread, d.xid) in forced_csn
              else f"transaction {d.xid} had ended on its own before it was forced")
             for d, thread in force_targets]
    assembly = trail.assembly + (f": {run.assembly_note}" if run.assembly_note else "")
    with store.transaction() as cur:
        checkpoint_id = None
        if br_checkpoint is not None:
            checkpoint_id = ckpt.insert_br_checkpoint(cur, state.group, **br_checkpoint)
            state.br_checkpoint = ckpt.BrCheckpoint(checkpoint_id, **br_checkpoint)
        required = recovery.required_scn(state, recovery.committed_plan(state))
        ckpt.commit_run(cur, state, files, required, {
            "started_at": run.started_at, "until": run.until, "read_from_scn": read_from,
            "horizon_scn": horizon_scn,
            "records_read": records_read, "transactions": written_transactions, "records_written": records_written,
            "recovery": plan.describe, "reread_records": sum(row["reread"] for row in per_thread),
            "read_from_time": min((_utc(row["from_time"]) for row in per_thread), default=None),
            "br_checkpoint_id": checkpoint_id, "timings": dict(watch.phases), "assembly": assembly}, warnings, done)
        runcounts.record(cur, "extract", state.group, runcounts.last_run_id(cur, "extract_run"), run.started_at,
                         counts)
    watch.lap("checkpoints")
    crashpoint("after_checkpoint_commit")
    if not extract.br.brkeepstalefiles:
        bounded.remove_stale_files(bounded.group_directory(config.path(extract.br.brdir), state.group),
                                   {t.persisted.file for t in state.open if t.persisted})
    return RunResult(state.group, horizon_scn, records_read, written_transactions, records_written, files,
                     len(state.open), timings=watch.phases, recovery=plan.describe, restart=run.restart.describe(),
                     br_checkpoint=br_checkpoint is not None,
                     assembly=assembly)


def _long_transaction_warnings(state: ckpt.ExtractState, extract, read_time) -> list[dict]:
    """WARNLONGTRANS: every open transaction older than the duration, at most once per
    check interval of log time."""
    rule = extract.warnlongtrans
    last = state.last_longtrans_check
    if last is not None and read_time - last < rule.checkinterval:
        return []
    state.last_longtrans_check = read_time
    warnings = []
    for txn in state.open:
        age = read_time - txn.start.ts
        if txn.skip_reason is None and age > rule.duration:
            warnings.append({"kind": "longtrans", "xid": txn.xid, "thread": txn.thread, "detail": {
                "start_position": str(txn.start.position), "start_scn": txn.start.scn, "start_time": txn.start.ts,
                "age_seconds": int(age.total_seconds()), "records": txn.records,
                "bytes": txn.bytes}})
    return warnings


def _bounded_recovery_checkpoint(spark, config, extract, state, log: LogRead, horizon_scn, read_time) -> dict | None:
    """At a BR boundary: persist every open transaction older than one BR interval (again
    only if it changed), and describe the checkpoint for the run's metadata commit."""
    interval = extract.effective_brinterval
    if extract.br.broff or state.br_suspended or not bounded.crosses_boundary(state.read_time, read_time, interval):
        return None
    eligible = [t for t in state.open if t.skip_reason is None and read_time - t.start.ts > interval]
    changed = [t for t in eligible if t.persisted is None or t.persisted.records != t.records]
    directory = bounded.group_directory(config.path(extract.br.brdir), state.group)
    keys = [(t.thread, t.xid) for t in changed]
    starts: dict[int, LogPosition] = {}
    for txn in changed:  # their records lie at and after their starts (or in their restored files)
        known = starts.get(txn.thread)
        starts[txn.thread] = txn.start.position if known is None else min(known, txn.start.position,
                                                                          key=lambda p: (p.sequence, p.rba))
    written = bounded.persist(log.records(transactions=keys, starts=starts), keys, directory, horizon_scn, spark)
    state.open = [dataclasses.replace(t, persisted=written[(t.thread, t.xid)]) if (t.thread, t.xid) in written else t
                  for t in state.open]
    oldest: dict[int, dict] = {}
    for txn in state.open:
        if txn.skip_reason is None and txn.persisted is None:
            known = oldest.get(txn.thread)
            if known is None or txn.start.scn < known["scn"]:
                oldest[txn.thread] = {"xid": txn.xid, "sequence": txn.start.position.sequence,
                                      "rba": txn.start.position.rba,
                                      "scn": txn.start.scn, "ts": txn.start.ts}
    persisted = [t.persisted for t in state.open if t.persisted]
    return {"scn": horizon_scn, "log_time": read_time, "interval_seconds": int(interval.total_seconds()),
            "table_spec": table_spec(extract.table), "oldest_nonpersisted": oldest, "persisted": len(persisted),
            "persisted_bytes": sum(p.file.stat().st_size for p in persisted)}


def _writes_a_new_version(versions: dict, last_written: Csn | None, expected: dict) -> bool:
    """Whether the files planned (`expected`) hold transactions committed at or after the
    scn of a table version after the first (or of a table that entered the archive late)
    that the trail written so far (up to `last_written`) did not reach."""
    if not expected:
        return False
    upto = max(plan["last_csn"].scn for plan in expected.values())
    since = last_written.scn if last_written is not None else -1
    return any(since < scn <= upto and (number > 1 or scn > 0)
               for pairs in versions.values() for scn, number in pairs)


def _copy_line_layouts(config: Config, extract) -> tuple[dict, dict]:
    """The layout (defs.json's latest columns and their JSON kinds) in which the trail's
    inserts carry their COPY lines, and each table's versions (scn, number), by which each
    record gets its table_version. An archive without readable definitions gets no lines
    and version 1 throughout: capture does not need them, and replicat, which does, says
    what is wrong with them."""
    try:
        defs = load_defs(config.archive_dir(config.source_name(extract.source)))
    except ArchiveError:
        return {}, {}
    return copytext.layouts_of(defs), versions_of(defs)


def _remove_uncommitted_files(store: MetadataStore, prefix: Path, committed_seqno: int) -> None:
    """Trail files past the committed write checkpoint are leftovers of a run that died
    before its commit: no reader can see them; remove them before writing again."""
    for path in trails.existing_files(prefix):
        if int(path.name[-9:]) > committed_seqno:
            path.unlink()
