"""Extract checkpoints in the metadata store: load a group's state, commit a run.

A run's whole outcome (read checkpoints per thread, the write checkpoint, the trail
files it wrote, the open transactions, the run's history row) is written by
`commit_run` inside one metadata transaction. Until that commits, nothing the run did
is visible: its trail files lie past the committed write checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from psycopg2.extras import execute_values

from trailbound.positions import Csn, LogPosition, Scn, TrailPosition
from trailbound.trail import catalog
from trailbound.trail.format import TrailFileInfo

READ_KINDS = ("startup", "recovery", "current")


# The store keeps SCNs as bigint columns; they become Scn at this boundary.
def _scn(value: int | None) -> Scn | None:
    return None if value is None else Scn(value)


def _value(scn: Scn | None) -> int | None:
    return None if scn is None else scn.value


@dataclass(frozen=True)
class ReadCheckpoint:
    """A position in one thread of the redo archive, with its SCN and time."""

    position: LogPosition
    scn: Scn
    ts: datetime | None
    segment: str | None = None

    def as_json(self) -> dict:
        """The flat form the run history keeps (and INFO ... SHOWCH reads back)."""
        p = self.position
        return {"thread": p.thread, "sequence": p.sequence, "rba": p.rba, "scn": self.scn.value, "ts": self.ts,
                "segment": self.segment}


@dataclass(frozen=True)
class WriteCheckpoint:
    # seqno: the last trail file written (0: none yet); rba: records in it (the next
    # write would start a new file).
    position: TrailPosition
    last_csn: Csn | None
    written_at: datetime | None = None


@dataclass(frozen=True)
class PersistedObject:
    """A long-running transaction's records up to `through` (the log position of the
    last one), persisted at a BR checkpoint."""

    file: Path
    sha256: str
    records: int
    through: LogPosition
    checkpoint_scn: Scn


@dataclass(frozen=True)
class OpenTransaction:
    xid: str
    thread: int
    start: ReadCheckpoint
    records: int
    bytes: int
    skip_reason: str | None = None
    persisted: PersistedObject | None = None


@dataclass(frozen=True)
class BrCheckpoint:
    checkpoint_id: int
    scn: Scn
    log_time: datetime
    interval_seconds: int
    table_spec: str
    oldest_nonpersisted: dict
    persisted: int
    persisted_bytes: int
    created_at: datetime | None = None


@dataclass(frozen=True)
class Directive:
    directive_id: int
    kind: str
    xid: str | None
    thread: int | None


@dataclass
class ExtractState:
    group: str
    source: str
    exttrail: Path
    begin_scn: Scn
    begin_spec: str
    table_spec: str
    read_scn: Scn | None          # every record below was read (None: never ran, or repositioned)
    created_at: datetime | None = None
    last_started: datetime | None = None
    last_run_end: datetime | None = None
    read: dict[str, dict[int, ReadCheckpoint]] = field(default_factory=lambda: {k: {} for k in READ_KINDS})
    write: WriteCheckpoint = WriteCheckpoint(TrailPosition(0, 0), None)
    open: list[OpenTransaction] = field(default_factory=list)
    read_time: datetime | None = None
    br_suspended: str | None = None
    last_longtrans_check: datetime | None = None
    br_checkpoint: BrCheckpoint | None = None
    directives: list[Directive] = field(default_factory=list)


def load(cur, group: str) -> ExtractState | None:
    cur.execute("SELECT * FROM trailbound.extract_group WHERE upper(group_name) = upper(%s)", (group,))
    row = cur.fetchone()
    if row is None:
        return None
    state = ExtractState(group=row["group_name"], source=row["source"], exttrail=Path(row["exttrail"]),
                         begin_scn=Scn(row["begin_scn"]), begin_spec=row["begin_spec"], table_spec=row["table_spec"],
                         read_scn=_scn(row["read_scn"]), created_at=row["created_at"], last_started=row["last_started"],
                         last_run_end=row["last_run_end"], read_time=row["read_time"],
                         br_suspended=row["br_suspended"], last_longtrans_check=row["last_longtrans_check"])
    cur.execute("SELECT * FROM trailbound.extract_read_checkpoint WHERE group_name = %s", (state.group,))
    for r in cur.fetchall():
        state.read[r["kind"]][r["thread"]] = ReadCheckpoint(LogPosition(r["thread"], r["sequence"], r["rba"]),
                                                            Scn(r["scn"]), r["ts"], r["segment"])
    cur.execute("SELECT * FROM trailbound.extract_write_checkpoint WHERE group_name = %s", (state.group,))
    w = cur.fetchone()
    if w is not None:
        state.write = WriteCheckpoint(TrailPosition(w["seqno"], w["rba"]),
                                      Csn.parse(w["last_csn"]) if w["last_csn"] else None, w["written_at"])
    cur.execute("SELECT * FROM trailbound.open_transaction WHERE group_name = %s ORDER BY start_ts, thread, xid",
                (state.group,))
    state.open = [OpenTransaction(t["xid"], t["thread"],
                                  ReadCheckpoint(LogPosition(t["thread"], t["start_sequence"], t["start_rba"]),
                                                 Scn(t["start_scn"]), t["start_ts"]),
                                  t["records"], t["bytes"], t["skip_reason"],
                                  PersistedObject(Path(t["persisted_file"]), t["persisted_sha256"],
                                                  t["persisted_records"],
                                                  LogPosition(t["thread"], t["persisted_through_sequence"],
                                                              t["persisted_through_rba"]),
                                                  Scn(t["persisted_checkpoint"]))
                                  if t["persisted_file"] else None)
                  for t in cur.fetchall()]
    cur.execute("SELECT * FROM trailbound.br_checkpoint WHERE group_name = %s ORDER BY checkpoint_id DESC LIMIT 1",
                (state.group,))
    b = cur.fetchone()
    if b is not None:
        state.br_checkpoint = BrCheckpoint(b["checkpoint_id"], Scn(b["scn"]), b["log_time"], b["interval_seconds"],
                                           b["table_spec"], b["oldest_nonpersisted"], b["persisted"],
                                           b["persisted_bytes"], b["created_at"])
    cur.execute("SELECT directive_id, kind, xid, thread FROM trailbound.extract_directive"
                " WHERE group_name = %s AND state = 'pending' ORDER BY directive_id", (state.group,))
    state.directives = [Directive(d["directive_id"], d["kind"], d["xid"], d["thread"]) for d in cur.fetchall()]
    return state


def add_group(cur, *, group: str, source: str, exttrail: Path, begin_scn: Scn, begin_spec: str,
              table_spec: str) -> None:
    cur.execute("INSERT INTO trailbound.extract_group (group_name, source, exttrail, begin_scn, begin_spec,"
                " table_spec) VALUES (%s, %s, %s, %s, %s, %s)",
                (group, source, str(exttrail), begin_scn.value, begin_spec, table_spec))
    cur.execute("INSERT INTO trailbound.extract_write_checkpoint (group_name, seqno, rba) VALUES (%s, 0, 0)", (group,))


def delete_group(cur, group: str) -> bool:
    """DELETE EXTRACT: the group's row and, with it, its checkpoints; False if it was not
    added. Its trail files and its logretention registration are left alone."""
    cur.execute("DELETE FROM trailbound.extract_group WHERE group_name = %s", (group,))
    return cur.rowcount > 0


def reposition(cur, group: str, begin_scn: Scn, begin_spec: str) -> None:
    """ALTER EXTRACT BEGIN: forget read checkpoints and open transactions; the next run
    starts like a first run from the new begin point. The write checkpoint stays, so
    the trail goes on from where it is."""
    cur.execute("UPDATE trailbound.extract_group SET begin_scn = %s, begin_spec = %s, read_scn = NULL,"
                " read_time = NULL, altered_at = now() WHERE group_name = %s", (begin_scn.value, begin_spec, group))
    cur.execute("SELECT count(*) AS n FROM trailbound.open_transaction WHERE group_name = %s"
                " AND persisted_file IS NOT NULL", (group,))
    if cur.fetchone()["n"]:
        record_warning(cur, group, "br_fallback", None, None, {
            "reason": "start point moved by alter extract: persisted transactions discarded, "
                      "the next run uses normal recovery"}, None)
    cur.execute("DELETE FROM trailbound.extract_read_checkpoint WHERE group_name = %s", (group,))
    cur.execute("DELETE FROM trailbound.open_transaction WHERE group_name = %s", (group,))


def _jsonable(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Scn):
        return value.value
    if isinstance(value, (Csn, LogPosition, Path)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def record_warning(cur, group: str, kind: str, xid: str | None, thread: int | None, detail: dict,
                   log_time: datetime | None) -> None:
    cur.execute("INSERT INTO trailbound.extract_warning (group_name, kind, xid, thread, detail, log_time)"
                " VALUES (%s, %s, %s, %s, %s, %s)", (group, kind, xid, thread, json.dumps(_jsonable(detail)), log_time))


def insert_br_checkpoint(cur, group: str, scn: Scn, log_time: datetime, interval_seconds: int, table_spec: str,
                         oldest_nonpersisted: dict, persisted: int, persisted_bytes: int) -> int:
    cur.execute("INSERT INTO trailbound.br_checkpoint (group_name, scn, log_time, interval_seconds, table_spec,"
                " oldest_nonpersisted, persisted, persisted_bytes) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " RETURNING checkpoint_id",
                (group, scn.value, log_time, interval_seconds, table_spec, json.dumps(_jsonable(oldest_nonpersisted)),
                 persisted, persisted_bytes))
    return cur.fetchone()["checkpoint_id"]


def commit_run(cur, state: ExtractState, files: list[TrailFileInfo], required_scn: Scn, run: dict,
               warnings: list[dict] = (), directives_done: list[tuple[int, str]] = ()) -> None:
    """Write a run's outcome. Call inside one metadata transaction. `required_scn`: what
    the next run needs from the archive (capture.recovery.required_scn)."""
    g = state.group
    cur.execute("UPDATE trailbound.extract_group SET read_scn = %s, read_time = %s, table_spec = %s,"
                " last_started = %s, last_run_end = now(), br_suspended = %s, last_longtrans_check = %s"
                " WHERE group_name = %s",
                (_value(state.read_scn), state.read_time, state.table_spec, state.last_started, state.br_suspended,
                 state.last_longtrans_check, g))
    for warning in warnings:
        record_warning(cur, g, warning["kind"], warning.get("xid"), warning.get("thread"), warning["detail"],
                       state.read_time)
    for directive_id, result in directives_done:
        cur.execute("UPDATE trailbound.extract_directive SET state = 'done', result = %s, done_at = now()"
                    " WHERE directive_id = %s", (result, directive_id))
    cur.execute("DELETE FROM trailbound.extract_read_checkpoint WHERE group_name = %s", (g,))
    rows = [(g, c.position.thread, kind, c.position.sequence, c.position.rba, c.scn.value, c.ts, c.segment)
            for kind, by_thread in state.read.items() for c in by_thread.values()]
    if rows:
        execute_values(cur, "INSERT INTO trailbound.extract_read_checkpoint (group_name, thread, kind, sequence,"
                            " rba, scn, ts, segment) VALUES %s", rows)
    w = state.write
    cur.execute("UPDATE trailbound.extract_write_checkpoint SET seqno = %s, rba = %s, last_csn = %s,"
                " last_csn_scn = %s, written_at = now() WHERE group_name = %s",
                (w.position.seqno, w.position.rba, str(w.last_csn) if w.last_csn else None,
                 w.last_csn.scn if w.last_csn else None, g))
    catalog.register(cur, str(state.exttrail), files, g)
    cur.execute("DELETE FROM trailbound.open_transaction WHERE group_name = %s", (g,))
    if state.open:
        execute_values(cur, "INSERT INTO trailbound.open_transaction (group_name, xid, thread, start_sequence,"
                            " start_rba, start_scn, start_ts, records, bytes, skip_reason, persisted_file,"
                            " persisted_sha256, persisted_records, persisted_through_sequence,"
                            " persisted_through_rba, persisted_checkpoint) VALUES %s",
                       [(g, t.xid, t.thread, t.start.position.sequence, t.start.position.rba, t.start.scn.value,
                         t.start.ts, t.records, t.bytes, t.skip_reason,
                         *((str(p.file), p.sha256, p.records, p.through.sequence, p.through.rba,
                            p.checkpoint_scn.value) if (p := t.persisted) else (None,) * 6))
                        for t in state.open])
    checkpoints = {"read": {kind: {t: c.as_json() for t, c in by.items()} for kind, by in state.read.items()},
                   "write": {"seqno": state.write.position.seqno, "rba": state.write.position.rba,
                             "last_csn": str(state.write.last_csn) if state.write.last_csn else None}}
    cur.execute("INSERT INTO trailbound.extract_run (group_name, started_at, until_time, read_from_scn, horizon_scn,"
                " records_read, transactions, records_written, checkpoints, recovery, reread_records,"
                " read_from_time, read_time, br_checkpoint_id, timings, assembly)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (g, run["started_at"], run.get("until"), _value(run.get("read_from_scn")), _value(run.get("horizon_scn")),
                 run["records_read"], run["transactions"], run["records_written"],
                 json.dumps(_jsonable(checkpoints)), run.get("recovery"), run.get("reread_records"),
                 run.get("read_from_time"), state.read_time, run.get("br_checkpoint_id"),
                 json.dumps({phase: round(seconds, 3) for phase, seconds in run["timings"].items()})
                 if run.get("timings") else None, run.get("assembly")))
    # LOGRETENTION: a registered group's required SCN moves in the same transaction as
    # the checkpoints it is computed from, so retention never sees one without the other.
    # A run that committed could read all it needed: any restore request is done.
    cur.execute("UPDATE trailbound.capture_registration SET required_scn = %s, updated_at = now(),"
                " needs_restore = NULL WHERE group_name = %s", (required_scn.value, g))


def history(cur, group: str, count: int) -> list[dict]:
    cur.execute("SELECT * FROM trailbound.extract_run WHERE group_name = %s ORDER BY run_id DESC LIMIT %s",
                (group, count))
    return cur.fetchall()


def read(store, group: str) -> ExtractState | None:
    """`load` in a transaction of its own, for a reader outside a run (the Airflow
    sensors and trigger, the capture DAG's checks)."""
    with store.transaction() as cur:
        return load(cur, group)
