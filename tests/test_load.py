"""`trailbound load` against a live PostgreSQL source, with pgbench writing all along.

Snapshot: 100,000+ rows loaded at the snapshot exported with the slot while pgbench
runs, then the pipeline hands over (replicat positioned at the consistent point): the
target equals the source, table by table (digests computed in SQL on both servers).
A second snapshot load, after a pull, is refused.

Watermark (DBLog): a table added to the publication later is loaded between watermarks
while pgbench updates, deletes and inserts its rows and replication goes on; the load is
killed (kill -9 at a crash point) after its first chunks, replicat applies what was
done, `info replicat` shows the load in progress, the load resumes from its first chunk
not done, and at the end the target equals the source.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest

from pg_source_kit import (SOURCE_ENV, digests, execute, pgbench, query, source_dsn,  # noqa: F401
                           source_server, write_config)
from replicat_kit import checkpoint_row
from trailbound import cli
from trailbound import config as configuration
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.grouplock import AdvisoryLock
from trailbound.replicat.loadinfo import load_lock_key
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn
from trailbound.pump.run import run_pump
from trailbound.replicat.run import run_replicat
from trailbound.sources.postgres.admin import pull

pytestmark = [pytest.mark.spark, pytest.mark.pg]

PGBENCH = [("public", "pgbench_accounts"), ("public", "pgbench_branches"), ("public", "pgbench_tellers"),
           ("public", "pgbench_history")]
WATERMARK = "trailbound.load_watermark"


def _run(config_path: Path, *words: str) -> int:
    return cli.main(["--config", str(config_path), *words])


def _config(tmp_path: Path, tables, *, handlecollisions: bool = False) -> Path:
    path = write_config(tmp_path, tables=tables)
    if handlecollisions:
        # GoldenGate's initial-load practice: rows not loaded yet are updated by the log
        path.write_text(path.read_text().replace("grouptransops: 500}", "grouptransops: 500, handlecollisions: true}"))
    return path


def _round(spark, store, config_path: Path, target: str):
    config = configuration.load(config_path)
    pull(config, "PG")
    run_extract(spark, store, config, "EXT1")
    run_pump(None, store, config, "PMP1")
    return run_replicat(spark, store, config, "REP1", target_dsn=target)


def _environment(monkeypatch, source: str, target: str, metadata: str) -> None:
    monkeypatch.setenv(SOURCE_ENV, source)
    monkeypatch.setenv(configuration.TARGET_DSN_ENV, target)
    monkeypatch.setenv(configuration.METADATA_DSN_ENV, metadata)


@pytest.mark.long_running(35)
def test_snapshot_load_while_pgbench_runs(source_dsn, target_dsn, metadata_dsn, store, spark, tmp_path, monkeypatch,
                                          capsys):
    _environment(monkeypatch, source_dsn, target_dsn, metadata_dsn)
    config_path = _config(tmp_path, ("public.pgbench_*",))
    pgbench(source_dsn, "-i", "-I", "dtgp", "-s", "1", "-q")  # 100,000 accounts
    execute(source_dsn, "ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
    pgbench(source_dsn, "-n", "-c", "2", "-t", "200")  # some history rows too
    assert _run(config_path, "add", "source", "PG") == 0
    assert _run(config_path, "target", "create") == 0
    capsys.readouterr()

    bench = subprocess.Popen(["pgbench", "-n", "-c", "2", "-T", "300", "-R", "50", source_dsn],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert _run(config_path, "load", "PG", "REP1", "--chunk-rows", "15000") == 0
        assert bench.poll() is None, "pgbench ran during the whole load"
        out = capsys.readouterr().out
    finally:
        bench.send_signal(signal.SIGINT)
        bench.wait(timeout=60)
    assert "exported snapshot" in out and "public.pgbench_accounts -> public.pgbench_accounts: 7 chunk(s)" in out
    assert "public.pgbench_accounts -> public.pgbench_accounts: 7/7 chunks, 100000 of about" in out
    consistent = query(source_dsn, "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots")[0][0]
    assert f"atcsn {int(consistent)}" in out
    loaded = digests(target_dsn, PGBENCH)
    assert loaded["public.pgbench_accounts"][0] == 100_000

    # The hand-over: the log from the consistent point on, applied exactly once.
    config = configuration.load(config_path)
    _round(spark, store, config_path, target_dsn)
    assert digests(target_dsn, PGBENCH) == digests(source_dsn, PGBENCH)
    assert Csn.parse(checkpoint_row(target_dsn)["log_csn"]).scn > int(consistent)
    assert query(source_dsn, "SELECT count(*) FROM pgbench_history")[0][0] > 400  # pgbench wrote during the load

    # Once something was pulled, a snapshot load would lose the log in between: refused.
    assert _run(config_path, "load", "PG", "REP1") == 1
    assert "segment(s) already pulled" in capsys.readouterr().err and config.archive_dir("PG").is_dir()


ORDERS = """
CREATE TABLE items (id bigserial PRIMARY KEY, v integer NOT NULL);
CREATE TABLE orders (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, qty integer NOT NULL, note text,
                     placed timestamptz NOT NULL DEFAULT now(), price numeric(10, 2));
