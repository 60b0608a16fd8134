"""Initial load benchmark: one table of 1,000,000 rows (pgbench_accounts at scale 10)
copied into an empty target table three ways, each timed to a table equal to the source:

- `trailbound load` (snapshot mode, key-range chunks on Spark local, one task per chunk
  piping COPY TO STDOUT into COPY FROM STDIN), timed for the whole CLI process (Spark's
  start included) and as the load itself reports it;
- `pg_dump --data-only -t pgbench_accounts | psql`;
- one plain `COPY pgbench_accounts TO STDOUT` piped into `COPY ... FROM STDIN` (psycopg2,
  one stream, what a single chunk does).

    make bench                                  # all benchmarks
    .venv/bin/python tests/bench/bench_load.py [--scale 10] [--chunk-rows 100000]

Uses TRAILBOUND_METADATA_DSN and TRAILBOUND_TARGET_DSN when set (make bench provides its
throwaway server), else starts its own (var/bench-load-target); the source is its own
server (var/bench-load-source, wal_level=logical). Results go to docs/benchmarks/load.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import psycopg2.extensions

from benchdb import fresh_database
from results import write_report

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "include"))
from trailbound.devtools.livedemo import LOGICAL_OPTIONS, recreate_database, table_digests  # noqa: E402
from trailbound.devtools.localpg import LocalServer  # noqa: E402

RESULTS = REPO / "docs" / "benchmarks" / "load.md"
WORK = REPO / "var" / "bench-load"
TABLE = [("public", "pgbench_accounts")]


def run(argv: list[str], env: dict, *, shell: bool = False) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, shell=shell)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return elapsed, done.stdout + done.stderr


def execute(dsn: str, *statements) -> None:
    connection = psycopg2.connect(dsn)
    connection.autocommit = True
    with connection.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    connection.close()


def plain_copy(source: str, target: str) -> None:
    src, tgt = psycopg2.connect(source), psycopg2.connect(target)
    read_end, write_end = os.pipe()

    def produce():
        with os.fdopen(write_end, "wb") as out, src.cursor() as cur:
            cur.copy_expert("COPY pgbench_accounts TO STDOUT", out)

    producer = threading.Thread(target=produce)
    producer.start()
    with os.fdopen(read_end, "rb") as inp, tgt.cursor() as cur:
        cur.copy_expert("COPY pgbench_accounts FROM STDIN", inp)
    producer.join()
    tgt.commit()
    src.close()
    tgt.close()


def write_config(source_env: str) -> Path:
    path = WORK / "trailbound.yaml"
    path.write_text(f"""home: {WORK}
sources:
  PGL:
    altarchivelogdest: archive
    postgres:
      dsn_env: {source_env}
      conn_id: bench_source
      slot: trailbound_bench_load
      publication: trailbound_bench_load
      table: ["public.pgbench_accounts"]
extracts:
  EXTL: {{source: PGL, exttrail: dirdat/lt, table: ["public.pgbench_accounts"]}}
replicats:
  REPL: {{exttrail: dirdat/lt, source: PGL}}
