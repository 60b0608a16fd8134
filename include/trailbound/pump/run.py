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

Each file is written under a temporary name and read back through the remote filesystem:
its bytes and SHA-256 checked against the source's recorded ones (PASSTHRU) or the
rewritten file's, its records decoded and counted against the catalog's; then renamed
into place, and only then committed: the pump's read and write checkpoints, the remote file's `trail_file` row, the
pump's `trail_reader` position on the source trail and the run's history row, in one
metadata transaction per file. A remote file past the committed write checkpoint is a
leftover of a run that died; the next run deletes it and ships that source file again,
so a crash anywhere followed by a re-run ships every transaction exactly once.

Files are whole units (a transaction never spans two), so a file-at-a-time commit costs
nothing in consistency and bounds what a crash on a long backlog makes the pump redo.
Local trails need no Spark; a remote URI goes through the SparkSession's Hadoop
filesystem (`trailbound.files`).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from trailbound.config import Config
from trailbound.crash import crashpoint
from trailbound import files as trailfs
from trailbound.durable import file_sha256
from trailbound.errors import TrailboundError, TrailError
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, Scn, TrailPosition
from trailbound.pump import checkpoints as pck
from trailbound.pump.checkpoints import PumpState, Shipped, ensure_pump, pump_lock
from trailbound.pump.filter import filter_parts
from trailbound import runcounts
from trailbound.runcounts import TableCounts, count_ops
from trailbound.tables import table_spec
from trailbound.trail import catalog
from trailbound.trail import format as trails

CRASH_POINTS = ("mid_copy", "before_rename", "after_copy", "after_file_commit")


@dataclass
class PumpResult:
    group: str
    exttrail: str
    rmttrail: str
    passthru: bool
    shipped: list[Shipped] = field(default_factory=list)
    note: str = ""
    transactions_written: int = 0   # transactions in the files written (trail.format.transactions_in)

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
                f"(seqno {read[0]}..{read[-1]}), {self.records_read} records; wrote {self.transactions_written} "
                f"transactions ({self.records_written} records) to ")
        text += (f"{len(written)} file(s) of {self.rmttrail} (seqno {written[0]}..{written[-1]})" if written
                 else f"no file of {self.rmttrail}")
        dropped = len(read) - len(written)
        return text + (f"; {dropped} file(s) had every record filtered out" if dropped else "")


def _pending_files(cur, state: PumpState) -> list[dict]:
    """The committed source files not shipped yet, in order, checked to be contiguous and
    still on disk (not purged)."""
    if state.read.rba > 0:
        records = catalog.file_records(cur, state.exttrail, state.read.seqno)
        if records is not None and records > state.read.rba:
            raise TrailboundError(f"pump {state.group} stopped inside trail file seqno {state.read.seqno} "
                                  f"(rba {state.read.rba}); a pump ships whole files")
    first = state.next_source_seqno()
    rows = catalog.committed_files(cur, state.exttrail, first)
    catalog.check_following(state.exttrail, rows, first, reader=f"pump {state.group}",
                            hint=f"restore it, or `trailbound delete pump {state.group}` and `trailbound add pump "
                                 f"{state.group} --extseqno N` past it (with a new rmttrail)")
    return rows


