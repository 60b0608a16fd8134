"""The slot lost behind the pipeline: dropped while the pipeline is idle, dropped and
created again under the same name, advanced by hand, or invalidated by the server
(max_slot_wal_keep_size). The next pull refuses with one line naming the slot and the
gap (the archive's end against where the slot resumes), archives nothing and moves
nothing; `info source` shows the gap; `alter source --accept-gap` records it with the
user's consent; a load between watermarks then brings the target back to the source."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg2
import pyarrow.parquet as pq
import pytest

from pg_source_kit import SOURCE_ENV, digests, execute, query, source_dsn, source_server, write_config  # noqa: F401
from trailbound import cli
from trailbound import config as configuration
from trailbound.archive.segments import discover
from trailbound.capture.run import run_extract
from trailbound.pump.run import run_pump
from trailbound.replicat.run import run_replicat
from trailbound.sources.postgres.admin import pull
from trailbound.sources.postgres.lsn import Lsn

pytestmark = [pytest.mark.pg]

SLOT = "trailbound_pg"
ITEMS = "CREATE TABLE items (id int PRIMARY KEY, v int, pad text)"
WATERMARK = "trailbound.load_watermark"


def _cli(config_path: Path, source: str, *words: str) -> subprocess.CompletedProcess:
    """`trailbound WORDS` in a process of its own: what an operator sees."""
    return subprocess.run([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), *words],
                          env={**os.environ, SOURCE_ENV: source}, capture_output=True, text=True, timeout=300)


def _fingerprint(archive: Path) -> dict[str, str]:
    """Every file under the archive (segments, manifests, the miner's state) and its digest."""
    return {str(p.relative_to(archive)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(archive.rglob("*")) if p.is_file()}


def _slot(dsn: str) -> tuple | None:
    rows = query(dsn, "SELECT confirmed_flush_lsn::text, wal_status FROM pg_replication_slots WHERE slot_name = %s",
                 (SLOT,))
    return rows[0] if rows else None


def _archive_end(archive: Path) -> Lsn:
    return Lsn.of(discover(archive)[-1].next_scn)


def _records(archive: Path) -> list[dict]:
    return [row for segment in discover(archive) for row in pq.read_table(segment.path).to_pylist()]


def _refused(config_path: Path, dsn: str, archive: Path) -> str:
    """A pull that must refuse: one ERROR line, nothing archived, the slot not moved."""
    before, slot_before = _fingerprint(archive), _slot(dsn)
    refused = _cli(config_path, dsn, "archive", "pull", "PG")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(lines) == 1 and lines[0].startswith("ERROR source PG: "), refused.stderr
    assert f"replication slot '{SLOT}'" in lines[0] and f"LSN {_archive_end(archive)}" in lines[0], lines[0]
    assert "nothing was archived" in lines[0] and "--accept-gap" in lines[0] and "When the slot is lost" in lines[0]
    # (loading the miner's state prunes states older than the last two, as any pull does)
    assert _fingerprint(archive).items() <= before.items(), "a refused pull wrote to the archive"
    assert _slot(dsn) == slot_before, "a refused pull moved the slot"
    return lines[0]


def _added(tmp_path: Path, dsn: str, tables=("public.items",)) -> Path:
    execute(dsn, ITEMS)
    config_path = write_config(tmp_path, tables=tables)
    added = _cli(config_path, dsn, "add", "source", "PG")
    assert added.returncode == 0, added.stderr
    return config_path


def _insert(dsn: str, first: int, last: int) -> None:
    execute(dsn, f"INSERT INTO items SELECT g, g, md5(g::text) FROM generate_series({first}, {last}) g")


@pytest.mark.long_running(30)
def test_a_slot_dropped_while_idle_is_refused_until_the_gap_is_accepted(source_dsn, tmp_path):
    """Dropped with a streamed transaction open: refused (by `archive pull` and shown by
    `info source`) until `alter source --accept-gap`, which makes the slot again, closes
    the open transaction as rolled back and writes one segment spanning the gap; then
    pulls go on, and what was written in the gap is not in the archive (never silently)."""
    config_path = _added(tmp_path, source_dsn)
    archive = tmp_path / "archive"
    _insert(source_dsn, 1, 100)
    # A transaction that streams (logical_decoding_work_mem is 64kB) and stays open.
    open_txn = psycopg2.connect(source_dsn)
    with open_txn.cursor() as cur:
        cur.execute("INSERT INTO items SELECT g, g, repeat('x', 200) FROM generate_series(1001, 3000) g")
    assert _cli(config_path, source_dsn, "archive", "pull", "PG").returncode == 0
    assert "1 streamed transaction(s) open" in _cli(config_path, source_dsn, "archive", "pull", "PG").stdout
    end = _archive_end(archive)

    execute(source_dsn, f"SELECT pg_drop_replication_slot('{SLOT}')")
    open_txn.commit()  # its commit, and these rows, are written while no slot keeps them
    open_txn.close()
    _insert(source_dsn, 101, 200)
    line = _refused(config_path, source_dsn, archive)
    assert "is gone from the source" in line, line
    info = _cli(config_path, source_dsn, "info", "source", "PG")
    assert info.returncode == 0 and "GAP: replication slot" in info.stdout and str(end) in info.stdout, info.stdout

    no_consent = _cli(config_path, source_dsn, "alter", "source", "PG")
    assert no_consent.returncode == 2 and "--accept-gap" in no_consent.stderr
    accepted = _cli(config_path, source_dsn, "alter", "source", "PG", "--accept-gap")
    assert accepted.returncode == 0, accepted.stderr
    assert f"gap accepted: slot {SLOT} created again at" in accepted.stdout and f"LSN {end}.." in accepted.stdout
    assert "1 open streamed transaction(s) closed as rolled back" in accepted.stdout, accepted.stdout
    resume = Lsn.parse(_slot(source_dsn)[0])
    assert _archive_end(archive) == resume > end, "one segment spans the gap, up to where the new slot resumes"
    again = _cli(config_path, source_dsn, "alter", "source", "PG", "--accept-gap")
    assert again.returncode == 0 and "there is no gap to accept" in again.stdout, again.stdout

    _insert(source_dsn, 201, 300)
    pulled = _cli(config_path, source_dsn, "archive", "pull", "PG")
    assert pulled.returncode == 0, pulled.stderr
    records = _records(archive)
    ids = [json.loads(r["after"])["id"] for r in records if r["op"] == "INSERT"]
    inserted = sorted(i for i in ids if i <= 300)
    assert inserted == list(range(1, 101)) + list(range(201, 301)), "the gap's rows are not in the archive"
    streamed = {r["xid"] for r in records if r["op"] == "INSERT" and json.loads(r["after"])["id"] > 1000}
    assert len(streamed) == 1 and [r["op"] for r in records if r["xid"] in streamed and r["op"] != "INSERT"] == \
        ["ROLLBACK"], "the streamed transaction whose commit fell in the gap is closed as rolled back"
    info = _cli(config_path, source_dsn, "info", "source", "PG").stdout
    assert "GAP:" not in info and f"LSN {end}..{resume} (gone) is not in the archive" in info, info


@pytest.mark.long_running(20)
def test_a_slot_advanced_by_hand_or_invalidated_by_the_server_is_refused(source_server, source_dsn, tmp_path):
    """pg_replication_slot_advance past the archive, and a slot the server invalidated
    because it held more WAL than max_slot_wal_keep_size allows: both refused."""
    config_path = _added(tmp_path, source_dsn)
    archive = tmp_path / "archive"
    _insert(source_dsn, 1, 100)
    assert _cli(config_path, source_dsn, "archive", "pull", "PG").returncode == 0
    _insert(source_dsn, 101, 200)
    # Past what the archive holds, to WAL that is flushed: logical decoding stops at the
    # flush position, and the suite's servers run with synchronous_commit off (advanced to
    # pg_current_wal_lsn(), the slot stayed where it was whenever the WAL writer had not yet
    # flushed the inserts: 2 runs in 3 on a fast machine, and the pull was not refused).
    execute(source_dsn, "CHECKPOINT", f"SELECT pg_replication_slot_advance('{SLOT}', pg_current_wal_flush_lsn())")
    assert Lsn.parse(_slot(source_dsn)[0]) > _archive_end(archive)
    line = _refused(config_path, source_dsn, archive)
    assert f"resumes at LSN {_slot(source_dsn)[0]}, past the archive's end at LSN {_archive_end(archive)}" in line
    assert "dropped and created again, or advanced" in line

    admin = source_server.dsn()
    execute(admin, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()")
    try:
        for _ in range(20):  # WAL past the slot's reserve, then checkpoints remove it
            _insert(source_dsn, 10_000, 10_100)
            execute(source_dsn, "DELETE FROM items WHERE id >= 10000", "SELECT pg_switch_wal()", "CHECKPOINT")
            if _slot(source_dsn)[1] == "lost":
                break
        assert _slot(source_dsn)[1] == "lost", "the server did not invalidate the slot"
    finally:
        execute(admin, "ALTER SYSTEM RESET max_slot_wal_keep_size", "SELECT pg_reload_conf()")
    line = _refused(config_path, source_dsn, archive)
    assert "was invalidated by the server (wal_status lost" in line, line
    accepted = _cli(config_path, source_dsn, "alter", "source", "PG", "--accept-gap")
    assert accepted.returncode == 0 and "created again at" in accepted.stdout, accepted.stderr
    assert _slot(source_dsn)[1] in ("reserved", "extended")
    assert _cli(config_path, source_dsn, "archive", "pull", "PG").returncode == 0


@pytest.mark.spark
@pytest.mark.long_running(90)
def test_a_slot_dropped_and_created_again_is_refused_and_the_way_back_converges(source_dsn, target_dsn, metadata_dsn,
                                                                                store, spark, tmp_path, monkeypatch,
                                                                                spark_remote):
    """Dropped and created again under the same name while inserts, updates and deletes
    go on: refused, naming both positions; after `alter source --accept-gap` the target
    misses the gap's changes; a load between watermarks (docs/live-postgres.md's way
    back) makes it equal to the source again."""
    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    monkeypatch.setenv(configuration.TARGET_DSN_ENV, target_dsn)
    monkeypatch.setenv(configuration.METADATA_DSN_ENV, metadata_dsn)
    config_path = _added(tmp_path, source_dsn, tables=("public.items", WATERMARK))
    # Rows the log may update before the load brings them: GoldenGate's initial-load practice.
    config_path.write_text(config_path.read_text().replace("grouptransops: 500}",
                                                           "grouptransops: 500, handlecollisions: true}"))
    assert cli.main(["--config", str(config_path), "target", "create"]) == 0
    archive = tmp_path / "archive"

    def round_trip():
        config = configuration.load(config_path)
        pull(config, "PG")
        run_extract(spark, store, config, "EXT1")
        run_pump(None, store, config, "PMP1")
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)

    _insert(source_dsn, 1, 2000)
    round_trip()
    tables = [("public", "items")]
    assert digests(target_dsn, tables) == digests(source_dsn, tables)

    execute(source_dsn, f"SELECT pg_drop_replication_slot('{SLOT}')")
    _insert(source_dsn, 2001, 2500)
    execute(source_dsn, "UPDATE items SET v = -v WHERE id % 7 = 0", "DELETE FROM items WHERE id % 11 = 0")
    execute(source_dsn, f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
    _insert(source_dsn, 2501, 2600)
    line = _refused(config_path, source_dsn, archive)
    assert f"resumes at LSN {_slot(source_dsn)[0]}, past the archive's end" in line, line

    accepted = _cli(config_path, source_dsn, "alter", "source", "PG", "--accept-gap")
    assert accepted.returncode == 0 and "created again" not in accepted.stdout, accepted.stdout
    assert "load the tables again" in accepted.stdout
    round_trip()
    assert digests(target_dsn, tables) != digests(source_dsn, tables), "the gap's changes cannot have arrived"
    # The operator's command, its Spark work on the worker's warm JVM (Connect): no JVM of its own.
    loaded = _cli(config_path, source_dsn, "--remote", spark_remote, "load", "PG", "REP1", "--mode", "watermark",
                  "--chunk-rows", "1000")
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    round_trip()
    assert digests(target_dsn, tables) == digests(source_dsn, tables)
