"""What a read of the suite found untested (issue 18, item 5): the replicat group lock,
replicat's crash before the target commit (in the grouped path and inside the
one-by-one replay), checkpoint-table xid lists past 2000 characters (_lox rows), the
start-up check of the target's columns, and capture's begin `now` and begin TIME."""

from __future__ import annotations

import json
import os
import subprocess
import time

import psycopg2
import pytest
from psycopg2 import sql

from capture_kit import at, committed_trail, ins, new_archive, rec, transactions
from capture_kit import write_config as capture_config
from replicat_kit import checkpoint_row as _row
from replicat_kit import write_config
from trailbound import cli
from trailbound import config as configuration
from trailbound.archive.segments import load_defs
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.replicat import checkpoint_table as ckt
from trailbound.replicat import target as tgt
from trailbound.replicat.apply.parallel import ParallelApply
from trailbound.replicat.run import hold_target, release_target, run_replicat

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def checkpoint_row(target_dsn: str) -> dict | None:
    """The checkpoint table row, None also when no run has created the table yet."""
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT to_regclass('trailbound.ggcheckpoint') IS NOT NULL")
        exists = cur.fetchone()[0]
    return _row(target_dsn) if exists else None


def _orders(target_dsn: str) -> dict[int, str]:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT id, note FROM shop.orders ORDER BY id")
        return dict(cur.fetchall())


def _captured(tmp_path, spark, store, target_dsn, records, **options):
    """An archive of `records` captured into the trail; target tables created."""
    archive = new_archive(tmp_path)
    archive.segment(1, records, 1000)
    config_path = write_config(tmp_path, tables=("shop.*",), **options)
    config = configuration.load(config_path)
    run_extract(spark, store, config, "EXT1")
    connection = psycopg2.connect(target_dsn)
    with connection, connection.cursor() as cur:
        tgt.create_tables(cur, load_defs(config.archive_dir("SRC")), config.replicat("REP1").map)
    connection.close()
    return config_path, config


FOUR = [ins(10, "T1", 1), rec(11, "T1", "COMMIT"), ins(20, "T2", 2), ins(21, "T2", 3), rec(22, "T2", "COMMIT"),
        ins(30, "T3", 4), rec(31, "T3", "COMMIT"), rec(40, "T4", "UPDATE", "shop.orders", key=1, note="changed"),
        rec(41, "T4", "COMMIT")]
FOUR_APPLIED = {1: "changed", 2: "n2", 3: "n3", 4: "n4"}


# ---------------------------------------------------------------- the group lock

def test_a_second_replicat_run_and_alter_are_refused_while_a_run_holds_the_group(tmp_path, spark, store, target_dsn,
                                                                                group_held_elsewhere, capsys, monkeypatch):
    config_path, _ = _captured(tmp_path, spark, store, target_dsn, FOUR)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    with group_held_elsewhere("replicat", "REP1"):
        capsys.readouterr()
        assert main("replicat", "run", "REP1") == 1
        assert "replicat REP1 is held by a running" in capsys.readouterr().err
        assert main("alter", "replicat", "REP1", "extseqno", "1", "extrba", "0") == 1
        assert "replicat REP1 is held by a running" in capsys.readouterr().err
        assert checkpoint_row(target_dsn) is None and _orders(target_dsn) == {}
    assert main("replicat", "run", "REP1") == 0
    assert _orders(target_dsn) == FOUR_APPLIED


def test_a_group_applying_to_the_target_from_another_metadata_store_is_refused_there(tmp_path, spark, store,
                                                                                      target_dsn, capsys,
                                                                                      monkeypatch):
    """The group is held on the target too: a second installation (another metadata store,
    so another group lock) pointed at the same target and group is refused, run and alter
    alike, and runs once the other lets go."""
    config_path, _ = _captured(tmp_path, spark, store, target_dsn, FOUR)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    other = psycopg2.connect(target_dsn)  # the other installation's run, on the target
    hold_target(other, "REP1")
    try:
        capsys.readouterr()
        assert main("replicat", "run", "REP1") == 1
        assert "replicat REP1 is applying to this target from another process" in capsys.readouterr().err
        assert main("alter", "replicat", "REP1", "extseqno", "1", "extrba", "0") == 1
        assert checkpoint_row(target_dsn) is None and _orders(target_dsn) == {}
    finally:
        release_target(other, "REP1")
    assert main("replicat", "run", "REP1") == 0
    assert _orders(target_dsn) == FOUR_APPLIED


