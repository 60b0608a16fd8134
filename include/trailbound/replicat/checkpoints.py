"""Replicat checkpoints in the metadata store (the file checkpoint) and the group registry.

The file checkpoint is committed right after each target commit, together with the
group's `trail_reader` row (trail purge keeps every file a reader has not passed). The
checkpoint table in the target is authoritative; see `checkpoint_table.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from trailbound.metadata import load_group_row
from trailbound.positions import Csn, Scn, TrailPosition
from trailbound.trail import catalog

READER_KIND = "replicat"


@dataclass(frozen=True)
class Checkpoint:
    """Where a replicat is: the next trail record to read, and the CSN at or below which
    every transaction is applied (None: nothing applied yet)."""

    position: TrailPosition
    log_csn: Csn | None = None
    log_bsn: Scn | None = None
    audit_ts: datetime | None = None

    def describe(self) -> str:
        return f"seqno {self.position.seqno} rba {self.position.rba}, log_csn {self.log_csn or 'none'}"


@dataclass
class ReplicatState:
    group: str
    exttrail: str
    checkpoint_table: str
    checkpoint: Checkpoint
    startup: TrailPosition | None = None
    created_at: datetime | None = None
    altered_at: datetime | None = None
    last_started: datetime | None = None
    last_run_end: datetime | None = None
    updated_at: datetime | None = None


def load(cur, group: str) -> ReplicatState | None:
    row = load_group_row(cur, "replicat", group, ("seqno", "rba", "log_csn", "log_bsn", "audit_ts", "startup_seqno",
                                                  "startup_rba", "updated_at"))
    if row is None:
        return None
    startup = TrailPosition(row["startup_seqno"], row["startup_rba"]) if row["startup_seqno"] is not None else None
    return ReplicatState(row["group_name"], row["exttrail"], row["checkpoint_table"],
                         Checkpoint(TrailPosition(row["seqno"], row["rba"]),
                                    Csn.parse(row["log_csn"]) if row["log_csn"] else None,
                                    Scn(row["log_bsn"]) if row["log_bsn"] is not None else None,
                                    row["audit_ts"]),
                         startup, row["created_at"], row["altered_at"], row["last_started"], row["last_run_end"],
                         row["updated_at"])


def add_group(cur, group: str, exttrail: str, checkpoint_table: str) -> None:
    """ADD REPLICAT: registered at the start of its trail, and at once a reader of it."""
    cur.execute("INSERT INTO trailbound.replicat_group (group_name, exttrail, checkpoint_table) VALUES (%s, %s, %s)",
                (group, exttrail, checkpoint_table))
    cur.execute("INSERT INTO trailbound.replicat_checkpoint (group_name) VALUES (%s)", (group,))
    catalog.set_reader_position(cur, exttrail, READER_KIND, group, TrailPosition(0, 0))


def switch_trail(cur, state: ReplicatState, exttrail: str, checkpoint_table: str) -> None:
    """ALTER REPLICAT ... EXTTRAIL: read another trail from now on (re-created lost trails).
    The group stops holding the old trail against purge."""
    catalog.drop_reader(cur, READER_KIND, state.group, state.exttrail)
    cur.execute("UPDATE trailbound.replicat_group SET exttrail = %s, checkpoint_table = %s WHERE group_name = %s",
                (exttrail, checkpoint_table, state.group))
    state.exttrail, state.checkpoint_table = exttrail, checkpoint_table


def save(cur, state: ReplicatState, checkpoint: Checkpoint) -> None:
    """Commit a new file checkpoint and the group's trail reader position (call inside one
    metadata transaction)."""
    csn = checkpoint.log_csn
    cur.execute("UPDATE trailbound.replicat_checkpoint SET seqno = %s, rba = %s, log_csn = %s, log_csn_scn = %s,"
                " log_bsn = %s, audit_ts = %s, updated_at = now() WHERE group_name = %s",
                (checkpoint.position.seqno, checkpoint.position.rba, str(csn) if csn else None,
                 csn.scn if csn else None, checkpoint.log_bsn.value if checkpoint.log_bsn is not None else None,
                 checkpoint.audit_ts, state.group))
    catalog.set_reader_position(cur, state.exttrail, READER_KIND, state.group, checkpoint.position)
    state.checkpoint = checkpoint


def mark_started(cur, state: ReplicatState, started_at: datetime, startup: TrailPosition) -> None:
    cur.execute("UPDATE trailbound.replicat_group SET last_started = %s WHERE group_name = %s",
                (started_at, state.group))
    cur.execute("UPDATE trailbound.replicat_checkpoint SET startup_seqno = %s, startup_rba = %s"
                " WHERE group_name = %s", (startup.seqno, startup.rba, state.group))
    state.last_started, state.startup = started_at, startup


def mark_altered(cur, state: ReplicatState) -> None:
    cur.execute("UPDATE trailbound.replicat_group SET altered_at = now() WHERE group_name = %s", (state.group,))


def record_run(cur, state: ReplicatState, run: dict) -> None:
    cur.execute("UPDATE trailbound.replicat_group SET last_run_end = now() WHERE group_name = %s", (state.group,))
    cur.execute("INSERT INTO trailbound.replicat_run (group_name, started_at, started_from, start_seqno, start_rba,"
                " end_seqno, end_rba, log_csn, groups, transactions, operations, skipped, replayed_groups,"
                " parallel_groups, collisions, timings) VALUES (%(group)s, %(started_at)s, %(started_from)s,"
                " %(start_seqno)s, %(start_rba)s, %(end_seqno)s, %(end_rba)s, %(log_csn)s, %(groups)s,"
                " %(transactions)s, %(operations)s, %(skipped)s, %(replayed_groups)s, %(parallel_groups)s,"
                " %(collisions)s, %(timings)s)",
                {**run, "group": state.group, "timings": json.dumps(run["timings"])})


def history(cur, group: str, count: int) -> list[dict]:
    cur.execute("SELECT * FROM trailbound.replicat_run WHERE group_name = %s ORDER BY run_id DESC LIMIT %s",
                (group, count))
    return cur.fetchall()
