"""The simulator's engine: the SCN clock, the redo threads and their segments, the
database model (committed rows, each open transaction's private changes with an undo log
for savepoints, row and table locks), the main loop that emits one record per step, and
the truth (the final state of every table)."""

from __future__ import annotations

import heapq
import os
import random
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from trailbound.archive.contract import FORMATS, data_name
from trailbound.archive.segments import Column, TableDef, TableVersion
from trailbound.archive.writer import encode_json, from_micros, to_micros, write_defs, write_segment_columns
from trailbound.positions import Scn
from trailbound.sources.simulator.changes import SchemaChange
from trailbound.sources.simulator.pools import HOSTILE_XID_PATTERNS, SINGLE_HOSTILE_XIDS
from trailbound.sources.simulator.tables import (CARTS, HEARTBEAT, MISSING, SimTable, heartbeat_table, review_table,
                                                 source_tables)
from trailbound.sources.simulator.workload import HANDOFF_TIMES, LONG_STORIES, TRUNCATE_TIMES, Workload

TRUTH_FORMAT = 1

_TRUNCATED = object()  # marks a TRUNCATE in a transaction's undo log


class Savepoint:
    __slots__ = ("xid", "undo_mark", "wrote", "released")

    def __init__(self, xid: str, undo_mark: int):
        self.xid = xid
        self.undo_mark = undo_mark
        self.wrote = False
        # subtransactions released into this one that wrote records, innermost first:
        # if this savepoint is rolled back, each of them needs its own ROLLBACK record
        self.released: list[str] = []


class Txn:
    """An open top-level transaction: its private changes, savepoints and locks."""

    __slots__ = ("xid", "thread", "gen", "long", "overlay", "truncated", "undo", "savepoints",
                 "locks", "tables")

    def __init__(self, xid: str, thread: RedoThread, long: bool = False):
        self.xid = xid
        self.thread = thread
        self.gen: Iterator | None = None
        self.long = long
        self.overlay: dict[SimTable, dict[Any, dict | None]] = {}  # None = deleted
        self.truncated: set[SimTable] = set()
        self.undo: list[tuple] = []       # kept only while a savepoint is open
        self.savepoints: list[Savepoint] = []
        self.locks: list[tuple[SimTable, Any]] = []
        self.tables: set[SimTable] = set()


class RedoThread:
    """One redo thread: its current segment's records and its open transactions."""

    def __init__(self, number: int, weight: float, first_scn: int, first_us: int, boundary_us: int):
        self.number = number
        self.weight = weight
        self.sequence = 1
        self.first_scn = first_scn
        self.first_us = first_us
        self.boundary_us = boundary_us   # log time of the next time-based segment switch
        self.rows: list[tuple] = []      # (scn, ts, xid, parent_xid, op, table, before, after)
        self.open: list[Txn] = []        # short transactions, advanced by the main loop
        self.long: list[Txn] = []        # long ones, advanced by scheduled events
        self.accepting = True            # starts new transactions
        self.closed = False
        self.segments = 0


