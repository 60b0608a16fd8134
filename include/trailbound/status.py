"""What an operator looks at first, as data: INFO ALL (every extract, pump and replicat
with its status, lag at checkpoint and time since checkpoint), a capture's open
transactions oldest first, and the lag history of a group. The CLI prints these; the
console in Airflow shows them. Nothing here prints or formats for a screen.

Two clocks, kept apart (and both UTC):
- log time: when the source committed (or wrote) a record, from the redo archive;
- wall time: when a trailbound process checkpointed.
Lag at checkpoint = the checkpoint's wall time minus the log time of the last record it
covers (GGSCI's "Lag at Chkpt"); time since checkpoint = now minus the checkpoint's wall
time. Transaction ages are log time (the read position's time minus the start's), as
WARNLONGTRANS measures them, so a backfill reports what a live run would.

Status: RUNNING, STOPPED or ABENDED, the rule of trailbound.runlog (run_state), which
INFO EXTRACT|PUMP|REPLICAT's header applies too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from fnmatch import fnmatchcase

from trailbound import runlog
from trailbound.config import Config
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, Scn

PROGRAMS = ("extract", "pump", "replicat")


@dataclass(frozen=True)
class GroupStatus:
    """One line of INFO ALL."""

    program: str                     # extract | pump | replicat
    group: str
    status: str                      # RUNNING | STOPPED | ABENDED
    added: bool                      # False: configured, but no checkpoint yet
    checkpoint_time: datetime | None  # wall time of the last checkpoint
    lag: timedelta | None            # lag at checkpoint
    since_checkpoint: timedelta | None
    last_started: datetime | None = None
    error: str | None = None         # ABENDED: what the last run said
    error_time: datetime | None = None
    last_run: runlog.RunOutcome | None = None
    configured: bool = True          # False: the metadata store knows it, the configuration in force does not


@dataclass(frozen=True)
class OpenTransaction:
    """An open transaction of a capture, as SEND EXTRACT ... SHOWTRANS lists it."""

    group: str
    xid: str
    thread: int
    start_position: str     # thread:sequence:rba of its first record
    start_scn: Scn
    start_time: datetime    # log time
    age: timedelta          # log time: the capture's read time minus start_time
    records: int
    bytes: int
    br_state: str           # persisted at BR checkpoint #N | not persisted | skipped: why
    long_running: bool      # open longer than the group's WARNLONGTRANS


@dataclass(frozen=True)
class LagPoint:
    """A group's lag at the checkpoint of one committed run (its history table)."""

    at: datetime            # wall time the run committed
    lag: timedelta
    airflow_dag_id: str | None = None   # the Airflow DAG run whose task committed it (None: the CLI)
    airflow_run_id: str | None = None
    records: int | None = None          # records it wrote (extract, pump) or operations it applied (replicat)
    seconds: float | None = None        # its wall time, start to commit: with records, its throughput

    @property
    def records_per_second(self) -> float | None:
        return self.records / self.seconds if self.records is not None and self.seconds else None


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(timezone.utc)


def _since(now: datetime, then: datetime | None) -> timedelta | None:
    return None if then is None else max(now - then, timedelta(0))


def _lag(checkpoint: datetime | None, log_time: datetime | None) -> timedelta | None:
    if checkpoint is None or log_time is None:
        return None
    return max(checkpoint - log_time, timedelta(0))  # two machines' clocks may disagree a little


def commit_time(cur, csn: Csn) -> datetime | None:
    """The log time of a commit, from the archive catalog: the CSN names the commit
    record's segment (thread, sequence; its SCN range tells sources apart), and the time
    is interpolated by SCN between the segment's first and next times (exact at its ends,
    within one segment's span in between). None when the CSN is a bare SCN or its segment
    is not cataloged."""
    if csn.sequence == 0:
        return None
    cur.execute("SELECT first_scn, next_scn, first_time, next_time FROM trailbound.archive_segment"
                " WHERE thread = %s AND sequence = %s AND %s BETWEEN first_scn AND next_scn LIMIT 1",
                (csn.thread, csn.sequence, csn.scn))
    row = cur.fetchone()
    if row is None:
        return None
    span = row["next_scn"] - row["first_scn"]
    fraction = 0.0 if span <= 0 else (csn.scn - row["first_scn"]) / span
    return row["first_time"] + (row["next_time"] - row["first_time"]) * fraction


