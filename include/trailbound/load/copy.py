"""One key-range chunk copied from the source to the target, inside a Spark task.

Each task opens its own two connections: the source streams
`COPY (SELECT columns FROM table WHERE key in range ORDER BY key) TO STDOUT` into a pipe,
the target reads the pipe with `COPY ... FROM STDIN`. The rows never pass through the
Spark driver, and no JDBC driver is needed. Both sessions use the same settings
(TimeZone UTC, DateStyle ISO, IntervalStyle postgres, bytea_output hex,
extra_float_digits 3), so every value's text form reads back as the same value.

At a snapshot (`snapshot`): the source transaction imports the exported snapshot; the
target transaction deletes the range, copies it, commits. Run twice, the range is
replaced, never doubled.

Between watermarks (`window_id`): a low watermark is committed in the source, the
chunk is read and copied into its own staging table in the target (created and filled
in one transaction), and only then the high watermark is committed. Replicat applies
the staged rows when it reaches that high watermark (replicat/windows.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

import psycopg2
from psycopg2 import sql

from trailbound.keyranges import range_condition
from trailbound.replicat.windows import WATERMARK, staging_table

SESSION = ("-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=postgres -c bytea_output=hex "
           "-c extra_float_digits=3")


@dataclass(frozen=True)
class ChunkTask:
    source_table: str                  # schema.name at the source
    chunk_no: int
    source: tuple[str, str]
    target: tuple[str, str]
    columns: tuple[str, ...]           # the source's columns (defs.json order), copied by name
    key: tuple[str, ...]
    lo: dict | None
    hi: dict | None
    snapshot: str | None = None        # an exported snapshot's name (mode snapshot)
    window_id: str | None = None       # the watermark window (mode watermark)


@dataclass(frozen=True)
class ChunkDone:
    source_table: str
    chunk_no: int
    rows: int
    window_id: str | None
    seconds: float


def connect(dsn: str, what: str):
    try:
        return psycopg2.connect(dsn, options=SESSION, application_name=f"trailbound load ({what})")
    except psycopg2.Error as exc:
        # the driver's text may quote the DSN: say which side, not how it was reached
        raise RuntimeError(f"cannot connect to the {what}: {' '.join(str(exc).split())}") from None


def _columns(columns) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, columns))


def _pipe(source_cur, copy_out: str, target_cur, copy_in: str) -> int:
    """Stream COPY TO STDOUT into COPY FROM STDIN through an OS pipe; the rows copied."""
    read_end, write_end = os.pipe()
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write_end, "wb") as out:
                source_cur.copy_expert(copy_out, out)
        except BaseException as exc:  # handed to the consumer's thread, which raises it
            failed.append(exc)

    producer = threading.Thread(target=produce, name="load-copy-out", daemon=True)
    producer.start()
    try:
        with os.fdopen(read_end, "rb") as source:
            target_cur.copy_expert(copy_in, source)
    finally:
        producer.join()
    if failed:
        # The target saw an early end of data; the caller rolls its transaction back.
        raise failed[0]
    return target_cur.rowcount


def _select(task: ChunkTask, cur) -> str:
    table = sql.Identifier(*task.source)
    condition, params = range_condition(table, task.key, task.lo, task.hi)
    query = sql.SQL("COPY (SELECT {} FROM {} WHERE {} ORDER BY {}) TO STDOUT").format(
        _columns(task.columns), table, condition, _columns(task.key))
    return cur.mogrify(query, params).decode()


def _settle(cur, patience: float = 2.0) -> None:
    """Before the chunk is read: wait until every transaction that committed before the
    low watermark is visible.

    A transaction's commit record goes into the WAL (its place in commit order) before
    the transaction leaves the server's list of running ones (when snapshots start to
    see it). One that committed just before the low watermark may, on a busy server,
    still be invisible to the chunk's snapshot: the chunk would hold its old row, and the
    log would not count its change as inside the window. Such a transaction is already
    marked committed in the commit log while a snapshot still sees it running: wait for
    those (they end in moments). One still in progress in the commit log wrote no commit
    record before the check; it is waited for briefly too (it may be writing it now),
    then taken to commit after the low watermark, inside the window."""
    cur.execute("SELECT coalesce(array_agg(x::text), '{}') FROM pg_snapshot_xip(pg_current_snapshot()) x")
    xids = cur.fetchone()[0]
    began = time.monotonic()
    while xids:
        cur.execute("SELECT x::text, pg_xact_status(x) FROM unnest(%s::xid8[]) x"
                    " WHERE NOT pg_visible_in_snapshot(x, pg_current_snapshot())", (xids,))
        states = cur.fetchall()
        patient = time.monotonic() - began < patience
        xids = [x for x, status in states if status == "committed" or (status == "in progress" and patient)]
        if xids:
            time.sleep(0.005)


def copy_chunk(task: ChunkTask, source_dsn: str, target_dsn: str) -> ChunkDone:
    began = time.perf_counter()
    source = connect(source_dsn, "source")
    target = connect(target_dsn, "target")
    try:
        if task.window_id:
            rows = _between_watermarks(task, source, target)
        else:
            rows = _at_snapshot(task, source, target)
    finally:
        source.close()
        target.close()
    return ChunkDone(task.source_table, task.chunk_no, rows, task.window_id, time.perf_counter() - began)


def _at_snapshot(task: ChunkTask, source, target) -> int:
    source.set_session(isolation_level="REPEATABLE READ", readonly=True)
    target_table = sql.Identifier(*task.target)
    with source.cursor() as src, target.cursor() as tgt:
        src.execute("SET TRANSACTION SNAPSHOT %s", (task.snapshot,))
        condition, params = range_condition(target_table, task.key, task.lo, task.hi)
        tgt.execute(sql.SQL("DELETE FROM {} WHERE {}").format(target_table, condition), params)
        rows = _copy_committed(task, src, target, tgt, target_table)
        source.rollback()
    return rows


def _copy_committed(task: ChunkTask, src, target, tgt, into: sql.Composable) -> int:
    """The chunk's rows piped from the source into `into` and committed on the target
    (rolled back there on any failure, a kill included); how many rows."""
    copy_in = sql.SQL("COPY {} ({}) FROM STDIN").format(into, _columns(task.columns)).as_string(tgt)
    try:
        rows = _pipe(src, _select(task, src), tgt, copy_in)
    except BaseException:
        target.rollback()
        raise
    target.commit()
    return rows


_LOW_WATERMARK = sql.SQL("INSERT INTO {} (window_id, source_table, mark, lo, hi) "
                         "VALUES (%s, %s, 'low', %s, %s)").format(WATERMARK.ident)
_HIGH_WATERMARK = sql.SQL("UPDATE {} SET mark = 'high', written_at = now() WHERE window_id = %s").format(WATERMARK.ident)


def _between_watermarks(task: ChunkTask, source, target) -> int:
    source.autocommit = True
    bounds = {"lo": json.dumps(task.lo) if task.lo else None, "hi": json.dumps(task.hi) if task.hi else None}
    staging = staging_table(task.window_id)
    with source.cursor() as src, target.cursor() as tgt:
        src.execute(_LOW_WATERMARK, (task.window_id, task.source_table, bounds["lo"], bounds["hi"]))
        _settle(src)
        tgt.execute(sql.SQL("CREATE TABLE {} (LIKE {})").format(staging, sql.Identifier(*task.target)))
        rows = _copy_committed(task, src, target, tgt, staging)  # durable before the high watermark names them
        src.execute(_HIGH_WATERMARK, (task.window_id,))
    return rows
