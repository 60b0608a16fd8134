"""The log miner: a slot's pgoutput messages -> redo archive records and segments, then
the slot confirmed to what the archive durably holds (docs/live-postgres.md).

Positions: a record's scn is the WAL position (LSN as an integer) of the change, raised to
the thread's last scn when lower, because a transaction that is not streamed reaches the
slot only at its commit, after later positions were archived; a COMMIT's scn is its
commit LSN. Segments follow each other as the contract says (thread 1, sequence + 1,
first_scn = previous next_scn), each written data file first, manifest last.

Table versions: pgoutput sends a table's columns (a Relation message) before its first
change in a session and again after the table changed. At the first change archived
under columns that differ from the table's last version in defs.json (added, dropped,
retyped, a new key, or a table not there yet), the miner records a new version from that
record's scn, raised past every record archived before it (the contract's rule: a
version's scn is above every scn of the versions before it). defs.json is written before
the state and the manifest of the segment that first uses the version, so the slot is
never confirmed past a version that is not durable; a version at or past the archive's
end (a pull killed before that segment's manifest) is forgotten on the next start.

Exactly once, whatever the slot sends again: the miner keeps, per transaction, the last
change it archived (state.py) and skips what is at or before it; the state is written
before each segment's manifest and names that segment, so a kill anywhere loses and
duplicates nothing. The slot is confirmed only after the last manifest, never past the
last segment's next_scn.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import json
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Callable

import psycopg2

from trailbound import heartbeat
from trailbound.archive.segments import Column, TableDef, TableVersion, load_defs
from trailbound.archive.contract import RECORD_FIELDS
from trailbound.archive.writer import encode_json, from_micros, to_micros, write_defs, write_segment_columns
from trailbound.crash import crashpoint
from trailbound.errors import TrailboundError
from trailbound.metadata import connection_error
from trailbound.sources.postgres import continuity
from trailbound.sources.postgres import decoder as d
from trailbound.sources.postgres import rowjson
from trailbound.sources.postgres import state as miner_state
from trailbound.sources.postgres.lsn import ZERO, Lsn
from trailbound.sources.postgres.reader import ROWS_PREFIX, Micros, Received, SlotReader
from trailbound.sources.postgres.rowjson import RowJson
from trailbound.sources.postgres.values import converter

THREAD = miner_state.THREAD
_CATALOG = ("SELECT attname, attnotnull, CASE WHEN atthasmissing THEN array_to_string(attmissingval, '') END"
            " FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped")


# A table's columns as the current catalog has them: name -> (NOT NULL, the value rows
# that existed before the column was added hold: attmissingval's text, or None).
Catalog = Callable[[int], dict[str, tuple[bool, str | None]]]


@dataclass(frozen=True)
class Limits:
    """When a segment is closed: at this many records, about this many bytes of row
    data, or this many seconds of log time."""

    records: int = 100_000
    bytes: int = 64 << 20
    seconds: float = 900.0


@dataclass
class _Relation:
    name: str
    columns: tuple[str, ...]
    convert: tuple[Callable | None, ...]
    key: tuple[int, ...]      # positions of the replica identity's columns
    json: RowJson
    sent: tuple[tuple[str, str], ...] = ()   # (name, type) as the Relation message says
    oid: int = 0
    full: bool = False        # REPLICA IDENTITY FULL: keyed by every column, as defs.json says
    resolved: bool = False    # compared with the table's last version (at its first archived change)
    heartbeat: bool = False   # a heartbeat table: its images get the archive's stamp (heartbeat.archived)
    key_columns: tuple[str, ...] = field(init=False)
    key_convert: tuple[Callable | None, ...] = field(init=False)

    def __post_init__(self) -> None:
        # The key's names and converters picked once: a key image is made per UPDATE and DELETE.
        self.key_columns = tuple(self.columns[i] for i in self.key)
        self.key_convert = tuple(self.convert[i] for i in self.key)

    def image(self, values: tuple) -> str:
        return _image(self.columns, self.convert, values)

    def key_image(self, values: tuple) -> str:
        return _image(self.key_columns, self.key_convert, [values[i] for i in self.key])


_OPS = {d.Insert: "INSERT", d.Update: "UPDATE", d.Delete: "DELETE"}
_ROW_CHANGES = (d.Insert, d.Update, d.Delete)


# The records the miner buffers: one flat list, a record's fields one after the other, cut
# into the segment's columns at the cut. One extend per record costs less than an append to
# each of eight lists, and a list of tuples, one kept per record, would be the garbage
# collector's to walk again and again.
_FIELDS = tuple(name for name in RECORD_FIELDS if name != "rba")  # scn, ts, xid, parent_xid, op, table, before, after
_WIDTH, _TS = len(_FIELDS), _FIELDS.index("ts")


def _columns(rows: list) -> dict[str, list]:
    return {name: rows[i::_WIDTH] for i, name in enumerate(_FIELDS)}


class _Sent:
    """What this pull was sent of one top-level transaction: the last change's position and
    how many changes at it (COPY logs many rows in one WAL record), and every change's
    position (a transaction streamed in an earlier pull may come whole at its commit in
    this one, and its subtransactions' changes with it)."""

    __slots__ = ("lsn", "count", "lsns")

    def __init__(self) -> None:
        self.lsn, self.count, self.lsns = -1, 0, []


@dataclass
class PullResult:
    source: str
    changes: int = 0
    commits: int = 0
    rollbacks: int = 0
    resent: int = 0            # messages the slot sent again that the archive already held
    segments: list[int] = field(default_factory=list)
    next_scn: Lsn = ZERO
    confirmed: Lsn | None = None
    open_streamed: int = 0
    new_versions: list[str] = field(default_factory=list)
    published: list[str] = field(default_factory=list)   # tables that entered the publication in this pull

    def describe(self) -> str:
        written = (f"segments {self.segments[0]}..{self.segments[-1]}" if len(self.segments) > 1 else
                   f"segment {self.segments[0]}" if self.segments else "no segment")
        confirmed = f"slot confirmed to {self.confirmed}" if self.confirmed else "slot not moved"
        return (f"Source {self.source}: pulled {self.changes} change(s), {self.commits} commit(s), "
                f"{self.rollbacks} rollback(s) ({self.resent} re-sent message(s) skipped); {written}; "
                f"next_scn {self.next_scn.scn} ({self.next_scn}); {confirmed}; "
                f"{self.open_streamed} streamed transaction(s) open"
                + (f"; published {', '.join(self.published)}" if self.published else "")
                + (f"; new table version(s): {', '.join(self.new_versions)}" if self.new_versions else ""))


class Miner:
    """Turns decoded messages into records, cutting segments as the limits say."""

    def __init__(self, archive: Path, defs: dict[str, TableDef], limits: Limits, state: miner_state.MinerState,
                 type_name: Callable[[int, int], str], result: PullResult, catalog: Catalog | None = None,
                 writer: Executor | None = None):
        self.archive, self.limits, self.state = archive, limits, state
        # With `writer` (one thread), each segment's files are written there while the next
        # segment is decoded (see `cut`); without, in `cut` itself.
        self.writer = writer
        self._writing: Future | None = None
        # A version at or past the archive's end was recorded by a pull killed before the
        # manifest of the segment that first used it: it never held.
        self.defs = {name: _born(table, state.next_scn.value) for name, table in defs.items()
                     if table.versions[0].scn < state.next_scn.value or not table.versions[0].scn}
        self.defs_changed = self.defs != defs
        self.new_versions: list[str] = []  # "table vN" recorded in this pull
        self.type_name = type_name
        self.catalog = catalog or (lambda oid: {})
        self.result = result
        self.relations: dict[int, _Relation] = {}
        self.row_json: dict[int, RowJson] = {}       # relation oid -> its RowJson
        self.tuple_readers: dict[int, Callable] = {}  # relation oid -> its RowJson.values
        # Plain ints from here on, per record (the archive's scn column): the inner loop.
        self.floor = state.next_scn.value  # the lowest scn the next record may have
        self.top: int | None = None     # the transaction being sent (Begin or Stream Start)
        self.streaming = False
        self.commit_micros = 0          # the non-streamed transaction's commit time: its records' ts
        self.micros = Micros()
        self.sent: dict[int, _Sent] = {}  # top xid -> what this pull was sent of it
        self._sent_top, self._sent_now = object(), None  # the last one looked up
        self.rows: list = []            # the next segment's records, flat (_FIELDS, "ts" in microseconds)
        self.buffer_bytes = 0
        self.full = False               # a limit is reached: cut before the next message
        self.limit_fields, self.limit_bytes = limits.records * _WIDTH, limits.bytes
        self.limit_micros = limits.seconds * 1_000_000
        self.last_lsn = self.floor

    # ---------------------------------------------------------------- messages

    def handle(self, received: Received) -> None:
        message = received.message
        lsn = received.lsn.value
        if lsn > self.last_lsn:
            self.last_lsn = lsn
        if isinstance(message, _ROW_CHANGES):  # first: nearly every message is one
            self._change(message, received)
        elif isinstance(message, d.Begin):
            self.top, self.streaming = message.xid, False
            self.commit_micros = self.micros(message.commit_time)
        elif isinstance(message, d.StreamStart):
            self.top, self.streaming = message.xid, True
        elif isinstance(message, d.Commit):
            self._end(self.top, "COMMIT", message.commit_lsn, self.micros(message.commit_time))
            self.top = None
        elif isinstance(message, d.StreamStop):
            self.top = None
        elif isinstance(message, d.StreamCommit):
            self._end(message.xid, "COMMIT", message.commit_lsn, self.micros(message.commit_time))
        elif isinstance(message, d.StreamAbort):
            if message.subxid == message.xid:
                self._end(message.xid, "ROLLBACK", received.lsn, self.micros(received.send_time))
            else:
                self._abort_subtransaction(message.xid, message.subxid, received)
        elif isinstance(message, d.Relation):
            # A Relation message comes without a position of its own (0/0): name the last one seen.
            self._relation(message, received.lsn if received.lsn != ZERO else Lsn(self.last_lsn))
        elif isinstance(message, d.Truncate):
            self._change(message, received)
        elif isinstance(message, d.Message) and message.prefix == ROWS_PREFIX and message.flags & 1:
            self._rows_of_a_new_table(message, received)
        # Type, Origin and any other logical Message carry nothing the archive holds.
        self._cut_if_full()

    def handle_batch(self, messages: list, decoding: d.Decoder) -> None:
        """Messages as the slot sent them (reader.SlotReader.batches: data_start, wal_end,
        send time in protocol microseconds, pgoutput bytes). A row change (nearly every
        message) goes from its bytes to its record's JSON images in one call
        (rowjson.row_images: in C when built), the images dropped when the archive holds
        the change already (the bytes are read whatever: a malformed message is
        refused). A batch per call, and `_account` and
        `_emit` inline for row changes: per change, no Lsn, datetime, decoded message, call
        or look-up that is not needed (each one cost the pull a few %)."""
        readers, shapes, relations, row_kinds = self.tuple_readers, self.row_json, self.relations, d.ROW_CHANGES
        admit, result, epoch, images_of = self._admit, self.result, d.PG_EPOCH_MICROS, rowjson.row_images
        for lsn, _, sent, data in messages:
            if lsn > self.last_lsn:
                self.last_lsn = lsn
            kind = data[0]
            if kind not in row_kinds:
                self._not_a_row_change(lsn, kind, data, sent, decoding)
                continue
            streaming = self.streaming
            ts = sent + epoch if streaming else self.commit_micros
            txn = admit(lsn, ts)
            kind, sent_xid, oid, before, after = images_of(data, decoding.in_stream, shapes, readers)
            if txn is None:
                continue
            # _account
            if lsn == txn.last_lsn:
                txn.at_last_lsn += 1
            else:
                txn.last_lsn, txn.at_last_lsn = lsn, 1
            top = self.top
            if not streaming or sent_xid is None or sent_xid == top:
                xid, parent = str(top), None
            else:
                span = txn.subxids.setdefault(str(sent_xid), [lsn, lsn])
                span[1] = max(span[1], lsn)
                xid, parent = str(sent_xid), str(top)
            relation = relations[oid]
            if not relation.resolved:
                self._resolve(relation, lsn)
            op = "INSERT" if kind == 0x49 else "UPDATE" if kind == 0x55 else "DELETE"
            if relation.heartbeat and after is not None:
                after = heartbeat.archived(after, datetime.now(UTC))
            # _emit
            if lsn > self.floor:
                self.floor = lsn
            rows = self.rows
            rows += (self.floor, ts, xid, parent, op, relation.name, before, after)
            self.buffer_bytes += 64 + len(before or "") + len(after or "")
            result.changes += 1
            if (len(rows) >= self.limit_fields or self.buffer_bytes >= self.limit_bytes
                    or ts - rows[_TS] >= self.limit_micros):
                self.cut(Lsn(self.floor + 1))

    def _not_a_row_change(self, lsn: int, kind: int, data: bytes, sent: int, decoding: d.Decoder) -> None:
        """BEGIN and COMMIT (one each per transaction) read as plain ints; anything else
        decoded and handled as a typed message."""
        if kind == 0x42 and len(data) == d.BEGIN.size + 1:  # 'B'
            _, micros, xid = d.BEGIN.unpack_from(data, 1)
            self.top, self.streaming = xid, False
            self.commit_micros = micros + d.PG_EPOCH_MICROS
        elif kind == 0x43 and len(data) == d.COMMIT.size + 1:  # 'C'
            _, commit_lsn, _, micros = d.COMMIT.unpack_from(data, 1)
            self._end(self.top, "COMMIT", Lsn(commit_lsn), micros + d.PG_EPOCH_MICROS)
            self.top = None
            self._cut_if_full()
        else:
            self.handle(Received(Lsn(lsn), d.pg_time(sent), decoding.decode(data)))

    def _relation(self, message: d.Relation, lsn: Lsn) -> None:
        """A table's columns as of the changes that follow: its readers are built again
        (rowjson's per-relation reader included); whether they make a new version is
        decided at its first change the archive does not hold yet (`_resolve`)."""
        name = f"{message.namespace}.{message.name}"
        sent = tuple((c.name, self.type_name(c.type_oid, c.type_modifier)) for c in message.columns)
        names = tuple(c.name for c in message.columns)
        key = tuple(i for i, c in enumerate(message.columns) if c.is_key)
        self.relations[message.oid] = _Relation(
            name, names, tuple(converter(c.type_oid) for c in message.columns), key,
            RowJson(names, tuple(c.type_oid for c in message.columns), key), sent, message.oid,
            message.replica_identity == "f", heartbeat=heartbeat.is_heartbeat(name))
        self.row_json[message.oid] = self.relations[message.oid].json
        self.tuple_readers[message.oid] = self.relations[message.oid].json.values

    def _resolve(self, relation: _Relation, lsn: int) -> None:
        """The relation's first change to archive: a new version of its table when its
        columns or key differ from the last one, from this record's scn on."""
        relation.resolved = True
        table = self.defs.get(relation.name)
        # REPLICA IDENTITY FULL flags every column: the key stays what defs.json says
        key = (table.key if table is not None else ()) if relation.full else relation.key_columns
        if table is not None and tuple((c.name, c.type) for c in table.columns) == relation.sent \
                and table.key == key:
            return
        known = {c.name: c for c in table.columns} if table else {}
        catalog = self.catalog(relation.oid)
        columns = tuple(known[name] if name in known and known[name].type == kind else
                        Column(name, kind, not catalog.get(name, (False, None))[0],
                               None if name in known else catalog.get(name, (False, None))[1])
                        for name, kind in relation.sent)
        self._new_version(relation.name, columns, key, lsn)

    def _new_version(self, name: str, columns: tuple[Column, ...], key: tuple[str, ...], lsn: int) -> None:
        # Above every scn archived so far: a record of the old version never shares its scn.
        scn = max(lsn, self.floor + 1)
        self.floor = scn
        table = self.defs.get(name)
        self.defs[name] = (table.with_version(columns, key, scn) if table is not None else
                           TableDef(name, columns, key, (_first_version(columns, key, scn),)))
        self.defs_changed = True
        self.new_versions.append(f"{name} v{self.defs[name].latest.version}")

    def _rows_of_a_new_table(self, message: d.Message, received: Received) -> None:
        """A table entering the publication (admin.widen_scope): its definition, and its
        rows as they were when it was published, archived as inserts of the transaction
        that published it, the first of them under the table's new version."""
        document = json.loads(message.content)
        definition = document["table"]
        name = definition["name"]
        columns = tuple(Column(c["name"], c["type"], bool(c["nullable"])) for c in definition["columns"])
        key = tuple(definition["key"])
        lsn, ts = received.lsn.value, self._ts(received)
        first = True
        for row in document["rows"] or [None]:
            txn = self._admit(lsn, ts)
            if txn is None:
                continue
            table = self.defs.get(name)
            if first and (table is None or (table.columns, table.key) != (columns, key)):
                self._new_version(name, columns, key, lsn)
            first = False
            if row is None:  # an empty table: its version alone
                continue
            xid = self._account(txn, lsn, None)
            image = encode_json(row)
            if heartbeat.is_heartbeat(name):
                image = heartbeat.archived(image, datetime.now(UTC))
            self._emit(lsn, ts, xid, None, "INSERT", name, None, image)
            self.result.changes += 1

    def _change(self, message, received: Received) -> None:
        lsn, ts = received.lsn.value, self._ts(received)
        txn = self._admit(lsn, ts)
        if txn is None:
            return
        xid = self._account(txn, lsn, message.xid)
        parent = None if xid == self.top else self.top
        if isinstance(message, d.Truncate):
            for oid in message.relation_oids:
                self._emit(lsn, ts, xid, parent, "TRUNCATE", self.relations[oid].name, None, None)
        else:
            relation = self.relations[message.relation_oid]
            if not relation.resolved:
                self._resolve(relation, lsn)
            before, after = _images(relation, message)
            if relation.heartbeat and after is not None:
                after = heartbeat.archived(after, datetime.now(UTC))
            self._emit(lsn, ts, xid, parent, _OPS[type(message)], relation.name, before, after)
        self.result.changes += 1

    def _admit(self, lsn: int, ts: int) -> miner_state.Txn | None:
        """A change of the transaction being sent, at `lsn` (`ts`: its record's, in
        microseconds): its transaction's state, or None when the archive holds it already
        (the slot sent it again)."""
        top = self.top
        if top != self._sent_top:  # looked up once per transaction sent, not per change
            self._sent_top = top
            self._sent_now = self.sent.get(top) or self.sent.setdefault(top, _Sent())
        seen = self._sent_now
        if lsn == seen.lsn:
            seen.count += 1
        else:
            seen.lsn, seen.count = lsn, 1
        seen.lsns.append(lsn)
        txn = self.state.txns.get(top)
        if txn is None:
            txn = self.state.txns[top] = miner_state.Txn(streamed=self.streaming,
                                                         first_time=from_micros(ts).isoformat())
        elif txn.ended is not None or lsn < txn.last_lsn or (lsn == txn.last_lsn and seen.count <= txn.at_last_lsn):
            self.result.resent += 1
            return None
        return txn

    def _ts(self, sent) -> int:
        """A change's `ts`: its send time if streamed, else its transaction's commit time."""
        return self.micros(sent.send_time) if self.streaming else self.commit_micros

    def _account(self, txn: miner_state.Txn, lsn: int, sent_xid: int | None) -> int:
        """Remember the change as archived; its record's xid (its parent_xid is the top
        transaction when that differs)."""
        if lsn == txn.last_lsn:
            txn.at_last_lsn += 1
        else:
            txn.last_lsn, txn.at_last_lsn = lsn, 1
        if not self.streaming or sent_xid is None or sent_xid == self.top:
            return self.top
        span = txn.subxids.setdefault(str(sent_xid), [lsn, lsn])
        span[1] = max(span[1], lsn)
        return sent_xid

    def _end(self, top: int | None, op: str, end: Lsn, ts: int) -> None:
        txn = self.state.txns.get(top)
        if txn is None:
            return  # the archive holds nothing of it: nothing to end
        if txn.ended is not None:
            self.result.resent += 1
            return
        lsn = end.value  # the record's scn, and the state's
        if op == "COMMIT":
            self._roll_back_vanished_subtransactions(top, txn, lsn, ts)
        txn.ended = lsn  # before the record: a segment cut at it saves the state
        self._emit(lsn, ts, top, None, op, None, None, None)
        if op == "COMMIT":
            self.result.commits += 1
        else:
            self.result.rollbacks += 1

    def _roll_back_vanished_subtransactions(self, top: int, txn: miner_state.Txn, lsn: int, ts: int) -> None:
        """Every change of a transaction that survives is sent again in each pull until it
        commits (the slot restarts at or before its start). A subtransaction whose
        archived changes were not sent again was rolled back in a part of the WAL where
        the server had not streamed it this time, so it sent no Stream Abort: archive the
        ROLLBACK it would have meant, before the COMMIT."""
        if not txn.subxids:
            return
        sent = sorted(self.sent[top].lsns) if top in self.sent else []
        for subxid, (first, last) in txn.subxids.items():
            if int(subxid) in txn.aborted_subxids:
                continue
            at = bisect.bisect_left(sent, first)
            if at == len(sent) or sent[at] > last:
                txn.aborted_subxids.append(int(subxid))
                self._emit(lsn, ts, int(subxid), top, "ROLLBACK", None, None, None)
                self.result.rollbacks += 1

    def _abort_subtransaction(self, top: int, subxid: int, received: Received) -> None:
        txn = self.state.txns.get(top)
        if txn is None or txn.ended is not None or subxid in txn.aborted_subxids:
            self.result.resent += txn is not None
            return
        txn.aborted_subxids.append(subxid)
        self._emit(received.lsn.value, self.micros(received.send_time), subxid, top, "ROLLBACK", None, None, None)
        self.result.rollbacks += 1

    # ---------------------------------------------------------------- records and segments

    def _emit(self, lsn: int, ts: int, xid: int, parent: int | None, op: str, table: str | None,
              before: str | None, after: str | None) -> None:
        """One record into the next segment; `ts` in microseconds since the epoch."""
        if lsn > self.floor:
            self.floor = lsn
        rows = self.rows
        rows += (self.floor, ts, str(xid), None if parent is None else str(parent), op, table, before, after)
        self.buffer_bytes += 64 + len(before or "") + len(after or "")
        if (len(rows) >= self.limit_fields or self.buffer_bytes >= self.limit_bytes
                or ts - rows[_TS] >= self.limit_micros):
            self.full = True

    def _cut_if_full(self) -> None:
        # Only between messages: the state saved with a segment must describe whole
        # messages (a TRUNCATE of several tables is several records). `_emit` says when a
        # limit is reached: checking here, once per message, cost the pull 4%.
        if self.full:
            self.cut(Lsn(self.floor + 1))

    def cut(self, next_scn: Lsn, at_least_time: datetime | None = None) -> None:
        """Write the buffered records as the next segment (possibly empty) ending at next_scn."""
        state = self.state
        first_scn, first_time = state.next_scn, state.next_time
        times = [first_time]
        columns = _columns(self.rows)
        if self.rows:
            times.append(from_micros(max(columns["ts"])))
        if at_least_time:
            times.append(at_least_time)
        next_time = max(times)
        state.sequence += 1
        state.next_scn, state.next_time = next_scn, next_time
        # What the segment's files say is fixed here, in the decoding thread (the state goes
        # on changing with the next messages); the files are written in this order (the
        # versions this segment uses, then the state that describes it, then the data and
        # the manifest that makes it visible: a kill anywhere leaves the archive whole).
        defs = [table.as_json() for table in self.defs.values()] if self.defs_changed else None
        self.defs_changed = False
        state_text = state.to_text()
        sequence = state.sequence

        def write() -> None:
            if defs is not None:
                write_defs(self.archive, defs)
            miner_state.write_text(self.archive, sequence, state_text)
            write_segment_columns(self.archive, thread=THREAD, sequence=sequence, columns=columns,
                                  first_scn=first_scn.scn, next_scn=next_scn.scn, first_time=first_time,
                                  next_time=next_time, fmt="parquet")

        if self.writer is None:
            write()
        else:
            self.flush()  # the segment before it is durable first: one at a time, in order
            self._writing = self.writer.submit(write)
        self.result.segments.append(state.sequence)
        self.rows, self.buffer_bytes, self.full = [], 0, False
        self.floor = next_scn.value

    def finish(self, safe: Lsn | None, now: datetime) -> None:
        """Write what is buffered; move next_scn to the safe position even with nothing
        to write (an idle source still moves capture's horizon)."""
        target = max(safe, self.state.next_scn) if safe else self.state.next_scn
        if self.rows:
            self.cut(max(target, Lsn(self.floor + 1)), now)
        elif target > self.state.next_scn:
            self.cut(target, now)
        self.flush()

    def flush(self) -> None:
        """Every segment cut so far is durable (or the writer's failure is raised)."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()


def _born(table: TableDef, end: int) -> TableDef:
    """`table` without the versions at or past `end`, the archive's end."""
    kept = tuple(v for v in table.versions if v.scn < end or v.version == 1)
    if kept == table.versions:
        return table
    return TableDef(table.name, kept[-1].columns, kept[-1].key, kept)


def _first_version(columns, key, scn: int) -> TableVersion:
    return TableVersion(1, scn, columns, key)


def _image(names: tuple[str, ...], converts: tuple, values) -> str:
    # An unchanged TOASTed value is left out: absent columns keep their value.
    return encode_json({name: value if value is None or convert is None else convert(value)
                        for name, convert, value in zip(names, converts, values) if value is not d.UNCHANGED})


def _images(relation: _Relation, message) -> tuple[str | None, str | None]:
    if isinstance(message, d.Insert):
        return None, relation.image(message.new)
    if isinstance(message, d.Delete):
        return (relation.key_image(message.old) if message.old_kind == "K" else relation.image(message.old)), None
    # UPDATE: the old key ('K', the key changed), the old row (REPLICA IDENTITY FULL), or
    # else the key as it is in the new row
    if message.old_kind == "O":
        before = relation.image(message.old)
    else:
        before = relation.key_image(message.old if message.old_kind == "K" else message.new)
    return before, relation.image(message.new)


def pull(source: str, archive: Path, dsn: str, slot: str, publication: str, limits: Limits,
         *, patience: float = 60.0) -> PullResult:
    """One pull: read the slot up to the server's WAL position at the start, archive it,
    then confirm the slot to what the archive holds."""
    result = PullResult(source)
    state = miner_state.load(archive)
    defs = load_defs(archive)
    message = None  # the last message read: (data_start, wal_end, send time, payload)
    try:
        with SlotReader(dsn, slot, publication) as reader:
            if state.slot != slot:
                raise TrailboundError(f"{archive}: this archive was written from slot {state.slot!r}, the "
                                      f"configuration names slot {slot!r}")
            archive_end = state.next_scn
            # Before anything is read, and again once the slot is ours (no one can drop or
            # advance it while this session holds it): never a silent gap.
            continuity.refuse_gap(source, slot, reader.slot_state(), archive_end, reader.database)
            reader.start()
            continuity.refuse_gap(source, slot, reader.at_start, archive_end, reader.database)
            until = reader.wal_position()
            started = datetime.now(UTC)
            types: dict[tuple[int, int], str] = {}

            def type_name(oid: int, modifier: int) -> str:
                if (oid, modifier) not in types:
                    types[oid, modifier] = reader.query("SELECT format_type(%s, %s)", (oid, modifier))[0][0]
                return types[oid, modifier]

            def catalog(oid: int) -> dict[str, tuple[bool, str | None]]:
                # Today's catalog, asked only when a table gets a new version: its NOT NULL
                # and the value its rows from before a column was added hold.
                return {name: (not_null, missing) for name, not_null, missing in reader.query(_CATALOG, (oid,))}

            if reader.confirmed_at_start is not None:
                state.forget_ended_before(reader.confirmed_at_start)
            # Segments are written by a thread of their own while the next is decoded:
            # Parquet's encoding, the SHA-256 and the fsyncs release the GIL (on the live 1M
            # backlog the pull's writing was about a fifth of its time). A failure leaves the
            # segments before it durable and none after it; the slot is confirmed only once
            # every segment is (`_close`).
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="segment-writer") as writer:
                miner = Miner(archive, defs, limits, state, type_name, result, catalog, writer)
                decoding = d.Decoder()
                with _collector_paused():
                    for batch in reader.batches(until, patience=patience):
                        message = batch[-1]
                        miner.handle_batch(batch, decoding)
                _close(miner, reader, result, started)
            result.new_versions = miner.new_versions
    except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:  # the connection, not a refusal
        if message is None:  # the source cannot be reached (the driver's text may quote the DSN)
            raise connection_error(f"source {source}", dsn, exc) from None
        # The source ended the session (a restart, a failover, pg_terminate_backend) or the
        # network did. The slot is confirmed only to what the archive holds, so what this
        # pull read and did not archive is sent again to the next one.
        raise TrailboundError(f"source {source}: the connection to the source failed after LSN {Lsn(message[0])}: "
                              f"{' '.join((exc.pgerror or str(exc)).split())}; the next pull reads again "
                              "from the slot's confirmed position") from None
    return result


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while the slot is read. Reading makes no
    reference cycles, only objects that reference counting frees or that live to the
    end (the state's transactions): the collector, set off by every 700 new objects and
    walking the transactions again and again, cost a pull a quarter of its time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def archive_gap(archive: Path, resume: Lsn, reason: str, now: datetime) -> miner_state.MinerState:
    """A gap the user accepted, written into the archive: one segment from the archive's
    end to where the slot now resumes, so that segments still follow each other. It holds
    a ROLLBACK for each streamed transaction still open: the rest of it, and its outcome,
    fell in the gap (a new load of the tables brings the truth). The gap is kept in the
    miner's state; the state is written before the manifest, as for any segment."""
    state = miner_state.load(archive)
    if resume <= state.next_scn:
        raise TrailboundError(f"{archive}: the archive already reaches LSN {state.next_scn}, past {resume}")
    start = state.next_scn
    miner = Miner(archive, {}, Limits(), state, lambda oid, modifier: "", PullResult(""))
    closed = sorted(state.open_streamed())
    for xid in closed:
        miner._end(xid, "ROLLBACK", start, to_micros(now))
    state.gaps.append({"from": str(start), "to": str(resume), "segment": state.sequence + 1, "reason": reason,
                       "accepted": now.astimezone(UTC).isoformat(), "closed": closed})
    miner.cut(resume, now)
    return state


def _close(miner: Miner, reader: SlotReader, result: PullResult, now: datetime) -> None:
    miner.finish(reader.safe, now)
    result.next_scn = miner.state.next_scn
    result.open_streamed = len(miner.state.open_streamed())
    crashpoint("after_manifest_before_confirm")
    if reader.safe is not None:
        position = min(reader.safe, miner.state.next_scn)
        if reader.confirm(position):
            result.confirmed = position
