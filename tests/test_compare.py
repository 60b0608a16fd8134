"""`trailbound compare` on real servers: a live PostgreSQL source replicated through the
whole pipeline (archive pull, extract, pump, replicat) to a target.

- While pgbench writes, a compare reports nothing out of sync: rows that differ because
  the replicat has not applied them yet are re-checked after it has (the test runs the
  pipeline's stages while the compare waits), and only rows still different count.
- Rows changed, deleted and inserted in the target behind the replicat's back are each
  reported, with their keys (and the changed columns), in the command's output, the
  metadata store and the report files; the repair script brings the target back in
  line, and a compare then finds nothing.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from pg_source_kit import (SOURCE_ENV, digests, execute, query, source_dsn, source_server,  # noqa: F401
                           write_config)
from trailbound import cli
from trailbound import config as configuration
import trailbound.compare.run as compare_run
from trailbound.capture.run import run_extract
from trailbound.compare.run import compare
from trailbound.pump.run import run_pump
from trailbound.replicat.run import run_replicat

pytestmark = [pytest.mark.spark, pytest.mark.pg]

TABLES = [("public", "pgbench_accounts"), ("public", "pgbench_branches"), ("public", "pgbench_tellers"),
          ("public", "pgbench_history")]
ACCOUNTS = 6000
TRANSFER = """\\set aid random(1, {accounts})
\\set tid random(1, 10)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = 1;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, 1, :aid, :delta, CURRENT_TIMESTAMP);
END;
""".format(accounts=ACCOUNTS)


class World:
    def __init__(self, spark, store, tmp_path, source, target, monkeypatch):
        monkeypatch.setenv(SOURCE_ENV, source)
        monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target)
        monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
        self.spark, self.store, self.source, self.target, self.tmp_path = spark, store, source, target, tmp_path
        self.config_path = write_config(tmp_path, tables=("public.pgbench_*",))
        self.config = configuration.load(self.config_path)
        self.rounds = 0

    def cli(self, *words: str) -> int:
        return cli.main(["--config", str(self.config_path), *words])

    def pipeline(self) -> None:
        """One pass of every stage: what the Airflow DAGs would do on their schedules."""
        assert self.cli("archive", "pull", "PG") == 0
        run_extract(self.spark, self.store, self.config, "EXT1")
        run_pump(None, self.store, self.config, "PMP1")
        run_replicat(self.spark, self.store, self.config, "REP1", target_dsn=self.target)
        self.rounds += 1

    def compare(self, **options):
        return compare(self.spark, self.store, self.config, "PG", "REP1", chunk_rows=1000,
                       report_dir=self.tmp_path / "reports", **options)


@pytest.fixture
def world(spark, store, tmp_path, source_dsn, target_dsn, monkeypatch):
    subprocess.run(["pgbench", "-i", "-I", "dtp", "-q", source_dsn], check=True, capture_output=True)
    execute(source_dsn, "ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
    world = World(spark, store, tmp_path, source_dsn, target_dsn, monkeypatch)
    assert world.cli("add", "source", "PG") == 0
    assert world.cli("target", "create") == 0
    execute(source_dsn, "INSERT INTO pgbench_branches VALUES (1, 0)",
            "INSERT INTO pgbench_tellers SELECT g, 1, 0 FROM generate_series(1, 10) g",
            f"INSERT INTO pgbench_accounts SELECT g, 1, g % 97, 'account ' || g FROM generate_series(1, {ACCOUNTS}) g",
            "INSERT INTO pgbench_history VALUES (1, 1, 1, 5, '2026-11-01 10:00:00+05:30'),"
            " (1, 1, 2, 5, '2026-11-01 10:00:00+05:30')")
    world.pipeline()
    assert digests(target_dsn, TABLES) == digests(source_dsn, TABLES)
    return world


@pytest.mark.long_running(55)
def test_in_sync_while_pgbench_writes_then_rows_changed_behind_the_replicats_back_are_reported_and_repaired(
        world, tmp_path, capsys, monkeypatch):
    script = tmp_path / "transfer.sql"
    script.write_text(TRANSFER)
    writer = subprocess.Popen(["pgbench", "-n", "-c", "2", "-T", "6", "-f", str(script), world.source],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        during = world.compare(catch_up=world.pipeline, wait_seconds=120)
    finally:
        output, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0, output
    assert during.out_of_sync == 0, during.describe()
    assert during.rounds >= 1 and any(t.ranges_differing for t in during.tables), \
        "pgbench's changes reached the compare before the replicat: the confirm step decided them"
    tables = {t.spec.source: t for t in during.tables}
    assert set(tables) == {f"{s}.{t}" for s, t in TABLES}
    assert tables["public.pgbench_accounts"].ranges == ACCOUNTS // 1000
    assert all(t.in_sync + t.in_flight_rows == t.rows_compared for t in during.tables)
    assert tables["public.pgbench_accounts"].rows_compared >= ACCOUNTS

    world.pipeline()  # pgbench has ended: everything reaches the target
    after = world.compare(wait_seconds=0)
    assert (after.out_of_sync, after.in_flight) == (0, 0), after.describe()
    counts = {f"{s}.{t}": n for (s, t), n in zip(TABLES, (query(world.source, f"SELECT count(*) FROM {s}.{t}")[0][0]
                                                           for s, t in TABLES))}
    assert {t.spec.source: (t.rows_compared, t.in_sync) for t in after.tables} == \
        {name: (n, n) for name, n in counts.items()}
    assert {t.spec.source: t.ranges_differing for t in after.tables} == {name: 0 for name in counts}

    # Rows changed, deleted and inserted in the target behind the replicat's back.
    execute(world.target,
            "UPDATE pgbench_accounts SET abalance = -1, filler = 'tampered' WHERE aid = 5",
            "UPDATE pgbench_tellers SET tbalance = 99 WHERE tid = 3",
            "DELETE FROM pgbench_accounts WHERE aid IN (7, 4500)",
            "INSERT INTO pgbench_accounts VALUES (900001, 1, 0, 'extra'), (0, 1, 0, 'below the first key')",
            "DELETE FROM pgbench_history WHERE aid = 2 AND delta = 5 AND mtime = '2026-11-01 10:00:00'",
            "INSERT INTO pgbench_history VALUES (2, 1, 2, 7, NULL)")
    # The source keeps changing too: those are in flight until the pipeline applies them.
    execute(world.source, "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN 100 AND 110",
            "DELETE FROM pgbench_accounts WHERE aid = 200")

    capsys.readouterr()
    repair_path = tmp_path / "repair.sql"
    # The command line, with the pipeline's stages run while the compare waits for the
    # replicat (in production the Airflow DAGs run them on their schedules).
    monkeypatch.setattr(compare_run, "compare", functools.partial(compare_run.compare, catch_up=world.pipeline))
    status = world.cli("compare", "PG", "REP1", "--chunk-rows", "1000", "--report-dir", str(tmp_path / "reports"),
                       "--repair-script", str(repair_path), "--fail-on-difference")
    out, err = capsys.readouterr()
    assert status == 1 and "8 row(s) out of sync" in err, out + err
    assert world.rounds >= 2, "the differences were confirmed after the replicat got past them"
    assert "OUT OF SYNC: 8 row(s)" in out
    assert "missing in target  aid=7" in out and "missing in target  aid=4500" in out
    assert "extra in target    aid=900001" in out and "extra in target    aid=0" in out
    assert "different          aid=5: abalance, filler" in out and "different          tid=3: tbalance" in out
    assert "aid=100" not in out and "aid=200" not in out, "in-flight source changes are not differences"

    with world.store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.compare_table WHERE run_id = (SELECT max(run_id) FROM"
                    " trailbound.compare_run) ORDER BY source_table")
        figures = {r["source_table"]: (r["missing"], r["extra"], r["different"], r["in_flight"]) for r in cur.fetchall()}
        cur.execute("SELECT source_table, kind, key, columns FROM trailbound.compare_row WHERE run_id ="
                    " (SELECT max(run_id) FROM trailbound.compare_run) ORDER BY source_table, kind, key::text")
        rows = [(r["source_table"], r["kind"], r["key"], r["columns"]) for r in cur.fetchall()]
        cur.execute("SELECT report_file, out_of_sync FROM trailbound.compare_run ORDER BY run_id DESC LIMIT 1")
        run = cur.fetchone()
    assert figures == {"public.pgbench_accounts": (2, 2, 1, 0), "public.pgbench_branches": (0, 0, 0, 0),
                       "public.pgbench_history": (1, 1, 0, 0), "public.pgbench_tellers": (0, 0, 1, 0)}
    accounts = [(kind, key["aid"], columns) for table, kind, key, columns in rows if table == "public.pgbench_accounts"]
    assert sorted(accounts) == [("different", "5", ["abalance", "filler"]), ("extra", "0", None),
                                ("extra", "900001", None), ("missing", "4500", None), ("missing", "7", None)]
    history = sorted((kind, key["aid"], key["delta"], key["mtime"]) for table, kind, key, _ in rows
                     if table == "public.pgbench_history")
    assert history == [("extra", "2", "7", None), ("missing", "2", "5", "2026-11-01 10:00:00")]
    report = json.loads(open(run["report_file"]).read())
    assert report["out_of_sync"] == run["out_of_sync"] == 8
    assert open(run["report_file"][:-len(".json")] + ".txt").read().startswith("COMPARE PG -> replicat REP1")

    script = repair_path.read_text()
    assert 'UPDATE "public"."pgbench_accounts" SET "abalance" = ' in script and "BEGIN;" in script
    execute(world.target, script)
    again = world.compare(wait_seconds=0)
    assert (again.out_of_sync, again.in_flight) == (0, 0), again.describe()
    assert digests(world.target, TABLES) == digests(world.source, TABLES)

    # A change the target refuses, set aside by REPERROR: the compare says which table's
    # differences discards may explain, until they are reapplied.
    document = yaml.safe_load(world.config_path.read_text())
    document["replicats"]["REP1"]["reperror"] = [{"sqlstate": "23514", "action": "discard"}]
    world.config_path.write_text(yaml.safe_dump(document))
    world.config = configuration.load(world.config_path)
    execute(world.target, "ALTER TABLE pgbench_tellers ADD CONSTRAINT small CHECK (tbalance < 1000000)")
    execute(world.source, "UPDATE pgbench_tellers SET tbalance = 5000000 WHERE tid = 4")
    world.pipeline()
    discarded = world.compare(catch_up=world.pipeline, wait_seconds=120)  # confirmed once the replicat is past it
    assert (discarded.out_of_sync, discarded.discarded) == (1, {"public.pgbench_tellers": 1}), discarded.describe()
    assert "1 discarded operation(s) outstanding on public.pgbench_tellers" in discarded.describe()
    execute(world.target, "ALTER TABLE pgbench_tellers DROP CONSTRAINT small")
    assert world.cli("discards", "REP1", "--reapply") == 0
    converged = world.compare(wait_seconds=0)
    assert (converged.out_of_sync, converged.discarded) == (0, {}), converged.describe()
    assert "discarded" not in converged.describe()
    assert digests(world.target, TABLES) == digests(world.source, TABLES)


@pytest.mark.long_running(85)
def test_the_compare_dag_and_the_replicat_dags_check_confirm_a_difference_across_runs(
        spark, store, tmp_path, source_dsn, target_dsn, monkeypatch, request, spark_remote):
    """Airflow (`airflow dags test`): first the load DAG, triggered by hand in snapshot mode
    before the first pull, copies the source's rows into the target, its progress lines in
    the task log; the replicat takes over after the snapshot. Then the compare DAG,
    triggered with a table pattern and no wait, finds two rows changed behind the replicat's back on an idle source; the
    replicat is not past them yet, so they are in flight and the run succeeds. After the
    pipeline has run once more (nothing to apply, but capture reads past them), the
    replicat DAG's Great Expectations check compares again and confirms both: it fails."""
    from test_dags import AirflowWorld, as_uri

    execute(source_dsn, "CREATE TABLE public.items (id int PRIMARY KEY, note text)",
            "CREATE TABLE public.other (id int PRIMARY KEY)")
    world = World(spark, store, tmp_path, source_dsn, target_dsn, monkeypatch)
    world.config_path = write_config(tmp_path, tables=("public.items", "public.other"))
    world.config = configuration.load(world.config_path)
    assert world.cli("add", "source", "PG") == 0
    assert world.cli("target", "create") == 0
    execute(source_dsn, "INSERT INTO public.items SELECT g, 'n' || g FROM generate_series(1, 500) g",
            "INSERT INTO public.other SELECT generate_series(1, 30)")

    airflow = AirflowWorld(tmp_path, world.config_path, store.connection.dsn, target_dsn, spark_remote)
    airflow.env.pop(SOURCE_ENV, None)
    airflow.env["AIRFLOW_CONN_SOURCE_PG"] = as_uri(source_dsn)  # the DAGs find the source through its connection
    assert (airflow.dags / "compare_pg_rep1.py").exists() and (airflow.dags / "load_pg_rep1.py").exists()

    request.addfinalizer(airflow.close)

    def dags_test(dag_id: str, conf: dict | None = None) -> tuple[str, str]:
        from datetime import UTC, datetime

        return airflow.run_dag(dag_id, datetime.now(UTC).replace(microsecond=0), conf)

    tables = [("public", "items"), ("public", "other")]
    state, output = dags_test("load_pg_rep1", {"table": "public.*", "chunk_rows": 200, "mode": "snapshot"})
    assert state == "success", output[-3000:]
    assert "exported snapshot" in output, output[-3000:]  # the task log shows the load as it goes
    assert "public.items -> public.items: 3 chunk(s) of about 200 rows" in output, output[-3000:]
    assert "public.items -> public.items: 3/3 chunks, 500 of about" in output, output[-3000:]
    assert "public.other -> public.other: 1/1 chunks, 30 of about" in output, output[-3000:]
    assert digests(target_dsn, tables) == digests(source_dsn, tables)
    execute(source_dsn, "UPDATE public.items SET note = 'after the load' WHERE id = 1")
    world.pipeline()  # the replicat takes over after the snapshot: the later change, once
    assert digests(target_dsn, tables) == digests(source_dsn, tables)
    execute(target_dsn, "UPDATE public.items SET note = 'changed' WHERE id = 3", "DELETE FROM public.items WHERE id = 4")

    state, output = dags_test("compare_pg_rep1", {"table": "public.items", "wait_seconds": 0})
    assert state == "success", output[-3000:]
    assert "2 row(s) in flight" in output and "tables public.items: IN SYNC" in output, output[-3000:]
    assert "NOTE 2 row(s) still in flight" in output and "it did not get past them within 0 s" in output

    world.pipeline()
    state, output = dags_test("replicat_rep1")
    assert state == "failed", output[-3000:]
    assert "FAILED: 2 target tables against source PG" in output and "differing: public.items" in output, \
        output[-3000:]
    with store.transaction() as cur:
        cur.execute("SELECT r.kind, r.key->>'id' AS id FROM trailbound.compare_row r WHERE r.run_id ="
                    " (SELECT max(run_id) FROM trailbound.compare_run) ORDER BY 2")
        assert [(r["kind"], r["id"]) for r in cur.fetchall()] == [("different", "3"), ("missing", "4")]


