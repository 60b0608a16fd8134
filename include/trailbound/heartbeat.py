"""The heartbeat: end-to-end lag measured by a row that travels the whole pipeline, as
GoldenGate's ADD HEARTBEATTABLE does (docs/heartbeat.md).

A source writes a row of its heartbeat table, `<schema>.trailbound_heartbeat` (source,
seq, written_at), as it would any change: the live PostgreSQL source before each pull
reads the slot, the simulator every `heartbeat_seconds` of log time. The row reaches the
archive, the trail, the remote trail and replicat like any change, and each stage's
moment of passing it on is a stamp:

    written_at   the source wrote it (the source's clock; the row's own column)
    archived_at  the archive's writer took it (added to the row's image by the miner or
                 the simulator: the one stamp that travels inside the record)
    captured_at  the capture run that wrote it to a trail file committed that file
                 (trail_file.created_at of the capture's trail)
    pumped_at    the pump that shipped that file committed the remote file (trail_file of
                 the remote trail; none when replicat reads the capture's own trail)
    applied_at   replicat wrote it in the target transaction that applies it, with the
                 checkpoint row

Capture and pump stamp nothing into the records: a trail stays a function of the archive
(a re-run writes the same files), and their commit times are in the metadata store
already. Each hop's lag is the difference of two consecutive stamps; the end-to-end lag
is applied_at - written_at. Stamps come from several clocks (the source's, the miner's,
the metadata store's, replicat's): a hop between two hosts includes their clock skew.

Capture and pump always keep heartbeat records whatever their TABLE selection
(`selection`); replicat never applies them as a user table (whatever its MAP) but writes
them into its heartbeat tables (replicat/heartbeat.py). This module holds the names, the
stamps and the metadata store's copy that `lag`, INFO ALL, the metrics and the console
read (migration 0015). It imports only foundations.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from psycopg2 import sql

from trailbound.tables import python_regex

TABLE = "trailbound_heartbeat"            # the heartbeat table's name, in any schema
DEFAULT_SCHEMA = "trailbound"            # where `add heartbeattable` creates it
HOPS = ("archive", "capture", "pump", "replicat")
STAMPS = ("written_at", "archived_at", "captured_at", "pumped_at", "applied_at")
_SUFFIX = "." + TABLE


def is_heartbeat(table: str | None) -> bool:
    """Whether `schema.table` names a heartbeat table."""
    return table is not None and table.endswith(_SUFFIX) and table.index(".") == len(table) - len(_SUFFIX)


def selection(patterns: list[str]) -> re.Pattern:
    """The TABLE patterns as capture and pump match them: the heartbeat table always with
    them (a selection never has to name it)."""
    return python_regex([*patterns, "*" + _SUFFIX])


def parse_time(text: str | None) -> datetime | None:
    """A stamp as the image holds it (timestamptz text, `+00` or `+00:00`), aware UTC."""
    if text is None:
        return None
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)


def time_text(moment: datetime) -> str:
    """A stamp as PostgreSQL's timestamptz input reads it."""
    return moment.astimezone(UTC).isoformat()


def archived(image: str, at: datetime) -> str:
    """A heartbeat row's image with the archive's stamp added (what the archive holds)."""
    row = json.loads(image)
    row["archived_at"] = time_text(at)
    return json.dumps(row, ensure_ascii=False, separators=(", ", ": "))


@dataclass(frozen=True)
class Beat:
    """One heartbeat as replicat applied it: the source's row and every stamp."""

    group: str                       # the replicat that applied it
    source: str                      # the source (its row's key)
    seq: int
    written_at: datetime
    archived_at: datetime | None
    captured_at: datetime | None
    pumped_at: datetime | None
    applied_at: datetime | None
    csn: str

    @classmethod
    def from_image(cls, group: str, image: str, csn: str) -> "Beat":
        """A heartbeat row's image as the archive holds it; ValueError, TypeError or
        KeyError when it is not one."""
        row = json.loads(image)
        if not isinstance(row.get("source"), str) or row.get("written_at") is None:
            raise ValueError("source must be text and written_at set")
        return cls(group, row["source"], int(row["seq"]), parse_time(row["written_at"]),
                   parse_time(row.get("archived_at")), None, None, None, csn)

    def stamped(self, **stamps: datetime | None) -> "Beat":
        return replace(self, **stamps)

    def lags(self) -> dict[str, float | None]:
        """Seconds per hop (None: a stamp is missing: no pump, say) and `total`."""
        def between(a: datetime | None, b: datetime | None) -> float | None:
            return None if a is None or b is None else (b - a).total_seconds()

        before_replicat = self.pumped_at or self.captured_at
        return {"archive": between(self.written_at, self.archived_at),
                "capture": between(self.archived_at, self.captured_at),
                "pump": between(self.captured_at, self.pumped_at),
                "replicat": between(before_replicat, self.applied_at),
                "total": between(self.written_at, self.applied_at)}

    def as_json(self) -> dict:
        return {"group": self.group, "source": self.source, "seq": self.seq, "csn": self.csn,
                **{name: None if getattr(self, name) is None else time_text(getattr(self, name)) for name in STAMPS},
                "lag_seconds": self.lags()}


