"""Bounded Recovery and long-running transactions, over archives measured in hours of
log time (one SCN per second, one segment per hour: scn 3600*h is hour h)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from capture_kit import at, committed_trail, ins, new_archive, rec, state, transactions
from trailbound import cli
from trailbound import config as configuration
from trailbound.archive.writer import encode_json
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.positions import Scn

pytestmark = [pytest.mark.spark, pytest.mark.pg]
HOUR = 3600


def hours(h: float) -> int:
    return int(h * HOUR)


def write_config(tmp_path: Path, *, tables=("shop.*",), br: str = "") -> Path:
    path = tmp_path / "trailbound.yaml"
    path.write_text(
        f"home: {tmp_path}\nsources:\n  SRC:\n    altarchivelogdest: archive\n"
        f"extracts:\n  EXT1:\n    source: SRC\n    exttrail: dirdat/lt\n"
        f"    table: [{', '.join(repr(t) for t in tables)}]\n    interval: 1h\n"
        f"    br:\n      brdir: brfiles\n      brinterval: 1h\n{br}"
        f"    warnlongtrans:\n      duration: 3h\n      checkinterval: 1h\n")
    return path


def long_running_archive(tmp_path: Path, *, total_hours: int, long_xids=("LONG",), commit_hour: int | None = None):
    """Each hour: a short transaction S<h> commits; every long xid adds one row; the long
    ones commit in `commit_hour` (or never). Thread 2 idles with empty segments."""
    archive = new_archive(tmp_path)
    for h in range(total_hours):
        base = hours(h)
        records = [ins(base + 10, f"S{h}", 100_000 + h), rec(base + 20, f"S{h}", "COMMIT")]
        for n, xid in enumerate(long_xids):
            if commit_hour is None or h < commit_hour:
                records.append(ins(base + 1800 + n, xid, 1000 * (n + 1) + h))
            if h == commit_hour:
                records.append(rec(base + 1900 + n, xid, "COMMIT"))
        archive.segment(1, records, hours(h + 1))
        archive.segment(2, [], hours(h + 1))
    return archive


def run(spark, store, config, until_hour=None, **kwargs):
    return run_extract(spark, store, config, "EXT1", until=None if until_hour is None else at(hours(until_hour)),
                       **kwargs)


def runs(store) -> list[dict]:
    with store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.extract_run ORDER BY run_id")
        return cur.fetchall()


def warnings(store, kind: str) -> list[dict]:
    with store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.extract_warning WHERE kind = %s ORDER BY warning_id", (kind,))
        return cur.fetchall()


@pytest.mark.long_running(50)
def test_a_transaction_open_48_hours_is_persisted_survives_runs_and_a_crash_and_is_written_once(
        tmp_path, spark, store, crash_driver):
    long_running_archive(tmp_path, total_hours=50, commit_hour=48)
    config_path = write_config(tmp_path)
    config = configuration.load(config_path)
    brdir = tmp_path / "brfiles" / "EXT1"
    until_hours = [2, 18, 34, 50]  # runs 16 hours of log apart: each re-reads at most one BR interval
    for n, h in enumerate(until_hours):
        if n == 2:  # die after persisting the BR checkpoint's files, before the commit
            env = {**os.environ, CRASH_ENV: "after_br_persist", "TRAILBOUND_METADATA_DSN": store.connection.dsn,
                   **crash_driver.env}
            crashed = subprocess.run(crash_driver.cli("--config", str(config_path), "extract", "run", "EXT1",
                                                       "--until", at(hours(h)).isoformat()), env=env,
                                     capture_output=True, text=True, timeout=300)
            assert crashed.returncode == 137, crashed.stderr[-2000:]
        result = run(spark, store, config, h)
        if h < 48:
            [long_one] = [t for t in state(store).open if t.xid == "LONG"]
            assert long_one.persisted is not None and long_one.persisted.file.parent == brdir
            assert long_one.start.scn == Scn(hours(0) + 1800), "the persisted transaction keeps its true start"
            assert [p.name for p in brdir.iterdir()] == [long_one.persisted.file.name], "stale files are removed"
            if n > 0:
                assert result.recovery == "bounded"
    written = transactions(committed_trail(store, config))
    longs = [keys for xid, keys in written if xid == "LONG"]
    assert longs == [[1000 + h for h in range(48)]], "written once, whole, in log order"
    assert [xid for xid, _ in written if xid.startswith("S")] == [f"S{h}" for h in range(50)]
    assert state(store).open == [] and list(brdir.iterdir()) == []
    history = runs(store)
    for previous, current in zip(history, history[1:]):
        reread = previous["read_time"] - current["read_from_time"]
        assert reread.total_seconds() <= 2 * HOUR, f"run {current['run_id']} re-read {reread} of log"


def test_without_bounded_recovery_every_run_rereads_from_the_oldest_open_transaction(tmp_path, spark, store):
    long_running_archive(tmp_path, total_hours=12)
    config = configuration.load(write_config(tmp_path, br="      broff: true\n"))
    for h in (2, 6, 10):
        result = run(spark, store, config, h)
        assert result.recovery == "normal"
    last = runs(store)[-1]
    assert last["read_from_time"] == at(hours(0) + 1800), "normal recovery goes back to the oldest open start"
    assert not (tmp_path / "brfiles" / "EXT1").exists() or not list((tmp_path / "brfiles" / "EXT1").iterdir())


def test_persisted_files_of_hostile_xids_stay_inside_the_group_directory(tmp_path, spark, store):
    hostile = ("../../escape", "a/b", "..\\..\\win", ".", "..", "/abs/path", "x" * 128, "ünï cödé 🚀")
    long_running_archive(tmp_path, total_hours=4, long_xids=hostile)
    config = configuration.load(write_config(tmp_path))
    run(spark, store, config, 3)
    brdir = (tmp_path / "brfiles" / "EXT1").resolve()
    persisted = [t for t in state(store).open if t.persisted]
    assert sorted(t.xid for t in persisted) == sorted(hostile)
    files = list(brdir.iterdir())
    assert len(files) == len(hostile)
    for path in files:
        assert path.resolve().parent == brdir and all(c in "0123456789abcdef." for c in path.name.removesuffix(".parquet"))
    assert not (tmp_path / "escape").exists() and not (tmp_path / "brfiles" / "a").exists()


@pytest.fixture
def persisted_setup(tmp_path, spark, store):
    """A long transaction persisted by two BR checkpoints (runs to hour 3 and 4); it
    commits in hour 7."""
    long_running_archive(tmp_path, total_hours=9, commit_hour=7)
    config_path = write_config(tmp_path)
    config = configuration.load(config_path)
    run(spark, store, config, 3)
    run(spark, store, config, 4)
    [long_one] = [t for t in state(store).open if t.xid == "LONG"]
    assert long_one.persisted is not None
    return tmp_path, config_path, config, long_one


def _finish_and_check(spark, store, config, fallback_reason: str):
    result = run(spark, store, config, 5)
    assert result.recovery.startswith("normal (fallback:") and fallback_reason in result.recovery
    [warning] = warnings(store, "br_fallback")
    assert fallback_reason in warning["detail"]["reason"]
    assert [t.persisted for t in state(store).open if t.xid == "LONG"] != [None], "BR is on again: re-persisted"
    assert run(spark, store, config, 6).recovery == "bounded"
    run(spark, store, config)
    assert [keys for xid, keys in transactions(committed_trail(store, config)) if xid == "LONG"] == \
        [[1000 + h for h in range(7)]]


def test_fallback_when_a_persisted_file_is_missing(persisted_setup, spark, store):
    _, _, config, long_one = persisted_setup
    long_one.persisted.file.unlink()
    _finish_and_check(spark, store, config, "is missing")


def test_fallback_when_a_persisted_file_is_corrupt(persisted_setup, spark, store):
    _, _, config, long_one = persisted_setup
    long_one.persisted.file.write_bytes(b"PAR1 not really" + long_one.persisted.file.read_bytes()[15:])
    _finish_and_check(spark, store, config, "is corrupt")


def test_fallback_when_the_table_selection_changed(persisted_setup, spark, store):
    tmp_path, _, _, _ = persisted_setup
    config = configuration.load(write_config(tmp_path, tables=("shop.*", "hr.*")))
    _finish_and_check(spark, store, config, "table selection changed")


def test_fallback_when_alter_extract_moved_the_start_point(persisted_setup, spark, store, monkeypatch, capsys):
    _, config_path, config, _ = persisted_setup
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(["--config", str(config_path), "alter", "extract", "EXT1", "begin", "scn", str(hours(4))]) == 0
    [warning] = warnings(store, "br_fallback")
    assert "alter extract" in warning["detail"]["reason"]
    result = run(spark, store, config, 6)
    assert result.recovery == "normal"
    assert "LONG" in [t.xid for t in state(store).open if t.skip_reason], "in flight at the new begin: never written"


def test_broffonfailure_keeps_normal_recovery_after_a_failure(tmp_path, spark, store):
    long_running_archive(tmp_path, total_hours=8, commit_hour=7)
    config = configuration.load(write_config(tmp_path, br="      broffonfailure: true\n"))
    run(spark, store, config, 3)
    [long_one] = [t for t in state(store).open if t.xid == "LONG"]
    long_one.persisted.file.unlink()
    assert "missing" in run(spark, store, config, 4).recovery
    assert state(store).br_suspended and all(t.persisted is None for t in state(store).open)
    assert run(spark, store, config, 6).recovery == "normal"
    assert run(spark, store, config, 7, brreset=True).recovery == "normal"
    assert state(store).br_suspended is None, "brreset turns Bounded Recovery back on"


def test_long_running_transactions_are_warned_about(tmp_path, spark, store):
    long_running_archive(tmp_path, total_hours=8)
    config = configuration.load(write_config(tmp_path))
    run(spark, store, config, 2)
    assert warnings(store, "longtrans") == []
    run(spark, store, config, 6)
    [warning] = warnings(store, "longtrans")
    assert warning["xid"] == "LONG" and warning["thread"] == 1
    assert warning["detail"]["age_seconds"] == hours(6) - 1800
    assert warning["detail"]["start_position"] == "1:1:2" and warning["detail"]["records"] == 6


def test_an_open_transaction_s_size_is_the_bytes_of_its_images(tmp_path, spark, store, monkeypatch, capsys):
    """SHOWTRANS and the long-running warning give an open transaction's size in bytes
    (UTF-8, as the log holds it), not characters: non-ASCII text counts 2-4 bytes a letter."""
    archive = new_archive(tmp_path)
    notes = ["Ångström", "北京市朝阳区", "emoji 🚀"]
    records = [rec(10 + n, "WIDE", "INSERT", "shop.orders", key=n, note=note) for n, note in enumerate(notes)]
    archive.segment(1, records, hours(4))
    archive.segment(2, [], hours(4))
    config_path = write_config(tmp_path)
    run(spark, store, configuration.load(config_path), 4)  # past WARNLONGTRANS's 3 hours
    expected = sum(len(encode_json(r["after"]).encode()) for r in records)
    assert expected > sum(len(encode_json(r["after"])) for r in records)
    [wide] = state(store).open
    assert (wide.xid, wide.records, wide.bytes) == ("WIDE", 3, expected)
    [warning] = warnings(store, "longtrans")
    assert warning["detail"]["bytes"] == expected
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(["--config", str(config_path), "send", "extract", "EXT1", "showtrans"]) == 0
    assert f"bytes {expected}" in capsys.readouterr().out


def test_showtrans_skiptrans_and_forcetrans_end_to_end(tmp_path, spark, store, monkeypatch, capsys):
    long_running_archive(tmp_path, total_hours=6, long_xids=("SKIPME", "FORCEME", "KEEP"), commit_hour=5)
    config_path = write_config(tmp_path)
    config = configuration.load(config_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    base = ["--config", str(config_path)]
    run(spark, store, config, 3)
    capsys.readouterr()
    assert cli.main([*base, "send", "extract", "EXT1", "showtrans", "--count", "2"]) == 0
    shown = capsys.readouterr().out
    assert shown.index("SKIPME") < shown.index("FORCEME") and "KEEP" not in shown
    assert cli.main([*base, "send", "extract", "EXT1", "skiptrans", "NOSUCH"]) == 1
    assert "is not open" in capsys.readouterr().err
    assert cli.main([*base, "send", "extract", "EXT1", "skiptrans", "S1"]) == 1  # committed long ago
    assert "is not open" in capsys.readouterr().err
    assert cli.main([*base, "send", "extract", "EXT1", "skiptrans", "SKIPME"]) == 0
    assert cli.main([*base, "send", "extract", "EXT1", "forcetrans", "FORCEME"]) == 0
    assert "recorded as directive" in capsys.readouterr().out
    run(spark, store, config, 4)
    written = transactions(committed_trail(store, config))
    assert ("FORCEME", [2000, 2001, 2002, 2003]) in written, "forced: what it held, as committed now"
    forced = [r for r in committed_trail(store, config) if r["xid"] == "FORCEME"]
    assert {(r["csn"], r["csn_thread"]) for r in forced} == {(hours(4), 0)}
    run(spark, store, config)  # hour 5: all three commit in the log
    written = transactions(committed_trail(store, config))
    assert [xid for xid, _ in written].count("FORCEME") == 1, "the later COMMIT does not write it again"
    assert "SKIPME" not in [xid for xid, _ in written]
    assert ("KEEP", [3000 + h for h in range(5)]) in written
    with store.transaction() as cur:
        cur.execute("SELECT kind, state, result FROM trailbound.extract_directive ORDER BY directive_id")
        done = cur.fetchall()
    assert [(d["kind"], d["state"]) for d in done] == [("skiptrans", "done"), ("forcetrans", "done")]
    assert "written at CSN" in done[1]["result"]


def test_info_extract_br_shows_checkpoint_persisted_restart_and_bound(persisted_setup, store, monkeypatch, capsys):
    _, config_path, _, long_one = persisted_setup
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(["--config", str(config_path), "info", "extract", "EXT1", "--br"]) == 0
    shown = capsys.readouterr().out
    for expected in ("Bounded Recovery:", "Status: on", "BR interval: 1:00:00", "Last BR checkpoint: #",
                     "Persisted transactions: 1", "xid 'LONG' thread 1", long_one.persisted.file.name,
                     f"Next run: bounded recovery, re-reads every thread from scn {hours(4)}",
                     "guarantees at most 2:00:00"):
        assert expected in shown, expected


def test_after_start_extract_brreset_info_predicts_the_restart_the_next_run_does(persisted_setup, spark, store,
                                                                                 monkeypatch, capsys):
    _, config_path, config, long_one = persisted_setup
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    base = ["--config", str(config_path)]
    assert cli.main([*base, "start", "extract", "EXT1", "--brreset"]) == 0
    capsys.readouterr()
    assert cli.main([*base, "info", "extract", "EXT1", "--br"]) == 0
    [predicted] = [line.strip() for line in capsys.readouterr().out.splitlines() if "Next run:" in line]
    assert predicted.startswith("Next run: normal (fallback: brreset requested) recovery"), predicted
    assert f"thread 1 from {long_one.start.position} (scn {long_one.start.scn})" in predicted, \
        "normal recovery goes back to the persisted transaction's true start"
    # SHOWCH's recovery checkpoint is the one the fallback uses: the persisted transaction's start.
    assert cli.main([*base, "info", "extract", "EXT1", "--showch"]) == 0
    shown = capsys.readouterr().out
    thread_1 = shown.split("Read Checkpoint #")[1:]
    block = next(b for b in thread_1 if "Thread #: 1" in b)
    recovery_block = block.split("Recovery Checkpoint (position of oldest")[1].split("Current Checkpoint")[0]
    assert f"Sequence #: {long_one.start.position.sequence}" in recovery_block, recovery_block
    assert f"RBA: {long_one.start.position.rba}" in recovery_block and f"SCN: {long_one.start.scn}" in recovery_block
    assert f"{long_one.start.position.sequence:09d}" in recovery_block.split("Redo File: ")[1].split()[0]

    result = run(spark, store, config, 5)
    did = f"{result.recovery} recovery, {result.restart}"
    assert predicted == f"Next run: {did}" and did in result.describe()
    last = runs(store)[-1]
    assert last["recovery"] == "normal (fallback: brreset requested)"
    assert last["read_from_time"] == long_one.start.ts, "the run really re-read from the predicted start"


def test_showch_shows_the_br_checkpoint_and_the_restart_the_next_run_does(persisted_setup, spark, store, monkeypatch,
                                                                          capsys):
    _, config_path, config, long_one = persisted_setup
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(["--config", str(config_path), "info", "extract", "EXT1", "--showch"]) == 0
    shown = capsys.readouterr().out
    b = state(store).br_checkpoint
    assert "Bounded Recovery Checkpoint (where the next run restarts" in shown and f"SCN: {b.scn}" in shown
    recovery_block = shown.split("Recovery Checkpoint (position of oldest")[1].split("Current Checkpoint")[0]
    sequence = int(recovery_block.split("Sequence #: ")[1].split()[0])
    redo_file = recovery_block.split("Redo File: ")[1].split()[0]
    assert f"{sequence:09d}" in redo_file, (sequence, redo_file)  # the file of its own sequence
    [predicted] = [line.strip() for line in shown.splitlines() if "Next run:" in line]
    result = run(spark, store, config, 5)
    assert predicted == f"Next run: {result.recovery} recovery, {result.restart}" and result.recovery == "bounded"


@pytest.mark.long_running(80)
def test_a_huge_transaction_persisted_across_runs_is_written_as_one_run_writes_it(tmp_path, spark, store):
    """A transaction of 4,000 records, open across two runs, persisted at a BR checkpoint
    in many Parquet row groups (Spark batches of 500 records) and restored a row group
    at a time, reaches the trail exactly as a run that reads it whole in one go writes
    it: the same records in the same order, the same content digest. (It starts at scn
    0, the single run's recovery SCN, so that both files carry the same log_bsn.)"""
    import pyarrow.parquet as pq

    from trailbound.trail import format as trail

    per_hour, total_hours = 1000, 4
    archive = new_archive(tmp_path)
    for h in range(total_hours):
        records = [ins(hours(h) + i, "HUGE", h * per_hour + i) for i in range(per_hour)]
        if h == total_hours - 1:
            records.append(rec(hours(h) + 3000, "HUGE", "COMMIT"))
        archive.segment(1, records, hours(h + 1))
    config_path = write_config(tmp_path)
    # A second group on the same archive and its own trail: the same transaction captured in one run.
    config_path.write_text(config_path.read_text() + "  ONCE:\n    source: SRC\n    exttrail: dirdat/lo\n"
                                                     "    table: ['shop.*']\n")
    config = configuration.load(config_path)
    batch = "spark.sql.execution.arrow.maxRecordsPerBatch"
    saved = spark.conf.get(batch)
    spark.conf.set(batch, "500")
    try:
        run(spark, store, config, 2)
        [huge] = state(store).open
        assert huge.persisted is not None and huge.persisted.records == 2 * per_hour
        assert pq.ParquetFile(huge.persisted.file).num_row_groups > 1, "persisted a batch at a time"
        assert run(spark, store, config).recovery == "bounded"
        run_extract(spark, store, config, "ONCE")
    finally:
        spark.conf.set(batch, saved)

    def trail_files(prefix: str) -> list[Path]:
        return sorted((tmp_path / "dirdat").glob(f"{prefix}?????????"))

    [across_runs], [in_one_run] = trail_files("lt"), trail_files("lo")
    assert transactions(list(trail.iter_records(across_runs))) == \
        [("HUGE", list(range(total_hours * per_hour)))], "written once, whole, in log order"
    assert trail.read_file(across_runs).equals(trail.read_file(in_one_run))
    digests = [trail.read_metadata(path)["content_sha256"] for path in (across_runs, in_one_run)]
    assert digests[0] == digests[1]