def test_compare_refuses_a_source_without_postgres_and_a_replicat_of_another_source(tmp_path, capsys):
    config_path = tmp_path / "trailbound.yaml"
    config_path.write_text(f"home: {tmp_path}\nsources:\n  SIM:\n    altarchivelogdest: a\n"
                           "  PG:\n    altarchivelogdest: b\n    postgres: {dsn_env: X, conn_id: x, slot: s, "
                           "publication: p, table: ['public.*']}\n"
                           "replicats:\n  REP1: {exttrail: rt, source: SIM}\n  REP2: {exttrail: rt2, source: PG}\n")
    assert cli.main(["--config", str(config_path), "compare", "SIM", "REP1"]) == 1
    assert "source SIM has no postgres: block" in capsys.readouterr().err
    assert cli.main(["--config", str(config_path), "compare", "PG", "REP1"]) == 1
    assert "replicat REP1 applies source SIM, not PG" in capsys.readouterr().err
    assert cli.main(["--config", str(config_path), "compare", "PG", "REP9"]) == 1
    assert "no replicat named 'REP9'" in capsys.readouterr().err


def test_a_row_changed_and_changed_back_while_the_target_holds_the_change_between_is_in_flight_not_out_of_sync(
        world):
    """A source row read at one image, changed, the change applied, then changed back to the
    first image (pgbench's balances do: +d then -d): the target holds the middle image
    while the source shows the one first read. Judged by its image alone the source was
    "unchanged", and the row was reported out of sync (a suite run under load saw it); by
    its version (xmin) it changed, so it stays in flight until the replicat applies the
    change back, and then it is in sync."""
    execute(world.source, "UPDATE pgbench_accounts SET abalance = 111 WHERE aid = 42")  # not applied yet

    def catch_up() -> None:
        if world.rounds == 1:  # the first catch-up: a change and its undoing around one pass
            execute(world.source, "UPDATE pgbench_accounts SET abalance = 222 WHERE aid = 42")
            world.pipeline()
            assert query(world.target, "SELECT abalance FROM pgbench_accounts WHERE aid = 42")[0][0] == 222
            execute(world.source, "UPDATE pgbench_accounts SET abalance = 111 WHERE aid = 42")
        else:
            world.pipeline()

    report = world.compare(catch_up=catch_up, wait_seconds=120)
    assert report.out_of_sync == 0, report.describe()
    assert world.rounds >= 3 and report.rounds >= 2, "the row was decided before the change back was applied"
    assert query(world.target, "SELECT abalance FROM pgbench_accounts WHERE aid = 42")[0][0] == 111


def test_a_row_changed_and_changed_back_between_two_compares_is_not_confirmed_from_the_first_ones_position(world):
    """The next compare confirms an in-flight row from the older read position only when
    the row is the same version: changed and changed back between two compares (the target
    holding the change between), it showed its first image again and was confirmed out of
    sync from the first compare's position."""
    execute(world.source, "UPDATE pgbench_accounts SET abalance = 111 WHERE aid = 43")  # not applied yet
    first = world.compare(wait_seconds=0)
    assert (first.out_of_sync, first.in_flight) == (0, 1), first.describe()
    execute(world.source, "UPDATE pgbench_accounts SET abalance = 222 WHERE aid = 43")
    world.pipeline()
    execute(world.source, "UPDATE pgbench_accounts SET abalance = 111 WHERE aid = 43")  # back: not applied yet
    second = world.compare(wait_seconds=0)
    assert (second.out_of_sync, second.in_flight) == (0, 1), second.describe()
    world.pipeline()
    assert world.compare(wait_seconds=0).out_of_sync == 0
