"""A live PostgreSQL source end to end: `add source`, pgbench writing (savepoints, rollbacks
to them, whole rollbacks, key updates), a table without a key (REPLICA IDENTITY FULL), a
quoted mixed-case name with TOASTed text, bytea, jsonb, arrays, timestamptz, a streamed
transaction held open across rounds, TRUNCATE; after every round `archive pull`,
`extract run`, `pump run`, `replicat run`, and the target equals the source table by table
(digests computed in SQL on both servers) with the checkpoint row at the last commit LSN.
Pulls killed between a segment and its manifest and between the manifest and the slot's
confirmation, and a pull whose replication session the source ends, converge on the rerun
(that pull stopping with one line); the slot is never confirmed past the archive. Every
refusal leaves nothing behind. The source server's TimeZone, DateStyle, bytea_output and
extra_float_digits are all unlike the archive's forms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg2
import pyarrow.parquet as pq
import pytest

from pg_source_kit import (SOURCE_ENV, digests, execute, pgbench, query, slot_confirmed, source_dsn,  # noqa: F401
                           source_server, write_config)
from replicat_kit import checkpoint_row
from trailbound import cli
from trailbound import config as configuration
from trailbound.archive.segments import discover
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.positions import Csn
from trailbound.pump.run import run_pump
from trailbound.replicat.run import run_replicat
from trailbound.sources.postgres.lsn import Lsn

pytestmark = [pytest.mark.spark, pytest.mark.pg]

TABLES = [("public", "pgbench_accounts"), ("public", "pgbench_branches"), ("public", "pgbench_tellers"),
          ("public", "pgbench_history"), ("Mixed", "Odd Name")]

TRANSFER = """\\set aid random(1, 100000)
\\set bid 1
\\set tid random(1, 10)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SAVEPOINT teller;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
ROLLBACK TO SAVEPOINT teller;
SAVEPOINT kept;
UPDATE pgbench_tellers SET tbalance = tbalance - :delta WHERE tid = :tid;
RELEASE SAVEPOINT kept;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
"""
ROLLED_BACK = """\\set aid random(1, 100000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance - 1 WHERE aid = :aid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, :aid, -1, CURRENT_TIMESTAMP);
ROLLBACK;
"""
MOVE_KEY = """\\set aid random(1, 100000)
UPDATE pgbench_accounts SET aid = aid + 1000000 WHERE aid = :aid;
UPDATE "Mixed"."Odd Name" SET id = id + 1000000 WHERE id = :aid % 200 + 1;
"""
ODD = """
CREATE SCHEMA "Mixed";
CREATE TABLE "Mixed"."Odd Name" (id bigint PRIMARY KEY, "Body Text" text, data bytea, doc jsonb, tags int[],
  at timestamptz, ratio float8, price numeric(12, 3), flag boolean, note varchar(20));
"""
ODD_ROWS = """
INSERT INTO "Mixed"."Odd Name"
SELECT g, CASE WHEN g %% %(toast)s = 0 THEN (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 120) i)
               ELSE 'héllo ✓ ' || g END,
       decode(md5(g::text), 'hex'), jsonb_build_object('g', g, 'tags', jsonb_build_array('a', g)),
       ARRAY[g, g + 1], timestamptz '2026-11-01 10:00:00+05:30' + g * interval '1 minute',
       1.0 / (g + 2), g * 1.125, g %% 2 = 0, NULL
  FROM generate_series(%(first)s, %(last)s) g
"""


NEVER = 10 ** 9  # no TOASTed row: a transaction with a TOAST change in progress cannot stream, it spills


def _run(config_path: Path, *words: str) -> int:
    return cli.main(["--config", str(config_path), *words])


def _pull_subprocess(config_path: Path, source: str, crash: str | None = None) -> subprocess.CompletedProcess:
    return _killed(config_path, source, crash, "archive", "pull", "PG")


def _killed(config_path: Path, source: str, crash: str | None, *words: str, driver=None) -> subprocess.CompletedProcess:
    """`trailbound WORDS` in a process of its own, killed (exit 137) at crash point `crash`;
    a Spark stage's process runs on `driver` (crash_kit.ConnectCrashDriver) when one is given."""
    env = {**os.environ, SOURCE_ENV: source, **(driver.env if driver else {})}
    if crash:
        env[CRASH_ENV] = crash
    command = ["--config", str(config_path), *words]
    return subprocess.run(driver.cli(*command) if driver else [sys.executable, "-m", "trailbound.cli", *command],
                          env=env, capture_output=True, text=True, timeout=600)


