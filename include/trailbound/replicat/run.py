"""One replicat run: apply the trail from the checkpoint to its committed end, exactly once.

1. Hold the group (advisory locks on the metadata store and the target).
2. Start from the checkpoint table's row when there is one (it wins: it commits with the
   data), else from the file checkpoint; repair the file checkpoint from it.
3. Read the committed trail files (trailbound.trail_file) from there in chunks, verifying
   each file. In each chunk, skip transactions at or below log_csn, group whole source
   transactions into target transactions (GROUPTRANSOPS operations at least; a
   transaction with a TRUNCATE starts a new group), and split groups into units at each
   TRUNCATE.
4. Spark computes each unit's net change per table and key (netchange.py) and formats
   COPY lines; a unit that is its own net change (INSERTs of distinct keys) is formatted
   on the driver with Arrow instead (direct.py). While the driver applies one chunk, the
   next is prepared in a background thread.
5. Per group, one target transaction: TRUNCATEs, COPY + merge per table, the checkpoint
   table row, COMMIT. Then the file checkpoint and trail_reader row in the metadata store.
   A group the fast path cannot apply is rolled back and replayed transaction by
   transaction (each its own target transaction with its checkpoint row); the record the
   target refuses stops the run, named by trail file, rba, CSN, table and key.

Crash points (TRAILBOUND_CRASH_AT): mid_copy, before_target_commit, after_target_commit,
between_groups. Whatever dies where, the next run reads the checkpoint table and skips
what it holds: nothing is applied twice and nothing is lost.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import psycopg2

from trailbound import trail as trails
from trailbound import trailfs
from trailbound.archive.segments import load_defs
from trailbound.config import Config
from trailbound.crash import crashpoint
from trailbound.errors import TrailboundError
from trailbound.grouplock import GroupBusy, GroupLock, lock_key
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, TrailPosition
from trailbound.replicat import checkpoint_table as ckt
from trailbound.replicat import checkpoints as ckpt
from trailbound.replicat import direct
from trailbound.replicat import target as tgt
from trailbound.replicat.apply import (DATA_ERRORS, ApplyError, Collision, FastApplier, NeedsReplay, Replayer,
                                       ReplayStats, record_key)
from trailbound.replicat.netchange import (STEP, Shape, copy_lines, format_line, lifetime_of, net_changes,
                                           resolve_chains)

log = logging.getLogger("trailbound.replicat")
CRASH_POINTS = ("mid_copy", "before_target_commit", "after_target_commit", "between_groups")
CHUNK_RECORDS = 250_000
FILE_CHECKPOINT_SECONDS = 1.0
LOST_TRAIL_HINT = "if the trail was lost, re-create it from the source: see 'Lost trails' in docs/replicat.md"


def group_lock(store: MetadataStore, group: str) -> GroupLock:
    """Holds the replicat group for the whole run on the metadata store (alter replicat
    takes it too); hold_target holds it on the target as well, so two metadata stores
    can never drive the same group into one target."""
    return GroupLock(store, "replicat", group)


def hold_target(connection, group: str) -> None:
    # A few tries: the session of a run that has just ended keeps its lock until its
    # server process has exited, which may be a moment after the client closed it.
    for attempt in range(20):
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (f"trailbound {lock_key('replicat', group)}",))
            got = cur.fetchone()[0]
        connection.commit()
        if got:
            return
        time.sleep(0.1)
    if not got:
        raise GroupBusy(f"replicat {group} is applying to this target from another process")


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
    raise TrailboundError(
        f"replicat {name} was added reading trail {state.exttrail} with checkpoint table {state.checkpoint_table}; "
        f"the configuration now says {exttrail} and {checkpoint_table}. Restore the configuration, or start reading "
        f"the new one with `trailbound alter replicat {name} extseqno S extrba R` (see docs/replicat.md)")


# ---------------------------------------------------------------- reading the trail

@dataclass(frozen=True)
class TrailFile:
    seqno: int
    path: str
    records: int
    sha256: str


def pending_files(cur, state: ckpt.ReplicatState, start: TrailPosition) -> tuple[list[TrailFile], int]:
    """The committed files still to read from `start`, and the rba to start at in the
    first. Only files listed in trail_file exist for a reader; they must follow on."""
    rows = ckpt.committed_files(cur, state.exttrail, start.seqno)
    if start.seqno == 0:
        rows, rba = rows, 0
    elif not rows or rows[0]["seqno"] != start.seqno:
        cur.execute("SELECT max(seqno) AS last FROM trailbound.trail_file WHERE trail = %s", (state.exttrail,))
        last = cur.fetchone()["last"]
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
    files, expected = [], rows[0]["seqno"] if rows else None
    for row in rows:
        if row["seqno"] != expected:
            raise TrailboundError(f"trail {state.exttrail}: file seqno {expected} is missing from the committed trail "
                                  f"(the next listed is {row['seqno']})")
        if row.get("purged_at") is not None:
            raise TrailboundError(f"{row['path']}: purged at {row['purged_at']:%Y-%m-%d %H:%M:%S}, but replicat "
                                  f"{state.group} still needs it; {LOST_TRAIL_HINT}")
        files.append(TrailFile(row["seqno"], row["path"], row["records"], row["sha256"]))
        expected += 1
    return files, rba


def _read(file: TrailFile, fs) -> pa.Table:
    if not fs.exists(file.path):
        raise trails.TrailError(file.path, f"listed as committed (seqno {file.seqno}) but not there; {LOST_TRAIL_HINT}",
                                rba=0)
    remote = fs is not trailfs.LOCAL
    # The whole file's SHA-256 as committed, local or not: a file rewritten so that it is
    # consistent with its own footer is still not the file capture committed.
    table = trails.read_file(file.path, fs=fs if remote else None, sha256=file.sha256)
    if len(table) != file.records:
        raise trails.TrailError(file.path, f"holds {len(table)} records; the trail lists {file.records}",
                                rba=min(len(table), file.records))
    return table


# ---------------------------------------------------------------- planning a chunk

@dataclass
class Group:
    """Source transactions applied in one target transaction."""

    txns: list[int]                      # transaction ordinals in the chunk
    units: list[tuple[int, str | None]]  # (unit, table it truncates or None), in order
    end: TrailPosition                   # position after its last record
    log_csn: Csn
    log_xid: str
    cmplt_xids: list[str]
    audit_ts: datetime
    log_bsn: int
    operations: int


@dataclass
class Chunk:
    files: list[TrailFile]
    records: pa.Table                    # the chunk's records, with their seqno
    txn_starts: np.ndarray               # first record of each transaction
    groups: list[Group]
    skipped: int                         # transactions at or below log_csn
    end: TrailPosition
    unit_of_record: np.ndarray           # each record's unit (meaningful for applied records)
    group_of_txn: np.ndarray             # each transaction's group (-1: skipped)
    net: "NetRows | None" = None

    def transaction(self, txn: int) -> list[dict]:
        start = int(self.txn_starts[txn])
        stop = int(self.txn_starts[txn + 1]) if txn + 1 < len(self.txn_starts) else len(self.records)
        return self.records.slice(start, stop - start).to_pylist()

    def path_of(self, seqno: int) -> str:
        return next(f.path for f in self.files if f.seqno == seqno)


def _csn_le(columns: list[np.ndarray], bound: Csn) -> np.ndarray:
    """Vectorised (scn, thread, sequence, rba) <= bound, lexicographically."""
    result = np.ones(len(columns[0]), dtype=bool)
    for column, limit in reversed(list(zip(columns, (bound.scn, bound.thread, bound.sequence, bound.rba)))):
        result = (column < limit) | ((column == limit) & result)
    return result


def plan_chunk(files: list[TrailFile], tables: list[pa.Table], start_rba: int, log_csn: Csn | None,
               grouptransops: int) -> Chunk:
    """Everything about a chunk that needs no Spark: transactions, what is skipped,
    groups, units and each group's checkpoint values."""
    parts = []
    for index, (file, table) in enumerate(zip(files, tables)):
        if index == 0 and start_rba:
            table = table.slice(start_rba)
        parts.append(table.append_column("seqno", pa.array(np.full(len(table), file.seqno, dtype=np.int64))))
    records = pa.concat_tables(parts) if parts else pa.table({})  # chunked: no copy of the images
    n = len(records)
    ind = records.column("trans_ind").to_numpy()
    starts = np.flatnonzero((ind == trails.BEGIN) | (ind == trails.WHOLE))
    if n and (not len(starts) or starts[0] != 0):
        raise trails.TrailError(files[0].path, "not the start of a transaction: replicat positions at transaction "
                                               "boundaries (alter replicat ... extrba)", rba=start_rba)
    stops = np.append(starts[1:], n)
    unfinished = np.flatnonzero(~np.isin(ind[stops - 1], (trails.END, trails.WHOLE)))
    if len(unfinished):
        at = int(stops[unfinished[0]] - 1)
        seqno = int(records.column("seqno")[at].as_py())
        raise trails.TrailError(next(f.path for f in files if f.seqno == seqno),
                                "a transaction does not end before its trail file does",
                                rba=int(records.column("rba")[at].as_py()))
    csn_columns = [records.column(c).to_numpy()[starts] for c in ("csn", "csn_thread", "csn_sequence", "csn_rba")]
    skip = _csn_le(csn_columns, log_csn) if log_csn is not None else np.zeros(len(starts), dtype=bool)
    ops = (stops - starts).tolist()
    truncating = np.asarray(pc.equal(records.column("op"), "TRUNCATE").to_numpy(zero_copy_only=False), dtype=bool)
    has_truncate = (np.add.reduceat(truncating.astype(np.int64), starts) > 0).tolist() if n else []

    group_of_txn = np.full(len(starts), -1, dtype=np.int64)
    group, size = -1, 0
    for txn, (skipped, count, truncates) in enumerate(zip(skip.tolist(), ops, has_truncate)):
        if skipped:
            continue
        if group < 0 or size >= grouptransops or (truncates and size):
            group, size = group + 1, 0
        group_of_txn[txn] = group
        size += count

    # Units: a new one at each group's first record, at each TRUNCATE and just after it.
    boundary = np.zeros(n + 1, dtype=bool)
    applied_txns = np.flatnonzero(group_of_txn >= 0)
    if len(applied_txns):
        firsts = applied_txns[np.r_[True, group_of_txn[applied_txns][1:] != group_of_txn[applied_txns][:-1]]]
        boundary[starts[firsts]] = True
    truncate_at = np.flatnonzero(truncating)
    boundary[truncate_at] = True
    boundary[truncate_at + 1] = True
    unit_of_record = np.cumsum(boundary[:n]) - 1

    seqnos = records.column("seqno").to_numpy()
    rbas = records.column("rba").to_numpy()
    xids = records.column("xid")
    tables = records.column("table")
    commit_ts = records.column("commit_ts")
    bsns = records.column("log_bsn").to_numpy()
    truncated_table = {int(unit_of_record[r]): tables[int(r)].as_py() for r in truncate_at}
    groups: list[Group] = []
    if len(applied_txns):
        txn_groups = group_of_txn[applied_txns]
        cuts = np.flatnonzero(np.r_[True, txn_groups[1:] != txn_groups[:-1], True])
        for a, b in zip(cuts[:-1], cuts[1:]):
            txns = applied_txns[a:b].tolist()
            last_txn = txns[-1]
            last = int(stops[last_txn] - 1)
            csn_at = lambda t: Csn(*(int(col[t]) for col in csn_columns))  # noqa: E731
            last_csn = csn_at(last_txn)
            # Units never cross groups, and their numbers increase along the trail.
            first_unit, last_unit = int(unit_of_record[starts[txns[0]]]), int(unit_of_record[last])
            units = [(unit, truncated_table.get(unit)) for unit in range(first_unit, last_unit + 1)]
            groups.append(Group(
                txns=txns, units=units, end=TrailPosition(int(seqnos[last]), int(rbas[last]) + 1), log_csn=last_csn,
                log_xid=xids[int(starts[last_txn])].as_py(),
                cmplt_xids=[xids[int(starts[t])].as_py() for t in txns if int(csn_columns[0][t]) == last_csn.scn],
                audit_ts=commit_ts[int(starts[last_txn])].as_py(), log_bsn=int(bsns[last]),
                operations=int(sum(ops[t] for t in txns))))
    end = TrailPosition(int(seqnos[-1]), int(rbas[-1]) + 1) if n else TrailPosition(files[-1].seqno, files[-1].records)
    return Chunk(files, records, starts, groups, int(skip.sum()), end, unit_of_record, group_of_txn)


