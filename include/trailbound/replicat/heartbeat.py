"""Replicat's side of the heartbeat (trailbound/heartbeat.py, docs/heartbeat.md): the
heartbeat records of the trail written into the target's heartbeat tables, in the
target transaction that applies them, with the checkpoint row; then into the metadata
store's copy with the file checkpoint.

The target's tables live in the checkpoint table's schema: `heartbeat` (the last beat
per replicat and source), `heartbeat_history` and the view `heartbeat_lag` (GoldenGate's
GG_LAG), created by the first heartbeat a replicat applies. A heartbeat record is never
applied as a user table, whatever the MAP says (replicat/target.py leaves it out).

The run's hooks: `follow_target` (the run's start: what the target holds and the
metadata store's copy lacks), `take` (the prepare thread: a chunk's heartbeat records),
`statements` (composing a target transaction's checkpoint row, in trail order: the beats
between the committed position and the transaction's end) and `committed` (the file
checkpoint: the beats it covers go to the metadata store). Writing a beat twice leaves one row, so a
group applied again after a rollback, or composed beside another on a parallel lane,
never duplicates one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow.compute as pc
from psycopg2 import sql

from trailbound import heartbeat
from trailbound.errors import TrailError
from trailbound.positions import Csn, TrailPosition

_DDL = """
CREATE TABLE IF NOT EXISTS {latest} (
    group_name text NOT NULL, source text NOT NULL, seq bigint NOT NULL, written_at timestamptz NOT NULL,
    archived_at timestamptz, captured_at timestamptz, pumped_at timestamptz, applied_at timestamptz,
    csn text NOT NULL, PRIMARY KEY (group_name, source));
CREATE TABLE IF NOT EXISTS {history} (LIKE {latest}, PRIMARY KEY (group_name, source, seq, written_at));
CREATE OR REPLACE VIEW {view} AS
SELECT group_name, source, seq, written_at, applied_at,
       extract(epoch FROM archived_at - written_at) AS archive_lag,
       extract(epoch FROM captured_at - archived_at) AS capture_lag,
       extract(epoch FROM pumped_at - captured_at) AS pump_lag,
       extract(epoch FROM applied_at - coalesce(pumped_at, captured_at)) AS replicat_lag,
       extract(epoch FROM applied_at - written_at) AS incoming_lag,
       extract(epoch FROM now() - applied_at) AS age
  FROM {latest}"""

# captured_at and pumped_at of a trail file: its own commit, and when it is a pump's
# remote file, the commit of the capture's file it was shipped from.
_FILE_STAMPS = """
SELECT f.created_at AS committed_at, g.group_name AS pump, src.created_at AS source_committed_at
  FROM trailbound.trail_file f
  LEFT JOIN trailbound.pump_group g ON g.rmttrail = f.trail
  LEFT JOIN trailbound.pump_file p ON p.group_name = g.group_name AND p.remote_seqno = f.seqno
  LEFT JOIN trailbound.trail_file src ON src.trail = g.exttrail AND src.seqno = p.source_seqno
 WHERE f.trail = %s AND f.seqno = %s
