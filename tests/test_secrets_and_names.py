"""Secrets and hostile names: no password in what trailbound prints or logs, and hostile
table, schema and transaction names carried through the whole pipeline.

A DSN with a password (a real role with a password on the test server) never appears in
what trailbound prints or logs: normal output, INFO output, error messages, log records.
Table and schema names with quotes, semicolons, dots and Unicode, and xids such as
`../../etc` or 128 characters of punctuation, flow from a handwritten archive through
capture (with Bounded Recovery persisting one of them), pump and replicat into the target
as data: never as a path, never as SQL text.
"""

from __future__ import annotations

import json
import logging
import os
import string
import uuid
from datetime import timedelta

import psycopg2
import psycopg2.extensions
import pytest
from psycopg2 import sql

from capture_kit import T0, new_archive
from pump_kit import write_config
from trailbound import cli
from trailbound.archive.writer import write_defs, write_segment
from trailbound.positions import Scn

pytestmark = [pytest.mark.spark, pytest.mark.pg]

PASSWORD = "Pw;'x\" S3cr3t-" + uuid.uuid4().hex[:8]


def _admin(server_dsn: str):
    connection = psycopg2.connect(psycopg2.extensions.make_dsn(server_dsn, dbname="postgres"))
    connection.autocommit = True
    return connection


@pytest.fixture
def secret_role(pg_server_dsn):
    """A login role with a password, owning a fresh metadata and a fresh target database.
    (The suite's server trusts local connections, so the password is carried, not checked:
    what is tested is where it goes.)"""
    tag = uuid.uuid4().hex[:8]
    role, meta, target = f"tb_secret_{tag}", f"tb_secret_meta_{tag}", f"tb_secret_target_{tag}"
    admin = _admin(pg_server_dsn)
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(PASSWORD)))
        for name in (meta, target):
            cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(role)))
    dsns = {kind: psycopg2.extensions.make_dsn(pg_server_dsn, dbname=name, user=role, password=PASSWORD)
            for kind, name in (("metadata", meta), ("target", target))}
    yield dsns
    with admin.cursor() as cur:
        for name in (meta, target):
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        cur.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    admin.close()


def _secret_parts() -> list[str]:
    return [PASSWORD, PASSWORD.split(" ")[-1]]