# ---------------------------------------------------------------- net rows from Spark

@dataclass
class UnitTable:
    table: str
    staged: tuple[int, int, int] | None = None       # (part, first line, past the last)
    counts: dict[str, int] = field(default_factory=dict)
    inserts: tuple[int, int, int] | None = None
    unresolved: bool = False


class NetRows:
    """COPY lines for a chunk, as slices: the lines of one (unit, table, step) are one
    contiguous slice of one part's data buffer, sent as is. A part must hold each
    (unit, table, step) contiguously (Arrow-made lines do, table by table); Spark's are
    sorted first."""

    def __init__(self, parts: list[pa.Table]):
        self._buffers: list[tuple[memoryview, np.ndarray]] = []
        self.units: dict[int, list[UnitTable]] = {}
        for table in parts:
            if len(table):
                self._add(table)

    def _add(self, table: pa.Table) -> None:
        part = len(self._buffers)
        lines = table.column("line").combine_chunks()
        if not pa.types.is_large_string(lines.type):
            lines = lines.cast(pa.large_string())
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
        self._buffers.append((memoryview(lines.buffers()[2]) if lines.buffers()[2] is not None else memoryview(b""),
                              offsets))
        units = table.column("unit").to_numpy()
        steps = table.column("step").to_numpy()
        names = table.column("table").combine_chunks().dictionary_encode()
        codes = names.indices.to_numpy()
        dictionary = names.dictionary.to_pylist()
        kinds = table.column("kind").to_numpy(zero_copy_only=False)
        cuts = np.flatnonzero(np.r_[True, (units[1:] != units[:-1]) | (codes[1:] != codes[:-1]) |
                                    (steps[1:] != steps[:-1]), True])
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            unit, name, step = int(units[a]), dictionary[codes[a]], int(steps[a])
            entries = self.units.setdefault(unit, [])
            entry = next((e for e in entries if e.table == name), None)
            if entry is None:
                entry = UnitTable(name)
                entries.append(entry)
            if step == 0:
                entry.unresolved = True
            elif step == 1:
                entry.staged = (part, a, b)
                found, counts = np.unique(kinds[a:b], return_counts=True)
                entry.counts = {str(k): int(c) for k, c in zip(found, counts)}
            else:
                entry.inserts = (part, a, b)

    def view(self, span: tuple[int, int, int] | None) -> memoryview | None:
        if span is None:
            return None
        part, a, b = span
        data, offsets = self._buffers[part]
        return data[int(offsets[a]):int(offsets[b])]


