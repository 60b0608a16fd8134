"""A load's progress in the metadata store (migration 0010): the load, its tables, its
key-range chunks and which are done. A killed load resumes from its chunks not done;
`info replicat` and the command's own output read the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from trailbound.grouplock import is_held
from trailbound.metadata import MetadataStore


@dataclass(frozen=True)
class ChunkRow:
    source_table: str
    chunk_no: int
    lo: dict | None
    hi: dict | None


@dataclass(frozen=True)
class TableProgress:
    source_table: str
    target_table: str
    chunks: int
    chunks_done: int
    rows_done: int
    estimated_rows: int

    def line(self, rate: float | None = None) -> str:
        estimate = max(self.estimated_rows, self.rows_done)
        share = f" ({100 * self.rows_done / estimate:.0f}%)" if estimate else ""
        text = (f"{self.source_table} -> {self.target_table}: {self.chunks_done}/{self.chunks} chunks, "
                f"{self.rows_done} of about {estimate} rows{share}")
        if rate and self.chunks_done < self.chunks:
            text += f", about {max(estimate - self.rows_done, 0) / rate:.0f} s left at {rate:.0f} rows/s"
        return text


def load_lock_key(replicat: str) -> str:
    return f"load:{replicat.upper()}"


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


def running(store: MetadataStore, replicat: str, mode: str | None = None) -> dict | None:
    """The replicat's load still marked running (the newest), or None."""
    with store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.load_run WHERE upper(replicat) = upper(%s) AND state = 'running'"
                    " AND (%s::text IS NULL OR mode = %s) ORDER BY load_id DESC LIMIT 1", (replicat, mode, mode))
        return cur.fetchone()


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


def tables(store: MetadataStore, load_id: int) -> list[TableProgress]:
    with store.transaction() as cur:
        cur.execute("SELECT t.source_table, t.target_table, t.estimated_rows, count(c.*) AS chunks,"
                    " count(c.*) FILTER (WHERE c.state = 'done') AS chunks_done,"
                    " coalesce(sum(c.rows_copied), 0)::bigint AS rows_done"
                    " FROM trailbound.load_table t LEFT JOIN trailbound.load_chunk c USING (load_id, source_table)"
                    " WHERE t.load_id = %s GROUP BY t.source_table, t.target_table, t.estimated_rows"
                    " ORDER BY t.source_table", (load_id,))
        return [TableProgress(r["source_table"], r["target_table"], r["chunks"], r["chunks_done"], r["rows_done"],
                              r["estimated_rows"]) for r in cur.fetchall()]


def describe_for_replicat(store: MetadataStore, replicat: str) -> list[str]:
    """INFO REPLICAT's lines about a load in progress for the group (none: no line)."""
    load = running(store, replicat)
    if load is None:
        return []
    alive = is_held(store, load_lock_key(replicat))
    since = (datetime.now(timezone.utc) - load["started_at"]).total_seconds()
    how = (f"at the snapshot of {load['snapshot_lsn']}" if load["mode"] == "snapshot" else "between watermarks")
    lines = [f"Load in progress     load {load['load_id']} {how}, tables {load['table_pattern']}, started "
             f"{since:.0f} s ago" + ("" if alive else "; no process holds it (killed?): run `trailbound load` "
                                                       "again to resume")]
    lines += [f"                     {t.line()}" for t in tables(store, load["load_id"])]
    return lines
