"""Faults of a live deployment, on real servers: the source server restarted
(`pg_ctl restart -m fast`) mid pull; the server holding the metadata store and the
target restarted while capture, pump and replicat are each caught mid-step
(TRAILBOUND_PAUSE_AT holds the process at a crash point while the test restarts the
server). Each run stops with one ERROR line, and the next run converges: the target
equals the source table by table, the checkpoint row at the last commit. And a busy
server whose published tables are idle: heavy writes to unpublished tables and to
another database do not hold the slot back; `info source` shows the slot's lag."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg2.extensions
import pyarrow.parquet as pq
import pytest

from pg_source_kit import (SOURCE_ENV, SOURCE_OPTIONS, digests, execute, pgbench, query, slot_confirmed,  # noqa: F401
                           source_dsn, source_server, write_config)
from replicat_kit import checkpoint_row
from trailbound import config as configuration
from trailbound.archive.segments import discover
from trailbound.crash import PAUSE_ENV
from trailbound.devtools.localpg import LocalServer
from trailbound.positions import Csn

pytestmark = [pytest.mark.pg]

REPO = Path(__file__).resolve().parents[1]
TABLE = "CREATE TABLE items (id bigint PRIMARY KEY, v int, note text)"
TABLES = [("public", "items")]


@pytest.fixture
def one_server():
    """A server of the test's own, for the source (logical decoding on), the metadata store
    and the target: restarting it disturbs no other test."""
    server = LocalServer(REPO / "var" / "test-pg-restarts" / uuid.uuid4().hex[:8], options=SOURCE_OPTIONS).start()
    try:
        execute(server.dsn(), "CREATE DATABASE source")
        yield server
    finally:
        server.remove()


def _env(server: LocalServer, extra: dict | None = None) -> dict[str, str]:
    return {**os.environ, SOURCE_ENV: server.dsn("source"), **server.environment(), **(extra or {})}


def _trailbound(config_path: Path, env: dict, *words: str, driver=None) -> subprocess.Popen:
    command = ["--config", str(config_path), *words]
    return subprocess.Popen(driver.cli(*command) if driver else [sys.executable, "-m", "trailbound.cli", *command],
                            env={**env, **(driver.env if driver else {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _done(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=600)
    return process.returncode, out, err


def _restarted_under(server: LocalServer, process: subprocess.Popen, flag: Path) -> tuple[int, str, str]:
    """Wait until `process` is held at its pause point, restart the server, let it go on."""
    deadline = time.monotonic() + 300
    while not flag.exists():
        assert process.poll() is None, f"the run ended before its pause point: {process.communicate()}"
        assert time.monotonic() < deadline, "the run never reached its pause point"
        time.sleep(0.05)
    server.restart()
    flag.unlink()
    return _done(process)


def _one_error_line(returncode: int, err: str, starts: str) -> str:
    lines = [line for line in err.strip().splitlines() if not re.match(r"^\d\d/\d\d/\d\d \d\d:", line)]
    assert returncode == 1 and len(lines) == 1 and lines[0].startswith(starts), err[-3000:]
    return lines[0]


def _rows(dsn: str, first: int, last: int) -> None:
    execute(dsn, f"INSERT INTO items SELECT g, g % 1000, md5(g::text) FROM generate_series({first}, {last}) g")


@pytest.mark.spark
@pytest.mark.long_running(120)
def test_restarts_of_the_source_and_of_the_target_and_metadata_server_mid_stage(one_server, crash_driver, tmp_path):
    """Source restarted mid pull; then the metadata and target server restarted with
    capture held after its trail write, pump after its copy, replicat before its target
    commit: one line each, and each rerun converges."""
    server, source = one_server, one_server.dsn("source")
    execute(source, TABLE)
    config_path = write_config(tmp_path, tables=("public.items",), segment={"records": 5000})
    env = _env(server)
    for words in (("add", "source", "PG"), ("target", "create")):
        rc, out, err = _done(_trailbound(config_path, env, *words))
        assert rc == 0, err
    for batch in range(10):  # one transaction each
        _rows(source, batch * 5000 + 1, (batch + 1) * 5000)

    # The source restarted (fast) while the pull reads. PostgreSQL ends the pull's SQL session
    # at once, but lets a logical walsender finish sending first: the pull either ends with
    # one line (its SQL session gone) or ends normally while the shutdown waits for it.
    pull = _trailbound(config_path, env, "archive", "pull", "PG")
    archive = tmp_path / "archive"
    while pull.poll() is None and not (archive.is_dir() and discover(archive)):
        time.sleep(0.01)
    assert pull.poll() is None, "the pull ended before the restart could come"
    restart = threading.Thread(target=server.restart)
    restart.start()
    rc, out, err = _done(pull)
    restart.join(timeout=300)
    assert not restart.is_alive(), "the server's restart waited on the pull for more than 5 minutes"
    if rc != 0:
        _one_error_line(rc, err, "ERROR source PG: the connection to the source failed after LSN ")
    print(f"pull under a source restart: exit {rc}: {(err.strip() or out.strip())[-400:]}")
    flag = tmp_path / "paused"
    assert slot_confirmed(source) <= discover(archive)[-1].next_scn.value, "the slot was confirmed past the archive"
    rc, out, err = _done(_trailbound(config_path, env, "archive", "pull", "PG"))
    assert rc == 0, err
    ids = [json.loads(r["after"])["id"] for segment in discover(archive)
           for r in pq.read_table(segment.path).to_pylist() if r["op"] == "INSERT"]
    assert sorted(ids) == list(range(1, 50_001)), "every row archived once"

    # The metadata store's and the target's server restarted under each stage, caught mid-step.
    for stage, point, starts in (("extract", "after_trail_write", "ERROR "),
                                 ("pump", "after_copy", "ERROR "),
                                 ("replicat", "before_target_commit", "ERROR ")):
        group = {"extract": "EXT1", "pump": "PMP1", "replicat": "REP1"}[stage]
        driver = crash_driver if stage != "pump" else None
        held = _trailbound(config_path, _env(server, {PAUSE_ENV: f"{point}={flag}"}), stage, "run", group,
                           driver=driver)
        rc, out, err = _restarted_under(server, held, flag)
        said = _one_error_line(rc, err, starts)
        assert "password" not in said, said
        print(f"{stage} held at {point} under a restart: {said}")
        rc, out, err = _done(_trailbound(config_path, env, stage, "run", group, driver=driver))
        assert rc == 0, f"{stage} did not converge after the restart: {err[-3000:]}"

    assert digests(server.environment()["TRAILBOUND_TARGET_DSN"], TABLES) == digests(source, TABLES)
    last_commit = max(r["scn"] for segment in discover(archive) for r in pq.read_table(segment.path).to_pylist()
                      if r["op"] == "COMMIT")
    assert Csn.parse(checkpoint_row(server.environment()["TRAILBOUND_TARGET_DSN"])["log_csn"]).scn == last_commit


@pytest.mark.long_running(40)
def test_a_busy_server_with_idle_published_tables_does_not_hold_the_slot_back(source_server, source_dsn, tmp_path):
    """Heavy writes to an unpublished table of the same database and to another database
    of the same server, none to the published table: each pull still moves the slot's
    confirmed position up to where the server's WAL was when it started, so the server
    can recycle its WAL, and `info source` says how far behind the slot is."""
    execute(source_dsn, TABLE, "CREATE TABLE busy (id bigserial PRIMARY KEY, payload text)")
    config_path = write_config(tmp_path, tables=("public.items",))
    env = {**os.environ, SOURCE_ENV: source_dsn}

    def run(*words: str) -> str:
        done = subprocess.run([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), *words], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("add", "source", "PG")
    other = psycopg2.extensions.make_dsn(source_server.dsn(), dbname=f"other_{uuid.uuid4().hex[:8]}")
    execute(source_server.dsn(), f"CREATE DATABASE {psycopg2.extensions.parse_dsn(other)['dbname']}")
    try:
        pgbench(other, "-i", "-q", "-s", "2")
        for _ in range(3):
            (before,), = query(source_dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0:1]
            pgbench(other, "-n", "-c", "2", "-t", "300")
            execute(source_dsn, "INSERT INTO busy (payload) SELECT repeat(md5(g::text), 20) FROM generate_series(1, "
                                "20000) g")
            (written,), = query(source_dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0:1]
            assert written - before > 4 << 20, "the round wrote megabytes of WAL, none of it published"
            confirmed_before = slot_confirmed(source_dsn)
            said = run("archive", "pull", "PG")
            assert "pulled 0 change(s)" in said, said
            assert slot_confirmed(source_dsn) >= written > confirmed_before, "the slot did not move past the busy WAL"
            info = run("info", "source", "PG")
            lag = int(re.search(r"Slot lag: +(\d+) bytes not yet archived", info).group(1))
            (now,), = query(source_dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0:1]
            assert 0 <= lag <= now - written + (1 << 16), info
    finally:
        execute(source_server.dsn(), f"DROP DATABASE {psycopg2.extensions.parse_dsn(other)['dbname']} WITH (FORCE)")