def _archive_end(archive: Path) -> int:
    return discover(archive)[-1].next_scn.value


def _records(archive: Path) -> list[dict]:
    rows = []
    for segment in discover(archive):
        rows += pq.read_table(segment.path).to_pylist()
    return rows


def _assert_slot_within_archive(source: str, archive: Path) -> None:
    assert slot_confirmed(source) <= _archive_end(archive), "the slot was confirmed past the archive"


class Pipeline:
    def __init__(self, spark, store, config, source, target):
        self.spark, self.store, self.config, self.source, self.target = spark, store, config, source, target

    def round(self) -> None:
        """capture, pump, replicat; then the target equals the source, the checkpoint row
        is at the archive's last COMMIT."""
        run_extract(self.spark, self.store, self.config, "EXT1")
        run_pump(None, self.store, self.config, "PMP1")
        run_replicat(self.spark, self.store, self.config, "REP1", target_dsn=self.target)
        assert digests(self.target, TABLES) == digests(self.source, TABLES)
        archive = self.config.archive_dir("PG")
        last_commit = max(r["scn"] for r in _records(archive) if r["op"] == "COMMIT")
        assert Csn.parse(checkpoint_row(self.target)["log_csn"]).scn == last_commit


@pytest.mark.long_running(105)
def test_pgbench_through_the_whole_pipeline(source_dsn, target_dsn, store, spark, tmp_path, monkeypatch, capsys,
                                            crash_driver):
    source = source_dsn
    monkeypatch.setenv(SOURCE_ENV, source)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)  # for the killed stages' processes
    config_path = write_config(tmp_path)
    config = configuration.load(config_path)
    archive = config.archive_dir("PG")
    pgbench(source, "-i", "-I", "dtp", "-q")
    execute(source, "ALTER TABLE pgbench_history REPLICA IDENTITY FULL", ODD)
    assert _run(config_path, "add", "source", "PG") == 0
    added = capsys.readouterr().out
    assert "slot trailbound_pg (pgoutput) consistent at" in added
    defs = json.loads((archive / "defs.json").read_text())["tables"]
    odd = next(t for t in defs if t["name"] == "Mixed.Odd Name")
    assert odd["key"] == ["id"] and odd["columns"][0] == {"name": "id", "type": "bigint", "nullable": False}
    assert [c["type"] for c in odd["columns"]][1:] == ["text", "bytea", "jsonb", "integer[]",
                                                       "timestamp with time zone", "double precision",
                                                       "numeric(12,3)", "boolean", "character varying(20)"]
    assert next(t for t in defs if t["name"] == "public.pgbench_history")["key"] == []
    assert _run(config_path, "target", "create") == 0
    pipeline = Pipeline(spark, store, config, source, target_dsn)

    # Round 1: pgbench's data load (TRUNCATE, then COPY of 100,000 rows: one streamed
    # transaction, many rows per WAL record), mixed values, a transaction left open.
    pgbench(source, "-i", "-I", "g", "-q")
    execute(source, ODD_ROWS, args={"first": 1, "last": 300, "toast": 10})
    held = psycopg2.connect(source)
    cur = held.cursor()
    cur.execute(ODD_ROWS, {"first": 5001, "last": 5600, "toast": NEVER})  # > 64kB: streamed before it commits
    cur.execute("SAVEPOINT a")
    cur.execute(ODD_ROWS, {"first": 6001, "last": 6300, "toast": NEVER})
    cur.execute("ROLLBACK TO SAVEPOINT a")
    assert _run(config_path, "archive", "pull", "PG") == 0
    summary = capsys.readouterr().out
    assert "streamed transaction(s) open" in summary and " 1 streamed transaction(s) open" in summary
    _assert_slot_within_archive(source, archive)
    pipeline.round()
    records = _records(archive)
    first = next(json.loads(r["after"]) for r in records if r["table"] == "Mixed.Odd Name" and r["op"] == "INSERT")
    assert first["at"] == "2026-11-01 04:31:00+00" and first["data"].startswith("\\x")
    assert isinstance(first["ratio"], float) and first["price"] == "1.125" and first["tags"] == "{1,2}"
    assert first["flag"] is False and first["doc"] == '{"g": 1, "tags": ["a", 1]}'
    assert {r["op"] for r in records if r["table"] == "public.pgbench_accounts"} == {"TRUNCATE", "INSERT"}

    # Round 2: pgbench transfers with savepoints, rollbacks, key moves; the held
    # transaction streams more and rolls a savepoint back after streaming it; the pull is
    # killed between a segment and its manifest, then run again.
    pgbench(source, "-n", "-c", "2", "-t", "150", "-M", "prepared", tmp_path=tmp_path,
            scripts={"transfer": TRANSFER, "rolled_back": ROLLED_BACK, "move_key": MOVE_KEY})
    cur.execute("SAVEPOINT b")
    cur.execute(ODD_ROWS, {"first": 7001, "last": 7700, "toast": NEVER})
    cur.execute("ROLLBACK TO SAVEPOINT b")
    cur.execute(ODD_ROWS, {"first": 8001, "last": 8100, "toast": NEVER})
    before = slot_confirmed(source)
    crashed = _pull_subprocess(config_path, source, "after_segment_before_manifest")
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    assert slot_confirmed(source) == before, "a killed pull confirmed nothing"
    _assert_slot_within_archive(source, archive)
    assert _run(config_path, "archive", "pull", "PG") == 0
    assert "re-sent message(s) skipped" in capsys.readouterr().out
    _assert_slot_within_archive(source, archive)
    pipeline.round()
    sub_rollbacks = [r for r in _records(archive) if r["op"] == "ROLLBACK" and r["parent_xid"]]
    assert sub_rollbacks, "a savepoint rolled back after streaming is a ROLLBACK of the subtransaction"

    # Round 3: the same, killed after the manifests, before the slot is confirmed: the
    # slot sends it all again, the archive keeps it once.
    pgbench(source, "-n", "-c", "2", "-t", "100", tmp_path=tmp_path,
            scripts={"transfer": TRANSFER, "move_key": MOVE_KEY})
    cur.execute(ODD_ROWS, {"first": 9001, "last": 9100, "toast": NEVER})
    before = slot_confirmed(source)
    crashed = _pull_subprocess(config_path, source, "after_manifest_before_confirm")
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    assert slot_confirmed(source) == before
    end_after_crash = _archive_end(archive)
    count_after_crash = len(_records(archive))
    assert _run(config_path, "archive", "pull", "PG") == 0
    _assert_slot_within_archive(source, archive)
    reread = _records(archive)
    assert all(r["scn"] >= end_after_crash for r in reread[count_after_crash:])
    # Each stage after the pull killed once (kill -9 at its commit point) on this live
    # source's archive, then the round converges: no loss, no duplicate, the row moved.
    # Each stage is killed, then run to the end before the next one is killed.
    for words, point in ((("extract", "run", "EXT1"), "after_trail_write"), (("pump", "run", "PMP1"), "after_copy"),
                         (("replicat", "run", "REP1"), "after_target_commit")):
        crashed = _killed(config_path, source, point, *words, driver=crash_driver if words[0] != "pump" else None)
        assert crashed.returncode == 137, (words, point, crashed.stderr[-2000:])
        if words[0] != "replicat":  # the round below runs replicat again
            assert _run(config_path, *words) == 0
    pipeline.round()

    # Round 4: the held transaction commits; a TRUNCATE; an idle pull; an ALTER TABLE
    # flows through as a new table version.
    cur.execute("UPDATE \"Mixed\".\"Odd Name\" SET note = 'committed' WHERE id = 5001")
    held.commit()
    held.close()
    execute(source, 'UPDATE "Mixed"."Odd Name" SET price = price + 1 WHERE id % 10 = 0',  # TOASTed body unchanged
            "TRUNCATE pgbench_history")
    assert _run(config_path, "archive", "pull", "PG") == 0
    assert " 0 streamed transaction(s) open" in capsys.readouterr().out

    # An idle source still moves next_scn (WAL written elsewhere, nothing published).
    execute(source, "CREATE TABLE unpublished (a int)", "INSERT INTO unpublished VALUES (1)")
    end = _archive_end(archive)
    assert _run(config_path, "archive", "pull", "PG") == 0
    assert _archive_end(archive) > end and discover(archive)[-1].records == 0
    assert slot_confirmed(source) == _archive_end(archive)
    capsys.readouterr()
    assert _run(config_path, "info", "source", "PG") == 0
    info = capsys.readouterr().out
    assert f"Confirmed LSN:  {Lsn(_archive_end(archive))}" in info and "Open streamed transactions: 0" in info

    # An ALTER TABLE makes a new version of the table (docs/live-postgres.md, "When a
    # table changes"): the pull goes on, replicat adds the column with its first row.
    execute(source, 'ALTER TABLE "Mixed"."Odd Name" ADD COLUMN extra int',
            'INSERT INTO "Mixed"."Odd Name" (id, extra) VALUES (-1, 42)')
    assert _run(config_path, "archive", "pull", "PG") == 0
    assert "new table version(s): Mixed.Odd Name v2" in capsys.readouterr().out
    _assert_slot_within_archive(source, archive)
    pipeline.round()

    records = _records(archive)
    odd_keys = [json.loads(r["after"])["id"] for r in records if r["table"] == "Mixed.Odd Name" and r["op"] == "INSERT"]
    committed = {*range(1, 301), *range(5001, 5601), *range(8001, 8101), *range(9001, 9101), -1}
    assert len(odd_keys) == len(set(odd_keys)) and committed <= set(odd_keys)
    toast_updates = [json.loads(r["after"]) for r in records if r["table"] == "Mixed.Odd Name"
                     and r["op"] == "UPDATE" and "price" in json.loads(r["after"])
                     and json.loads(r["after"])["id"] % 10 == 0 and json.loads(r["after"])["id"] < 1000]
    assert toast_updates and all("Body Text" not in after for after in toast_updates)
    scns = [r["scn"] for r in records]
    assert scns == sorted(scns)

    assert _run(config_path, "delete", "source", "PG") == 0
    assert query(source, "SELECT count(*) FROM pg_replication_slots")[0][0] == 0


