"""What a compare asks either side: a range's digest, a hash per row of a range, rows by
key, and (on the source) the WAL position right after a read. And the one Spark task per key range.

Both sides run in sessions with the same settings, so that equal values have equal
text whatever the servers' defaults: a row is compared as the text of its columns. The
digest of a range is order-independent (the count and the sum of 60 bits of each row
text's md5), so no side sorts anything to answer it. Reads are plain SELECTs in
autocommit: no lock beyond the one every reader takes, no long snapshot.

A row's image on one side is the tuple of its columns' texts (None: no row with that
key); for a table without a key it is how many identical rows that side holds.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg2
from psycopg2 import sql

from trailbound.errors import TrailboundError
from trailbound.keyranges import key_row, range_condition
from trailbound.metadata import connection_error
from trailbound.positions import Scn

if TYPE_CHECKING:  # planned by the driver (compare/run.py), which alone reads the source's key ranges
    from trailbound.keyranges import KeyRange

# The text forms both sides must agree on (the archive's forms, docs/live-postgres.md).
SESSION = {"TimeZone": "UTC", "DateStyle": "ISO", "IntervalStyle": "postgres", "bytea_output": "hex",
           "extra_float_digits": "3", "default_transaction_read_only": "on"}


@dataclass(frozen=True)
class TableSpec:
    """One compared table, as both sides see it (picklable: Spark ships it to tasks)."""

    source: str                       # schema.table at the source (defs.json's name)
    source_rel: tuple[str, str]
    target_rel: tuple[str, str]
    columns: tuple[str, ...]          # the source's columns, compared in this order
    key: tuple[str, ...]              # keyless: empty
    keyless: bool

    @property
    def target(self) -> str:
        return ".".join(self.target_rel)

    def key_text(self, texts: tuple) -> tuple:
        """A row's key in text form (keyless: the whole row)."""
        if self.keyless:
            return texts
        return tuple(texts[self.columns.index(k)] for k in self.key)


@dataclass
class RowDifference:
    """A key whose images differ. `lsn` is the source's WAL position just after
    `source` was read: once the replicat has applied past it, the target must show it."""

    table: str
    key: tuple                        # key text (keyless: the row's texts)
    key_values: tuple | None          # the key as read, for querying it again (keyless: None)
    source: tuple | int | None
    target: tuple | int | None
    lsn: Scn
    # The source row's version when `source` was read (its xmin: every committed UPDATE
    # gives the row a new one), None when unknown (keyless, missing): a row that changed
    # and changed back shows the same image, not the same version.
    source_version: str | None = None

    def kind(self) -> str:
        if isinstance(self.source, int) or isinstance(self.target, int):
            return "missing" if (self.source or 0) > (self.target or 0) else "extra"
        if self.target is None:
            return "missing"
        if self.source is None:
            return "extra"
        return "different"

    def count(self) -> int:
        """Rows this difference stands for (a keyless table's duplicates count each)."""
        if isinstance(self.source, int) or isinstance(self.target, int):
            return abs((self.source or 0) - (self.target or 0))
        return 1

    def columns(self, names: tuple[str, ...]) -> list[str]:
        if self.kind() != "different":
            return []
        return [n for n, a, b in zip(names, self.source, self.target) if a != b]


@dataclass(frozen=True)
class RangeTask:
    table: TableSpec
    index: int                        # the range's place in the table's key order
    bounds: KeyRange                  # text-form bounds, read by each side's own row type
    source_dsn: str
    target_dsn: str

    def __repr__(self) -> str:  # never show a DSN (it may hold a password) in a Spark error
        return f"RangeTask({self.table.source} range {self.index})"


@dataclass
class RangeResult:
    table: str
    index: int
    source_rows: int
    target_rows: int
    same: bool
    rows_compared: int
    differences: list[RowDifference] = field(default_factory=list)