def test_a_password_never_reaches_output_errors_or_logs(tmp_path, secret_role, capsys, caplog, monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [{"scn": 10, "ts": T0 + timedelta(seconds=10), "xid": "A", "op": "INSERT",
                         "table": "shop.orders", "after": {"id": 1, "note": "x"}},
                        {"scn": 20, "ts": T0 + timedelta(seconds=20), "xid": "A", "op": "COMMIT"}], 100)
    config_path = write_config(tmp_path, {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt"}},
                               extract_tables=("shop.*",),
                               replicats={"REP1": {"exttrail": "remote/rt", "source": "SRC"}})
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", secret_role["metadata"])
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", secret_role["target"])
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    seen = []
    for words, status in ((("archive", "scan"), 0), (("extract", "run", "EXT1"), 0),
                          (("info", "extract", "EXT1", "--showch", "1"), 0), (("pump", "run", "PMP1"), 0),
                          (("info", "pump", "PMP1", "--showch"), 0), (("target", "create"), 0),
                          (("replicat", "run", "REP1"), 0), (("info", "replicat", "REP1", "--showch", "1"), 0),
                          (("info", "retention",), 0)):
        assert main(*words) == status, (words, capsys.readouterr())
        captured = capsys.readouterr()
        seen += [captured.out, captured.err]
    # Errors that name the database they could not reach: a missing database, a bad port.
    broken = {"metadata": psycopg2.extensions.make_dsn(secret_role["metadata"], dbname="no_such_db_" + uuid.uuid4().hex[:6]),
              "target": psycopg2.extensions.make_dsn(secret_role["target"], port="1")}
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", broken["metadata"])
    assert main("info", "extract", "EXT1") == 1
    error = capsys.readouterr().err
    assert "cannot connect to the metadata store" in error and "password=***" in error, error
    seen.append(error)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", secret_role["metadata"])
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", broken["target"])
    assert main("replicat", "run", "REP1") == 1
    error = capsys.readouterr().err
    assert "cannot connect to the target" in error and "password=***" in error, error
    seen.append(error)
    # A password with an unquoted space: the DSN does not parse, and the driver's message
    # would quote the word after the space.
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", f"host=127.0.0.1 user=u password=Pw {PASSWORD.split(' ')[-1]} dbname=d")
    assert main("info", "extract", "EXT1") == 1
    error = capsys.readouterr().err
    assert "its DSN does not parse" in error, error
    seen.append(error)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", secret_role["metadata"])
    uri = f"postgresql://someone:{PASSWORD.split(' ')[-1]}@127.0.0.1:1/nothing"
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", uri)
    assert main("info", "replicat", "REP1") in (0, 1)
    seen += list(capsys.readouterr())
    seen += [record.getMessage() for record in caplog.records]
    for text in seen:
        for secret in _secret_parts():
            assert secret not in text, text


# ---------------------------------------------------------------- hostile names

SCHEMA = 'we"ird; DROP SCHEMA public;--'
TABLE = 'Tä"b;le.x (1)'  # a table name may hold a dot: the schema ends at the first one
NAME = f"{SCHEMA}.{TABLE}"
NOTE = 'nö"te; DELETE'
PUNCT = (string.punctuation * 5)[:128]
XIDS = ["../../etc", PUNCT, "/", "..", "~root", "x\\y", "%2e%2e%2f"]
LONG = "../..//etc/passwd"


def _minutes(n: int):
    return T0 + timedelta(minutes=n)


def _r(scn, xid, op, key=None, note=None, parent=None):
    return {"scn": scn, "ts": _minutes(scn), "xid": xid, "parent_xid": parent, "op": op,
            "table": NAME if op in ("INSERT", "UPDATE", "DELETE") else None,
            "before": {"id": key} if op in ("UPDATE", "DELETE") else None,
            "after": {"id": key, NOTE: note} if op in ("INSERT", "UPDATE") else None}


def test_hostile_names_and_xids_flow_end_to_end_as_data(tmp_path, spark, metadata_dsn, target_dsn, capsys,
                                                        monkeypatch):
    root = tmp_path / "archive"
    write_defs(root, [{"name": NAME, "columns": [{"name": "id", "type": "bigint", "nullable": False},
                                                 {"name": NOTE, "type": "text", "nullable": True}], "key": ["id"]}])
    # SCNs are minutes of log time, so Bounded Recovery (brinterval 20m, rounded up to the
    # extract's interval) has something to persist.
    first = [_r(2 * n + 1, xid, "INSERT", key=n, note=xid) for n, xid in enumerate(XIDS)]
    first += [_r(20, PUNCT[::-1], "INSERT", key=100, note="rolled back", parent="../../etc"),  # a savepoint
              _r(21, PUNCT[::-1], "ROLLBACK", parent="../../etc"),
              _r(22, "../../etc", "UPDATE", key=0, note="it's; \"fine\"")]
    first += [_r(30 + n, xid, "COMMIT") for n, xid in enumerate(XIDS) if xid != "../../etc"]
    first += [_r(40, LONG, "INSERT", key=50, note="open long")]
    second = [_r(130, "../../etc", "DELETE", key=1), _r(140, "../../etc", "COMMIT"), _r(150, LONG, "COMMIT")]
    for sequence, (records, first_scn, next_scn) in enumerate([(first, 0, 120), (second, 120, 240)], start=1):
        write_segment(root, thread=1, sequence=sequence, records=records, first_scn=Scn(first_scn), next_scn=Scn(next_scn),
                      first_time=_minutes(first_scn), next_time=_minutes(next_scn), fmt="parquet")
    config_path = write_config(tmp_path, {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt"}},
                               extract_tables=("*.*",), megabytes=0.0001,
                               replicats={"REP1": {"exttrail": "remote/rt", "source": "SRC"}})
    config_path.write_text(config_path.read_text().replace(
        "    megabytes: 0.0001\n", "    megabytes: 0.0001\n    br: {brdir: brfiles, brinterval: 20m}\n"))
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", metadata_dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    assert main("target", "create") == 0, capsys.readouterr()
    outputs = []
    for until in (_minutes(120), None):  # the first run persists "../../etc" (open for 119 minutes)
        assert main("extract", "run", "EXT1", *(["--until", until.isoformat()] if until else [])) == 0, \
            capsys.readouterr()
        assert main("pump", "run", "PMP1") == 0, capsys.readouterr()
        assert main("replicat", "run", "REP1") == 0, capsys.readouterr()
        outputs.append(capsys.readouterr().out)
        if until is not None:  # "../../etc" is persisted now (its file goes once it commits)
            br_files = [p for p in (tmp_path / "brfiles").rglob("*") if p.is_file()]
    assert "BR checkpoint taken" in outputs[0], outputs[0]

    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT id, {} FROM {} ORDER BY id").format(sql.Identifier(NOTE),
                                                                       sql.Identifier(SCHEMA, TABLE)))
        rows = dict(cur.fetchall())
        cur.execute("SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'public'")
        assert cur.fetchone()[0] == 1, "no name ever ran as SQL"
        cur.execute("SELECT log_xid FROM trailbound.ggcheckpoint")
        assert cur.fetchone()[0] == LONG
    expected = {n: xid for n, xid in enumerate(XIDS)} | {0: "it's; \"fine\"", 50: "open long"}
    del expected[1]
    assert rows == expected
    # Nothing is named after an xid: BR files and trail files have names of their own.
    assert not any(p.name in ("etc", "passwd", "..", "~root") or "%2e" in p.name or "\\" in p.name
                   for p in tmp_path.rglob("*"))
    assert br_files, "the long transaction was persisted"
    allowed = set(string.ascii_letters + string.digits + "_-.")
    assert all(set(part) <= allowed for p in br_files for part in p.relative_to(tmp_path / "brfiles").parts)
    assert not (tmp_path.parent / "etc").exists()
    assert {r["xid"] for r in map(json.loads, _logdump(main, tmp_path, capsys))} == set(XIDS) | {LONG}


