"""The operator's console on the command line: every run's outcome recorded (ABENDED until
a run succeeds), INFO ALL, wildcards in INFO, the status data the console in Airflow
shows (its JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from capture_kit import ins, load_config, new_archive, rec, write_config
from pg_source_kit import source_dsn, source_server  # noqa: F401 (fixtures)
from trailbound import cli, runlog, status
from trailbound.errors import TrailboundError
from trailbound.positions import Scn

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


def test_a_killed_run_is_abended_and_a_refused_one_changes_nothing(tmp_path, spark, store, group_held_elsewhere,
                                                                   monkeypatch):
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

    with group_held_elsewhere("extract", "EXT1"):
        assert status.info_all(store, config)[0].status == "RUNNING"
        assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 1  # refused: the group is held
    assert [o.outcome for o in runlog.history(store, "extract", "EXT1")][:2] == ["refused", "running"]
    assert status.info_all(store, config)[0].status == "ABENDED", "a refused run says nothing of the group"
    assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 0
    assert status.info_all(store, config)[0].status == "STOPPED"


def test_each_lag_point_names_the_airflow_run_that_committed_it(tmp_path, spark, store, monkeypatch):
    """The task passes its DAG run (--airflow-run); the console links each point to it."""
    archive = new_archive(tmp_path)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    runs = [("capture_ext1", "scheduled__2026-11-01T01:00:00+00:00"), None,
            ("capture_ext1", "manual__2026-11-01T03:00:00+00:00")]
    for n, run in enumerate(runs):
        archive.segment(1, [ins(100 * n + 10, f"T{n}", n + 1), rec(100 * n + 20, f"T{n}", "COMMIT")], 100 * (n + 1))
        assert cli.main(tb(config_path, "extract", "run", "EXT1", *(["--airflow-run", *run] if run else []))) == 0
    points = status.lag_history(store, "extract", "EXT1")
    assert [(p.airflow_dag_id, p.airflow_run_id) for p in points] == [run or (None, None) for run in runs]
    with store.transaction() as cur:   # each run's throughput: what it wrote, over its wall time
        cur.execute("SELECT records_written, ended_at - started_at AS took FROM trailbound.extract_run ORDER BY run_id")
        assert [(p.records, p.seconds) for p in points] == [(r["records_written"], r["took"].total_seconds())
                                                           for r in cur.fetchall()]
    assert [o.airflow_run_id for o in runlog.history(store, "extract", "EXT1")] == [
        run and run[1] for run in reversed(runs)]


def test_command_line_frictions(tmp_path, store, capsys, monkeypatch):
    new_archive(tmp_path)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    # An unknown group is said before any JVM starts: with no Java at all, the error is ours.
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "extract", "run",
                           "NOPE"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("ERROR no extract named 'NOPE'"), done.stderr
    assert "java" not in done.stderr.lower()
    # --config after the verb, as well as before it.
    assert cli.main(["info", "all", "--config", str(config_path)]) == 0
    assert "EXTRACT" in capsys.readouterr().out
    # An unquoted `info extract *` the shell expanded into the file names here.
    monkeypatch.chdir(tmp_path)
    names = sorted(path.name for path in tmp_path.iterdir())
    assert len(names) >= 2
    assert cli.main(tb(config_path, "info", "extract", *names)) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"ERROR trailbound info extract: {len(names)} words where one group name goes") and \
        "the shell expanded an unquoted * or ?" in said and "trailbound info extract '*'" in said, said
    assert cli.main(tb(config_path, "info", "extract", names[0])) == 1, "one file: the shell's * in a directory of one"
    assert "quote the wildcard: trailbound info extract '*'" in capsys.readouterr().err


def test_info_all_lists_every_group_configured_or_known_to_the_store_and_wildcards_match_them(tmp_path, store, capsys, monkeypatch):
    new_archive(tmp_path)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(tb(config_path, "info", "all")) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("EXTRACT")]
    assert line.split()[:3] == ["EXTRACT", "STOPPED", "EXT1"] and line.endswith("(not added yet)")
    # A group another configuration added to the same store is listed too, marked.
    assert cli.main(tb(config_path, "add", "extract", "EXT1")) == 0
    other = tmp_path / "other.yaml"
    other.write_text(config_path.read_text().replace("EXT1:", "EXT2:"))
    capsys.readouterr()
    assert cli.main(tb(other, "info", "all")) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("EXTRACT")]
    assert [x.split()[2] for x in lines] == ["EXT1", "EXT2"], lines
    assert lines[0].endswith("(not in this configuration)") and lines[1].endswith("(not added yet)")
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
    assert found[0].start_position == "1:1:0" and found[0].start_scn == Scn(10)
    [point] = status.lag_history(store, "extract", "EXT1")
    assert point.lag.total_seconds() > 0
    # A pump's and a replicat's lag: the commit time of a CSN, from the archive catalog.
    from capture_kit import at
    from trailbound.positions import Csn

    with store.transaction() as cur:
        assert status.commit_time(cur, Csn.parse("3501@1:1:3")) == at(3501)
        assert status.commit_time(cur, Csn.parse("3501@1:9:3")) is None, "no such segment"


def test_the_long_transaction_alert_reaches_a_users_notifier_with_group_xid_age_position_and_commands():
    from airflow.sdk import BaseNotifier

    from trailbound_airflow.notifiers import LongTransactionNotifier, long_transaction_message

    class Recorder(BaseNotifier):
        template_fields = ("text",)

        def __init__(self):
            super().__init__()
            self.text, self.sent = "{{ trailbound_alert }}", []

        def notify(self, context):
            self.sent.append(self.text)

    mine = Recorder()
    long_ones = [{"xid": "X9", "thread": 2, "age_seconds": 5400.0, "start_time": "2026-11-01T00:00:10+00:00",
                  "start_position": "2:7:41", "start_scn": 10, "records": 3}]
    message = long_transaction_message("EXT1", long_ones, 3600)
    LongTransactionNotifier(notifiers=[mine])({"trailbound_alert": message, "long_transactions": long_ones})
    [sent] = mine.sent
    for expected in ("EXTRACT EXT1", "WARNLONGTRANS 1:00:00", "xid 'X9' thread 2 open 1:30:00", "start position 2:7:41",
                     "trailbound send extract EXT1 skiptrans X9 --thread 2", "FORCETRANS X9 THREAD 2"):
        assert expected in sent, sent


def test_the_pages_data_links_each_run_to_its_dag_run_relative_to_the_ui_and_says_utc():
    from datetime import datetime, timedelta, timezone

    from trailbound.stats import TableStats
    from trailbound_airflow.console import Snapshot, console_data

    now = datetime(2026, 11, 23, 1, 0, tzinfo=timezone.utc)
    point = status.LagPoint
    key = ("replicat", "REP1")
    snap = Snapshot(now=now, groups=[status.GroupStatus("replicat", "REP1", "ABENDED", True, now, timedelta(seconds=5),
                                                        timedelta(seconds=60), None, "target <gone>", now)],
                    # Two runs committed by DAG runs (each recorded its own), one from the CLI.
                    lags={key: [
                        point(now - timedelta(hours=2), timedelta(seconds=70), "replicat_rep1",
                              "scheduled__2026-11-22T23:00:00+00:00", 600, 12.0),
                        point(now - timedelta(hours=1), timedelta(seconds=50), records=0, seconds=3.0),
                        point(now, timedelta(seconds=5), "replicat_rep1", "scheduled__2026-11-23T00:00:00+00:00")]},
                    dags={key: ["replicat_rep1"]},
                    stats={key: [TableStats("shop.orders", "shop.orders",
                                            dict(inserts=5, updates=1, deletes=1, truncates=0, discards=2,
                                                 collisions=1))]})
    data = json.loads(json.dumps(console_data(snap)))  # what the page receives
    [group] = data["groups"]
    assert (group["status"], group["error"], group["error_time"]) == ("ABENDED", "target <gone>",
                                                                      "2026-11-23T01:00:00+00:00")
    assert group["dags"] == [{"dag_id": "replicat_rep1", "href": "dags/replicat_rep1/runs"}]
    # Each point links to its own DAG run, when one committed it; relative to the UI's base URL.
    assert [r["href"] for r in group["runs"]] == [
        "dags/replicat_rep1/runs/scheduled__2026-11-22T23%3A00%3A00%2B00%3A00", None,
        "dags/replicat_rep1/runs/scheduled__2026-11-23T00%3A00%3A00%2B00%3A00"]
    assert [r["lag"] for r in group["runs"]] == [70.0, 50.0, 5.0]
    assert [r["records_per_second"] for r in group["runs"]] == [50.0, 0.0, None], "throughput: records per second"
    assert group["tables"] == [{"table": "shop.orders", "target": "shop.orders", "inserts": 5, "updates": 1,
                                "deletes": 1, "truncates": 0, "discards": 2, "collisions": 1, "operations": 7}]
    assert group["discards"] == 2
    assert data["as_of"] == "2026-11-23T01:00:00+00:00" and data["heartbeat"] is None
    assert data["links"]["control"] == "dags/control"
    assert "http" not in json.dumps(data), "no absolute URL: the page works under a proxy's base path"


def test_logdump_bounds_and_a_closed_pipe_end_cleanly(tmp_path, spark, store, capsys, monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), ins(11, "A", 2), rec(20, "A", "COMMIT")], 100)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(tb(config_path, "extract", "run", "EXT1")) == 0
    trail_file = str(tmp_path / "dirdat" / "lt000000001")
    capsys.readouterr()
    assert cli.main(["logdump", trail_file, "--from", "1"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.split()[:2] == ["1:1", "ind"] and "commit 2026-11-01 00:00:20.000000 UTC" in line, line
    assert cli.main(["logdump", trail_file, "--from", "2"]) == 1
    assert f"{trail_file}: --from 2 is past the file's end: it holds 2 record(s), rba 0..1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli.main(["logdump", trail_file, "--from", "-3"])
    assert usage.value.code == 2 and "-3 is negative" in capsys.readouterr().err

    # `trailbound info extract EXT1 --showch 5 | head -1`: the reader leaves early.
    reader = subprocess.Popen([sys.executable, "-m", "trailbound.cli", *tb(config_path, "info", "extract", "EXT1",
                                                                          "--showch", "5")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
    reader.stdout.close()
    error = reader.stderr.read().decode()
    assert reader.wait() == 141 and "Traceback" not in error and "BrokenPipe" not in error, error


def test_the_view_shows_each_live_sources_slot_lag(tmp_path, store, source_dsn, monkeypatch):
    from pg_source_kit import SOURCE_ENV, execute, write_config as write_pg_config
    from trailbound_airflow.console import console_data, read_snapshot

    execute(source_dsn, "CREATE TABLE public.items (id int PRIMARY KEY, note text)")
    config_path = write_pg_config(tmp_path, tables=("public.items",))
    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(tb(config_path, "add", "source", "PG")) == 0
    execute(source_dsn, "INSERT INTO public.items SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g")
    before, = read_snapshot(str(config_path)).sources
    assert before.exists and before.lag_bytes > 100_000, "2,000 rows of WAL not archived yet"
    assert before.last_segment is None and before.behind_seconds is None

    assert cli.main(tb(config_path, "archive", "pull", "PG")) == 0
    snap = read_snapshot(str(config_path))
    after, = snap.sources
    assert after.lag_bytes < before.lag_bytes // 10, "the pull archived it and confirmed the slot"
    assert after.last_segment.records == 2001 and 0 <= after.behind_seconds < 120  # 2,000 INSERTs, a COMMIT
    [shown] = console_data(snap)["sources"]
    assert (shown["source"], shown["slot"], shown["confirmed"], shown["lag_bytes"]) == (
        "PG", "trailbound_pg", after.confirmed, after.lag_bytes)

    monkeypatch.setenv(SOURCE_ENV, "postgresql://nobody@127.0.0.1:1/none")
    down, = read_snapshot(str(config_path)).sources
    assert down[0] == "PG" and "127.0.0.1" in down[1], "an unreachable source is named, the page still renders"
    assert console_data(read_snapshot(str(config_path)))["sources"] == [{"source": "PG", "error": down[1]}]


def test_archive_verify_checks_the_configured_directory_and_reports_purged_segments(tmp_path, spark, store, capsys,
                                                                                    monkeypatch):
    import shutil

    archive = new_archive(tmp_path)
    for n in (1, 2, 3):
        archive.segment(1, [ins(n * 100, f"T{n}", n), rec(n * 100 + 1, f"T{n}", "COMMIT")], n * 100 + 50)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(tb(config_path, "archive", "scan")) == 0
    with store.transaction() as cur:  # what retention leaves: sequence 1 purged
        cur.execute("UPDATE trailbound.archive_segment SET state = 'purged', purged_at = now(), purge_reason = 'test'"
                    " WHERE source = 'SRC' AND sequence = 1")
    capsys.readouterr()
    assert cli.main(tb(config_path, "archive", "list", "--summary")) == 0
    assert "Thread 1: sequences 2..3 available, 1 purged," in capsys.readouterr().out
    assert cli.main(tb(config_path, "archive", "verify")) == 0
    out = capsys.readouterr().out
    assert "2 segment(s), 4 records verified" in out and "sequences 1 purged, not checked" in out
    assert "points elsewhere" not in out and "note:" not in out

    # A copy of the archive, one of its data files damaged; the configuration now names the copy.
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "archive", copy)
    damaged = copy / "arch_1_000000002.parquet"  # a data file (sha256 no longer matches)
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\0")
    config_path.write_text(config_path.read_text().replace("altarchivelogdest: archive", "altarchivelogdest: copy"))
    assert cli.main(tb(config_path, "archive", "verify")) == 1
    assert str(damaged) in capsys.readouterr().err
    damaged.write_bytes((tmp_path / "archive" / damaged.name).read_bytes())
    assert cli.main(tb(config_path, "archive", "verify")) == 0
    out = capsys.readouterr().out
    assert f"verified in {copy}" in out and f"the catalog recorded segments in {tmp_path / 'archive'}" in out


def test_every_printed_time_is_utc_and_says_so_whatever_the_sessions_time_zone(tmp_path, spark, store, capsys,
                                                                             monkeypatch):
    import re
    from datetime import timezone

    from capture_kit import at

    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT"), ins(30, "OPEN", 2)], 100)
    archive.segment(1, [ins(110, "B", 3), rec(120, "B", "COMMIT")], 200)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("PGTZ", "Asia/Tokyo")  # libpq sets the session's TimeZone from it
    for words in (("register", "extract", "EXT1", "logretention"), ("extract", "run", "EXT1")):
        assert cli.main(tb(config_path, *words)) == 0
    capsys.readouterr()
    shown = {}
    for words in (("info", "extract", "EXT1", "--showch"), ("info", "retention"), ("archive", "list"),
                  ("send", "extract", "EXT1", "showtrans"), ("info", "all")):
        assert cli.main(tb(config_path, *words)) == 0
        shown[words[0] if words[0] == "send" else words[1]] = capsys.readouterr().out
    from datetime import datetime

    [run] = runlog.history(store, "extract", "EXT1", limit=1)
    showch = shown["extract"]
    found = re.search(r"Last Started (\S+ \S+) UTC", showch)
    assert found, showch
    last_started = found.group(1)
    assert abs(datetime.fromisoformat(last_started).replace(tzinfo=timezone.utc) - run.started_at).total_seconds() < 120
    assert f"Start Time = {last_started}:" in showch
    assert "Times are UTC. Log time:" in showch and "Wall time:" in showch
    recovery_block = showch.split("Recovery Checkpoint (position of oldest")[1].split("Current Checkpoint")[0]
    assert "Sequence #: 1\n" in recovery_block and "Redo File: arch_1_000000001.parquet" in recovery_block, \
        "the recovery checkpoint (OPEN's start) names its own sequence's file, not the current one"
    assert "Next run: normal recovery, re-reads every thread from scn 200; thread 1 from 1:1:2 (scn 30)" in showch
    assert f"{at(30).astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC" in shown["send"]  # OPEN's start, log time
    assert f"{at(0).astimezone(timezone.utc):%Y-%m-%d %H:%M:%S}" in shown["list"]      # the segment's first time
    assert "(UTC)" in shown["list"]
    assert re.search(r"updated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown["retention"])
    for name, text in shown.items():  # every time printed says its zone, none is in Tokyo's
        assert "+09" not in text, name
        for match in re.finditer(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?", text):
            after = text[match.end():match.end() + 5]
            assert after.startswith(" UTC") or "(UTC)" in text, (name, text[match.start():match.end() + 5])