def _grouped(table: pa.Table) -> pa.Table:
    """Lines sorted so that each (unit, table, step) is contiguous."""
    if not len(table):
        return table
    return table.take(pc.sort_indices(table, sort_keys=[("unit", "ascending"), ("table", "ascending"),
                                                        ("step", "ascending")]))


def compute_net(spark, chunk: Chunk, plans: dict[str, tgt.TablePlan | None], workdir: Path,
                timer: "_Timer | None" = None) -> NetRows | None:
    """The COPY lines of the chunk's applied DML records: units that are their own net
    change are formatted on the driver (direct.py); the rest goes to Spark."""
    records = chunk.records
    n = len(records)
    if not chunk.groups:
        return None
    began = time.perf_counter()
    applied = np.repeat(chunk.group_of_txn >= 0, np.diff(np.append(chunk.txn_starts, n)))
    dml = applied & ~np.asarray(pc.equal(records.column("op"), "TRUNCATE").to_numpy(zero_copy_only=False), dtype=bool)
    mapped_names = [name for name, plan in plans.items() if plan is not None]
    dml &= np.asarray(pc.is_in(records.column("table"), pa.array(mapped_names, pa.string()))
                      .to_numpy(zero_copy_only=False), dtype=bool)
    chosen = np.flatnonzero(dml)
    if not len(chosen):
        return NetRows([])
    selected = records if len(chosen) == n else records.take(pa.array(chosen))
    data = pa.table({"unit": pa.array(chunk.unit_of_record[chosen].astype(np.int64)),
                     "seq": pa.array(chosen.astype(np.int64)), "table": selected.column("table"),
                     "op": selected.column("op"), "before": selected.column("before"),
                     "after": selected.column("after")})
    direct_lines, rest = direct.split(data, {name: plans[name] for name in mapped_names})
    parts = [direct_lines]
    if timer:
        timer.add("prepare: net change, units that are their own (Arrow)", time.perf_counter() - began)
    if rest.any():
        began = time.perf_counter()
        data = data.filter(pa.array(rest))
        present = set(pc.unique(data.column("table")).to_pylist())
        inputs, outputs = workdir / "in", workdir / "out"
        shutil.rmtree(workdir, ignore_errors=True)
        inputs.mkdir(parents=True)
        # Several files, so that Spark reads (and parses the images) in parallel.
        pieces = max(1, min(spark.sparkContext.defaultParallelism, len(data) // 20_000))
        step = -(-len(data) // pieces)
        for number, offset in enumerate(range(0, len(data), step)):
            pq.write_table(data.slice(offset, step), inputs / f"part-{number:05d}.parquet", compression="lz4")
        shapes = {name: Shape.of(plans[name].columns, plans[name].key) for name in sorted(present)}
        net = net_changes(spark.read.parquet(str(inputs)), shapes)
        copy_lines(net, shapes).write.mode("overwrite").parquet(str(outputs))
        parts.append(_grouped(_with_chains_resolved(pq.read_table(outputs, schema=_NET_LINES), shapes)))
        shutil.rmtree(workdir, ignore_errors=True)
        if timer:
            timer.add("prepare: net change (Spark)", time.perf_counter() - began)
    began = time.perf_counter()
    rows = NetRows(parts)
    if timer:
        timer.add("prepare: index the COPY lines", time.perf_counter() - began)
    return rows


_NET_LINES = pa.schema([("unit", pa.int64()), ("table", pa.string()), ("kind", pa.string()), ("step", pa.int8()),
                        ("line", pa.string())])


def _with_chains_resolved(lines: pa.Table, shapes: dict[str, Shape]) -> pa.Table:
    """Replace Spark's linked lifetimes (kind L: rows moved by key updates) with the net
    rows their chains come to."""
    linked = pc.equal(lines.column("kind"), "L")
    if not pc.any(linked).as_py():
        return lines
    lifetimes = [lifetime_of(json.loads(text) | {"unit": unit, "table": table}, shapes[table])
                 for unit, table, text in zip(*(lines.filter(linked).column(c).to_pylist()
                                                for c in ("unit", "table", "line")))]
    rows = resolve_chains(lifetimes)
    resolved = pa.table({"unit": [r["unit"] for r in rows], "table": [r["table"] for r in rows],
                         "kind": [r["kind"] for r in rows], "step": [STEP[r["kind"]] for r in rows],
                         "line": [format_line(r, shapes[r["table"]]) for r in rows]}, schema=_NET_LINES)
    return pa.concat_tables([lines.filter(pc.invert(linked)), resolved])


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
    collisions: int = 0
    note: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        text = (f"Replicat {self.group}: from {self.started_from} at seqno {self.start.seqno} rba {self.start.rba}"
                if self.start else f"Replicat {self.group}:")
        if self.note:
            return f"{text}: {self.note}"
        text += (f", applied {self.transactions} transactions ({self.operations} operations) in {self.groups} target "
                 f"transactions; skipped {self.skipped} already applied; now at seqno {self.end.seqno} rba "
                 f"{self.end.rba}, log_csn {self.log_csn or 'none'}")
        if self.replayed_groups:
            text += f"; {self.replayed_groups} group(s) replayed transaction by transaction"
        if self.collisions:
            text += f"; {self.collisions} collision(s) handled (HANDLECOLLISIONS)"
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

    def __init__(self, spark, store: MetadataStore, config: Config, state: ckpt.ReplicatState, connection,
                 plans, checkpoint: ckpt.Checkpoint, result: RunResult, timer: _Timer):
        self.spark, self.store, self.config, self.state = spark, store, config, state
        self.connection, self.plans, self.checkpoint, self.result, self.timer = (connection, plans, checkpoint,
                                                                               result, timer)
        replicat = config.replicat(state.group)
        self.grouptransops, self.handlecollisions = replicat.grouptransops, replicat.handlecollisions
        self.table_name = ckt.CheckpointTableName.parse(state.checkpoint_table)
        self.fast = FastApplier(connection, plans)
        self.replayer = Replayer(plans, replicat.handlecollisions)
        self.current_dir = str(config.home)
        self.workdir = config.path(Path("var") / "replicat" / state.group)
        self.fs = trailfs.for_location(state.exttrail, spark)
        self._saved_at, self._unsaved = float("-inf"), False

    # -- preparing chunks (in a background thread, one chunk ahead)

    def chunks(self, files: list[TrailFile], start_rba: int):
        batches, batch, size = [], [], 0
        for file in files:
            batch.append(file)
            size += file.records
            if size >= CHUNK_RECORDS:
                batches.append(batch)
                batch, size = [], 0
        if batch:
            batches.append(batch)
        log_csn = self.checkpoint.log_csn
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="replicat-prepare") as pool:
            pending: Future | None = None
            for number, batch in enumerate(batches):
                if pending is None:
                    pending = pool.submit(self._prepare, number, batch, start_rba if number == 0 else 0, log_csn)
                waited = time.perf_counter()
                chunk = pending.result()
                self.timer.add("apply: waiting for the next chunk", time.perf_counter() - waited)
                pending = (pool.submit(self._prepare, number + 1, batches[number + 1], 0, log_csn)
                           if number + 1 < len(batches) else None)
                try:
                    yield chunk
                except GeneratorExit:
                    if pending is not None:
                        pending.cancel()
                    raise

    def _prepare(self, number: int, files: list[TrailFile], start_rba: int, log_csn: Csn | None) -> Chunk:
        began = time.perf_counter()
        tables = [_read(f, self.fs) for f in files]
        read = time.perf_counter()
        chunk = plan_chunk(files, tables, start_rba, log_csn, self.grouptransops)
        planned = time.perf_counter()
        chunk.net = compute_net(self.spark, chunk, self.plans, self.workdir / f"chunk-{number}", self.timer)
        self.timer.add("prepare: read and verify trail files", read - began)
        self.timer.add("prepare: plan groups", planned - read)
        return chunk

    # -- applying

    def apply_chunk(self, chunk: Chunk) -> None:
        if chunk.net is not None:
            self.fast.prepare({e.table for entries in chunk.net.units.values() for e in entries})
        for group in chunk.groups:
            self.apply_group(chunk, group)
        self.result.skipped += chunk.skipped
        if chunk.end > self.checkpoint.position:
            # Past transactions already applied (skipped) after the last group: move the
            # position in both checkpoints, keeping log_csn.
            with self.connection.cursor() as cur:
                ckt.set_position(cur, self.table_name, self.state.group, chunk.end, current_dir=self.current_dir,
                                 initial_csn=self.checkpoint.log_csn)
            self.connection.commit()
            self._save(ckpt.Checkpoint(chunk.end, self.checkpoint.log_csn, self.checkpoint.log_bsn,
                                       self.checkpoint.audit_ts), now=True)
        self.flush()

    def apply_group(self, chunk: Chunk, group: Group) -> None:
        began = time.perf_counter()
        try:
            with self.connection.cursor() as cur:
                for unit, truncated in group.units:
                    if truncated is not None:
                        self.fast.truncate(cur, truncated)
                        continue
                    for entry in (chunk.net.units.get(unit, []) if chunk.net else []):
                        if entry.unresolved:
                            raise NeedsReplay(f"unit {unit} table {entry.table}")
                        self.fast.apply(cur, entry.table, chunk.net.view(entry.staged), entry.counts,
                                        chunk.net.view(entry.inserts))
                copied = time.perf_counter()
                self._write_checkpoint_row(cur, group.end, group)
                crashpoint("before_target_commit")
            self.connection.commit()
        except (*DATA_ERRORS, Collision, NeedsReplay) as exc:
            self.connection.rollback()
            self.timer.add("apply: fast path (failed, rolled back)", time.perf_counter() - began)
            self.replay_group(chunk, group, reason=exc)
            return
        except psycopg2.Error as exc:  # not the data: the target itself (a missing grant, a lost connection)
            self._rollback_quietly()
            self.flush()
            first = chunk.transaction(group.txns[0])[0]
            raise TrailboundError(f"target error applying the group from {chunk.path_of(first['seqno'])} rba "
                                  f"{first['rba']} (CSN {trails.csn_of(first)} to {group.log_csn}): "
                                  f"{(exc.pgerror or str(exc)).strip()}") from None
        except BaseException:
            self._rollback_quietly()
            raise
        committed = time.perf_counter()
        crashpoint("after_target_commit")
        self._save(ckpt.Checkpoint(group.end, group.log_csn, group.log_bsn, group.audit_ts))
        crashpoint("between_groups")
        self.result.groups += 1
        self.result.transactions += len(group.txns)
        self.result.operations += group.operations
        self.timer.add("apply: COPY and merge", copied - began)
        self.timer.add("apply: checkpoint row and commit", committed - copied)
        self.timer.add("apply: metadata checkpoint", time.perf_counter() - committed)

    def replay_group(self, chunk: Chunk, group: Group, reason: Exception) -> None:
        """Apply a group transaction by transaction, each with its checkpoint row."""
        began = time.perf_counter()
        self.result.replayed_groups += 1
        log.warning("replicat %s: the group ending at seqno %s rba %s (CSN %s) is replayed transaction by "
                    "transaction: %s", self.state.group, group.end.seqno, group.end.rba, group.log_csn,
                    str(reason).strip().splitlines()[0] if str(reason).strip() else type(reason).__name__)
        for txn in group.txns:
            records = chunk.transaction(txn)
            stats = ReplayStats()
            record = None
            try:
                with self.connection.cursor() as cur:
                    for record in records:
                        self.replayer.apply(cur, record, stats)
                    last = records[-1]
                    end = TrailPosition(last["seqno"], last["rba"] + 1)
                    csn = trails.csn_of(records[0])
                    self._write_checkpoint_row(cur, end, None, csn=csn, xid=records[0]["xid"],
                                               audit_ts=records[0]["commit_ts"], log_bsn=last["log_bsn"])
                    crashpoint("before_target_commit")
                self.connection.commit()
            except (psycopg2.Error, TrailboundError) as exc:
                self._rollback_quietly()
                if record is None:
                    raise
                self.flush()  # what did commit is recorded before the run stops
                message = (exc.pgerror or str(exc)).strip() if isinstance(exc, psycopg2.Error) else str(exc)
                raise ApplyError(chunk.path_of(record["seqno"]), record["rba"], trails.csn_of(record), record["xid"],
                                 record["op"], record["table"], record_key(self.plans.get(record["table"]), record),
                                 message) from None
            except BaseException:
                self._rollback_quietly()
                raise
            crashpoint("after_target_commit")
            self._save(ckpt.Checkpoint(end, csn, last["log_bsn"], records[0]["commit_ts"]))
            self.result.transactions += 1
            self.result.operations += stats.operations
            self.result.collisions += stats.collisions
        self.result.groups += len(group.txns)
        self.timer.add("apply: replay transaction by transaction", time.perf_counter() - began)
        crashpoint("between_groups")

    def _write_checkpoint_row(self, cur, end: TrailPosition, group: Group | None, *, csn=None, xid=None,
                              audit_ts=None, log_bsn=None) -> None:
        if group is not None:
            csn, xid, xids, audit_ts, log_bsn = (group.log_csn, group.log_xid, group.cmplt_xids, group.audit_ts,
                                                  group.log_bsn)
        else:
            xids = [xid]
        ckt.write(cur, self.table_name, self.state.group, position=end, log_csn=csn, log_bsn=log_bsn,
                  audit_ts=audit_ts, log_xid=xid, cmplt_xids=xids, current_dir=self.current_dir)

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
        self._saved_at, self._unsaved = time.monotonic(), False

    def flush(self) -> None:
        if self._unsaved:
            self._save(self.checkpoint, now=True)

    def _rollback_quietly(self) -> None:
        try:
            if not self.connection.closed:
                self.connection.rollback()
        except psycopg2.Error:
            pass


def starting_checkpoint(state: ckpt.ReplicatState, row: ckt.CheckpointRow | None) -> tuple[ckpt.Checkpoint, str]:
    """The checkpoint table's row wins over the file checkpoint: it commits with the data."""
    if row is None:
        return state.checkpoint, "file checkpoint"
    return ckpt.Checkpoint(row.position, row.log_csn, row.log_bsn, row.audit_ts), "checkpoint table"


def run_replicat(spark, store: MetadataStore, config: Config, group: str, *, target_dsn: str | None = None) -> RunResult:
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
                row = ckt.read(cur, table_name, name)
                plans = tgt.plan_tables(cur, load_defs(config.archive_dir(replicat.source)), replicat.map)
            connection.commit()
            checkpoint, started_from = starting_checkpoint(state, row)
            result = RunResult(name, started_from, checkpoint.position, checkpoint.position, checkpoint.log_csn)
            with store.transaction() as cur:
                if checkpoint != state.checkpoint:
                    ckpt.save(cur, state, checkpoint)  # repaired from the checkpoint table
                ckpt.mark_started(cur, state, started_at, checkpoint.position)
                files, start_rba = pending_files(cur, state, checkpoint.position)
            timer.add("start: checkpoints, catalog, trail listing", time.perf_counter() - began)
            if not files:
                result.note = "nothing new in the trail"
                return result
            run = _Run(spark, store, config, state, connection, plans, checkpoint, result, timer)
            for chunk in run.chunks(files, start_rba):
                run.apply_chunk(chunk)
            shutil.rmtree(run.workdir, ignore_errors=True)
            result.end, result.log_csn = run.checkpoint.position, run.checkpoint.log_csn
            result.timings = dict(timer.phases)
            with store.transaction() as cur:
                ckpt.record_run(cur, state, {
                    "started_at": started_at, "started_from": started_from, "start_seqno": result.start.seqno,
                    "start_rba": result.start.rba, "end_seqno": result.end.seqno, "end_rba": result.end.rba,
                    "log_csn": str(result.log_csn) if result.log_csn else None, "groups": result.groups,
                    "transactions": result.transactions, "operations": result.operations, "skipped": result.skipped,
                    "replayed_groups": result.replayed_groups, "collisions": result.collisions,
                    "timings": {k: round(v, 3) for k, v in result.timings.items()}})
            return result
        finally:
            connection.close()


# ---------------------------------------------------------------- ALTER REPLICAT

_MAX_BIGINT = 2 ** 63 - 1


def _just_below(csn: Csn) -> Csn:
    """The greatest CSN below `csn`: "applied up to here" for `atcsn csn`."""
    if csn.rba:
        return Csn(csn.scn, csn.thread, csn.sequence, csn.rba - 1)
    if csn.sequence:
        return Csn(csn.scn, csn.thread, csn.sequence - 1, _MAX_BIGINT)
    if csn.thread:
        return Csn(csn.scn, csn.thread - 1, _MAX_BIGINT, _MAX_BIGINT)
    return Csn(csn.scn - 1, _MAX_BIGINT, _MAX_BIGINT, _MAX_BIGINT) if csn.scn else csn


def csn_bound(how: str, text: str) -> Csn:
    """log_csn for `atcsn N` / `aftercsn N`: every transaction at or below it counts as
    applied. A bare commit SCN N means every commit at that SCN (Csn.parse sorts N before
    them all, and N+1 after them all)."""
    csn = Csn.parse(text)
    bare = "@" not in text
    if how == "atcsn":
        return csn if bare else _just_below(csn)
    return Csn(csn.scn + 1) if bare else csn


def _position_for(cur, trail: str, bound: Csn) -> TrailPosition:
    """The first committed file holding a transaction above `bound` (from its start);
    past the end of the trail when none does yet."""
    cur.execute("SELECT seqno, records, last_csn FROM trailbound.trail_file WHERE trail = %s ORDER BY seqno", (trail,))
    rows = cur.fetchall()
    for row in rows:
        if Csn.parse(row["last_csn"]) > bound:
            return TrailPosition(row["seqno"], 0)
    return TrailPosition(rows[-1]["seqno"], rows[-1]["records"]) if rows else TrailPosition(0, 0)


def reposition(store: MetadataStore, config: Config, group: str, words: list[str], *,
               target_dsn: str | None = None) -> str:
    """ALTER REPLICAT group atcsn N | aftercsn N | extseqno S [extrba R]: writes the new
    position to the checkpoint table and the file checkpoint (the next run starts there).
    extseqno keeps log_csn, so transactions already applied are still skipped."""
    usage = "usage: trailbound alter replicat GROUP atcsn N | aftercsn N | extseqno S [extrba R]"
    lowered = [w.lower() for w in words]
    name = config.replicat_name(group)
    with group_lock(store, name):
        state = ensure_group(store, config, name, adopt=lowered[:1] == ["extseqno"])
        if len(words) == 2 and lowered[0] in ("atcsn", "aftercsn"):
            try:
                bound = csn_bound(lowered[0], words[1])
            except ValueError as exc:
                raise TrailboundError(f"{exc}; {usage}") from None
            with store.transaction() as cur:
                position = _position_for(cur, state.exttrail, bound)
            log_csn, what = bound, f"{lowered[0]} {words[1]}: transactions at or below CSN {bound} count as applied"
        elif lowered[:1] == ["extseqno"] and len(words) in (2, 4) and (len(words) == 2 or lowered[2] == "extrba"):
            try:
                position = TrailPosition(int(words[1]), int(words[3]) if len(words) == 4 else 0)
            except ValueError:
                raise TrailboundError(usage) from None
            if position.seqno < 0 or position.rba < 0:
                raise TrailboundError(usage)
            log_csn, what = False, f"extseqno {position.seqno} extrba {position.rba}"
        else:
            raise TrailboundError(usage)
        table_name = ckt.CheckpointTableName.parse(state.checkpoint_table)
        connection = tgt.connect(config, target_dsn)
        try:
            hold_target(connection, name)
            with connection.cursor() as cur:
                ckt.create(cur, table_name)
                ckt.set_position(cur, table_name, name, position, log_csn=log_csn, current_dir=str(config.home))
                row = ckt.read(cur, table_name, name)
            connection.commit()
        finally:
            connection.close()
        checkpoint = ckpt.Checkpoint(row.position, row.log_csn, row.log_bsn, row.audit_ts)
        with store.transaction() as cur:
            ckpt.save(cur, state, checkpoint)
            ckpt.mark_altered(cur, state)
    return (f"REPLICAT {name} altered, {what}; the next run reads trail {state.exttrail} from seqno "
            f"{position.seqno} rba {position.rba} (log_csn {checkpoint.log_csn or 'none'})")
