"""Extract checkpoints in the metadata store: load a group's state, commit a run.

A run's whole outcome (read checkpoints per thread, the write checkpoint, the trail
files it wrote, the open transactions, the run's history row) is written by
`commit_run` inside one metadata transaction. Until that commits, nothing the run did
is visible: its trail files lie past the committed write checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from psycopg2.extras import execute_values

from trailbound.positions import Csn, LogPosition
from trailbound.trail import TrailFileInfo

READ_KINDS = ("startup", "recovery", "current")


@dataclass(frozen=True)
class ReadCheckpoint:
    """A position in one thread of the redo archive, with its SCN and time."""

    thread: int
    sequence: int
    rba: int
    scn: int
    ts: datetime | None
    segment: str | None = None

    @property
    def position(self) -> LogPosition:
        return LogPosition(self.thread, self.sequence, self.rba)


@dataclass(frozen=True)
class WriteCheckpoint:
    seqno: int          # the last trail file written (0: none yet)
    rba: int            # records in it: the next write would start a new file
    last_csn: Csn | None
    written_at: datetime | None = None


@dataclass(frozen=True)
class OpenTransaction:
    xid: str
    thread: int
    start: ReadCheckpoint
    records: int
    bytes: int
    skip_reason: str | None = None


@dataclass
class ExtractState:
    group: str
    source: str
    exttrail: Path
    begin_scn: int
    begin_spec: str
    table_spec: str
    read_scn: int | None
    created_at: datetime | None = None
    last_started: datetime | None = None
    last_run_end: datetime | None = None
    read: dict[str, dict[int, ReadCheckpoint]] = field(default_factory=lambda: {k: {} for k in READ_KINDS})
    write: WriteCheckpoint = WriteCheckpoint(0, 0, None)
    open: list[OpenTransaction] = field(default_factory=list)

    def recovery_scn(self) -> int | None:
        """The lowest SCN a restart reads from: the oldest open transaction that will be
        written, else the read position. This is what the trail's log_bsn carries."""
        starts = [t.start.scn for t in self.open if t.skip_reason is None]
        if starts:
            return min(starts)
        return self.read_scn


def load(cur, group: str) -> ExtractState | None:
    cur.execute("SELECT * FROM trailbound.extract_group WHERE upper(group_name) = upper(%s)", (group,))
    row = cur.fetchone()
    if row is None:
        return None
    state = ExtractState(group=row["group_name"], source=row["source"], exttrail=Path(row["exttrail"]),
                         begin_scn=row["begin_scn"], begin_spec=row["begin_spec"], table_spec=row["table_spec"],
                         read_scn=row["read_scn"], created_at=row["created_at"], last_started=row["last_started"],
                         last_run_end=row["last_run_end"])
    cur.execute("SELECT * FROM trailbound.extract_read_checkpoint WHERE group_name = %s", (state.group,))
    for r in cur.fetchall():
        state.read[r["kind"]][r["thread"]] = ReadCheckpoint(r["thread"], r["sequence"], r["rba"], r["scn"], r["ts"],
                                                            r["segment"])
    cur.execute("SELECT * FROM trailbound.extract_write_checkpoint WHERE group_name = %s", (state.group,))
    w = cur.fetchone()
    if w is not None:
        state.write = WriteCheckpoint(w["seqno"], w["rba"], Csn.parse(w["last_csn"]) if w["last_csn"] else None,
                                      w["written_at"])
    cur.execute("SELECT * FROM trailbound.open_transaction WHERE group_name = %s ORDER BY start_ts, thread, xid",
                (state.group,))
    state.open = [OpenTransaction(t["xid"], t["thread"],
                                  ReadCheckpoint(t["thread"], t["start_sequence"], t["start_rba"], t["start_scn"],
                                                 t["start_ts"]), t["records"], t["bytes"], t["skip_reason"])
                  for t in cur.fetchall()]
    return state


def add_group(cur, *, group: str, source: str, exttrail: Path, begin_scn: int, begin_spec: str,
              table_spec: str) -> None:
    cur.execute("INSERT INTO trailbound.extract_group (group_name, source, exttrail, begin_scn, begin_spec,"
                " table_spec) VALUES (%s, %s, %s, %s, %s, %s)",
                (group, source, str(exttrail), begin_scn, begin_spec, table_spec))
    cur.execute("INSERT INTO trailbound.extract_write_checkpoint (group_name, seqno, rba) VALUES (%s, 0, 0)", (group,))