INSERT INTO orders (id, qty, note, placed, price)
SELECT g, g % 7, md5(g::text), timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second', g / 100.0
  FROM generate_series(1, 40000) g;
SELECT setval(pg_get_serial_sequence('orders', 'id'), 200000);
"""
CHURN = """\\set id random(1, 40000)
\\set gone random(1, 40000)
UPDATE orders SET qty = qty + 1, note = md5(random()::text) WHERE id = :id;
DELETE FROM orders WHERE id = :gone;
INSERT INTO orders (qty, note) VALUES (:id % 5, 'new');
INSERT INTO items (v) VALUES (:id);
"""


def _load_subprocess(config_path: Path, crash: str | None, driver) -> subprocess.CompletedProcess:
    """`trailbound load` in a process of its own, to be killed at `crash`; its Spark jobs
    run on `driver` (crash_kit.ConnectCrashDriver), the worker's warm Connect server, not
    on a JVM of its own (a cold start each)."""
    env = {**os.environ, **driver.env}
    if crash:
        env[CRASH_ENV] = crash
    return subprocess.run(driver.cli("--config", str(config_path), "load", "PG", "REP1", "--table", "public.orders",
                                     "--mode", "watermark", "--chunk-rows", "5000"),
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.long_running(65)
def test_watermark_load_of_a_table_added_later_killed_and_resumed(source_dsn, target_dsn, metadata_dsn, store, spark,
                                                                  tmp_path, monkeypatch, capsys, crash_driver):
    _environment(monkeypatch, source_dsn, target_dsn, metadata_dsn)
    execute(source_dsn, ORDERS)
    config_path = _config(tmp_path, ("public.items", WATERMARK), handlecollisions=True)
    assert _run(config_path, "add", "source", "PG") == 0
    assert _run(config_path, "target", "create") == 0
    execute(source_dsn, "INSERT INTO items (v) SELECT g FROM generate_series(1, 500) g")
    _round(spark, store, config_path, target_dsn)  # replication is going on

    # orders joins the publication; its 40,000 existing rows are not in the log
    config_path = _config(tmp_path, ("public.items", "public.orders", WATERMARK), handlecollisions=True)
    assert _run(config_path, "add", "source", "PG", "--refresh-defs") == 0
    assert _run(config_path, "target", "create") == 0
    capsys.readouterr()
    bench_script = tmp_path / "churn.sql"
    bench_script.write_text(CHURN)
    bench = subprocess.Popen(["pgbench", "-n", "-c", "2", "-T", "600", "-R", "10", "-f", str(bench_script),
                              source_dsn], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        killed = _load_subprocess(config_path, "load_between_chunks", crash_driver)
        assert killed.returncode == 137, killed.stderr[-3000:]
        planned = re.search(r"public.orders -> public.orders: (\d+) chunk\(s\)", killed.stdout)
        assert "between watermarks" in killed.stdout and planned, killed.stdout
        (done, chunks), = query(metadata_dsn, "SELECT count(*) FILTER (WHERE state = 'done'), count(*)"
                                              " FROM trailbound.load_chunk")
        # 40,000 rows in 5,000-row ranges, and one more for what pgbench inserted above them
        assert 0 < done < chunks == int(planned.group(1)) and chunks in (8, 9)

        _round(spark, store, config_path, target_dsn)  # applies the windows closed so far
        partly = query(target_dsn, "SELECT count(*) FROM orders")[0][0]
        assert 0 < partly < 40_000
        assert _run(config_path, "info", "replicat", "REP1") == 0
        info = capsys.readouterr().out
        assert "Load in progress" in info and "no process holds it" in info and "public.orders" in info

        # A load of the group running elsewhere (holding its lock, on a session of its own): refused.
        with MetadataStore.open(metadata_dsn) as other, AdvisoryLock(other, load_lock_key("REP1"), "held", wait=None):
            assert _run(config_path, "load", "PG", "REP1", "--table", "public.orders", "--mode", "watermark") == 1
            assert "a load for replicat REP1 is running" in capsys.readouterr().err
        assert _run(config_path, "load", "PG", "REP1", "--table", "public.orders", "--mode", "watermark",
                    "--chunk-rows", "5000") == 0
        out = capsys.readouterr().out
        assert "resuming" in out and "resumed" in out and f"{chunks}/{chunks} chunks" in out
        assert bench.poll() is None, "pgbench ran all through the load"
    finally:
        bench.send_signal(signal.SIGINT)
        bench.wait(timeout=60)
    _round(spark, store, config_path, target_dsn)
    tables = [("public", "orders"), ("public", "items")]
    assert digests(target_dsn, tables) == digests(source_dsn, tables)
    assert query(target_dsn, "SELECT count(*) FROM trailbound_load.open_window")[0][0] == 0
    assert query(target_dsn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'trailbound_load'"
                             " AND tablename LIKE 'w\\_%%'")[0][0] == 0, "every staging table is gone"
    # With no window open any more, inserts go to parallel sessions again (docs/replicat.md).
    for first in range(10_001, 10_301, 5):
        execute(source_dsn, f"INSERT INTO items (v) SELECT g FROM generate_series({first}, {first + 4}) g")
    result = _round(spark, store, config_path, target_dsn)
    assert result.parallel_groups > 0, result.describe()
    assert digests(target_dsn, tables) == digests(source_dsn, tables)


def test_a_high_watermark_ends_its_replicat_group():
    """The window's chunk goes in right after its high watermark: no later transaction
    shares that target transaction (pure planning, no server)."""
    import pyarrow as pa

    from trailbound.replicat.chunks import TrailFile, plan_chunk
    from trailbound.trail import format as trail

    def txn(number, op, table, after):
        return {"rba": number, "trans_ind": trail.WHOLE, "csn": 10 * number, "csn_thread": 1, "csn_sequence": 1,
                "csn_rba": number, "xid": f"T{number}", "commit_ts": datetime(2026, 1, 1, tzinfo=UTC), "op": op,
                "table": table, "before": None, "after": after, "src_thread": 1, "src_sequence": 1, "src_rba": number,
                "src_scn": 10 * number - 1, "log_bsn": 5}

    row = '{"id":1}'
    records = pa.Table.from_pylist([
        txn(0, "INSERT", "public.orders", row),
        txn(1, "INSERT", WATERMARK, '{"window_id":"a","mark":"low"}'),
        txn(2, "INSERT", "public.orders", row),
        txn(3, "UPDATE", WATERMARK, '{"window_id":"a","source_table":"public.orders","mark":"high"}'),
        txn(4, "INSERT", "public.orders", row),
    ], schema=trail.SCHEMA)
    chunk = plan_chunk([TrailFile(1, "lt000000001", len(records), "")], [records], None, grouptransops=100)
    assert [g.txns for g in chunk.groups] == [[0, 1, 2, 3], [4]]


def test_key_ranges_cover_a_composite_key_once_each(target_dsn):
    """The shared planner (trailbound/keyranges.py) on a composite key with awkward
    text (quotes, case, accents, a timestamp): every row falls in exactly one range, the
    ranges follow the key's order and hold about N rows each."""
    import psycopg2
    from psycopg2 import sql

    from trailbound.load.copy import SESSION
    from trailbound import keyranges

    execute(target_dsn, 'CREATE SCHEMA "Odd"',
            'CREATE TABLE "Odd"."Key Table" ("Name" text, at timestamptz, n int, PRIMARY KEY ("Name", at))',
            """INSERT INTO "Odd"."Key Table" SELECT (ARRAY['a''b', 'Ä', 'z "q"', 'B'])[g % 4 + 1],
                      timestamptz '2026-01-01 00:00:00+05:30' + g * interval '1.5 second', g
                 FROM generate_series(1, 1000) g""")
    connection = psycopg2.connect(target_dsn, options=SESSION)
    with connection.cursor() as cur:
        key = keyranges.primary_key(cur, "Odd", "Key Table")
        assert key == ["Name", "at"]
        ranges = keyranges.plan(cur, "Odd", "Key Table", key, 97)
        assert len(ranges) == 11 and ranges[0].lo is None and ranges[-1].hi is None
        assert all(a.hi == b.lo for a, b in zip(ranges, ranges[1:]))
        seen = []
        for key_range in ranges:
            condition, params = keyranges.condition("Odd", "Key Table", key, key_range)
            cur.execute(sql.SQL('SELECT n FROM "Odd"."Key Table" WHERE {} ORDER BY {}').format(
                condition, keyranges.order_by(key)), params)
            rows = [n for (n,) in cur.fetchall()]
            assert 0 < len(rows) <= 97
            seen += rows
    connection.close()
    assert sorted(seen) == list(range(1, 1001))