"""


@dataclass
class _Pending:
    position: TrailPosition   # the heartbeat record's own (seqno, rba)
    beat: heartbeat.Beat


class Heartbeats:
    """A run's heartbeats, from the trail to the target and the metadata store."""

    def __init__(self, group: str, trail: str, schema: str):
        self.group, self.trail = group, trail
        self.tables = {name: sql.Identifier(schema, name) for name in ("heartbeat", "heartbeat_history",
                                                                          "heartbeat_lag")}
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()   # `take` runs in the prepare thread
        self._files: dict[int, tuple[datetime | None, datetime | None]] = {}
        self._created = False

    def take(self, chunk) -> None:
        """The chunk's heartbeat records, in trail order (their images decoded only when
        the chunk holds one)."""
        tables = chunk.light.column("table")
        mask = pc.fill_null(pc.ends_with(tables, "." + heartbeat.TABLE), False)
        if not pc.any(mask).as_py():
            return
        rows = chunk.records.filter(mask).select(
            ["seqno", "rba", "table", "op", "after", "csn", "csn_thread", "csn_sequence", "csn_rba"]).to_pylist()
        found = []
        for row in rows:
            if not heartbeat.is_heartbeat(row["table"]) or row["after"] is None:
                continue  # (a DELETE or TRUNCATE of the heartbeat table: nothing to record)
            try:
                beat = heartbeat.Beat.from_image(self.group, row["after"], str(Csn.from_row(row)))
            except (ValueError, TypeError, KeyError) as exc:  # json.JSONDecodeError is a ValueError
                raise TrailError(chunk.path_of(row["seqno"]), f"a {row['table']} row is not a heartbeat (source, "
                                 f"seq, written_at, archived_at): {type(exc).__name__}: {exc}",
                                 rba=row["rba"]) from None
            found.append(_Pending(TrailPosition(row["seqno"], row["rba"]), beat))
        with self._lock:
            self._pending.extend(found)

    def statements(self, cur, store, since: TrailPosition, end: TrailPosition) -> bytes:
        """The statements writing the beats at or after `since` and before `end` into the
        target (its tables created with the first), stamped applied now; b"" if none."""
        with self._lock:
            beats = [p for p in self._pending if since <= p.position < end]
        if not beats:
            return b""
        now = datetime.now(UTC)
        parts = []
        if not self._created:
            parts.append(cur.mogrify(sql.SQL(_DDL).format(latest=self.tables["heartbeat"],
                                                          history=self.tables["heartbeat_history"],
                                                          view=self.tables["heartbeat_lag"])))
        for pending in beats:
            captured, pumped = self._file_stamps(store, pending.position.seqno)
            # Stamped once: composed again (a replay after a rollback, or beside its own
            # group on a parallel lane) it carries the same values, so the target and the
            # metadata copy agree whichever transaction commits it.
            pending.beat = pending.beat.stamped(captured_at=captured, pumped_at=pumped,
                                                applied_at=pending.beat.applied_at or now)
            values = heartbeat.values(pending.beat)
            parts.append(cur.mogrify(sql.SQL(heartbeat.UPSERT_LATEST).format(table=self.tables["heartbeat"]), values))
            parts.append(cur.mogrify(sql.SQL(heartbeat.INSERT_HISTORY).format(table=self.tables["heartbeat_history"]),
                                     values))
        return b"; ".join(parts)

    def committed(self, cur, position: TrailPosition) -> None:
        """Inside the metadata transaction of a file checkpoint at `position`: the beats
        it covers, into the metadata store's copy."""
        with self._lock:
            done = [p for p in self._pending if p.position < position and p.beat.applied_at is not None]
            self._pending = [p for p in self._pending if not (p.position < position and p.beat.applied_at)]
        if done:
            self._created = True  # a target transaction holding them committed: the tables exist
        heartbeat.record(cur, [p.beat for p in done])

    @staticmethod
    def follow_target(store, cur, group: str, schema: str) -> int:
        """At a run's start (`cur` on the target): the heartbeats the target holds and the
        metadata store's copy does not (a run killed between a target commit and the file
        checkpoint after it), copied, as the file checkpoint is repaired from the
        checkpoint table. How many (beats of one target transaction share their applied_at:
        those at the copy's last are copied again, which leaves one row each)."""
        history = sql.Identifier(schema, "heartbeat_history")
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (history.as_string(cur),))
        if not cur.fetchone()[0]:
            return 0
        with store.transaction() as meta:
            meta.execute("SELECT max(applied_at) AS last FROM trailbound.heartbeat_history WHERE group_name = %s",
                         (group,))
            last = meta.fetchone()["last"]
        cur.execute(sql.SQL("SELECT * FROM {} WHERE group_name = %s AND (%s::timestamptz IS NULL OR applied_at >= %s)"
                            " ORDER BY applied_at").format(history), (group, last, last))
        names = [column.name for column in cur.description]
        missing = [heartbeat.from_row(dict(zip(names, row))) for row in cur.fetchall()]
        if missing:
            with store.transaction() as meta:
                heartbeat.record(meta, missing)
        return len(missing)

    def _file_stamps(self, store, seqno: int) -> tuple[datetime | None, datetime | None]:
        if seqno not in self._files:
            with store.transaction() as cur:
                cur.execute(_FILE_STAMPS, (self.trail, seqno))
                row = cur.fetchone()
            if row is None:
                self._files[seqno] = (None, None)
            elif row["pump"] is None:
                self._files[seqno] = (row["committed_at"], None)
            else:
                self._files[seqno] = (row["source_committed_at"], row["committed_at"])
        return self._files[seqno]