def _nothing_written(source: str, archive: Path) -> None:
    assert not archive.exists(), "a refused add source wrote into the archive"
    assert query(source, "SELECT count(*) FROM pg_replication_slots")[0][0] == 0
    assert query(source, "SELECT count(*) FROM pg_publication")[0][0] == 0


def test_add_source_refuses_a_table_without_key_or_full_identity(source_dsn, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    config_path = write_config(tmp_path)
    pgbench(source_dsn, "-i", "-I", "dtp", "-q")
    execute(source_dsn, ODD)
    assert _run(config_path, "add", "source", "PG") == 1
    error = capsys.readouterr().err
    assert "table public.pgbench_history has neither a primary key nor REPLICA IDENTITY FULL" in error
    _nothing_written(source_dsn, tmp_path / "archive")
    # a table: pattern that names nothing is refused too
    config_path = write_config(tmp_path, tables=("nosuch.*",))
    assert _run(config_path, "add", "source", "PG") == 1
    assert "no table of the source matches table: nosuch.*" in capsys.readouterr().err
    _nothing_written(source_dsn, tmp_path / "archive")


def test_add_source_refuses_a_server_without_logical_decoding(pg_server_dsn, tmp_path, monkeypatch, capsys):
    # the suite's own server runs with the default wal_level (replica)
    database = f"nolog_{os.getpid()}"
    execute(pg_server_dsn, f'DROP DATABASE IF EXISTS "{database}"', f'CREATE DATABASE "{database}"')
    source = psycopg2.extensions.make_dsn(pg_server_dsn, dbname=database)
    try:
        execute(source, ODD)
        monkeypatch.setenv(SOURCE_ENV, source)
        config_path = write_config(tmp_path, tables=("Mixed.*",))
        assert _run(config_path, "add", "source", "PG") == 1
        error = capsys.readouterr().err
        assert "wal_level = replica" in error and "wal_level = logical" in error
        _nothing_written(source, tmp_path / "archive")
    finally:
        execute(pg_server_dsn, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_add_source_refuses_an_existing_slot_or_archive(source_dsn, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    execute(source_dsn, ODD)
    config_path = write_config(tmp_path, tables=("Mixed.*",))
    assert _run(config_path, "add", "source", "PG") == 0
    capsys.readouterr()
    defs = (tmp_path / "archive" / "defs.json").read_bytes()
    assert _run(config_path, "add", "source", "PG") == 1
    assert "replication slot trailbound_pg already exists" in capsys.readouterr().err
    assert (tmp_path / "archive" / "defs.json").read_bytes() == defs
    assert _run(config_path, "delete", "source", "PG") == 0
    assert "slot trailbound_pg dropped" in capsys.readouterr().out
    assert _run(config_path, "add", "source", "PG") == 1
    assert "already holds an archive" in capsys.readouterr().err
    assert query(source_dsn, "SELECT count(*) FROM pg_replication_slots")[0][0] == 0
    assert query(source_dsn, "SELECT count(*) FROM pg_publication")[0][0] == 0


def test_extract_run_pull_captures_while_the_pull_reads_the_slot(source_dsn, target_dsn, store, spark, tmp_path,
                                                                  monkeypatch, capsys):
    """`extract run EXT1 --pull`: the pull runs in a child process while capture rounds
    take what lands in the archive, then a last round takes the rest. The trail holds
    every committed change once: the replica equals the source. Refused: --until with
    it, and a source that is not a PostgreSQL database."""
    source = source_dsn
    monkeypatch.setenv(SOURCE_ENV, source)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    config_path = write_config(tmp_path, segment={"records": 2000})
    config = configuration.load(config_path)
    archive = config.archive_dir("PG")
    pgbench(source, "-i", "-I", "dtp", "-q")
    execute(source, "ALTER TABLE pgbench_history REPLICA IDENTITY FULL", ODD)
    assert _run(config_path, "add", "source", "PG") == 0
    assert _run(config_path, "target", "create") == 0
    pgbench(source, "-i", "-I", "g", "-q")  # 100,000 rows: many segments for the rounds to follow
    pgbench(source, "-n", "-c", "2", "-t", "200", tmp_path=tmp_path, scripts={"transfer": TRANSFER})
    capsys.readouterr()

    assert _run(config_path, "extract", "run", "EXT1", "--pull") == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("Source PG: pulled "), out
    assert any(line.startswith("Extract EXT1") for line in out[1:]), out
    _assert_slot_within_archive(source, archive)
    run_pump(None, store, config, "PMP1")
    run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert digests(target_dsn, TABLES) == digests(source, TABLES)
    last_commit = max(r["scn"] for r in _records(archive) if r["op"] == "COMMIT")
    assert Csn.parse(checkpoint_row(target_dsn)["log_csn"]).scn == last_commit

    # A pull that stops (its slot dropped behind the pipeline) ends the command with its
    # error, after capture took what the archive holds.
    execute(source, 'INSERT INTO "Mixed"."Odd Name" (id) VALUES (-1)',
            "SELECT pg_drop_replication_slot('trailbound_pg')")
    assert _run(config_path, "extract", "run", "EXT1", "--pull") == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("ERROR archive pull PG: ") and "is gone" in error[0], error

    assert _run(config_path, "extract", "run", "EXT1", "--pull", "--until", "2026-11-01T00:00:00Z") == 1
    assert "--pull reads the source up to now" in capsys.readouterr().err
    simulated = tmp_path / "simulated.yaml"
    simulated.write_text(f"home: {tmp_path}\nsources:\n  SIM:\n    altarchivelogdest: sim-archive\nextracts:\n"
                         "  EXT1: {source: SIM, exttrail: dirdat/sim, table: ['*.*']}\n")
    assert _run(simulated, "extract", "run", "EXT1", "--pull") == 1
    assert "source SIM has no postgres: block" in capsys.readouterr().err


@pytest.mark.long_running(40)
def test_a_pull_whose_replication_session_is_ended_stops_with_one_line_and_the_rerun_converges(source_dsn, tmp_path):
    """The source ends the pull's replication session mid-stream (a restart, a failover,
    pg_terminate_backend): the pull stops with one ERROR line naming the source, the slot
    is not confirmed past the archive, and the next pull archives every change once."""
    execute(source_dsn, ODD)
    config_path = write_config(tmp_path, tables=("Mixed.*",))
    added = _killed(config_path, source_dsn, None, "add", "source", "PG")
    assert added.returncode == 0, added.stderr
    batches, rows = 20, 10_000
    for batch in range(batches):  # one transaction each
        execute(source_dsn, ODD_ROWS, args={"toast": NEVER, "first": batch * rows + 1, "last": (batch + 1) * rows})
    pull = subprocess.Popen([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "archive", "pull",
                             "PG"], env={**os.environ, SOURCE_ENV: source_dsn}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    archive = tmp_path / "archive"
    while pull.poll() is None and not (archive.is_dir() and discover(archive)):
        time.sleep(0.01)  # mid-stream once the first segment is archived (the backlog takes seconds)
    (walsender,), = query(source_dsn, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'trailbound_pg'")
    assert pull.poll() is None and walsender is not None, "the pull ended before its session could be ended"
    execute(source_dsn, "SELECT pg_terminate_backend(%(pid)s)", args={"pid": walsender})
    out, err = pull.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert pull.returncode == 1 and len(lines) == 1 and lines[0].startswith("ERROR "), err[-3000:]
    assert lines[0].startswith("ERROR source PG: the connection to the source failed after LSN ") and \
        "terminating connection due to administrator command" in lines[0], lines[0]
    _assert_slot_within_archive(source_dsn, archive)

    again = _pull_subprocess(config_path, source_dsn)
    assert again.returncode == 0, again.stderr[-3000:]
    _assert_slot_within_archive(source_dsn, archive)
    ids = [json.loads(r["after"])["id"] for r in _records(archive)
           if r["table"] == "Mixed.Odd Name" and r["op"] == "INSERT"]
    assert sorted(ids) == list(range(1, batches * rows + 1))

    # A source that cannot be reached at all: one line, the DSN without its password.
    unreachable = psycopg2.extensions.make_dsn(source_dsn, port=1, password="s3cret-pw")
    down = _pull_subprocess(config_path, unreachable)
    lines = down.stderr.strip().splitlines()
    assert down.returncode == 1 and len(lines) == 1 and lines[0].startswith("ERROR cannot connect to source PG "), \
        down.stderr[-3000:]
    assert "s3cret-pw" not in down.stderr + down.stdout


def _added_with_a_target(source_dsn: str, target_dsn: str, metadata_dsn: str, tmp_path: Path, monkeypatch) -> Path:
    """A source added (its slot, publication and archive) and its target tables created;
    the configuration's path."""
    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", metadata_dsn)
    execute(source_dsn, ODD)
    config_path = write_config(tmp_path, tables=("Mixed.*",))
    assert _run(config_path, "add", "source", "PG") == 0
    assert _run(config_path, "target", "create", "--source", "PG") == 0
    return config_path


def test_a_source_that_cannot_be_reached_is_one_line_without_its_password(source_dsn, target_dsn, metadata_dsn, spark,
                                                                         tmp_path, monkeypatch, capsys):
    """Every verb that talks to the source says which source it cannot reach, with the DSN
    and the driver's text but not the password, in one line, and writes nothing."""
    config_path = _added_with_a_target(source_dsn, target_dsn, metadata_dsn, tmp_path, monkeypatch)
    archive = sorted(p.relative_to(tmp_path) for p in (tmp_path / "archive").rglob("*"))
    monkeypatch.setenv(SOURCE_ENV, psycopg2.extensions.make_dsn(source_dsn, port=1, password="s3cret-pw"))
    for words, what in ((["info", "source", "PG"], "source PG"), (["archive", "pull", "PG"], "source PG"),
                        (["load", "PG", "REP1"], "the source"), (["delete", "source", "PG"], "source PG"),
                        (["add", "source", "PG"], "source PG")):
        capsys.readouterr()
        status = _run(config_path, *words)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert status == 1 and len(lines) == 1 and lines[0].startswith(f"ERROR cannot connect to {what} "), (words, err)
        assert "password=***" in lines[0] and "s3cret-pw" not in out + err, (words, err)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "archive").rglob("*")) == archive
    assert query(source_dsn, "SELECT count(*) FROM pg_replication_slots")[0][0] == 1


def test_a_refusal_no_step_names_is_still_one_line(source_dsn, target_dsn, metadata_dsn, spark, tmp_path, monkeypatch,
                                                   capsys):
    """A database's refusal that no step turns into one of trailbound's errors (here a role
    without REPLICATION asked for a snapshot load, which replaces the slot) is one ERROR
    line with the verb and the server's words, not a traceback, and changes nothing."""
    config_path = _added_with_a_target(source_dsn, target_dsn, metadata_dsn, tmp_path, monkeypatch)
    role = f"tb_noreplication_{uuid.uuid4().hex[:8]}"  # roles belong to the whole server
    execute(source_dsn, f'CREATE ROLE "{role}" LOGIN NOREPLICATION')
    try:
        monkeypatch.setenv(SOURCE_ENV, psycopg2.extensions.make_dsn(source_dsn, user=role))
        capsys.readouterr()
        assert _run(config_path, "load", "PG", "REP1") == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == ["ERROR load: must be superuser or replication role to use replication slots"], lines
    finally:
        execute(source_dsn, f'DROP ROLE "{role}"')
    assert query(source_dsn, "SELECT count(*) FROM pg_replication_slots")[0][0] == 1
