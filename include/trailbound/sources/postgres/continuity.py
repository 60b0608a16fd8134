"""Is the slot still the one the archive was pulled from? A gap in the log is refused,
never archived as if nothing happened (docs/live-postgres.md, "When the slot is lost").

A logical slot is what keeps the source's changes for the archive: it resumes at its
confirmed position, and the miner confirms it only to what the archive durably holds,
never past the archive's end (its last segment's next_scn). So the archive's own slot
always resumes at or before the archive's end. A slot that resumes past it was dropped
and created again under the same name (a new slot starts where the server's WAL is when
it is made, and skips every transaction still running then) or advanced by hand
(`pg_replication_slot_advance`): the changes in between were never sent and never will
be. A slot that is gone, or that the server invalidated (`max_slot_wal_keep_size`: the
WAL it still needed was removed), cannot send them either; nor can a slot of the same
name made for another database or another output plugin.

Each of these is found before anything is read and refused with one line naming the
slot and the gap: nothing is archived, the slot is not moved. Only the user closes a
gap: `trailbound alter source S --accept-gap` records it in the archive (admin.py), and
a new load of the tables brings the target back to the source.
"""

from __future__ import annotations

from dataclasses import dataclass

from trailbound.errors import TrailboundError
from trailbound.sources.postgres.lsn import Lsn

SLOT_QUERY = ("SELECT plugin, database, confirmed_flush_lsn::text, restart_lsn::text, wal_status, active_pid"
              " FROM pg_replication_slots WHERE slot_name = %s")
RUNBOOK = 'see docs/live-postgres.md, "When the slot is lost"'


@dataclass(frozen=True)
class SlotState:
    """A logical slot as pg_replication_slots shows it."""

    name: str
    plugin: str
    database: str
    confirmed: Lsn | None      # where it resumes sending (confirmed_flush_lsn)
    restart: Lsn | None        # the oldest WAL it keeps (NULL once invalidated)
    wal_status: str | None     # reserved | extended | unreserved (at risk) | lost (invalidated)
    active_pid: int | None

    @classmethod
    def from_row(cls, name: str, row: tuple) -> "SlotState":
        plugin, database, confirmed, restart, wal_status, pid = row
        return cls(name, plugin, database, Lsn.parse(confirmed) if confirmed else None,
                   Lsn.parse(restart) if restart else None, wal_status, pid)


def read_slot(cursor, name: str) -> SlotState | None:
    """The slot `name` on the server `cursor` is connected to (None: there is none)."""
    cursor.execute(SLOT_QUERY, (name,))
    row = cursor.fetchone()
    return SlotState.from_row(name, row) if row else None


@dataclass(frozen=True)
class Gap:
    """Why the slot cannot continue the archive, and where the archive ends."""

    slot: str
    reason: str                 # gone | invalidated | foreign | ahead
    archive_end: Lsn            # the archive's last next_scn: everything before it is archived
    slot_start: Lsn | None = None  # where the slot resumes (ahead, foreign)
    detail: str = ""

    @property
    def missing_bytes(self) -> int | None:
        """WAL between the archive's end and where the slot resumes, never archived."""
        return self.slot_start.value - self.archive_end.value if self.reason == "ahead" else None

    def describe(self) -> str:
        end = f"the archive ends at LSN {self.archive_end}"
        if self.reason == "gone":
            return (f"replication slot {self.slot!r} is gone from the source (dropped behind the pipeline): {end} "
                    "and no slot keeps the changes written after it")
        if self.reason == "invalidated":
            return (f"replication slot {self.slot!r} was invalidated by the server (wal_status lost: it removed WAL "
                    f"the slot still needed, max_slot_wal_keep_size): {end} and the changes after it are gone from "
                    "the log")
        if self.reason == "foreign":
            return f"replication slot {self.slot!r} is not this archive's: {self.detail}; {end}"
        return (f"replication slot {self.slot!r} resumes at LSN {self.slot_start}, past the archive's end at LSN "
                f"{self.archive_end}: the {self.missing_bytes} bytes of WAL between them were never archived (the "
                "slot was dropped and created again, or advanced, behind the pipeline)")


def find_gap(slot: str, state: SlotState | None, archive_end: Lsn, database: str) -> Gap | None:
    """The gap between the archive and the slot `state` on the database `database`, if any."""
    if state is None:
        return Gap(slot, "gone", archive_end)
    if state.wal_status == "lost":
        return Gap(slot, "invalidated", archive_end, state.confirmed)
    if state.plugin != "pgoutput" or state.database != database:
        return Gap(slot, "foreign", archive_end, state.confirmed,
                   f"it decodes database {state.database!r} with {state.plugin}, the source is database "
                   f"{database!r} through pgoutput")
    if state.confirmed is not None and state.confirmed > archive_end:
        return Gap(slot, "ahead", archive_end, state.confirmed)
    return None


def inspect(cursor, name: str, archive_end: Lsn) -> tuple[SlotState | None, Gap | None]:
    """The slot `name` on the server `cursor` is connected to, and its gap to an archive
    that ends at `archive_end`, if any (`info source`, `alter source --accept-gap`)."""
    state = read_slot(cursor, name)
    cursor.execute("SELECT current_database()")
    (database,), = cursor.fetchall()
    return state, find_gap(name, state, archive_end, database)


class SlotLost(TrailboundError):
    """The slot cannot continue the archive: a pull refuses, archiving nothing."""


def refuse_gap(source: str, slot: str, state: SlotState | None, archive_end: Lsn, database: str) -> None:
    gap = find_gap(slot, state, archive_end, database)
    if gap is not None:
        raise SlotLost(f"source {source}: {gap.describe()}; nothing was archived and the slot was not moved. "
                       f"`trailbound alter source {source} --accept-gap` records the gap, then load the tables "
                       f"again; {RUNBOOK}")
