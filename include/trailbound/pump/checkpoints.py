"""A pump's state in the metadata store: the group, its read and write checkpoints, the
files it shipped and its runs (migration 0005_pump.sql). Adding a pump registers it as a
reader of its source trail (trail_reader), so trail purge keeps what it has not shipped;
each shipped file commits its checkpoints, the remote file's trail_file row and the
reader position in one metadata transaction (`commit_file`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from trailbound.config import Config
from trailbound.errors import TrailboundError, changed_since_added
from trailbound.grouplock import GroupLock
from trailbound.metadata import MetadataStore, load_group_row
from trailbound.positions import Csn, TrailPosition
from trailbound.tables import table_spec
from trailbound.trail import catalog
from trailbound.trail.format import TrailFileInfo

READER_KIND = "pump"


def pump_lock(store: MetadataStore, group: str) -> GroupLock:
    """Holds the pump group for a whole run; `delete pump` takes it too."""
    return GroupLock(store, "pump", group)


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


@dataclass(frozen=True)
class Shipped:
    """One source file shipped (a pump_file row)."""

    source_seqno: int
    source_records: int
    remote_seqno: int | None      # None: every record filtered out
    remote_records: int = 0


def load(cur, group: str) -> PumpState | None:
    row = load_group_row(cur, "pump", group, ("read_seqno", "read_rba", "write_seqno", "write_rba", "last_csn",
                                              "updated_at"))
    if row is None:
        return None
    return PumpState(row["group_name"], row["exttrail"], row["rmttrail"], row["table_spec"],
                     TrailPosition(row["read_seqno"], row["read_rba"]),
                     TrailPosition(row["write_seqno"], row["write_rba"]),
                     Csn.parse(row["last_csn"]) if row["last_csn"] else None, row["created_at"], row["last_started"],
                     row["last_run_end"], row["updated_at"])


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
                raise changed_since_added(f"pump {name}", f"reading trail {state.exttrail} into {state.rmttrail}",
                                          f"{exttrail} into {rmttrail}",
                                          f"`trailbound delete pump {name}` and add it again")
            if extseqno is not None:
                raise TrailboundError(f"pump {name} is already added")
            return state
        cur.execute("SELECT group_name FROM trailbound.pump_group WHERE rmttrail = %s", (rmttrail,))
        other = cur.fetchone()
        if other is not None:
            raise TrailboundError(f"pump {other['group_name']} already writes remote trail {rmttrail}")
        held = catalog.extent(cur, rmttrail)
        if held.last is not None:
            raise TrailboundError(
                f"remote trail {rmttrail} already holds committed files (seqno {held.first}..{held.last}, "
                f"written by {held.writer}); a new pump starts an empty trail: choose another rmttrail for {name}")
        start = TrailPosition(extseqno, 0) if extseqno is not None else TrailPosition(0, 0)
        if start.seqno < 0:
            raise TrailboundError("--extseqno is a trail file seqno, 1 or more")
        cur.execute("INSERT INTO trailbound.pump_group (group_name, exttrail, rmttrail, table_spec)"
                    " VALUES (%s, %s, %s, %s)", (name, exttrail, rmttrail, table_spec(pump.table)))
        cur.execute("INSERT INTO trailbound.pump_checkpoint (group_name, read_seqno, read_rba) VALUES (%s, %s, %s)",
                    (name, start.seqno, start.rba))
        catalog.set_reader_position(cur, exttrail, READER_KIND, name, start)
        return load(cur, name)


def delete_pump(store: MetadataStore, config: Config, group: str) -> PumpState:
    """DELETE EXTRACT for a pump: forget its checkpoints and its reader registration (it
    no longer holds its source trail against purge). Remote files stay."""
    name = config.pump_name(group)
    with pump_lock(store, name), store.transaction() as cur:
        state = load(cur, name)
        if state is None:
            raise TrailboundError(f"pump {name} is not added")
        cur.execute("DELETE FROM trailbound.pump_group WHERE group_name = %s", (name,))
        catalog.drop_reader(cur, READER_KIND, name)
    return state




def mark_started(cur, group: str, started_at: datetime) -> None:
    cur.execute("UPDATE trailbound.pump_group SET last_started = %s WHERE group_name = %s", (started_at, group))


def commit_file(cur, state: PumpState, *, read: TrailPosition, write: TrailPosition, last_csn: Csn | None,
                remote: TrailFileInfo | None, shipped: Shipped, run: dict,
                run_id: int | None, patterns: list[str] | None) -> int:
    """One shipped source file, committed (call inside one metadata transaction): the
    remote file's trail_file row (None: every record was filtered out), the read and write
    checkpoints, the reader position on the source trail, the pump_file row and the
    run's history row, which
    `run_id` names after the first file. Returns the run_id."""
    if remote:
        catalog.register(cur, state.rmttrail, [remote], state.group)
    cur.execute("UPDATE trailbound.pump_checkpoint SET read_seqno = %s, read_rba = %s, write_seqno = %s,"
                " write_rba = %s, last_csn = %s, last_csn_scn = %s, updated_at = now() WHERE group_name = %s",
                (read.seqno, read.rba, write.seqno, write.rba, str(last_csn) if last_csn else None,
                 last_csn.scn if last_csn else None, state.group))
    catalog.set_reader_position(cur, state.exttrail, READER_KIND, state.group, read)
    cur.execute("INSERT INTO trailbound.pump_file (group_name, source_seqno, source_records, remote_seqno,"
                " remote_records) VALUES (%s, %s, %s, %s, %s)",
                (state.group, shipped.source_seqno, shipped.source_records, shipped.remote_seqno,
                 shipped.remote_records))
    counts = (run["files_read"], run["files_written"], run["records_read"], run["records_written"],
              json.dumps(run["checkpoints"]))
    if run_id is None:
        cur.execute("INSERT INTO trailbound.pump_run (group_name, started_at, files_read, files_written,"
                    " records_read, records_written, checkpoints) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    " RETURNING run_id", (state.group, run["started_at"], *counts))
        run_id = cur.fetchone()["run_id"]
    else:
        cur.execute("UPDATE trailbound.pump_run SET ended_at = now(), files_read = %s, files_written = %s,"
                    " records_read = %s, records_written = %s, checkpoints = %s WHERE run_id = %s",
                    (*counts, run_id))
    cur.execute("UPDATE trailbound.pump_group SET table_spec = %s, last_run_end = now() WHERE group_name = %s",
                (table_spec(patterns), state.group))
    return run_id


def history(cur, group: str, count: int) -> list[dict]:
    cur.execute("SELECT * FROM trailbound.pump_run WHERE group_name = %s ORDER BY run_id DESC LIMIT %s",
                (group, count))
    return cur.fetchall()
