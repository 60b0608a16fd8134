"""`make demo-live`: the pipeline on a live PostgreSQL source, through Airflow.

    python -m trailbound.devtools.livedemo [--rounds N] [--rate TPS]

A second throwaway server (var/pg-source, wal_level=logical) hosts the source database
`trailbound_source`; the demo's own server (var/pg, started by `make db`) holds this
demo's metadata store and target, in two fresh databases of their own
(trailbound_live_meta, trailbound_live_target), so `make demo`'s are untouched. Steps:
pgbench's tables (empty), `trailbound add source PGLIVE`, `add heartbeattable PGLIVE`, `trailbound target create`,
pgbench's data load, then pgbench writing (-R TPS) while `airflow dags test` runs capture
(its first task pulls the slot), pump and replicat, N rounds; pgbench stops, one last
round, and the source and target are compared table by table (an order-independent
digest of every row's text computed in SQL on each server).

Everything starts from scratch on each run: the source database, the slot, var/live and
the two databases. Expects Airflow's environment (AIRFLOW_HOME...) from the Makefile.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
from psycopg2 import sql

from trailbound import config as configuration
from trailbound import dagfiles
from trailbound.devtools.localpg import LocalServer

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "include" / "config" / "trailbound-live.yaml"
SOURCE_DIR = REPO / "var" / "pg-source"
MAIN_DIR = REPO / "var" / "pg"
LIVE = REPO / "var" / "live"
SOURCE_DB, META_DB, TARGET_DB = "trailbound_source", "trailbound_live_meta", "trailbound_live_target"
# What logical decoding needs; the rest of the server's options are localpg's.
LOGICAL_OPTIONS = "-c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10"
DAGS = ("capture_elive", "pump_plive", "replicat_rlive")
SUMMARY = re.compile(r"(Source [A-Z0-9_]+: pulled [^\[]*|Extract [A-Z0-9_]*: [^\[]*|Pump [A-Z0-9_]* [^\[]*"
                     r"|Replicat [A-Z0-9_]*: [^\[]*|PASSED: [^\[]*|not the current interval[^\[]*"
                     r"|(?:extract|pump|replicat) [A-Z0-9_]*: nothing new [^\[]*)")
_SETTINGS = "SET TimeZone = 'UTC'; SET extra_float_digits = 3; SET bytea_output = 'hex'; SET DateStyle = 'ISO'"


def source_server() -> LocalServer:
    return LocalServer(SOURCE_DIR, options=LOGICAL_OPTIONS, databases=(SOURCE_DB,))


def recreate_database(server_dsn: str, name: str) -> None:
    """Drop the database (and its replication slots, which would block the drop), create it."""
    connection = psycopg2.connect(server_dsn)
    connection.autocommit = True
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                        (name,))
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    finally:
        connection.close()


def table_digests(dsn: str, tables: list[tuple[str, str]]) -> dict[str, tuple[int, str]]:
    """Per table: (row count, md5 of the sorted md5s of every row's text): equal on two
    servers exactly when they hold the same rows, whatever the order. Both sides use the
    same session settings, so that equal values have equal text."""
    found = {}
    with psycopg2.connect(dsn) as connection, connection.cursor() as cur:
        cur.execute(_SETTINGS)
        for schema, table in tables:
            cur.execute(sql.SQL("SELECT count(*), coalesce(md5(string_agg(h, ',' ORDER BY h)), '')"
                                " FROM (SELECT md5(t::text) AS h FROM {} t) rows").format(
                                    sql.Identifier(schema, table)))
            found[f"{schema}.{table}"] = tuple(cur.fetchone())
    connection.close()
    return found


def compare(source_dsn: str, target_dsn: str, tables: list[tuple[str, str]]) -> bool:
    """Print source and target side by side per table; True when every table matches."""
    source, target = table_digests(source_dsn, tables), table_digests(target_dsn, tables)
    print(f"{'table':<28} {'source rows':>11} {'target rows':>11}  {'digest (source)':<34} result")
    for name in source:
        ok = source[name] == target[name]
        print(f"{name:<28} {source[name][0]:>11} {target[name][0]:>11}  {source[name][1]:<34} "
              f"{'PASSED' if ok else 'FAILED (target ' + target[name][1] + ')'}")
    return source == target


def run(argv: list[str], env: dict, **kwargs) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout + done.stderr


def dag_test(dag_id: str, logical_date: datetime, env: dict) -> None:
    """`airflow dags test` (trailbound_airflow.dagtest: the DAG run's real start is
    recorded), its log under var/live/logs; prints when it started (wall time), how long
    it took, its outcome, and the tasks' summary lines, whole."""
    log = LIVE / "logs" / f"{dag_id}_{logical_date:%H%M%S}.log"
    started = datetime.now(UTC)
    done = subprocess.run([sys.executable, "-m", "trailbound_airflow.dagtest", dag_id, logical_date.isoformat()],
                          env=env, capture_output=True, text=True)
    seconds = (datetime.now(UTC) - started).total_seconds()
    output = done.stdout + done.stderr
    log.write_text(output)
    finished = [line for line in output.splitlines() if "DagRun Finished" in line]
    state = finished[-1].rsplit("state=", 1)[-1].split()[0].strip(",") if finished else "error"
    print(f"  {started:%H:%M:%S} {dag_id}: {state} ({seconds:.0f} s; logical date {logical_date:%H:%M:%S})")
    seen = []
    for match in SUMMARY.findall(output):
        line = re.sub(r" \(checked in [0-9.]+ s\)$", "", match.strip().splitlines()[0].rstrip())
        if line not in seen:
            seen.append(line)
            print(f"      {line}")
    if state != "success":
        print(f"  -> {log}")
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trailbound.devtools.livedemo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="pipeline rounds while pgbench writes (default 2)")
    parser.add_argument("--rate", type=int, default=20, help="pgbench transactions per second (default 20)")
    args = parser.parse_args(argv)
    started = time.monotonic()

    print("== servers: the source (var/pg-source, wal_level=logical) and the demo's (var/pg)")
    source = source_server().start()
    main_server = LocalServer(MAIN_DIR).start()
    recreate_database(source.dsn(), SOURCE_DB)
    for name in (META_DB, TARGET_DB):
        recreate_database(main_server.dsn(), name)
    source_dsn = source.dsn(SOURCE_DB)
    env = {**os.environ, "TRAILBOUND_CONFIG": str(CONFIG), "TRAILBOUND_SOURCE_DSN": source_dsn,
           "TRAILBOUND_METADATA_DSN": main_server.dsn(META_DB), "TRAILBOUND_TARGET_DSN": main_server.dsn(TARGET_DB)}
    subprocess.run(["rm", "-rf", str(LIVE)], check=True)
    (LIVE / "logs").mkdir(parents=True)
    config = configuration.load(CONFIG)
    # This demo's DAGs only (no second `control`), in the live-demo DAG bundle the
    # Makefile's Airflow environment names beside dags/: the UI lists them with their runs.
    dags = LIVE / "dags"
    dags.mkdir()
    for name, text in dagfiles.dag_files(config).items():
        if Path(name).stem in DAGS:
            (dags / name).write_text(text)
    # A fresh start in Airflow too: an earlier demo's runs (one interrupted mid-task would
    # block capture's depends_on_past) go with the rest.
    for dag_id in DAGS:
        subprocess.run(["airflow", "dags", "delete", dag_id, "--yes"], env=env, capture_output=True)

    print("== pgbench's tables (empty), then `trailbound add source PGLIVE`, `add heartbeattable PGLIVE`"
          " (end-to-end lag) and `trailbound target create`")
    run(["pgbench", "-i", "-I", "dtp", "-q", source_dsn], env)
    with psycopg2.connect(source_dsn) as connection, connection.cursor() as cur:
        cur.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")  # it has no primary key
    connection.close()
    for words in (["add", "source", "PGLIVE"], ["add", "heartbeattable", "PGLIVE"], ["target", "create"]):
        print("  " + run(["trailbound", *words], env).strip().replace("\n", "\n  "))

    print(f"== pgbench: the data load (100,000 accounts), then {args.rate} transactions/s while the pipeline runs")
    run(["pgbench", "-i", "-I", "g", "-q", source_dsn], env)
    bench = subprocess.Popen(["pgbench", "-n", "-c", "2", "-j", "1", "-R", str(args.rate), "-T", "100000",
                              source_dsn], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        for round_ in range(1, args.rounds + 1):
            print(f"== round {round_} (pgbench writing): capture (pull first), pump, replicat")
            logical_date = (datetime.now(UTC) + timedelta(seconds=1)).replace(microsecond=0)
            for dag_id in DAGS:
                dag_test(dag_id, logical_date, env)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGINT)
        bench.wait(timeout=60)
    print("== pgbench stopped; a last round")
    time.sleep(1)
    logical_date = (datetime.now(UTC) + timedelta(seconds=1)).replace(microsecond=0)
    for dag_id in DAGS:
        dag_test(dag_id, logical_date, env)

    print("== source and target, table by table")
    tables = [tuple(t.split(".", 1)) for t in ("public.pgbench_accounts", "public.pgbench_branches",
                                                "public.pgbench_history", "public.pgbench_tellers")]
    same = compare(source_dsn, env["TRAILBOUND_TARGET_DSN"], tables)
    print("  " + run(["trailbound", "info", "source", "PGLIVE"], env).strip().replace("\n", "\n  "))
    # The heartbeat's way from the source's row to the target's, hop by hop.
    print("  " + run(["trailbound", "lag", "replicat", "RLIVE"], env).strip().replace("\n", "\n  "))
    print(f"\nWall time: {time.monotonic() - started:.0f} s. Logs: {LIVE / 'logs'}; archive {LIVE / 'archive'};"
          f" the source: psql {source_dsn}")
    print("The slot holds the source's WAL until you drop it: trailbound delete source PGLIVE "
          "(or make clean, which removes both servers).")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
