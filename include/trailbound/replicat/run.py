"""One replicat run: apply the trail from the checkpoint to its committed end, exactly once.

1. Hold the group (advisory locks on the metadata store and the target).
2. Start from the checkpoint table's row when there is one (it wins: it commits with the
   data), else from the file checkpoint; repair the file checkpoint from it.
3. Read the committed trail files (trailbound.trail_file) from there, each file's
   SHA-256 checked beside the decoding of its first row groups (nothing read from a
   file commits, and no error its records led to is reported, before the check has
   passed; a mismatch is the run's error), and cut them into chunks: rba ranges
   ending at a transaction's end, the first GROUPTRANSOPS records, each next one twice
   the last, up to chunk_records (chunks.cut); a transaction longer than chunk_records
   comes as pieces of that size, applied one after another inside its one target
   transaction (`apply_piece`), so memory is bounded by the setting, not by the
   transaction. Applying starts once the first small chunk
   is prepared. In each chunk, skip transactions at or below log_csn, group whole source
   transactions into target transactions (GROUPTRANSOPS operations at least; a
   transaction with a TRUNCATE starts a new group), and split groups into units at each
   TRUNCATE.
4. Each unit's net change per table and key, as COPY lines (replicat/net/): vectorised
   with Arrow (net/arrow.py); a (unit, table) with a key-changing UPDATE in Python
   (net/python.py), or by Spark past net/python.py's LIMIT such records in a chunk
   (net/spark.py). While the driver applies one chunk, the next two are prepared in a
   background thread.
5. Per group, one target transaction: TRUNCATEs, COPY + merge per table, the records of
   the (unit, table)s the net change cannot apply as a set (a keyless table's updates
   and deletes) one statement each (`apply_units`), the checkpoint table row, COMMIT. Then the file checkpoint and trail_reader row in the metadata store.
   Groups that only insert run on `apply_parallelism` sessions at once, committed in
   trail order (apply/parallel.py).
   A group the fast path cannot apply is rolled back and replayed transaction by
   transaction (each its own target transaction with its checkpoint row); the record the
   target refuses stops the run, named by trail file, rba, CSN, table and key, unless the
   REPERROR rules say otherwise (replicat/reperror.py): a discarded record goes to the
   discard table in the same target transaction (replicat/discards.py), and to the run's
   discard file after the commit.

Crash points (TRAILBOUND_CRASH_AT): mid_copy, before_target_commit, after_target_commit,
between_groups, between_pieces (a long transaction's target transaction open between two
of its pieces), discard_before_commit (a discard row written, not committed),
discard_after_commit (committed, not yet in the discard file). Whatever dies where, the
next run reads the checkpoint table and skips what it holds: nothing is applied (or
discarded) twice and nothing is lost.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import psycopg2
import psycopg2.errors

from trailbound import files as trailfs
from trailbound import runcounts
from trailbound import spark as spark_session
from trailbound.archive.segments import load_defs
from trailbound.config import Config
from trailbound.crash import crashpoint
from trailbound.errors import TrailboundError, TrailError, changed_since_added
from trailbound.grouplock import CRASH_GRACE, GroupBusy, GroupLock, lock_key
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, Scn, TrailPosition
from trailbound.replicat import checkpoint_table as ckt
from trailbound.replicat import checkpoints as ckpt
from trailbound.replicat import ddl
from trailbound.replicat import discards as dsc
from trailbound.replicat import reperror
from trailbound.replicat import target as tgt
from trailbound.replicat.apply import DATA_ERRORS, ApplyError, Collision, NeedsReplay
from trailbound.replicat.apply.parallel import ParallelApply, lane_connection
from trailbound.replicat.apply.serial import FastApplier, Replayer, ReplayStats, record_key
from trailbound.replicat.chunks import Chunk, DeferredImages, Group, TrailFile, cut, plan_chunk
from trailbound.replicat.heartbeat import Heartbeats
from trailbound.replicat.net import arrow
from trailbound.replicat.windows import Windows
from trailbound.runcounts import TableCounts
from trailbound.trail import catalog
from trailbound.trail import format as trails

log = logging.getLogger("trailbound.replicat")
CRASH_POINTS = ("mid_copy", "before_target_commit", "after_target_commit", "between_groups", "between_pieces",
                "discard_before_commit", "discard_after_commit", "after_target_alter")
# Chunks prepared ahead of the one being applied: two while they are small (the first
# ones apply faster than the next row group decodes), one from a chunk of half the most
# on (it takes longer to apply than the next to prepare; a third would only hold memory).
CHUNKS_AHEAD = 2
FILE_CHECKPOINT_SECONDS = 1.0
LOST_TRAIL_HINT = "if the trail was lost, re-create it from the source: see 'Lost trails' in docs/replicat.md"


def group_lock(store: MetadataStore, group: str) -> GroupLock:
    """Holds the replicat group for the whole run on the metadata store (alter replicat
    takes it too); hold_target holds it on the target as well, so two metadata stores
    can never drive the same group into one target."""
    return GroupLock(store, "replicat", group)


def target_lock_key(group: str) -> str:
    return f"trailbound {lock_key('replicat', group)}"


def hold_target(connection, group: str) -> None:
    """Holds the group on the target, for the session's life or until release_target.
    Waits CRASH_GRACE first, as GroupLock does: a killed run's session keeps the lock
    until its server process has noticed, a moment after the client went."""
    try:
        with connection.cursor() as cur:
            cur.execute("SET LOCAL lock_timeout = %s", (CRASH_GRACE,))
            cur.execute("SELECT pg_advisory_lock(hashtext(%s))", (target_lock_key(group),))
        connection.commit()
    except psycopg2.errors.LockNotAvailable:
        connection.rollback()
        raise GroupBusy(f"replicat {group} is applying to this target from another process") from None


def release_target(connection, group: str) -> None:
    """Lets the group go on the target, then closes the session. Released first, not by
    the close: the closed session's server process would hold the lock a moment longer,
    and the next run or alter would wait for it."""
    try:
        if not connection.closed:
            connection.rollback()  # whatever the run left uncommitted (an error) rolls back
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", (target_lock_key(group),))
            connection.commit()
    except psycopg2.Error:
        pass  # a broken session: its server process lets the lock go as it ends
    finally:
        connection.close()


# ---------------------------------------------------------------- group registry

def ensure_group(store: MetadataStore, config: Config, group: str, *, adopt: bool = False) -> ckpt.ReplicatState:
    """The group's state, adding it (ADD REPLICAT ... EXTTRAIL, at the trail's start) if
    new. A configured trail or checkpoint table that differs from the registered one is
    refused, unless `adopt` (alter replicat ... extseqno: the user says where to read)."""
    name = config.replicat_name(group)
    replicat = config.replicat(name)
    exttrail = config.trail_location(replicat.exttrail)
    checkpoint_table = str(ckt.CheckpointTableName.parse(replicat.checkpointtable))
    with store.transaction() as cur:
        state = ckpt.load(cur, name)
        if state is None:
            ckpt.add_group(cur, name, exttrail, checkpoint_table)
            return ckpt.load(cur, name)
        if (state.exttrail, state.checkpoint_table) == (exttrail, checkpoint_table):
            return state
        if adopt:
            ckpt.switch_trail(cur, state, exttrail, checkpoint_table)
            return state
    raise changed_since_added(f"replicat {name}", f"reading trail {state.exttrail} with checkpoint table "
                              f"{state.checkpoint_table}", f"{exttrail} and {checkpoint_table}",
                              f"start reading the new one with `trailbound alter replicat {name} extseqno S extrba R` "
                              "(see docs/replicat.md)")


# ---------------------------------------------------------------- reading the trail

def pending_files(cur, state: ckpt.ReplicatState, start: TrailPosition) -> tuple[list[TrailFile], int]:
    """The committed files still to read from `start`, and the rba to start at in the
    first. Only files listed in trail_file exist for a reader; they must follow on."""
    rows = catalog.committed_files(cur, state.exttrail, start.seqno)
    if start.seqno == 0:
        rows, rba = rows, 0
    elif not rows or rows[0]["seqno"] != start.seqno:
        last = catalog.extent(cur, state.exttrail).last
        if last is not None and last > start.seqno:
            raise TrailboundError(f"replicat {state.group} is at trail file seqno {start.seqno} of {state.exttrail}, "
                                  f"which the trail does not list; {LOST_TRAIL_HINT}")
        return [], 0  # positioned at a file not written yet
    else:
        rba = start.rba
        if rba > rows[0]["records"]:
            raise TrailboundError(f"replicat {state.group} is at rba {rba} of trail file seqno {start.seqno}, which "
                                  f"holds {rows[0]['records']} records")
        if rba == rows[0]["records"]:
            rows, rba = rows[1:], 0
    catalog.check_following(state.exttrail, rows, rows[0]["seqno"] if rows else 0, reader=f"replicat {state.group}",
                            hint=LOST_TRAIL_HINT)
    return [TrailFile(row["seqno"], row["path"], row["records"], row["sha256"]) for row in rows], rba


def _read(file: TrailFile, fs,
          checksum: trails.Checksum) -> Iterator[tuple[pa.Table, Callable[[], pa.ChunkedArray]]]:
    """The file's records, a row group at a time, each part with the function that decodes
    its after images (trail.format.read_parts_deferring_images); its SHA-256 is checked
    beside them (`checksum`)."""
    if not fs.exists(file.path):
        raise TrailError(file.path, f"listed as committed (seqno {file.seqno}) but not there; {LOST_TRAIL_HINT}",
                         rba=0)
    remote = fs is not trailfs.LOCAL
    # The whole file's SHA-256 as committed, local or not: a file rewritten so that it is
    # consistent with its own footer is still not the file capture committed.
    return trails.read_parts_deferring_images(file.path, fs=fs if remote else None, sha256=file.sha256,
                                              records=file.records, checksum=checksum)


# ---------------------------------------------------------------- the run

@dataclass
class RunResult:
    group: str
    started_from: str = ""
    start: TrailPosition | None = None
    end: TrailPosition | None = None
    log_csn: Csn | None = None
    groups: int = 0
    transactions: int = 0
    operations: int = 0
    skipped: int = 0
    replayed_groups: int = 0
    replayed_records: int = 0   # records replayed one by one inside groups applied as a set (apply_units)
    parallel_groups: int = 0    # applied on a parallel lane (apply/parallel.py)
    collisions: int = 0
    discarded: int = 0          # operations set aside by REPERROR discard / transdiscard
    ignored: int = 0            # operations skipped by REPERROR ignore
    retried: int = 0            # attempts again by REPERROR retryop
    discard_file: Path | None = None   # this run's discard file (written only if something was discarded)
    started_at: datetime | None = None
    pieced: int = 0             # transactions longer than chunk_records, applied in pieces
    pieces: int = 0
    ddl: list[str] = field(default_factory=list)   # what a source table's new version changed on the target
    note: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    counts: TableCounts = field(default_factory=TableCounts)   # per source table, what committed (STATS)

    def describe(self) -> str:
        text = (f"Replicat {self.group}: from {self.started_from} at seqno {self.start.seqno} rba {self.start.rba}"
                if self.start else f"Replicat {self.group}:")
        if self.note:
            return f"{text}: {self.note}"
        # "records", as capture and pump say: the trail records of the applied transactions.
        text += (f", applied {self.transactions} transactions ({self.operations} records) in {self.groups} target "
                 f"transactions; skipped {self.skipped} transactions already applied; now at seqno {self.end.seqno} rba "
                 f"{self.end.rba}, log_csn {self.log_csn or 'none'}")
        if self.parallel_groups:
            text += f"; {self.parallel_groups} of them on parallel sessions"
        if self.replayed_groups:
            text += f"; {self.replayed_groups} group(s) replayed transaction by transaction"
        if self.replayed_records:
            text += (f"; {self.replayed_records} record(s) of keyless tables (or of key chains) replayed one by one "
                     "inside groups applied as a set")
        if self.collisions:
            text += f"; {self.collisions} collision(s) handled (HANDLECOLLISIONS)"
        if self.discarded:
            text += f"; {self.discarded} operation(s) discarded (REPERROR; see {self.discard_file})"
        if self.ignored:
            text += f"; {self.ignored} operation(s) ignored (REPERROR)"
        if self.retried:
            text += f"; {self.retried} operation attempt(s) retried (REPERROR retryop)"
        if self.pieced:
            text += (f"; {self.pieced} transaction(s) longer than chunk_records applied in {self.pieces} pieces, "
                     "each transaction in one target transaction")
        if self.ddl:
            text += f"; table versions applied: {'; '.join(self.ddl)}"
        return text


class _Timer:
    def __init__(self):
        self.phases: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.phases[phase] = self.phases.get(phase, 0.0) + seconds


class _Run:
    """The state of one run while it applies."""

    def __init__(self, start_spark, store: MetadataStore, config: Config, state: ckpt.ReplicatState, connection,
                 plans, checkpoint: ckpt.Checkpoint, result: RunResult, timer: _Timer, overflow: ckt.Overflow,
                 target_dsn: str | None = None, versions: ddl.Versions | None = None):
        self.start_spark, self.store, self.config, self.state = start_spark, store, config, state
        self.connection, self.plans, self.checkpoint, self.result, self.timer = (connection, plans, checkpoint,
                                                                               result, timer)
        replicat = config.replicat(state.group)
        self.grouptransops, self.handlecollisions = replicat.grouptransops, replicat.handlecollisions
        self.chunk_records = replicat.chunk_records  # the most records prepared at once; a longer
        # transaction is applied in pieces of this size (chunks.cut), inside one target transaction
        self.table_name = ckt.CheckpointTableName.parse(state.checkpoint_table)
        self.overflow = overflow  # whether the checkpoint row's _lox rows may exist
        self.fast = FastApplier(connection, plans)
        self.replayer = Replayer(plans, replicat.handlecollisions)
        # Records replayed inside a group applied as a set (apply_units): any record the
        # target refuses, or a row missing, sends the whole group to the replay, where
        # HANDLECOLLISIONS and the REPERROR rules act (and name the record).
        self.strict_replayer = Replayer(plans, False) if replicat.handlecollisions else self.replayer
        self.reperror = reperror.Policy(replicat.reperror)
        self.pieced_discards = False  # the open long transaction's pieces set records aside
        self._piece_replayed = 0  # records the open long transaction's pieces replayed inside apply_units
        self.windows = Windows(plans)  # a watermark load's chunks, applied at their high watermarks
        self.heartbeats = Heartbeats(state.group, state.exttrail, self.table_name.schema)
        self.images = DeferredImages()  # the trail's after images, decoded when a chunk needs them
        # Each file's SHA-256, checked beside its decoding: verified before anything
        # its records lead to commits (`verified`), and before an error they led to is
        # reported (`checksum_error`).
        self.checksums: dict[int, trails.Checksum] = {}
        # Insert-only groups on several sessions at once (apply/parallel.py); their
        # sessions open beside the first prepare (`chunks`).
        self.parallel = (ParallelApply(self, replicat.apply_parallelism, lane_connection(config, target_dsn))
                         if replicat.apply_parallelism > 1 else None)
        self.current_dir = str(config.home)
        self.workdir = config.path(Path("var") / "replicat" / state.group)
        self.fs = trailfs.for_location(state.exttrail, None if trailfs.is_local(state.exttrail) else start_spark())
        self._saved_at, self._unsaved = float("-inf"), False
        # The table versions the plans are for; the first record of another is a fence:
        # this pass ends before its transaction (replicat/ddl.py).
        self.versions = versions
        self.fence: ddl.Fence | None = None

    # -- preparing chunks (in a background thread, CHUNKS_AHEAD chunks ahead)

    def chunks(self, files: list[TrailFile], start_rba: int):
        """The chunks to apply, each prepared in a background thread while the ones
        before it are applied."""
        log_csn = self.checkpoint.log_csn
        # Advanced only by the worker thread, one chunk at a time (it reads the files).
        cuts = cut(files, self._read, start_rba, first=self.grouptransops, most=self.chunk_records)
        numbers = itertools.count()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="replicat-prepare") as pool:
            pending = deque(pool.submit(self._prepare, next(numbers), cuts, log_csn) for _ in range(CHUNKS_AHEAD))
            if self.parallel is not None:
                self.parallel.open_ahead()
            while True:
                waited = time.perf_counter()
                try:
                    chunk = pending.popleft().result()
                except BaseException:
                    # The groups in flight were read before the error: they commit as
                    # they would have, and are recorded.
                    self.settle()
                    raise
                self.timer.add("apply: waiting for the next chunk", time.perf_counter() - waited)
                if chunk is None:
                    return
                ahead = CHUNKS_AHEAD if len(chunk.light) < self.chunk_records // 2 else 1
                while len(pending) < ahead:
                    pending.append(pool.submit(self._prepare, next(numbers), cuts, log_csn))
                try:
                    yield chunk
                except GeneratorExit:
                    for future in pending:
                        future.cancel()
                    raise

    def _read(self, file: TrailFile) -> Iterator[pa.Table]:
        """The file's records, their after images decoded only when a chunk needs them."""
        checksum = self.checksums[file.seqno] = trails.Checksum()
        parts = _read(file, self.fs, checksum)
        while True:
            began = time.perf_counter()
            part, decode = next(parts, (None, None))
            self.timer.add("prepare: read and verify trail files", time.perf_counter() - began)
            if part is None:
                return
            part = arrow.trusted_lines(part, self.plans)
            decode = ddl.older_images_fitted(part, decode, self.versions)
            self.images.add(file.seqno, part, decode, now=arrow.needs_images(part, self.plans))
            yield part

    def _prepare(self, number: int, cuts, log_csn: Csn | None) -> Chunk | None:
        """The next chunk of `cuts` planned and netted; None after the last, or once a
        chunk ended at a fence."""
        if self.fence is not None:
            return None
        following = next(cuts, None)
        if following is None:
            return None
        files, tables, piece = following
        began = time.perf_counter()
        chunk = plan_chunk(files, tables, log_csn, self.grouptransops, self.images, piece)
        if self.versions is not None and (at := ddl.first_change(chunk.light, self.versions)) is not None:
            if piece is not None and piece.number > 0:
                # The fence goes before the transaction, and its first pieces are in the
                # open target transaction already: a new pass cannot start there.
                first = chunk.light.slice(at, 1).to_pylist()[0]
                raise TrailboundError(
                    f"a source table's version changes inside a transaction longer than chunk_records "
                    f"({self.chunk_records} records), at trail file {chunk.path_of(first['seqno'])} rba "
                    f"{first['rba']}: nothing of the transaction was applied; set replicat's chunk_records above "
                    f"the transaction's size for this run, then back")
            chunk = self._up_to_fence(chunk, files, tables, at, log_csn)
            if chunk is None:
                return None
        self.heartbeats.take(chunk)
        planned = time.perf_counter()
        from trailbound.replicat.net.compute import compute_net  # not for a run with nothing new

        chunk.net = compute_net(self.start_spark, chunk, self.plans, self.workdir / f"chunk-{number}", self.timer)
        self.timer.add("prepare: plan groups", planned - began)
        return chunk

    def _up_to_fence(self, chunk: Chunk, files, tables, at: int, log_csn: Csn | None) -> Chunk | None:
        """The chunk's transactions before the one holding record `at` (the first of a
        table version this pass is not planned for); the fence there."""
        txn = int(np.searchsorted(chunk.txn_starts, at, side="right")) - 1
        start = int(chunk.txn_starts[txn])
        stop = int(chunk.txn_starts[txn + 1]) if txn + 1 < len(chunk.txn_starts) else len(chunk.light)
        first = chunk.light.slice(start, 1).to_pylist()[0]
        self.fence = ddl.Fence(first["seqno"], first["rba"], str(Csn.from_row(first)), chunk.path_of(first["seqno"]),
                               ddl.changed_at(chunk.light, start, stop, self.versions))
        if start == 0:
            return None
        files, tables = ddl.prefix(tables, files, start)
        return plan_chunk(files, tables, log_csn, self.grouptransops, self.images)

    # -- applying

    def _versions_first(self, cur) -> None:
        """A table version's statements, in the target transaction of its first row."""
        if self.versions is not None and self.versions.pending:
            self.verified(self.checkpoint.position)
            self.versions.run_pending(cur)
            crashpoint("after_target_alter")  # the target altered, its first rows and checkpoint row not yet

    def _versions_committed(self) -> None:
        if self.versions is not None and self.versions.pending:
            self.result.ddl.extend(self.versions.described)
            for change in self.versions.described:
                log.warning("replicat %s: %s", self.state.group, change)
            self.versions.committed()

    def apply_chunk(self, chunk: Chunk) -> None:
        if chunk.piece is not None and chunk.groups:
            self.apply_piece(chunk)
            return
        if chunk.piece is not None and not chunk.piece.last:
            return  # a piece of a transaction applied before: the position moves past it at its last piece
        if chunk.net is not None:
            self.fast.prepare(chunk.net.tables())
            self.fast.stage(chunk.net.staged_to_merge())
        if self.parallel is not None and not (self.versions is not None and self.versions.pending):
            with self.connection.cursor() as cur:
                quiet = self.windows.quiet(cur, chunk)
            self.connection.commit()
            self.parallel.apply(chunk, parallel=quiet)
        else:
            for group in chunk.groups:
                self.apply_group(chunk, group)
        self.result.skipped += chunk.skipped
        # Recorded only when the whole run commits (run_replicat): every group of the
        # chunk has committed by then, on the fast path or replayed.
        self.result.counts.add_rows(chunk.op_counts)
        if not chunk.groups or chunk.end > chunk.groups[-1].end:
            # Past transactions already applied (skipped) after the last group: once the
            # groups in flight have committed, move the position in both checkpoints,
            # keeping log_csn. (Otherwise the last group's commit moves it.)
            self.settle()
            if chunk.end > self.checkpoint.position:
                self.verified(chunk.end)
                with self.connection.cursor() as cur:
                    ckt.set_position(cur, self.table_name, self.state.group, chunk.end, current_dir=self.current_dir,
                                     log_csn=self.checkpoint.log_csn, keep_log_csn=True)
                self.connection.commit()
                self._save(ckpt.Checkpoint(chunk.end, self.checkpoint.log_csn, self.checkpoint.log_bsn,
                                           self.checkpoint.audit_ts), now=True)
        self.flush()

    def apply_group(self, chunk: Chunk, group: Group) -> None:
        """One group as one target transaction on the run's own session."""
        began = time.perf_counter()
        try:
            with self.connection.cursor() as cur:
                self._versions_first(cur)
                replayed = self.apply_units(cur, self.fast, chunk, group)
                self.windows.apply(cur, chunk, group.txns)
                copied = time.perf_counter()
                self._write_checkpoint_row(cur, group.end, **_row_values(group))
                crashpoint("before_target_commit")
            self.connection.commit()
            self._versions_committed()
        except (*DATA_ERRORS, Collision, NeedsReplay) as exc:
            self.connection.rollback()
            self.timer.add("apply: fast path (failed, rolled back)", time.perf_counter() - began)
            self.replay_group(chunk, group, reason=exc)
            return
        except psycopg2.Error as exc:  # not the data: the target itself (a missing grant, a lost connection)
            self._rollback_quietly()
            if not self.connection.closed and self.reperror.may_handle(exc):
                # An error a REPERROR rule acts on (a deadlock, a lock wait): record by record.
                self.replay_group(chunk, group, reason=exc)
                return
            self.flush()
            raise self.target_error(chunk, group, exc) from None
        except BaseException:
            self._rollback_quietly()
            raise
        committed = time.perf_counter()
        crashpoint("after_target_commit")
        self.group_committed(group, statements=copied - began, committing=committed - copied)
        self.result.replayed_records += replayed

    def apply_piece(self, chunk: Chunk) -> None:
        """A piece of a transaction longer than chunk_records, inside the transaction's one
        target transaction: the first piece opens it, the last writes the checkpoint row
        and commits (the crash points before_target_commit and after there mean what they
        do for a group); between pieces it stays open (between_pieces), and a crash or
        error anywhere leaves nothing of the transaction on the target. A piece the fast
        path cannot apply is rolled back to its savepoint and replayed record by record."""
        piece, group = chunk.piece, chunk.groups[0]
        if piece.number == 0:
            self.settle()  # whatever went to parallel lanes commits before this transaction starts
        began = time.perf_counter()
        try:
            if chunk.net is not None:
                self.fast.prepare(chunk.net.tables())
                # Staged inside the open transaction past the first piece (a commit
                # would commit the pieces before it).
                self.fast.stage(chunk.net.staged_to_merge(), commit=piece.number == 0)
            with self.connection.cursor() as cur:
                cur.execute("SAVEPOINT tb_piece")
                try:
                    self._piece_replayed += self.apply_units(cur, self.fast, chunk, group)
                except (*DATA_ERRORS, Collision, NeedsReplay) as exc:
                    cur.execute("ROLLBACK TO SAVEPOINT tb_piece")
                    self.replay_piece(cur, chunk, reason=exc)
                except psycopg2.Error as exc:
                    if self.connection.closed or not self.reperror.may_handle(exc):
                        raise
                    cur.execute("ROLLBACK TO SAVEPOINT tb_piece")  # a REPERROR rule acts on it: record by record
                    self.replay_piece(cur, chunk, reason=exc)
                self.windows.apply(cur, chunk, group.txns)
                copied = time.perf_counter()
                if not piece.last:
                    cur.execute("RELEASE SAVEPOINT tb_piece")
                    self.result.operations += group.operations
                    self.timer.add("apply: COPY and merge", copied - began)
                    crashpoint("between_pieces")
                    return
                self._write_checkpoint_row(cur, group.end, **_row_values(group))
                crashpoint("before_target_commit")
            self.connection.commit()
            self.fast.committed()
        except psycopg2.Error as exc:  # not the data (see apply_group)
            self._rollback_quietly()
            self.fast.rolled_back()
            self._piece_replayed = 0
            self.flush()
            raise self.target_error(chunk, group, exc) from None
        except BaseException as exc:
            self._rollback_quietly()
            self.fast.rolled_back()
            self._piece_replayed = 0
            if isinstance(exc, TrailboundError):
                self.flush()  # what did commit is recorded before the run stops
            raise
        committed = time.perf_counter()
        crashpoint("after_target_commit")
        self.group_committed(group, statements=copied - began, committing=committed - copied)
        self.result.pieced += 1
        self.result.pieces += piece.number + 1
        self.result.replayed_records += self._piece_replayed
        self._piece_replayed = 0
        self.flush()
        if self.pieced_discards:
            self.pieced_discards = False
            crashpoint("discard_after_commit")
            self.write_discard_file()

    def replay_piece(self, cur, chunk: Chunk, reason: Exception) -> None:
        """A piece's records one statement each, inside the open transaction (the pieces
        before it stay applied: replaying them would give the same rows). A record the
        target refuses rolls back the whole transaction and stops the run, named."""
        self.verified(chunk.groups[0].end)  # before a record of it is applied, or named in an error
        began = time.perf_counter()
        self.result.replayed_groups += 1
        log.warning("replicat %s: piece %d of the transaction ending at or after seqno %s rba %s (CSN %s) is "
                    "replayed record by record: %s", self.state.group, chunk.piece.number, chunk.end.seqno,
                    chunk.end.rba, chunk.groups[0].log_csn,
                    str(reason).strip().splitlines()[0] if str(reason).strip() else type(reason).__name__)
        stats, counted = ReplayStats(), TableCounts()
        try:
            set_aside = self._apply_records(cur, chunk, chunk.transaction(0), stats, counted)
        except reperror.Stop as stop:
            raise self._refused(chunk, stop.failure) from None
        except reperror.DiscardTransaction as whole:
            raise TrailboundError(
                f"REPERROR transdiscard for a transaction longer than chunk_records ({self.chunk_records} records): "
                f"its first pieces are no longer in memory to be set aside; {self._refused(chunk, whole.failure)}; "
                f"nothing of the transaction was applied. Set replicat's chunk_records above the transaction's size "
                f"for this run, or make the target accept it") from None
        if set_aside:  # in the transaction's one target transaction, with its last piece's checkpoint row
            cur.execute(dsc.insert_statement(cur, self.table_name, self.state.group, set_aside))
            self.pieced_discards = True
        self.result.counts.merge(counted)
        self.result.collisions += stats.collisions
        self.timer.add("apply: replay transaction by transaction", time.perf_counter() - began)

    def apply_units(self, cur, fast: FastApplier, chunk: Chunk, group: Group) -> int:
        """The group's net rows, unit by unit, on `fast`'s session (inside its transaction).
        The (unit, table)s the net change cannot apply as a set (a keyless table's updates
        or deletes, keys changed in a chain) are replayed record by record in the same
        unit, after its set-based rows: each such table's records keep their order, and
        other tables never depended on their order against them (the set-based path
        applies tables one after another already; see "Limits" in docs/replicat.md).
        Returns the number of records replayed."""
        replayed = 0
        for unit, truncated in group.units:
            if truncated is not None:
                fast.truncate(cur, truncated)
                continue
            entries = chunk.net.units.get(unit, []) if chunk.net else []
            fast.apply_unit(cur, unit, [(e.table, e.counts, chunk.net.view(e.inserts), e.partial_updates) for e in entries
                                        if not e.unresolved])
            if tables := {e.table for e in entries if e.unresolved}:
                replayed += self._replay_tables(cur, chunk, unit, tables)
        return replayed

    def _replay_tables(self, cur, chunk: Chunk, unit: int, tables: set[str]) -> int:
        """The unit's records of `tables`, one statement each, in trail order, inside the
        group's target transaction. A record the target refuses (or whose row is missing)
        makes the group roll back and be replayed transaction by transaction
        (NeedsReplay), where the record is named and the REPERROR rules and
        HANDLECOLLISIONS act: the same outcome as if the group had been replayed whole
        from the start."""
        began = time.perf_counter()
        stats, records = ReplayStats(), chunk.unit_records(unit, tables)
        for record in records:
            try:
                self.strict_replayer.apply(cur, record, stats)
            except (psycopg2.Error, TrailboundError) as exc:
                if self.connection.closed:
                    raise
                raise NeedsReplay(f"{record['op']} on {record['table']} at rba {record['rba']} in a group applied as "
                                  f"a set: {' '.join(str(exc).split())}") from None
        self.timer.add("apply: records replayed inside a set-applied group", time.perf_counter() - began)
        return len(records)

    def group_checkpoint_statements(self, group: Group) -> bytes:
        """The group's checkpoint row and COMMIT, as one text for a parallel session to
        send after the group's rows; composed on the run's thread, in trail order (see
        ckt.Overflow). Its sender verifies the files the group was read from (`verified`)
        before it lets them run. (Every session's client encoding is UTF8: the run's own
        session composes for all.)"""
        with self.connection.cursor() as cur:
            return self._checkpoint_statements(cur, group.end, **_row_values(group), commit=True)

    def group_committed(self, group: Group, *, statements: float, committing: float,
                        waiting: float | None = None) -> None:
        """After a group's target transaction committed (here or on a parallel lane), in
        trail order: the file checkpoint, the counts."""
        began = time.perf_counter()
        self._save(ckpt.Checkpoint(group.end, group.log_csn, group.log_bsn, group.audit_ts))
        crashpoint("between_groups")
        self.result.groups += 1
        self.result.transactions += len(group.txns)
        self.result.operations += group.operations
        self.timer.add("apply: COPY and merge", statements)
        if waiting is not None:  # applied on a parallel lane
            self.result.parallel_groups += 1
            self.timer.add("apply: waiting to commit in trail order", waiting)
        self.timer.add("apply: checkpoint row and commit", committing)
        self.timer.add("apply: metadata checkpoint", time.perf_counter() - began)

    def target_error(self, chunk: Chunk, group: Group, exc: psycopg2.Error) -> TrailboundError:
        """The error of a target that refused a group for another reason than its data
        (a missing grant, a lost connection): one line naming where the group starts."""
        first = chunk.transaction(group.txns[0])[0]
        return TrailboundError(f"target error applying the group from {chunk.path_of(first['seqno'])} rba "
                               f"{first['rba']} (CSN {Csn.from_row(first)} to {group.log_csn}): "
                               f"{' '.join((exc.pgerror or str(exc)).split())}")  # one line

    def replay_group(self, chunk: Chunk, group: Group, reason: Exception) -> None:
        """Apply a group transaction by transaction, each with its checkpoint row."""
        self.verified(group.end)  # before a record of it is applied, or named in an error
        began = time.perf_counter()
        self.result.replayed_groups += 1
        log.warning("replicat %s: the group ending at seqno %s rba %s (CSN %s) is replayed transaction by "
                    "transaction: %s", self.state.group, group.end.seqno, group.end.rba, group.log_csn,
                    str(reason).strip().splitlines()[0] if str(reason).strip() else type(reason).__name__)
        for txn in group.txns:
            records = chunk.transaction(txn)
            stats = ReplayStats()
            counted = TableCounts()   # collisions, discards; its operations are counted with the chunk's (apply_chunk)
            set_aside: list[dict] = []
            try:
                with self.connection.cursor() as cur:
                    self._versions_first(cur)
                    set_aside = self._apply_records(cur, chunk, records, stats, counted)
                    last = records[-1]
                    end = TrailPosition(last["seqno"], last["rba"] + 1)
                    csn = Csn.from_row(records[0])
                    bsn = Scn(last["log_bsn"])
                    self.windows.apply(cur, chunk, [txn])
                    if set_aside:
                        self.verified(end)  # the positions it names are the committed files'
                        cur.execute(dsc.insert_statement(cur, self.table_name, self.state.group, set_aside))
                        crashpoint("discard_before_commit")
                    self._write_checkpoint_row(cur, end, log_csn=csn, log_xid=records[0]["xid"],
                                               cmplt_xids=[records[0]["xid"]], audit_ts=records[0]["commit_ts"],
                                               log_bsn=bsn)
                    crashpoint("before_target_commit")
                self.connection.commit()
                self._versions_committed()
            except reperror.Stop as stop:
                self._rollback_quietly()
                self.flush()  # what did commit is recorded before the run stops
                raise self._refused(chunk, stop.failure) from None
            except (psycopg2.Error, TrailboundError) as exc:
                # Not one record's: a table version that cannot be made, a file that is not
                # the committed one (raised as they are), a target that went away, or a
                # refusal at COMMIT (a deferred constraint: named by the transaction's
                # last record; no REPERROR rule can set one operation aside there).
                lost = self.connection.closed
                self._rollback_quietly()
                self.flush()
                if isinstance(exc, TrailboundError):
                    raise
                message = " ".join((exc.pgerror or str(exc)).split())
                if lost:
                    raise TrailboundError(f"target error replaying the transaction from "
                                          f"{chunk.path_of(records[0]['seqno'])} rba {records[0]['rba']} (CSN "
                                          f"{Csn.from_row(records[0])}): {message}") from None
                raise self._refused(chunk, reperror.Failure(records[-1], exc, reperror.ABEND)) from None
            except BaseException:
                self._rollback_quietly()
                raise
            crashpoint("after_target_commit")
            self._save(ckpt.Checkpoint(end, csn, bsn, records[0]["commit_ts"]))
            self.result.transactions += 1
            self.result.operations += len(records)  # every trail record, as a group applied whole counts them
            self.result.collisions += stats.collisions
            self.result.counts.merge(counted)
            if set_aside:
                crashpoint("discard_after_commit")
                self.write_discard_file()
        self.result.groups += len(group.txns)
        self.timer.add("apply: replay transaction by transaction", time.perf_counter() - began)
        crashpoint("between_groups")

    def _apply_records(self, cur, chunk: Chunk, records: list[dict], stats: ReplayStats,
                       counted: TableCounts) -> list[dict]:
        """A transaction's records one statement each, inside its target transaction.
        Without REPERROR rules the first the target refuses is raised as it is (the
        caller names it); with them each runs under a savepoint and the rules act
        (replicat/reperror.py). Returns the discard table's rows for what was set aside
        (to be written in this same target transaction); `counted` gets the collisions,
        discards and the operations not applied."""
        def apply(cur, record: dict) -> None:
            collisions = stats.collisions
            self.replayer.apply(cur, record, stats)
            if stats.collisions > collisions:
                counted.add(record["table"], "collisions", stats.collisions - collisions)

        if not self.reperror.active:
            for record in records:
                try:
                    apply(cur, record)
                except (psycopg2.Error, TrailboundError) as exc:
                    if self.connection.closed:
                        raise
                    raise reperror.Stop(reperror.Failure(record, exc, reperror.ABEND)) from None
            return []
        cur.execute("SAVEPOINT tb_transaction")
        try:
            outcome = reperror.apply_transaction(cur, records, apply, self.reperror,
                                                 alive=lambda: not self.connection.closed)
        except reperror.DiscardTransaction as whole:
            # Back to the transaction's start: every mapped record of it is set aside.
            cur.execute("ROLLBACK TO SAVEPOINT tb_transaction")
            counted.tables.clear()
            stats.collisions = 0
            refused = whole.failure
            others = f"discarded with its transaction: {refused.record['op']} at rba {refused.record['rba']} " \
                     f"refused: {refused.message}"
            discarded = [reperror.Failure(r, refused.error, refused.action) for r in records
                         if self.plans.get(r["table"]) is not None]
            rows = [self._discard_row(chunk, f, message=None if f.record is refused.record else others)
                    for f in discarded]
            ignored = []
            log.warning("replicat %s: REPERROR transdiscard: transaction %r (CSN %s, %d operation(s)) discarded: %s "
                        "on %s refused (SQLSTATE %s): %s", self.state.group, records[0]["xid"],
                        Csn.from_row(records[0]), len(rows), refused.record["op"], refused.record["table"],
                        refused.sqlstate, refused.message)
        else:
            discarded, ignored = outcome.discarded, outcome.ignored
            rows = [self._discard_row(chunk, f) for f in discarded]
            self.result.retried += outcome.retries
            for failure in discarded:
                log.warning("replicat %s: REPERROR discard: %s on %s at %s rba %s (SQLSTATE %s): %s", self.state.group,
                            failure.record["op"], failure.record["table"], chunk.path_of(failure.record["seqno"]),
                            failure.record["rba"], failure.sqlstate, failure.message)
        for failure in [*discarded, *ignored]:
            counted.add_op(failure.record["table"], failure.record["op"], -1)
        for failure in discarded:
            counted.add(failure.record["table"], "discards")
        self.result.discarded += len(discarded)
        self.result.ignored += len(ignored)
        return rows

    def _discard_row(self, chunk: Chunk, failure: reperror.Failure, *, message: str | None = None) -> dict:
        plan = self.plans.get(failure.record["table"])
        return {**failure.record, "trail_file": chunk.path_of(failure.record["seqno"]),
                "target_table": plan.target if plan else None, "action": failure.action.name,
                "sqlstate": failure.sqlstate, "message": message or failure.message}

    def _refused(self, chunk: Chunk, failure: reperror.Failure) -> ApplyError:
        """The error that stops the run at a record the target refuses."""
        record, message = failure.record, failure.message
        if failure.action.name == "retryop":
            message = f"still refused after {failure.action.retries} retries (REPERROR retryop): {message}"
        elif failure.action.name == "transabend":
            message = f"REPERROR transabend, its transaction rolled back: {message}"
        return ApplyError(chunk.path_of(record["seqno"]), record["rba"], Csn.from_row(record), record["xid"],
                          record["op"], record["table"], record_key(self.plans.get(record["table"]), record), message)

    def write_discard_file(self) -> None:
        """The discards committed and not yet in a file, to this run's discard file (after
        the commit: the discard table is the record, the file a view of it)."""
        if self.result.discard_file is not None:
            dsc.write_file(self.connection, self.table_name, self.state.group, self.result.discard_file,
                           self.result.started_at)

    def _write_checkpoint_row(self, cur, end: TrailPosition, *, log_csn: Csn, log_xid: str, cmplt_xids: list[str],
                              audit_ts: datetime, log_bsn: Scn) -> None:
        """The checkpoint table's row for what this target transaction applied (a group,
        or one replayed transaction), written inside it, once the files it was read from
        are known to be the committed ones."""
        self.verified(end)
        cur.execute(self._checkpoint_statements(cur, end, log_csn=log_csn, log_xid=log_xid, cmplt_xids=cmplt_xids,
                                                audit_ts=audit_ts, log_bsn=log_bsn))

    def _checkpoint_statements(self, cur, end: TrailPosition, *, log_csn: Csn, log_xid: str, cmplt_xids: list[str],
                               audit_ts: datetime, log_bsn: Scn, commit: bool = False) -> bytes:
        # the heartbeats this target transaction applies go in with its checkpoint row
        beats = self.heartbeats.statements(cur, self.store, self.checkpoint.position, end)
        row = ckt.row_statements(cur, self.table_name, self.state.group, position=end, log_csn=log_csn,
                                 log_bsn=log_bsn, audit_ts=audit_ts, log_xid=log_xid, cmplt_xids=cmplt_xids,
                                 current_dir=self.current_dir, commit=commit, overflow=self.overflow)
        return beats + b"; " + row if beats else row

    def _save(self, checkpoint: ckpt.Checkpoint, *, now: bool = False) -> None:
        """The file checkpoint (and trail_reader row) after a target commit: written at
        once for the first group, then at most every FILE_CHECKPOINT_SECONDS and at the
        end of each chunk. Lagging is safe: the checkpoint table is authoritative, and a
        reader position behind the truth only makes purge keep more."""
        self.checkpoint = checkpoint
        if not now and time.monotonic() - self._saved_at < FILE_CHECKPOINT_SECONDS:
            self._unsaved = True
            return
        with self.store.transaction() as cur:
            ckpt.save(cur, self.state, checkpoint)
            self.heartbeats.committed(cur, checkpoint.position)
        self._saved_at, self._unsaved = time.monotonic(), False

    def verified(self, end: TrailPosition) -> None:
        """Wait for the checksums of the files read up to `end`; raise a mismatch."""
        for seqno, checksum in list(self.checksums.items()):  # the prepare thread adds to it
            if seqno <= end.seqno:
                checksum.verify()

    def checksum_error(self) -> TrailboundError | None:
        """The mismatch of any file read, once every check is done, or None."""
        return next((error for checksum in list(self.checksums.values()) if (error := checksum.error())), None)

    def settle(self) -> None:
        """Wait for the groups still in flight on the parallel lanes, and record them
        (counts and file checkpoint)."""
        if self.parallel is not None:
            self.parallel.settle()
        self.flush()

    def flush(self) -> None:
        if self._unsaved:
            self._save(self.checkpoint, now=True)

    def _rollback_quietly(self) -> None:
        try:
            if not self.connection.closed:
                self.connection.rollback()
        except psycopg2.Error:
            pass


