"""The simulated source: a busy OLTP database that writes a redo archive (the embedded default).

`simulate()` plays a shop (schema `shop`) and its HR department (schema `hr`) on a
database with several redo threads, and writes what their redo log would hold, exactly
in the archive format of trailbound.archive.contract, plus `defs.json` and a truth file:
the final state of every table after the committed work, which a replica must reach.

How it works, in one paragraph: a single loop emits one log record per step. Each open
transaction is a Python generator that performs one change per step (so transactions
interleave freely) against a small model of the database: committed rows, per-transaction
private changes with an undo log for savepoints, and row/table locks so that, as in a real
database, no two open transactions touch the same row and a TRUNCATE waits for every other
user of its table. Every record gets the next SCN of one global clock and a log time that
advances evenly from `start` to `start + hours`; each thread switches to a new segment every
`segment_minutes` of log time. A few long stories (transactions open for hours, a truncate
every few hours, the last thread going quiet and then stopping for good) are scheduled at
fixed fractions of the duration, so every archive size holds all of them.

Everything is drawn from one seeded random generator and nothing depends on set or hash
order, so the same arguments produce byte-identical files.
"""

from __future__ import annotations

import gc
import heapq
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trailbound.archive.contract import DEFS_FILE, FORMATS, MAX_XID_LENGTH, SEGMENT_RE, data_name
from trailbound.archive.writer import (
    encode_json,
    from_micros,
    to_micros,
    write_defs,
    write_segment_columns,
)
from trailbound.durable import atomic_write
from trailbound.positions import Scn

TRUTH_FORMAT = 1
SIMULATOR_FORMATS = FORMATS + ("mixed",)

# Last thread: quiet stretches (it writes empty segments) and the moment it stops for
# good, as fractions of the duration.
DEFAULT_QUIET_STRETCHES = ((0.20, 0.28), (0.45, 0.52))
DEFAULT_CLOSE_AT = 0.75

MISSING = object()
_TRUNCATED = object()  # marks a TRUNCATE in a transaction's undo log


# --------------------------------------------------------------------------------------
# The source tables
# --------------------------------------------------------------------------------------

class SimTable:
    """One source table: its definition and, while simulating, its committed rows and locks.

    Rows are identified by their key; a keyless table by `identity`, a column whose values
    are unique and never updated (a simulator-internal handle: the archive and the truth
    treat the table as keyed by all its columns, and its rows are unique)."""

    def __init__(self, name: str, columns: list[tuple[str, str, bool]], key: list[str],
                 cap: int, identity: str | None = None, first_id: int = 1):
        self.name = name
        self.columns = columns
        self.column_names = [column for column, _, _ in columns]
        self.key = key
        self.keyless = not key
        self.cap = cap  # soft limit on committed rows: beyond it, inserts are paired with deletes
        handle = key or [identity]
        if len(handle) == 1:
            only = handle[0]
            self.ident_of: Callable[[dict], Any] = lambda row: row[only]
        else:
            self.ident_of = lambda row: tuple(row[column] for column in handle)
        self.next_id = first_id
        # committed state: rows by ident, plus a list of idents for O(1) random picks
        self.rows: dict[Any, dict] = {}
        self.idents: list = []
        self.where: dict[Any, int] = {}
        # locking
        self.locks: dict[Any, Txn] = {}
        self.users: set[Txn] = set()        # open transactions that touched the table
        self.exclusive: Txn | None = None   # the transaction that truncated it
        self.draining = False               # a TRUNCATE is waiting: no new users

    def definition(self) -> dict:
        return {
            "name": self.name,
            "columns": [{"name": n, "type": t, "nullable": nullable} for n, t, nullable in self.columns],
            "key": list(self.key),
        }

    def key_of(self, row: dict) -> dict:
        return {column: row[column] for column in self.key}

    def new_id(self) -> int:
        # Keys come from counters that never go back, so an INSERT never reuses a key
        # that exists, is reserved by an open transaction, or was ever used.
        self.next_id += 1
        return self.next_id - 1

    def put(self, ident, row: dict) -> None:
        if ident not in self.rows:
            self.where[ident] = len(self.idents)
            self.idents.append(ident)
        self.rows[ident] = row

    def remove(self, ident) -> None:
        if self.rows.pop(ident, MISSING) is MISSING:
            return
        index = self.where.pop(ident)
        last = self.idents.pop()
        if index < len(self.idents):
            self.idents[index] = last
            self.where[last] = index

    def clear(self) -> None:
        self.rows.clear()
        self.idents.clear()
        self.where.clear()


CUSTOMERS = "shop.customers"
ORDERS = "shop.orders"
LINES = "shop.order_lines"
INVENTORY = "shop.inventory"
KUNDEN = 'shop.Kunden "Prüfung"'
PAGE_VIEWS = "shop.page_views"
CARTS = "shop.cart_sessions"
EMPLOYEES = "hr.employees"
TIMESHEETS = "hr.timesheets"


