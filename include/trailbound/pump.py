"""One pump run: ship the committed files of a trail to a remote trail (docs/pump.md).

A pump (GoldenGate's data pump) reads only files a committed write checkpoint covers
(`trailbound.trail_file` rows of its source trail) and writes them, one remote file per
source file, to the remote trail: its own prefix and seqnos, at a local path or a
Hadoop-compatible URI.

- PASSTHRU (no `table` filter): the file is copied byte for byte, never decoded.
- With a `table` filter: the file is decoded, records of other tables dropped, RBAs
  renumbered and transaction indicators rewritten at the new transaction boundaries (a
  transaction with no record left disappears), and written anew; a file with no record
  left produces no remote file.

Each file is written under a temporary name, its SHA-256 checked against the source's
recorded one (PASSTHRU) or the rewritten file's, renamed into place, and only then
committed: the pump's read and write checkpoints, the remote file's `trail_file` row, the
pump's `trail_reader` position on the source trail and the run's history row, in one
metadata transaction per file. A remote file past the committed write checkpoint is a
leftover of a run that died; the next run deletes it and ships that source file again,
so a crash anywhere followed by a re-run ships every transaction exactly once.

Files are whole units (a transaction never spans two), so a file-at-a-time commit costs
nothing in consistency and bounds what a crash on a long backlog makes the pump redo.
Local trails need no Spark; a remote URI goes through the SparkSession's Hadoop
filesystem (`trailbound.trailfs`).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound import trail as trails
from trailbound import trailfs
from trailbound.config import Config
from trailbound.crash import crashpoint
from trailbound.errors import TrailboundError
from trailbound.grouplock import GroupLock, is_running
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, TrailPosition

CRASH_POINTS = ("mid_copy", "before_rename", "after_copy", "after_file_commit")
READER_KIND = "pump"


def pump_lock(store: MetadataStore, group: str) -> GroupLock:
    """Holds the pump group for a whole run; `delete pump` takes it too. It waits a few
    seconds: a retry right after a crash should not be refused while the server has not
    yet noticed the dead process's connection."""
    return GroupLock(store, "pump", group, wait="5s")


# ---------------------------------------------------------------- state

@dataclass(frozen=True)
class PumpState:
    group: str
    exttrail: str                 # the source trail, as trail_file.trail keys it
    rmttrail: str                 # the remote trail
    table_spec: str | None        # the filter last run with (None: PASSTHRU)
    read: TrailPosition           # source: files below read.seqno shipped, read.rba records of read.seqno
    write: TrailPosition          # remote: the last file committed (seqno 0: none) and its records
    last_csn: Csn | None
    created_at: datetime | None = None
    last_started: datetime | None = None
    last_run_end: datetime | None = None
    updated_at: datetime | None = None

    def next_source_seqno(self) -> int:
        """The first source file not yet shipped: read.seqno itself when none of its
        records were read (a pump added at an --extseqno), else the one after it."""
        return self.read.seqno if self.read.seqno > 0 and self.read.rba == 0 else self.read.seqno + 1


def load(cur, group: str) -> PumpState | None:
    cur.execute("SELECT g.*, c.read_seqno, c.read_rba, c.write_seqno, c.write_rba, c.last_csn, c.updated_at"
                " FROM trailbound.pump_group g JOIN trailbound.pump_checkpoint c USING (group_name)"
                " WHERE upper(g.group_name) = upper(%s)", (group,))
    row = cur.fetchone()
    if row is None:
        return None
    return PumpState(row["group_name"], row["exttrail"], row["rmttrail"], row["table_spec"],
                     TrailPosition(row["read_seqno"], row["read_rba"]),
                     TrailPosition(row["write_seqno"], row["write_rba"]),
                     Csn.parse(row["last_csn"]) if row["last_csn"] else None, row["created_at"], row["last_started"],
                     row["last_run_end"], row["updated_at"])


def _table_spec(patterns: list[str] | None) -> str | None:
    return None if patterns is None else ",".join(patterns)


