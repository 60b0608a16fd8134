"""Capture benchmark: capture runs over simulated archives, each beside a plain Spark
read + sort + write of the same records in the same Spark session.

    make bench                                   # all benchmarks (the default suite)
    .venv/bin/python tests/bench/bench_capture.py [--records 10000000 ...] [--masters local[1] local[2] standalone]
                                                  [--driver-memory 1g]

For each archive size and each master, one process: a fresh metadata database, a warm-up
read, the plain read + sort + write, the archive scan, the capture run; it reports rates,
the trail's digest (of every record in order, and of the files' SHA-256s), and the peak
RSS of the Python driver and of the JVM. `standalone` starts a Spark standalone master
and one worker (its own work directory) on 127.0.0.1 from the pyspark install, and stops
them after. The results go to docs/benchmarks/capture.md and capture.png (throughput
against archive size, beside the plain Spark line).

Needs TRAILBOUND_METADATA_DSN (make bench provides its throwaway server); uses a
database `trailbound_bench` there, dropped and created afresh for each run. Simulated
archives are kept under var/bench/ between runs (they are deterministic).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "capture.md"
PLOT = REPO / "docs" / "benchmarks" / "capture.png"
SENTINEL = "BENCH-RESULT "
LOG = REPO / "var" / "bench" / "capture-results.jsonl"


BASE = 1_000_000  # simulated; larger archives are whole copies of it laid end to end


def _archive(records: int) -> Path:
    from trailbound.sources.simulator import simulate

    work = REPO / "var" / "bench" / f"capture-{records}"
    archive = work / "archive"
    if not (archive / "defs.json").exists():
        shutil.rmtree(work, ignore_errors=True)
        if records > BASE and records % BASE == 0:
            _tile(_archive(BASE) / "archive", archive, records // BASE)
        else:
            print(f"simulating {records:,} records into {archive} ...", flush=True)
            simulate(archive, work / "truth.json", records=records, hours=48, fmt="parquet")
    return work


def _tile(base: Path, archive: Path, copies: int) -> None:
    """`copies` copies of the simulated archive `base`, each thread's copies following
    each other (sequence, scn and time shifted by the thread's span; xids of copy k get
    the suffix ~k, after at most 125 characters): the simulator takes minutes per million records, this seconds. A
    thread that closes is closed only in the last copy."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from trailbound.archive import contract
    from trailbound.archive.segments import discover

    print(f"tiling {copies} copies of {base} into {archive} ...", flush=True)
    archive.mkdir(parents=True)
    shutil.copy(base / contract.DEFS_FILE, archive / contract.DEFS_FILE)
    segments = discover(base)
    for thread in sorted({s.thread for s in segments}):
        own = [s for s in segments if s.thread == thread]
        scn_span, time_span, count = own[-1].next_scn.value - own[0].first_scn.value, own[-1].next_time - own[0].first_time, len(own)
        for k in range(copies):
            for s in own:
                table = pq.read_table(s.path)
                if k:
                    suffix = pa.scalar(f"~{k}")
                    table = table.set_column(table.schema.get_field_index("scn"), "scn",
                                             pc.add(table["scn"], k * scn_span))
                    table = table.set_column(table.schema.get_field_index("ts"), "ts",
                                             pc.add(table["ts"], pa.scalar(k * time_span, pa.duration("us"))))
                    for name in ("xid", "parent_xid"):  # a 128-character xid keeps its first 125
                        table = table.set_column(table.schema.get_field_index(name), name, pc.binary_join_element_wise(
                            pc.utf8_slice_codeunits(table[name], 0, 125), suffix, ""))
                sequence = s.sequence + k * count
                path = archive / contract.data_name(thread, sequence, "parquet")
                pq.write_table(table, path, compression="zstd")
                data = path.read_bytes()
                manifest = {"thread": thread, "sequence": sequence, "first_scn": s.first_scn.value + k * scn_span,
                            "next_scn": s.next_scn.value + k * scn_span,
                            "first_time": f"{s.first_time + k * time_span:%Y-%m-%dT%H:%M:%S.%fZ}",
                            "next_time": f"{s.next_time + k * time_span:%Y-%m-%dT%H:%M:%S.%fZ}",
                            "records": table.num_rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                            "format": "parquet"}
                if s.closed and k == copies - 1:
                    manifest["closed"] = True
                (archive / contract.manifest_name(thread, sequence)).write_text(json.dumps(manifest))


