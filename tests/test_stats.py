"""STATS, LAG, VIEW REPORT and SEND REPLICAT ... STATUS as a GGSCI user reads them, after
real runs (capture on local Spark, replicat and pump through the command line) on real
PostgreSQL. Every count is checked against one computed here from the committed trail
files, not from what the stages recorded."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import psycopg2
import pytest

from capture_kit import at, ins, new_archive, rec
from pump_kit import SourceTrail, committed_files
from pump_kit import load as load_pump_config
from replicat_kit import write_config
from trailbound import cli
from trailbound import config as configuration
from trailbound import runlog, status
from trailbound.archive.segments import load_defs
from trailbound.capture.run import run_extract
from trailbound.pump.run import run_pump
from trailbound.replicat import target as tgt
from trailbound.trail import format as trail

pytestmark = [pytest.mark.pg]

OPS = {"INSERT": "inserts", "UPDATE": "updates", "DELETE": "deletes", "TRUNCATE": "truncates"}


def salary(scn: int, xid: str, op: str, key: int, amount: int | None = None) -> dict:
    return {"scn": scn, "ts": at(scn), "xid": xid, "parent_xid": None, "op": op, "table": "hr.salaries",
            "before": {"id": key} if op in ("UPDATE", "DELETE") else None,
            "after": None if op == "DELETE" else {"id": key, "amount": amount}}


def trail_counts(store, trail_key: str, from_seqno: int = 1) -> dict[str, Counter]:
    """Per table, its operations in the committed trail files (read here, with pyarrow)."""
    found: dict[str, Counter] = {}
    for row in committed_files(store, trail_key):
        if row["seqno"] >= from_seqno:
            for record in trail.read_file(row["path"]).select(["table", "op"]).to_pylist():
                found.setdefault(record["table"], Counter())[OPS[record["op"]]] += 1
    return found


def parse_stats(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """STATS output as {(table line, period): {"inserts": 3.0, ...}}."""
    found, table, period = {}, None, None
    for line in text.splitlines():
        if m := re.match(r"(?:Replicating|Extracting) from (\S+) to (\S+):$", line):
            table = m.group(1)
        elif m := re.match(r"\*\*\* (\w+) statistics since", line):
            period = m.group(1).lower()
            found[(table, period)] = {}
        elif m := re.match(r"\tTotal (\w+)\s+([\d,.]+)$", line):
            found[(table, period)][m.group(1)] = float(m.group(2).replace(",", ""))
    return found


def expected(counts: Counter) -> dict[str, float]:
    values = {c: float(counts.get(c, 0)) for c in ("inserts", "updates", "deletes", "truncates", "discards",
                                                   "collisions")}
    return values | {"operations": float(sum(counts[c] for c in OPS.values()))}


@pytest.fixture
def environment(monkeypatch, metadata_dsn, target_dsn):
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", metadata_dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)


def trailbound(capsys, *argv) -> str:
    capsys.readouterr()
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert status == 0, err
    return out


def test_stats_lag_report_status_and_metrics_say_what_capture_and_replicat_did(
        tmp_path, spark, store, target_dsn, environment, capsys, group_held_elsewhere, monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), ins(11, "T1", 2), ins(12, "T1", 3), salary(13, "T1", "INSERT", 1, 10),
                        rec(14, "T1", "COMMIT"),
                        rec(20, "T2", "UPDATE", "shop.orders", key=1, note="changed"),
                        rec(21, "T2", "DELETE", "shop.orders", key=2), salary(22, "T2", "UPDATE", 1, 11),
                        rec(23, "T2", "COMMIT"),
                        rec(30, "T3", "TRUNCATE", "hr.salaries"), salary(31, "T3", "INSERT", 2, 20),
                        rec(32, "T3", "COMMIT"), ins(40, "OPEN", 9)], 100)   # OPEN stays open
    config_path = write_config(tmp_path, handlecollisions=True)
    config = configuration.load(config_path)
    run_extract(spark, store, config, "EXT1")
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        tgt.create_tables(cur, load_defs(config.archive_dir("SRC")), config.replicat("REP1").map)
        cur.execute("INSERT INTO shop.orders VALUES (4, 'already there')")  # T4's insert collides
    connection.close()
    key = config.trail_location("dirdat/lt")
    first = trail_counts(store, key)
    assert first == {"shop.orders": Counter(inserts=3, updates=1, deletes=1),
                     "hr.salaries": Counter(inserts=2, updates=1, truncates=1)}

    base = ["--config", str(config_path)]
    assert "applied 3 transactions" in trailbound(capsys, *base, "replicat", "run", "REP1")
    archive.segment(1, [ins(110, "T4", 4), ins(111, "T4", 5), rec(112, "T4", "COMMIT")], 200)
    run_extract(spark, store, config, "EXT1")
    second = trail_counts(store, key, from_seqno=2)
    assert second == {"shop.orders": Counter(inserts=2)}

    # Before replicat takes the second file: LAG and SEND ... STATUS say what waits.
    assert "2 record(s) of the committed trail wait" in trailbound(capsys, *base, "lag", "replicat", "REP1")
    assert "At EOF" in trailbound(capsys, *base, "lag", "extract", "EXT1")
    out = trailbound(capsys, *base, "send", "replicat", "REP1", "status")
    assert "Current status: Not running" in out
    assert "Sequence #: 1, RBA: 9 " in out and "2 record(s) of the committed trail after this position" in out
    with group_held_elsewhere("replicat", "REP1"), runlog.recorded_run(store, "replicat", "REP1", "elsewhere") as run:
        out = trailbound(capsys, *base, "send", "replicat", "REP1", "status")
    assert f"Current status: Processing data (run {run} started" in out

    assert "1 collision(s) handled" in trailbound(capsys, *base, "replicat", "run", "REP1")
    # LAG: the checkpoint's wall time minus the applied commit's log time, and EOF.
    with store.transaction() as cur:
        cur.execute("SELECT updated_at - audit_ts AS lag FROM trailbound.replicat_checkpoint WHERE group_name = 'REP1'")
        lag = int(cur.fetchone()["lag"].total_seconds())
    out = trailbound(capsys, *base, "lag", "replicat", "REP1")
    assert f"Last record lag {lag} seconds." in out and "At EOF, no more records to process." in out

    # STATS REPLICAT: per table, the trail's operations; latest = the second run only.
    stats = parse_stats(trailbound(capsys, *base, "stats", "replicat", "REP1"))
    total_orders = first["shop.orders"] + second["shop.orders"] + Counter(collisions=1)
    assert stats[("shop.orders", "total")] == expected(total_orders)
    assert stats[("hr.salaries", "total")] == expected(first["hr.salaries"])
    assert stats[("shop.orders", "latest")] == expected(second["shop.orders"] + Counter(collisions=1))
    assert stats[("hr.salaries", "latest")] == {}  # "No database operations have been performed."
    assert stats[("shop.orders", "daily")] == stats[("shop.orders", "total")]  # both runs committed just now
    # STATS EXTRACT counts what capture wrote to the trail.
    extract_stats = parse_stats(trailbound(capsys, *base, "stats", "extract", "EXT1", "--total"))
    assert {t: v for (t, _), v in extract_stats.items()} == {
        "shop.orders": expected(first["shop.orders"] + second["shop.orders"]),
        "hr.salaries": expected(first["hr.salaries"])}
    only = trailbound(capsys, *base, "stats", "replicat", "REP1", "--table", "hr.*", "--total")
    assert "Replicating from hr.salaries to hr.salaries:" in only and "shop.orders" not in only
    assert "*** Total statistics" in only and "*** Latest statistics" not in only
    summed = parse_stats(trailbound(capsys, *base, "stats", "replicat", "REP1", "--totalsonly", "--total"))
    applied = sum((first[t] + second.get(t, Counter()) for t in first), Counter())
    assert summed[(None, "total")]["operations"] == applied.total() == 11  # every trail record replicat applied

    check_metrics(store, config_path, monkeypatch, stats)

    # VIEW REPORT: the last finished run, then the first one by its number.
    runs = [r for r in runlog.history(store, "replicat", "REP1") if r.command != "elsewhere"]
    out = trailbound(capsys, *base, "view", "report", "REP1", "--run", str(runs[0].run_id))
    assert "Outcome:   OK" in out and "applied 1 transactions (2 operations)" in out
    assert re.search(r"shop\.orders\s+shop\.orders\s+2\s+0\s+0\s+0\s+0\s+1$", out, re.M), out
    out = trailbound(capsys, *base, "view", "report", "REP1", "--run", str(runs[-1].run_id))
    assert "applied 3 transactions (9 operations)" in out
    # The console's throughput per run: the operations each run applied, per second of its wall time.
    points = status.lag_history(store, "replicat", "REP1")
    assert [p.records for p in points] == [9, 2] and all(p.seconds > 0 for p in points)
    assert [p.records_per_second for p in points] == [p.records / p.seconds for p in points]
    assert re.search(r"hr\.salaries\s+hr\.salaries\s+2\s+1\s+0\s+1\s+0\s+0$", out, re.M), out


def test_stats_pump_counts_the_files_it_shipped(tmp_path, store, environment, capsys):
    config = load_pump_config(tmp_path, {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt"}})
    source = SourceTrail(store, Path(config.trail_location("dirdat/lt")))
    source.add_file([("A", [("shop.orders", 1), ("hr.salaries", 2)])])
    source.add_file([("B", [("shop.orders", 3)]), ("C", [("shop.orders", 4)])])
    run_pump(None, store, config, "PMP1")
    shipped = trail_counts(store, config.trail_location("remote/rt"))
    assert shipped == {"shop.orders": Counter(inserts=3), "hr.salaries": Counter(inserts=1)}
    out = trailbound(capsys, "--config", str(tmp_path / "trailbound.yaml"), "stats", "pump", "PMP1", "--latest")
    assert parse_stats(out) == {("hr.salaries", "latest"): expected(shipped["hr.salaries"]),
                                ("shop.orders", "latest"): expected(shipped["shop.orders"])}
    assert "Extracting from shop.orders to shop.orders:" in out
    with store.transaction() as cur:  # one row per table, added to as each file committed
        cur.execute("SELECT table_name, inserts, run_id FROM trailbound.run_table_counts WHERE stage = 'pump'"
                    " ORDER BY table_name")
        rows = cur.fetchall()
        cur.execute("SELECT run_id FROM trailbound.pump_run")
        assert {r["run_id"] for r in rows} == {r["run_id"] for r in cur.fetchall()}
    assert [(r["table_name"], r["inserts"]) for r in rows] == [("hr.salaries", 1), ("shop.orders", 3)]


def test_stats_of_a_group_not_configured_is_one_error_line(tmp_path, environment, capsys):
    config_path = write_config(tmp_path)
    assert cli.main(["--config", str(config_path), "stats", "replicat", "NOPE"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ERROR no replicat named 'NOPE'") and len(err.strip().splitlines()) == 1
    out = trailbound(capsys, "--config", str(config_path), "stats", "replicat", "REP1")
    assert "No operations have been counted for replicat REP1 yet" in out


def parse_metrics(text: str) -> dict[tuple, float]:
    """Prometheus text as {(name, (label, value), ...): value}; every family has HELP and TYPE."""
    found, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            m = re.fullmatch(r'(\w+)(?:\{(.*)\})? (\S+)', line)
            assert m, line
            labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
            assert m.group(1) in typed, f"{m.group(1)} has no TYPE line"
            found[(m.group(1), *labels)] = float(m.group(3))
    return found


def check_metrics(store, config_path, monkeypatch, stats):
    """/trailbound/metrics, through the console's FastAPI app with the documented token,
    against the metadata store and STATS."""
    from starlette.testclient import TestClient
    from trailbound_airflow.console import create_app

    monkeypatch.setenv("TRAILBOUND_CONFIG", str(config_path))
    monkeypatch.setenv("TRAILBOUND_METRICS_TOKEN", "scrape-me")
    # Any other caller goes to Airflow's auth manager (not started in this process: the
    # 401 of a real API server is checked in test_console_ui.py); never to the figures.
    client = TestClient(create_app(), raise_server_exceptions=False)
    refused = client.get("/metrics", headers={"Authorization": "Bearer wrong"})
    assert refused.status_code != 200 and "trailbound_" not in refused.text
    response = client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    metrics = parse_metrics(response.text)

    def value(name, **labels):
        return metrics[(name, *sorted(labels.items()))]

    rep1 = {"program": "replicat", "group": "REP1"}
    for (table, period), row in stats.items():
        if period == "total":
            for op in ("insert", "update", "delete", "truncate"):
                assert value("trailbound_operations_total", **rep1, table=table, op=op) == row[op + "s"]
            assert value("trailbound_collisions_total", **rep1, table=table) == row["collisions"]
    with store.transaction() as cur:
        cur.execute("SELECT outcome, count(*) AS n FROM trailbound.run_outcome WHERE group_name = 'REP1' GROUP BY 1")
        outcomes = {r["outcome"]: r["n"] for r in cur.fetchall()}
        cur.execute("SELECT extract(epoch FROM updated_at - audit_ts) AS lag FROM trailbound.replicat_checkpoint")
        lag = float(cur.fetchone()["lag"])
        cur.execute("SELECT operations FROM trailbound.replicat_run ORDER BY run_id DESC LIMIT 1")
        operations = cur.fetchone()["operations"]
        cur.execute("SELECT bytes FROM trailbound.trail_file WHERE written_by = 'EXT1' ORDER BY seqno DESC LIMIT 1")
        last_file_bytes = cur.fetchone()["bytes"]
    for outcome, n in outcomes.items():
        assert value("trailbound_runs_total", **rep1, outcome=outcome) == n
    assert value("trailbound_group_lag_seconds", **rep1) == pytest.approx(lag, abs=1e-3)
    assert value("trailbound_group_status", **rep1, status="STOPPED") == 1
    assert value("trailbound_last_run_records", **rep1) == operations == 2
    assert value("trailbound_last_run_bytes", program="extract", group="EXT1") == last_file_bytes
    assert value("trailbound_open_transactions", group="EXT1", br_state="not_persisted") == 1
    from trailbound import status
    [open_txn] = status.open_transactions(store, configuration.load(config_path), "EXT1")
    assert value("trailbound_oldest_open_transaction_age_seconds", group="EXT1") == open_txn.age.total_seconds() > 0
    assert value("trailbound_br_suspended", group="EXT1") == 0


def test_view_report_of_a_capture_run_says_how_its_records_became_the_trail_and_where_its_time_went(
        tmp_path, spark, store, environment, capsys):
    """VIEW REPORT of a capture run, as of a replicat run: the summary line with how the
    records became the trail (one task, or grouped and why), and its time per phase."""
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), ins(11, "T1", 2), rec(12, "T1", "COMMIT")], 100)
    base = ["--config", str(write_config(tmp_path))]
    assert "records in commit order (one pass)" in trailbound(capsys, *base, "extract", "run", "EXT1")
    out = trailbound(capsys, *base, "view", "report", "EXT1")
    assert "wrote 1 transactions (2 records); records in commit order (one pass)" in out, out
    phases = re.search(r"^Time per phase: (.*)$", out, re.M)
    assert phases, out
    assert "write trail files by one task (one Spark job)" in phases.group(1), out
