"""The initial load's progress as read back from the metadata store (migration 0010):
the replicat's load still running, its tables' progress, the load's lock, and
`load_in_progress`, the lines INFO REPLICAT shows for it. load/progress.py writes these
rows (and reads the chunks a load resumes with); `trailbound load` reads the rest back
through here, as INFO does, and replicat never imports the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from trailbound.grouplock import is_held
from trailbound.metadata import MetadataStore


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


def running(store: MetadataStore, replicat: str, mode: str | None = None) -> dict | None:
    """The replicat's load still marked running (the newest), or None."""
    with store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.load_run WHERE upper(replicat) = upper(%s) AND state = 'running'"
                    " AND (%s::text IS NULL OR mode = %s) ORDER BY load_id DESC LIMIT 1", (replicat, mode, mode))
        return cur.fetchone()


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


def load_in_progress(store: MetadataStore, replicat: str) -> list[str]:
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
