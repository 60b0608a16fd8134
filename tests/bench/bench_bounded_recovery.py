"""Bounded Recovery benchmark: how much log a capture run re-reads, against the age of
the oldest open transaction, with BR on and off.

    make bench
    .venv/bin/python tests/bench/bench_bounded_recovery.py [--records-per-hour N]

One long transaction starts at hour 0 and stays open; a steady OLTP stream commits
around it (one segment per hour of log time, capture interval 1h, brinterval 4h, the
GoldenGate default). For each age (6h, 24h, 72h) capture runs to four hours before it,
then hourly: the figure is the most any of those four hourly runs re-read (what it read
below the previous run's horizon). Needs
TRAILBOUND_METADATA_DSN (a database `trailbound_bench_br` is created afresh). Results:
docs/benchmarks/bounded-recovery.md and .png.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from benchdb import fresh_database
from results import write_report

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "bounded-recovery.md"
PLOT = RESULTS.with_suffix(".png")
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
AGES = (6, 24, 72)
HOUR = 3600
BRINTERVAL = 4  # hours


def write_archive(archive: Path, hours: int, per_hour: int) -> None:
    from trailbound.archive.writer import write_defs, write_segment_columns, to_micros
    from trailbound.positions import Scn

    write_defs(archive, [{"name": "shop.events", "columns": [{"name": "id", "type": "bigint", "nullable": False},
                                                              {"name": "note", "type": "text", "nullable": True}],
                          "key": ["id"]}])
    key = 0
    for h in range(hours):
        columns = {name: [] for name in ("scn", "ts", "xid", "parent_xid", "op", "table", "before", "after")}

        def add(scn, xid, op, after=None):
            columns["scn"].append(scn)
            columns["ts"].append(to_micros(T0 + timedelta(seconds=scn)))
            columns["xid"].append(xid)
            columns["parent_xid"].append(None)
            columns["op"].append(op)
            columns["table"].append("shop.events" if op == "INSERT" else None)
            columns["before"].append(None)
            columns["after"].append(after)

        base = h * HOUR
        add(base, "LONG", "INSERT", f'{{"id":-{h + 1},"note":"long"}}')
        for n in range(per_hour // 2):  # each short transaction: an insert and its commit
            scn = base + 1 + (n * (HOUR - 2)) // (per_hour // 2)
            key += 1
            add(scn, f"T{key}", "INSERT", f'{{"id":{key},"note":"n{key}"}}')
            add(scn, f"T{key}", "COMMIT")
        write_segment_columns(archive, thread=1, sequence=h + 1, columns=columns, first_scn=Scn(base),
                              next_scn=Scn(base + HOUR), first_time=T0 + timedelta(seconds=base),
                              next_time=T0 + timedelta(seconds=base + HOUR), fmt="parquet")


def measure(spark, work: Path, server_dsn: str, broff: bool) -> dict[int, tuple[int, float]]:
    from trailbound import config as configuration
    from trailbound.capture.run import run_extract
    from trailbound.metadata import MetadataStore

    mode = "off" if broff else "on"
    shutil.rmtree(work / f"dirdat-{mode}", ignore_errors=True)
    shutil.rmtree(work / f"br-{mode}", ignore_errors=True)
    config_path = work / f"trailbound-{mode}.yaml"
    config_path.write_text(f"home: {work}\nsources:\n  SRC:\n    altarchivelogdest: archive\n"
                           f"extracts:\n  EXT1:\n    source: SRC\n    exttrail: dirdat-{mode}/lt\n"
                           f"    table: ['shop.*']\n    interval: 1h\n"
                           f"    br:\n      brdir: br-{mode}\n      brinterval: {BRINTERVAL}h\n"
                           f"      broff: {str(broff).lower()}\n")
    config = configuration.load(config_path)
    store = MetadataStore.open(fresh_database(server_dsn, f"trailbound_bench_br_{mode}"))
    results = {}
    for age in AGES:
        for hour in range(age - BRINTERVAL, age + 1):
            run_extract(spark, store, config, "EXT1", until=T0 + timedelta(hours=hour))
        with store.transaction() as cur:
            cur.execute("SELECT reread_records, read_from_time, read_time FROM trailbound.extract_run"
                        " ORDER BY run_id DESC LIMIT %s", (BRINTERVAL + 1,))
            recent = cur.fetchall()
        spans = [(previous["read_time"] - run["read_from_time"]).total_seconds() / HOUR
                 for run, previous in zip(recent, recent[1:])]
        results[age] = (max(run["reread_records"] for run in recent[:-1]), max(0.0, *spans))
    store.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records-per-hour", type=int, default=20_000)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trailbound import spark as spark_session
    from trailbound.metadata import dsn_from_env

    work = REPO / "var" / "bench" / f"br-{args.records_per_hour}"
    archive = work / "archive"
    total_hours = max(AGES) + 1
    if not (archive / "defs.json").exists():
        shutil.rmtree(work, ignore_errors=True)
        write_archive(archive, total_hours, args.records_per_hour)
    spark = spark_session.session("trailbound-bench-br", master="local[*]")
    server = dsn_from_env("TRAILBOUND_METADATA_DSN")
    on = measure(spark, work, server, broff=False)
    off = measure(spark, work, server, broff=True)
    spark.stop()

    rows = "\n".join(f"| {age} h | {on[age][0]:,} | {on[age][1]:.1f} h | {off[age][0]:,} | {off[age][1]:.1f} h | "
                     f"{(off[age][0] / on[age][0]) if on[age][0] else float('inf'):,.0f}x |" for age in AGES)
    bound_ok = all(on[age][1] <= 2.0 * BRINTERVAL for age in AGES)
    ratio_72 = off[72][0] / max(1, on[72][0])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(AGES, [off[a][0] for a in AGES], marker="o", label="BR off (normal recovery)")
    ax.plot(AGES, [on[a][0] for a in AGES], marker="o", label=f"BR on (brinterval {BRINTERVAL}h)")
    ax.set_xlabel("age of the oldest open transaction (hours of log time)")
    ax.set_ylabel("records re-read per run")
    ax.set_xticks(AGES)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    command = f".venv/bin/python tests/bench/bench_bounded_recovery.py --records-per-hour {args.records_per_hour}"
    report = f"""# Bounded Recovery benchmark