def trail_digest(prefix: Path) -> dict:
    """What two captures of one archive must agree on: every record in order (file
    boundaries aside) and the files themselves."""
    import pyarrow as pa

    from trailbound.trail import format as trails

    files = list(trails.existing_files(prefix))
    records = hashlib.sha256()
    count = 0
    for path in files:
        table = trails.read_file(path).drop_columns(["rba"])
        count += len(table)
        records.update(trails._content_digest(table.add_column(0, "rba", pa.array([0] * len(table), pa.int64())))
                       .encode())
    whole = hashlib.sha256("".join(trails.file_sha256(p) for p in files).encode()).hexdigest()
    return {"files": len(files), "records": count, "records_sha256": records.hexdigest(), "files_sha256": whole}


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one_run(records: int, master: str, driver_memory: str | None, compare_scan: bool = False) -> dict:
    """One process's measurement (see the module docstring)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from benchdb import fresh_database

    from trailbound import config as configuration
    from trailbound import spark as spark_session
    from trailbound.archive.catalog import ArchiveCatalog
    from trailbound.archive.segments import discover
    from trailbound.capture.run import run_extract
    from trailbound.metadata import MetadataStore, dsn_from_env

    work = _archive(records)
    archive = work / "archive"
    for leftover in ("dirdat", "plain", "brfiles"):
        shutil.rmtree(work / leftover, ignore_errors=True)
    config_path = work / "trailbound.yaml"
    config_path.write_text(f"home: {work}\nsources:\n  BENCH:\n    altarchivelogdest: archive\n"
                           "extracts:\n  EXT1:\n    source: BENCH\n    exttrail: dirdat/lt\n"
                           "    table: [\"shop.*\", \"hr.*\"]\n    megabytes: 256\n")
    config = configuration.load(config_path)
    store = MetadataStore.open(fresh_database(dsn_from_env("TRAILBOUND_METADATA_DSN"), "trailbound_bench"))

    # The driver JVM's memory is fixed when it starts: through spark-submit's arguments.
    submit = [f"--driver-memory {driver_memory}"] if driver_memory else []
    if master.startswith("spark://"):  # the workers' Python must find trailbound
        submit.append(f"--conf spark.executorEnv.PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    os.environ["PYSPARK_SUBMIT_ARGS"] = " ".join(submit + ["pyspark-shell"])
    spark = spark_session.session("trailbound-bench", master=master)
    segments = discover(archive)
    paths = [str(s.path) for s in segments]
    total = sum(s.records for s in segments)
    spark.read.parquet(*paths).count()  # warm the JVM and the page cache for both contenders

    started = time.perf_counter()
    spark.read.parquet(*paths).orderBy("scn", "rba").write.mode("overwrite").parquet(str(work / "plain"))
    plain = time.perf_counter() - started

    scan_before = None
    if compare_scan:  # the scan's checks as they were before issue 17, on the same files
        from trailbound.archive import reader
        from trailbound.archive.segments import verify_data

        started = time.perf_counter()
        for segment in segments:
            verify_data(segment)
        reader.check_records(spark, segments)
        scan_before = time.perf_counter() - started

    started = time.perf_counter()
    ArchiveCatalog(store, "BENCH").scan(archive, spark)
    scan = time.perf_counter() - started

    started = time.perf_counter()
    result = run_extract(spark, store, config, "EXT1")
    capture = time.perf_counter() - started
    jvm_peak = _peak_rss_mb(spark._jvm.java.lang.ProcessHandle.current().pid())
    store.close()
    spark.stop()
    return {"records": total, "segments": len(segments), "master": master, "driver_memory": driver_memory or "default",
            "plain_s": plain, "scan_s": scan, "scan_before_s": scan_before, "capture_s": capture,
            "transactions_written": result.transactions_written, "records_written": result.records_written,
            "trail_files": len(result.files), "phases": result.timings,
            "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "jvm_peak_rss_mb": jvm_peak, "digest": trail_digest(work / "dirdat" / "lt"),
            "at": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "load_average": os.getloadavg()[0]}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Standalone:
    """A Spark standalone master and one worker on 127.0.0.1, from the pyspark install."""

    def __init__(self, cores: int, memory: str):
        import pyspark

        self.spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        self.port = _free_port()
        self.work = REPO / "var" / "bench" / "standalone-worker"
        self.cores, self.memory = cores, memory
        self.processes: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def __enter__(self) -> "Standalone":
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        logs = self.work / "logs"
        logs.mkdir()
        self.processes.append(subprocess.Popen(
            [str(self.spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(_free_port())],
            env=env, stdout=open(logs / "master.log", "w"), stderr=subprocess.STDOUT))
        self._wait_for(self.port)
        self.processes.append(subprocess.Popen(
            [str(self.spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.work / "work"),
             "--webui-port", str(_free_port()), self.url],
            env=env, stdout=open(logs / "worker.log", "w"), stderr=subprocess.STDOUT))
        deadline = time.time() + 120
        while "Successfully registered with master" not in (logs / "worker.log").read_text():
            if time.time() > deadline:
                raise RuntimeError(f"the standalone worker did not register; see {logs}")
            time.sleep(1)
        return self

    @staticmethod
    def _wait_for(port: int) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(1)
        raise RuntimeError(f"the standalone master did not listen on {port}")

    def __exit__(self, *exc) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def _child(records: int, master: str, driver_memory: str | None, compare_scan: bool = False) -> dict:
    command = [sys.executable, __file__, "--one", str(records), master]
    if driver_memory:
        command += ["--driver-memory", driver_memory]
    if compare_scan:
        command.append("--compare-scan")
    print("$", " ".join(command[1:]), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(SENTINEL)]
    if done.returncode or not lines:
        raise RuntimeError(f"{master} run of {records:,} records failed:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len(SENTINEL):])
    with open(LOG, "a") as log:  # every run's figures, for --report-only
        log.write(json.dumps(result, default=str) + "\n")
    print(f"  plain {result['plain_s']:.1f} s, scan {result['scan_s']:.1f} s, capture {result['capture_s']:.1f} s",
          flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000],
                        help="archive sizes; the largest also runs on every master")
    parser.add_argument("--masters", nargs="+", default=["local[2]", "local[1]", "standalone"])
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--compare-scan", action="store_true",
                        help="also time the scan's checks as they were before issue 17 (at the largest size)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report from every run logged in var/bench/capture-results.jsonl")
    parser.add_argument("--one", nargs=2, metavar=("RECORDS", "MASTER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = one_run(int(args.one[0]), args.one[1], args.driver_memory, args.compare_scan)
        print(SENTINEL + json.dumps(result, default=str), flush=True)
        return 0

    if args.report_only:
        results = [json.loads(line) for line in LOG.read_text().splitlines()]
        for r in results:
            if r["master"].startswith("spark://"):
                r["master"] = "standalone (master + 1 worker, 2 cores, 127.0.0.1)"
        report(results, args)
        return 0
    results = []
    largest = max(args.records)
    first = args.masters[0]
    for records in sorted(args.records):
        results.append(_child(records, first, args.driver_memory, args.compare_scan and records == largest))
    for master in args.masters[1:]:
        if master == "standalone":
            with Standalone(cores=2, memory="6g") as cluster:
                result = _child(largest, cluster.url, args.driver_memory)
            result["master"] = "standalone (master + 1 worker, 2 cores, 127.0.0.1)"
            results.append(result)
        else:
            results.append(_child(largest, master, args.driver_memory))
    (REPO / "var" / "bench" / "capture-results.json").write_text(json.dumps(results, indent=1, default=str))
    report(results, args)
    return 0


def report(results: list[dict], args) -> None:
    by_size = [r for r in results if r["master"] == args.masters[0]]
    largest = max(by_size, key=lambda r: r["records"])
    rows = []
    for r in results:
        plain_rate, capture_rate = r["records"] / r["plain_s"], r["records"] / r["capture_s"]
        rows.append(f"| {r['records']:,} | {r['master']} | {r['plain_s']:.1f} s ({plain_rate:,.0f}/s) | "
                    f"{r['capture_s']:.1f} s ({capture_rate:,.0f}/s) | **{capture_rate / plain_rate:.2f}x** | "
                    f"{r['scan_s']:.1f} s ({r['records'] / r['scan_s']:,.0f}/s) | {r['trail_files']} | "
                    f"{r['driver_peak_rss_mb']:,.0f} / {r['jvm_peak_rss_mb']:,.0f} MB | "
                    f"`{r['digest']['records_sha256'][:12]}` `{r['digest']['files_sha256'][:12]}` |")
    scaling, same_trail = [], []
    for size in sorted({r["records"] for r in results}):
        runs = {r["master"]: r for r in results if r["records"] == size}
        one, two = runs.get("local[1]"), runs.get("local[2]")
        if one and two:
            scaling.append(f"{size:,} records: local[2] over local[1], capture {one['capture_s'] / two['capture_s']:.2f}x, "
                           f"plain {one['plain_s'] / two['plain_s']:.2f}x, scan {one['scan_s'] / two['scan_s']:.2f}x")
        if len(runs) > 1:
            digests = {(r["digest"]["records_sha256"], r["digest"]["files_sha256"]) for r in runs.values()}
            same_trail.append(f"{size:,} records, {', '.join(runs)}: "
                              + ("one digest, the same trail files byte for byte" if len(digests) == 1
                                 else "**the digests differ**"))
    speedup = "; ".join(scaling) or "local[1] not run"
    scan_line = ""
    if largest.get("scan_before_s"):
        scan_line = (f"- Archive scan, {largest['records']:,} records, same session: before issue 17's change "
                     f"{largest['scan_before_s']:.1f} s ({largest['records'] / largest['scan_before_s']:,.0f}/s), now "
                     f"{largest['scan_s']:.1f} s ({largest['records'] / largest['scan_s']:,.0f}/s): "
                     f"**{largest['scan_before_s'] / largest['scan_s']:.1f}x** (goal 4x).\n")
    phases = "\n".join(f"| {phase} | {seconds:.1f} s |" for phase, seconds in largest["phases"].items())
    command = (".venv/bin/python tests/bench/bench_capture.py --records "
               + " ".join(map(str, args.records)) + " --masters " + " ".join(args.masters)
               + f" --driver-memory {args.driver_memory}")
    # A run loads the CPUs itself (the load average at its end is about their number, more
    # with a standalone cluster's processes); twice their number means other jobs ran too.
    loads = [r["load_average"] for r in results if "load_average" in r]
    shared = bool(loads) and max(loads) > 2 * (os.cpu_count() or 1)
    if not loads:
        conditions = "The load average was not recorded."
    elif shared:
        conditions = (f"**The machine was shared** with other jobs (load average up to {max(loads):.1f} on "
                      f"{os.cpu_count()} CPUs): absolute times are inflated and noisy; the ratios compare "
                      "contenders measured back to back in one process.")
    else:
        conditions = f"Nothing else ran on the machine (load average at most {max(loads):.1f})."
    _plot(by_size, shared)
    text = RESULTS.read_text() if RESULTS.exists() else ""
    before = text[text.index("## Before"):] if "## Before" in text else ""
    RESULTS.write_text(f"""# Capture benchmark