def reposition(cur, group: str, begin_scn: int, begin_spec: str) -> None:
    """ALTER EXTRACT BEGIN: forget read checkpoints and open transactions; the next run
    starts like a first run from the new begin point. The write checkpoint stays, so
    the trail goes on from where it is."""
    cur.execute("UPDATE trailbound.extract_group SET begin_scn = %s, begin_spec = %s, read_scn = NULL,"
                " altered_at = now() WHERE group_name = %s", (begin_scn, begin_spec, group))
    cur.execute("DELETE FROM trailbound.extract_read_checkpoint WHERE group_name = %s", (group,))
    cur.execute("DELETE FROM trailbound.open_transaction WHERE group_name = %s", (group,))


def _jsonable(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (Csn, Path)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def commit_run(cur, state: ExtractState, files: list[TrailFileInfo], run: dict) -> None:
    """Write a run's outcome. Call inside one metadata transaction."""
    g = state.group
    cur.execute("UPDATE trailbound.extract_group SET read_scn = %s, table_spec = %s, last_started = %s,"
                " last_run_end = now() WHERE group_name = %s",
                (state.read_scn, state.table_spec, state.last_started, g))
    cur.execute("DELETE FROM trailbound.extract_read_checkpoint WHERE group_name = %s", (g,))
    rows = [(g, c.thread, kind, c.sequence, c.rba, c.scn, c.ts, c.segment)
            for kind, by_thread in state.read.items() for c in by_thread.values()]
    if rows:
        execute_values(cur, "INSERT INTO trailbound.extract_read_checkpoint (group_name, thread, kind, sequence,"
                            " rba, scn, ts, segment) VALUES %s", rows)
    w = state.write
    cur.execute("UPDATE trailbound.extract_write_checkpoint SET seqno = %s, rba = %s, last_csn = %s,"
                " last_csn_scn = %s, written_at = now() WHERE group_name = %s",
                (w.seqno, w.rba, str(w.last_csn) if w.last_csn else None, w.last_csn.scn if w.last_csn else None, g))
    if files:
        # A re-run after a crash rewrites the same seqnos: the committed rows win.
        execute_values(cur, "INSERT INTO trailbound.trail_file (trail, seqno, path, records, bytes, sha256,"
                            " first_csn, last_csn, log_bsn, written_by) VALUES %s",
                       [(str(state.exttrail), f.seqno, str(f.path), f.records, f.bytes, f.sha256, str(f.first_csn),
                         str(f.last_csn), f.log_bsn, g) for f in files])
    cur.execute("DELETE FROM trailbound.open_transaction WHERE group_name = %s", (g,))
    if state.open:
        execute_values(cur, "INSERT INTO trailbound.open_transaction (group_name, xid, thread, start_sequence,"
                            " start_rba, start_scn, start_ts, records, bytes, skip_reason) VALUES %s",
                       [(g, t.xid, t.thread, t.start.sequence, t.start.rba, t.start.scn, t.start.ts, t.records,
                         t.bytes, t.skip_reason) for t in state.open])
    checkpoints = {"read": {kind: {t: asdict(c) for t, c in by.items()} for kind, by in state.read.items()},
                   "write": {"seqno": state.write.seqno, "rba": state.write.rba,
                             "last_csn": str(state.write.last_csn) if state.write.last_csn else None}}
    cur.execute("INSERT INTO trailbound.extract_run (group_name, started_at, until_time, read_from_scn, horizon_scn,"
                " records_read, transactions, records_written, checkpoints)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (g, run["started_at"], run.get("until"), run.get("read_from_scn"), run.get("horizon_scn"),
                 run["records_read"], run["transactions"], run["records_written"],
                 json.dumps(_jsonable(checkpoints))))


def committed_trail_files(cur, trail: Path) -> list[dict]:
    cur.execute("SELECT * FROM trailbound.trail_file WHERE trail = %s ORDER BY seqno", (str(trail),))
    return cur.fetchall()


def history(cur, group: str, count: int) -> list[dict]:
    cur.execute("SELECT * FROM trailbound.extract_run WHERE group_name = %s ORDER BY run_id DESC LIMIT %s",
                (group, count))
    return cur.fetchall()