def ensure_pump(store: MetadataStore, config: Config, group: str, *, extseqno: int | None = None) -> PumpState:
    """The pump's state, adding it (ADD EXTRACT ... EXTTRAILSOURCE, ADD RMTTRAIL) if new.
    Adding registers it as a reader of its source trail at once: from then on trail purge
    keeps every file it has not shipped."""
    name = config.pump_name(group)
    pump = config.pump(name)
    exttrail, rmttrail = config.trail_location(pump.exttrail), config.trail_location(pump.rmttrail)
    with store.transaction() as cur:
        state = load(cur, name)
        if state is not None:
            if (state.exttrail, state.rmttrail) != (exttrail, rmttrail):
                raise TrailboundError(
                    f"pump {name} was added reading trail {state.exttrail} into {state.rmttrail}; the configuration "
                    f"now says {exttrail} into {rmttrail}. Restore the configuration, or `trailbound delete pump "
                    f"{name}` and add it again")
            if extseqno is not None:
                raise TrailboundError(f"pump {name} is already added")
            return state
        cur.execute("SELECT group_name FROM trailbound.pump_group WHERE rmttrail = %s", (rmttrail,))
        other = cur.fetchone()
        if other is not None:
            raise TrailboundError(f"pump {other['group_name']} already writes remote trail {rmttrail}")
        cur.execute("SELECT min(seqno) AS first, max(seqno) AS last, min(written_by) AS writer"
                    " FROM trailbound.trail_file WHERE trail = %s", (rmttrail,))
        held = cur.fetchone()
        if held["last"] is not None:
            raise TrailboundError(
                f"remote trail {rmttrail} already holds committed files (seqno {held['first']}..{held['last']}, "
                f"written by {held['writer']}); a new pump starts an empty trail: choose another rmttrail for {name}")
        start = TrailPosition(extseqno, 0) if extseqno is not None else TrailPosition(0, 0)
        if start.seqno < 0:
            raise TrailboundError("--extseqno is a trail file seqno, 1 or more")
        cur.execute("INSERT INTO trailbound.pump_group (group_name, exttrail, rmttrail, table_spec)"
                    " VALUES (%s, %s, %s, %s)", (name, exttrail, rmttrail, _table_spec(pump.table)))
        cur.execute("INSERT INTO trailbound.pump_checkpoint (group_name, read_seqno, read_rba) VALUES (%s, %s, %s)",
                    (name, start.seqno, start.rba))
        _set_reader_position(cur, exttrail, name, start)
        return load(cur, name)


def _set_reader_position(cur, trail: str, group: str, position: TrailPosition) -> None:
    cur.execute("INSERT INTO trailbound.trail_reader (trail, reader_kind, group_name, seqno, rba)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (trail, reader_kind, group_name)"
                " DO UPDATE SET seqno = EXCLUDED.seqno, rba = EXCLUDED.rba, updated_at = now()",
                (trail, READER_KIND, group, position.seqno, position.rba))


def delete_pump(store: MetadataStore, config: Config, group: str) -> PumpState:
    """DELETE EXTRACT for a pump: forget its checkpoints and its reader registration (it
    no longer holds its source trail against purge). Remote files stay."""
    name = config.pump_name(group)
    with pump_lock(store, name), store.transaction() as cur:
        state = load(cur, name)
        if state is None:
            raise TrailboundError(f"pump {name} is not added")
        cur.execute("DELETE FROM trailbound.pump_group WHERE group_name = %s", (name,))
        cur.execute("DELETE FROM trailbound.trail_reader WHERE reader_kind = %s AND group_name = %s",
                    (READER_KIND, name))
    return state


# ---------------------------------------------------------------- table filter (pure)

def table_regex(patterns: list[str]) -> re.Pattern:
    """TABLE patterns (`shop.*`, `hr.emp?`) as one regex over whole names, as capture
    matches them: * any run of characters, ? one, everything else literal, case-sensitive."""
    def one(pattern: str) -> str:
        return "".join(".*" if p == "*" else "." if p == "?" else re.escape(p) for p in re.split(r"([*?])", pattern))
    return re.compile("(?:" + "|".join(one(p) for p in patterns) + ")", re.DOTALL)


