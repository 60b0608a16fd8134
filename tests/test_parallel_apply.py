"""Parallel apply (replicat's apply_parallelism): insert-only groups on several target
sessions at once. A reader of the target only ever sees a prefix of the trail, the one the
checkpoint row names; a refused row, a lock cycle between two groups and a crash at any
point end as they do on one session."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg2
import psycopg2.extensions
import pytest
from psycopg2 import sql

from capture_kit import ins, new_archive, rec
from replicat_kit import checkpoint_row, write_config
from trailbound import config as configuration
from trailbound.archive.segments import load_defs
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.positions import Csn, Scn
from trailbound.replicat import target as tgt
from trailbound.replicat.apply import ApplyError, copychain
from trailbound.replicat.info import describe_replicat
from trailbound.replicat.run import run_replicat
from trailbound.trail import format as trail

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def _insert_only(tmp_path: Path, transactions: int, *, salaries: bool = True) -> None:
    """Transactions each inserting two orders (and a salary), keys counting up."""
    archive = new_archive(tmp_path)
    records, scn = [], 10
    for number in range(1, transactions + 1):
        xid = f"T{number}"
        records += [ins(scn, xid, 2 * number - 1), ins(scn + 1, xid, 2 * number)]
        if salaries:
            records.append(rec(scn + 2, xid, "INSERT", "hr.salaries", key=number))
        records.append(rec(scn + 3, xid, "COMMIT"))
        scn += 4
    archive.segment(1, records, scn + 10)


def _prepare(tmp_path, spark, store, target_dsn, **config) -> tuple[Path, configuration.Config, list[dict]]:
    config_path = write_config(tmp_path, **config)
    loaded = configuration.load(config_path)
    run_extract(spark, store, loaded, "EXT1")
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        tgt.create_tables(cur, load_defs(loaded.archive_dir("SRC")), loaded.replicat("REP1").map)
    connection.close()
    with store.transaction() as cur:
        cur.execute("SELECT path FROM trailbound.trail_file ORDER BY seqno")
        paths = [row["path"] for row in cur.fetchall()]
    assert len(paths) == 1, "one trail file: an rba alone says how far a prefix reaches"
    return config_path, loaded, list(trail.iter_records(Path(paths[0])))


def _rows(target_dsn: str) -> dict[str, dict[int, str]]:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT id, note FROM shop.orders")
        orders = dict(cur.fetchall())
        cur.execute("SELECT id, amount::text FROM hr.salaries")
        return {"shop.orders": orders, "hr.salaries": dict(cur.fetchall())}


def _prefix_counts(records: list[dict], rba: int) -> tuple[int, int]:
    """(orders, salaries) the trail inserts before `rba`."""
    before = [r for r in records[:rba] if r["op"] == "INSERT"]
    return sum(r["table"] == "shop.orders" for r in before), sum(r["table"] == "hr.salaries" for r in before)


def _consistent_prefix(target_dsn: str, records: list[dict]) -> None:
    """In one snapshot, the target holds exactly the rows of the trail up to where its
    checkpoint row says."""
    with psycopg2.connect(target_dsn) as connection:
        connection.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ)
        with connection.cursor() as cur:
            cur.execute("SELECT rba FROM trailbound.ggcheckpoint WHERE group_name = 'REP1'")
            row = cur.fetchone()
            cur.execute("SELECT (SELECT count(*) FROM shop.orders), (SELECT count(*) FROM hr.salaries)")
            counts = cur.fetchone()
    assert counts == _prefix_counts(records, row[0] if row else 0), (row, counts)


# Each group as one query of chained COPYs (apply/copychain.py), and, where that cannot be used,
# as psycopg2's own queries.
WAYS = pytest.mark.parametrize("way", ["copychain", "psycopg2"])


def _send_by(way: str, monkeypatch) -> None:
    assert copychain.available(), "this machine's psycopg2 libpq is found (Linux)"
    if way == "psycopg2":
        monkeypatch.setattr(copychain, "available", lambda: False)


@WAYS
def test_groups_on_two_sessions_commit_in_trail_order(way, tmp_path, spark, store, target_dsn, monkeypatch):
    """200 insert-only groups, two at a time. A reader polling the target throughout sees,
    in every snapshot, exactly the rows of the trail up to the checkpoint row's position:
    no group is ever visible before the one ahead of it."""
    _send_by(way, monkeypatch)
    _insert_only(tmp_path, 400)
    _, config, records = _prepare(tmp_path, spark, store, target_dsn, tables=("shop.*", "hr.*"), grouptransops=6,
                                  apply_parallelism=2)
    samples, stop = [], threading.Event()

    def poll():
        with psycopg2.connect(target_dsn) as connection:
            connection.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ)
            while not stop.is_set():
                with connection.cursor() as cur:
                    cur.execute("SELECT to_regclass('trailbound.ggcheckpoint') IS NOT NULL")
                    if cur.fetchone()[0]:
                        cur.execute("SELECT rba FROM trailbound.ggcheckpoint WHERE group_name = 'REP1'")
                        row = cur.fetchone()
                        cur.execute("SELECT (SELECT count(*) FROM shop.orders), (SELECT count(*) FROM hr.salaries)")
                        samples.append((row[0] if row else 0, cur.fetchone()))
                connection.commit()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    finally:
        stop.set()
        poller.join()
    assert (result.groups, result.parallel_groups, result.replayed_groups) == (200, 200, 0), result.describe()
    assert "200 of them on parallel sessions" in result.describe()
    assert "in 200 target transactions (200 on parallel sessions)" in describe_replicat(store, config, "REP1", showch=1)
    assert _rows(target_dsn) == {"shop.orders": {k: f"n{k}" for k in range(1, 801)},
                                 "hr.salaries": {k: None for k in range(1, 401)}}
    assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(records[-1]))
    midway = [(rba, counts) for rba, counts in samples if 0 < rba < len(records)]
    assert len({rba for rba, _ in midway}) >= 2, f"the reader saw the run under way ({len(samples)} samples)"
    for rba, counts in samples:
        assert counts == _prefix_counts(records, rba), f"at rba {rba} the target held {counts}"


@WAYS
def test_a_refused_row_in_a_parallel_group_commits_nothing_after_it(way, tmp_path, spark, store, target_dsn,
                                                                    monkeypatch):
    """The target already holds a row the 8th group inserts. Groups after it were sent on
    the other session: none of them commits. The error names the record; the checkpoint
    row is just before it. With HANDLECOLLISIONS the rerun converges."""
    _send_by(way, monkeypatch)
    _insert_only(tmp_path, 40, salaries=False)
    _, config, records = _prepare(tmp_path, spark, store, target_dsn, tables=("shop.*",), grouptransops=4)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("INSERT INTO shop.orders VALUES (29, 'already here')")
    connection.close()

    with pytest.raises(ApplyError) as error:
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    refused = next(r for r in records if r["op"] == "INSERT" and '"id":29' in r["after"].replace(" ", ""))
    assert (error.value.rba, error.value.table, error.value.key) == (refused["rba"], "shop.orders", {"id": 29})
    # T15 (keys 29, 30) was refused; T14 went in (replayed on its own, ahead of it).
    last_in = max(r["rba"] for r in records if r["xid"] == "T14")
    assert checkpoint_row(target_dsn)["rba"] == last_in + 1
    assert _rows(target_dsn)["shop.orders"] == {**{k: f"n{k}" for k in range(1, 29)}, 29: "already here"}

    config = configuration.load(write_config(tmp_path, tables=("shop.*",), grouptransops=4, handlecollisions=True))
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert result.collisions == 1 and result.parallel_groups > 0, result.describe()
    assert _rows(target_dsn)["shop.orders"] == {k: f"n{k}" for k in range(1, 81)}
    assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(records[-1]))


def test_a_row_refused_at_commit_on_a_parallel_session_commits_nothing_after_it(tmp_path, spark, store, target_dsn):
    """A deferred constraint refuses a parallel group only at its COMMIT, which the
    lane sends with the checkpoint row: the group and every one after it roll back, the
    error names the refused transaction, the checkpoint row is just before it, and once
    the conflicting row is gone the rerun converges."""
    _insert_only(tmp_path, 40, salaries=False)
    _, config, records = _prepare(tmp_path, spark, store, target_dsn, tables=("shop.*",), grouptransops=4)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("ALTER TABLE shop.orders ADD CONSTRAINT one_note UNIQUE (note) DEFERRABLE INITIALLY DEFERRED")
        cur.execute("INSERT INTO shop.orders VALUES (1000, 'n29')")
    connection.close()

    with pytest.raises(ApplyError) as error:
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    # T15 inserts keys 29 and 30; COMMIT refuses it, so the error names its last record.
    refused = [r for r in records if r["xid"] == "T15"]
    assert error.value.rba == refused[-1]["rba"] and "one_note" in str(error.value), str(error.value)
    assert checkpoint_row(target_dsn)["rba"] == refused[0]["rba"]
    assert _rows(target_dsn)["shop.orders"] == {**{k: f"n{k}" for k in range(1, 29)}, 1000: "n29"}

    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("DELETE FROM shop.orders WHERE id = 1000")
    connection.close()
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert result.parallel_groups > 0, result.describe()
    assert _rows(target_dsn)["shop.orders"] == {k: f"n{k}" for k in range(1, 81)}
    assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(records[-1]))


def test_two_groups_waiting_for_each_other_are_applied_one_at_a_time(tmp_path, spark, store, target_dsn):
    """The trail inserts key 7 in two transactions (a source the target was out of step
    with). A trigger holds the first group before its 7, so the second group's session
    inserts 7 first: the first now waits for a lock the second holds, and the second waits
    for the first to commit. lock_timeout ends the wait; both roll back and are applied
    one at a time, and HANDLECOLLISIONS makes the second insert an update, as on one
    session. Without the timeout the run never ends."""
    archive = new_archive(tmp_path)
    # Chunks of 1, 2 and 4 records (GROUPTRANSOPS 1): T3 and T4 share the third, so they
    # are in flight together.
    archive.segment(1, [ins(10, "T1", 50), rec(11, "T1", "COMMIT"),
                        ins(20, "T2", 51), ins(21, "T2", 52), rec(22, "T2", "COMMIT"),
                        rec(30, "T3", "INSERT", "shop.orders", key=100, note="slow"),
                        rec(31, "T3", "INSERT", "shop.orders", key=7, note="first"), rec(32, "T3", "COMMIT"),
                        rec(40, "T4", "INSERT", "shop.orders", key=7, note="second"), rec(41, "T4", "COMMIT"),
                        ins(50, "T5", 53), rec(51, "T5", "COMMIT")], 100)
    _, config, records = _prepare(tmp_path, spark, store, target_dsn, tables=("shop.*",), grouptransops=1,
                                  handlecollisions=True)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("CREATE FUNCTION public.slow_note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "IF NEW.note = 'slow' THEN PERFORM pg_sleep(1); END IF; RETURN NEW; END $$")
        cur.execute("CREATE TRIGGER slow BEFORE INSERT ON shop.orders FOR EACH ROW EXECUTE FUNCTION public.slow_note()")
    connection.close()
    outcome = {}

    def apply():
        try:
            outcome["result"] = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    runner = threading.Thread(target=apply, daemon=True)
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive(), "the two sessions still wait for each other"
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert (result.groups, result.collisions, result.replayed_groups) == (5, 1, 1), result.describe()
    assert _rows(target_dsn)["shop.orders"] == {50: "n50", 51: "n51", 52: "n52", 100: "slow", 7: "second", 53: "n53"}
    assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(records[-1]))


@pytest.mark.parametrize("point", ["mid_copy", "before_target_commit", "after_target_commit", "between_groups"])
def test_a_crash_with_groups_in_flight_on_both_sessions_converges(point, tmp_path, spark, metadata_dsn, store,
                                                                  target_dsn):
    """`replicat run` killed at a crash point while groups are in flight on two sessions:
    the target holds exactly the prefix its checkpoint row names, and the rerun converges
    with nothing applied twice (a key inserted twice would fail on the primary key)."""
    _insert_only(tmp_path, 300)
    config_path, _, records = _prepare(tmp_path, spark, store, target_dsn, tables=("shop.*", "hr.*"),
                                       grouptransops=3)
    env = {**os.environ, "TRAILBOUND_METADATA_DSN": metadata_dsn, "TRAILBOUND_TARGET_DSN": target_dsn}
    replicat = [sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "replicat", "run", "REP1"]
    crashed = subprocess.run(replicat, env={**env, CRASH_ENV: point}, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    row = checkpoint_row(target_dsn)
    if point in ("mid_copy", "before_target_commit"):
        assert row is None, "the first group died before its commit: nothing is committed"
    else:
        assert row is not None and 0 < row["rba"] < len(records)
    _consistent_prefix(target_dsn, records)
    done = subprocess.run(replicat, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on parallel sessions" in done.stdout, done.stdout
    assert _rows(target_dsn) == {"shop.orders": {k: f"n{k}" for k in range(1, 601)},
                                 "hr.salaries": {k: None for k in range(1, 301)}}
    assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(records[-1]))


def _wait_until_no_session_of(role: str, dsn: str, seconds: float = 60) -> None:
    """Until the server lists no session of `role` (its closed ones have exited)."""
    deadline = time.monotonic() + seconds
    with psycopg2.connect(dsn) as connection:
        connection.autocommit = True
        with connection.cursor() as cur:
            while True:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,))
                left = cur.fetchone()[0]
                if not left:
                    break
                assert time.monotonic() < deadline, f"{left} session(s) of {role} still there after {seconds} s"
                time.sleep(0.05)
    connection.close()


def test_a_target_that_takes_no_second_session_is_applied_on_one(tmp_path, spark, store, target_dsn, caplog):
    """The replicat's role may open one connection (CONNECTION LIMIT 1): the lane cannot
    be opened, the run says so in a warning and applies every group on its own session."""
    _insert_only(tmp_path, 100)
    role = f"tb_one_{uuid.uuid4().hex[:8]}"
    parts = psycopg2.extensions.parse_dsn(target_dsn)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(role)))
        cur.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(parts["dbname"]),
                                                                   sql.Identifier(role)))
    connection.close()
    limited = psycopg2.extensions.make_dsn(target_dsn, user=role)
    try:
        _, config, records = _prepare(tmp_path, spark, store, limited, tables=("shop.*", "hr.*"), grouptransops=3)
        # _prepare's session of the limited role (it created the tables) is closed, but it
        # counts against the limit until its server process has exited, a moment later: the
        # run's own session, opened right after, would be refused ("too many connections").
        _wait_until_no_session_of(role, target_dsn)
        result = run_replicat(spark, store, config, "REP1", target_dsn=limited)
        assert (result.groups, result.parallel_groups) == (100, 0), result.describe()
        assert any("parallel apply goes on with 1 session(s)" in r.getMessage() and "too many connections" in
                   r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        # Read as the suite's own role: a session of the limited one, just closed, may
        # still count against its limit until its server process has exited.
        assert _rows(target_dsn) == {"shop.orders": {k: f"n{k}" for k in range(1, 201)},
                                     "hr.salaries": {k: None for k in range(1, 101)}}
        assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(records[-1]))
    finally:
        with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
            cur.execute(sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(sql.Identifier(parts["dbname"])))
            cur.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(sql.Identifier(role)))
            cur.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            cur.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        connection.close()


def test_a_file_replaced_after_its_commit_commits_nothing_from_the_sessions(tmp_path, store, target_dsn):
    """A committed file replaced by another that is valid on its own (its footer agrees),
    of groups the two sessions would take: nothing of it is committed, and the run stops
    saying the file is not the one committed (its SHA-256 as recorded at commit)."""
    from test_copy_lines import ITEMS, _commit_files, _create_target, _home, _item, _records, _rows

    from trailbound.errors import TrailError

    config, prefix = _home(tmp_path, [ITEMS], grouptransops=1, apply_parallelism=2)

    def transactions(note):
        return [(f"T{k}", [("INSERT", "shop.items", None, _item(k, note))]) for k in range(1, 41)]
    _commit_files(store, prefix, [_records(transactions("as committed"))])
    replaced = trail.write_file(prefix, 1, _records(transactions("replaced")), group="EXT1", log_bsn=Scn(50))
    _create_target(config, target_dsn)
    with pytest.raises(TrailError) as refused:
        run_replicat(None, store, config, "REP1", target_dsn=target_dsn)
    assert refused.value.path == str(replaced.path) and "does not match the recorded" in str(refused.value)
    assert _rows(target_dsn, "shop.items", "id, note") == []


def test_a_damaged_next_file_stops_the_run_after_every_group_in_flight_is_committed_and_recorded(
        tmp_path, store, target_dsn):
    """The lanes are not drained between chunks, so groups may still be in flight when the
    next chunk turns out to be unreadable (here the second file, replaced after its
    commit). They commit as they would have, and the run records them before it stops
    naming the file: the target holds every row of the first file, its checkpoint row
    and the file checkpoint both name the first file's end."""
    from test_copy_lines import ITEMS, _commit_files, _create_target, _home, _item, _records, _rows

    from trailbound.errors import TrailError
    from trailbound.replicat import checkpoints as ckpt

    # 31 one-row transactions at GROUPTRANSOPS 1: chunks of 1, 2, 4, 8 and 16 groups end
    # with the first file, and the next chunk starts with the second.
    config, prefix = _home(tmp_path, [ITEMS], grouptransops=1, apply_parallelism=2)

    def transactions(first, count, note):
        return [(f"T{k}", [("INSERT", "shop.items", None, _item(k, note))]) for k in range(first, first + count)]
    first = _records(transactions(1, 31, "first file"))
    _commit_files(store, prefix, [first, _records(transactions(32, 10, "as committed"), scn=10_000)])
    replaced = trail.write_file(prefix, 2, _records(transactions(32, 10, "replaced"), scn=10_000), group="EXT1",
                                log_bsn=Scn(50))
    _create_target(config, target_dsn)
    with pytest.raises(TrailError) as refused:
        run_replicat(None, store, config, "REP1", target_dsn=target_dsn)
    assert refused.value.path == str(replaced.path) and "does not match the recorded" in str(refused.value)
    assert _rows(target_dsn, "shop.items", "id, note") == [(k, "first file") for k in range(1, 32)]
    assert (checkpoint_row(target_dsn)["seqno"], checkpoint_row(target_dsn)["rba"]) == (1, 31)
    with store.transaction() as cur:
        position = ckpt.load(cur, "REP1").checkpoint.position
    assert (position.seqno, position.rba) == (1, 31)
