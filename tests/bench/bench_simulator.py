"""Benchmark: how fast the simulator writes a large archive (budget: 10M records in 3 min).

Run from the repository root:

    .venv/bin/python tests/bench/bench_simulator.py

Simulates into a temporary directory (deleted afterwards), prints the figures and writes
them, with the exact command, to docs/benchmarks/simulator.md. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow

from trailbound.sources.simulator import simulate

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "docs" / "benchmarks" / "simulator.md"
BUDGET_SECONDS = 180.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--hours", type=float, default=48.0)
    parser.add_argument("--fmt", default="parquet", choices=["parquet", "jsonl", "mixed"])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--report", type=Path, default=REPORT, help="where to write the figures")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-simulator-") as scratch:
        cpu_before = time.process_time()
        summary = simulate(Path(scratch) / "archive", Path(scratch) / "truth.json", seed=args.seed,
                           records=args.records, hours=args.hours, fmt=args.fmt)
        cpu_seconds = time.process_time() - cpu_before
        truth_bytes = (Path(scratch) / "truth.json").stat().st_size

    rate = summary.records / summary.elapsed_seconds
    within = summary.elapsed_seconds < BUDGET_SECONDS
    print(summary.describe())
    print(f"elapsed {summary.elapsed_seconds:.1f} s, CPU {cpu_seconds:.1f} s, {rate:,.0f} records/s"
          f" ({'within' if within else 'OVER'} the {BUDGET_SECONDS:.0f} s budget for 10M records)")

    command = " ".join([".venv/bin/python", "tests/bench/bench_simulator.py"] + [shlex.quote(a) for a in sys.argv[1:]])
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(f"""# Simulator benchmark

How fast `trailbound.sources.simulator.simulate` writes a redo archive (and its truth file).
The budget: 10,000,000 records in under {BUDGET_SECONDS:.0f} s on the 2-core development machine.

Command, from the repository root:

    {command}

| | |
|---|---|
| records | {summary.records:,} ({args.fmt}, {args.hours:g} h of log time, seed {args.seed}) |
| elapsed (wall clock) | {summary.elapsed_seconds:.1f} s |
| CPU time | {cpu_seconds:.1f} s |
| records/s | {rate:,.0f} |
| within budget | {"yes" if within else "NO"} |
| archive | {summary.bytes / 1e6:,.1f} MB in {sum(summary.segments.values())} segments |
| truth file | {truth_bytes / 1e6:,.1f} MB |
| measured | {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}, pyarrow {pyarrow.__version__} |

The simulator is single-threaded; wall clock above CPU time means the machine was busy
with other work.

Summary as printed:

```
{summary.describe()}
```
""", encoding="utf-8")
    print(f"wrote {args.report}")
    return 0 if within or args.records != 10_000_000 else 1


if __name__ == "__main__":
    sys.exit(main())