# ---------------------------------------------------------------- crashes before the target commit

def _crash(config_path, store, target_dsn, point: str, jvm) -> subprocess.CompletedProcess:
    env = {**os.environ, CRASH_ENV: point, "TRAILBOUND_METADATA_DSN": store.connection.dsn,
           "TRAILBOUND_TARGET_DSN": target_dsn, **jvm.env}
    return subprocess.run(jvm.cli("--config", str(config_path), "replicat", "run", "REP1"),
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.long_running(30)
@pytest.mark.parametrize("replay", [False, True], ids=["grouped", "one_by_one_replay"])
def test_a_crash_before_the_target_commit_leaves_nothing_then_the_rerun_converges(tmp_path, spark, store, target_dsn,
                                                                                 replay, driver_jvm):
    # The replay case on one session: a parallel session sends the group's commit with
    # its last COPY's end (replicat/apply/copychain.py), so its crash point comes before the
    # server has refused the row.
    config_path, config = _captured(tmp_path, spark, store, target_dsn, FOUR, handlecollisions=replay,
                                    apply_parallelism=1 if replay else None)
    before = {}
    if replay:
        # A row already there makes the grouped COPY fail, so the group is replayed one
        # transaction at a time (handlecollisions turns the insert into an update); the
        # crash point is then reached inside the replay, at its first transaction.
        with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
            cur.execute("INSERT INTO shop.orders VALUES (3, 'already here')")
        before = {3: "already here"}
    crashed = _crash(config_path, store, target_dsn, "before_target_commit", driver_jvm)
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    assert ("one by one" in crashed.stderr or "transaction by transaction" in crashed.stderr) == replay
    assert checkpoint_row(target_dsn) is None, "nothing of the group (or of its first transaction) committed"
    assert _orders(target_dsn) == before
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert _orders(target_dsn) == FOUR_APPLIED
    assert result.transactions == 4 and (result.replayed_groups > 0) == replay
    last = committed_trail(store, config)[-1]
    assert checkpoint_row(target_dsn)["log_csn"] == f"{last['csn']}@{last['csn_thread']}:{last['csn_sequence']}:" \
                                                    f"{last['csn_rba']}"


# ---------------------------------------------------------------- _lox rows

def test_completed_xids_past_2000_characters_continue_in_lox_rows(tmp_path, spark, store, target_dsn):
    """Twenty transactions with 120-character xids commit at one SCN: the list of
    completed xids (about 2,500 characters) overflows log_cmplt_xids into _lox rows and
    reads back whole; the next checkpoint row replaces them."""
    xids = [f"{n:03d}" + "x/.'\";" * 19 + "é" for n in range(20)]
    assert all(len(x) == 118 for x in xids)
    records = [ins(10 + n, xid, n) for n, xid in enumerate(xids)] + [rec(50, xid, "COMMIT") for xid in xids]
    config_path, config = _captured(tmp_path, spark, store, target_dsn, records)
    run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    name = ckt.CheckpointTableName.parse("trailbound.ggcheckpoint")
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT length(log_cmplt_xids) FROM {}").format(name.table))
        assert cur.fetchone()[0] == ckt.XIDS_WIDTH
        cur.execute(sql.SQL("SELECT log_cmplt_xids_seq, length(log_cmplt_xids) FROM {} ORDER BY 1").format(name.lox))
        lox = cur.fetchall()
        assert [seq for seq, _ in lox] == [1] and 400 < lox[0][1] <= ckt.XIDS_WIDTH
        row = ckt.read(cur, name, "REP1")
    assert row.log_cmplt_xids == xids and sorted(_orders(target_dsn)) == list(range(20))
    assert len(json.dumps(xids, ensure_ascii=False)) == ckt.XIDS_WIDTH + lox[0][1]

    archive = new_archive(tmp_path)  # one more short transaction: its row replaces the overflow
    archive.next_sequence, archive.next_scn = {1: 2}, {1: 1000}
    archive.segment(1, [ins(1010, "LAST", 99), rec(1011, "LAST", "COMMIT")], 2000)
    run_extract(spark, store, config, "EXT1")
    run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(name.lox))
        assert cur.fetchone()[0] == 0
        assert ckt.read(cur, name, "REP1").log_cmplt_xids == ["LAST"]


