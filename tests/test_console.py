"""The operator's console on the command line: every run's outcome recorded (ABENDED until
a run succeeds), INFO ALL, wildcards in INFO, the status data the Airflow view renders."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg2
import pytest

from capture_kit import ins, load_config, new_archive, rec, write_config
from trailbound import cli, runlog, status
from trailbound.errors import TrailboundError

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def tb(config_path, *words) -> list[str]:
    return ["--config", str(config_path), *words]


def test_a_failed_run_abends_its_group_until_a_run_succeeds(tmp_path, spark, store, capsys, monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT"), ins(30, "OPEN", 2)], 100)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 0
    capsys.readouterr()
    assert cli.main(tb(config_path, "info", "all")) == 0
    shown = capsys.readouterr().out
    [line] = [x for x in shown.splitlines() if x.startswith("EXTRACT")]
    assert line.split()[:3] == ["EXTRACT", "STOPPED", "EXT1"]
    lag, since = line.split()[3:5]
    assert lag.count(":") == 2 and since.count(":") == 2
    assert "UTC" in shown

    # The archive goes missing: the run fails, and says so everywhere an operator looks.
    (tmp_path / "archive").rename(tmp_path / "archive.away")
    assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 1
    error = capsys.readouterr().err.removeprefix("ERROR ").strip()
    assert cli.main(tb(config_path, "info", "all")) == 0
    shown = capsys.readouterr().out
    assert [x for x in shown.splitlines() if x.startswith("EXTRACT ")][0].split()[:3] == ["EXTRACT", "ABENDED", "EXT1"]
    assert f"EXTRACT EXT1 ABENDED " in shown and error[:60] in shown and " UTC: " in shown
    assert cli.main(tb(config_path, "info", "extract", "ext1")) == 0
    report = capsys.readouterr().out
    assert "Status ABENDED" in report.splitlines()[0] and "Last Error" in report and error[:60] in report
    [last] = runlog.history(store, "extract", "EXT1", limit=1)
    assert (last.outcome, last.ended_at is not None, last.command) == ("error", True,
                                                                       f"trailbound --config {config_path} extract run EXT1")

    # Fixed: the next run succeeds and the group is STOPPED again.
    (tmp_path / "archive.away").rename(tmp_path / "archive")
    assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 0
    capsys.readouterr()
    assert cli.main(tb(config_path, "info", "extract", "*")) == 0
    report = capsys.readouterr().out
    assert "Status STOPPED" in report and "Last Error" not in report and "Last Run" in report
    assert [o.outcome for o in runlog.history(store, "extract", "EXT1")] == ["ok", "error", "ok"]


def test_a_killed_run_is_abended_and_a_refused_one_changes_nothing(tmp_path, spark, store, monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT")], 100)
    config_path = write_config(tmp_path)
    config = load_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 0
    # A process killed in the middle of a run: its row has no end, nothing holds the group.
    script = ("import os, sys\nfrom trailbound.metadata import MetadataStore\nfrom trailbound.runlog import recorded_run\n"
              "store = MetadataStore.open(sys.argv[1])\n"
              "with recorded_run(store, 'extract', 'EXT1', 'trailbound extract run EXT1'):\n    os._exit(9)\n")
    killed = subprocess.run([sys.executable, "-c", script, store.connection.dsn], env=os.environ.copy())
    assert killed.returncode == 9
    [ext1] = status.info_all(store, config)
    assert ext1.status == "ABENDED" and "ended without recording an outcome" in ext1.error

    holder = psycopg2.connect(store.connection.dsn)
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(hashtext('extract:EXT1'))")
        assert status.info_all(store, config)[0].status == "RUNNING"
        assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 1  # refused: the group is held
    finally:
        holder.close()
    assert [o.outcome for o in runlog.history(store, "extract", "EXT1")][:2] == ["refused", "running"]
    assert status.info_all(store, config)[0].status == "ABENDED", "a refused run says nothing of the group"
    assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 0
    assert status.info_all(store, config)[0].status == "STOPPED"


def test_info_all_lists_every_configured_group_and_wildcards_match_them(tmp_path, store, capsys, monkeypatch):
    new_archive(tmp_path)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(tb(config_path, "info", "all")) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("EXTRACT")]
    assert line.split()[:3] == ["EXTRACT", "STOPPED", "EXT1"] and line.endswith("(not added yet)")
    assert cli.main(tb(config_path, "info", "extract", "X*")) == 1
    assert "no extract group matching 'X*' is added" in capsys.readouterr().err


def test_a_run_error_is_recorded_without_a_password():
    text = runlog.error_text(TrailboundError("cannot connect to postgresql://tb:s3cret@db:5432/meta "
                                             "(host=db password=s3cret)"))
    assert "s3cret" not in text and "cannot connect" in text


def test_open_transactions_oldest_first_with_age_and_the_long_ones(tmp_path, spark, store):
    from trailbound.capture.run import run_extract

    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "OLD", 1), ins(3000, "NEW", 2), ins(3500, "A", 3), rec(3501, "A", "COMMIT")], 7200)
    config = load_config(tmp_path)  # WARNLONGTRANS 1h by default
    run_extract(spark, store, config, "EXT1")
    found = status.open_transactions(store, config, "EXT1")
    assert [(t.xid, t.age.total_seconds(), t.long_running, t.br_state) for t in found] == [
        ("OLD", 7190.0, True, "not persisted"), ("NEW", 4200.0, True, "not persisted")]
    assert found[0].start_position == "1:1:0" and found[0].start_scn == 10
    [point] = status.lag_history(store, "extract", "EXT1")
    assert point.lag.total_seconds() > 0