def connect(dsn: str, what: str):
    options = " ".join(f"-c {name}={value}" for name, value in SESSION.items())
    try:
        connection = psycopg2.connect(dsn, options=options, application_name="trailbound compare",
                                      client_encoding="UTF8")
    except psycopg2.Error as exc:
        raise connection_error(what, dsn, exc) from None
    connection.autocommit = True
    return connection


def _texts(columns: tuple[str, ...]) -> sql.Composable:
    return sql.SQL("ARRAY[{}]").format(sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c))
                                                         for c in columns))


def _where(table: TableSpec, relation: tuple[str, str], bounds: KeyRange) -> tuple[sql.Composed, list]:
    """The range's condition on one side: its bounds become values by that side's row type."""
    return range_condition(sql.Identifier(*relation), table.key, bounds.lo, bounds.hi)


def digest(connection, table: TableSpec, relation: tuple[str, str], bounds: KeyRange) -> tuple[int, str]:
    """(rows, order-independent digest) of a range."""
    where, args = _where(table, relation, bounds)
    row = sql.SQL("ROW({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in table.columns))
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT count(*), coalesce(sum(('x' || left(md5({}::text), 15))::bit(60)::bigint), 0)"
                            "::text FROM {} WHERE {}").format(row, sql.Identifier(*relation), where), args)
        count, total = cur.fetchone()
    return count, total


def current_lsn(connection) -> Scn:
    """The source's WAL position now, as the archive's SCN (the same integer): every
    commit a read before this saw lies below it."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return Scn(int(cur.fetchone()[0]))


def _picklable(value):
    return bytes(value) if isinstance(value, memoryview) else value


def rows(connection, table: TableSpec, relation: tuple[str, str], bounds: KeyRange | None = None,
         keys: list[tuple] | None = None, *, versions: bool = False) -> dict[tuple, tuple]:
    """key text -> (key values, image) for a range's rows, or for the rows of `keys`
    (key values); with `versions` (a keyed table on PostgreSQL), (key values, image, the
    row's xmin). Keyless: row texts -> (None, how many)."""
    texts = _texts(table.columns)
    if versions and not table.keyless:
        texts = sql.SQL("{}, xmin::text").format(texts)
    with connection.cursor() as cur:
        if table.keyless:
            cur.execute(sql.SQL("SELECT {} FROM {}").format(texts, sql.Identifier(*relation)))
            counted = Counter(tuple(r[0]) for r in cur.fetchall())
            return {row: (None, n) for row, n in counted.items()}
        names = sql.SQL(", ").join(sql.Identifier(k) for k in table.key)
        if keys is not None:
            if not keys:
                return {}
            cur.execute(sql.SQL("SELECT {}, {} FROM {} WHERE {} IN %s").format(
                names, texts, sql.Identifier(*relation), key_row(table.key)), (tuple(keys),))
        else:
            where, args = _where(table, relation, bounds)
            cur.execute(sql.SQL("SELECT {}, {} FROM {} WHERE {}").format(names, texts, sql.Identifier(*relation),
                                                                       where), args)
        width = len(table.key)
        found = {}
        for record in cur.fetchall():
            image = tuple(record[width])
            found[table.key_text(image)] = (tuple(_picklable(v) for v in record[:width]), image,
                                            *record[width + 1:])
        return found


def row_hashes(connection, table: TableSpec, relation: tuple[str, str], bounds: KeyRange) -> dict[tuple, tuple]:
    """key text -> (key values, md5 of the row's text) for a range of a keyed table: what
    a range that differs is compared by first, so that only differing rows travel whole."""
    row = sql.SQL("ROW({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in table.columns))
    names = sql.SQL(", ").join(sql.Identifier(k) for k in table.key)
    texts = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in table.key)
    where, args = _where(table, relation, bounds)
    width = len(table.key)
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT md5({}::text), {}, {} FROM {} WHERE {}").format(
            row, names, texts, sql.Identifier(*relation), where), args)
        return {tuple(r[1 + width:]): (tuple(_picklable(v) for v in r[1:1 + width]), r[0]) for r in cur.fetchall()}


