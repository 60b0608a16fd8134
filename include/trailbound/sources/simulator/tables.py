"""The simulated source's tables: their definitions (defs.json order) and, while
simulating, each one's committed rows and row locks (SimTable)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trailbound import heartbeat

if TYPE_CHECKING:
    from trailbound.sources.simulator.engine import Txn

MISSING = object()


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
        # After a schema change (changes.py): the rows the workload makes are reshaped to
        # the table's columns; an added column's values for them, and its DEFAULT.
        self.reshaped = False
        self.fills: dict[str, tuple] = {}
        self.defaults: dict[str, str] = {}

    def definition(self) -> dict:
        return {
            "name": self.name,
            "columns": [{"name": n, "type": t, "nullable": nullable} for n, t, nullable in self.columns],
            "key": list(self.key),
        }

    def add_column(self, name: str, kind: str, default: str | None, values: tuple, rows) -> None:
        """ADD COLUMN: every existing row (committed, and `rows`: the changing
        transaction's own) gets the DEFAULT, as PostgreSQL gives it."""
        self.columns = self.columns + [(name, kind, True)]
        self.fills[name] = values
        if default is not None:
            self.defaults[name] = default
        for row in [*self.rows.values(), *rows]:
            row[name] = default
        self._reshape()

    def drop_column(self, name: str, rows) -> None:
        self.columns = [c for c in self.columns if c[0] != name]
        for row in [*self.rows.values(), *rows]:
            row.pop(name, None)
        self._reshape()

    def retype(self, name: str, kind: str) -> None:
        self.columns = [(n, kind if n == name else t, nullable) for n, t, nullable in self.columns]

    def _reshape(self) -> None:
        self.column_names = [column for column, _, _ in self.columns]
        self.reshaped = True

    def shaped(self, row: dict, pick: Callable[[tuple], Any]) -> dict:
        """A row the workload made, in the table's columns now (an added one filled by `pick`)."""
        return {column: row[column] if column in row else pick(self.fills.get(column, (None,)))
                for column in self.column_names}

    def shaped_changes(self, changes: dict) -> dict:
        return {column: value for column, value in changes.items() if column in self.column_names}

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
REVIEWS = "shop.reviews"   # created mid-archive by a schema change (changes.py)
HEARTBEAT = f"{heartbeat.DEFAULT_SCHEMA}.{heartbeat.TABLE}"   # written only with heartbeat_seconds


def heartbeat_table() -> SimTable:
    """The heartbeat table (trailbound/heartbeat.py): its definition for defs.json. Its
    rows are not part of the modelled database (nor of the truth): replicat keeps them
    in its heartbeat tables."""
    return SimTable(HEARTBEAT, [("source", "text", False), ("seq", "bigint", False),
                                ("written_at", "timestamptz", False)], key=["source"], cap=1)


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


def review_table() -> SimTable:
    """The table a CREATE TABLE brings (changes.py)."""
    return SimTable(REVIEWS, [
        ("id", "bigint", False), ("customer_id", "bigint", False), ("stars", "integer", False),
        ("body", "text", True), ("written_at", "timestamptz", False),
    ], key=["id"], cap=10_000)
