"""Schema changes on a live PostgreSQL source flow through to the target without a stop
(issue 39): ADD COLUMN with and without a default (in the transaction that inserted a
row before it), DROP COLUMN, ALTER COLUMN TYPE
bigint, a new table matching `table:`, one change inside a streamed transaction, replicat
killed before and after the commit that alters the target with its first rows; after
each round of pull, capture, pump and replicat the target equals the source table by
table (a column the target keeps after a drop left out), the archive holds each table's
versions, the trail names each record's version. A narrowing change stops replicat
before its first row with the documented message; after the runbook it converges."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg2
import pytest
from psycopg2 import sql

from pg_source_kit import SOURCE_ENV, execute, query, source_dsn, source_server, write_config  # noqa: F401
from trailbound import cli
from trailbound import config as configuration
from trailbound.archive.segments import load_defs
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.pump.run import run_pump
from trailbound.replicat.ddl import DdlStop
from trailbound.replicat.run import run_replicat
from trailbound.trail import format as trail

pytestmark = [pytest.mark.spark, pytest.mark.pg]

SETTINGS = "SET TimeZone = 'UTC'; SET extra_float_digits = 3; SET DateStyle = 'ISO'"


def _columns(dsn: str, schema: str, table: str) -> list[str]:
    return [name for (name,) in query(dsn, "SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
                                           " AND table_name = %s ORDER BY ordinal_position", (schema, table))]


def _digest(dsn: str, schema: str, table: str, columns: list[str]) -> tuple[int, str]:
    """(rows, md5 of the sorted rows' text) over `columns`, the same settings on both sides."""
    with psycopg2.connect(dsn) as connection, connection.cursor() as cur:
        cur.execute(SETTINGS)
        row = sql.SQL("ROW({})::text").format(sql.SQL(", ").join(map(sql.Identifier, columns)))
        cur.execute(sql.SQL("SELECT count(*), coalesce(md5(string_agg(h, ',' ORDER BY h)), '')"
                            " FROM (SELECT md5({}) AS h FROM {}) rows").format(row, sql.Identifier(schema, table)))
        found = tuple(cur.fetchone())
    connection.close()
    return found


class Rounds:
    def __init__(self, spark, store, config, config_path, source, target):
        self.spark, self.store, self.config, self.config_path = spark, store, config, config_path
        self.source, self.target = source, target

    def pull(self) -> None:
        assert cli.main(["--config", str(self.config_path), "archive", "pull", "PG"]) == 0

    def round(self, tables: list[tuple[str, str]]):
        """pull, capture, pump, replicat; then every table equals the source's over the
        source's columns."""
        self.pull()
        run_extract(self.spark, self.store, self.config, "EXT1")
        run_pump(None, self.store, self.config, "PMP1")
        result = run_replicat(self.spark, self.store, self.config, "REP1", target_dsn=self.target)
        for schema, table in tables:
            columns = _columns(self.source, schema, table)
            assert _digest(self.target, schema, table, columns) == _digest(self.source, schema, table, columns), table
        return result


@pytest.mark.long_running(200)
def test_schema_changes_flow_through_and_a_narrowing_one_stops(source_dsn, target_dsn, store, spark, tmp_path,
                                                                monkeypatch, capsys):
    source = source_dsn
    monkeypatch.setenv(SOURCE_ENV, source)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)  # for the killed replicat's process
    execute(source, "CREATE SCHEMA shop",
            "CREATE TABLE shop.orders (id int PRIMARY KEY, note varchar(10), qty int NOT NULL, gone text NOT NULL)",
            "CREATE TABLE shop.other (id int PRIMARY KEY)")  # matches the pattern, never written
    config_path = write_config(tmp_path, tables=("shop.*",))
    config = configuration.load(config_path)
    archive = config.archive_dir("PG")
    assert cli.main(["--config", str(config_path), "add", "source", "PG"]) == 0
    assert cli.main(["--config", str(config_path), "target", "create"]) == 0
    execute(source, "INSERT INTO shop.orders SELECT g, 'n' || g, g, 'g' || g FROM generate_series(1, 20) g")
    rounds = Rounds(spark, store, config, config_path, source, target_dsn)
    orders = [("shop", "orders")]
    rounds.round(orders)

    # Round 2: two new columns, one with a default the old rows take; rows that use them;
    # all in one transaction with a row inserted before the ALTER (version 1 inside the
    # transaction that makes version 2: the source gives that row the default too).
    execute(source, "BEGIN", "INSERT INTO shop.orders VALUES (30, 'n30', 30, 'g30')",
            "ALTER TABLE shop.orders ADD COLUMN extra int",
            "ALTER TABLE shop.orders ADD COLUMN flag text NOT NULL DEFAULT 'yes'",
            "INSERT INTO shop.orders VALUES (21, 'n21', 21, 'g21', 7, 'no')", "COMMIT",
            "UPDATE shop.orders SET extra = 1 WHERE id = 1")
    capsys.readouterr()
    rounds.pull()
    assert "new table version(s): shop.orders v2" in capsys.readouterr().out
    run_extract(spark, store, config, "EXT1")
    run_pump(None, store, config, "PMP1")
    # kill -9 with the new columns' ALTER and the first rows in the target transaction,
    # before its commit (neither stays) and after (both do: the rerun has nothing to alter)
    for point, there in (("before_target_commit", False), ("after_target_commit", True)):
        crashed = subprocess.run([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "replicat",
                                  "run", "REP1"], env={**os.environ, CRASH_ENV: point}, capture_output=True, text=True,
                                 timeout=300)
        assert crashed.returncode == 137, crashed.stderr[-2000:]
        assert ("extra" in _columns(target_dsn, "shop", "orders")) is there
    rounds.round(orders)
    assert _columns(target_dsn, "shop", "orders")[-2:] == ["extra", "flag"]
    assert query(target_dsn, "SELECT flag FROM shop.orders WHERE id IN (2, 30) ORDER BY id") == [("yes",), ("yes",)]
    defs = load_defs(archive)["shop.orders"]
    assert [v.version for v in defs.versions] == [1, 2] and defs.latest.columns[-1].default == "yes"

    # Round 3: a dropped column stays on the target (its NOT NULL dropped), values stop
    # arriving; a widened type; a new table matching shop.*, written before it is published
    # and after; a change inside a transaction that streams (over logical_decoding_work_mem).
    execute(source, "ALTER TABLE shop.orders DROP COLUMN gone",
            "INSERT INTO shop.orders (id, note, qty) VALUES (22, 'n22', 22)",
            "ALTER TABLE shop.orders ALTER COLUMN qty TYPE bigint",
            "INSERT INTO shop.orders (id, note, qty) VALUES (23, 'n23', 1099511627776)",
            "CREATE TABLE shop.items (sku text PRIMARY KEY, price numeric(8,2))",
            "INSERT INTO shop.items VALUES ('a', 1.5), ('b', 2.25)")
    rounds.pull()  # publishes shop.items with its two rows
    held = psycopg2.connect(source)
    with held.cursor() as cur:
        cur.execute("INSERT INTO shop.items SELECT 'bulk' || g, g FROM generate_series(1, 3000) g")  # streams
        cur.execute("ALTER TABLE shop.items ADD COLUMN label varchar(20)")
        cur.execute("INSERT INTO shop.items SELECT 'late' || g, g, 'x' || g FROM generate_series(1, 2000) g")
    rounds.pull()  # the streamed part is archived before its commit
    held.commit()
    held.close()
    execute(source, "UPDATE shop.orders SET qty = qty * 1024 WHERE id <= 5", "DELETE FROM shop.items WHERE sku = 'a'")
    capsys.readouterr()
    result = rounds.round(orders + [("shop", "items")])
    assert "gone" in _columns(target_dsn, "shop", "orders")  # kept
    assert query(target_dsn, "SELECT gone FROM shop.orders WHERE id = 22") == [(None,)]
    assert query(target_dsn, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                             "'shop.orders'::regclass AND attname = 'qty'") == [("bigint",)]
    assert any("shop.items: created" in change for change in result.ddl)
    versions = {name: [v.version for v in table.versions] for name, table in load_defs(archive).items()}
    assert versions == {"shop.orders": [1, 2, 3, 4], "shop.items": [1, 2], "shop.other": [1]}
    capsys.readouterr()
    assert cli.main(["--config", str(config_path), "info", "source", "PG"]) == 0
    info = capsys.readouterr().out
    assert "Table shop.orders: version 4 since scn" in info and "Table shop.items: version 2 since scn" in info
    # Each record of the trail names its version; logdump shows it.
    remote = sorted(trail.existing_files(tmp_path / "remote" / "rt"))
    records = [r for path in remote for r in trail.read_file(path).to_pylist()]
    seen = {(r["table"], r["table_version"]) for r in records}
    assert {("shop.orders", 1), ("shop.orders", 2), ("shop.orders", 3), ("shop.orders", 4), ("shop.items", 1),
            ("shop.items", 2)} <= seen
    capsys.readouterr()
    assert cli.main(["logdump", str(remote[-1])]) == 0
    assert " v" in capsys.readouterr().out

    # Round 4: a narrowing change stops replicat before its first row, naming table,
    # version, position and the runbook; nothing past it is applied.
    execute(source, "ALTER TABLE shop.orders ALTER COLUMN note TYPE varchar(5)",
            "INSERT INTO shop.orders (id, note, qty) VALUES (24, 'n24', 24)")
    before = _digest(target_dsn, "shop", "orders", ["id"])
    with pytest.raises(DdlStop) as stopped:
        rounds.round(orders)
    message = str(stopped.value)
    assert "source table shop.orders version 5" in message and "changes type from character varying(10) to " \
        "character varying(5)" in message and "rba" in message and "docs/live-postgres.md" in message
    assert _digest(target_dsn, "shop", "orders", ["id"]) == before
    # The runbook: the target altered by hand; replicat goes on.
    execute(target_dsn, "ALTER TABLE shop.orders ALTER COLUMN note TYPE varchar(5)")
    run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    columns = _columns(source, "shop", "orders")
    assert _digest(target_dsn, "shop", "orders", columns) == _digest(source, "shop", "orders", columns)
    assert json.loads((archive / "defs.json").read_text())["tables"]
