"""`trailbound replicate SRC`: a live PostgreSQL source's pull, capture, pump and replicat
run at once, each a loop of ordinary runs in a process of its own, until the target
holds the source's end as of the start. pgbench writes a backlog; the command runs to
caught up; the target equals the source table by table and every checkpoint is at the
end (capture's read position at the archive's end, every trail file shipped byte for
byte, the checkpoint row at the archive's last COMMIT), every run recorded as ended
well. Then a capture process killed (kill -9) mid-run: the command stops with one line
naming the stage, the other stages stopped cleanly, and a rerun converges.

The capture processes are Spark Connect clients of the suite's own JVM (`spark_remote`):
no JVM of their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pg_source_kit import (SOURCE_ENV, digests, execute, pgbench, query, slot_confirmed, source_dsn,  # noqa: F401
                           source_server, write_config)
from replicat_kit import checkpoint_row
from trailbound import cli
from trailbound import config as configuration
from trailbound.archive.segments import discover
from trailbound.capture import checkpoints as extract_checkpoints
from trailbound.overlap import pipeline
from trailbound.positions import Csn, Scn

pytestmark = [pytest.mark.spark, pytest.mark.pg]

TABLES = [("public", "pgbench_accounts"), ("public", "pgbench_branches"), ("public", "pgbench_tellers"),
          ("public", "pgbench_history")]


def test_the_pipeline_of_a_source_and_what_replicate_refuses(tmp_path, capsys):
    """A source's stages, upstream first; a source nothing would carry to the target, and
    a loop given a past interval or a pull of its own, refused in one line before
    anything runs."""
    config = configuration.load(write_config(tmp_path))
    assert [str(stage) for stage in pipeline(config, "pg")] == ["pull PG", "capture EXT1", "pump PMP1",
                                                                "replicat REP1"]
    lonely = tmp_path / "lonely.yaml"
    lonely.write_text(f"home: {tmp_path}\nsources:\n  SIM: {{altarchivelogdest: sim}}\n"
                      "extracts:\n  EXT9: {source: SIM, exttrail: dirdat/sim, table: ['*.*']}\n")
    assert cli.main(["--config", str(lonely), "replicate", "SIM"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "ERROR no replicat in the configuration applies a trail of source SIM's extracts (EXT9) or of their pumps: "
        "nothing would reach the target"]
    for option in (["--pull"], ["--until", "2026-11-01T00:00:00Z"]):
        assert cli.main(["--config", str(lonely), "extract", "run", "EXT9", "--loop", *option]) == 1
        assert "--loop runs each capture up to what is archived then" in capsys.readouterr().err


def _replicate(config_path: Path, remote: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "--remote", remote,
                             "replicate", "PG", "--poll", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _capture_process(parent: int) -> int | None:
    """The pid of `parent`'s child running `extract run ... --loop`, if it has started."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and b"extract" in words and b"--loop" in words:
            return int(entry.name)
    return None


def _capture_running(store, after: int) -> bool:
    with store.transaction() as cur:
        cur.execute("SELECT count(*) AS n FROM trailbound.run_outcome WHERE kind = 'extract' AND run_id > %s"
                    " AND ended_at IS NULL", (after,))
        return cur.fetchone()["n"] > 0


def _last_run_id(store) -> int:
    with store.transaction() as cur:
        cur.execute("SELECT coalesce(max(run_id), 0) AS id FROM trailbound.run_outcome")
        return cur.fetchone()["id"]