""")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=10, help="pgbench scale (x 100,000 rows)")
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    own = None
    if "TRAILBOUND_TARGET_DSN" not in os.environ or "TRAILBOUND_METADATA_DSN" not in os.environ:
        own = LocalServer(REPO / "var" / "bench-load-target").start()
    server = lambda name: os.environ.get(name) or own.dsn()  # noqa: E731
    source_server = LocalServer(REPO / "var" / "bench-load-source", options=LOGICAL_OPTIONS,
                                databases=("bench_load",)).start()
    try:
        recreate_database(source_server.dsn(), "bench_load")
        source = source_server.dsn("bench_load")
        metadata = fresh_database(server("TRAILBOUND_METADATA_DSN"), "trailbound_bench_load_meta")
        targets = {how: fresh_database(server("TRAILBOUND_TARGET_DSN"), f"trailbound_bench_load_{how}")
                   for how in ("trailbound", "dump", "copy")}
        shutil.rmtree(WORK, ignore_errors=True)
        WORK.mkdir(parents=True)
        env = {**os.environ, "TRAILBOUND_BENCH_SOURCE_DSN": source, "TRAILBOUND_METADATA_DSN": metadata,
               "TRAILBOUND_TARGET_DSN": targets["trailbound"],
               "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}",
               "TRAILBOUND_CONFIG": str(write_config("TRAILBOUND_BENCH_SOURCE_DSN"))}
        tb = [sys.executable, "-m", "trailbound.cli"]
        run(["pgbench", "-i", "-I", "dtgp", "-q", "-s", str(args.scale), source], env)
        execute(source, "VACUUM ANALYZE pgbench_accounts")
        rows = args.scale * 100_000
        for how, dsn in targets.items():
            run(["pgbench", "-i", "-I", "dtp", "-q", dsn], env)  # the empty table, with its primary key
        run([*tb, "add", "source", "PGL"], env)
        source_digest = table_digests(source, TABLE)
        timings = {}

        timings["trailbound"], output = run([*tb, "load", "PGL", "REPL", "--table", "public.pgbench_accounts",
                                             "--chunk-rows", str(args.chunk_rows)], env)
        reported = float(re.search(r"rows in ([\d.]+) s", output).group(1))
        chunks = int(re.search(r"(\d+) chunk\(s\)", output).group(1))
        print(output.strip().splitlines()[-3], flush=True)
        assert table_digests(targets["trailbound"], TABLE) == source_digest

        timings["dump"], _ = run(f"pg_dump --data-only -t pgbench_accounts '{source}' | psql -q -v ON_ERROR_STOP=1 "
                                 f"'{targets['dump']}'", env, shell=True)
        assert table_digests(targets["dump"], TABLE) == source_digest
        started = time.monotonic()
        plain_copy(source, targets["copy"])
        timings["copy"] = time.monotonic() - started
        assert table_digests(targets["copy"], TABLE) == source_digest
        run([*tb, "delete", "source", "PGL"], env)
    finally:
        source_server.remove()
        if own is not None:
            own.remove()
    load_after = os.getloadavg()

    command = f".venv/bin/python tests/bench/bench_load.py --scale {args.scale} --chunk-rows {args.chunk_rows}"
    rate = lambda seconds: f"{rows / seconds:,.0f} rows/s"  # noqa: E731
    write_report(RESULTS, f"""# Initial load: `trailbound load` beside pg_dump | psql and a plain COPY

Command: `{command}` (or `make bench`), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, on {platform.node()}:
{os.cpu_count()} CPUs, Python {platform.python_version()}, PostgreSQL 15 (local throwaway servers, fsync
off). Load average {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end: **the machine was
shared with other helpers running tests at the same time (2 CPUs), so every time below is
pessimistic and noisy.**

One table, pgbench_accounts at scale {args.scale}: **{rows:,} rows**, copied into an empty table with
its primary key on the target server; every copy was checked equal to the source (an
order-independent digest of every row's text, computed in SQL on both servers).

| | time | rate |
|---|---:|---:|
| `trailbound load` ({chunks} chunks of {args.chunk_rows:,} rows on Spark local[*], snapshot mode), the whole CLI process | {timings['trailbound']:.1f} s | {rate(timings['trailbound'])} |
| `trailbound load`, as it reports itself (slot and snapshot, planning, chunks, replicat positioned; no JVM start) | {reported:.1f} s | {rate(reported)} |
| `pg_dump --data-only -t pgbench_accounts \\| psql` | {timings['dump']:.1f} s | {rate(timings['dump'])} |
| one `COPY TO STDOUT` piped into `COPY FROM STDIN` (psycopg2) | {timings['copy']:.1f} s | {rate(timings['copy'])} |

What the load adds to a plain COPY: the slot made again with an exported snapshot, the key
ranges found by walking the primary key's index, a Spark task per chunk (each with two
connections and its own pipe), the metadata store's progress rows and the replicat's
repositioning. On two shared CPUs the chunks cannot run much in parallel; on a cluster each
chunk is its own task, so the load grows with the executors, where one COPY stream cannot.
""")
    print(RESULTS.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