class Simulator:
    def __init__(self, archive_dir: Path, *, seed: int, records: int, hours: float, threads: int,
                 fmt: str, start: datetime, segment_minutes: float, segment_records: int | None,
                 concurrency: int, quiet_stretches, close_at: float | None,
                 hostile_xid_rate: float, rollback_rate: float, schema_changes: tuple[SchemaChange, ...] = (),
                 heartbeat_seconds: float | None = None, heartbeat_source: str = "SIM"):
        self.archive = archive_dir
        self.seed = seed
        self.rng = random.Random(seed)
        self.total = records
        self.fmt = fmt
        self.start_us = to_micros(start)
        self.span_us = int(hours * 3_600_000_000)
        self.end_us = self.start_us + self.span_us
        self.segment_us = int(segment_minutes * 60_000_000)
        self.segment_records = segment_records
        self.concurrency = concurrency
        self.hostile_xid_rate = hostile_xid_rate
        self.rollback_rate = rollback_rate
        # A heartbeat (trailbound/heartbeat.py) every heartbeat_seconds of log time, if any.
        self.heartbeat_us = int(heartbeat_seconds * 1_000_000) if heartbeat_seconds else 0
        self.heartbeat_source = heartbeat_source

        self.count = 0                 # records emitted so far
        self.scn = 999                 # last SCN handed out
        self.previous_commit_thread = 0  # thread of the previous record if it was a COMMIT
        self.hold_scn = False            # the next records get the last SCN again (a handoff)
        self.last_csn = 0
        self.committed = 0
        self.rolled_back = 0
        self.xid_counter = 1000
        self.single_hostile = list(reversed(SINGLE_HOSTILE_XIDS))
        self.features: dict[str, int] = dict.fromkeys([
            "rolled_back_transactions", "rolled_back_savepoints", "nested_savepoint_rollbacks",
            "released_savepoints", "pk_updates", "keyless_changes", "truncates_committed",
            "truncates_rolled_back", "hostile_xids", "shared_commit_scns", "large_values",
            "empty_segments", "long_transactions", "handoffs",
        ], 0)
        if schema_changes:
            self.features["schema_changes"] = 0

        self.tables = source_tables()
        self.table = {table.name: table for table in self.tables}
        # defs.json as it is written: each table's versions (a schema change adds one)
        self.defs = {table.name: _definition(table) for table in self.tables}
        if self.heartbeat_us:  # its rows are not the modelled database's: in defs.json only
            self.defs[HEARTBEAT] = _definition(heartbeat_table())
        self.schema_changes = tuple(schema_changes)
        for change in self.schema_changes:  # what the workload knows how to write to
            known = self.table.get(change.table)
            if change.kind == "create_table" and (known is not None or change.table != review_table().name):
                raise ValueError(f"{change.describe()}: the simulator creates only {review_table().name}, once")
            if change.kind != "create_table" and (known is None or (change.kind != "add_column") !=
                                                  (change.column in known.column_names)):
                raise ValueError(f"{change.describe()}: no such table, or the column is (not) there already")

        self.threads = [
            RedoThread(number, weight=threads - number + 1, first_scn=self.scn + 1,
                       first_us=self.start_us,
                       # staggered switches: threads do not all switch at the same moment
                       boundary_us=self.start_us + self.segment_us + (number - 1) * self.segment_us // threads)
            for number in range(1, threads + 1)
        ]
        self.next_switch_us = min(thread.boundary_us for thread in self.threads)
        self.eligible: list[tuple[RedoThread, float]] = []
        self._refresh_eligible()

        self.events: list[tuple[int, int, Callable[[], None]]] = []
        self.event_seq = 0
        self._text_minute = None
        self._text_prefix = ""
        self.last_seen_us = 0
        self.workload = Workload(self)
        self.bytes = 0  # data files written
        self._plan(quiet_stretches, close_at)

    # ---- time and scheduling -------------------------------------------------------

    def now_us(self) -> int:
        """Log time of the next record: advances evenly from start to start + hours."""
        return self.start_us + self.count * self.span_us // self.total

    def at(self, fraction: float) -> int:
        return self.start_us + int(self.span_us * fraction)

    def schedule(self, due_us: int, action: Callable[[], None]) -> None:
        self.event_seq += 1
        heapq.heappush(self.events, (due_us, self.event_seq, action))

    def _plan(self, quiet_stretches, close_at: float | None) -> None:
        """Schedule the long stories that must occur whatever the archive size."""
        last = self.threads[-1]
        stops = len(self.threads) > 1 and close_at is not None
        goes_quiet = len(self.threads) > 1 and bool(quiet_stretches)
        # Threads that are always up: long transactions and truncates run there.
        self.busy_threads = self.threads[:-1] if stops or goes_quiet else self.threads
        if len(self.threads) > 1:
            for quiet_from, quiet_to in quiet_stretches:
                if close_at is None or quiet_to < close_at:
                    self.schedule(self.at(quiet_from), lambda: self._set_accepting(last, False))
                    self.schedule(self.at(quiet_to), lambda: self._set_accepting(last, True))
        if stops:
            # stop starting transactions a little before, let the open ones finish, then close
            self.schedule(self.at(close_at - 0.005), lambda: self._set_accepting(last, False))
            self.schedule(self.at(close_at), lambda: self._close_when_idle(last))

        for index, (story, start, length, outcome) in enumerate(LONG_STORIES):
            thread = self.busy_threads[index % len(self.busy_threads)]
            until = self.at(start + length) if length else None
            every = self.span_us * (length or (1.0 - start) * 0.8) // 30  # ~30 records each
            self.schedule(self.at(start), lambda s=story, t=thread, u=until, e=int(every), o=outcome:
                          self._start_long(s, t, u, e, o))

        for number, fraction in enumerate(TRUNCATE_TIMES):
            thread = self.busy_threads[number % len(self.busy_threads)]
            commit = number % 3 != 1               # the 2nd, 5th, 8th ... roll back
            in_savepoint = number % 4 == 2         # a TRUNCATE rolled back to a savepoint first
            self.schedule(self.at(fraction), lambda t=thread, c=commit, s=in_savepoint:
                          self._start_truncate(t, c, s))

        if len(self.busy_threads) > 1:
            for fraction in HANDOFF_TIMES:
                self.schedule(self.at(fraction), self._handoff)

        for change in self.schema_changes:
            self.schedule(self.at(change.at), lambda c=change: self._schema_change(c))
        if self.heartbeat_us:
            self.features["heartbeats"] = 0
            self.schedule(self.start_us + self.heartbeat_us, self._heartbeat)

        self.schedule(1 << 62, lambda: None)  # sentinel: the heap is never empty

    def _start_long(self, story, thread: RedoThread, until: int | None, every: int, outcome: str) -> None:
        txn = self.new_txn(thread, long=True)
        txn.gen = getattr(self.workload, story)(txn, until, every, outcome)
        self.features["long_transactions"] += 1
        self._advance_long(txn)

    def _advance_long(self, txn: Txn) -> None:
        delay = next(txn.gen, None)
        if delay is not None:
            self.schedule(self.now_us() + delay, lambda: self._advance_long(txn))

    def _start_truncate(self, thread: RedoThread, commit: bool, in_savepoint: bool) -> None:
        table = self.table[CARTS]
        # Someone is shopping right now (one change written here, at once): the TRUNCATE
        # must wait until that transaction ends.
        shopper = self.new_txn(self.busy_threads[-1])
        shopper.gen = self.workload.cart_story(shopper)
        next(shopper.gen, None)
        table.draining = True  # like a lock queue: new users wait behind the TRUNCATE
        txn = self.new_txn(thread)
        txn.gen = self.workload.truncate_story(txn, table, commit, in_savepoint)

    def _handoff(self) -> None:
        """Two transactions on two threads change the same row one right after the other
        and commit at the same SCN: only the tie-break (scn, thread, sequence, rba) applies
        them in the right order. Written at once (four records), so nothing comes between."""
        if self.total - self.count < 4:
            return
        self.hold_scn = False
        first = self.new_txn(self.busy_threads[0])
        ident = self.workload.reprice_or_stock(first)
        self.end(first, commit=True)
        self.hold_scn = True
        second = self.new_txn(self.busy_threads[1])
        self.workload.reprice_or_stock(second, ident)
        self.end(second, commit=True)
        self.hold_scn = False
        self.features["handoffs"] += 1

    def _schema_change(self, change: SchemaChange) -> None:
        """One schema change as its own transaction (changes.py): once no open transaction
        has used the table, a row under the old definition, the change (a new version in
        defs.json), a row under the new one, COMMIT. Written at once: nothing comes between."""
        table = self.table.get(change.table)
        if table is not None and (table.users or table.exclusive is not None):
            self.schedule(self.now_us() + 1, lambda: self._schema_change(change))  # after the next record
            return
        if self.total - self.count < 4:
            return
        txn = self.new_txn(self.busy_threads[0])
        if change.kind == "create_table":
            table = review_table()
            self.tables.append(table)
            self.table[table.name] = table
            self._new_version(table)
        else:
            self.insert(txn, table, self.workload.row_for(table))
            own = [row for row in txn.overlay.get(table, {}).values() if row is not None]
            if change.kind == "add_column":
                table.add_column(change.column, change.type, change.default, change.values, own)
            elif change.kind == "drop_column":
                table.drop_column(change.column, own)
            else:
                table.retype(change.column, change.type)
            self._new_version(table)
        self.insert(txn, table, self.workload.row_for(table))
        self.end(txn, commit=True)
        self.features["schema_changes"] += 1

    def _new_version(self, table: SimTable) -> None:
        """The table's definition now, as a new version from the next scn: above every
        record written so far (the old version's), at or below the first of the new.
        defs.json is rewritten before any segment holding such a record is closed."""
        scn, time = self.scn + 1, from_micros(self.now_us()).isoformat()
        now = _definition(table)
        before = self.defs.get(table.name)
        self.defs[table.name] = (before.with_version(now.columns, now.key, scn, time) if before is not None else
                                 TableDef(table.name, now.columns, now.key,
                                          (TableVersion(1, scn, now.columns, now.key, time),)))
        write_defs(self.archive, [definition.as_json() for definition in self.defs.values()])
    def _heartbeat(self) -> None:
        """The source's heartbeat row written in a transaction of its own (an INSERT the
        first time, then UPDATEs), as the live source's pull writes it. Its archive stamp
        is when its segment is due to close: when the simulated archiver hands it on."""
        self.schedule(self.now_us() + self.heartbeat_us, self._heartbeat)
        if self.total - self.count < 2:
            return
        ts = self.now_us()
        if ts >= self.next_switch_us:
            self._switch_segments(ts)  # the segment the row lands in, and when it closes
        thread = self.busy_threads[0]
        self.features["heartbeats"] += 1
        seq = self.features["heartbeats"]
        row = {"source": self.heartbeat_source, "seq": seq, "written_at": self.timestamptz_text(ts),
               "archived_at": self.timestamptz_text(thread.boundary_us)}
        self.xid_counter += 1  # (no random draw: the rest of the archive is the same with or without heartbeats)
        xid = str(self.xid_counter)
        after = encode_json(row)
        if seq == 1:
            self.emit(thread, xid, None, "INSERT", HEARTBEAT, None, after)
        else:
            self.emit(thread, xid, None, "UPDATE", HEARTBEAT, encode_json({"source": self.heartbeat_source}), after)
        self.last_csn = self.emit(thread, xid, None, "COMMIT", None, None, None)
        self.committed += 1

    def _set_accepting(self, thread: RedoThread, accepting: bool) -> None:
        thread.accepting = accepting
        self._refresh_eligible()

    def _close_when_idle(self, thread: RedoThread) -> None:
        if thread.open or thread.long:
            self.schedule(self.now_us() + 60_000_000, lambda: self._close_when_idle(thread))
            return
        now = self.now_us()
        self._switch_segments(now)
        self._close_segment(thread, now, closed=True)
        thread.closed = True
        self._refresh_eligible()
        self._refresh_next_switch()

    def _refresh_eligible(self) -> None:
        """Threads the main loop may pick: up, and starting or finishing transactions."""
        active = [t for t in self.threads if not t.closed and (t.accepting or t.open)]
        total = sum(t.weight for t in active)
        cumulative = 0.0
        self.eligible = []
        for thread in active:
            cumulative += thread.weight / total
            self.eligible.append((thread, cumulative))

    # ---- the main loop ---------------------------------------------------------------

    def run(self) -> None:
        events, step = self.events, self.step
        start_us, span_us, total = self.start_us, self.span_us, self.total
        while self.count < total:
            if events[0][0] <= start_us + self.count * span_us // total:  # self.now_us(), inlined
                heapq.heappop(events)[2]()
                continue
            step()
        self._switch_segments(self.end_us - 1)
        for thread in self.threads:
            if not thread.closed:
                self._close_segment(thread, self.end_us)

    def step(self) -> None:
        r = self.rng.random()
        for thread, threshold in self.eligible:
            if r < threshold:
                break
        open_txns = thread.open
        n = len(open_txns)
        if thread.accepting and (n == 0 or (n < self.concurrency and self.rng.random() < 0.3)):
            txn = self.new_txn(thread)
            txn.gen = self.workload.story(txn)
        else:
            txn = open_txns[int(self.rng.random() * n)]
        next(txn.gen, None)

    def new_xid(self) -> str:
        self.xid_counter += 1
        if self.rng.random() >= self.hostile_xid_rate:
            return str(self.xid_counter)
        self.features["hostile_xids"] += 1
        if self.single_hostile:
            return self.single_hostile.pop()
        return HOSTILE_XID_PATTERNS[self.xid_counter % len(HOSTILE_XID_PATTERNS)](self.xid_counter)

    def new_txn(self, thread: RedoThread, long: bool = False) -> Txn:
        txn = Txn(self.new_xid(), thread, long)
        (thread.long if long else thread.open).append(txn)
        return txn

    # ---- the log -------------------------------------------------------------------

    def emit(self, thread: RedoThread, xid: str, parent: str | None, op: str, table: str | None,
             before: str | None, after: str | None) -> int:
        """Append one record to the thread's current segment; returns its SCN."""
        count = self.count
        ts = self.start_us + count * self.span_us // self.total
        if ts >= self.next_switch_us:
            self._switch_segments(ts)
        if self.segment_records and len(thread.rows) >= self.segment_records:
            self._close_segment(thread, ts)
        if thread.first_scn > self.scn:  # a new segment starts above the last SCN handed out
            self.scn = scn = self.scn + 1
        elif self.hold_scn or (op == "COMMIT" and 0 < self.previous_commit_thread < thread.number
                               and self.rng.random() < 0.5):
            # Commits on two threads at the very same SCN: only the tie-break (scn, thread,
            # sequence, rba) orders them. The lower thread committed first, so the
            # contract's order is the order the changes really happened in.
            scn = self.scn
            if op == "COMMIT":
                self.features["shared_commit_scns"] += 1
        else:
            self.scn = scn = self.scn + 1
        self.previous_commit_thread = thread.number if op == "COMMIT" else 0
        thread.rows.append((scn, ts, xid, parent, op, table, before, after))
        self.count = count + 1
        return scn

    def _switch_segments(self, ts: int) -> None:
        """Close every segment whose time is up; an idle thread writes empty segments."""
        for thread in self.threads:
            while not thread.closed and thread.boundary_us <= ts:
                self._close_segment(thread, thread.boundary_us)
                thread.boundary_us += self.segment_us
        self._refresh_next_switch()

    def _refresh_next_switch(self) -> None:
        self.next_switch_us = min((t.boundary_us for t in self.threads if not t.closed), default=1 << 62)

    def _segment_format(self, thread: RedoThread) -> str:
        if self.fmt != "mixed":
            return self.fmt
        # both encodings, alternating within every thread
        return FORMATS[(thread.number + thread.sequence) % 2]

    def _close_segment(self, thread: RedoThread, at_us: int, closed: bool = False) -> None:
        rows = thread.rows
        if rows:
            scn, ts, xid, parent, op, table, before, after = zip(*rows)
        else:
            scn = ts = xid = parent = op = table = before = after = ()
            self.features["empty_segments"] += 1
        next_scn = self.scn + 1
        fmt = self._segment_format(thread)
        write_segment_columns(
            self.archive, thread=thread.number, sequence=thread.sequence,
            columns={"scn": scn, "ts": ts, "xid": xid, "parent_xid": parent, "op": op,
                     "table": table, "before": before, "after": after},
            first_scn=Scn(thread.first_scn), next_scn=Scn(next_scn),
            first_time=from_micros(thread.first_us), next_time=from_micros(at_us),
            fmt=fmt, closed=closed,
        )
        self.bytes += os.path.getsize(self.archive / data_name(thread.number, thread.sequence, fmt))
        thread.segments += 1
        thread.sequence += 1
        thread.first_scn = next_scn
        thread.first_us = at_us
        thread.rows = []

    # ---- the database model --------------------------------------------------------
    #
    # A transaction sees the committed rows plus its own changes (txn.overlay). Locks keep
    # other open transactions away from every row it touched, so its view never goes stale.

    def available(self, txn: Txn, table: SimTable) -> bool:
        """May the transaction use the table (not truncated or about to be, by another)?"""
        return table in txn.tables or not (table.draining or table.exclusive is not None)

    def pick(self, txn: Txn, table: SimTable) -> tuple[Any, dict] | None:
        """A random existing row the transaction may change, locked for it; None if the
        table is empty, unavailable, or the rows tried are locked by others."""
        if not self.available(txn, table):
            return None
        idents = table.idents
        for _ in range(3):
            if not idents:
                return None
            ident = idents[int(self.rng.random() * len(idents))]
            owner = table.locks.get(ident)
            if owner is None:
                if table in txn.truncated:
                    continue
                table.locks[ident] = txn
                txn.locks.append((table, ident))
                if table not in txn.tables:
                    table.users.add(txn)
                    txn.tables.add(table)
                return ident, table.rows[ident]
            if owner is txn:
                row = self.view(txn, table, ident)
                if row is not None:
                    return ident, row
        return None

    def pick_row(self, txn: Txn, table: SimTable, ident) -> dict | None:
        """Lock a given row for the transaction; None if another one holds it."""
        owner = table.locks.get(ident)
        if owner is None:
            table.locks[ident] = txn
            txn.locks.append((table, ident))
        elif owner is not txn:
            return None
        return self.view(txn, table, ident)

    def view(self, txn: Txn, table: SimTable, ident) -> dict | None:
        changes = txn.overlay.get(table)
        if changes is not None and ident in changes:
            return changes[ident]
        if table in txn.truncated:
            return None
        return table.rows.get(ident)

    def _set(self, txn: Txn, table: SimTable, ident, row: dict | None) -> None:
        changes = txn.overlay.get(table)
        if changes is None:
            changes = txn.overlay[table] = {}
            if table not in txn.tables:
                table.users.add(txn)
                txn.tables.add(table)
        if txn.savepoints:
            txn.undo.append((table, ident, changes.get(ident, MISSING)))
        changes[ident] = row

    def _dml(self, txn: Txn, op: str, table: SimTable, before: str | None, after: str | None) -> None:
        if txn.savepoints:
            savepoint = txn.savepoints[-1]
            savepoint.wrote = True
            self.emit(txn.thread, savepoint.xid, txn.xid, op, table.name, before, after)
        else:
            self.emit(txn.thread, txn.xid, None, op, table.name, before, after)
        if table.keyless:
            self.features["keyless_changes"] += 1

    def begin(self, txn: Txn) -> None:
        self.emit(txn.thread, txn.xid, None, "BEGIN", None, None, None)

    def insert(self, txn: Txn, table: SimTable, row: dict) -> None:
        if table.reshaped:
            row = table.shaped(row, self._pick)
        ident = table.ident_of(row)
        table.locks[ident] = txn  # the new key is reserved until the transaction ends
        txn.locks.append((table, ident))
        self._set(txn, table, ident, row)
        self._dml(txn, "INSERT", table, None, encode_json(row))

    def update(self, txn: Txn, table: SimTable, ident, old: dict, changes: dict,
               full_before: bool = False) -> None:
        """UPDATE a picked row: `after` holds the key and the changed columns only."""
        if table.reshaped:
            changes = table.shaped_changes(changes)
        new = {**old, **changes}
        new_ident = table.ident_of(new)
        if new_ident != ident:  # a primary-key update: the row moves to a fresh key
            table.locks[new_ident] = txn
            txn.locks.append((table, new_ident))
            self._set(txn, table, ident, None)
            self.features["pk_updates"] += 1
        self._set(txn, table, new_ident, new)
        if table.keyless:  # identified by all columns: both images are whole rows
            before, after = old, new
        else:
            before = old if full_before else table.key_of(old)
            after = table.key_of(new)
            after.update(changes)
        self._dml(txn, "UPDATE", table, encode_json(before), encode_json(after))

    def delete(self, txn: Txn, table: SimTable, ident, old: dict, full_before: bool = False) -> None:
        self._set(txn, table, ident, None)
        before = old if (full_before or table.keyless) else table.key_of(old)
        self._dml(txn, "DELETE", table, encode_json(before), None)

    def try_truncate(self, txn: Txn, table: SimTable) -> bool:
        """TRUNCATE needs the table to itself: no other open transaction may have touched it."""
        if table.exclusive not in (None, txn) or len(table.users) > (txn in table.users):
            return False
        table.exclusive = txn
        table.users.add(txn)
        txn.tables.add(table)
        if txn.savepoints:
            txn.undo.append((_TRUNCATED, table, txn.overlay.get(table), table in txn.truncated))
        txn.overlay[table] = {}
        txn.truncated.add(table)
        self._dml(txn, "TRUNCATE", table, None, None)
        return True

    def savepoint(self, txn: Txn) -> None:
        """SAVEPOINT: later changes belong to a new subtransaction (no record of its own)."""
        txn.savepoints.append(Savepoint(self.new_xid(), len(txn.undo)))

    def release(self, txn: Txn) -> None:
        """RELEASE SAVEPOINT: the work stays, no record is written."""
        savepoint = txn.savepoints.pop()
        if savepoint.wrote:
            self.features["released_savepoints"] += 1
        if txn.savepoints:
            outer = txn.savepoints[-1]
            outer.released.extend(savepoint.released)
            if savepoint.wrote:
                outer.released.append(savepoint.xid)
        else:
            txn.undo.clear()  # no savepoint left that could be rolled back to

    def undo_savepoints(self, txn: Txn, level: int) -> list[str]:
        """ROLLBACK TO SAVEPOINT number `level` (0 = outermost open one): undo the changes
        since then and return the subtransactions that need a ROLLBACK record, innermost
        first (only those that wrote records exist in the log)."""
        doomed: list[str] = []
        mark = len(txn.undo)
        while len(txn.savepoints) > level:
            savepoint = txn.savepoints.pop()
            doomed.extend(savepoint.released)
            if savepoint.wrote:
                doomed.append(savepoint.xid)
            mark = savepoint.undo_mark
        undo = txn.undo
        while len(undo) > mark:
            entry = undo.pop()
            if entry[0] is _TRUNCATED:
                _, table, changes, was_truncated = entry
                if changes is None:
                    txn.overlay.pop(table, None)
                else:
                    txn.overlay[table] = changes
                if not was_truncated:
                    txn.truncated.discard(table)
            else:
                table, ident, previous = entry
                if previous is MISSING:
                    del txn.overlay[table][ident]
                else:
                    txn.overlay[table][ident] = previous
        if not txn.savepoints:
            undo.clear()
        if doomed:
            self.features["rolled_back_savepoints"] += len(doomed)
            if len(doomed) > 1:
                self.features["nested_savepoint_rollbacks"] += 1
        return doomed

    def roll_back_subtransaction(self, txn: Txn, sub_xid: str) -> None:
        self.emit(txn.thread, sub_xid, txn.xid, "ROLLBACK", None, None, None)

    def end(self, txn: Txn, commit: bool) -> None:
        """COMMIT or ROLLBACK the whole transaction and release its locks."""
        scn = self.emit(txn.thread, txn.xid, None, "COMMIT" if commit else "ROLLBACK", None, None, None)
        if commit:
            for table in txn.truncated:
                table.clear()
                self.features["truncates_committed"] += 1
            for table, changes in txn.overlay.items():
                for ident, row in changes.items():
                    if row is None:
                        table.remove(ident)
                    else:
                        table.put(ident, row)
            self.committed += 1
            self.last_csn = scn
        else:
            self.rolled_back += 1
            self.features["rolled_back_transactions"] += 1
            self.features["truncates_rolled_back"] += len(txn.truncated)
        for table, ident in txn.locks:
            del table.locks[ident]
        for table in txn.tables:
            table.users.discard(txn)
            if table.exclusive is txn:
                table.exclusive = None
                table.draining = False
        txn.gen = None  # the generator refers to the transaction: break the cycle
        thread = txn.thread
        (thread.long if txn.long else thread.open).remove(txn)
        if not thread.accepting and not thread.open:
            self._refresh_eligible()

    def _pick(self, pool: tuple):
        return pool[int(self.rng.random() * len(pool))]

    # ---- values that depend on log time ----------------------------------------------

    def timestamptz_text(self, micros: int) -> str:
        minute, within = divmod(micros, 60_000_000)
        if minute != self._text_minute:  # strftime is slow: once a minute is enough
            self._text_minute = minute
            self._text_prefix = from_micros(minute * 60_000_000).strftime("%Y-%m-%d %H:%M:")
        second, fraction = divmod(within, 1_000_000)
        return f"{self._text_prefix}{second:02d}.{fraction:06d}+00"

    def now_text(self) -> str:
        return self.timestamptz_text(self.now_us())

    def unique_now_text(self) -> str:
        """Log time, but strictly increasing: keeps the keyless table's rows unique."""
        self.last_seen_us = max(self.now_us(), self.last_seen_us + 1)
        return self.timestamptz_text(self.last_seen_us)

    # ---- the truth -------------------------------------------------------------------

    def truth(self) -> dict:
        tables = {}
        for table in self.tables:
            columns = table.column_names
            order = table.key or columns
            rows = [{column: row[column] for column in columns} for row in table.rows.values()]
            rows.sort(key=lambda row: [_sortable(row[column]) for column in order])
            tables[table.name] = {"key": list(table.key), "columns": columns, "rows": rows}
        open_at_end = sum(len(t.open) + len(t.long) for t in self.threads)
        return {
            "format": TRUTH_FORMAT,
            "seed": self.seed,
            "records": self.count,
            "last_csn": self.last_csn,
            "tables": tables,
            "transactions": {"committed": self.committed, "rolled_back": self.rolled_back,
                             "open_at_end": open_at_end},
        }


def _definition(table: SimTable) -> TableDef:
    return TableDef(table.name, tuple(Column(name, kind, nullable, table.defaults.get(name))
                                      for name, kind, nullable in table.columns), tuple(table.key))


def _sortable(value: Any) -> tuple:
    """Order values of mixed JSON types deterministically (None < bool < number < text)."""
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, (int, float)):
        return (2, value)
    return (3, value)
