"""The bad-input corpus: every malformed archive and every corrupt
trail file stops the `trailbound` command with exit status 1 and one ERROR line naming
the file and the rba (a JSON Lines error: its line), and writes nothing: checkpoints,
catalog, trail listing, target rows and every file are compared before and after.

The commands run in this process (`cli.main`, the console script's entry point) so that
they share the suite's Spark session; one case runs the real console script to show the
same through a separate process. The cases themselves are tables in bad_input_kit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg2
import pytest

import bad_input_kit as kit
from trailbound import cli
from trailbound import config as configuration
from trailbound.capture.run import run_extract
from trailbound.metadata import MetadataStore

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def _run_cli(pipeline, argv, capsys, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", pipeline.metadata_dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", pipeline.target_dsn)
    capsys.readouterr()
    status = cli.main(["--config", str(pipeline.config_path), *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _one_error_line(status: int, out: str, err: str, file: str, rba: int | None) -> str:
    assert status == 1, f"exit status {status}; out={out!r} err={err!r}"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR "), f"one ERROR line expected, got {err!r}"
    line = lines[0]
    assert file in line, f"the error must name {file}: {line}"
    if rba is not None:
        assert f"{file} rba {rba}:" in line, f"the error must name rba {rba}: {line}"
    else:
        assert " rba " not in line.split(": ", 1)[0], f"a file-level error names no rba: {line}"
    return line


# ------------------------------------------------------------------ archives

@pytest.fixture(scope="module")
def archive_pipeline(tmp_path_factory, pg_server_dsn, metadata_template, spark):
    """Segment 1 captured (A written, OPEN and its savepoint open), then saved."""
    pipeline = kit.new_pipeline(tmp_path_factory.mktemp("bad-archive") / "home", pg_server_dsn, uuid.uuid4().hex[:8])
    kit.first_segment(pipeline.archive)
    with MetadataStore.open(pipeline.metadata_dsn) as store:
        result = run_extract(spark, store, configuration.load(pipeline.config_path), "EXT1")
    assert result.transactions_written == 1 and result.open_transactions == 1
    pipeline.save()
    yield pipeline
    pipeline.drop()


@pytest.mark.parametrize("case", kit.ARCHIVE_CASES, ids=lambda case: case.__name__)
def test_a_malformed_archive_stops_capture_and_writes_nothing(archive_pipeline, case, capsys, monkeypatch):
    pipeline = archive_pipeline
    pipeline.restore()
    expect = case(pipeline.archive)
    if expect.capture_path:  # the scan accepts it (it cannot see segment 1): catalog it first
        assert _run_cli(pipeline, ["archive", "scan"], capsys, monkeypatch)[0] == 0
    before = kit.snapshot(pipeline)
    status, out, err = _run_cli(pipeline, ["extract", "run", "EXT1"], capsys, monkeypatch)
    line = _one_error_line(status, out, err, expect.file, expect.rba)
    assert expect.message in line, f"expected {expect.message!r} in {line}"
    assert kit.changes(before, kit.snapshot(pipeline)) == []


def test_the_corpus_is_what_the_issue_asks_for():
    names = {case.__name__ for case in kit.ARCHIVE_CASES}
    assert len(names) == len(kit.ARCHIVE_CASES) >= 20
    assert len(kit.TRAIL_CASES) >= 10


# ------------------------------------------------------------------ trails

@pytest.fixture(scope="module")
def trail_pipeline(tmp_path_factory, pg_server_dsn, metadata_template, spark):
    """A, then B and C, captured one file each (lt1, lt2, lt3); pump and replicat have
    processed lt1 only, so lt2 is the next file both read."""
    from trailbound.archive.segments import load_defs
    from trailbound.pump.run import run_pump
    from trailbound.replicat import target
    from trailbound.replicat.run import run_replicat

    pipeline = kit.new_pipeline(tmp_path_factory.mktemp("bad-trail") / "home", pg_server_dsn, uuid.uuid4().hex[:8])
    config = configuration.load(pipeline.config_path)
    pipeline.archive.segment(kit.THREAD, [kit.ins(10, "A", 1), kit.rec(20, "A", "COMMIT")], 100)
    connection = target.connect(config, pipeline.target_dsn)
    with connection.cursor() as cur:
        target.create_tables(cur, load_defs(pipeline.archive.root), target.IDENTITY)
    connection.commit()
    connection.close()
    with MetadataStore.open(pipeline.metadata_dsn) as store:
        run_extract(spark, store, config, "EXT1")
        assert len(run_pump(None, store, config, "PMP1").shipped) == 1
        assert run_replicat(spark, store, config, "REP1", target_dsn=pipeline.target_dsn).transactions == 1
        # Once more with nothing new: the file checkpoint catches up with the checkpoint
        # table (saved lazily), so a refused run later has nothing to repair.
        run_replicat(spark, store, config, "REP1", target_dsn=pipeline.target_dsn)
        pipeline.archive.segment(kit.THREAD, [kit.ins(110, "B", 2), kit.rec(120, "B", "COMMIT"),
                                              kit.ins(130, "C", 3), kit.rec(140, "C", "COMMIT")], 200)
        assert len(run_extract(spark, store, config, "EXT1").files) == 2
    pipeline.save()
    yield pipeline
    pipeline.drop()


@pytest.mark.parametrize("damage,message,rba", kit.TRAIL_CASES, ids=[c[0].__name__ for c in kit.TRAIL_CASES])
def test_a_corrupt_trail_file_stops_pump_replicat_and_logdump(trail_pipeline, damage, message, rba, capsys,
                                                             monkeypatch):
    pipeline = trail_pipeline
    pipeline.restore()
    path = pipeline.home / "dirdat" / "lt000000002"
    damage(path)
    before = kit.snapshot(pipeline)
    expected = "not there" if damage is kit.missing_file else "does not match the recorded"
    for argv in (["pump", "run", "PMP1"], ["replicat", "run", "REP1"]):
        status, out, err = _run_cli(pipeline, argv, capsys, monkeypatch)
        assert expected in _one_error_line(status, out, err, str(path), 0), argv
    status, out, err = _run_cli(pipeline, ["logdump", str(path)], capsys, monkeypatch)
    if message is None:  # a valid trail file on its own: logdump shows it
        assert status == 0 and len(out.splitlines()) == 1
    else:
        assert message in _one_error_line(status, out, err, str(path), rba)
    assert kit.changes(before, kit.snapshot(pipeline)) == []


def test_a_trail_file_past_the_committed_write_position_is_never_read(trail_pipeline, capsys, monkeypatch):
    """A file no write checkpoint covers (a capture that died before its commit) is
    invisible: pump and replicat read only the committed files, and the next capture
    run replaces it."""
    pipeline = trail_pipeline
    pipeline.restore()
    stray = pipeline.home / "dirdat" / "lt000000004"
    stray.write_bytes((pipeline.home / "dirdat" / "lt000000003").read_bytes())
    for argv in (["pump", "run", "PMP1"], ["replicat", "run", "REP1"]):
        status, out, err = _run_cli(pipeline, argv, capsys, monkeypatch)
        assert status == 0 and err == "", err
        assert "seqno 4" not in out and "lt000000004" not in out
    assert sorted(p.name for p in (pipeline.home / "remote").iterdir()) == ["rt000000001", "rt000000002",
                                                                            "rt000000003"]
    status, out, err = _run_cli(pipeline, ["info", "replicat", "REP1", "--showch"], capsys, monkeypatch)
    assert status == 0 and "Log Read Checkpoint" in out or "seqno 3" in out or "Seqno 3" in out, out


def test_the_trailbound_command_exits_1_with_one_line(trail_pipeline):
    """The same through the `trailbound` console script in a process of its own (pump and
    logdump need no Spark, so stderr holds nothing but trailbound's own line)."""
    pipeline = trail_pipeline
    pipeline.restore()
    path = pipeline.home / "dirdat" / "lt000000002"
    kit.flipped_byte_in_a_page(path)
    before = kit.snapshot(pipeline)
    command = shutil.which("trailbound") or str(Path(sys.executable).with_name("trailbound"))
    env = {**os.environ, "TRAILBOUND_METADATA_DSN": pipeline.metadata_dsn}
    for argv, message in ((["pump", "run", "PMP1"], "does not match the recorded"),
                          (["logdump", str(path)], "damaged trail file")):
        done = subprocess.run([command, "--config", str(pipeline.config_path), *argv], env=env,
                              capture_output=True, text=True, timeout=120)
        assert message in _one_error_line(done.returncode, done.stdout, done.stderr, str(path), 0)
        assert done.stdout == ""
    assert kit.changes(before, kit.snapshot(pipeline)) == []


def test_a_file_that_is_not_what_the_catalog_committed_stops_pump_and_replicat(trail_pipeline, capsys, monkeypatch):
    """The bytes match the committed SHA-256 but the catalog's record count does not
    (what a writer that verified nothing could commit): pump reads its copy back and
    counts it, replicat counts what it read, and both refuse before any checkpoint."""
    pipeline = trail_pipeline
    pipeline.restore()
    path = pipeline.home / "dirdat" / "lt000000002"
    connection = psycopg2.connect(pipeline.metadata_dsn)
    with connection, connection.cursor() as cur:
        cur.execute("UPDATE trailbound.trail_file SET records = records + 1 WHERE path = %s RETURNING records",
                    (str(path),))
        listed = cur.fetchone()[0]
    connection.close()
    before = kit.snapshot(pipeline)
    status, out, err = _run_cli(pipeline, ["pump", "run", "PMP1"], capsys, monkeypatch)
    line = _one_error_line(status, out, err, str(pipeline.home / "remote" / "rt000000002"), 0)
    assert f"shipped from {path}" in line and f"wrote {listed} records" in line and \
        f"reads {listed - 1} records" in line, line
    status, out, err = _run_cli(pipeline, ["replicat", "run", "REP1"], capsys, monkeypatch)
    line = _one_error_line(status, out, err, str(path), listed - 1)
    assert f"holds {listed - 1} records; the trail lists {listed}" in line, line
    assert kit.changes(before, kit.snapshot(pipeline)) == []