def _logdump(main, tmp_path, capsys) -> list[str]:
    lines = []
    for path in sorted((tmp_path / "remote").iterdir()):
        assert main("logdump", str(path), "--json") == 0
        lines += capsys.readouterr().out.splitlines()
    return lines


def test_the_airflow_hook_hands_dsns_to_the_engine_and_never_to_the_process_environment(tmp_path, secret_role,
                                                                                        monkeypatch):
    """TrailboundHook resolves the metadata store's and the target's Airflow connections
    and passes the DSNs to the engine as arguments: the commands reach both databases
    (the variables are not set), and afterwards os.environ is what it was, no value in it
    holding the password but the connections' own."""
    from trailbound_airflow.hooks import TrailboundHook

    new_archive(tmp_path)
    config_path = write_config(tmp_path, {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt"}},
                               extract_tables=("shop.*",),
                               replicats={"REP1": {"exttrail": "remote/rt", "source": "SRC"}})
    for variable in ("TRAILBOUND_METADATA_DSN", "TRAILBOUND_TARGET_DSN"):
        monkeypatch.delenv(variable, raising=False)
    for conn_id, kind in (("TRAILBOUND_METADATA", "metadata"), ("TRAILBOUND_TARGET", "target")):
        parts = psycopg2.extensions.parse_dsn(secret_role[kind])
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id}", json.dumps({
            "conn_type": "postgres", "host": parts["host"], "port": int(parts.get("port", 5432)),
            "login": parts["user"], "password": parts["password"], "schema": parts["dbname"]}))
    before = dict(os.environ)

    hook = TrailboundHook(config_path=str(config_path))
    assert "EXTRACT" in hook.run_command(["info", "all"])
    assert "created" in hook.run_command(["target", "create"])
    assert hook.extract_state("EXT1") is None
    hook.nothing_to_do("replicat", "REP1")  # the store and the target, each through its connection

    assert dict(os.environ) == before, "a hook call changed the process environment"
    holding = sorted(name for name, value in os.environ.items() if any(s in value for s in _secret_parts()))
    assert holding == ["AIRFLOW_CONN_TRAILBOUND_METADATA", "AIRFLOW_CONN_TRAILBOUND_TARGET"]