def filter_records(table: pa.Table, patterns: list[str]) -> pa.Table:
    """The records of the selected tables, as a trail file of their own: RBAs from 0 and
    transaction indicators rewritten at the new boundaries. A transaction that keeps no
    record disappears; one that keeps one record becomes WHOLE."""
    regex = table_regex(patterns)
    names = [n for n in pc.unique(table.column("table")).to_pylist() if n is not None and regex.fullmatch(n)]
    keep = pc.fill_null(pc.is_in(table.column("table"), pa.array(names, pa.string())), False)
    keep_np = np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool)
    starts = np.isin(table.column("trans_ind").to_numpy(), (trails.BEGIN, trails.WHOLE))
    transaction = np.cumsum(starts)[keep_np]
    kept = table.filter(pa.array(keep_np))
    count = len(kept)
    if count == 0:
        return kept
    first = np.ones(count, dtype=bool)
    first[1:] = transaction[1:] != transaction[:-1]
    last = np.ones(count, dtype=bool)
    last[:-1] = first[1:]
    indicator = np.where(first & last, trails.WHOLE,
                         np.where(first, trails.BEGIN, np.where(last, trails.END, trails.MIDDLE))).astype(np.int8)
    kept = kept.set_column(kept.schema.get_field_index("trans_ind"), "trans_ind", pa.array(indicator, pa.int8()))
    return kept.set_column(kept.schema.get_field_index("rba"), "rba", pa.array(np.arange(count), pa.int64()))


# ---------------------------------------------------------------- one run

@dataclass(frozen=True)
class Shipped:
    source_seqno: int
    source_records: int
    remote_seqno: int | None      # None: every record filtered out
    remote_records: int = 0


@dataclass
class PumpResult:
    group: str
    exttrail: str
    rmttrail: str
    passthru: bool
    shipped: list[Shipped] = field(default_factory=list)
    note: str = ""

    @property
    def records_read(self) -> int:
        return sum(s.source_records for s in self.shipped)

    @property
    def records_written(self) -> int:
        return sum(s.remote_records for s in self.shipped)

    @property
    def files_written(self) -> list[int]:
        return [s.remote_seqno for s in self.shipped if s.remote_seqno is not None]

    def describe(self) -> str:
        if self.note:
            return f"Pump {self.group}: {self.note}"
        read = [s.source_seqno for s in self.shipped]
        written = self.files_written
        mode = "PASSTHRU" if self.passthru else "filtered"
        text = (f"Pump {self.group} ({mode}): read {len(read)} file(s) of {self.exttrail} "
                f"(seqno {read[0]}..{read[-1]}), {self.records_read} records; wrote {self.records_written} records to ")
        text += (f"{len(written)} file(s) of {self.rmttrail} (seqno {written[0]}..{written[-1]})" if written
                 else f"no file of {self.rmttrail}")
        dropped = len(read) - len(written)
        return text + (f"; {dropped} file(s) had every record filtered out" if dropped else "")


def _pending_files(cur, state: PumpState) -> list[dict]:
    """The committed source files not shipped yet, in order, checked to be contiguous and
    still on disk (not purged)."""
    if state.read.rba > 0:
        cur.execute("SELECT records FROM trailbound.trail_file WHERE trail = %s AND seqno = %s",
                    (state.exttrail, state.read.seqno))
        current = cur.fetchone()
        if current is not None and current["records"] > state.read.rba:
            raise TrailboundError(f"pump {state.group} stopped inside trail file seqno {state.read.seqno} "
                                  f"(rba {state.read.rba}); a pump ships whole files")
    first = state.next_source_seqno()
    cur.execute("SELECT * FROM trailbound.trail_file WHERE trail = %s AND seqno >= %s ORDER BY seqno",
                (state.exttrail, first))
    rows = cur.fetchall()
    for expected, row in enumerate(rows, start=first):
        if row["seqno"] != expected:
            raise TrailboundError(f"trail {state.exttrail}: file seqno {expected} is not committed but seqno "
                                  f"{row['seqno']} is; pump {state.group} cannot skip it")
        if row["purged_at"] is not None:
            raise TrailboundError(
                f"{row['path']}: trail file seqno {row['seqno']}, which pump {state.group} has not shipped, was purged "
                f"at {row['purged_at']:%Y-%m-%d %H:%M:%S}. Restore it, or `trailbound delete pump {state.group}` and "
                f"`trailbound add pump {state.group} --extseqno N` past it (with a new rmttrail)")
    return rows