def source_tables() -> list[SimTable]:
    """Fresh table objects, in defs.json order."""
    return [
        SimTable(CUSTOMERS, [
            ("id", "bigint", False), ("name", "text", False), ("email", "text", True),
            ("country", "text", True), ("created_at", "timestamptz", False),
            ("vip", "boolean", False), ("notes", "text", True),
        ], key=["id"], cap=20_000),
        SimTable(ORDERS, [
            ("id", "bigint", False), ("customer_id", "bigint", False), ("status", "text", False),
            ("total", "numeric", False), ("ordered_at", "timestamptz", False),
            ("ship_date", "date", True), ("items", "integer[]", True), ("meta", "jsonb", True),
        ], key=["id"], cap=50_000),
        SimTable(LINES, [
            ("order_id", "bigint", False), ("line_no", "integer", False), ("sku", "text", False),
            ("qty", "integer", False), ("price", "numeric", False),
            ("discount", "double precision", True),
        ], key=["order_id", "line_no"], cap=120_000),
        SimTable(INVENTORY, [
            ("sku", "text", False), ("on_hand", "integer", False), ("reserved", "integer", False),
            ("price", "numeric", False), ("updated_at", "timestamptz", False),
        ], key=["sku"], cap=5_000),
        SimTable(KUNDEN, [
            ("Kunden-Nr", "bigint", False), ("select", "text", True), ("Mixed Case", "text", True),
            ("naïve", "boolean", True), ("from", "date", True), ("payload", "bytea", True),
            ("score", "double precision", True), ("tags", "text[]", True), ("big", "bigint", True),
        ], key=["Kunden-Nr"], cap=5_000, first_id=100_000),
        SimTable(PAGE_VIEWS, [
            ("session", "text", False), ("url", "text", False), ("seen_at", "timestamptz", False),
            ("hits", "integer", False), ("referrer", "text", True),
        ], key=[], cap=30_000, identity="seen_at"),
        SimTable(CARTS, [
            ("session_id", "bigint", False), ("customer_id", "bigint", True),
            ("started_at", "timestamptz", False), ("data", "jsonb", True),
        ], key=["session_id"], cap=5_000),
        SimTable(EMPLOYEES, [
            ("emp_id", "integer", False), ("full_name", "text", False), ("dept", "text", False),
            ("salary", "numeric", False), ("hired", "date", False), ("manager_id", "integer", True),
            ("active", "boolean", False),
        ], key=["emp_id"], cap=3_000, first_id=1_000),
        SimTable(TIMESHEETS, [
            ("id", "bigint", False), ("emp_id", "integer", False), ("day", "date", False),
            ("hours", "double precision", False), ("note", "text", True),
        ], key=["id"], cap=40_000),
    ]


# --------------------------------------------------------------------------------------
# Awkward values, in the contract's value encoding (PostgreSQL text input forms)
# --------------------------------------------------------------------------------------

FIRST_NAMES = ["Anna", "Zoë", "José", "Łukasz", "Søren", "Nguyễn", "O'Neil", "Иван", "李",
               "さくら", "Mary-Jane", "Renée", "D'Angelo", "Åsa", "Chloé"]
LAST_NAMES = ["Müller", "O'Brien", "García", "van der Berg", "Ødegaard", 'Smith "Smitty"', "王",
              "山田", "Ñúñez", "Back\\slash", "Ångström", "Dupont", "Nowak-Kowalska"]
COUNTRIES = ["DE", "FR", "JP", "US", "BR", "NO", "CN", "", None]
STATUS_FLOW = {"new": "paid", "paid": "packed", "packed": "shipped", "shipped": "delivered",
               "delivered": "returned", "returned": "cancelled", "cancelled": "new"}
AWKWARD_TEXTS = [
    "O'Brien's \"quoted\" note", "back\\slash \\N and \\\\", "C:\\temp\\new", "Zoë Ångström",
    "北京市朝阳区", "東京都渋谷区", "서울특별시", "emoji 🚀🎉👩‍👩‍👧", "e\u0301 (e + combining acute)",
    "", " ", "tab\tand\nnewline\r\n", "NULL", "null", "\\x00 is not a byte", "'; DROP TABLE x; --",
    "Ω≈ç√∫ ﬁ ligature", "zero\u200bwidth", "עברית RTL", "a,b,{c}", "$$dollar$$", "%s %d {0}",
]
URLS = ["/", "/cart", "/produkt/über-uns", "/search?q=a%20b&x=1", "/商品/123", "/path with space",
        "/emoji/🚀", "/a/../b", "/'quote'"]
REFERRERS = [None, "", "https://example.com/", "https://例え.jp/", "https://x.test/?q=\"a\""]
JSONB_VALUES = ['{"channel": "web"}', '{"gift": true, "note": "naïve \\"quoted\\""}',
                '{"n": 1.5, "tags": ["a", "b"]}', "{}", "[]", '"just a string"', "null",
                '{"emoji": "🚀", "nested": {"deep": [1, {"x": null}]}}']