def _assert_converged(source: str, target_dsn: str, store, config, tmp_path: Path) -> None:
    """The target equals the source, and every stage's checkpoint is at the end."""
    assert digests(target_dsn, TABLES) == digests(source, TABLES)
    archive = config.archive_dir("PG")
    segments = discover(archive)
    archive_end = segments[-1].next_scn.value
    assert slot_confirmed(source) <= archive_end, "the slot was confirmed past the archive"
    with store.transaction() as cur:
        assert extract_checkpoints.load(cur, "EXT1").read_scn == Scn(archive_end)
    local = {p.name: p.read_bytes() for p in (tmp_path / "dirdat").glob("lt*")}
    remote = {p.name.replace("rt", "lt", 1): p.read_bytes() for p in (tmp_path / "remote").glob("rt*")}
    assert local and remote == local, "the pump did not ship every trail file whole"
    commits = [r["scn"] for s in segments for r in pq.read_table(s.path, columns=["op", "scn"]).to_pylist()
               if r["op"] == "COMMIT"]
    assert Csn.parse(checkpoint_row(target_dsn)["log_csn"]).scn == max(commits)


@pytest.mark.long_running(150)
def test_replicate_runs_the_stages_at_once_to_caught_up_and_a_killed_stage_stops_it(
        source_dsn, target_dsn, store, spark_remote, tmp_path, monkeypatch, capsys):
    source = source_dsn
    monkeypatch.setenv(SOURCE_ENV, source)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    config_path = write_config(tmp_path, tables=("public.pgbench_*",), segment={"records": 20000})
    config = configuration.load(config_path)
    pgbench(source, "-i", "-I", "dtp", "-q")
    execute(source, "ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
    assert cli.main(["--config", str(config_path), "add", "source", "PG"]) == 0
    assert cli.main(["--config", str(config_path), "target", "create"]) == 0
    pgbench(source, "-i", "-I", "g", "-q")  # 100,000 rows: several segments for capture to follow
    pgbench(source, "-n", "-c", "2", "-t", "100")

    replicate = _replicate(config_path, spark_remote)
    out, err = replicate.communicate(timeout=600)
    assert replicate.returncode == 0, err[-3000:]
    lines = out.strip().splitlines()
    assert lines[-1].startswith("Source PG: caught up in "), out
    assert any(line.startswith("Source PG: pulled ") for line in lines), out
    assert any(line.startswith("Extract EXT1") for line in lines), out
    assert any(line.startswith("Replicat REP1") for line in lines), out
    _assert_converged(source, target_dsn, store, config, tmp_path)
    with store.transaction() as cur:
        cur.execute("SELECT kind, outcome, ended_at IS NOT NULL AS ended FROM trailbound.run_outcome")
        runs = cur.fetchall()
    assert {r["kind"] for r in runs} == {"extract", "pump", "replicat"}
    assert all(r["outcome"] == "ok" and r["ended"] for r in runs), runs

    # A capture process killed mid-run: one line naming the stage; the others stop.
    before = _last_run_id(store)
    pgbench(source, "-n", "-c", "2", "-t", "100")
    replicate = _replicate(config_path, spark_remote)
    deadline = time.monotonic() + 300
    while not _capture_running(store, before):
        assert replicate.poll() is None and time.monotonic() < deadline, replicate.communicate()
        time.sleep(0.05)
    os.kill(_capture_process(replicate.pid), signal.SIGKILL)
    out, err = replicate.communicate(timeout=600)
    lines = err.strip().splitlines()
    assert replicate.returncode == 1 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("ERROR replicate PG: capture EXT1 failed: killed by signal 9 (SIGKILL); "), lines[0]
    with store.transaction() as cur:  # the others ended their runs well; only the killed one is open
        cur.execute("SELECT kind, outcome, ended_at IS NULL AS open FROM trailbound.run_outcome WHERE run_id > %s",
                    (before,))
        runs = cur.fetchall()
    assert [r["kind"] for r in runs if r["open"]] == ["extract"], runs
    assert all(r["outcome"] == "ok" for r in runs if not r["open"]), runs

    replicate = _replicate(config_path, spark_remote)
    out, err = replicate.communicate(timeout=600)
    assert replicate.returncode == 0, err[-3000:]
    _assert_converged(source, target_dsn, store, config, tmp_path)
