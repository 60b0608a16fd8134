"""Many tables: the cost per change of the live pipeline on 300 tables against the same
number of changes on 5 tables (issue 42 item 5).

    .venv/bin/python tests/bench/bench_many_tables.py [--changes N] [--tables 300] [--baseline 5]

Starts its own PostgreSQL server (var/bench-many-tables, wal_level=logical) that holds the
source, the metadata store and the target, each a fresh database per run, so that every
server process's CPU is this benchmark's (the postmaster reaps its backends: its children's
CPU counts them). For each of the two table counts:

- a fresh source database with the tables, spread over 6 schemas, five shapes in turn:
  an integer key, a composite key (int, text), a uuid key, no key with REPLICA IDENTITY
  FULL, and a wide table of 64 columns of mixed types (int, bigint, numeric, text,
  varchar, bool, date, timestamptz, jsonb, bytea, uuid, int[], text[], float8);
- `trailbound add source`, `target create`;
- a seeded random workload: transactions touching 1 to 20 tables (a table may be touched
  twice), each touch an INSERT, UPDATE or DELETE of 1 to 5 rows (an INSERT while the table
  has fewer than 5 rows), until N row changes; the same seed and the same draws for both
  runs, only which table a touch picks differs (every shape equally often in both);
- `archive pull`, `extract run`, `pump run`, `replicat run`, each a CLI process (Spark
  local mode: capture starts a JVM, replicat needs none), timed, with the CPU of the
  process and its children (polled from /proc) and of the server over the stage;
- the target checked equal to the source table by table (count and order-independent
  digest in SQL).

Results: docs/benchmarks/many-tables.md (the run's table; earlier runs kept below).

    .venv/bin/python tests/bench/bench_many_tables.py --replicat-again 300 [--profile]

runs replicat alone again, in this process, on the last run's trail for that table count
(a copy of its metadata store, a fresh target) and prints the process's CPU seconds (all
threads) and the server's (the target's work, and the metadata store's), its phases and whether the target equals the source: the figure to compare
between two versions of replicat side by side, without capture.
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
from psycopg2 import sql


from benchdb import fresh_database
from results import write_report

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "include"))
sys.path.insert(0, str(REPO / "tests"))
from many_tables_kit import SCHEMAS, SHAPES, create_tables, tables_for, workload  # noqa: E402
from trailbound.devtools.livedemo import LOGICAL_OPTIONS, table_digests  # noqa: E402
from trailbound.devtools.localpg import LocalServer  # noqa: E402

RESULTS = REPO / "docs" / "benchmarks" / "many-tables.md"
SERVER = REPO / "var" / "bench-many-tables"
STAGES = ("pull", "capture", "pump", "replicat")


# --- measuring a stage -------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _own_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TreeCpu:
    """The CPU a process and all its descendants use, polled every 50 ms: the largest
    utime+stime seen per process (a process that exits between two polls loses at most
    its last 50 ms; its reaped children's CPU is not read from the parent, so nothing
    counts twice)."""

    def __init__(self, pid: int):
        self.pid, self.seen, self._stop = pid, {}, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            stack = [self.pid]
            while stack:
                pid = stack.pop()
                used = _own_cpu(pid)
                if used is not None:
                    self.seen[pid] = max(used, self.seen.get(pid, 0.0))
                stack.extend(_children(pid))
            self._stop.wait(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.seen.values())


def server_cpu(server: LocalServer) -> float:
    """The CPU the whole server has used: the postmaster, its live children, and (through
    the postmaster's cutime/cstime) every backend that ended."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total + sum(used for used in map(_own_cpu, _children(postmaster)) if used is not None)  # one may just have ended


@dataclass
class Stage:
    seconds: float
    client_cpu: float
    server_cpu: float
    output: str = field(repr=False)


def stage(argv: list[str], env: dict, server: LocalServer) -> Stage:
    server_before = server_cpu(server)
    started = time.monotonic()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tree = TreeCpu(process.pid)
    output = process.communicate()[0]
    seconds = time.monotonic() - started
    client = tree.stop()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{output[-3000:]}")
    return Stage(seconds, client, server_cpu(server) - server_before, output)


# --- one run -----------------------------------------------------------------------------

def write_config(work: Path, tables: list[tuple[str, str, str]]) -> Path:
    patterns = sorted({f"{schema}.*" for schema, _, _ in tables})
    path = work / "trailbound.yaml"
    path.write_text(f"""home: {work}
sources:
  PGM:
    altarchivelogdest: archive
    postgres:
      dsn_env: TRAILBOUND_BENCH_SOURCE_DSN
      conn_id: bench_source
      slot: trailbound_many
      publication: trailbound_many
      table: {patterns}
      segment: {{records: 200000, bytes: 256M, seconds: 3600}}
extracts:
  EXTM: {{source: PGM, exttrail: dirdat/lt, table: {patterns}, megabytes: 256}}
pumps:
  PMPM: {{exttrail: dirdat/lt, rmttrail: remote/rt}}
replicats:
  REPM:
    exttrail: remote/rt
    source: PGM
    map: [{', '.join(f'{{source: "{p}", target: "{p}"}}' for p in patterns)}]
    grouptransops: 1000
""")
    return path


def one_run(server: LocalServer, count: int, changes: int, seed: int) -> dict:
    tables = tables_for(count)
    tag = f"t{count}"
    work = REPO / "var" / "bench-many-tables-work" / tag
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    admin = server.dsn()
    source = fresh_database(admin, f"many_source_{tag}")
    metadata = fresh_database(admin, f"many_meta_{tag}")
    target = fresh_database(admin, f"many_target_{tag}")
    create_tables(source, tables)
    env = {**os.environ, "TRAILBOUND_BENCH_SOURCE_DSN": source, "TRAILBOUND_METADATA_DSN": metadata,
           "TRAILBOUND_TARGET_DSN": target, "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}",
           "TRAILBOUND_CONFIG": str(write_config(work, tables))}
    env.pop("SPARK_REMOTE", None)
    tb = [sys.executable, "-m", "trailbound.cli"]
    stage([*tb, "add", "source", "PGM"], env, server)
    stage([*tb, "target", "create"], env, server)
    started = time.monotonic()
    transactions = workload(source, tables, changes, seed)
    written = time.monotonic() - started
    print(f"{count} tables: {transactions} transactions, {changes} changes written in {written:.0f} s", flush=True)
    stages = {}
    for name, words in zip(STAGES, (["archive", "pull", "PGM"], ["extract", "run", "EXTM"], ["pump", "run", "PMPM"],
                                    ["replicat", "run", "REPM"])):
        stages[name] = stage([*tb, *words], env, server)
        print(f"  {name}: {stages[name].seconds:.1f} s, CPU {stages[name].client_cpu:.1f} s client + "
              f"{stages[name].server_cpu:.1f} s server", flush=True)
    pulled = int(re.search(r"pulled (\d+) change", stages["pull"].output).group(1))
    names = [(schema, table) for schema, table, _ in tables]
    source_digests = table_digests(source, names)
    different = [n for n, d in table_digests(target, names).items() if d != source_digests[n]]
    if different:
        raise SystemExit(f"{count} tables: the target differs from the source in {len(different)} table(s): "
                         f"{different[:10]}")
    print(f"  target equal to the source in all {count} tables", flush=True)
    stage([*tb, "delete", "source", "PGM"], env, server)
    return {"tables": count, "transactions": transactions, "changes": pulled, "stages": stages}


def replicat_again(count: int, profile: bool) -> None:
    """Replicat alone on the last run's trail for `count` tables (see the docstring)."""
    import cProfile
    import pstats

    from trailbound import cli

    tag = f"t{count}"
    server = LocalServer(SERVER, options=LOGICAL_OPTIONS, databases=()).start()
    try:
        admin = psycopg2.connect(server.dsn())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier("many_meta_again")))
            cur.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier("many_meta_again"),
                                                                      sql.Identifier(f"many_meta_{tag}")))
        admin.close()
        target = fresh_database(server.dsn(), "many_target_again")
        os.environ.update(TRAILBOUND_METADATA_DSN=server.dsn("many_meta_again"), TRAILBOUND_TARGET_DSN=target,
                          TRAILBOUND_CONFIG=str(REPO / "var" / "bench-many-tables-work" / tag / "trailbound.yaml"),
                          TRAILBOUND_BENCH_SOURCE_DSN=server.dsn(f"many_source_{tag}"))
        assert cli.main(["target", "create"]) == 0
        assert cli.main(["alter", "replicat", "REPM", "extseqno", "1", "extrba", "0"]) == 0
        profiler = cProfile.Profile() if profile else None
        started, cpu, server_before = time.monotonic(), time.process_time(), server_cpu(server)
        if profiler:
            profiler.enable()
        assert cli.main(["replicat", "run", "REPM"]) == 0
        if profiler:
            profiler.disable()
        print(f"{count} tables: replicat {time.monotonic() - started:.1f} s, process CPU "
              f"{time.process_time() - cpu:.2f} s, server CPU {server_cpu(server) - server_before:.2f} s, "
              f"load average {os.getloadavg()[0]:.1f}")
        with psycopg2.connect(server.dsn("many_meta_again")) as connection, connection.cursor() as cur:
            cur.execute("SELECT timings FROM trailbound.replicat_run ORDER BY run_id DESC LIMIT 1")
            for phase, seconds in sorted(cur.fetchone()[0].items(), key=lambda item: -item[1]):
                print(f"  {seconds:8.3f} s  {phase}")
        connection.close()
        names = [(schema, table) for schema, table, _ in tables_for(count)]
        equal = table_digests(server.dsn(f"many_source_{tag}"), names) == table_digests(target, names)
        print(f"  target equal to the source: {equal}")
        if profiler:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    finally:
        server.stop()


