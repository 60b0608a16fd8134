"""The pull alone (the slot's pgoutput stream to archive segments), run again and again on
one backlog: each run reads its own copy of the slot (pg_copy_logical_replication_slot,
made before the backlog) into a fresh archive, so runs of two versions of the code can be
alternated on the very same WAL.

    .venv/bin/python tests/bench/bench_pull.py [--scale S] [--transactions T] [--runs N] [--profile]
        [--reuse] [--code NAME=INCLUDE_DIR ...] [--cgtime /work/tools/cgtime]

Starts its own source server (var/bench-pull-source, wal_level=logical). The backlog is
pgbench's data load at scale S (S x 100,000 inserts in one transaction) then T TPC-B-like
transactions (3 updates and 1 insert each) on 2 clients. Each run is timed in its own
process (`trailbound archive pull`; `--runs 0` makes the backlog alone); `--profile` runs one pull under cProfile in this
process and prints the top functions. Results go to docs/benchmarks/pull.md.

A/B: with `--code old=DIR --code new=DIR` (each an `include/` directory, e.g. of a
`git archive` of the commit) each run pulls once with each code, alternated, and prints
what each took; with `--cgtime` each pull runs under that command, which prints its
CPU-seconds (on a loaded machine wall time says little); each code's first archive is kept
as var/bench-pull/archive_<NAME> for a comparison. Nothing is written to pull.md.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg2

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "include"))
from trailbound.devtools.livedemo import LOGICAL_OPTIONS, recreate_database  # noqa: E402
from trailbound.devtools.localpg import LocalServer  # noqa: E402

RESULTS = REPO / "docs" / "benchmarks" / "pull.md"
WORK = REPO / "var" / "bench-pull"
SLOT = "bench_pull"


def execute(dsn: str, *statements: str) -> list:
    connection = psycopg2.connect(dsn)
    connection.autocommit = True
    try:
        with connection.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
            return cur.fetchall() if cur.description else []
    finally:
        connection.close()


def config_text(archive: Path, slot: str) -> str:
    return (f"home: {WORK}\nsources:\n  PGB:\n    altarchivelogdest: {archive}\n    postgres:\n"
            f"      dsn_env: TRAILBOUND_BENCH_SOURCE_DSN\n      conn_id: bench_source\n      slot: {slot}\n      publication: bench_pub\n"
            "      table: ['public.pgbench_*']\n")


def fresh_run(n: int, source: str) -> Path:
    """A copy of the slot and of the archive as `add source` left it; the configuration's path."""
    slot = f"{SLOT}_{n}"
    execute(source, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{slot}'",
            f"SELECT pg_copy_logical_replication_slot('{SLOT}', '{slot}')")
    archive = WORK / f"archive_{n}"
    shutil.rmtree(archive, ignore_errors=True)
    shutil.copytree(WORK / "archive", archive)
    state = archive / ".pgminer" / "state_000000000.json"
    state.write_text(state.read_text().replace(f'"slot":"{SLOT}"', f'"slot":"{slot}"'))
    path = WORK / f"run_{n}.yaml"
    path.write_text(config_text(archive, slot))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=5)
    parser.add_argument("--transactions", type=int, default=125_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--reuse", action="store_true", help="keep the backlog of the last invocation")
    parser.add_argument("--code", action="append", default=[], metavar="NAME=INCLUDE_DIR",
                        help="A/B: pull with each of these code trees in turn")
    parser.add_argument("--cgtime", help="run each A/B pull under this command (prints CPU-seconds)")
    args = parser.parse_args(argv)

    server = LocalServer(REPO / "var" / "bench-pull-source", options=LOGICAL_OPTIONS + " -c max_wal_size=8GB "
                         "-c max_replication_slots=40", databases=("bench_source",)).start()
    source = server.dsn("bench_source")
    env = {**os.environ, "TRAILBOUND_BENCH_SOURCE_DSN": source,
           "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}"}
    tb = [sys.executable, "-m", "trailbound.cli"]
    if not (args.reuse and (WORK / "archive").is_dir()):
        recreate_database(server.dsn(), "bench_source")
        shutil.rmtree(WORK, ignore_errors=True)
        WORK.mkdir(parents=True)
        subprocess.run(["pgbench", "-i", "-I", "dtp", "-q", source], check=True, capture_output=True)
        execute(source, "ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
        (WORK / "base.yaml").write_text(config_text(WORK / "archive", SLOT))
        subprocess.run([*tb, "--config", str(WORK / "base.yaml"), "add", "source", "PGB"], env=env, check=True)
        subprocess.run(["pgbench", "-i", "-I", "g", "-q", "-s", str(args.scale), source], check=True,
                       capture_output=True)
        subprocess.run(["pgbench", "-n", "-c", "2", "-j", "2", "-t", str(args.transactions // 2), source],
                       check=True, capture_output=True)
        print(f"backlog: scale {args.scale} load, then {args.transactions} transactions", flush=True)

    if args.profile:
        from trailbound import config as configuration
        from trailbound.sources.postgres.admin import pull

        os.environ["TRAILBOUND_BENCH_SOURCE_DSN"] = source
        config = configuration.load(fresh_run(0, source))
        profile = cProfile.Profile()
        started = time.monotonic()
        profile.enable()
        result = pull(config, "PGB")
        profile.disable()
        print(result.describe(), f"({time.monotonic() - started:.1f} s under the profiler)")
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return 0

    if args.code:
        return compare_codes(args, source, env, tb)

    rates = []
    for n in range(1, args.runs + 1):
        config_path = fresh_run(n, source)
        started = time.monotonic()
        done = subprocess.run([*tb, "--config", str(config_path), "archive", "pull", "PGB"], env=env,
                              capture_output=True, text=True)
        seconds = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        changes = int(re.search(r"pulled (\d+) change", done.stdout).group(1))
        rates.append((seconds, changes))
        print(f"run {n}: {changes} changes in {seconds:.2f} s: {changes / seconds:,.0f} changes/s", flush=True)
        execute(source, f"SELECT pg_drop_replication_slot('{SLOT}_{n}')")
        shutil.rmtree(WORK / f"archive_{n}", ignore_errors=True)

    if not rates:  # --runs 0: the backlog alone
        return 0
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    best = min(s for s, _ in rates)
    line = (f"| {datetime.now(UTC):%Y-%m-%d %H:%M} UTC | {commit} | {rates[0][1]:,} | "
            + ", ".join(f"{s:.2f}" for s, _ in rates) + f" s | {rates[0][1] / best:,.0f} | "
            f"{os.getloadavg()[0]:.1f} | {platform.node()} |")
    print(line)
    if not RESULTS.exists():
        RESULTS.write_text("# The pull alone, run again on one backlog (tests/bench/bench_pull.py)\n\n"
                           "Command: `make bench`, or `.venv/bin/python tests/bench/bench_pull.py --scale 5 "
                           "--transactions 125000 --runs 3`.\n\n"
                           "| run | commit | changes | seconds per run | best changes/s | load | machine |\n"
                           "|---|---|---|---|---|---|---|\n")
    with RESULTS.open("a") as results:
        results.write(line + "\n")
    return 0


def compare_codes(args, source: str, env: dict, tb: list[str]) -> int:
    """Each run: one pull with each code tree, on its own copy of the slot and archive."""
    n = 100
    for run in range(1, args.runs + 1):
        for name, include in (code.split("=", 1) for code in args.code):
            n += 1
            config_path = fresh_run(n, source)
            command = [*tb, "--config", str(config_path), "archive", "pull", "PGB"]
            started = time.monotonic()
            done = subprocess.run([args.cgtime, *command] if args.cgtime else command,
                                  env={**env, "PYTHONPATH": include}, capture_output=True, text=True)
            seconds = time.monotonic() - started
            assert done.returncode == 0, done.stderr
            changes = int(re.search(r"pulled (\d+) change", done.stdout).group(1))
            cpu = re.search(r"([\d.]+) CPU-s", done.stderr)
            print(f"{name} run {run}: {changes} changes in {seconds:.1f} s wall ({changes / seconds:,.0f} changes/s)"
                  + (f", {cpu.group(1)} CPU-s ({float(cpu.group(1)) * 1e6 / changes:.1f} CPU-us per change)"
                     if cpu else "") + f", load {os.getloadavg()[0]:.1f}", flush=True)
            execute(source, f"SELECT pg_drop_replication_slot('{SLOT}_{n}')")
            if run == 1:  # each code's first archive kept, to be compared (cmp of the segments)
                shutil.rmtree(WORK / f"archive_{name}", ignore_errors=True)
                (WORK / f"archive_{n}").rename(WORK / f"archive_{name}")
            else:
                shutil.rmtree(WORK / f"archive_{n}", ignore_errors=True)
    print(f"the first pull's archive of each code: {WORK}/archive_<name>")
    return 0


if __name__ == "__main__":
    sys.exit(main())