INT_ARRAYS = ["{1,2}", "{}", "{7}", "{1,2,3,5,8}", "{NULL,4}", "{-1,0,1}"]
TEXT_ARRAYS = ['{"a b",c}', "{}", '{"with \\"quote\\"","back\\\\slash"}', '{NULL,"NULL"}', "{ä,😀}"]
DISCOUNTS = [None, 0.0, 0.05, 0.1, 0.125, 0.3333333333333333, 1e-07, 0.99]
SCORES = [None, 3.14159, -2.5, 1e-300, 6.02214076e23, 0.1, -0.0, 12345.6789, 1.7976931348623157e308]
BIG_INTS = [None, 0, -1, 9007199254740993, -9223372036854775808, 9223372036854775807]
PRECISE_NUMERICS = ["12345.678901234567890", "-0.000000000000000000001", "0", "99999999999999999999.99"]
DEPARTMENTS = ["Sales", "R&D", "Buchhaltung", "人事部", "Ops/Infra", "Legal \"L\""]

# Large values (tens of KB), used now and then for customers' notes: unchanged large values
# must not be repeated in UPDATE after-images.
_LARGE_UNIT = "Große Anmerkung — 大きなメモ — 🚀 \"quoted\", back\\slash; line\n"
LARGE_TEXTS = [_LARGE_UNIT * repeat for repeat in (250, 600, 1100)]

# Hostile transaction ids: a capture must never use an xid as a path or file name.
SINGLE_HOSTILE_XIDS = ["/", ".", "..", "\\"]  # each used once: xids must be unique
HOSTILE_XID_PATTERNS: list[Callable[[int], str]] = [
    lambda n: f"a/b/{n}",
    lambda n: f"../../etc/{n}",
    lambda n: f"..\\..\\{n}",
    lambda n: f"tx {n} . with spaces",
    lambda n: f"Überweisung-{n}-日本-🚀",
    lambda n: f"{n}.".ljust(MAX_XID_LENGTH, "ø"),
    lambda n: f"C:\\{n}\\x",
    lambda n: f"{n}e\u0301\u200b",
    lambda n: f"*?<>|:{n}",
    lambda n: f"${{HOME}}/{n}",
]


# --------------------------------------------------------------------------------------
# Transactions and threads
# --------------------------------------------------------------------------------------

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


@dataclass
class SimulationSummary:
    archive_dir: Path
    truth_path: Path
    records: int
    committed: int
    rolled_back: int
    open_at_end: int
    segments: dict[int, int]
    bytes: int
    first_time: datetime
    last_time: datetime
    last_scn: int
    elapsed_seconds: float
    features: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        rate = self.records / self.elapsed_seconds if self.elapsed_seconds else 0.0
        segments = ", ".join(f"thread {t}: {n}" for t, n in sorted(self.segments.items()))
        features = ", ".join(f"{name} {count}" for name, count in self.features.items())
        return "\n".join([
            f"{self.records:,} records in {self.elapsed_seconds:.1f} s ({rate:,.0f} records/s), "
            f"{self.bytes / 1e6:,.1f} MB in {self.archive_dir}",
            f"log time {self.first_time.isoformat()} .. {self.last_time.isoformat()}, last SCN {self.last_scn}",
            f"transactions: {self.committed:,} committed, {self.rolled_back:,} rolled back, "
            f"{self.open_at_end:,} open at the end",
            f"segments: {segments}",
            f"features: {features}",
        ])


# --------------------------------------------------------------------------------------
# The engine: SCN clock, log threads and segments, the database model
# --------------------------------------------------------------------------------------

class Simulator:
    def __init__(self, archive_dir: Path, *, seed: int, records: int, hours: float, threads: int,
                 fmt: str, start: datetime, segment_minutes: float, segment_records: int | None,
                 concurrency: int, quiet_stretches, close_at: float | None,
                 hostile_xid_rate: float, rollback_rate: float):
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

        self.tables = source_tables()
        self.table = {table.name: table for table in self.tables}

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
        ident = table.ident_of(row)
        table.locks[ident] = txn  # the new key is reserved until the transaction ends
        txn.locks.append((table, ident))
        self._set(txn, table, ident, row)
        self._dml(txn, "INSERT", table, None, encode_json(row))

    def update(self, txn: Txn, table: SimTable, ident, old: dict, changes: dict,
               full_before: bool = False) -> None:
        """UPDATE a picked row: `after` holds the key and the changed columns only."""
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


def _sortable(value: Any) -> tuple:
    """Order values of mixed JSON types deterministically (None < bool < number < text)."""
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, (int, float)):
        return (2, value)
    return (3, value)


# --------------------------------------------------------------------------------------
# The workload: what the shop and HR do, one change per step
# --------------------------------------------------------------------------------------

# Long stories: (workload method, start, length, outcome); start and length are fractions
# of the duration (hours at the default 48 h in the comments). A length of None: never ends.
LONG_STORIES = (
    ("repricing", 0.05, 6 / 48, "commit"),         # 6 h, holds inventory row locks throughout
    ("annual_review", 0.08, 26 / 48, "commit"),    # 26 h, with a savepoint rolled back inside
    ("bulk_import", 0.30, 4 / 48, "rollback"),     # 4 h of inserts, then all rolled back
    ("stuck_session", 0.62, None, "open"),         # one change, then idle in transaction forever
    ("slow_migration", 0.85, None, "open"),        # still writing when the archive ends
)
# TRUNCATE of shop.cart_sessions, as fractions of the duration (every ~5 h at 48 h).
TRUNCATE_TIMES = tuple(0.07 + 0.1 * n for n in range(10))
# Handoffs of one row between two threads at one SCN (Simulator._handoff).
HANDOFF_TIMES = tuple(0.1 + 0.04 * n for n in range(20))