# ---------------------------------------------------------------- the metadata store's copy

_COLUMNS = ("group_name", "source", "seq", *STAMPS, "csn")


def values(beat: Beat) -> tuple:
    return (beat.group, beat.source, beat.seq, *(getattr(beat, name) for name in STAMPS), beat.csn)


def record(cur, beats: list[Beat]) -> None:
    """The metadata store's copy of heartbeats replicat committed to the target: the
    latest per (replicat, source) and the history (idempotent: a beat recorded twice
    stays one row)."""
    for beat in beats:
        cur.execute(sql.SQL(UPSERT_LATEST).format(table=sql.Identifier("trailbound", "heartbeat")), values(beat))
        cur.execute(sql.SQL(INSERT_HISTORY).format(table=sql.Identifier("trailbound", "heartbeat_history")),
                    values(beat))


def from_row(row: dict) -> Beat:
    """A beat as the heartbeat tables hold it (the target's or the metadata store's)."""
    return Beat(row["group_name"], row["source"], row["seq"], *(row[name] for name in STAMPS), row["csn"])


def latest(cur, group: str | None = None) -> list[Beat]:
    """The last heartbeat each replicat applied, per source (of `group` only, if given)."""
    cur.execute("SELECT * FROM trailbound.heartbeat WHERE %(group)s::text IS NULL OR group_name = %(group)s"
                " ORDER BY group_name, source", {"group": group})
    return [from_row(row) for row in cur.fetchall()]


def history(cur, group: str | None = None, since: datetime | None = None, limit: int = 500,
            source: str | None = None) -> list[Beat]:
    """Heartbeats applied, oldest first: the last `limit` (of `group`, of `source`, since
    `since`). The beats one target transaction applied share its applied_at: seq orders them."""
    cur.execute("SELECT * FROM (SELECT * FROM trailbound.heartbeat_history"
                " WHERE (%(group)s::text IS NULL OR group_name = %(group)s)"
                " AND (%(source)s::text IS NULL OR source = %(source)s)"
                " AND (%(since)s::timestamptz IS NULL OR applied_at >= %(since)s)"
                " ORDER BY applied_at DESC NULLS LAST, seq DESC LIMIT %(limit)s) h ORDER BY applied_at, seq",
                {"group": group, "since": since, "limit": limit, "source": source})
    return [from_row(row) for row in cur.fetchall()]


def snapshot(cur, now: datetime, limit: int = 200) -> dict:
    """The heartbeats as JSON-ready data (the console's `/trailbound/api/heartbeat`):
    `latest`, each replicat's last beat per source with its lags and `age_seconds`, and
    `history`, "GROUP/SOURCE" -> its last `limit` beats, oldest first."""
    beats = latest(cur)
    found = {"as_of": time_text(now), "hops": list(HOPS), "latest": [], "history": {}}
    for beat in beats:
        age = (now - beat.applied_at).total_seconds() if beat.applied_at else None
        found["latest"].append(beat.as_json() | {"age_seconds": age})
        found["history"][f"{beat.group}/{beat.source}"] = [
            b.as_json() for b in history(cur, beat.group, limit=limit, source=beat.source)]
    return found


def describe(beat: Beat, now: datetime) -> str:
    """One line: end-to-end lag and each hop's share, and how old the heartbeat is."""
    lags = beat.lags()
    hops = ", ".join(f"{hop} {_seconds(lags[hop])}" for hop in HOPS if lags[hop] is not None)
    age = f"; applied {_seconds((now - beat.applied_at).total_seconds())} ago" if beat.applied_at else ""
    return (f"Heartbeat from {beat.source} (seq {beat.seq}, written {time_text(beat.written_at)[:19]}Z): "
            f"end-to-end lag {_seconds(lags['total'])} ({hops}){age}")


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} s"


# The same statements write the target's tables (replicat/heartbeat.py) and the metadata
# store's copy: {table} is a composed identifier (psycopg2.sql).
UPSERT_LATEST = (
    "INSERT INTO {table} AS h (" + ", ".join(_COLUMNS) + ") VALUES (" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
    " ON CONFLICT (group_name, source) DO UPDATE SET " + ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS[2:])
    + " WHERE (h.written_at, h.seq) < (EXCLUDED.written_at, EXCLUDED.seq)")
INSERT_HISTORY = (
    "INSERT INTO {table} (" + ", ".join(_COLUMNS) + ") VALUES (" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
    " ON CONFLICT (group_name, source, seq, written_at) DO NOTHING")
