"""The replication connection: reads a pgoutput slot up to a WAL position, and confirms
to the slot only what the caller says is durable.

A pull asks the server for its current WAL position first and reads until the slot has
sent everything before it (a keepalive or a message at or past it, at a transaction
boundary), so that a pull always ends, even while the source keeps writing.

The stream is read from the connection's socket in large chunks and cut into messages
here (_SocketStream); libpq only opens the connection. A connection encrypted inside
libpq (TLS, GSSAPI) is read through psycopg2's read_message instead (_LibpqStream), a
third slower.

Feedback moves the slot only in `confirm`. No periodic feedback is sent, and the server
asks for a reply only when wal_sender_timeout is set (this session sets it to 0); a reply
it asks for anyway carries the position already confirmed. (psycopg2, on its own, would
reply with the server's WAL end while the archive does not yet hold it: the libpq path
switches its periodic feedback off, and the server does not ask.)

The session's TimeZone, DateStyle, IntervalStyle, bytea_output and extra_float_digits
are set in the connection's startup options, so that the values pgoutput writes (the
types' text output, produced in the walsender) have the archive's text forms whatever
the server's or the database's defaults.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import NamedTuple

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
from psycopg2 import sql

from trailbound.archive.writer import to_micros
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

    lsn: Lsn                # the message's data_start
    send_time: datetime     # when the server sent it, by its clock (naive local times, as
                            # psycopg2 gives them, are converted as such)
    message: decoder.DecodedMessage


class SlotReader:
    """One pull's replication connection to a pgoutput slot, and a plain SQL connection
    beside it for positions and the slot's state."""

    def __init__(self, dsn: str, slot: str, publication: str, *, extra_options: dict[str, str] | None = None):
        self.dsn, self.slot, self.publication = dsn, slot, publication
        self.extra_options = extra_options
        self.sql = None
        self.replication = None
        self.stream: _SocketStream | _LibpqStream | None = None
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
        if self.stream is not None:
            self.stream.close()
        for connection in (self.replication, self.sql):
            if connection is not None:
                connection.close()
        self.replication = self.sql = self.stream = None

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
            try:
                self.stream = self._open_stream()
                break
            except psycopg2.errors.UndefinedObject:
                self.replication.close()
                self.replication = None
                return  # no such slot: at_start stays None
            except psycopg2.errors.ObjectInUse:
                # "replication slot ... is active for PID n": a killed pull's walsender has
                # not noticed its client is gone yet.
                self.replication.close()
                self.replication = None
                if time.monotonic() > deadline:
                    raise TrailboundError(f"replication slot {self.slot!r} is in use by another process "
                                          f"(is another pull running?)") from None
                time.sleep(0.3)
        self.at_start = self.slot_state()
        self.stream.confirmed = self.confirmed_at_start.value if self.confirmed_at_start else 0

    def _open_stream(self) -> "_SocketStream | _LibpqStream":
        """START_REPLICATION from the slot's confirmed position: read from the socket
        itself when the channel is plain (no TLS or GSSAPI encryption inside libpq)."""
        options = {"proto_version": "2", "publication_names": self.publication, "streaming": "on",
                   "messages": "true"}
        if self.replication.info.ssl_in_use or self._gss_encrypted():
            cursor = self.replication.cursor()
            cursor.start_replication(slot_name=self.slot, decode=False, start_lsn=0, status_interval=_NEVER,
                                     options=options)
            return _LibpqStream(cursor)
        command = sql.SQL("START_REPLICATION SLOT {} LOGICAL 0/0 ({})").format(
            sql.Identifier(self.slot),
            sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(name), sql.Literal(value))
                               for name, value in options.items()))
        return _SocketStream(self.replication, command.as_string(self.replication))

    def _gss_encrypted(self) -> bool:
        rows = self.query("SELECT encrypted FROM pg_stat_gssapi WHERE pid = %s",
                          (self.replication.info.backend_pid,))
        return bool(rows and rows[0][0])

    # ---------------------------------------------------------------- reading

    def batches(self, until: Lsn, *, patience: float = 60.0) -> Iterator[list[tuple[int, int, int, bytes]]]:
        """The messages up to `until`, as sent, in lists of those received together: each
        (data_start: the message's WAL position, wal_end, send_time: microseconds since
        2000-01-01 UTC by the server's clock, payload: the pgoutput bytes), a plain tuple;
        the caller decodes them. Stops at the first transaction boundary where the server
        has sent everything before `until`. `self.safe` is then the position the slot may
        be confirmed to once everything yielded is durable. Stops early, at a boundary, if
        nothing arrives for `patience` seconds. (A list per read, not a generator step per
        message: a pull reads millions.)"""
        boundary = True
        idle_since = None  # when a read last found nothing, after the last message
        stream, end = self.stream, until.value
        self._mark_boundary(stream.wal_end)
        while True:
            batch = stream.read()
            if not batch:
                if boundary:
                    self._mark_boundary(stream.wal_end)
                    if self.safe is not None and self.safe >= until:
                        return
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                elif now - idle_since > patience:
                    return
                continue
            idle_since = None  # (no clock read per message)
            boundary, safe, stop = _scan(batch, boundary, self.safe.value if self.safe is not None else 0, end)
            if stop:
                self._mark_boundary(safe)
                yield batch[:stop]
                return
            self._mark_boundary(safe)
            yield batch
            if boundary:  # keepalives after the batch's last message
                self._mark_boundary(stream.wal_end)

    def _mark_boundary(self, wal_end: int) -> None:
        # Called between transactions only. There, the server's WAL end (the last
        # message's position or a keepalive's) is a position everything before which has
        # been sent: a commit before it has been sent whole, a transaction committing
        # after it will be sent again whole if the slot restarts there. (Mid-transaction
        # it is not: a BEGIN's position is its first change's, below what came before.)
        if wal_end and (self.safe is None or wal_end > self.safe.value):
            self.safe = Lsn(wal_end)

    # ---------------------------------------------------------------- feedback

    def confirm(self, position: Lsn, timeout: float = 10.0) -> bool:
        """Tell the slot everything before `position` is durable, and wait until the
        server shows it. Never moves it backwards (PostgreSQL 15 would)."""
        if self.confirmed_at_start is not None and position <= self.confirmed_at_start:
            return True
        self.stream.confirm(position.value)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.slot_state()
            if state and state.confirmed is not None and state.confirmed >= position:
                return True
            self.stream.drain()  # keep the stream drained while the server catches up
            time.sleep(0.05)
        return False