Capture runs (`run_extract`, normal recovery, no open transactions before it) over
simulated archives (3 threads, 48 h of log time, Parquet segments), each beside a plain
Spark read + sort + write of the same records in the same Spark session, after one
warm-up read of the files for both; one process per row, spark.driver.memory
{args.driver_memory}, default executor settings, 256 MB trail files.

Command, from the repository root (`make bench` runs it with the throwaway PostgreSQL):

    {command}

Measured {largest['at']}, {os.cpu_count()} CPUs, {platform.platform()}, Python
{platform.python_version()}. {conditions}

| records | master | plain read+sort+write | capture run | capture / plain | archive scan | trail files | peak RSS driver / JVM | trail digest (records, files) |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{scan_line}- Scaling: {speedup}.
- Same trail on every master: {"; ".join(same_trail) or "one master only"}.
- Written ({largest['records']:,} records): {largest['transactions_written']:,} transactions,
  {largest['records_written']:,} records in {largest['trail_files']} trail file(s).
- Goal (issue 17): capture at least 0.5x plain at 10M records:
  {largest['records'] / largest['capture_s'] / (largest['records'] / largest['plain_s']):.2f}x.

![capture throughput against archive size](capture.png)

Where the capture run's time goes ({largest['records']:,} records, {largest['master']}):

| phase | time |
|---|---|
{phases}

{before}""")
    print(RESULTS.read_text())


def _plot(results: list[dict], shared: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = sorted(results, key=lambda r: r["records"])
    sizes = [r["records"] / 1e6 for r in results]
    figure, axis = plt.subplots(figsize=(7, 4.2))
    axis.plot(sizes, [r["records"] / r["plain_s"] / 1e3 for r in results], "o--", label="plain Spark read+sort+write")
    axis.plot(sizes, [r["records"] / r["capture_s"] / 1e3 for r in results], "o-", label="capture run")
    axis.plot(sizes, [r["records"] / r["scan_s"] / 1e3 for r in results], "o:", label="archive scan")
    axis.set_xlabel("archive size (million records)")
    axis.set_ylabel("thousand records / s")
    axis.set_ylim(bottom=0)
    machine = f"{os.cpu_count()}-CPU machine" + (", shared with other jobs" if shared else "")
    axis.set_title(f"Capture throughput, {results[-1]['master']} ({machine})")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(PLOT, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