def info_all(store: MetadataStore, config: Config, *, now: datetime | None = None,
             pattern: str = "*", programs: tuple[str, ...] = PROGRAMS) -> list[GroupStatus]:
    """Every group of the given programs whose name matches `pattern` (GGSCI wildcards: *
    and ?) that the configuration names or the metadata store knows (added, or with a
    recorded run: another configuration's groups on the same store too, marked not
    configured), extracts first, then pumps, then replicats."""
    now = _now(now)
    outcomes = runlog.last_outcomes(store)
    rows: dict[str, dict[str, dict]] = {}
    with store.transaction() as cur:
        cur.execute("SELECT g.group_name, g.last_started, g.last_run_end,"
                    " (SELECT max(ts) FROM trailbound.extract_read_checkpoint c"
                    "   WHERE c.group_name = g.group_name AND c.kind = 'current') AS read_ts"
                    " FROM trailbound.extract_group g")
        rows["extract"] = {r["group_name"].upper(): r for r in cur.fetchall()}
        cur.execute("SELECT g.group_name, g.last_started, g.last_run_end, c.last_csn, c.updated_at"
                    " FROM trailbound.pump_group g JOIN trailbound.pump_checkpoint c USING (group_name)")
        pumps = cur.fetchall()
        for r in pumps:
            r["log_time"] = commit_time(cur, Csn.parse(r["last_csn"])) if r["last_csn"] else None
        rows["pump"] = {r["group_name"].upper(): r for r in pumps}
        cur.execute("SELECT g.group_name, g.last_started, g.last_run_end, c.audit_ts, c.updated_at"
                    " FROM trailbound.replicat_group g JOIN trailbound.replicat_checkpoint c USING (group_name)")
        rows["replicat"] = {r["group_name"].upper(): r for r in cur.fetchall()}
    configured = {"extract": config.extracts, "pump": config.pumps, "replicat": config.replicats}

    found = []
    for program in programs:
        names = {group: group for kind, group in outcomes if kind == program}
        names.update({name.upper(): name for name in configured[program]})
        names.update({key: row["group_name"] for key, row in rows[program].items()})
        in_config = {name.upper() for name in configured[program]}
        for key in sorted(k for k in names if fnmatchcase(k, pattern.upper())):
            name, row, last = names[key], rows[program].get(key), outcomes.get((program, key))
            state = runlog.group_state(store, program, name, last)
            status, error, error_time = state.status, state.error, state.error_time
            if row is None:
                found.append(GroupStatus(program, name, status, False, None, None, None, None, error, error_time,
                                         last, key in in_config))
                continue
            if program == "extract":
                checkpoint, log_time = row["last_run_end"], row["read_ts"]
            elif program == "pump":
                checkpoint, log_time = row["updated_at"], row["log_time"]
            else:
                checkpoint, log_time = row["updated_at"], row["audit_ts"]
            found.append(GroupStatus(program, name, status, True, checkpoint, _lag(checkpoint, log_time),
                                     _since(now, checkpoint), row["last_started"], error, error_time, last,
                                     key in in_config))
    return found


def open_transactions(store: MetadataStore, config: Config, group: str) -> list[OpenTransaction]:
    """A capture's open transactions at its last checkpoint, oldest first."""
    from trailbound.capture import checkpoints as ckpt

    name = config.extract_name(group)
    with store.transaction() as cur:
        state = ckpt.load(cur, name)
    if state is None:
        return []
    limit = config.extract(name).warnlongtrans.duration
    found = []
    for t in state.open:
        age = max((state.read_time or t.start.ts) - t.start.ts, timedelta(0))
        if t.skip_reason is not None:
            br = f"skipped: {t.skip_reason}"
        elif t.persisted is not None:
            through = t.persisted.through
            br = f"persisted ({t.persisted.records} records through sequence {through.sequence} rba {through.rba})"
        else:
            br = "not persisted"
        found.append(OpenTransaction(name, t.xid, t.thread, str(t.start.position),
                                     t.start.scn, t.start.ts, age, t.records, t.bytes, br,
                                     t.skip_reason is None and age > limit))
    return sorted(found, key=lambda t: (t.start_time, t.start_scn))


def lag_history(store: MetadataStore, program: str, group: str, limit: int = 200) -> list[LagPoint]:
    """Lag at checkpoint and throughput of a group's last committed runs, oldest first
    (from the stage's history table: extract_run's read time, replicat's applied CSN,
    pump's shipped CSN), each with the Airflow DAG run that committed it, when a task did (runlog.committed_by)."""
    name = group.upper()
    with store.transaction() as cur:
        if program == "extract":
            cur.execute("SELECT started_at, ended_at, records_written AS records, read_time FROM trailbound.extract_run"
                        " WHERE group_name = %s AND read_time IS NOT NULL ORDER BY run_id DESC LIMIT %s", (name, limit))
            rows = [(r, r["read_time"]) for r in cur.fetchall()]
        elif program in ("replicat", "pump"):
            query = ("SELECT started_at, ended_at, operations AS records, log_csn AS csn FROM trailbound.replicat_run"
                     " WHERE group_name = %s AND log_csn IS NOT NULL ORDER BY run_id DESC LIMIT %s") \
                if program == "replicat" else \
                ("SELECT started_at, ended_at, records_written AS records, checkpoints->>'last_csn' AS csn"
                 " FROM trailbound.pump_run WHERE group_name = %s ORDER BY run_id DESC LIMIT %s")
            cur.execute(query, (name, limit))
            rows = [(r, commit_time(cur, Csn.parse(r["csn"])) if r["csn"] else None) for r in cur.fetchall()]
        else:
            rows = []
        found = []
        for row, log_time in reversed(rows):
            if log_time is None:
                continue
            at = row["ended_at"]
            run = runlog.committed_by(cur, program, name, at)
            found.append(LagPoint(at, _lag(at, log_time), run and run.airflow_dag_id, run and run.airflow_run_id,
                                  row["records"], (at - row["started_at"]).total_seconds()))
    return found