def _check_remote_end(cur, state: PumpState) -> None:
    cur.execute("SELECT max(seqno) AS last FROM trailbound.trail_file WHERE trail = %s", (state.rmttrail,))
    last = cur.fetchone()["last"] or 0
    if last != state.write.seqno:
        raise TrailboundError(f"remote trail {state.rmttrail} has committed files up to seqno {last} but pump "
                              f"{state.group}'s write checkpoint is seqno {state.write.seqno}: another writer?")


def _remove_uncommitted(fs, rmttrail: str, committed_seqno: int) -> list[str]:
    """Remote files past the committed write checkpoint, and temporary files, are
    leftovers of a run that died: no reader sees them; delete them before writing again."""
    directory, name = trailfs.split(rmttrail)
    removed = []
    for entry in fs.list_names(directory):
        seqno = trailfs.seqno_of(name, entry)
        temporary = entry.startswith(".") and entry.endswith(".tmp") and trailfs.seqno_of(name, entry[1:-4]) is not None
        if temporary or (seqno is not None and seqno > committed_seqno):
            location = f"{directory.rstrip('/')}/{entry}"
            fs.delete(location)
            removed.append(location)
    return removed


class _Run:
    """The files of one run, shipped and committed one at a time."""

    def __init__(self, spark, store: MetadataStore, state: PumpState, patterns: list[str] | None, started_at: datetime):
        self.store, self.state, self.patterns, self.started_at = store, state, patterns, started_at
        self.source_fs = trailfs.for_location(state.exttrail, spark)
        self.remote_fs = trailfs.for_location(state.rmttrail, spark)
        self.run_id: int | None = None
        self.result = PumpResult(state.group, state.exttrail, state.rmttrail, patterns is None)
        self._staging: Path | None = None

    @property
    def staging(self) -> Path:
        """Local scratch space for rewritten or downloaded files: beside a local source
        trail (space planned for trails), else a temporary directory."""
        if self._staging is None:
            if trailfs.is_local(self.state.exttrail):
                self._staging = trailfs.local_path(self.state.exttrail).parent / f".pump-{self.state.group}"
                shutil.rmtree(self._staging, ignore_errors=True)
                self._staging.mkdir(parents=True)
            else:
                self._staging = Path(tempfile.mkdtemp(prefix=f"trailbound-pump-{self.state.group}-"))
        return self._staging

    def close(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)

    def ship(self, row: dict) -> None:
        remote_seqno = self.state.write.seqno + 1
        target = trailfs.file_location(self.state.rmttrail, remote_seqno)
        if self.patterns is None:
            local = self._local_copy(row)
            expected, records, bytes_ = row["sha256"], row["records"], row["bytes"]
            first_csn, last_csn = Csn.parse(row["first_csn"]), Csn.parse(row["last_csn"])
        else:
            table = trails.read_file(row["path"], fs=self.source_fs, sha256=row["sha256"])
            kept = filter_records(table, self.patterns)
            if len(kept) == 0:
                self._commit(row, None, None)
                return
            _, name = trailfs.split(self.state.rmttrail)
            info = trails.write_file(self.staging / name, remote_seqno, kept, group=self.state.group,
                                     log_bsn=row["log_bsn"])
            local, expected, records, bytes_ = info.path, info.sha256, info.records, info.bytes
            first_csn, last_csn = info.first_csn, info.last_csn
        self._copy_verified(local, expected, target, row)
        remote = {"seqno": remote_seqno, "path": target, "records": records, "bytes": bytes_, "sha256": expected,
                  "first_csn": first_csn, "last_csn": last_csn, "log_bsn": row["log_bsn"]}
        self._commit(row, remote, last_csn)

    def _local_copy(self, row: dict) -> Path:
        if not self.source_fs.exists(row["path"]):
            raise trails.TrailError(row["path"], f"listed as committed (seqno {row['seqno']}) but not there; "
                                                 "nothing was shipped", rba=0)
        if trailfs.is_local(row["path"]):
            return trailfs.local_path(row["path"])
        local = self.staging / f"source{row['seqno']:09d}"
        self.source_fs.download(row["path"], local)
        return local

    def _copy_verified(self, local: Path, expected: str, target: str, row: dict) -> None:
        temporary = trailfs.temporary_location(target)
        self.remote_fs.upload(local, temporary, on_chunk=lambda: crashpoint("mid_copy"))
        actual = self.remote_fs.sha256(temporary)
        if actual != expected:
            self.remote_fs.delete(temporary)
            if self.patterns is None and (source := trailfs.sha256_of_file(local)) != expected:
                raise trails.TrailError(row["path"], f"file checksum {source} does not match the recorded {expected}: "
                                                     "the source trail file is damaged; nothing was shipped", rba=0)
            raise trails.TrailError(target, f"the copy's checksum {actual} does not match {expected}, the file "
                                            "shipped: the copy is damaged; nothing was committed", rba=0)
        crashpoint("before_rename")
        self.remote_fs.rename(temporary, target)
        crashpoint("after_copy")

    def _commit(self, row: dict, remote: dict | None, last_csn: Csn | None) -> None:
        state = self.state
        read = TrailPosition(row["seqno"], row["records"])
        write = TrailPosition(remote["seqno"], remote["records"]) if remote else state.write
        last_csn = last_csn or state.last_csn
        shipped = Shipped(row["seqno"], row["records"], remote["seqno"] if remote else None,
                          remote["records"] if remote else 0)
        self.result.shipped.append(shipped)
        checkpoints = {"read": str(read), "write": str(write), "last_csn": str(last_csn) if last_csn else None}
        with self.store.transaction() as cur:
            if remote:
                cur.execute("INSERT INTO trailbound.trail_file (trail, seqno, path, records, bytes, sha256, first_csn,"
                            " last_csn, log_bsn, written_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            (state.rmttrail, remote["seqno"], remote["path"], remote["records"], remote["bytes"],
                             remote["sha256"], str(remote["first_csn"]), str(remote["last_csn"]), remote["log_bsn"],
                             state.group))
            cur.execute("UPDATE trailbound.pump_checkpoint SET read_seqno = %s, read_rba = %s, write_seqno = %s,"
                        " write_rba = %s, last_csn = %s, last_csn_scn = %s, updated_at = now() WHERE group_name = %s",
                        (read.seqno, read.rba, write.seqno, write.rba, str(last_csn) if last_csn else None,
                         last_csn.scn if last_csn else None, state.group))
            _set_reader_position(cur, state.exttrail, state.group, read)
            cur.execute("INSERT INTO trailbound.pump_file (group_name, source_seqno, source_records, remote_seqno,"
                        " remote_records) VALUES (%s, %s, %s, %s, %s)",
                        (state.group, shipped.source_seqno, shipped.source_records, shipped.remote_seqno,
                         shipped.remote_records))
            counts = (len(self.result.shipped), len(self.result.files_written), self.result.records_read,
                      self.result.records_written, json.dumps(checkpoints))
            if self.run_id is None:
                cur.execute("INSERT INTO trailbound.pump_run (group_name, started_at, files_read, files_written,"
                            " records_read, records_written, checkpoints) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                            " RETURNING run_id", (state.group, self.started_at, *counts))
                self.run_id = cur.fetchone()["run_id"]
            else:
                cur.execute("UPDATE trailbound.pump_run SET ended_at = now(), files_read = %s, files_written = %s,"
                            " records_read = %s, records_written = %s, checkpoints = %s WHERE run_id = %s",
                            (*counts, self.run_id))
            cur.execute("UPDATE trailbound.pump_group SET table_spec = %s, last_run_end = now() WHERE group_name = %s",
                        (_table_spec(self.patterns), state.group))
        self.state = PumpState(state.group, state.exttrail, state.rmttrail, _table_spec(self.patterns), read, write,
                               last_csn, state.created_at, self.started_at)
        crashpoint("after_file_commit")


def run_pump(spark, store: MetadataStore, config: Config, group: str) -> PumpResult:
    """Ship every committed source file the pump has not shipped. `spark` is needed only
    when a trail is not local (it may be None otherwise)."""
    name = config.pump_name(group)
    patterns = config.pump(name).table
    with pump_lock(store, name):
        started_at = datetime.now(timezone.utc)
        state = ensure_pump(store, config, name)
        with store.transaction() as cur:
            cur.execute("UPDATE trailbound.pump_group SET last_started = %s WHERE group_name = %s", (started_at, name))
            _check_remote_end(cur, state)
            pending = _pending_files(cur, state)
        run = _Run(spark, store, state, patterns, started_at)
        _remove_uncommitted(run.remote_fs, state.rmttrail, state.write.seqno)
        if not pending:
            run.result.note = f"nothing new in {state.exttrail} after seqno {state.next_source_seqno() - 1}"
            return run.result
        try:
            for row in pending:
                run.ship(row)
        finally:
            run.close()
        return run.result


def needs_spark(config: Config, group: str) -> bool:
    """Whether a pump's trails are out of the local filesystem's reach."""
    pump = config.pump(group)
    return not (trailfs.is_local(pump.exttrail) and trailfs.is_local(pump.rmttrail))


# ---------------------------------------------------------------- INFO PUMP

def _time(value) -> str:
    return "Not Available" if value is None else value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def describe_pump(store: MetadataStore, config: Config, group: str, *, showch: int | None = None) -> str:
    name = config.pump_name(group)
    with store.transaction() as cur:
        state = load(cur, name)
        if state is None:
            raise TrailboundError(f"pump {name} is not added (it is added by its first run or `trailbound add pump`)")
        cur.execute("SELECT max(seqno) AS last, count(*) FILTER (WHERE seqno >= %s) AS behind"
                    " FROM trailbound.trail_file WHERE trail = %s", (state.next_source_seqno(), state.exttrail))
        source = cur.fetchone()
        cur.execute("SELECT * FROM trailbound.pump_run WHERE group_name = %s ORDER BY run_id DESC LIMIT %s",
                    (name, showch or 0))
        runs = cur.fetchall()
    status = "RUNNING" if is_running(store, "pump", name) else "STOPPED"
    mode = "PASSTHRU" if config.pump(name).table is None else f"TABLE {', '.join(config.pump(name).table)}"
    lines = [f"PUMP       {name:<9} Last Started {_time(state.last_started)[:16]}   Status {status}",
             f"Source Trail         {state.exttrail} (committed up to seqno {source['last'] or 0}; "
             f"{source['behind']} file(s) not shipped yet)",
             f"Read Checkpoint      Seqno {state.read.seqno}, RBA {state.read.rba}",
             f"Remote Trail         {state.rmttrail} ({mode})",
             f"Write Checkpoint     Seqno {state.write.seqno}, RBA {state.write.rba}, "
             f"last CSN {state.last_csn or 'none'}"]
    if showch is None:
        return "\n".join(lines)
    lines += ["", "Current Checkpoint Detail:", "", "Read Checkpoint #1", "", "    Trail (EXTTRAILSOURCE)",
              "    Current Checkpoint (position of last record read in the source trail):",
              f"        Sequence #: {state.read.seqno}", f"        RBA: {state.read.rba}",
              f"        Extract Trail: {state.exttrail}",
              "", "Write Checkpoint #1", "", "    Trail (RMTTRAIL)", "    Current Checkpoint (current write position):",
              f"        Sequence #: {state.write.seqno}", f"        RBA: {state.write.rba}",
              f"        Timestamp: {_time(state.updated_at)}", f"        Last CSN: {state.last_csn or 'none'}",
              f"        Remote Trail: {state.rmttrail}",
              "", "    Status:", f"        Table filter = {state.table_spec or 'none (PASSTHRU)'}",
              f"        Start Time = {_time(state.last_started)}",
              f"        Last Update Time = {_time(state.last_run_end)}"]
    for run in runs:
        c = run["checkpoints"]
        lines += ["", f"Checkpoint history: run {run['run_id']} ended {_time(run['ended_at'])}, "
                      f"{run['files_read']} file(s) read ({run['records_read']} records), {run['files_written']} "
                      f"written ({run['records_written']} records)",
                  f"    Read: Seqno:RBA {c['read']}; Write: Seqno:RBA {c['write']} last CSN {c['last_csn']}"]
    return "\n".join(lines)