Records a capture run re-reads (records below the previous run's horizon that it had to
read again), against the age of the oldest open transaction, with Bounded Recovery on
and off. One transaction opens at hour 0 and never commits; around it
{args.records_per_hour:,} records per hour commit in short transactions (one segment per hour,
capture interval 1h, brinterval {BRINTERVAL}h). For each age, capture runs to {BRINTERVAL} hours before it and
then hourly; the table shows the most any of those {BRINTERVAL} hourly runs re-read.

Command, from the repository root (`make bench` runs it with the throwaway PostgreSQL):

    {command}

| oldest open transaction | BR on: records re-read | BR on: log re-read | BR off: records re-read | BR off: log re-read | off / on |
|---|---|---|---|---|---|
{rows}

![re-read against age](bounded-recovery.png)

- Bound (re-read at most two BR intervals = {2 * BRINTERVAL} h of log with BR on): {"met" if bound_ok else "NOT met"}.
- At 72 h, BR off re-reads {ratio_72:,.0f}x what BR on does (goal: at least 20x): {"met" if ratio_72 >= 20 else "NOT met"}.
- Why: with BR on, each run restarts at the last BR checkpoint (the long transaction comes
  back from its persisted file), so it re-reads at most the hours since that checkpoint;
  with BR off it re-reads everything since the long transaction began.
- Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.platform()}, Python {platform.python_version()}.
"""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_report(RESULTS, report)
    print(report)
    if not (bound_ok and ratio_72 >= 20):
        print("FAILED: Bounded Recovery did not meet its bound (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