class Workload:
    """Transaction stories. Each is a generator: it makes one change (one record) and
    yields, so the main loop can interleave it with the others."""

    def __init__(self, sim: Simulator):
        self.sim = sim
        self.random = sim.rng.random
        self.t = sim.table
        stories = [
            (22, self.order_story), (18, self.fulfilment_story), (14, self.browsing_story),
            (9, self.customer_care_story), (8, self.inventory_story), (12, self.hr_story),
            (6, self.kunden_story), (6, self.cart_story), (5, self.savepoint_story),
        ]
        total = sum(weight for weight, _ in stories)
        cumulative = 0.0
        self.stories = []
        for weight, story in stories:
            cumulative += weight / total
            self.stories.append((cumulative, story))

    def story(self, txn: Txn) -> Iterator:
        r = self.random()
        for threshold, story in self.stories:
            if r < threshold:
                return story(txn)
        return self.stories[-1][1](txn)

    # ---- small helpers -----------------------------------------------------------------

    def choice(self, pool: list):
        return pool[int(self.random() * len(pool))]

    def below(self, n: int) -> int:
        return int(self.random() * n)

    def chance(self, p: float) -> bool:
        return self.random() < p

    def money(self) -> str:
        cents = 100 + self.below(10_000_000)
        return f"{cents // 100}.{cents % 100:02d}"

    def precise(self) -> str:
        """numeric with 20 significant digits (a double would lose them)."""
        if self.chance(0.05):
            return self.choice(PRECISE_NUMERICS)
        return f"{10_000 + self.below(90_000)}.{self.below(10 ** 15):015d}"

    def today(self) -> str:
        return self.sim.now_text()[:10]

    def commit_or_rollback(self, txn: Txn, rollback_rate: float | None = None) -> None:
        rate = self.sim.rollback_rate if rollback_rate is None else rollback_rate
        self.sim.end(txn, commit=not self.chance(rate))

    def trim(self, txn: Txn, table: SimTable, inserted: int = 1) -> Iterator:
        """Keep a table near its cap: once it is full, a delete for every row inserted."""
        for _ in range(inserted):
            if len(table.rows) <= table.cap:
                return
            picked = self.sim.pick(txn, table)
            if picked is None:
                return
            self.sim.delete(txn, table, *picked, full_before=self.chance(0.3))
            yield

    def roll_back_to(self, txn: Txn, level: int) -> Iterator:
        for sub_xid in self.sim.undo_savepoints(txn, level):
            self.sim.roll_back_subtransaction(txn, sub_xid)
            yield

    # ---- rows ------------------------------------------------------------------------

    def customer_row(self) -> dict:
        sim = self.sim
        customer_id = self.t[CUSTOMERS].new_id()
        notes = None
        r = self.random()
        if r < 0.005:
            notes = self.choice(LARGE_TEXTS)
            sim.features["large_values"] += 1
        elif r < 0.2:
            notes = self.choice(AWKWARD_TEXTS)
        return {
            "id": customer_id,
            "name": f"{self.choice(FIRST_NAMES)} {self.choice(LAST_NAMES)}",
            "email": None if r > 0.95 else ("" if r > 0.93 else f"user{customer_id}@example.com"),
            "country": self.choice(COUNTRIES),
            "created_at": sim.now_text(),
            "vip": r < 0.1,
            "notes": notes,
        }

    def order_row(self, customer_id: int) -> dict:
        return {
            "id": self.t[ORDERS].new_id(),
            "customer_id": customer_id,
            "status": "new",
            "total": self.money(),
            "ordered_at": self.sim.now_text(),
            "ship_date": None,
            "items": self.choice(INT_ARRAYS),
            "meta": self.choice(JSONB_VALUES) if self.chance(0.7) else None,
        }

    def line_row(self, order_id: int) -> dict:
        return {
            "order_id": order_id,
            "line_no": self.t[LINES].new_id(),
            "sku": f"SKU-{self.below(5000):06d}",
            "qty": 1 + self.below(5),
            "price": self.money(),
            "discount": self.choice(DISCOUNTS),
        }

    def inventory_row(self) -> dict:
        return {
            "sku": f"SKU-{self.t[INVENTORY].new_id():06d}",
            "on_hand": self.below(1000),
            "reserved": 0,
            "price": self.precise(),
            "updated_at": self.sim.now_text(),
        }

    def kunden_row(self) -> dict:
        return {"Kunden-Nr": self.t[KUNDEN].new_id(), **self.kunden_values()}

    def kunden_values(self) -> dict:
        return {
            "select": self.choice(AWKWARD_TEXTS),
            "Mixed Case": self.choice(AWKWARD_TEXTS) if self.chance(0.8) else None,
            "naïve": self.choice([True, False, None]),
            "from": self.today() if self.chance(0.8) else None,
            "payload": "\\x" + self.sim.rng.getrandbits(64).to_bytes(8, "big").hex() if self.chance(0.8) else self.choice(["\\x", None]),
            "score": self.choice(SCORES),
            "tags": self.choice(TEXT_ARRAYS) if self.chance(0.8) else None,
            "big": self.choice(BIG_INTS),
        }

    def page_view_row(self) -> dict:
        return {
            "session": f"s-{self.below(100_000):05x}",
            "url": self.choice(URLS),
            "seen_at": self.sim.unique_now_text(),
            "hits": 1,
            "referrer": self.choice(REFERRERS),
        }

    def cart_row(self) -> dict:
        return {
            "session_id": self.t[CARTS].new_id(),
            "customer_id": self.below(20_000) if self.chance(0.7) else None,
            "started_at": self.sim.now_text(),
            "data": self.choice(JSONB_VALUES),
        }

    def employee_row(self) -> dict:
        return {
            "emp_id": self.t[EMPLOYEES].new_id(),
            "full_name": f"{self.choice(FIRST_NAMES)} {self.choice(LAST_NAMES)}",
            "dept": self.choice(DEPARTMENTS),
            "salary": f"{40_000 + self.below(80_000)}.00",
            "hired": self.today(),
            "manager_id": None if self.chance(0.2) else 1_000 + self.below(50),
            "active": True,
        }

    def timesheet_row(self, emp_id: int) -> dict:
        return {
            "id": self.t[TIMESHEETS].new_id(),
            "emp_id": emp_id,
            "day": self.today(),
            "hours": self.choice([8.0, 7.5, 4.25, 0.5, 10.0, 6.333333333333333]),
            "note": self.choice(AWKWARD_TEXTS) if self.chance(0.3) else None,
        }

    # ---- short transactions --------------------------------------------------------------

    def order_story(self, txn: Txn) -> Iterator:
        sim, t = self.sim, self.t
        if self.chance(0.4):
            sim.begin(txn)
            yield
        picked = sim.pick(txn, t[CUSTOMERS])
        if picked is None:
            customer = self.customer_row()
            sim.insert(txn, t[CUSTOMERS], customer)
            yield
        else:
            customer = picked[1]
        order = self.order_row(customer["id"])
        sim.insert(txn, t[ORDERS], order)
        yield
        lines = 1 + self.below(4)
        for _ in range(lines):
            sim.insert(txn, t[LINES], self.line_row(order["id"]))
            yield
        if self.chance(0.1):  # the customer adds an item, and sometimes takes it out again
            sim.savepoint(txn)
            sim.insert(txn, t[LINES], self.line_row(order["id"]))
            yield
            if self.chance(0.5):
                yield from self.roll_back_to(txn, 0)
            else:
                sim.release(txn)
        if self.chance(0.5):
            picked = sim.pick(txn, t[INVENTORY])
            if picked is not None:
                ident, item = picked
                sim.update(txn, t[INVENTORY], ident, item,
                           {"on_hand": item["on_hand"] - 1, "reserved": item["reserved"] + 1,
                            "updated_at": sim.now_text()})
                yield
        yield from self.trim(txn, t[ORDERS])
        yield from self.trim(txn, t[LINES], lines)
        yield from self.trim(txn, t[CUSTOMERS])
        self.commit_or_rollback(txn)

    def fulfilment_story(self, txn: Txn) -> Iterator:
        sim, t = self.sim, self.t
        if self.chance(0.3):
            sim.begin(txn)
            yield
        picked = sim.pick(txn, t[ORDERS])
        if picked is None:
            sim.insert(txn, t[PAGE_VIEWS], self.page_view_row())
            yield
        else:
            ident, order = picked
            r = self.random()
            if r < 0.05:  # order withdrawn
                sim.delete(txn, t[ORDERS], ident, order, full_before=self.chance(0.5))
                yield
            else:
                status = STATUS_FLOW[order["status"]]
                changes = {"status": status}
                if status == "shipped":
                    changes["ship_date"] = self.today()
                if r < 0.15:
                    changes["meta"] = self.choice(JSONB_VALUES)
                sim.update(txn, t[ORDERS], ident, order, changes, full_before=self.chance(0.3))
                yield
        r = self.random()
        if r < 0.4:
            picked = sim.pick(txn, t[LINES])
            if picked is not None:
                ident, line = picked
                if r < 0.2:
                    sim.delete(txn, t[LINES], ident, line, full_before=self.chance(0.5))
                elif r < 0.3:  # renumbered: a primary-key update
                    sim.update(txn, t[LINES], ident, line,
                               {"line_no": t[LINES].new_id(), "qty": 1 + self.below(9)},
                               full_before=self.chance(0.5))
                else:
                    sim.update(txn, t[LINES], ident, line,
                               {"discount": self.choice(DISCOUNTS)}, full_before=self.chance(0.3))
                yield
        self.commit_or_rollback(txn)

    def browsing_story(self, txn: Txn) -> Iterator:
        """The keyless table: updates and deletes identify rows by all their columns."""
        sim, views = self.sim, self.t[PAGE_VIEWS]
        inserted = 1 + self.below(3)
        for _ in range(inserted):
            sim.insert(txn, views, self.page_view_row())
            yield
        r = self.random()
        if r < 0.5:
            picked = sim.pick(txn, views)
            if picked is not None:
                ident, view = picked
                if r < 0.3:
                    changes = {"hits": view["hits"] + 1}
                    if self.chance(0.3):
                        changes["referrer"] = self.choice(REFERRERS)
                    sim.update(txn, views, ident, view, changes)
                else:
                    sim.delete(txn, views, ident, view)
                yield
        yield from self.trim(txn, views, inserted)
        self.commit_or_rollback(txn)

    def customer_care_story(self, txn: Txn) -> Iterator:
        sim, customers = self.sim, self.t[CUSTOMERS]
        if self.chance(0.3):
            sim.begin(txn)
            yield
        picked = sim.pick(txn, customers)
        if picked is None or self.chance(0.2):
            sim.insert(txn, customers, self.customer_row())
            yield
        if picked is not None:
            ident, customer = picked
            r = self.random()
            if r < 0.06:  # customer number changed: a primary-key update
                sim.update(txn, customers, ident, customer, {"id": customers.new_id()},
                           full_before=self.chance(0.5))
            elif r < 0.10:
                sim.delete(txn, customers, ident, customer, full_before=self.chance(0.5))
            else:
                changes = {}
                if self.chance(0.5):
                    changes["email"] = self.choice([None, "", f"new{self.below(10**6)}@example.org"])
                if self.chance(0.4):
                    changes["country"] = self.choice(COUNTRIES)
                if self.chance(0.3) or not changes:
                    changes["vip"] = not customer["vip"]
                if self.chance(0.2):
                    if self.chance(0.05):
                        changes["notes"] = self.choice(LARGE_TEXTS)
                        sim.features["large_values"] += 1
                    else:
                        changes["notes"] = self.choice(AWKWARD_TEXTS + [None])
                sim.update(txn, customers, ident, customer, changes, full_before=self.chance(0.3))
            yield
        yield from self.trim(txn, customers)
        self.commit_or_rollback(txn)

    def inventory_story(self, txn: Txn) -> Iterator:
        sim, inventory = self.sim, self.t[INVENTORY]
        for _ in range(1 + self.below(3)):
            picked = sim.pick(txn, inventory)
            if picked is None or (len(inventory.rows) < inventory.cap and self.chance(0.1)):
                sim.insert(txn, inventory, self.inventory_row())
            else:
                ident, item = picked
                changes = {"on_hand": item["on_hand"] + self.below(50), "updated_at": sim.now_text()}
                if self.chance(0.2):
                    changes["price"] = self.precise()
                if self.chance(0.2):
                    changes["reserved"] = 0
                sim.update(txn, inventory, ident, item, changes, full_before=self.chance(0.3))
            yield
        self.commit_or_rollback(txn)

    def hr_story(self, txn: Txn) -> Iterator:
        """Touches the hr schema only (table-selection tests rely on that)."""
        sim, employees, timesheets = self.sim, self.t[EMPLOYEES], self.t[TIMESHEETS]
        if self.chance(0.5):
            sim.begin(txn)
            yield
        picked = sim.pick(txn, employees)
        if picked is None or self.chance(0.1):
            employee = self.employee_row()
            sim.insert(txn, employees, employee)
            yield
        else:
            ident, employee = picked
            r = self.random()
            if r < 0.05:  # re-numbered: a primary-key update
                sim.update(txn, employees, ident, employee, {"emp_id": employees.new_id()},
                           full_before=self.chance(0.5))
                yield
            elif r < 0.35:
                column = self.choice(["dept", "salary", "manager_id", "active"])
                if column == "dept":
                    value = self.choice(DEPARTMENTS)
                elif column == "salary":
                    value = f"{40_000 + self.below(80_000)}.{self.below(100):02d}"
                elif column == "manager_id":
                    value = None if self.chance(0.3) else 1_000 + self.below(50)
                else:
                    value = not employee["active"]
                changes = {column: value}
                sim.update(txn, employees, ident, employee, changes, full_before=self.chance(0.3))
                yield
        inserted = 1 + self.below(2)
        for _ in range(inserted):
            sim.insert(txn, timesheets, self.timesheet_row(employee["emp_id"]))
            yield
        if self.chance(0.1):
            picked = sim.pick(txn, timesheets)
            if picked is not None:
                sim.delete(txn, timesheets, *picked, full_before=self.chance(0.3))
                yield
        yield from self.trim(txn, timesheets, inserted)
        self.commit_or_rollback(txn)

    def kunden_story(self, txn: Txn) -> Iterator:
        """The table with the awkward name, columns and values."""
        sim, kunden = self.sim, self.t[KUNDEN]
        picked = sim.pick(txn, kunden)
        r = self.random()
        if picked is None or r < 0.4:
            sim.insert(txn, kunden, self.kunden_row())
        else:
            ident, row = picked
            if r < 0.48:
                sim.update(txn, kunden, ident, row, {"Kunden-Nr": kunden.new_id()},
                           full_before=self.chance(0.5))
            elif r < 0.58:
                sim.delete(txn, kunden, ident, row, full_before=self.chance(0.5))
            else:
                fresh = self.kunden_values()
                columns = [c for c in fresh if self.chance(0.3)] or ["select"]
                sim.update(txn, kunden, ident, row, {c: fresh[c] for c in columns},
                           full_before=self.chance(0.3))
        yield
        yield from self.trim(txn, kunden)
        self.commit_or_rollback(txn)

    def cart_story(self, txn: Txn) -> Iterator:
        sim, carts = self.sim, self.t[CARTS]
        if not sim.available(txn, carts):  # a TRUNCATE has the table: browse instead
            sim.insert(txn, self.t[PAGE_VIEWS], self.page_view_row())
            yield
            self.commit_or_rollback(txn)
            return
        sim.insert(txn, carts, self.cart_row())
        yield
        r = self.random()
        if r < 0.7:
            picked = sim.pick(txn, carts)
            if picked is not None:
                ident, cart = picked
                if r < 0.4:
                    sim.update(txn, carts, ident, cart, {"data": self.choice(JSONB_VALUES)},
                               full_before=self.chance(0.3))
                else:
                    sim.delete(txn, carts, ident, cart, full_before=self.chance(0.3))
                yield
        yield from self.trim(txn, carts)
        self.commit_or_rollback(txn)

    def any_change(self, txn: Txn) -> None:
        """Exactly one change to some shop or hr table (the body of savepoints)."""
        sim, t = self.sim, self.t
        r = self.random()
        if r < 0.25:
            picked = sim.pick(txn, t[CUSTOMERS])
            if picked is not None:
                ident, customer = picked
                sim.update(txn, t[CUSTOMERS], ident, customer, {"vip": not customer["vip"]},
                           full_before=self.chance(0.3))
                return
        elif r < 0.45:
            picked = sim.pick(txn, t[ORDERS])
            if picked is not None:
                ident, order = picked
                sim.update(txn, t[ORDERS], ident, order, {"status": STATUS_FLOW[order["status"]]})
                return
        elif r < 0.6:
            picked = sim.pick(txn, t[PAGE_VIEWS])
            if picked is not None:
                sim.delete(txn, t[PAGE_VIEWS], *picked)
                return
        elif r < 0.75:
            sim.insert(txn, t[TIMESHEETS], self.timesheet_row(1_000 + self.below(50)))
            return
        sim.insert(txn, t[PAGE_VIEWS], self.page_view_row())

    def savepoint_story(self, txn: Txn) -> Iterator:
        """A random walk over savepoints: nested ones, released ones, rolled back ones."""
        sim = self.sim
        if self.chance(0.3):
            sim.begin(txn)
            yield
        for _ in range(3 + self.below(6)):
            depth = len(txn.savepoints)
            r = self.random()
            if r < 0.35 and depth < 3:
                sim.savepoint(txn)
                self.any_change(txn)  # every savepoint writes, so it exists in the log
                yield
            elif r < 0.55 or depth == 0:
                self.any_change(txn)
                yield
            elif r < 0.75:
                sim.release(txn)
            else:
                yield from self.roll_back_to(txn, self.below(depth))
        while txn.savepoints:
            sim.release(txn)
        self.commit_or_rollback(txn, rollback_rate=0.1)

    # ---- scheduled stories -------------------------------------------------------------

    def truncate_story(self, txn: Txn, carts: SimTable, commit: bool, in_savepoint: bool) -> Iterator:
        """TRUNCATE shop.cart_sessions once every other user of it has finished."""
        sim = self.sim
        if in_savepoint:  # truncate, change one's mind, truncate again
            sim.savepoint(txn)
            while not sim.try_truncate(txn, carts):
                yield
            yield
            sim.insert(txn, carts, self.cart_row())
            yield
            yield from self.roll_back_to(txn, 0)
        while not sim.try_truncate(txn, carts):
            yield
        yield
        for _ in range(1 + self.below(3)):
            sim.insert(txn, carts, self.cart_row())
            yield
        sim.end(txn, commit)

    def reprice_or_stock(self, txn: Txn, ident=None):
        """Reprice an inventory item (the given one, else any), or stock a new one if
        there is none to take; returns the item's key."""
        sim, inventory = self.sim, self.t[INVENTORY]
        if ident is None:
            picked = sim.pick(txn, inventory)
        else:
            row = sim.pick_row(txn, inventory, ident)
            picked = None if row is None else (ident, row)
        if picked is None:
            item = self.inventory_row()
            sim.insert(txn, inventory, item)
            return item["sku"]
        ident, item = picked
        sim.update(txn, inventory, ident, item, {"price": self.precise(), "updated_at": sim.now_text()})
        return ident

    def repricing(self, txn: Txn, until: int, every: int, outcome: str) -> Iterator[int]:
        """Reprices inventory one item at a time, holding every row it touched for hours."""
        sim, inventory = self.sim, self.t[INVENTORY]
        sim.begin(txn)
        yield every
        while sim.now_us() < until:
            picked = sim.pick(txn, inventory)
            if picked is None:
                sim.insert(txn, inventory, self.inventory_row())
            else:
                ident, item = picked
                sim.update(txn, inventory, ident, item, {"price": self.precise(), "updated_at": sim.now_text()})
            yield every
        sim.end(txn, outcome == "commit")

    def annual_review(self, txn: Txn, until: int, every: int, outcome: str) -> Iterator[int]:
        """Salary review over a day and more, hr only; one raise is taken back midway."""
        sim, employees = self.sim, self.t[EMPLOYEES]
        steps = 0
        while sim.now_us() < until:
            steps += 1
            if steps == 10:
                sim.savepoint(txn)
            picked = sim.pick(txn, employees)
            if picked is None:
                sim.insert(txn, employees, self.employee_row())
            else:
                ident, employee = picked
                sim.update(txn, employees, ident, employee,
                           {"salary": f"{40_000 + self.below(90_000)}.{self.below(100):02d}"},
                           full_before=True)
            yield every
            if steps == 11:
                for _ in self.roll_back_to(txn, 0):
                    yield every
        sim.end(txn, outcome == "commit")

    def bulk_import(self, txn: Txn, until: int, every: int, outcome: str) -> Iterator[int]:
        sim, customers = self.sim, self.t[CUSTOMERS]
        sim.begin(txn)
        yield every
        while sim.now_us() < until:
            sim.insert(txn, customers, self.customer_row())
            yield every
        sim.end(txn, outcome == "commit")

    def stuck_session(self, txn: Txn, until: int | None, every: int, outcome: str) -> Iterator[int]:
        """One change, then idle in transaction: never commits."""
        sim = self.sim
        picked = sim.pick(txn, self.t[KUNDEN])
        if picked is None:
            sim.insert(txn, self.t[KUNDEN], self.kunden_row())
        else:
            sim.update(txn, self.t[KUNDEN], *picked, {"select": "locked by a forgotten session"})
        yield every

    def slow_migration(self, txn: Txn, until: int | None, every: int, outcome: str) -> Iterator[int]:
        """Copies timesheets slowly and is still at it when the archive ends."""
        sim = self.sim
        while True:
            sim.insert(txn, self.t[TIMESHEETS], self.timesheet_row(1_000 + self.below(50)))
            yield every


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------