def _check_remote_end(cur, state: PumpState) -> None:
    last = catalog.extent(cur, state.rmttrail).last or 0
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
        self._file_counts = TableCounts()  # the shipped copy's operations per table (STATS), as read back
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
        log_bsn = Scn(row["log_bsn"])
        if self.patterns is None:
            local = self._local_copy(row)
            expected, records, bytes_ = row["sha256"], row["records"], row["bytes"]
            first_csn, last_csn = Csn.parse(row["first_csn"]), Csn.parse(row["last_csn"])
        else:
            # Read, filtered and written a row group at a time: a file holds whole
            # transactions, and one transaction can be millions of records.
            parts = trails.read_parts(row["path"], sha256=row["sha256"], records=row["records"], fs=self.source_fs)
            _, name = trailfs.split(self.state.rmttrail)
            info = trails.write_streamed_file(self.staging / name, remote_seqno, filter_parts(parts, self.patterns),
                                              group=self.state.group, log_bsn=log_bsn)
            if info is None:  # none of the file's tables is selected
                self._commit(row, None, None)
                return
            local, expected, records, bytes_ = info.path, info.sha256, info.records, info.bytes
            first_csn, last_csn = info.first_csn, info.last_csn
        self._copy_verified(local, expected, records, bytes_, target, row)
        transactions = trails.count_transactions(local)  # once the copy is verified: a damaged file is named first
        remote = trails.TrailFileInfo(remote_seqno, target, records, bytes_, expected, first_csn, last_csn,
                                      log_bsn)
        self._commit(row, remote, last_csn)
        self.result.transactions_written += transactions

    def _local_copy(self, row: dict) -> Path:
        if not self.source_fs.exists(row["path"]):
            raise TrailError(row["path"], f"listed as committed (seqno {row['seqno']}) but not there; "
                                          "nothing was shipped", rba=0)
        if trailfs.is_local(row["path"]):
            return trailfs.local_path(row["path"])
        local = self.staging / f"source{row['seqno']:09d}"
        self.source_fs.download(row["path"], local)
        return local

    def _copy_verified(self, local: Path, expected: str, records: int, bytes_: int, target: str, row: dict) -> None:
        """Upload, then read the copy back through the remote filesystem and check it
        against the file shipped (bytes, SHA-256, and its records decoded and counted)
        before it is renamed into place and committed."""
        temporary = trailfs.temporary_location(target)
        self.remote_fs.upload(local, temporary, on_chunk=lambda: crashpoint("mid_copy"))
        shipped = trailfs.WrittenFile(temporary, records, bytes_, expected)

        def count_records(location: str) -> int:
            # The copy's bytes are the committed file's (its SHA-256 was checked first);
            # its records are counted, with its operations per table (STATS PUMP), from
            # two columns a row group at a time: a pump's memory does not grow with a
            # file that holds one huge transaction.
            self._file_counts = TableCounts()
            records = 0
            for part in trails.read_columns(location, ["table", "op"], fs=self.remote_fs):
                self._file_counts.add_rows(count_ops(part))
                records += len(part)
            return records

        problem = trailfs.check_written(shipped, self.remote_fs, writer=f"pump {self.state.group}",
                                        count_records=count_records)
        if problem is not None:
            self.remote_fs.delete(temporary)
            if self.patterns is None and (source := file_sha256(local)) != expected:
                raise TrailError(row["path"], f"file checksum {source} does not match the recorded {expected}: "
                                              "the source trail file is damaged; nothing was shipped", rba=0)
            raise TrailError(target, f"the copy is not the file shipped from {row['path']}: {problem}", rba=0)
        crashpoint("before_rename")
        self.remote_fs.rename(temporary, target)
        crashpoint("after_copy")

    def _commit(self, row: dict, remote: trails.TrailFileInfo | None, last_csn: Csn | None) -> None:
        state = self.state
        read = TrailPosition(row["seqno"], row["records"])
        write = remote.end if remote else state.write
        last_csn = last_csn or state.last_csn
        shipped = Shipped(row["seqno"], row["records"], remote.seqno if remote else None,
                          remote.records if remote else 0)
        self.result.shipped.append(shipped)
        checkpoints = {"read": str(read), "write": str(write), "last_csn": str(last_csn) if last_csn else None}
        run = {"started_at": self.started_at, "files_read": len(self.result.shipped),
               "files_written": len(self.result.files_written), "records_read": self.result.records_read,
               "records_written": self.result.records_written, "checkpoints": checkpoints}
        with self.store.transaction() as cur:
            self.run_id = pck.commit_file(cur, state, read=read, write=write, last_csn=last_csn, remote=remote,
                                          shipped=shipped, run=run, run_id=self.run_id, patterns=self.patterns)
            if remote is not None:
                runcounts.record(cur, "pump", state.group, self.run_id, self.started_at, self._file_counts)
        self._file_counts = TableCounts()
        self.state = PumpState(state.group, state.exttrail, state.rmttrail, table_spec(self.patterns), read, write,
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
            pck.mark_started(cur, name, started_at)
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