# The replication protocol's frames (PostgreSQL's "Streaming Replication Protocol"): a
# type byte and an int32 length (itself included); in CopyData ('d'), XLogData ('w': WAL
# start, WAL end, send time) and the primary's keepalive ('k': WAL end, send time, reply
# requested); the standby status update we send ('r': written, flushed, applied, time, reply).
_FRAME = struct.Struct("!BI")
_XLOG_DATA = struct.Struct("!QQq")
_KEEPALIVE = struct.Struct("!Qq?")
_STATUS = struct.Struct("!BIBQQQq?")
_READ_SIZE = 1 << 20
_READ_WAIT = 0.2  # seconds a read waits for the server before it returns nothing


def _scan_py(batch: list, boundary: bool, safe: int, end: int) -> tuple[bool, int, int]:
    """A batch's transaction boundaries: (at a boundary after it, the safe position: the
    WAL end of its last message that closes what is sent of a transaction, if higher, and
    how many of its messages to take when that reaches `end`, else 0)."""
    for at, (_, wal_end, _, payload) in enumerate(batch):
        kind = payload[0] if payload else 0
        if kind in _OPENS:
            boundary = False
        elif kind in _CLOSES:
            boundary = True
            if wal_end > safe:
                safe = wal_end
            if safe >= end:
                return boundary, safe, at + 1
    return boundary, safe, 0


