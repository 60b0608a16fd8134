"""The trail catalog in the metadata store: which trail files are committed, and who reads them.

`trailbound.trail_file` lists every committed file of every trail (a file past its
writer's committed checkpoint is not listed, so no reader ever sees it);
`trailbound.trail_reader` holds each reader's position on a trail (a pump or a
replicat), which trail purge keeps files for. Every statement on those two tables lives
here; each function runs inside the caller's metadata transaction (`cur`), so a file is
registered, or a reader moved, in the same commit as its writer's or reader's checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from psycopg2.extras import execute_values

from trailbound.errors import TrailboundError
from trailbound.ggsci import utc
from trailbound.positions import Csn, TrailPosition


# ---------------------------------------------------------------- committed files

def register(cur, trail: str, files: Iterable, written_by: str) -> None:
    """List committed trail files (`format.TrailFileInfo`s; a remote file's path is its
    location text). A re-run after a crash rewrites the same seqnos: the committed rows win."""
    rows = [(trail, f.seqno, str(f.path), f.records, f.bytes, f.sha256, str(f.first_csn), str(f.last_csn),
             f.log_bsn.value, written_by) for f in files]
    if rows:
        execute_values(cur, "INSERT INTO trailbound.trail_file (trail, seqno, path, records, bytes, sha256,"
                            " first_csn, last_csn, log_bsn, written_by) VALUES %s", rows)


def committed_files(cur, trail: str, from_seqno: int = 0) -> list[dict]:
    """The trail's committed files from `from_seqno` on (purged ones included, marked)."""
    cur.execute("SELECT * FROM trailbound.trail_file WHERE trail = %s AND seqno >= %s ORDER BY seqno",
                (trail, from_seqno))
    return cur.fetchall()


@dataclass(frozen=True)
class Extent:
    first: int | None    # None: no committed file
    last: int | None
    writer: str | None


def extent(cur, trail: str) -> Extent:
    """The first and last committed seqno of a trail, and (one of) its writers."""
    cur.execute("SELECT min(seqno) AS first, max(seqno) AS last, min(written_by) AS writer"
                " FROM trailbound.trail_file WHERE trail = %s", (trail,))
    row = cur.fetchone()
    return Extent(row["first"], row["last"], row["writer"])


def file_records(cur, trail: str, seqno: int) -> int | None:
    """How many records committed file `seqno` holds (None: not committed)."""
    cur.execute("SELECT records FROM trailbound.trail_file WHERE trail = %s AND seqno = %s", (trail, seqno))
    row = cur.fetchone()
    return None if row is None else row["records"]


def check_following(trail: str, rows: list[dict], first_seqno: int, *, reader: str, hint: str) -> None:
    """The pending-files check: committed files (`committed_files` rows) that a reader
    (`reader`, e.g. "pump PMP1") reads in order from `first_seqno` must follow on and
    still exist. `hint` ends the error about a purged file: what the user can do."""
    for expected, row in enumerate(rows, start=first_seqno):
        if row["seqno"] != expected:
            raise TrailboundError(f"trail {trail}: file seqno {expected} is missing from the committed trail "
                                  f"(the next listed is {row['seqno']}); {reader} cannot skip it")
        if row["purged_at"] is not None:
            raise TrailboundError(f"{row['path']}: trail file seqno {row['seqno']} was purged at "
                                  f"{utc(row['purged_at'])}, but {reader} still needs it; {hint}")


def position_after(cur, trail: str, bound: Csn) -> TrailPosition:
    """The start of the first committed file holding a transaction above `bound`; past
    the end of the trail when none does yet."""
    cur.execute("SELECT seqno, records, last_csn FROM trailbound.trail_file WHERE trail = %s ORDER BY seqno", (trail,))
    rows = cur.fetchall()
    for row in rows:
        if Csn.parse(row["last_csn"]) > bound:
            return TrailPosition(row["seqno"], 0)
    return TrailPosition(rows[-1]["seqno"], rows[-1]["records"]) if rows else TrailPosition(0, 0)


def trails_with_files(cur) -> list[str]:
    """Every trail with committed files not purged yet."""
    cur.execute("SELECT DISTINCT trail FROM trailbound.trail_file WHERE purged_at IS NULL ORDER BY trail")
    return [row["trail"] for row in cur.fetchall()]


def unpurged_files(cur, trail: str) -> list[dict]:
    cur.execute("SELECT seqno, path, records, created_at FROM trailbound.trail_file"
                " WHERE trail = %s AND purged_at IS NULL ORDER BY seqno", (trail,))
    return cur.fetchall()


def mark_purged(cur, trail: str, seqno: int) -> None:
    """A purged file's row stays, marked: a reader that still wanted it gets a clear error."""
    cur.execute("UPDATE trailbound.trail_file SET purged_at = now() WHERE trail = %s AND seqno = %s", (trail, seqno))


def purged_file(cur, paths: Iterable[str]) -> dict | None:
    """The catalog's row of a purged trail file at one of `paths` (trail, seqno, records,
    purged_at) with the purge's reason; None when no purged file was there."""
    cur.execute("SELECT f.trail, f.seqno, f.records, f.purged_at, p.reason FROM trailbound.trail_file f"
                " LEFT JOIN LATERAL (SELECT reason FROM trailbound.trail_purge p WHERE p.trail = f.trail"
                "   AND p.seqno = f.seqno ORDER BY purge_id DESC LIMIT 1) p ON true"
                " WHERE f.path = ANY(%s) AND f.purged_at IS NOT NULL ORDER BY f.purged_at DESC LIMIT 1",
                (list(paths),))
    return cur.fetchone()


# ---------------------------------------------------------------- readers

def set_reader_position(cur, trail: str, kind: str, group: str, position: TrailPosition) -> None:
    """Register a reader of `trail` (kind "pump" or "replicat"), or move it."""
    cur.execute("INSERT INTO trailbound.trail_reader (trail, reader_kind, group_name, seqno, rba)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (trail, reader_kind, group_name)"
                " DO UPDATE SET seqno = EXCLUDED.seqno, rba = EXCLUDED.rba, updated_at = now()",
                (trail, kind, group, position.seqno, position.rba))


def drop_reader(cur, kind: str, group: str, trail: str | None = None) -> None:
    """Forget a reader (of `trail`, or of every trail): it no longer holds files against purge."""
    if trail is None:
        cur.execute("DELETE FROM trailbound.trail_reader WHERE reader_kind = %s AND group_name = %s", (kind, group))
    else:
        cur.execute("DELETE FROM trailbound.trail_reader WHERE trail = %s AND reader_kind = %s AND group_name = %s",
                    (trail, kind, group))


def reader_positions(cur, trail: str) -> list[dict]:
    """Every registered reader of a trail: reader_kind, group_name, seqno, rba."""
    cur.execute("SELECT reader_kind, group_name, seqno, rba FROM trailbound.trail_reader WHERE trail = %s"
                " ORDER BY reader_kind, group_name", (trail,))
    return cur.fetchall()


def lock_readers(cur) -> None:
    """Readers may neither register nor move until the caller's transaction ends (purge)."""
    cur.execute("LOCK TABLE trailbound.trail_reader IN SHARE MODE")
