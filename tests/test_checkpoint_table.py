"""The checkpoint table: the target's rows and the checkpoint row commit together, so a
crash before the target commit leaves neither (in the grouped path and inside the
one-by-one replay) and the rerun converges; completed-xid lists past 2000 characters
continue in _lox rows, which the next checkpoint row replaces."""

from __future__ import annotations

import json
import os
import subprocess
import time

import psycopg2
import pytest
from psycopg2 import sql

from capture_kit import committed_trail, ins, new_archive, rec
from replicat_kit import FOUR, FOUR_APPLIED
from replicat_kit import captured as _captured
from replicat_kit import checkpoint_row_if_created as checkpoint_row
from replicat_kit import orders as _orders
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.replicat import checkpoint_table as ckt
from trailbound.replicat.apply.parallel import ParallelApply
from trailbound.replicat.run import run_replicat

pytestmark = [pytest.mark.spark, pytest.mark.pg]


# ---------------------------------------------------------------- crashes before the target commit

def _crash(config_path, store, target_dsn, point: str, driver) -> subprocess.CompletedProcess:
    env = {**os.environ, CRASH_ENV: point, "TRAILBOUND_METADATA_DSN": store.connection.dsn,
           "TRAILBOUND_TARGET_DSN": target_dsn, **driver.env}
    return subprocess.run(driver.cli("--config", str(config_path), "replicat", "run", "REP1"),
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.long_running(30)
@pytest.mark.parametrize("replay", [False, True], ids=["grouped", "one_by_one_replay"])
def test_a_crash_before_the_target_commit_leaves_nothing_then_the_rerun_converges(tmp_path, spark, store, target_dsn,
                                                                                 replay, crash_driver):
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
    crashed = _crash(config_path, store, target_dsn, "before_target_commit", crash_driver)
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
