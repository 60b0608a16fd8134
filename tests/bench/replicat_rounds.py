"""Two replicat engines side by side, in warm rounds: the A/B that sessions 18 and 19
used to tell a change of one or two points from the bench's spread (docs/benchmarks/replicat.md).

    .venv/bin/python tests/bench/replicat_rounds.py ENGINE_A ENGINE_B [--processes 3] [--rounds 6] [--rows N]

An engine is a directory holding `include/` and `plugins/`, e.g. one made with
`git archive <commit> include plugins | tar -x -C /tmp/before`, or `.` for the working
tree. The two alternate, process by process; each process builds the bench's
insert-heavy trail (300,000 changes, GROUPTRANSOPS 1000, two sessions), measures the
plain COPY (the median of three), then applies the trail `--rounds` times, each on a
fresh target, and prints the median and mean share of COPY. Warm rounds leave out the
first run's imports and the JVM the bench keeps; one bench run's spread is about ±3
points, the median of six rounds about ±1.

Needs TRAILBOUND_METADATA_DSN and TRAILBOUND_TARGET_DSN (make bench's throwaway server);
uses bench_replicat's databases.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rounds(rows: int, count: int) -> list[float]:
    """In this process, with the engine on sys.path: each round's share of the COPY."""
    import shutil
    import time

    import bench_replicat as bench
    from benchdb import fresh_database

    from trailbound.metadata import MetadataStore, dsn_from_env
    from trailbound.replicat.run import run_replicat

    home, defs, transactions, files, config = bench.insert_workspace(rows, "trailbound-rounds-")
    meta_server, target_server = dsn_from_env("TRAILBOUND_METADATA_DSN"), dsn_from_env("TRAILBOUND_TARGET_DSN")
    try:
        (copy_seconds, _), _ = bench.median_copy(target_server, defs, transactions)
        shares = []
        for _ in range(count):
            meta = fresh_database(meta_server, "trailbound_bench_replicat_meta")
            target = fresh_database(target_server, "trailbound_bench_replicat_target")
            bench.create_target(target, defs)
            store = MetadataStore.open(meta)
            bench.register_trail(store, home / "dirdat" / "lt", files)
            began = time.perf_counter()
            result = run_replicat(bench.no_spark, store, config, "REP1", target_dsn=target)
            seconds = time.perf_counter() - began
            store.close()
            assert result.operations == rows, result.describe()
            shares.append(copy_seconds / seconds)
        return shares
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engines", nargs=2, type=Path, metavar="ENGINE")
    parser.add_argument("--processes", type=int, default=3, help="processes per engine (default 3)")
    parser.add_argument("--rounds", type=int, default=6, help="runs per process (default 6)")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: this process's rounds
    args = parser.parse_args()
    if args.one:
        shares = rounds(args.rows, args.rounds)
        print(f"{statistics.median(shares):.4f} {statistics.mean(shares):.4f}")
        return 0
    results: dict[Path, list[tuple[float, float]]] = {engine: [] for engine in args.engines}
    for _ in range(args.processes):
        for engine in args.engines:
            root = engine.resolve()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "include"), str(root / "plugins")])}
            done = subprocess.run([sys.executable, __file__, *map(str, args.engines), "--rounds", str(args.rounds),
                                   "--rows", str(args.rows), "--one"], env=env, cwd=HERE, capture_output=True,
                                  text=True, check=True)
            median, mean = map(float, done.stdout.split()[-2:])
            results[engine].append((median, mean))
            print(f"{engine}: median {median:.1%}, mean {mean:.1%} of COPY over {args.rounds} rounds", flush=True)
    for engine, figures in results.items():
        print(f"{engine}: medians {', '.join(f'{m:.1%}' for m, _ in figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
