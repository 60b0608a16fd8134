"""The horizon: the archive is complete below the lowest next_scn over the threads that
can still write. An idle thread advances it with empty segments; a closed thread stops
counting after its last segment; `until` keeps to segments archived by then."""

from datetime import datetime, timedelta, timezone

import pytest

from trailbound.archive.catalog import ArchiveCatalog, compute_horizon
from trailbound.archive.writer import write_defs, write_segment
from trailbound.positions import Scn

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def commit_pair(scn: int, xid: str) -> list[dict]:
    return [{"scn": scn, "ts": at(0), "xid": xid, "op": "INSERT", "table": "s.t", "after": {"id": scn}},
            {"scn": scn + 1, "ts": at(0), "xid": xid, "op": "COMMIT"}]


@pytest.fixture
def three_threads(tmp_path):
    """Thread 1 busy to scn 600 (archived by minute 60); thread 2 idle, writing empty
    segments, to scn 450 (minute 45); thread 3 closed at scn 300 (minute 30)."""
    root = tmp_path / "archive"
    write_defs(root, [{"name": "s.t", "columns": [{"name": "id", "type": "bigint"}], "key": ["id"]}])
    for sequence, (first, nxt, minute) in enumerate([(100, 200, 15), (200, 400, 30), (400, 600, 60)], start=1):
        write_segment(root, thread=1, sequence=sequence, records=commit_pair(first, f"A{sequence}"),
                      first_scn=Scn(first), next_scn=Scn(nxt), first_time=at(minute - 15), next_time=at(minute),
                      fmt="parquet")
    for sequence, (first, nxt, minute) in enumerate([(100, 250, 15), (250, 350, 30), (350, 450, 45)], start=1):
        write_segment(root, thread=2, sequence=sequence, records=[], first_scn=Scn(first), next_scn=Scn(nxt),
                      first_time=at(minute - 15), next_time=at(minute), fmt="jsonl")
    write_segment(root, thread=3, sequence=1, records=commit_pair(120, "C1"), first_scn=Scn(100), next_scn=Scn(180),
                  first_time=at(0), next_time=at(20), fmt="jsonl")
    write_segment(root, thread=3, sequence=2, records=[], first_scn=Scn(180), next_scn=Scn(300), first_time=at(20),
                  next_time=at(30), fmt="parquet", closed=True)
    return root


@pytest.mark.spark
@pytest.mark.pg
def test_horizon_over_three_threads_with_an_idle_and_a_closed_one(store, spark, three_threads):
    catalog = ArchiveCatalog(store, "SRC")
    catalog.scan(three_threads, spark)
    horizon = catalog.horizon()
    # The idle thread 2 limits; the closed thread 3 (next_scn 300) no longer does.
    assert horizon.scn == Scn(450) and horizon.limiting_thread == 2
    assert horizon.threads == {1: (Scn(600), False), 2: (Scn(450), False), 3: (Scn(300), True)}


@pytest.mark.spark
@pytest.mark.pg
def test_horizon_restricted_to_segments_archived_by_a_time(store, spark, three_threads):
    catalog = ArchiveCatalog(store, "SRC")
    catalog.scan(three_threads, spark)
    # By minute 25 thread 3 had not closed yet: its first segment (next_scn 180) limits.
    assert (catalog.horizon(at(25)).scn, catalog.horizon(at(25)).limiting_thread) == (Scn(180), 3)
    # By minute 30 it had closed: thread 1 (400) and thread 2 (350) remain.
    assert (catalog.horizon(at(30)).scn, catalog.horizon(at(30)).limiting_thread) == (Scn(350), 2)
    assert catalog.horizon(at(5)) is None  # nothing archived yet


def test_when_every_thread_is_closed_the_whole_archive_is_complete(three_threads):
    from trailbound.archive.segments import discover

    segments = [s for s in discover(three_threads) if s.thread == 3]
    horizon = compute_horizon(segments)
    assert horizon.scn == Scn(300) and horizon.limiting_thread is None
