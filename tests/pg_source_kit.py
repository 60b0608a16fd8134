"""Helpers for the live PostgreSQL source's tests: a source server that logical decoding
can read (wal_level=logical, logical_decoding_work_mem at its 64kB minimum so that
transactions stream, a TimeZone that is not UTC), a configuration with the source and
the whole pipeline, pgbench, and an order-independent digest of each table computed in
SQL on both servers."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import psycopg2
import psycopg2.extensions
import pytest
from psycopg2 import sql

from trailbound.devtools.localpg import LocalServer

REPO = Path(__file__).resolve().parent.parent
SOURCE_ENV = "TRAILBOUND_TEST_SOURCE_DSN"
SOURCE_OPTIONS = ("-c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20 "
                  "-c logical_decoding_work_mem=64kB -c TimeZone=Asia/Kolkata -c extra_float_digits=0 "
                  "-c DateStyle=SQL,DMY -c bytea_output=escape")


@pytest.fixture(scope="session")
def source_server():
    """A PostgreSQL server with logical decoding on, started for this session only."""
    server = LocalServer(REPO / "var" / "test-pg-source" / str(os.getpid()), options=SOURCE_OPTIONS).start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def source_dsn(source_server):
    """A fresh database on the source server (dropped afterwards, slots and all)."""
    name = f"src_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(source_server.dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield source_server.dsn(name)
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s"
                    " AND NOT active", (name,))
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.close()


def write_config(tmp_path: Path, *, tables=("public.pgbench_*", "Mixed.*"), segment: dict | None = None,
                 slot: str = "trailbound_pg") -> Path:
    """Source PG (postgres: block, DSN in $TRAILBOUND_TEST_SOURCE_DSN), extract EXT1, pump
    PMP1 to a remote trail, replicat REP1 from it."""
    postgres = {"dsn_env": SOURCE_ENV, "conn_id": "source_pg", "slot": slot, "publication": "trailbound_pub",
                "table": list(tables), "segment": segment or {"records": 5000}}
    lines = [f"home: {tmp_path}", "sources:", "  PG:", "    altarchivelogdest: archive",
             f"    postgres: {json.dumps(postgres)}",
             "extracts:", "  EXT1:", "    source: PG", "    exttrail: dirdat/lt", f"    table: {json.dumps(list(tables))}",
             "    megabytes: 4",
             "pumps:", "  PMP1: {exttrail: dirdat/lt, rmttrail: remote/rt}",
             "replicats:", "  REP1: {exttrail: remote/rt, source: PG, grouptransops: 500}"]
    path = tmp_path / "trailbound.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def execute(dsn: str, *statements: str, args=None) -> None:
    connection = psycopg2.connect(dsn)
    connection.autocommit = True
    try:
        with connection.cursor() as cur:
            for statement in statements:
                cur.execute(statement, args)
    finally:
        connection.close()


def query(dsn: str, text: str, args=None) -> list[tuple]:
    with psycopg2.connect(dsn) as connection, connection.cursor() as cur:
        cur.execute(text, args)
        rows = cur.fetchall()
    connection.close()
    return rows


def pgbench(dsn: str, *args: str, scripts: dict[str, str] | None = None, tmp_path: Path | None = None) -> str:
    """Run pgbench (as root it runs as is: it is a client). `scripts`: name -> text, each
    passed as -f name@weight... via files under tmp_path."""
    argv = ["pgbench", *args]
    for name, text in (scripts or {}).items():
        path = tmp_path / f"{name}.sql"
        path.write_text(text)
        argv += ["-f", str(path)]
    result = subprocess.run([*argv, dsn], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


_SETTINGS = "SET TimeZone = 'UTC'; SET extra_float_digits = 3; SET bytea_output = 'hex'; SET DateStyle = 'ISO'"


def digests(dsn: str, tables: list[tuple[str, str]]) -> dict[str, tuple[int, str]]:
    """Per table: (row count, md5 of the sorted md5s of every row's text), the same
    session settings on both sides so that equal rows have equal text."""
    found = {}
    with psycopg2.connect(dsn) as connection, connection.cursor() as cur:
        cur.execute(_SETTINGS)
        for schema, table in tables:
            cur.execute(sql.SQL("SELECT count(*), coalesce(md5(string_agg(h, ',' ORDER BY h)), '')"
                                " FROM (SELECT md5(t::text) AS h FROM {} t) rows").format(sql.Identifier(schema, table)))
            found[f"{schema}.{table}"] = tuple(cur.fetchone())
    connection.close()
    return found


def slot_confirmed(dsn: str, slot: str = "trailbound_pg") -> int:
    (lsn,), = query(dsn, "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,))
    return int(lsn)
