"""The replication connection: reads a pgoutput slot up to a WAL position, and confirms
to the slot only what the caller says is durable.

A pull asks the server for its current WAL position first and reads until the slot has
sent everything before it (a keepalive or a message at or past it, at a transaction
boundary), so that a pull always ends, even while the source keeps writing.

Feedback is sent only by `confirm`. psycopg2 sends feedback on its own in two cases: every
`status_interval` (made longer than any pull) and when the server asks for a reply (it asks
only when wal_sender_timeout is set; this session sets it to 0). On such a reply psycopg2
would move the flush position to the server's WAL end while the archive does not yet
hold it; with both switched off the slot moves only when we say so.

The session's TimeZone, DateStyle, IntervalStyle, bytea_output and extra_float_digits
are set in the connection's startup options, so that the values pgoutput writes (the
types' text output, produced in the walsender) have the archive's text forms whatever
the server's or the database's defaults.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from datetime import datetime
from typing import NamedTuple

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from trailbound.errors import TrailboundError
from trailbound.sources.postgres import decoder
from trailbound.sources.postgres.continuity import SlotState, read_slot
from trailbound.sources.postgres.lsn import Lsn

SESSION_OPTIONS = {
    "TimeZone": "UTC",
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "bytea_output": "hex",
    "extra_float_digits": "3",
    "wal_sender_timeout": "0",  # no reply requests: psycopg2 would answer them with a flush position of its own
}
# The transactional logical message in which a table entering the publication brings its
# rows (admin.widen_scope; the miner archives them as inserts): the slot is asked to send
# logical messages for it.
ROWS_PREFIX = "trailbound.rows"
_NEVER = 10 * 365 * 86400  # seconds: psycopg2's periodic feedback, effectively off


def session_options(extra: dict[str, str] | None = None) -> str:
    """The libpq `options` string: -c name=value for each session setting."""
    settings = SESSION_OPTIONS | (extra or {})
    return " ".join(f"-c {name}={value}" for name, value in settings.items())


# The messages that open and close what is sent of a transaction (by their type byte: Begin,
# Stream Start; Commit, Stream Stop): between a close and the next open the stream is at a
# transaction boundary.
_OPENS = frozenset(b"BS")
_CLOSES = frozenset(b"CE")


class Received(NamedTuple):
    """One decoded message and where the server says it belongs (a tuple: one is made
    per message that is not a row change)."""

    lsn: Lsn                # ReplicationMessage.data_start
    send_time: datetime     # when the server sent it, by its clock: psycopg2 gives a naive
                            # local time (the miner converts only what it archives)
    message: decoder.DecodedMessage


class SlotReader:
    """One pull's replication connection to a pgoutput slot, and a plain SQL connection
    beside it for positions and the slot's state."""

    def __init__(self, dsn: str, slot: str, publication: str, *, extra_options: dict[str, str] | None = None):
        self.dsn, self.slot, self.publication = dsn, slot, publication
        self.extra_options = extra_options
        self.sql = None
        self.replication = None
        self.cursor = None
        self.safe = None            # the highest position everything before which was received
        self.at_start: SlotState | None = None  # the slot once streaming started (held by us: it cannot change)
        self.database = None

    # ---------------------------------------------------------------- connections

    def __enter__(self) -> "SlotReader":
        self.sql = psycopg2.connect(self.dsn, options=session_options())
        self.sql.autocommit = True
        (self.database,), = self.query("SELECT current_database()")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for connection in (self.replication, self.sql):
            if connection is not None:
                connection.close()
        self.replication = self.sql = self.cursor = None

    def query(self, text: str, args=()) -> list[tuple]:
        with self.sql.cursor() as cur:
            cur.execute(text, args)
            return cur.fetchall()

    def wal_position(self) -> Lsn:
        """Where a pull started now reads to: the end of every WAL record inserted so far.

        pg_current_wal_lsn() is only what has been written out, and the slot sends only
        what has been flushed; with asynchronous commit both lag behind transactions that
        have committed. A transaction of our own that writes WAL (a logical decoding message,
        which this slot is not asked to send) and commits synchronously flushes all WAL
        before it. (A transaction that writes nothing but its commit is not flushed.)"""
        with self.sql.cursor() as cur:
            cur.execute("SET synchronous_commit = on")
            cur.execute("BEGIN")
            cur.execute("SELECT pg_logical_emit_message(true, 'trailbound.pull', '')")
            cur.execute("COMMIT")
            cur.execute("SELECT pg_current_wal_flush_lsn()::text, pg_current_wal_insert_lsn()::text")
            flushed, inserted = cur.fetchone()
            return min(Lsn.parse(flushed), Lsn.parse(inserted))

    def slot_state(self) -> SlotState | None:
        with self.sql.cursor() as cur:
            return read_slot(cur, self.slot)

    @property
    def confirmed_at_start(self) -> Lsn | None:
        return self.at_start.confirmed if self.at_start else None

    def start(self, wait_for_slot: float = 15.0) -> None:
        """Open the replication connection and start streaming from the slot's confirmed
        position. A slot still held by a killed pull's server process is waited for.
        `at_start` is then the slot as it is while this session holds it (None: there is
        no such slot); the caller checks it before reading anything (continuity.py)."""
        deadline = time.monotonic() + wait_for_slot
        while True:
            self.replication = psycopg2.connect(
                self.dsn, options=session_options(self.extra_options),
                connection_factory=psycopg2.extras.LogicalReplicationConnection)
            self.cursor = self.replication.cursor()
            try:
                self.cursor.start_replication(
                    slot_name=self.slot, decode=False, start_lsn=0, status_interval=_NEVER,
                    options={"proto_version": "2", "publication_names": self.publication, "streaming": "on",
                             "messages": "true"})
                break
            except psycopg2.errors.UndefinedObject:
                self.replication.close()
                self.replication = self.cursor = None
                return  # no such slot: at_start stays None
            except psycopg2.errors.ObjectInUse:
                # "replication slot ... is active for PID n": a killed pull's walsender has
                # not noticed its client is gone yet.
                self.replication.close()
                if time.monotonic() > deadline:
                    raise TrailboundError(f"replication slot {self.slot!r} is in use by another process "
                                          f"(is another pull running?)") from None
                time.sleep(0.3)
        self.at_start = self.slot_state()

    # ---------------------------------------------------------------- reading

    def messages(self, until: Lsn, *, patience: float = 60.0) -> Iterator[psycopg2.extras.ReplicationMessage]:
        """The messages up to `until`, as sent: psycopg2's ReplicationMessage (data_start:
        its WAL position; payload: the pgoutput bytes; send_time: a datetime psycopg2 makes
        at each read of it, so read only where needed); the caller decodes them. Stops at the first transaction
        boundary where the server has sent everything before `until`. `self.safe` is then
        the position the slot may be confirmed to once everything yielded is durable.
        Stops early, at a boundary, if nothing arrives for `patience` seconds."""
        boundary = True
        idle_since = None  # when read_message last found nothing, after the last message
        self._mark_boundary()
        read = self.cursor.read_message
        while True:
            raw = read()
            if raw is None:
                if boundary:
                    self._mark_boundary()
                if boundary and self.safe is not None and self.safe >= until:
                    return
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                elif now - idle_since > patience:
                    return
                select.select([self.cursor], [], [], 0.2)
                continue
            idle_since = None  # (no clock read per message: a pull reads millions)
            payload = raw.payload
            kind = payload[0] if payload else 0
            if kind in _OPENS:
                boundary = False
            elif kind in _CLOSES:
                boundary = True
            yield raw
            if boundary:
                self._mark_boundary()
                if self.safe is not None and self.safe >= until:
                    return

    def _mark_boundary(self) -> None:
        # Called between transactions only. There, the server's WAL end (the last
        # message's position or a keepalive's) is a position everything before which has
        # been sent: a commit before it has been sent whole, a transaction committing
        # after it will be sent again whole if the slot restarts there. (Mid-transaction
        # it is not: a BEGIN's position is its first change's, below what came before.)
        wal_end = self.cursor.wal_end
        if wal_end and (self.safe is None or wal_end > self.safe.value):
            self.safe = Lsn(wal_end)

    # ---------------------------------------------------------------- feedback

    def confirm(self, position: Lsn, timeout: float = 10.0) -> bool:
        """Tell the slot everything before `position` is durable, and wait until the
        server shows it. Never moves it backwards (PostgreSQL 15 would)."""
        if self.confirmed_at_start is not None and position <= self.confirmed_at_start:
            return True
        self.cursor.send_feedback(write_lsn=position.value, flush_lsn=position.value, force=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.slot_state()
            if state and state.confirmed is not None and state.confirmed >= position:
                return True
            self.cursor.read_message()  # keep the stream drained while the server catches up
            time.sleep(0.05)
        return False