# The per-message loops compiled when they were built (make; setup.py): reader.py's own otherwise.
try:
    from trailbound.sources.postgres import _reader_c
except ImportError:
    _reader_c, _scan = None, _scan_py
else:
    _scan = _reader_c.scan


def _now_micros() -> int:
    return time.time_ns() // 1000 - decoder.PG_EPOCH_MICROS


class _SocketStream:
    """The replication stream read from the connection's socket in large chunks, cut into
    messages here: psycopg2's read_message makes a Python object per message (and libpq a
    copy, and a read call), which cost a pull a third of its time. libpq opened the
    connection (authentication, startup options); the START_REPLICATION query is sent here,
    so that no message is left in libpq's buffer. Feedback as `SlotReader.confirm` says;
    a keepalive that asks for a reply is answered with the position already confirmed
    (a flush position of 0/0 does not move a slot either)."""

    def __init__(self, connection, command: str):
        # our own descriptor of libpq's socket: closing it leaves libpq's open
        self.socket = socket.socket(fileno=os.dup(connection.fileno()))
        self.socket.settimeout(_READ_WAIT)
        self.pending = b""    # the start of a message not received whole yet
        self.wal_end = 0
        self.confirmed = 0    # the flush position last sent
        query = command.encode(psycopg2.extensions.encodings[connection.encoding]) + b"\0"
        try:
            self.socket.sendall(_FRAME.pack(0x51, 4 + len(query)) + query)  # 'Q': a simple query
            self._await_copy_both()
        except BaseException:
            self.socket.close()
            raise

    def _await_copy_both(self) -> None:
        while True:
            kind, body = self._frame()
            if kind == 0x57:  # 'W': CopyBothResponse: streaming starts
                return
            if kind == 0x45:  # 'E'
                raise _error(body)
            # 'N' (a notice), 'S' (a parameter's value): nothing the stream needs

    def _frame(self) -> tuple[int, bytes]:
        """One whole frame before streaming starts (blocking)."""
        while True:
            if len(self.pending) >= 5:
                kind, size = _FRAME.unpack_from(self.pending)
                if len(self.pending) >= 1 + size:
                    body, self.pending = self.pending[5:1 + size], self.pending[1 + size:]
                    return kind, body
            chunk = self._recv(wait=True)
            self.pending += chunk

    def _recv(self, wait: bool = False) -> bytes:
        while True:
            try:
                chunk = self.socket.recv(_READ_SIZE)
            except TimeoutError:
                if wait:
                    continue
                return b""
            except OSError as exc:
                raise psycopg2.OperationalError(f"the replication connection failed: {exc}") from None
            if not chunk:
                raise psycopg2.OperationalError("the server closed the replication connection")
            return chunk

    def read(self) -> list[tuple[int, int, int, bytes]]:
        """The messages received whole by now, after waiting up to _READ_WAIT seconds for
        the first: (data_start, wal_end, send_time, payload) each."""
        chunk = self._recv()
        data = self.pending + chunk if self.pending else chunk  # (the first messages may have come with
        if not data:                                             # CopyBothResponse, whole, in `pending`)
            return []
        end, at = len(data), 0
        if end >= 5:
            (_, size) = _FRAME.unpack_from(data)
            if 1 + size > end:  # a large message: receive the rest of it at once
                data = self._complete(data, 1 + size)
                end = len(data)
        messages, wal_end = [], self.wal_end
        if _reader_c is not None:  # the usual frames in C; from the first other one on, below
            at, wal_end, reply = _reader_c.cut(data, messages, wal_end)
            if reply:
                self._send_status(self.confirmed)
        append, frame, xlog_data = messages.append, _FRAME.unpack_from, _XLOG_DATA.unpack_from
        while end - at >= 5:
            kind, size = frame(data, at)
            stop = at + 1 + size
            if stop > end:
                break
            if kind == 0x64:  # 'd': CopyData
                inner = data[at + 5]
                if inner == 0x77:  # 'w': XLogData
                    start, wal_end, sent = xlog_data(data, at + 6)
                    append((start, wal_end, sent, data[at + 30:stop]))
                elif inner == 0x6B:  # 'k': the primary's keepalive
                    wal_end, _, reply = _KEEPALIVE.unpack_from(data, at + 6)
                    if reply:
                        self._send_status(self.confirmed)
            elif kind == 0x45:  # 'E': the server ended the session with an error
                raise _error(data[at + 5:stop])
            elif kind == 0x63 or kind == 0x43 or kind == 0x5A:  # 'c' CopyDone, 'C', 'Z': streaming ended
                raise psycopg2.OperationalError("the server ended the replication stream")
            at = stop
        self.pending = data[at:]
        self.wal_end = wal_end
        return messages

    def _complete(self, data: bytes, size: int) -> bytes:
        pieces, have = [data], len(data)
        while have < size:
            chunk = self._recv(wait=True)
            pieces.append(chunk)
            have += len(chunk)
        return b"".join(pieces)

    def confirm(self, position: int) -> None:
        self.confirmed = position
        self._send_status(position)

    def _send_status(self, flushed: int) -> None:
        self.socket.sendall(_STATUS.pack(0x64, 4 + 1 + 8 * 4 + 1, 0x72, flushed, flushed, flushed, _now_micros(),
                                         False))

    def drain(self) -> None:
        """Read and drop what the server sent since (the next pull reads it again)."""
        self.socket.settimeout(0)
        try:
            while self.socket.recv(_READ_SIZE):
                pass
        except (BlockingIOError, TimeoutError):
            pass
        finally:
            self.socket.settimeout(_READ_WAIT)
        self.pending = b""

    def close(self) -> None:
        self.socket.close()


