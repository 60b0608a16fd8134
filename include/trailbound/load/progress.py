"""A load's progress in the metadata store (migration 0010), as the load writes it: the
load, its tables, its key-range chunks and which are done. A killed load resumes from
its chunks not done (`pending`). Reading the rest back (the load still running, its
tables' progress, its lock, `info replicat`'s lines) is replicat/loadinfo.py's, which
the load uses too: replicat reads these rows and never imports the load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from trailbound.metadata import MetadataStore


@dataclass(frozen=True)
class ChunkRow:
    source_table: str
    chunk_no: int
    lo: dict | None
    hi: dict | None


def start(store: MetadataStore, *, source: str, replicat: str, mode: str, pattern: str, chunk_rows: int,
          snapshot_lsn: str | None = None) -> int:
    with store.transaction() as cur:
        cur.execute("INSERT INTO trailbound.load_run (source, replicat, mode, table_pattern, chunk_rows, snapshot_lsn)"
                    " VALUES (%s, %s, %s, %s, %s, %s) RETURNING load_id",
                    (source, replicat, mode, pattern, chunk_rows, snapshot_lsn))
        return cur.fetchone()["load_id"]


def add_table(store: MetadataStore, load_id: int, source_table: str, target_table: str, key: list[str],
              estimated_rows: int, ranges: list) -> None:
    """The table and all its chunks, in one transaction: a load is planned whole or not at all."""
    with store.transaction() as cur:
        cur.execute("INSERT INTO trailbound.load_table (load_id, source_table, target_table, key_columns,"
                    " estimated_rows) VALUES (%s, %s, %s, %s, %s)",
                    (load_id, source_table, target_table, key, estimated_rows))
        cur.executemany("INSERT INTO trailbound.load_chunk (load_id, source_table, chunk_no, lo, hi)"
                        " VALUES (%s, %s, %s, %s, %s)",
                        [(load_id, source_table, number, json.dumps(r.lo) if r.lo else None,
                          json.dumps(r.hi) if r.hi else None) for number, r in enumerate(ranges)])


def pending(store: MetadataStore, load_id: int) -> list[ChunkRow]:
    with store.transaction() as cur:
        cur.execute("SELECT source_table, chunk_no, lo, hi FROM trailbound.load_chunk"
                    " WHERE load_id = %s AND state = 'pending' ORDER BY source_table, chunk_no", (load_id,))
        return [ChunkRow(r["source_table"], r["chunk_no"], r["lo"], r["hi"]) for r in cur.fetchall()]


def mark_done(store: MetadataStore, load_id: int, done: list[tuple[str, int, int, str | None]]) -> None:
    """(source_table, chunk_no, rows, window_id) per chunk finished."""
    with store.transaction() as cur:
        cur.executemany("UPDATE trailbound.load_chunk SET state = 'done', rows_copied = %s, window_id = %s,"
                        " done_at = now() WHERE load_id = %s AND source_table = %s AND chunk_no = %s",
                        [(rows, window, load_id, table, number) for table, number, rows, window in done])


def finish(store: MetadataStore, load_id: int, state: str = "done") -> None:
    with store.transaction() as cur:
        cur.execute("UPDATE trailbound.load_run SET state = %s, ended_at = now() WHERE load_id = %s",
                    (state, load_id))