def test_a_group_after_one_whose_xids_overflowed_clears_the_lox_rows_in_the_same_run(tmp_path, spark, store,
                                                                                       target_dsn, monkeypatch):
    """A run writes its checkpoint rows without deleting _lox rows while none can exist.
    Here the first group's completed xids overflow into a _lox row, and the next group
    of the same run (on the other parallel session) replaces it: no _lox row is left,
    and the row reads back the last group's xid alone. The first group's session is
    held back a moment, so that the second group's session starts before it: the second
    group's row must know of the first's overflow all the same."""
    apply = ParallelApply._apply

    def first_one_late(self, lane, chunk, group, *rest):
        if len(group.cmplt_xids) > 1:  # the first group: the twenty xids
            time.sleep(0.3)
        return apply(self, lane, chunk, group, *rest)

    monkeypatch.setattr(ParallelApply, "_apply", first_one_late)
    xids = [f"{n:03d}" + "x/.'\";" * 19 + "é" for n in range(20)]
    records = [ins(10 + n, xid, n) for n, xid in enumerate(xids)] + [rec(50, xid, "COMMIT") for xid in xids]
    records += [ins(60, "LAST", 99), rec(61, "LAST", "COMMIT")]
    _, config = _captured(tmp_path, spark, store, target_dsn, records, grouptransops=20, apply_parallelism=2)
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert (result.groups, result.parallel_groups) == (2, 2), result.describe()
    name = ckt.CheckpointTableName.parse("trailbound.ggcheckpoint")
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(name.lox))
        assert cur.fetchone()[0] == 0
        assert ckt.read(cur, name, "REP1").log_cmplt_xids == ["LAST"]
    assert sorted(_orders(target_dsn)) == [*range(20), 99]


# ---------------------------------------------------------------- the target's columns

@pytest.mark.parametrize("damage,message", [
    ("ALTER TABLE shop.orders DROP COLUMN note", "target table shop.orders has no column(s) 'note'"),
    ("DROP TABLE shop.orders", "target table shop.orders (mapped from source table shop.orders) does not exist"),
], ids=["missing_column", "missing_table"])
def test_replicat_checks_the_target_columns_before_it_applies_anything(tmp_path, spark, store, target_dsn, damage,
                                                                       message, capsys, monkeypatch):
    config_path, _ = _captured(tmp_path, spark, store, target_dsn, FOUR)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(damage)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    capsys.readouterr()
    assert cli.main(["--config", str(config_path), "replicat", "run", "REP1"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert checkpoint_row(target_dsn) is None


# ---------------------------------------------------------------- begin now, begin TIME

def test_begin_now_and_begin_an_iso_time(tmp_path, spark, store, capsys, monkeypatch):
    """`now` begins at the horizon: transactions in flight there are never written. A
    time begins at the first segment that ends after it (a naive time is UTC)."""
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT"), ins(30, "INFLIGHT", 2)], 100)
    archive.segment(1, [ins(110, "B", 3), rec(120, "INFLIGHT", "COMMIT"), rec(130, "B", "COMMIT")], 200)
    config_path = capture_config(tmp_path)
    config = configuration.load(config_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    assert main("archive", "scan") == 0
    assert main("add", "extract", "EXT1", "--begin", "now") == 0
    assert "begin now (scn 200)" in capsys.readouterr().out
    archive.segment(1, [ins(210, "C", 4), rec(220, "C", "COMMIT")], 300)
    run_extract(spark, store, config, "EXT1")
    assert transactions(committed_trail(store, config)) == [("C", [4])]

    assert main("delete", "extract", "EXT1") == 0
    for path in (tmp_path / "dirdat").iterdir():
        path.unlink()
    with store.transaction() as cur:
        cur.execute("DELETE FROM trailbound.trail_file")
    naive = at(100).replace(tzinfo=None).isoformat()  # 2026-11-01T00:01:40, read as UTC
    assert main("add", "extract", "EXT1", "--begin", naive) == 0
    assert f"begin {naive} (scn 100)" in capsys.readouterr().out
    run_extract(spark, store, config, "EXT1")
    # INFLIGHT began at scn 30, before the begin point: never written; B and C are.
    assert transactions(committed_trail(store, config)) == [("B", [3]), ("C", [4])]
    assert main("alter", "extract", "EXT1", "begin", at(250).isoformat()) == 0
    assert f"begin {at(250).isoformat()} (scn 200)" in capsys.readouterr().out
    assert main("alter", "extract", "EXT1", "begin", "yesterday") == 1
    assert "begin 'yesterday': expected earliest | now | an ISO-8601 time | scn N" in capsys.readouterr().err
