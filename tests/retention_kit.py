"""Helpers for archive-log retention tests: hour-scale archives (one SCN per second, one
segment per thread per hour: scn 3600*h is hour h, sequence h+1 covers hour h), a
configuration with several captures and a retention policy, and views of the catalog.

Copied and adapted from tests/test_bounded_recovery.py's helpers (kept separate so the
two suites can change independently)."""

from __future__ import annotations

import shutil
from pathlib import Path

from capture_kit import at, ins, new_archive, rec
from trailbound.capture.run import run_extract

HOUR = 3600


def hours(h: float) -> int:
    return int(h * HOUR)


def hourly_archive(tmp_path: Path, *, total_hours: int, long_from: int, commit_hour: int | None = None):
    """Each hour h: a short transaction S<h> commits (key 100000+h). A long transaction
    LONG starts at hour `long_from` + 30 minutes, adds one row (key 1000+h) every hour
    and commits in `commit_hour` (or never). Thread 2 idles with empty segments."""
    archive = new_archive(tmp_path)
    for h in range(total_hours):
        base = hours(h)
        records = [ins(base + 10, f"S{h}", 100_000 + h), rec(base + 20, f"S{h}", "COMMIT")]
        if long_from <= h and (commit_hour is None or h < commit_hour):
            records.append(ins(base + 1800, "LONG", 1000 + h))
        if h == commit_hour:
            records.append(rec(base + 1900, "LONG", "COMMIT"))
        archive.segment(1, records, hours(h + 1))
        archive.segment(2, [], hours(h + 1))
    return archive


def expected_transactions(*, total_hours: int, long_from: int, commit_hour: int) -> list[tuple[str, list[int]]]:
    """What the trail must hold, written from the archive's definition above (not from
    capture): every S<h> in hour order, and LONG, whole, at its commit in `commit_hour`
    (after S<commit_hour>, whose COMMIT has the lower SCN)."""
    out = []
    for h in range(total_hours):
        out.append((f"S{h}", [100_000 + h]))
        if h == commit_hour:
            out.append(("LONG", [1000 + k for k in range(long_from, commit_hour)]))
    return out


def write_config(tmp_path: Path, *, extracts: dict[str, str] | None = None, retention: str = "",
                 filename: str = "trailbound.yaml") -> Path:
    """EXT1 (and others: name -> extra br option lines) reading source SRC, hourly runs,
    a 1-hour BR interval. `retention` is the body of the retention section."""
    extracts = extracts if extracts is not None else {"EXT1": ""}
    text = f"home: {tmp_path}\nsources:\n  SRC:\n    altarchivelogdest: archive\nextracts:\n"
    for name, br in extracts.items():
        text += (f"  {name}:\n    source: SRC\n    exttrail: dirdat/{name.lower()[:2]}{name[-1]}\n"
                 f"    table: ['shop.*']\n    interval: 1h\n"
                 f"    br:\n      brdir: brfiles\n      brinterval: 1h\n{br}"
                 f"    warnlongtrans:\n      duration: 3h\n      checkinterval: 1h\n")
    if retention:
        text += f"retention:\n{retention}"
    path = tmp_path / filename
    path.write_text(text)
    return path


def run(spark, store, config, group: str = "EXT1", until_hour: float | None = None, **kwargs):
    return run_extract(spark, store, config, group, until=None if until_hour is None else at(hours(until_hour)),
                       **kwargs)


def catalog_rows(store) -> list[dict]:
    with store.transaction() as cur:
        cur.execute("SELECT thread, sequence, state, purge_reason, purge_scn, purge_run_id, backed_up_count,"
                    " restored_at FROM trailbound.archive_segment ORDER BY thread, sequence")
        return cur.fetchall()


def purged(store) -> list[tuple[int, int]]:
    """(thread, sequence) of every purged segment."""
    return [(r["thread"], r["sequence"]) for r in catalog_rows(store) if r["state"] == "purged"]


def registration(store, group: str = "EXT1") -> dict | None:
    with store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.capture_registration WHERE group_name = %s", (group,))
        return cur.fetchone()


def files_on_disk(archive_root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(archive_root.iterdir()) if p.is_file()}


def back_up(archive_root: Path, backup: Path) -> None:
    """What an RMAN backup is here: a copy of every segment file."""
    shutil.copytree(archive_root, backup)


def restore(backup: Path, archive_root: Path, names: list[str]) -> None:
    for name in names:
        shutil.copy2(backup / name, archive_root / name)


def segment_files(thread: int, sequence: int) -> list[str]:
    stem = f"arch_{thread}_{sequence:09d}"
    return [f"{stem}.parquet", f"{stem}.json"]
