"""pgoutput, logical replication protocol version 2: bytes -> typed messages, nothing else.

Each XLogData payload of a pgoutput slot is one message, its first byte the message type
(PostgreSQL's "Logical Replication Message Formats"). Inside a streamed block (between
Stream Start and Stream Stop) the messages that carry data also carry the id of the
(sub)transaction they belong to; the Decoder keeps that one bit of state. It does no I/O
and knows nothing of the archive: tests feed it recorded bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from trailbound.sources.postgres.lsn import Lsn

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# a protocol timestamp (microseconds since PG_EPOCH) + this: microseconds since the Unix epoch
PG_EPOCH_MICROS = (PG_EPOCH - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
_INT16, _INT32 = struct.Struct("!h"), struct.Struct("!i")
_OID, _XID_OID = struct.Struct("!I"), struct.Struct("!II")
# BEGIN (final LSN, commit time, xid) and COMMIT (flags, commit LSN, end LSN, commit time)
# after the type byte: fixed sizes, one unpack each
BEGIN, COMMIT = struct.Struct("!QqI"), struct.Struct("!bQQq")
_TEXT, _BINARY, _NULL, _UNCHANGED_TOAST = 0x74, 0x62, 0x6E, 0x75  # 't', 'b', 'n', 'u'
_NEW, _OLD_KEY, _OLD_ROW = 0x4E, 0x4B, 0x4F                       # 'N', 'K', 'O'


class DecodeError(ValueError):
    """The bytes are not a pgoutput protocol message this decoder knows."""


class _Unchanged:
    """An unchanged TOASTed value ('u'): the server did not send it; the column keeps its value."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()

# A tuple's values, in the relation's column order: None (NULL), UNCHANGED, str (the
# type's text output) or bytes (binary format, which this miner never asks for).
Value = None | _Unchanged | str | bytes


@dataclass(frozen=True)
class Begin:
    final_lsn: Lsn          # the commit record's LSN
    commit_time: datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: Lsn         # where the commit record starts
    end_lsn: Lsn            # where it ends: the transaction's end position
    commit_time: datetime


@dataclass(frozen=True)
class Origin:
    lsn: Lsn
    name: str


@dataclass(frozen=True)
class RelationColumn:
    flags: int              # 1: part of the key (the replica identity)
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True)
class Relation:
    xid: int | None
    oid: int
    namespace: str
    name: str
    replica_identity: str   # d default, n nothing, f full, i index
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True)
class Type:
    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True)
class Insert:
    xid: int | None
    relation_oid: int
    new: tuple[Value, ...]


@dataclass(frozen=True)
class Update:
    xid: int | None
    relation_oid: int
    old_kind: str | None    # 'K' old key (the key changed), 'O' old row (REPLICA IDENTITY FULL), None
    old: tuple[Value, ...] | None
    new: tuple[Value, ...]


@dataclass(frozen=True)
class Delete:
    xid: int | None
    relation_oid: int
    old_kind: str           # 'K' or 'O'
    old: tuple[Value, ...]


@dataclass(frozen=True)
class Truncate:
    xid: int | None
    options: int            # 1 CASCADE, 2 RESTART IDENTITY
    relation_oids: tuple[int, ...]


@dataclass(frozen=True)
class Message:
    xid: int | None
    flags: int              # 1: transactional
    lsn: Lsn
    prefix: str
    content: bytes


@dataclass(frozen=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True)
class StreamStop:
    pass


