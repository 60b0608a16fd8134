"""Capture benchmark: one capture run over a simulated archive, beside a plain Spark
read + sort + write of the same records, in the same process.

    make bench                                   # all benchmarks
    .venv/bin/python tests/bench/bench_capture.py [--records N]

Needs TRAILBOUND_METADATA_DSN (make bench provides its throwaway server); uses a
database `trailbound_bench` there, dropped and created afresh. The simulated archive is
kept under var/bench/ between runs (it is deterministic). Results go to
docs/benchmarks/capture.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchdb import fresh_database

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "capture.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    args = parser.parse_args()

    from trailbound import config as configuration
    from trailbound import spark as spark_session
    from trailbound.archive.catalog import ArchiveCatalog
    from trailbound.archive.segments import discover
    from trailbound.capture.run import run_extract
    from trailbound.metadata import MetadataStore, dsn_from_env
    from trailbound.sources.simulator import simulate

    work = REPO / "var" / "bench" / f"capture-{args.records}"
    archive = work / "archive"
    if not (archive / "defs.json").exists():
        shutil.rmtree(work, ignore_errors=True)
        print(f"simulating {args.records:,} records into {archive} ...", flush=True)
        simulate(archive, work / "truth.json", records=args.records, hours=48, fmt="parquet")
    shutil.rmtree(work / "dirdat", ignore_errors=True)
    shutil.rmtree(work / "plain", ignore_errors=True)
    config_path = work / "trailbound.yaml"
    config_path.write_text(f"home: {work}\nsources:\n  BENCH:\n    altarchivelogdest: archive\n"
                           "extracts:\n  EXT1:\n    source: BENCH\n    exttrail: dirdat/lt\n"
                           "    table: [\"shop.*\", \"hr.*\"]\n    megabytes: 256\n")
    config = configuration.load(config_path)
    store = MetadataStore.open(fresh_database(dsn_from_env("TRAILBOUND_METADATA_DSN"), "trailbound_bench"))

    spark = spark_session.session("trailbound-bench", master="local[*]")
    segments = discover(archive)
    paths = [str(s.path) for s in segments]
    records = sum(s.records for s in segments)
    spark.read.parquet(*paths).count()  # warm the JVM and the page cache for both contenders

    started = time.perf_counter()
    (spark.read.parquet(*paths).orderBy("scn", "rba").write.mode("overwrite").parquet(str(work / "plain")))
    plain = time.perf_counter() - started

    started = time.perf_counter()
    ArchiveCatalog(store, "BENCH").scan(archive, spark)
    scan = time.perf_counter() - started

    started = time.perf_counter()
    result = run_extract(spark, store, config, "EXT1")
    capture = time.perf_counter() - started
    store.close()
    spark.stop()

    plain_rate, capture_rate, scan_rate = records / plain, records / capture, records / scan
    phases = "\n".join(f"| {phase} | {seconds:.1f} s |" for phase, seconds in result.timings.items())
    command = f".venv/bin/python tests/bench/bench_capture.py --records {args.records}"
    report = f"""# Capture benchmark

One capture run (`run_extract`, normal recovery, no open transactions before it) over a
simulated archive, beside a plain Spark read + sort + write of the same records, in the
same Spark session (local[*]), after one warm-up read of the files for both.

Command, from the repository root (`make bench` runs it with the throwaway PostgreSQL):

    {command}

| | |
|---|---|
| records | {records:,} in {len(segments)} Parquet segments (3 threads, 48 h of log time) |
| plain read + sort + write | {plain:.1f} s, {plain_rate:,.0f} records/s |
| capture run | {capture:.1f} s, **{capture_rate:,.0f} records/s** ({capture_rate / plain_rate:.0%} of plain) |
| archive scan (catalog + record checks, done once per segment) | {scan:.1f} s, {scan_rate:,.0f} records/s |
| written | {result.transactions_written:,} transactions, {result.records_written:,} records in {len(result.files)} trail file(s) |
| goal | at least half the plain rate and 400,000 records/s: {"met" if capture_rate >= max(plain_rate / 2, 400_000) else "not met"} |
| measured | {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()} |

Where the capture run's time goes:

| phase | time |
|---|---|
{phases}
"""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