def simulate(
    archive_dir: str | os.PathLike,
    truth_path: str | os.PathLike,
    *,
    seed: int = 7,
    records: int = 200_000,
    hours: float = 48.0,
    threads: int = 3,
    fmt: str = "mixed",
    start: datetime = datetime(2026, 11, 1, tzinfo=UTC),
    segment_minutes: float = 15,
    segment_records: int | None = None,
    concurrency: int = 6,
    quiet_stretches: tuple[tuple[float, float], ...] = DEFAULT_QUIET_STRETCHES,
    close_last_thread_at: float | None = DEFAULT_CLOSE_AT,
    hostile_xid_rate: float = 0.01,
    rollback_rate: float = 0.04,
) -> SimulationSummary:
    """Write a simulated redo archive (segments and defs.json) into `archive_dir` and the
    state a replica must reach into `truth_path`.

    records, hours: how many records and how much log time. threads: redo threads; the last
    one goes quiet during `quiet_stretches` (fractions of the duration; it writes empty
    segments) and stops for good at `close_last_thread_at` (None: never). fmt: "parquet",
    "jsonl" or "mixed" (alternating per segment). Segments switch every `segment_minutes`
    of log time, and also after `segment_records` records if given. concurrency: open
    short transactions per thread. Deterministic: the same arguments write the same bytes.
    """
    if fmt not in SIMULATOR_FORMATS:
        raise ValueError(f"fmt must be one of {SIMULATOR_FORMATS}, not {fmt!r}")
    if records < 1 or hours <= 0 or threads < 1 or segment_minutes <= 0:
        raise ValueError("records, hours, threads and segment_minutes must be positive")
    if start.tzinfo is None:
        raise ValueError("start must be an aware datetime")
    archive = Path(archive_dir)
    archive.mkdir(parents=True, exist_ok=True)
    leftovers = [p.name for p in archive.iterdir() if SEGMENT_RE.match(p.name) or p.name == DEFS_FILE]
    if leftovers:
        # Old segments would mix with the new ones into an archive that is neither.
        raise FileExistsError(f"{archive} already holds an archive ({sorted(leftovers)[0]} ...)")

    began = time.perf_counter()
    # Millions of small dicts and tuples and no reference cycles (finished transactions
    # break theirs): the cyclic garbage collector would only rescan them over and over.
    collecting = gc.isenabled()
    gc.disable()
    try:
        sim = Simulator(
            archive, seed=seed, records=records, hours=hours, threads=threads, fmt=fmt,
            start=start, segment_minutes=segment_minutes, segment_records=segment_records,
            concurrency=concurrency, quiet_stretches=quiet_stretches,
            close_at=close_last_thread_at, hostile_xid_rate=hostile_xid_rate,
            rollback_rate=rollback_rate,
        )
        write_defs(archive, [table.definition() for table in sim.tables])
        sim.run()
        truth = sim.truth()
    finally:
        if collecting:
            gc.enable()
    truth_file = Path(truth_path)
    truth_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(truth_file, (json.dumps(truth, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))

    return SimulationSummary(
        archive_dir=archive,
        truth_path=truth_file,
        records=sim.count,
        committed=sim.committed,
        rolled_back=sim.rolled_back,
        open_at_end=truth["transactions"]["open_at_end"],
        segments={t.number: t.segments for t in sim.threads},
        bytes=sim.bytes,
        first_time=from_micros(sim.start_us),
        last_time=from_micros(sim.end_us),
        last_scn=sim.scn,
        elapsed_seconds=time.perf_counter() - began,
        features=dict(sim.features),
    )
