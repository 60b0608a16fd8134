"""Where one insert-heavy replicat run spends its time: per thread and per process, as
docs/benchmarks/replicat.md ("Where insert-heavy time goes") reports it.

    .venv/bin/python tests/bench/replicat_profile.py [--rows N] [--rounds R] [--apply-parallelism P] [--timeline]

Needs TRAILBOUND_METADATA_DSN and TRAILBOUND_TARGET_DSN (make bench's throwaway server);
uses bench_replicat's databases and plain COPY (the median of three). The trail is
local, so no Spark runs. Each round is one `run_replicat` on a fresh target, and reports:

- the run's wall time and its share of the plain COPY;
- the time from the run's start to the first parallel session's first group;
- CPU and run-queue wait (from /proc/self/task/<tid>/schedstat) of the prepare thread
  (`_Run._prepare`) and of the parallel sessions' threads (`ParallelApply._apply`), and
  the CPU of the run's process and of the whole machine;
- the CPU of the parallel sessions' server processes (from /proc, when the server runs on
  this machine; "-" otherwise);
- with --timeline, below each round: the machine's busy share in each 20 ms of the run
  (from /proc/stat, so in steps of 25% on two CPUs) and when each chunk was prepared:
  where the run leaves a CPU idle (sessions drained between chunks show here).

The first round includes the process's first imports; read the others. The measurement
wraps three methods of the engine for the runs of this process (a benchmark, not a test).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import bench_replicat as bench
from benchdb import backend_cpu, fresh_database


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--apply-parallelism", type=int, default=2)
    parser.add_argument("--timeline", action="store_true", help="each round's busy share per 20 ms, and its chunks")
    args = parser.parse_args()

    from trailbound.metadata import MetadataStore, dsn_from_env
    from trailbound.replicat.apply import parallel
    from trailbound.replicat import run as replicat_run
    from trailbound.replicat import target as tgt

    work, defs, transactions, files, config = bench.insert_workspace(args.rows, "trailbound-profile-",
                                                                     sessions=args.apply_parallelism)
    meta_server, target_server = dsn_from_env("TRAILBOUND_METADATA_DSN"), dsn_from_env("TRAILBOUND_TARGET_DSN")
    (copy_seconds, _), copies = bench.median_copy(target_server, defs, transactions)

    seen = Counter()
    lock = threading.Lock()
    marks: dict[str, float] = {}
    spans: list[tuple[str, float, float]] = []  # (label, began, ended) of every measured call
    lane_servers: list = []   # (connection, its server process's CPU since it opened)

    def thread_times() -> tuple[float, float]:
        """This thread's CPU and run-queue wait so far, in seconds."""
        text = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()
        return int(text[0]) / 1e9, int(text[1]) / 1e9

    def measured(method, label: str):
        def wrapper(*args_, **kwargs):
            began_at = time.perf_counter()
            marks.setdefault(label, began_at)  # when the first call began
            cpu, waited = thread_times()
            try:
                return method(*args_, **kwargs)
            finally:
                cpu_after, waited_after = thread_times()
                with lock:
                    seen[f"{label} CPU"] += cpu_after - cpu
                    seen[f"{label} run queue"] += waited_after - waited
                    spans.append((label, began_at, time.perf_counter()))
        return wrapper

    def machine_ticks() -> tuple[int, int]:
        """The machine's busy ticks (all but idle and iowait) and all its ticks so far."""
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields) - fields[3] - fields[4], sum(fields)

    def machine_cpu() -> float:
        return machine_ticks()[0] / os.sysconf("SC_CLK_TCK")

    def sample_busy(samples: list, stop: threading.Event) -> None:
        while not stop.is_set():
            samples.append((time.perf_counter(), *machine_ticks()))
            time.sleep(0.02)

    def timeline(samples: list, began: float) -> str:
        busy = " ".join(f"{(t0 - began) * 1000:.0f}:{(b1 - b0) / max(1, a1 - a0):.0%}"
                        for (t0, b0, a0), (_, b1, a1) in zip(samples, samples[1:]))
        chunks = " ".join(f"{(a - began) * 1000:.0f}-{(z - began) * 1000:.0f}"
                          for label, a, z in sorted(spans, key=lambda span: span[1]) if label == "prepare")
        return f"  busy per 20 ms (ms from the start: share): {busy}\n  chunks prepared (ms): {chunks}"

    originals = (replicat_run._Run._prepare, parallel.ParallelApply._apply, parallel.Lane.close,
                 replicat_run.lane_connection)
    lane_close = originals[2]

    def close(lane) -> None:
        # A session's server process is gone once closed: read its CPU before.
        server = next((cpu for connection, cpu in lane_servers if connection is lane.connection), None)
        if server is not None:
            seen["servers CPU"] += server()
        lane_close(lane)

    def lane_connection(config_, dsn):
        def open_lane():
            connection = tgt.connect(config_, dsn)
            lane_servers.append((connection, backend_cpu(connection)))
            return connection
        return open_lane

    replicat_run._Run._prepare = measured(replicat_run._Run._prepare, "prepare")
    parallel.ParallelApply._apply = measured(parallel.ParallelApply._apply, "sessions")
    parallel.Lane.close = close
    replicat_run.lane_connection = lane_connection
    print(f"{args.rows:,} insert-heavy changes, GROUPTRANSOPS 1000, {args.apply_parallelism} sessions; "
          f"plain COPY {copy_seconds:.3f} s (the median of {', '.join(f'{s:.3f}' for s, _ in copies)})")
    print("| round | run | share of COPY | first group sent at | prepare CPU | its run-queue wait | sessions' "
          "threads CPU | their run-queue wait | run's process CPU | sessions' servers CPU | machine CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for number in range(1, args.rounds + 1):
            meta = fresh_database(meta_server, "trailbound_bench_replicat_meta")
            target = fresh_database(target_server, "trailbound_bench_replicat_target")
            bench.create_target(target, defs)
            store = MetadataStore.open(meta)
            bench.register_trail(store, work / "dirdat" / "lt", files)
            seen.clear()
            marks.clear()
            spans.clear()
            lane_servers.clear()
            samples, stop = [], threading.Event()
            sampler = threading.Thread(target=sample_busy, args=(samples, stop)) if args.timeline else None
            machine, process = machine_cpu(), time.process_time()
            began = time.perf_counter()
            if sampler:
                sampler.start()
            result = replicat_run.run_replicat(bench.no_spark, store, config, "REP1", target_dsn=target)
            seconds = time.perf_counter() - began
            if sampler:
                stop.set()
                sampler.join()
            process, machine = time.process_time() - process, machine_cpu() - machine
            store.close()
            assert result.operations == args.rows, result.describe()
            first = marks.get("sessions")
            servers_cpu = f"{seen['servers CPU']:.2f} s" if lane_servers and all(s for _, s in lane_servers) else "-"
            print(f"| {number} | {seconds:.3f} s | {copy_seconds / seconds:.0%} | "
                  f"{'-' if first is None else f'{(first - began) * 1000:.0f} ms'} | "
                  f"{seen['prepare CPU']:.2f} s | {seen['prepare run queue']:.2f} s | {seen['sessions CPU']:.2f} s | "
                  f"{seen['sessions run queue']:.2f} s | {process:.2f} s | {servers_cpu} | {machine:.2f} s |", flush=True)
            if sampler:
                print(timeline(samples, began), flush=True)
    finally:
        (replicat_run._Run._prepare, parallel.ParallelApply._apply, parallel.Lane.close,
         replicat_run.lane_connection) = originals
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
