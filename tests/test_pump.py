"""Pump (trail shipping) and trail purge: PASSTHRU and filtered shipping, checkpoints,
crashes at every named point, damaged files named, remote URIs through Spark's Hadoop
filesystem, purge by readers' checkpoints, and capture -> pump -> replicat over a
simulated source with purges between the runs."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pump_kit import (SourceTrail, changes, committed_files, load, pump_state, read_trail, records_of, set_reader,
                      write_config)
from trailbound import cli
from trailbound import config as configuration
from trailbound.trail import format as trail
from trailbound import files as trailfs
from trailbound.crash import CRASH_ENV
from trailbound.errors import ConfigError, TrailboundError
from trailbound.pump.filter import filter_parts, filter_records
from trailbound.pump.run import CRASH_POINTS, run_pump
from trailbound.positions import TrailPosition
from trailbound.trail.purge import Reader, decide, purge_trails

pytestmark = [pytest.mark.pg]

PASSTHRU = {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt"}}


def _setup(tmp_path, store, pumps=None, **kwargs):
    config = load(tmp_path, pumps or PASSTHRU, **kwargs)
    source = SourceTrail(store, Path(config.trail_location("dirdat/lt")))
    return config, source


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def _reader_rows(store, trail_key):
    with store.transaction() as cur:
        cur.execute("SELECT reader_kind, group_name, seqno, rba FROM trailbound.trail_reader WHERE trail = %s"
                    " ORDER BY reader_kind, group_name", (trail_key,))
        return [tuple(r.values()) for r in cur.fetchall()]


# ---------------------------------------------------------------- the table filter (pure)

@pytest.mark.parametrize("pattern", ["shop.*", "shop.ord?rs"])
def test_a_table_filter_keeps_whole_transactions_and_rewrites_their_boundaries(pattern):
    rows, _ = records_of([
        ("A", [("shop.orders", 1), ("hr.salaries", 2), ("shop.orders", 3)]),
        ("B", [("hr.salaries", 4), ("hr.salaries", 5)]),                       # nothing left: disappears
        ("C", [("hr.salaries", 6), ("shop.orders", 7), ("hr.salaries", 8)]),    # one left: WHOLE
        ("D", [("shop.orders", 9), ("shop.orders", 10), ("shop.orders", 11)]),
        ("E", [("shopXorders", 12)]),                                           # the dot is literal
    ], 100)
    kept = filter_records(pa.Table.from_pylist(rows, trail.SCHEMA), [pattern])
    records = kept.to_pylist()
    assert changes(records) == [("A", trail.BEGIN, "shop.orders", 1), ("A", trail.END, "shop.orders", 3),
                                ("C", trail.WHOLE, "shop.orders", 7), ("D", trail.BEGIN, "shop.orders", 9),
                                ("D", trail.MIDDLE, "shop.orders", 10), ("D", trail.END, "shop.orders", 11)]
    assert [r["rba"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert [r["src_rba"] for r in records] == [107, 109, 128, 137, 138, 139], "the records themselves are untouched"


def test_a_table_filter_fed_a_part_at_a_time_gives_what_it_gives_the_whole_file():
    rows, _ = records_of([
        ("A", [("shop.orders", 1), ("hr.salaries", 2), ("shop.orders", 3)]),
        ("B", [("hr.salaries", 4), ("hr.salaries", 5)]),
        ("C", [("hr.salaries", 6), ("shop.orders", 7), ("hr.salaries", 8)]),
        ("D", [("shop.orders", 9), ("shop.orders", 10), ("shop.orders", 11)]),
    ], 100)
    table = pa.Table.from_pylist(rows, trail.SCHEMA)
    whole = filter_records(table, ["shop.*"]).to_pylist()
    assert len(whole) == 6
    for first in range(len(table) + 1):  # every way to cut the file into three parts, empty ones too
        for second in range(first, len(table) + 1):
            parts = [table.slice(0, first), table.slice(first, second - first), table.slice(second)]
            streamed = [record for part in filter_parts(parts, ["shop.*"]) for record in part.to_pylist()]
            assert streamed == whole, f"cut at {first} and {second}"


def test_a_filtering_pump_ships_a_file_of_many_row_groups_a_row_group_at_a_time(tmp_path, store):
    config, source = _setup(tmp_path, store, FILTERED)
    big = [("shop.orders" if key % 3 else "hr.salaries", key) for key in range(9_000)]
    info = source.add_file([("A", big), ("B", [("hr.salaries", 9_001)]), ("C", [("shop.orders", 9_002)])])
    assert pq.ParquetFile(info.path).num_row_groups > 1

    run_pump(None, store, config, "PMP1")
    shipped = committed_files(store, str(tmp_path / "remote" / "rt"))
    assert [(r["seqno"], r["records"]) for r in shipped] == [(1, 6_001)]
    assert pq.ParquetFile(shipped[0]["path"]).num_row_groups > 1
    records = read_trail(store, str(tmp_path / "remote" / "rt"))
    kept = [key for key in range(9_000) if key % 3]
    assert changes(records) == ([("A", trail.BEGIN, "shop.orders", kept[0])]
                                + [("A", trail.MIDDLE, "shop.orders", key) for key in kept[1:-1]]
                                + [("A", trail.END, "shop.orders", kept[-1]), ("C", trail.WHOLE, "shop.orders", 9_002)])
    assert [r["rba"] for r in records] == list(range(6_001))


# ---------------------------------------------------------------- shipping

def test_passthru_ships_committed_files_byte_for_byte_and_checkpoints_each(tmp_path, store):
    config, source = _setup(tmp_path, store)
    f1 = source.add_file([("A", [("shop.orders", 1), ("hr.salaries", 2)])])
    f2 = source.add_file([("B", [("shop.orders", 3)]), ("C", [("shop.orders", 4)])])
    f3 = source.add_file([("D", [("shop.orders", 5)])], commit=False)   # on disk, not committed: invisible

    result = run_pump(None, store, config, "PMP1")
    remote_key = str(tmp_path / "remote" / "rt")
    assert config.trail_location("remote/rt") == remote_key
    rows = committed_files(store, remote_key)
    assert [(r["seqno"], r["records"], r["sha256"], r["written_by"]) for r in rows] == [
        (1, 2, f1.sha256, "PMP1"), (2, 2, f2.sha256, "PMP1")]
    assert (tmp_path / "remote" / "rt000000001").read_bytes() == f1.path.read_bytes()
    assert _names(tmp_path / "remote") == ["rt000000001", "rt000000002"]
    state = pump_state(store)
    assert (state.read, state.write, str(state.last_csn)) == (TrailPosition(2, 2), TrailPosition(2, 2), "130@1:1:130")
    assert _reader_rows(store, str(source.prefix)) == [("pump", "PMP1", 2, 2)]
    assert result.records_written == 4 and result.files_written == [1, 2]

    source.commit(f3)
    assert run_pump(None, store, config, "PMP1").files_written == [3]
    assert "nothing new" in run_pump(None, store, config, "PMP1").describe()
    assert changes(read_trail(store, remote_key)) == changes(read_trail(store, str(source.prefix)))
    with store.transaction() as cur:
        cur.execute("SELECT source_seqno, remote_seqno FROM trailbound.pump_file ORDER BY 1")
        assert [tuple(r.values()) for r in cur.fetchall()] == [(1, 1), (2, 2), (3, 3)]
        cur.execute("SELECT files_read, files_written FROM trailbound.pump_run ORDER BY run_id")
        assert [tuple(r.values()) for r in cur.fetchall()] == [(2, 2), (1, 1)]


def test_a_filtering_pump_drops_tables_transactions_and_empty_files(tmp_path, store):
    remote = f"file://{tmp_path}/remote/ft"
    config, source = _setup(tmp_path, store, {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": remote,
                                                        "table": ["shop.*"]}})
    source.add_file([("A", [("shop.orders", 1), ("hr.salaries", 2), ("shop.orders", 3)]),
                     ("B", [("hr.salaries", 4)])])
    source.add_file([("C", [("hr.salaries", 5)])])                            # every record filtered
    source.add_file([("D", [("hr.salaries", 6), ("shop.orders", 7)]), ("E", [("shop.orders", 8)])])

    run_pump(None, store, config, "PMP1")
    remote_key = str(tmp_path / "remote" / "ft")
    assert config.trail_location(remote) == remote_key, "a file: URI is keyed as its path"
    records = read_trail(store, remote_key)
    assert changes(records) == [("A", trail.BEGIN, "shop.orders", 1), ("A", trail.END, "shop.orders", 3),
                                ("D", trail.WHOLE, "shop.orders", 7), ("E", trail.WHOLE, "shop.orders", 8)]
    assert [(r["seqno"], r["rba"]) for r in records] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert _names(tmp_path / "remote") == ["ft000000001", "ft000000002"]
    meta = trail.read_metadata(tmp_path / "remote" / "ft000000002")
    assert (meta["group"], meta["trail"], meta["seqno"], meta["records"]) == ("PMP1", "ft", 2, 2)
    state = pump_state(store)
    assert (state.read, state.write, str(state.last_csn)) == (TrailPosition(3, 3), TrailPosition(2, 2), "150@1:1:150")
    with store.transaction() as cur:
        cur.execute("SELECT source_seqno, remote_seqno, remote_records FROM trailbound.pump_file ORDER BY 1")
        assert [tuple(r.values()) for r in cur.fetchall()] == [(1, 1, 2), (2, None, 0), (3, 2, 2)]
    assert not (source.prefix.parent / ".pump-PMP1").exists(), "the staging directory is cleaned up"


FILTERED = {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt", "table": ["shop.*"]}}


@pytest.mark.parametrize("mode", ["passthru", "filtered"])
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_any_point_then_a_rerun_ships_every_transaction_once(tmp_path, store, point, mode):
    pumps = PASSTHRU if mode == "passthru" else FILTERED
    config_path = write_config(tmp_path, pumps)
    config = configuration.load(config_path)
    source = SourceTrail(store, Path(config.trail_location("dirdat/lt")))
    # File 1 is larger than one copy chunk, so a crash at mid_copy leaves a partial file.
    big = base64.b64encode(os.urandom(2_000_000)).decode()
    source.add_file([("A", [("shop.orders", 1, big), ("hr.salaries", 2)]), ("B", [("shop.orders", 3)])])
    source.add_file([("C", [("shop.orders", 4)])])
    source.add_file([("D", [("hr.salaries", 5), ("shop.orders", 6)])])
    remote_dir, remote_key = tmp_path / "remote", str(tmp_path / "remote" / "rt")

    env = {**os.environ, CRASH_ENV: point, "TRAILBOUND_METADATA_DSN": store.connection.dsn}
    crashed = subprocess.run([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "pump", "run",
                              "PMP1"], env=env, capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    state = pump_state(store)
    committed = [r["seqno"] for r in committed_files(store, remote_key)]
    partial = None
    if point in ("mid_copy", "before_rename"):
        assert _names(remote_dir) == [".rt000000001.tmp"] and committed == []
        partial = (remote_dir / ".rt000000001.tmp").stat().st_size
    elif point == "after_copy":
        assert _names(remote_dir) == ["rt000000001"] and committed == []
    else:
        assert _names(remote_dir) == ["rt000000001"] and committed == [1]
    assert state.read == (TrailPosition(1, 3) if point == "after_file_commit" else TrailPosition(0, 0))
    assert _reader_rows(store, str(source.prefix)) == [("pump", "PMP1", state.read.seqno, state.read.rba)]

    run_pump(None, store, config, "PMP1")
    shipped = changes(read_trail(store, remote_key))
    expected = [("A", trail.WHOLE if mode == "filtered" else trail.BEGIN, "shop.orders", 1)]
    expected += [] if mode == "filtered" else [("A", trail.END, "hr.salaries", 2)]
    expected += [("B", trail.WHOLE, "shop.orders", 3), ("C", trail.WHOLE, "shop.orders", 4)]
    expected += [("D", trail.WHOLE, "shop.orders", 6)] if mode == "filtered" else [
        ("D", trail.BEGIN, "hr.salaries", 5), ("D", trail.END, "shop.orders", 6)]
    assert shipped == expected
    assert _names(remote_dir) == ["rt000000001", "rt000000002", "rt000000003"]
    assert pump_state(store).read == TrailPosition(3, 2)
    if partial is not None:  # mid_copy left part of the file, before_rename all of it
        assert (partial < (remote_dir / "rt000000001").stat().st_size) == (point == "mid_copy")


def test_a_damaged_file_stops_its_reader_with_the_files_name_and_nothing_after_it(tmp_path, store):
    config, source = _setup(tmp_path, store, {**PASSTHRU, "PMP2": {"exttrail": "remote/rt", "rmttrail": "far/rt"}})
    for n in range(3):
        source.add_file([(f"T{n}", [("shop.orders", n)])])
    run_pump(None, store, config, "PMP1")
    damaged = tmp_path / "remote" / "rt000000002"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))

    with pytest.raises(trail.TrailError) as error:           # a reader of the remote trail (as replicat reads)
        read_trail(store, str(tmp_path / "remote" / "rt"))
    assert error.value.path == str(damaged) and "does not match the recorded" in str(error.value)

    with pytest.raises(trail.TrailError) as error:           # a pump reading it
        run_pump(None, store, config, "PMP2")
    assert error.value.path == str(damaged)
    assert [r["seqno"] for r in committed_files(store, str(tmp_path / "far" / "rt"))] == [1]
    assert pump_state(store, "PMP2").read == TrailPosition(1, 1)
    assert _names(tmp_path / "far") == ["rt000000001"], "no copy of the damaged file, not even a temporary one"

    f4 = source.add_file([("T4", [("shop.orders", 4)])])      # the pump's own source, damaged before shipping
    f4.path.write_bytes(f4.path.read_bytes()[:-9] + b"garbage!!")
    with pytest.raises(trail.TrailError) as error:
        run_pump(None, store, config, "PMP1")
    assert error.value.path == str(f4.path) and "does not match the recorded" in str(error.value)
    assert pump_state(store).read == TrailPosition(3, 1)
    assert _names(tmp_path / "remote") == ["rt000000001", "rt000000002", "rt000000003"]


def test_the_copy_is_read_back_and_counted_before_the_pump_commits_it(tmp_path, store):
    """A copy whose bytes match but whose records are not what the catalog committed for
    the source file (here the catalog row says one record more): refused, naming the
    remote file, with no remote file, no temporary and no checkpoint left behind."""
    config, source = _setup(tmp_path, store)
    first = source.add_file([("A", [("shop.orders", 1)])])
    second = source.add_file([("B", [("shop.orders", 2), ("shop.orders", 3)])])
    with store.transaction() as cur:
        cur.execute("UPDATE trailbound.trail_file SET records = records + 1 WHERE path = %s", (str(second.path),))
    with pytest.raises(trail.TrailError) as error:
        run_pump(None, store, config, "PMP1")
    remote = tmp_path / "remote" / "rt000000002"
    assert error.value.path == str(remote)
    assert "pump PMP1 wrote 3 records" in str(error.value) and "this process reads 2 records" in str(error.value)
    assert "nothing was committed" in str(error.value) and "\n" not in str(error.value)
    assert _names(tmp_path / "remote") == ["rt000000001"], "the first file shipped, the second not even as a temporary"
    assert pump_state(store).read == TrailPosition(first.seqno, 1)
    assert [r["seqno"] for r in committed_files(store, str(tmp_path / "remote" / "rt"))] == [1]


@pytest.mark.spark
def test_a_remote_uri_goes_through_sparks_hadoop_filesystem(tmp_path, spark, store):
    mount, disk = f"tb{uuid.uuid4().hex[:10]}", tmp_path / "cluster"
    disk.mkdir()
    # viewfs:// is a Hadoop filesystem that is not the local one, mounted over a directory.
    spark._jsc.hadoopConfiguration().set(f"fs.viewfs.mounttable.{mount}.link./trails", disk.as_uri())
    pumps = {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": f"viewfs://{mount}/trails/rt"},
             "PMP2": {"exttrail": "dirdat/lt", "rmttrail": f"viewfs://{mount}/trails/ft", "table": ["hr.*"]}}
    config, source = _setup(tmp_path, store, pumps, purge={"minkeepfiles": 1})
    files = [source.add_file([(f"T{n}", [("shop.orders", n), ("hr.salaries", n)])]) for n in range(3)]
    with pytest.raises(TrailboundError, match="not a local path"):
        run_pump(None, store, config, "PMP1")

    (disk / "rt000000009").write_bytes(b"left by a run that died")       # past the write checkpoint
    (disk / ".rt000000001.tmp").write_bytes(b"partial")
    run_pump(spark, store, config, "PMP1")
    run_pump(spark, store, config, "PMP2")
    visible = [n for n in _names(disk) if not n.endswith(".crc")]
    assert visible == ["ft000000001", "ft000000002", "ft000000003", "rt000000001", "rt000000002", "rt000000003"]
    assert (disk / "rt000000002").read_bytes() == files[1].path.read_bytes()
    remote = f"viewfs://{mount}/trails/rt"
    assert [r["path"] for r in committed_files(store, remote)] == [f"{remote}{n:09d}" for n in (1, 2, 3)]
    assert changes(read_trail(store, remote, spark)) == changes(read_trail(store, str(source.prefix)))
    assert changes(read_trail(store, f"viewfs://{mount}/trails/ft", spark)) == [
        (f"T{n}", trail.WHOLE, "hr.salaries", n) for n in range(3)]

    set_reader(store, remote, "replicat", "REP1", 2, 1)   # inside file 2: only file 1 passed
    purge_trails(store, config, spark=spark)
    assert [n for n in _names(disk) if n.startswith("rt")] == ["rt000000002", "rt000000003"]
    assert [r["purged_at"] is not None for r in committed_files(store, remote)] == [True, False, False]


# ---------------------------------------------------------------- purge

def _purged(store, trail_key):
    return [r["seqno"] for r in committed_files(store, trail_key) if r["purged_at"] is not None]


def test_purge_deletes_exactly_the_files_every_reader_has_passed(tmp_path, store, capsys, monkeypatch):
    config_path = write_config(tmp_path, PASSTHRU, purge={"minkeephours": 0, "minkeepfiles": 1})
    config = configuration.load(config_path)
    source = SourceTrail(store, Path(config.trail_location("dirdat/lt")))
    lt = str(source.prefix)
    for n in range(5):
        source.add_file([(f"T{n}", [("shop.orders", 2 * n), ("shop.orders", 2 * n + 1)])])
    run_pump(None, store, config, "PMP1")                      # the pump has passed all five
    set_reader(store, lt, "replicat", "REP0", 3, 2)           # a replicat reading the local trail: past 1..3
    set_reader(store, lt, "replicat", "REP9", 2, 1)           # another, inside file 2
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)

    assert cli.main(["--config", str(config_path), "purge", "trails", "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "would purge seqno 1 " in shown and "seqno 2 " not in shown.split("kept")[0]
    assert "still needed by replicat REP9 at 2:1" in shown
    assert "no reader is registered" in shown                  # the remote trail: nobody reads it yet
    assert [n for n in _names(source.prefix.parent) if n.startswith("lt")][:5] == [f"lt00000000{n}" for n in range(1, 6)] and _purged(store, lt) == []

    assert cli.main(["--config", str(config_path), "purge", "trails"]) == 0
    assert "purged seqno 1 " in capsys.readouterr().out
    assert not (source.prefix.parent / "lt000000001").exists() and _purged(store, lt) == [1]
    with store.transaction() as cur:
        cur.execute("SELECT trail, seqno, path, reason, readers FROM trailbound.trail_purge")
        [logged] = cur.fetchall()
    assert (logged["trail"], logged["seqno"], logged["path"]) == (lt, 1, str(source.prefix) + "000000001")
    assert {"kind": "replicat", "group": "REP9", "seqno": 2, "rba": 1, "registered": True} in logged["readers"]
    assert "every reader has passed it" in logged["reason"]
    assert _purged(store, str(tmp_path / "remote" / "rt")) == []
    # logdump on the purged file says it was purged, when and why, not "Failed to open".
    assert cli.main(["--config", str(config_path), "logdump", str(source.prefix) + "000000001"]) == 1
    said = capsys.readouterr().err
    assert "purged at " in said and " UTC by the trail purge (every reader has passed it" in said, said
    assert "seqno 1 of trail" in said and "Errno" not in said and said.count("\n") == 1

    set_reader(store, lt, "replicat", "REP9", 4, 0)           # REP9 now in file 4, nothing of it read
    purge_trails(store, config)
    assert _purged(store, lt) == [1, 2, 3]                    # REP0 at 3:2 has passed 3 (2 records) too
    set_reader(store, lt, "replicat", "REP0", 5, 2)
    set_reader(store, lt, "replicat", "REP9", 5, 2)
    purge_trails(store, config)
    assert _purged(store, lt) == [1, 2, 3, 4], "minkeepfiles 1 keeps the newest file"
    assert [n for n in _names(source.prefix.parent) if n.startswith("lt")] == ["lt000000005"]
    assert len(committed_files(store, lt)) == 5, "purged files keep their rows"


def test_two_replicats_reading_one_trail_each_hold_what_they_need(tmp_path, store):
    config, source = _setup(tmp_path, store, purge={"minkeepfiles": 0})
    for n in range(6):
        source.add_file([(f"T{n}", [("shop.orders", n)])])
    run_pump(None, store, config, "PMP1")
    rt = str(tmp_path / "remote" / "rt")
    set_reader(store, rt, "replicat", "FAST", 0, 0)           # registered, never started: holds everything
    set_reader(store, rt, "replicat", "SLOW", 0, 0)
    purge_trails(store, config)
    assert _purged(store, rt) == []
    expected = changes(read_trail(store, rt))

    applied = {"FAST": [], "SLOW": []}
    position = {"FAST": TrailPosition(0, 0), "SLOW": TrailPosition(0, 0)}
    for step, (group, files) in enumerate([("FAST", 4), ("SLOW", 2), ("FAST", 2), ("SLOW", 3), ("SLOW", 1)]):
        # A replicat reads the committed files past its position, checked, then records it.
        todo = [r for r in committed_files(store, rt) if r["seqno"] > position[group].seqno][:files]
        for row in todo:
            applied[group] += changes(trail.read_file(row["path"], sha256=row["sha256"]).to_pylist())
            position[group] = TrailPosition(row["seqno"], row["records"])
        set_reader(store, rt, "replicat", group, position[group].seqno, position[group].rba)
        purge_trails(store, config)
        slowest = min(position.values()).seqno
        assert _purged(store, rt) == list(range(1, slowest + 1)), f"step {step}"
    assert applied["FAST"] == applied["SLOW"] == expected


def test_purge_rules_minkeephours_minkeepfiles_and_readers_not_started():
    now = datetime(2026, 11, 2, 12, tzinfo=timezone.utc)
    files = [{"seqno": n, "path": f"/t/lt{n:09d}", "records": 10, "created_at": now - timedelta(hours=h)}
             for n, h in ((1, 5), (2, 3), (3, 1), (4, 0))]
    done = [Reader("replicat", "REP1", TrailPosition(4, 10))]

    def purged(readers, **rules):
        return [v.seqno for v in decide(files, readers, now=now, **{"minkeephours": 0, "minkeepfiles": 0} | rules)
                if v.purge]

    assert purged(done) == [1, 2, 3, 4]
    assert purged(done, minkeephours=2) == [1, 2]
    assert purged(done, minkeepfiles=3) == [1]
    assert purged(done, minkeepfiles=9) == []
    assert purged(done + [Reader("pump", "PMP1", TrailPosition(0, 0))]) == [], "registered, never started"
    assert purged(done + [Reader("pump", "PMP2", TrailPosition(0, 0), registered=False)]) == []
    assert purged(done + [Reader("replicat", "REP2", TrailPosition(3, 9))]) == [1, 2]
    assert purged(done + [Reader("replicat", "REP2", TrailPosition(3, 10))]) == [1, 2, 3]
    assert purged([]) == [], "a trail nobody is registered to read keeps its files"


def test_a_configured_pump_not_added_yet_holds_its_trail(tmp_path, store):
    config, source = _setup(tmp_path, store, purge={"minkeepfiles": 0})
    for n in range(2):
        source.add_file([(f"T{n}", [("shop.orders", n)])])
    set_reader(store, str(source.prefix), "replicat", "REP1", 2, 1)
    result = purge_trails(store, config)
    assert _purged(store, str(source.prefix)) == []
    assert "pump PMP1 configured, not added yet" in result.describe()


# ---------------------------------------------------------------- commands, configuration

def test_add_info_and_delete_pump_and_a_pump_that_needs_a_purged_file(tmp_path, store, group_held_elsewhere, capsys,
                                                                     monkeypatch):
    config_path = write_config(tmp_path, PASSTHRU, purge={"minkeepfiles": 0})
    config = configuration.load(config_path)
    source = SourceTrail(store, Path(config.trail_location("dirdat/lt")))
    for n in range(3):
        source.add_file([(f"T{n}", [("shop.orders", n), ("shop.orders", 10 + n)])])
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    main = lambda *args: cli.main(["--config", str(config_path), *args])  # noqa: E731

    assert main("add", "pump", "PMP1", "--extseqno", "2") == 0
    assert _reader_rows(store, str(source.prefix)) == [("pump", "PMP1", 2, 0)]
    assert main("purge", "trails") == 0
    assert _purged(store, str(source.prefix)) == [1]
    assert main("pump", "run", "pmp1") == 0
    assert "wrote 2 transactions (4 records) to 2 file(s)" in capsys.readouterr().out
    assert main("info", "pump", "PMP1", "--showch", "3") == 0
    shown = capsys.readouterr().out
    for expected in ("Status STOPPED", "Read Checkpoint      Seqno 3, RBA 2", "Write Checkpoint     Seqno 2, RBA 2",
                     "(PASSTHRU)", "0 file(s) not shipped yet", "Checkpoint history: run", "Read: Seqno:RBA 3:2"):
        assert expected in shown, expected

    (tmp_path / "moved").mkdir()
    moved = write_config(tmp_path / "moved", {"PMP1": {"exttrail": str(source.prefix), "rmttrail": "elsewhere/rt"}})
    assert cli.main(["--config", str(moved), "pump", "run", "PMP1"]) == 1
    assert "was added reading trail" in capsys.readouterr().err, "a pump's trails cannot move under it"

    with group_held_elsewhere("pump", "PMP1"):
        assert main("pump", "run", "PMP1") == 1
        assert "held by a running pump" in capsys.readouterr().err
        assert main("info", "pump", "PMP1") == 0 and "Status RUNNING" in capsys.readouterr().out

    assert main("delete", "pump", "PMP1") == 0
    assert _reader_rows(store, str(source.prefix)) == []
    assert main("add", "pump", "PMP1") == 1
    assert "already holds committed files" in capsys.readouterr().err

    late = write_config(tmp_path, {"PMP2": {"exttrail": "dirdat/lt", "rmttrail": "late/rt"}})
    assert cli.main(["--config", str(late), "pump", "run", "PMP2"]) == 1
    error = capsys.readouterr().err
    assert f"{source.prefix}000000001: trail file seqno 1" in error and "was purged" in error and "--extseqno" in error


@pytest.mark.parametrize("pumps, message", [
    ({"EXT1": {"exttrail": "dirdat/lt", "rmttrail": "r/rt"}}, "pump and extract names must differ"),
    ({"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "r/rt", "table": ["orders"]}}, "must be schema.table"),
    ({"PMP1": {"exttrail": "dirdat/lt", "rmtrail": "r/rt"}}, "pumps.PMP1.rmtrail: unknown option"),
    ({"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "dirdat/lt"}}, "would write the trail it reads"),
    ({"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "r/"}}, "file-name prefix"),
])
def test_pump_configuration_errors_name_the_key(tmp_path, pumps, message):
    with pytest.raises(ConfigError, match=message):
        configuration.load(write_config(tmp_path, pumps))


def test_location_text():
    assert trailfs.split("s3a://bucket/dirdat/rt") == ("s3a://bucket/dirdat", "rt")
    assert trailfs.split("s3a://bucket/rt") == ("s3a://bucket/", "rt")
    assert trailfs.temporary_location("hdfs://nn:8020/d/rt000000003") == "hdfs://nn:8020/d/.rt000000003.tmp"
    assert trailfs.local_path("file:///var/x%20y/rt") == Path("/var/x y/rt")
    assert trailfs.is_local("var/dirdat/rt") and trailfs.is_local("file:/d/rt") and not trailfs.is_local("s3a://b/rt")
    assert trailfs.seqno_of("rt", "rt000000012") == 12 and trailfs.seqno_of("rt", "rtx000000012") is None


# ---------------------------------------------------------------- capture -> pump -> replicat

@pytest.mark.spark
@pytest.mark.long_running(45)
def test_extract_pump_replicat_over_a_simulated_source_reach_the_truth_with_purges_between(tmp_path, spark, store,
                                                                                             target_dsn):
    """Capture runs, two pumps (PASSTHRU and filtered) and trail purges between the runs.
    Replicat applies the PASSTHRU remote trail to PostgreSQL; the filtered one is applied
    by a deliberately simple model that reads it the way replicat does (committed files
    past its position, each checked against its recorded SHA-256, its position recorded
    in trail_reader). Both reach the simulator's truth (the filtered one for its tables
    only), and purge has removed every file but the newest of each trail read through."""
    import psycopg2

    from replay_kit import apply_change, canonical
    from replicat_kit import differences
    from trailbound.archive.segments import load_defs
    from trailbound.capture.run import run_extract
    from trailbound.replicat import target
    from trailbound.replicat.run import run_replicat
    from trailbound.sources.simulator import simulate

    summary = simulate(tmp_path / "archive", tmp_path / "truth.json", records=5_000, hours=8, seed=5)
    pumps = {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt"},
             "PMP2": {"exttrail": "dirdat/lt", "rmttrail": "remote/st", "table": ["shop.*"]}}
    config = load(tmp_path, pumps, purge={"minkeepfiles": 1}, megabytes=0.1,
                  replicats={"REP1": {"exttrail": "remote/rt", "source": "SRC"}})
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        target.create_tables(cur, load_defs(config.archive_dir("SRC")), config.replicat("REP1").map)
    truth = json.loads((tmp_path / "truth.json").read_text())
    keys = {name: table["key"] for name, table in truth["tables"].items()}
    columns = {name: table["columns"] for name, table in truth["tables"].items()}
    model, position = {name: {} for name in truth["tables"]}, TrailPosition(0, 0)
    st = config.trail_location("remote/st")
    set_reader(store, st, "replicat", "MODEL", 0, 0)

    for hour in (3, 6, None):
        run_extract(spark, store, config, "EXT1", until=summary.first_time + timedelta(hours=hour) if hour else None)
        run_pump(None, store, config, "PMP1")
        run_pump(None, store, config, "PMP2")
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
        for row in committed_files(store, st):
            if row["seqno"] > position.seqno:
                for record in trail.read_file(row["path"], sha256=row["sha256"]).to_pylist():
                    apply_change(model, keys, columns, record)
                position = TrailPosition(row["seqno"], row["records"])
        set_reader(store, st, "replicat", "MODEL", position.seqno, position.rba)
        purge_trails(store, config)

    assert differences(target_dsn, truth) == {}
    for name, table in truth["tables"].items():
        expected = table["rows"] if name.startswith("shop.") else []
        assert canonical(list(model[name].values())) == canonical(expected), name
    lt, rt = config.trail_location("dirdat/lt"), config.trail_location("remote/rt")
    assert len(committed_files(store, lt)) > 3
    for trail_key in (lt, rt, st):
        rows = committed_files(store, trail_key)
        assert [r["purged_at"] is None for r in rows] == [False] * (len(rows) - 1) + [True], trail_key
    shipped = {key: sum(r["records"] for r in committed_files(store, key)) for key in (lt, rt, st)}
    assert shipped[st] < shipped[rt] == shipped[lt], "PASSTHRU ships every record, the filter only shop.*"