@dataclass(frozen=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: datetime


@dataclass(frozen=True)
class StreamAbort:
    xid: int                # the top-level transaction
    subxid: int             # the aborted (sub)transaction; equal to xid for a top-level abort


DecodedMessage = (Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message
                  | StreamStart | StreamStop | StreamCommit | StreamAbort)


ROW_CHANGES = frozenset(b"IUD")  # the first byte of INSERT, UPDATE, DELETE


def pg_time(micros: int) -> datetime:
    """A protocol timestamp (microseconds since 2000-01-01 UTC) as an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=micros)


def _tuple(data, at: int) -> tuple[tuple[Value, ...], int]:
    """TupleData at `at`: its values and the position after it. The hot path of a pull
    (one call per row image), so the bytes are walked inline."""
    size = len(data)
    try:
        (count,) = _INT16.unpack_from(data, at)
        at += 2
        values: list[Value] = []
        for _ in range(count):
            kind = data[at]
            at += 1
            if kind == _TEXT or kind == _BINARY:
                (length,) = _INT32.unpack_from(data, at)
                at += 4
                if length < 0 or at + length > size:
                    raise DecodeError(f"value of {length} bytes runs past the message end at byte {at}")
                raw = data[at:at + length]
                values.append(str(raw, "utf-8") if kind == _TEXT else bytes(raw))
                at += length
            elif kind == _NULL:
                values.append(None)
            elif kind == _UNCHANGED_TOAST:
                values.append(UNCHANGED)
            else:
                raise DecodeError(f"unknown tuple value kind {chr(kind)!r} at byte {at - 1}")
    except (struct.error, IndexError):
        raise DecodeError(f"message ends early at byte {at}") from None
    return tuple(values), at


class _Values:
    """Every relation's tuples read as typed values."""

    def __getitem__(self, oid: int):
        return _tuple


_values = _Values()


def row_change(data: bytes, in_stream: bool, readers):
    """INSERT, UPDATE or DELETE (one per row changed, so framed from the bytes directly):
    (kind byte, xid or None, relation oid, old tuple's kind byte ('K' key, 'O' row) or None,
    old tuple, new tuple), each tuple read by `readers[oid](data, at)` -> (tuple, the
    position after it): typed values (Decoder) or the archive's JSON (rowjson.py)."""
    kind, at = data[0], 1
    old_kind = old = new = None
    try:
        if in_stream:
            xid, oid = _XID_OID.unpack_from(data, at)
            at += 8
        else:
            xid, (oid,) = None, _OID.unpack_from(data, at)
            at += 4
        part = data[at]
        at += 1
        if kind == 0x49:  # 'I'
            if part != _NEW:
                raise DecodeError("INSERT without its new tuple ('N')")
            new, at = readers[oid](data, at)
        elif kind == 0x55:  # 'U'
            if part == _OLD_KEY or part == _OLD_ROW:
                old_kind = part
                old, at = readers[oid](data, at)
                part = data[at]
                at += 1
            if part != _NEW:
                raise DecodeError(f"UPDATE: expected the new tuple ('N'), found {chr(part)!r}")
            new, at = readers[oid](data, at)
        else:  # 'D'
            if part != _OLD_KEY and part != _OLD_ROW:
                raise DecodeError(f"DELETE: expected the old key ('K') or row ('O'), found {chr(part)!r}")
            old_kind = part
            old, at = readers[oid](data, at)
    except (struct.error, IndexError):
        raise DecodeError(f"message ends early at byte {at}") from None
    if at != len(data):
        raise DecodeError(f"{len(data) - at} unexpected byte(s) after the message at byte {at}")
    return kind, xid, oid, old_kind, old, new


class _Buffer:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.at = 0

    def _take(self, fmt: str):
        try:
            values = struct.unpack_from(fmt, self.data, self.at)
        except struct.error:
            raise DecodeError(f"message ends early at byte {self.at}") from None
        self.at += struct.calcsize(fmt)
        return values[0]

    def int8(self) -> int:
        return self._take("!b")

    def byte(self) -> str:
        return chr(self._take("!B"))

    def int16(self) -> int:
        return self._take("!h")

    def int32(self) -> int:
        return self._take("!i")

    def uint32(self) -> int:
        return self._take("!I")

    def int64(self) -> int:
        return self._take("!q")

    def lsn(self) -> Lsn:
        return Lsn(self._take("!Q"))

    def time(self) -> datetime:
        return pg_time(self.int64())

    def string(self) -> str:
        end = bytes(self.data[self.at:]).find(b"\0")
        if end < 0:
            raise DecodeError(f"unterminated string at byte {self.at}")
        text = bytes(self.data[self.at:self.at + end]).decode("utf-8")
        self.at += end + 1
        return text

    def raw(self, length: int) -> bytes:
        if length < 0 or self.at + length > len(self.data):
            raise DecodeError(f"value of {length} bytes runs past the message end at byte {self.at}")
        value = bytes(self.data[self.at:self.at + length])
        self.at += length
        return value

    def tuple(self) -> tuple[Value, ...]:
        values, self.at = _tuple(self.data, self.at)
        return values

    def end(self) -> None:
        if self.at != len(self.data):
            raise DecodeError(f"{len(self.data) - self.at} unexpected byte(s) after the message at byte {self.at}")


class Decoder:
    """Decodes one pgoutput message at a time, remembering whether a streamed block is
    open (its data messages carry a transaction id)."""

    def __init__(self) -> None:
        self.in_stream = False

    def decode(self, data: bytes) -> DecodedMessage:
        if not data:
            raise DecodeError("empty message")
        kind = data[0]
        if kind in ROW_CHANGES:
            return self._row_change(data)
        # BEGIN and COMMIT, one each per transaction, have a fixed size: one unpack. Any
        # other size takes the general path, which names the byte where it goes wrong.
        if kind == 0x42 and len(data) == BEGIN.size + 1:  # 'B'
            final_lsn, micros, xid = BEGIN.unpack_from(data, 1)
            return Begin(Lsn(final_lsn), pg_time(micros), xid)
        if kind == 0x43 and len(data) == COMMIT.size + 1:  # 'C'
            flags, commit_lsn, end_lsn, micros = COMMIT.unpack_from(data, 1)
            return Commit(flags, Lsn(commit_lsn), Lsn(end_lsn), pg_time(micros))
        buf = _Buffer(data)
        kind = buf.byte()
        message = self._decode(kind, buf)
        buf.end()
        return message

    def _row_change(self, data: bytes) -> Insert | Update | Delete:
        kind, xid, oid, old_kind, old, new = row_change(data, self.in_stream, _values)
        if kind == 0x49:  # 'I'
            return Insert(xid, oid, new)
        if kind == 0x55:  # 'U'
            return Update(xid, oid, old_kind and chr(old_kind), old, new)
        return Delete(xid, oid, chr(old_kind), old)

    def _xid(self, buf: _Buffer) -> int | None:
        return buf.uint32() if self.in_stream else None

    def _decode(self, kind: str, buf: _Buffer) -> DecodedMessage:
        if kind == "B":
            return Begin(buf.lsn(), buf.time(), buf.uint32())
        if kind == "C":
            return Commit(buf.int8(), buf.lsn(), buf.lsn(), buf.time())
        if kind == "O":
            return Origin(buf.lsn(), buf.string())
        if kind == "R":
            xid, oid, namespace, name, identity = self._xid(buf), buf.uint32(), buf.string(), buf.string(), buf.byte()
            columns = tuple(RelationColumn(buf.int8(), buf.string(), buf.uint32(), buf.int32())
                            for _ in range(buf.int16()))
            return Relation(xid, oid, namespace, name, identity, columns)
        if kind == "Y":
            return Type(self._xid(buf), buf.uint32(), buf.string(), buf.string())
        if kind == "T":
            xid, count, options = self._xid(buf), buf.int32(), buf.int8()
            return Truncate(xid, options, tuple(buf.uint32() for _ in range(count)))
        if kind == "M":
            xid, flags, lsn, prefix = self._xid(buf), buf.int8(), buf.lsn(), buf.string()
            return Message(xid, flags, lsn, prefix, buf.raw(buf.int32()))
        if kind == "S":
            self.in_stream = True
            return StreamStart(buf.uint32(), buf.int8() == 1)
        if kind == "E":
            self.in_stream = False
            return StreamStop()
        if kind == "c":
            return StreamCommit(buf.uint32(), buf.int8(), buf.lsn(), buf.lsn(), buf.time())
        if kind == "A":
            return StreamAbort(buf.uint32(), buf.uint32())
        raise DecodeError(f"unknown message type {kind!r}")