class _LibpqStream:
    """The replication stream through libpq and psycopg2 (a connection encrypted inside
    libpq, TLS or GSSAPI): psycopg2's messages as `_SocketStream` gives them."""

    def __init__(self, cursor):
        self.cursor = cursor
        self.wal_end = 0
        self.confirmed = 0
        self.micros = Micros()

    def read(self) -> list[tuple[int, int, int, bytes]]:
        messages = []
        read, micros = self.cursor.read_message, self.micros
        while len(messages) < 1000:
            message = read()
            if message is None:
                break
            messages.append((message.data_start, self.cursor.wal_end, micros(message.send_time) - decoder.PG_EPOCH_MICROS,
                             message.payload))
        if not messages:
            select.select([self.cursor], [], [], _READ_WAIT)
        self.wal_end = self.cursor.wal_end
        return messages

    def confirm(self, position: int) -> None:
        self.confirmed = position
        self.cursor.send_feedback(write_lsn=position, flush_lsn=position, force=True)

    def drain(self) -> None:
        self.cursor.read_message()

    def close(self) -> None:
        pass


class Micros:
    """datetime -> microseconds since the Unix epoch, the archive's `ts`. psycopg2 gives a
    message's send time as a naive local time; converting one costs more than the rest
    of a row's work, so the conversion is made once per second of send times."""

    def __init__(self) -> None:
        self._second = datetime.min
        self._base = 0

    def __call__(self, moment: datetime) -> int:
        second = moment.replace(microsecond=0)
        # (naive times compare equal across a DST fall-back's repeated hour: fold tells them apart)
        if second != self._second or second.fold != self._second.fold:
            self._second, self._base = second, to_micros(second.astimezone(UTC))
        return self._base + moment.microsecond


def _error(body: bytes) -> psycopg2.Error:
    """An ErrorResponse's fields (a code byte and a NUL-terminated text each) as the
    psycopg2 exception of its SQLSTATE."""
    fields = {part[0]: part[1:].decode("utf-8", "replace") for part in body.split(b"\0") if part}
    code, text = fields.get(ord("C"), ""), fields.get(ord("M"), "the server refused the replication stream")
    try:
        kind = psycopg2.errors.lookup(code)
    except KeyError:
        kind = psycopg2.OperationalError
    return kind(text)