def differences(table: TableSpec, source: dict, target: dict, lsn: Scn) -> list[RowDifference]:
    """Keys whose images differ, from two `rows` answers."""
    found = []
    for key in sorted(source.keys() | target.keys(), key=lambda k: tuple("" if v is None else v for v in k)):
        (values, a), (values_b, b) = source.get(key, (None, None)), target.get(key, (None, None))
        if a != b:
            found.append(RowDifference(table.source, key, values or values_b, a, b, lsn))
    return found


def check_range(task: RangeTask) -> RangeResult:
    """One Spark task: both sides' digests of the range, read at the same time; only
    when they differ, both sides' row hashes by key, then whole rows for the keys whose
    hashes differ (a table without a key: both sides' rows, counted)."""
    table, bounds = task.table, task.bounds
    source = connect(task.source_dsn, f"the source (comparing {table.source})")
    try:
        target = connect(task.target_dsn, f"the target (comparing {table.target})")
    except TrailboundError:
        source.close()
        raise
    try:
        with ThreadPoolExecutor(2) as pool:
            on_source = pool.submit(digest, source, table, table.source_rel, bounds)
            on_target = pool.submit(digest, target, table, table.target_rel, bounds)
            (source_rows, source_digest), (target_rows, target_digest) = on_source.result(), on_target.result()
            if (source_rows, source_digest) == (target_rows, target_digest):
                return RangeResult(table.source, task.index, source_rows, target_rows, True, source_rows)

            if table.keyless:  # no key to ask by: both sides' rows, counted
                on_source = pool.submit(rows, source, table, table.source_rel, bounds)
                on_target = pool.submit(rows, target, table, table.target_rel, bounds)
                source_found, target_found = on_source.result(), on_target.result()
                lsn = current_lsn(source)
                compared = (sum(n for _, n in source_found.values()) + sum(n for _, n in target_found.values())
                            - sum(min(n, target_found[k][1]) for k, (_, n) in source_found.items()
                                  if k in target_found))  # rows on both sides count once
                return RangeResult(table.source, task.index, source_rows, target_rows, False, compared,
                                   differences(table, source_found, target_found, lsn))
            # A row hash per key first; whole rows only for the keys whose hashes differ.
            on_source = pool.submit(row_hashes, source, table, table.source_rel, bounds)
            on_target = pool.submit(row_hashes, target, table, table.target_rel, bounds)
            source_hashes, target_hashes = on_source.result(), on_target.result()
            differing = [k for k in source_hashes.keys() | target_hashes.keys()
                         if (source_hashes.get(k) or (None, None))[1] != (target_hashes.get(k) or (None, None))[1]]
            compared = len(source_hashes.keys() | target_hashes.keys())
            found = {}
            for start in range(0, len(differing), 5000):
                batch = differing[start:start + 5000]
                values = [(source_hashes.get(k) or target_hashes.get(k))[0] for k in batch]
                on_source = pool.submit(rows, source, table, table.source_rel, keys=values, versions=True)
                on_target = pool.submit(rows, target, table, table.target_rel, keys=values)
                source_part, target_part = on_source.result(), on_target.result()
                lsn = current_lsn(source)
                found.update({k: (source_part.get(k), target_part.get(k), lsn) for k in batch})
    finally:
        source.close()
        target.close()
    result = []
    for key in sorted(found, key=lambda k: tuple("" if v is None else v for v in k)):
        (values_a, a, version), (values_b, b) = (found[key][0] or (None, None, None)), (found[key][1] or (None, None))
        if a != b:  # a row may have changed back between the two reads
            result.append(RowDifference(table.source, key, values_a or values_b, a, b, found[key][2], version))
    return RangeResult(table.source, task.index, source_rows, target_rows, False, compared, result)