def report(runs: list[dict], args, loads: tuple, commit: str) -> str:
    many, few = runs
    rows = []
    for name in (*STAGES, "total"):
        def per(run, what):
            if name == "total":
                return sum(getattr(run["stages"][s], what) for s in STAGES) / run["changes"] * 1e6
            return getattr(run["stages"][name], what) / run["changes"] * 1e6

        cells = []
        for what in ("seconds", "client_cpu", "server_cpu"):
            a, b = per(many, what), per(few, what)
            cells.append(f"{a:,.1f} / {b:,.1f} | {a / b:.2f}x" if b else f"{a:,.1f} / {b:,.1f} | -")
        bold = "**" if name in ("capture", "replicat", "total") else ""
        rows.append(f"| {bold}{name}{bold} | " + " | ".join(cells) + " |")
    seconds = " | ".join(f"{many['stages'][s].seconds:.1f} / {few['stages'][s].seconds:.1f}" for s in STAGES)
    return f"""# Many tables: cost per change on {many['tables']} tables against {few['tables']}

Command: `.venv/bin/python tests/bench/bench_many_tables.py --changes {args.changes} --tables {args.tables} \
--baseline {args.baseline} --seed {args.seed}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, on
{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, PostgreSQL 15 (the benchmark's own
local server, fsync off). Load average {loads[0]:.1f} at the start, {loads[1]:.1f} at the end.

Workload: {many['changes']:,} row changes in {many['transactions']:,} transactions on {many['tables']} tables
({many['tables'] // len(SHAPES)} of each shape: integer key, composite key, uuid key, keyless with REPLICA
IDENTITY FULL, 64 mixed columns) in {len(SCHEMAS)} schemas, against {few['changes']:,} changes in
{few['transactions']:,} transactions on {few['tables']} tables (one of each shape). The same seeded draws;
transactions touch 1 to 20 tables, each touch INSERTs, UPDATEs or DELETEs 1 to 5 rows.
Each stage is a CLI process (capture starts its local Spark JVM). Target equal to the
source, table by table, after both runs.

Seconds per stage ({many['tables']} / {few['tables']} tables): pull, capture, pump, replicat: {seconds}.

Per million changes, {many['tables']} tables / {few['tables']} tables, and the ratio:

| stage | wall s | ratio | client CPU s | ratio | server CPU s | ratio |
|---|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

(client CPU: the CLI process and its children, the JVM and Spark's Python workers among
them; server CPU: the one PostgreSQL server holding source, metadata store and target.)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--tables", type=int, default=300)
    parser.add_argument("--baseline", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--no-write", action="store_true", help="print the report, do not write the results page")
    parser.add_argument("--replicat-again", type=int, metavar="TABLES",
                        help="only run replicat again, in this process, on the last run's trail for TABLES tables")
    parser.add_argument("--profile", action="store_true", help="with --replicat-again: print its cProfile")
    args = parser.parse_args(argv)
    if args.replicat_again:
        replicat_again(args.replicat_again, args.profile)
        return 0
    load_before = os.getloadavg()[0]
    server = LocalServer(SERVER, options=LOGICAL_OPTIONS + " -c max_wal_size=4GB", databases=()).start()
    # The benchmark's own server: a slot an interrupted run left behind would refuse `add source`.
    admin = psycopg2.connect(server.dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active")
    admin.close()
    try:
        runs = [one_run(server, count, args.changes, args.seed) for count in (args.tables, args.baseline)]
    finally:
        server.stop()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    text = report(runs, args, (load_before, os.getloadavg()[0]), commit)
    print(text)
    if not args.no_write:
        write_report(RESULTS, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