def _mapped(counts: TableCounts, plans) -> TableCounts:
    """The counts of the tables replicat maps (a table no MAP selects, and the load's
    watermark records, are read but not applied), each with its target."""
    mapped = TableCounts()
    for table, row in counts.tables.items():
        if (plan := plans.get(table)) is not None:
            mapped.tables[table] = row
            mapped.targets[table] = plan.target
    return mapped


def _row_values(group: Group) -> dict:
    """What a group's checkpoint row says besides its position."""
    return {"log_csn": group.log_csn, "log_xid": group.log_xid, "cmplt_xids": group.cmplt_xids,
            "audit_ts": group.audit_ts, "log_bsn": group.log_bsn}


def starting_checkpoint(state: ckpt.ReplicatState, row: ckt.CheckpointRow | None) -> tuple[ckpt.Checkpoint, str]:
    """The checkpoint table's row wins over the file checkpoint: it commits with the data."""
    if row is None:
        return state.checkpoint, "file checkpoint"
    return ckpt.Checkpoint(row.position, row.log_csn, row.log_bsn, row.audit_ts), "checkpoint table"


def run_replicat(spark, store: MetadataStore, config: Config, group: str, *, target_dsn: str | None = None) -> RunResult:
    """`spark`: a SparkSession, or a function that starts one. Spark is asked for only by
    a run that needs it (a trail outside the local filesystem, or more key-changing
    UPDATEs in a chunk than net/python.py's LIMIT): the CLI's replicat of a local trail starts
    no JVM."""
    start_spark = spark_session.on_demand(spark)
    name = config.replicat_name(group)
    replicat = config.replicat(name)
    timer = _Timer()
    began = time.perf_counter()
    with group_lock(store, name):
        started_at = datetime.now(timezone.utc)
        state = ensure_group(store, config, name)
        connection = tgt.connect(config, target_dsn)
        try:
            hold_target(connection, name)
            table_name = ckt.CheckpointTableName.parse(state.checkpoint_table)
            with connection.cursor() as cur:
                ckt.create(cur, table_name)
                dsc.create(cur, table_name)
                row = ckt.read(cur, table_name, name)
                Heartbeats.follow_target(store, cur, name, table_name.schema)  # the copy follows, as the file checkpoint
                overflow = ckt.overflow_exists(cur, table_name, name)
                checkpoint, started_from = starting_checkpoint(state, row)
                versions = ddl.start(cur, load_defs(config.archive_dir(replicat.source)), replicat.map, replicat.ddl,
                                     checkpoint.log_csn.scn if checkpoint.log_csn else None)
            connection.commit()
            result = RunResult(name, started_from, checkpoint.position, checkpoint.position, checkpoint.log_csn,
                               started_at=started_at,
                               discard_file=dsc.file_path(config.path(replicat.discarddir), name, started_at))
            # Discards an earlier run committed and was killed before it wrote to its file.
            dsc.write_file(connection, table_name, name, result.discard_file, started_at)
            with store.transaction() as cur:
                if checkpoint != state.checkpoint:
                    ckpt.save(cur, state, checkpoint)  # repaired from the checkpoint table
                ckpt.mark_started(cur, state, started_at, checkpoint.position)
                files, start_rba = pending_files(cur, state, checkpoint.position)
            timer.add("start: checkpoints, catalog, trail listing", time.perf_counter() - began)
            if not files:
                result.note = "nothing new in the trail"
                return result
            run = _Run(start_spark, store, config, state, connection, versions.plans, checkpoint, result, timer,
                       overflow, target_dsn, versions)
            try:
                while True:
                    for chunk in run.chunks(files, start_rba):
                        run.apply_chunk(chunk)
                    run.settle()
                    if run.fence is None:
                        break
                    # A table's new version: what came before it is applied; the next pass
                    # is planned for the new version, its statements run with its first row.
                    fence = run.fence
                    if run.parallel is not None:
                        run.parallel.close()
                    with connection.cursor() as cur:
                        cur.execute("DISCARD TEMP")  # the staging tables of the old plans
                        versions = ddl.advance(cur, versions, fence, load_defs(config.archive_dir(replicat.source)))
                    connection.commit()
                    with store.transaction() as cur:
                        files, start_rba = pending_files(cur, state, TrailPosition(fence.seqno, fence.rba))
                    run = _Run(start_spark, store, config, state, connection, versions.plans, run.checkpoint, result,
                               timer, overflow, target_dsn, versions)
            except Exception:
                # A file found not to be the committed one is the error, whatever its
                # records led to before its checksum was known (none of them committed).
                if (mismatch := run.checksum_error()) is not None:
                    run.flush()
                    raise mismatch from None
                raise
            finally:
                if run.parallel is not None:
                    run.parallel.close()
            shutil.rmtree(run.workdir, ignore_errors=True)
            result.end, result.log_csn = run.checkpoint.position, run.checkpoint.log_csn
            result.timings = dict(timer.phases)
            with store.transaction() as cur:
                ckpt.record_run(cur, state, {
                    "started_at": started_at, "started_from": started_from, "start_seqno": result.start.seqno,
                    "start_rba": result.start.rba, "end_seqno": result.end.seqno, "end_rba": result.end.rba,
                    "log_csn": str(result.log_csn) if result.log_csn else None, "groups": result.groups,
                    "transactions": result.transactions, "operations": result.operations, "skipped": result.skipped,
                    "replayed_groups": result.replayed_groups, "parallel_groups": result.parallel_groups,
                    "collisions": result.collisions,
                    "timings": {k: round(v, 3) for k, v in result.timings.items()}})
                runcounts.record(cur, "replicat", name, runcounts.last_run_id(cur, "replicat_run"), started_at,
                                 _mapped(result.counts, run.plans))
            return result
        finally:
            release_target(connection, name)
