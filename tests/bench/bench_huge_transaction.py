"""A huge transaction: peak memory of every process, and wall time per stage, for one
source transaction of N row changes, before and after (issue 42, item 4).

    PYTHONPATH=include .venv/bin/python tests/bench/bench_huge_transaction.py \
        --rows 1500000 3000000 --engines before=var/bench/engine-a347c2b/include after=include

Needs TRAILBOUND_METADATA_DSN and TRAILBOUND_TARGET_DSN (`export $(.venv/bin/python -m
trailbound.devtools.localpg env var/pg)`); uses databases `trailbound_bench_huge_meta_N_WORK` and
`..._target_N_WORK` (N the rows, WORK the `--work` directory's name, so that runs side by side
do not share them), dropped and created afresh. An engine is an `include` directory: make the
one before with `git archive a347c2b include | tar -x -C var/bench/engine-a347c2b`.

Replicat: the target is preloaded (untimed) with N rows of shop.orders; the trail holds
ONE transaction of N UPDATEs of them (the shape of the independent run of 2026-11-26: a
1.5M-row UPDATE), written directly with trail.TrailWriter and committed in
trailbound.trail_file as capture would. `trailbound replicat run` runs as a child process
with the engine under test on PYTHONPATH and its default settings; the peak RSS of it and
of every process under it (a JVM, Python workers: none for a local trail) is sampled from
/proc every 0.2 s (psutil; VmHWM for the replicat process itself, exact). Both engines
must leave the same target (one MD5 over the table).

Capture (`--capture`): an archive segment holding ONE transaction of N INSERTs, captured
by `trailbound extract run` (a child process: the driver, its JVM and the Python workers
Spark starts, each sampled), wall time and peak RSS per process. With
PYSPARK_SUBMIT_ARGS=--driver-memory 1g (Spark's default, said explicitly).

Pump (`--stages pump`): the replicat stage's trail shipped by `trailbound pump run`,
PASSTHRU and through a TABLE filter that keeps every record; peak RSS of each.

Trail write (`--stages trailwrite`): what a capture task runs, alone in a process of its
own: trail.format.write_planned_files over 10,000-record batches of ONE transaction of N
INSERTs, with capture's copy lines and table versions; its peak RSS and CPU.

Bounded Recovery (`--stages br`): ONE transaction of N INSERTs over 10 hours of log time,
captured by one group in two runs (the first to hour 5 persists it at the default 4-hour
BR boundary; the second restores it and writes it) and by another in one run; each run's
peaks and phases (capture.run.Stopwatch); the two trails must be equal, records and digest.

Live (`--stages live`): a throwaway PostgreSQL (wal_level=logical, under the --work
directory); N rows of public.huge_orders loaded on it and on the target before the slot
exists, then ONE transaction of N UPDATEs; `archive pull` (pgoutput, streaming on),
`extract run`, `pump run`, `replicat run` with the default settings, each measured; the
target must equal the source.

CPU is the user + system time of every process of the tree, as last sampled.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg2 import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdb import fresh_database  # noqa: E402
from results import write_report  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "huge-transaction.md"
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
BATCH = 100_000


# ---------------------------------------------------------------- peak memory of a process tree

class PeakSampler:
    """Samples the RSS of a process and all its descendants until it ends: the peak of
    each, keyed by what it is (the root's own VmHWM, read at its last sample, is exact;
    the others are sampled peaks)."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.pid, self.interval = pid, interval
        self.peaks: dict[str, int] = {}
        self.tree_peak = 0
        self.started = time.perf_counter()
        # Per Python worker: its peak, when it was reached, first and last seen (seconds
        # from the start), to tell which phase of a run made a worker's peak.
        self.workers: dict[int, list[float]] = {}
        self._cpu: dict[int, float] = {}  # per process, its user + system CPU seconds when last seen
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def kind(process: psutil.Process, root: int) -> str:
        """What a process is, by its executable's name (a command line may name python
        paths in a JVM's classpath, or a JVM in a shell script's arguments)."""
        if process.pid == root:
            return "driver (python)"
        try:
            name, text = process.name(), " ".join(process.cmdline())
        except psutil.Error:
            return f"pid {process.pid}"
        if name == "java":
            return "JVM"
        if name.startswith("python"):
            return ("Python worker (pyspark daemon and forks, each)" if "pyspark" in text
                    else "other Python")
        return name

    def _run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while True:
            try:
                processes = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for process in processes:
                try:
                    rss = process.memory_info().rss
                    if process.pid == self.pid:
                        hwm = _vmhwm(process.pid)
                        rss = max(rss, hwm or 0)
                except psutil.Error:
                    continue
                try:
                    times = process.cpu_times()
                    self._cpu[process.pid] = times.user + times.system
                except psutil.Error:
                    pass
                # Asked each time: spark-submit's shell script execs the JVM under its own pid.
                kind = self.kind(process, self.pid)
                self.peaks[kind] = max(self.peaks.get(kind, 0), rss)
                if kind.startswith("Python worker"):
                    now = time.perf_counter() - self.started
                    seen = self.workers.setdefault(process.pid, [0, 0.0, now, now])
                    if rss > seen[0]:
                        seen[0], seen[1] = rss, now
                    seen[3] = now
                total += process.memory_info().rss if process.is_running() else 0
            self.tree_peak = max(self.tree_peak, total)
            if not root.is_running() or root.status() == psutil.STATUS_ZOMBIE:
                return
            time.sleep(self.interval)

    def join(self) -> None:
        self._thread.join(timeout=10)

    @property
    def cpu_seconds(self) -> float:
        """User + system CPU of every process of the tree, as last sampled (a process's
        last 0.2 s before it ended are missed)."""
        return sum(self._cpu.values())


def _vmhwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run_measured(command: list[str], env: dict) -> tuple[float, float, dict[str, int], int, str, str]:
    """Run `command`; its wall time, CPU time, peak RSS per kind of process, the tree's
    peak, output."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = PeakSampler(process.pid)
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    sampler.join()
    cpu = sampler.cpu_seconds
    largest = sorted(sampler.workers.items(), key=lambda item: -item[1][0])[:4]
    if largest:
        print("    largest Python workers (pid: peak at t, seen from t to t): " + "; ".join(
            f"{pid}: {mb(peak)} at {at:.0f} s, {first:.0f}-{last:.0f} s" for pid, (peak, at, first, last) in largest),
            flush=True)
    if process.returncode != 0:
        peaks = {k: mb(v) for k, v in sampler.peaks.items()}
        raise SystemExit(f"{' '.join(command[-4:])} failed ({process.returncode}) after {seconds:.1f} s, "
                         f"CPU {cpu:.1f} s, peaks {peaks}, tree {mb(sampler.tree_peak)}:\n{err[-3000:]}")
    return seconds, cpu, sampler.peaks, sampler.tree_peak, out, err


def mb(value: int) -> str:
    return f"{value / 2**20:,.0f} MB"


# ---------------------------------------------------------------- replicat: one UPDATE transaction of N rows

def write_update_trail(rows: int, prefix: Path) -> list:
    """ONE transaction of `rows` UPDATEs of shop.orders ids 1..rows, as a trail file
    (written as capture's tasks write theirs, a row group at a time)."""
    from trailbound.positions import Scn
    from trailbound.trail import format as trail

    names = [name for name in trail.COLUMNS if name not in ("rba", "trans_ind", "copy_line", "table_version")]
    schema = pa.schema([trail.SCHEMA.field(name) for name in names] + [("file_no", pa.int64())])
    statuses = ("paid", "packed", "shipped")

    def batches():
        for start in range(1, rows + 1, BATCH):
            ids = range(start, min(rows, start + BATCH - 1) + 1)
            n = len(ids)
            columns = {
                "csn": [10] * n, "csn_thread": [1] * n, "csn_sequence": [1] * n,
                "csn_rba": [1] * n, "xid": ["X1"] * n, "commit_ts": [T0] * n, "op": ["UPDATE"] * n,
                "table": ["shop.orders"] * n, "before": [f'{{"id":{i}}}' for i in ids],
                "after": [f'{{"id":{i},"status":"{statuses[i % 3]}"}}' for i in ids],
                "src_thread": [1] * n, "src_sequence": [1] * n, "src_rba": list(ids), "src_scn": [9] * n,
                "log_bsn": [1] * n, "file_no": [0] * n}
            yield pa.RecordBatch.from_pydict(columns, schema=schema)
    return list(trail.write_planned_files(prefix, 1, batches(), group="BENCH", log_bsn=Scn(1)))


def commit_trail(meta_dsn: str, prefix: Path, files: list) -> None:
    """The trail's files listed as committed in the metadata store, as capture commits them."""
    from trailbound.metadata import MetadataStore

    with MetadataStore.open(meta_dsn) as store, store.transaction() as cur:
        for f in files:
            cur.execute("INSERT INTO trailbound.trail_file (trail, seqno, path, records, bytes, sha256, first_csn,"
                        " last_csn, log_bsn, written_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'BENCH')",
                        (str(prefix), f.seqno, str(f.path), f.records, f.bytes, f.sha256, str(f.first_csn),
                         str(f.last_csn), f.log_bsn.value))


def preload_orders(target_dsn: str, defs, rows: int) -> None:
    """shop.orders ids 1..rows, untimed, through COPY in batches."""
    columns = [c.name for c in defs["shop.orders"].columns]
    values = {"customer_id": "7", "status": "new", "total": "12.50", "ordered_at": "2026-11-01 00:00:00+00",
              "ship_date": "\\N", "items": "{1,2}", "meta": "\\N"}
    connection = psycopg2.connect(target_dsn)
    with connection.cursor() as cur:
        statement = sql.SQL("COPY shop.orders FROM STDIN").as_string(cur)
        for start in range(1, rows + 1, BATCH):
            text = "".join("\t".join(str(i) if c == "id" else values[c] for c in columns) + "\n"
                           for i in range(start, min(rows, start + BATCH - 1) + 1))
            cur.copy_expert(statement, io.BytesIO(text.encode()))
        cur.execute("ANALYZE shop.orders")
    connection.commit()
    connection.close()


def orders_digest(target_dsn: str) -> tuple[int, str]:
    connection = psycopg2.connect(target_dsn)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*), md5(string_agg(t::text, E'\\n' ORDER BY id)) FROM shop.orders t")
        count, digest = cur.fetchone()
    connection.close()
    return count, digest


def bench_replicat(rows: int, engines: dict[str, Path], work: Path, defs, servers) -> list[dict]:
    from trailbound.replicat import target as tgt
    from trailbound.config import MapRule

    home = work / f"replicat-{rows}"
    shutil.rmtree(home, ignore_errors=True)
    prefix = home / "dirdat" / "lt"
    began = time.perf_counter()
    files = write_update_trail(rows, prefix)
    print(f"replicat {rows:,}: trail of one transaction written in {time.perf_counter() - began:.1f} s "
          f"({len(files)} file(s), {sum(f.bytes for f in files) / 2**20:.0f} MB)", flush=True)
    (home / "trailbound.yaml").write_text(
        f"home: {home}\nsources:\n  BENCH:\n    altarchivelogdest: {work / 'archive'}\nreplicats:\n  REP1:\n"
        f"    exttrail: dirdat/lt\n    source: BENCH\n    map:\n      - {{source: shop.orders, target: shop.orders}}\n")
    results = []
    for name, include in engines.items():
        meta_dsn = fresh_database(servers[0], f"trailbound_bench_huge_meta_{rows}_{work.name}".replace("-", "_"))
        target_dsn = fresh_database(servers[1], f"trailbound_bench_huge_target_{rows}_{work.name}".replace("-", "_"))
        with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
            tgt.create_tables(cur, {"shop.orders": defs["shop.orders"]},
                              [MapRule(source="shop.orders", target="shop.orders")])
        connection.close()
        preload_orders(target_dsn, defs, rows)
        commit_trail(meta_dsn, prefix, files)
        env = {**os.environ, "PYTHONPATH": str(include), "TRAILBOUND_METADATA_DSN": meta_dsn,
               "TRAILBOUND_TARGET_DSN": target_dsn}
        seconds, cpu, peaks, tree, out, _ = run_measured(
            [sys.executable, "-m", "trailbound.cli", "--config", str(home / "trailbound.yaml"), "replicat", "run",
             "REP1"], env)
        count, digest = orders_digest(target_dsn)
        line = out.strip().splitlines()[-1] if out.strip() else ""
        print(f"  {name}: {seconds:.1f} s wall, {cpu:.1f} s CPU, peaks {({k: mb(v) for k, v in peaks.items()})}, tree {mb(tree)}\n"
              f"    {line}\n    target: {count:,} rows, md5 {digest}", flush=True)
        results.append({"stage": "replicat", "rows": rows, "engine": name, "seconds": seconds, "cpu": cpu,
                        "peaks": peaks,
                        "tree": tree, "said": line, "digest": digest, "count": count})
    digests = {r["digest"] for r in results}
    assert len(digests) == 1, f"the engines left different targets: {digests}"
    shutil.rmtree(home / "dirdat", ignore_errors=True)
    return results


# ---------------------------------------------------------------- pump: the same trail shipped, whole and filtered

def bench_pump(rows: int, engines: dict[str, Path], work: Path, servers) -> list[dict]:
    """The replicat stage's trail (ONE transaction of N UPDATEs) shipped by `trailbound
    pump run`: PASSTHRU (a copy, read back and counted) and with a TABLE filter that
    keeps every record (the filtered path's worst case: the whole file read, rewritten
    and counted)."""
    home = work / f"pump-{rows}"
    shutil.rmtree(home, ignore_errors=True)
    prefix = home / "dirdat" / "lt"
    files = write_update_trail(rows, prefix)
    print(f"pump {rows:,}: trail of one transaction written ({len(files)} file(s), "
          f"{sum(f.bytes for f in files) / 2**20:.0f} MB)", flush=True)
    (home / "trailbound.yaml").write_text(
        f"home: {home}\nsources:\n  BENCH:\n    altarchivelogdest: {work / 'archive'}\npumps:\n"
        f"  PASSTHRU: {{exttrail: dirdat/lt, rmttrail: dirdat/rp}}\n"
        f"  FILTERED: {{exttrail: dirdat/lt, rmttrail: dirdat/rf, table: [shop.orders]}}\n")
    results = []
    for name, include in engines.items():
        meta_dsn = fresh_database(servers[0], f"trailbound_bench_huge_meta_{rows}_{work.name}".replace("-", "_"))
        commit_trail(meta_dsn, prefix, files)
        env = {**os.environ, "PYTHONPATH": str(include), "TRAILBOUND_METADATA_DSN": meta_dsn}
        for group in ("PASSTHRU", "FILTERED"):
            seconds, cpu, peaks, tree, out, _ = run_measured(
                [sys.executable, "-m", "trailbound.cli", "--config", str(home / "trailbound.yaml"), "pump", "run",
                 group], env)
            line = out.strip().splitlines()[-1] if out.strip() else ""
            print(f"  {name} {group}: {seconds:.1f} s wall, {cpu:.1f} s CPU, "
                  f"peaks {({k: mb(v) for k, v in peaks.items()})}\n    {line}", flush=True)
            results.append({"stage": f"pump {group}", "rows": rows, "engine": name, "seconds": seconds, "cpu": cpu,
                            "peaks": peaks, "tree": tree, "said": line})
        for directory in ("rp", "rf"):
            for shipped in (home / "dirdat").glob(f"{directory}*"):
                shipped.unlink()
    shutil.rmtree(home / "dirdat", ignore_errors=True)
    return results


# ---------------------------------------------------------------- capture: one INSERT transaction of N rows

def write_insert_archive(rows: int, archive: Path, per_segment: int = 500_000,
                         tick: timedelta = timedelta(microseconds=1), start_scn: int = 1) -> None:
    """Archive segments of thread 1 holding ONE transaction of `rows` INSERTs into
    shop.orders (spanning the segments, `per_segment` records each) and its COMMIT, a
    record every `tick` of log time, the first at `start_scn`."""
    from trailbound.archive.writer import to_micros, write_segment_columns
    from trailbound.positions import Scn

    scn = start_scn
    for sequence, start in enumerate(range(1, rows + 2, per_segment), start=1):
        ids = list(range(start, min(rows + 1, start + per_segment - 1) + 1))  # rows + 1: the COMMIT
        first_scn = scn
        columns = {"scn": [], "ts": [], "xid": [], "parent_xid": [], "op": [], "table": [], "before": [], "after": []}
        for i in ids:
            commit = i == rows + 1
            columns["scn"].append(scn)
            columns["ts"].append(to_micros(T0 + scn * tick))
            columns["xid"].append("X1")
            columns["parent_xid"].append(None)
            columns["op"].append("COMMIT" if commit else "INSERT")
            columns["table"].append(None if commit else "shop.orders")
            columns["before"].append(None)
            columns["after"].append(None if commit else
                                    f'{{"id":{i},"customer_id":7,"status":"new","total":"12.50"}}')
            scn += 1
        write_segment_columns(archive, thread=1, sequence=sequence, columns=columns, first_scn=Scn(first_scn),
                              next_scn=Scn(scn), first_time=T0 + first_scn * tick,
                              next_time=T0 + scn * tick, fmt="parquet")


def bench_capture(rows: int, engines: dict[str, Path], work: Path, servers) -> list[dict]:
    home = work / f"capture-{rows}"
    shutil.rmtree(home, ignore_errors=True)
    from trailbound.archive.writer import write_defs
    from trailbound.sources.simulator import source_tables

    write_defs(home / "archive", [t.definition() for t in source_tables()])
    write_insert_archive(rows, home / "archive")
    (home / "trailbound.yaml").write_text(
        f"home: {home}\nsources:\n  BENCH:\n    altarchivelogdest: archive\nextracts:\n  EXT1:\n    source: BENCH\n"
        f"    exttrail: dirdat/lt\n    table: [\"shop.orders\"]\n")
    results = []
    for name, include in engines.items():
        shutil.rmtree(home / "dirdat", ignore_errors=True)
        meta_dsn = fresh_database(servers[0], f"trailbound_bench_huge_meta_{rows}_{work.name}".replace("-", "_"))
        # Spark's default driver heap, said explicitly: the setting the numbers assume.
        env = {**os.environ, "PYTHONPATH": str(include), "TRAILBOUND_METADATA_DSN": meta_dsn,
               "PYSPARK_SUBMIT_ARGS": "--driver-memory 1g pyspark-shell"}
        seconds, cpu, peaks, tree, out, _ = run_measured(
            [sys.executable, "-c", EXTRACT_WITH_PHASES, "--config", str(home / "trailbound.yaml"), "extract", "run",
             "EXT1"], env)
        line = next((line for line in out.splitlines() if line.startswith("Extract")), "")
        print("    " + next((line for line in out.splitlines() if line.startswith("phases")), ""), flush=True)
        print(f"  capture {name}: {seconds:.1f} s wall, {cpu:.1f} s CPU, peaks "
              f"{({k: mb(v) for k, v in peaks.items()})}, tree {mb(tree)}\n    {line}", flush=True)
        # Read with pyarrow alone: the footers of every trail format (the engine under test
        # may write another one than this process's trailbound reads).
        written = sum(json.loads(pq.read_schema(path).metadata[b"trailbound.trail"])["records"]
                      for path in sorted((home / "dirdat").glob("lt?????????")))
        print(f"    trail: {written:,} records", flush=True)
        results.append({"stage": "capture", "rows": rows, "engine": name, "seconds": seconds, "cpu": cpu,
                        "peaks": peaks,
                        "tree": tree, "said": line})
    return results


# ---------------------------------------------------------------- capture's trail write alone

# What a capture task runs, in a process of its own: write_planned_files over Spark-sized
# batches (spark.sql.execution.arrow.maxRecordsPerBatch, 10,000) of ONE transaction of N
# INSERTs, with the copy lines and table versions capture gives it.
TRAIL_WRITE = """
import sys
from pathlib import Path
import pyarrow as pa
from trailbound import copytext
from trailbound.archive.segments import load_defs, versions_of
from trailbound.positions import Scn
from trailbound.trail import format as trail

rows, archive, prefix = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
defs = load_defs(archive)
names = [n for n in trail.COLUMNS if n not in ("rba", "trans_ind", "copy_line", "table_version")]
schema = pa.schema([trail.SCHEMA.field(n) for n in names] + [("file_no", pa.int64())])
T0 = pa.scalar(0, pa.timestamp("us", tz="UTC"))

def batches(size=10_000):
    for start in range(1, rows + 1, size):
        ids = range(start, min(rows, start + size - 1) + 1)
        n = len(ids)
        yield pa.RecordBatch.from_pydict({
            "csn": [rows + 1] * n, "csn_thread": [1] * n, "csn_sequence": [1] * n, "csn_rba": [rows] * n,
            "xid": ["X1"] * n, "commit_ts": pa.array([0] * n, pa.timestamp("us", tz="UTC")), "op": ["INSERT"] * n,
            "table": ["shop.orders"] * n, "before": [None] * n,
            "after": [f'{{"id":{i},"customer_id":7,"status":"new","total":"12.50"}}' for i in ids],
            "src_thread": [1] * n, "src_sequence": [1 + i // 500_000 for i in ids], "src_rba": list(ids),
            "src_scn": list(ids), "log_bsn": [1] * n, "file_no": [0] * n}, schema=schema)

files = list(trail.write_planned_files(prefix, 1, batches(), group="BENCH", log_bsn=Scn(1),
                                      layouts=copytext.layouts_of(defs), versions=versions_of(defs)))
print(f"{sum(f.records for f in files)} records in {len(files)} file(s)")
"""


def bench_trailwrite(rows: int, engines: dict[str, Path], work: Path) -> list[dict]:
    results = []
    for name, include in engines.items():
        home = work / f"trailwrite-{rows}-{name}"
        shutil.rmtree(home, ignore_errors=True)
        env = {**os.environ, "PYTHONPATH": str(include)}
        seconds, cpu, peaks, tree, out, _ = run_measured(
            [sys.executable, "-c", TRAIL_WRITE, str(rows), str(work / "archive"), str(home / "lt")], env)
        line = out.strip().splitlines()[-1] if out.strip() else ""
        print(f"  trail write {name} {rows:,}: {seconds:.1f} s wall, {cpu:.1f} s CPU, peak {mb(tree)}: {line}",
              flush=True)
        results.append({"stage": "trail write", "rows": rows, "engine": name, "seconds": seconds, "cpu": cpu,
                        "peaks": peaks, "tree": tree, "said": line})
        shutil.rmtree(home, ignore_errors=True)
    return results


# ---------------------------------------------------------------- Bounded Recovery: the transaction open across runs

# `trailbound extract run ...`, printing the run's phases (capture.run.Stopwatch) after its line.
EXTRACT_WITH_PHASES = """
import json, sys
from trailbound import cli
from trailbound.capture import run as capture

run_extract = capture.run_extract
def with_phases(*args, **kwargs):
    result = run_extract(*args, **kwargs)
    print(result.describe())
    print("phases " + json.dumps({k: round(v, 1) for k, v in result.timings.items()}), flush=True)
    return result
capture.run_extract = with_phases
sys.exit(cli.main(sys.argv[1:]))
"""


def bench_bounded_recovery(rows: int, include: Path, work: Path, servers) -> list[dict]:
    """ONE transaction of N INSERTs spanning 10 hours of log time (20 segments), captured
    twice: by group BR in two runs, the first to hour 5 (the transaction open for 5 hours
    at the 4-hour BR boundary, the default brinterval: persisted, half its records), the
    second to the end (restored a row group at a time, the rest read, written); and by
    group ONCE in one run. Both trails must be the same (records and content digest). The
    transaction starts at scn 0, the one run's recovery SCN (its begin point), so that both
    files carry the same log_bsn (the two-run group's is the transaction's start)."""
    from trailbound.archive.writer import write_defs
    from trailbound.sources.simulator import source_tables
    from trailbound.trail import format as trail

    home = work / f"br-{rows}"
    shutil.rmtree(home, ignore_errors=True)
    write_defs(home / "archive", [t.definition() for t in source_tables()])
    hours = 10
    write_insert_archive(rows, home / "archive", per_segment=-(-(rows + 1) // 20),
                         tick=timedelta(hours=hours) / (rows + 1), start_scn=0)
    (home / "trailbound.yaml").write_text(
        f"home: {home}\nsources:\n  BENCH:\n    altarchivelogdest: archive\nextracts:\n"
        f"  BR:\n    source: BENCH\n    exttrail: dirdat/lb\n    table: [\"shop.orders\"]\n"
        f"  ONCE:\n    source: BENCH\n    exttrail: dirdat/lo\n    table: [\"shop.orders\"]\n")
    meta_dsn = fresh_database(servers[0], f"trailbound_bench_huge_br_meta_{rows}_{work.name}".replace("-", "_"))
    env = {**os.environ, "PYTHONPATH": str(include), "TRAILBOUND_METADATA_DSN": meta_dsn,
           "PYSPARK_SUBMIT_ARGS": "--driver-memory 1g pyspark-shell"}
    results = []
    for stage, words in (("BR run 1: read half, persist", ["extract", "run", "BR", "--until",
                                                             (T0 + timedelta(hours=5)).isoformat()]),
                         ("BR run 2: restore, read the rest, write", ["extract", "run", "BR"]),
                         ("one run: read all, write", ["extract", "run", "ONCE"])):
        seconds, cpu, peaks, tree, out, _ = run_measured(
            [sys.executable, "-c", EXTRACT_WITH_PHASES, "--config", str(home / "trailbound.yaml"), *words], env)
        said = [line for line in out.strip().splitlines() if line.startswith("Extract")][-1:]
        phases = [line for line in out.strip().splitlines() if line.startswith("phases")][-1:]
        print(f"  {stage}: {seconds:.1f} s wall, {cpu:.1f} s CPU, peaks {({k: mb(v) for k, v in peaks.items()})}, "
              f"tree {mb(tree)}\n    {said}\n    {phases}", flush=True)
        results.append({"stage": stage, "rows": rows, "engine": "after", "seconds": seconds, "cpu": cpu,
                        "peaks": peaks, "tree": tree, "said": " ".join(said + phases)})
    persisted = sorted((home / "var" / "br").rglob("*.parquet"))
    trails_written = {prefix: sorted((home / "dirdat").glob(f"{prefix}?????????")) for prefix in ("lb", "lo")}
    [across_runs], [in_one_run] = trails_written["lb"], trails_written["lo"]
    footers = [trail.read_metadata(path) for path in (across_runs, in_one_run)]
    same = trail.read_file(across_runs).equals(trail.read_file(in_one_run))
    print(f"  trails: {[f['records'] for f in footers]} records, digests "
          f"{[f['content_sha256'] for f in footers]}, log_bsn {[f['log_bsn'] for f in footers]}, "
          f"every record equal: {same}; BR files left: {len(persisted)}", flush=True)
    assert same and footers[0]["content_sha256"] == footers[1]["content_sha256"], "the two trails differ"
    return results


# ---------------------------------------------------------------- live: ONE UPDATE transaction of N rows on PostgreSQL

LIVE_TABLE = ("public", "huge_orders")


def bench_live(rows: int, include: Path, work: Path, servers) -> list[dict]:
    """A throwaway source server (wal_level=logical); N rows of public.huge_orders loaded
    there and on the target before the slot exists (untimed), then ONE transaction of N
    UPDATEs; `archive pull` (pgoutput, streaming on: the transaction is streamed in
    progress, past logical_decoding_work_mem), `extract run`, `pump run`, `replicat run`,
    each a measured child process with the default settings; the target must then equal
    the source."""
    from trailbound.devtools.livedemo import LOGICAL_OPTIONS, recreate_database, table_digests
    from trailbound.devtools.localpg import LocalServer

    home = work / f"live-{rows}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    server = LocalServer(work / "source-pg", options=LOGICAL_OPTIONS + " -c max_wal_size=8GB",
                         databases=("bench_huge_source",)).start()
    recreate_database(server.dsn(), "bench_huge_source")
    source = server.dsn("bench_huge_source")
    meta_dsn = fresh_database(servers[0], f"trailbound_bench_huge_live_meta_{rows}_{work.name}".replace("-", "_"))
    target_dsn = fresh_database(servers[1], f"trailbound_bench_huge_live_target_{rows}_{work.name}".replace("-", "_"))
    config = home / "trailbound.yaml"
    config.write_text(f"""home: {home}
sources:
  LIVE:
    altarchivelogdest: archive
    postgres: {{dsn_env: TRAILBOUND_BENCH_SOURCE_DSN, conn_id: bench_source, slot: trailbound_huge,
               publication: trailbound_huge, table: ["public.huge_orders"]}}
extracts:
  EXTH: {{source: LIVE, exttrail: dirdat/lt, table: ["public.huge_orders"]}}
pumps:
  PMPH: {{exttrail: dirdat/lt, rmttrail: remote/rt}}
replicats:
  REPH: {{exttrail: remote/rt, source: LIVE}}
""")
    env = {**os.environ, "PYTHONPATH": str(include), "TRAILBOUND_METADATA_DSN": meta_dsn,
           "TRAILBOUND_TARGET_DSN": target_dsn, "TRAILBOUND_BENCH_SOURCE_DSN": source,
           "TRAILBOUND_CONFIG": str(config), "PYSPARK_SUBMIT_ARGS": "--driver-memory 1g pyspark-shell"}
    tb = [sys.executable, "-m", "trailbound.cli", "--config", str(config)]

    def execute(dsn: str, *statements) -> None:
        connection = psycopg2.connect(dsn)
        connection.autocommit = True  # each statement its own transaction (VACUUM needs it)
        with connection.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        connection.close()

    began = time.perf_counter()
    execute(source, "CREATE TABLE public.huge_orders (id bigint PRIMARY KEY, customer_id int NOT NULL, "
                    "status text NOT NULL, total numeric(12,2) NOT NULL, note text)",
            sql.SQL("INSERT INTO public.huge_orders SELECT i, i % 1000, 'new', 12.50, 'order ' || i "
                    "FROM generate_series(1, {}) i").format(sql.Literal(rows)), "VACUUM ANALYZE public.huge_orders")
    for words in (["add", "source", "LIVE"], ["target", "create", "--source", "LIVE"]):
        subprocess.run([*tb, *words], env=env, check=True, capture_output=True, text=True)
    # The target starts as the source was when the slot was made (untimed).
    dump = home / "huge_orders.copy"
    with psycopg2.connect(source) as connection, connection.cursor() as cur, dump.open("wb") as out:
        cur.copy_expert("COPY public.huge_orders TO STDOUT", out)
    connection.close()
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur, dump.open("rb") as data:
        cur.copy_expert("COPY public.huge_orders FROM STDIN", data)
        cur.execute("ANALYZE public.huge_orders")
    connection.close()
    dump.unlink()
    started = time.perf_counter()
    execute(source, "UPDATE public.huge_orders SET status = 'shipped', total = total + 1")  # ONE transaction
    print(f"live {rows:,}: loaded in {started - began:.1f} s, one UPDATE transaction of {rows:,} rows in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    results = []
    for stage, words in (("pull", ["archive", "pull", "LIVE"]), ("capture", ["extract", "run", "EXTH"]),
                         ("pump", ["pump", "run", "PMPH"]), ("replicat", ["replicat", "run", "REPH"])):
        seconds, cpu, peaks, tree, out, _ = run_measured([*tb, *words], env)
        line = out.strip().splitlines()[-1] if out.strip() else ""
        print(f"  live {stage}: {seconds:.1f} s wall, {cpu:.1f} s CPU, peaks {({k: mb(v) for k, v in peaks.items()})}, "
              f"tree {mb(tree)}\n    {line}", flush=True)
        results.append({"stage": f"live {stage}", "rows": rows, "engine": "live", "seconds": seconds, "cpu": cpu,
                        "peaks": peaks, "tree": tree, "said": line})
    table = [LIVE_TABLE]
    expected, got = table_digests(source, table), table_digests(target_dsn, table)
    print(f"  source {expected}, target {got}", flush=True)
    assert got == expected, f"the target differs from the source: {got} against {expected}"
    server.stop()
    return results


# ---------------------------------------------------------------- the report

def report(results: list[dict], command: str) -> str:
    kinds = sorted({k for r in results for k in r["peaks"]})
    lines = [
        "# A huge transaction: peak memory per process and wall time",
        "",
        f"Generated by `tests/bench/bench_huge_transaction.py` on {platform.node()} "
        f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end), "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC:",
        "",
        f"    {command}",
        "",
        "| stage | row changes in the one transaction | engine | wall time | CPU | " + " | ".join(kinds)
        + " | whole tree (sampled) |",
        "| --- | ---: | --- | ---: | ---: | " + " | ".join("---:" for _ in kinds) + " | ---: |",
    ]
    for r in results:
        lines.append(f"| {r['stage']} | {r['rows']:,} | {r['engine']} | {r['seconds']:.1f} s | {r['cpu']:.1f} s | "
                     + " | ".join(mb(r["peaks"][k]) if k in r["peaks"] else "-" for k in kinds)
                     + f" | {mb(r['tree'])} |")
    lines += ["", "What each run printed:", ""]
    lines += [f"- {r['stage']} {r['rows']:,} {r['engine']}: `{r['said']}`" for r in results]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_500_000])
    parser.add_argument("--engines", nargs="+", default=[f"after={REPO / 'include'}"],
                        help="NAME=INCLUDE_DIR, each run in turn on the same trail")
    parser.add_argument("--stages", nargs="+", default=["replicat"], choices=["replicat", "pump", "capture", "trailwrite", "live", "br"])
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "huge",
                        help="the runs' directory (one per concurrent run of this script)")
    args = parser.parse_args()
    engines = {name: Path(path).resolve() for name, path in (e.split("=", 1) for e in args.engines)}

    from trailbound.archive.segments import load_defs
    from trailbound.archive.writer import write_defs
    from trailbound.metadata import dsn_from_env
    from trailbound.sources.simulator import source_tables

    work = args.work.resolve()
    write_defs(work / "archive", [t.definition() for t in source_tables()])
    defs = load_defs(work / "archive")
    servers = (dsn_from_env("TRAILBOUND_METADATA_DSN"), dsn_from_env("TRAILBOUND_TARGET_DSN"))
    results = []
    for rows in args.rows:
        if "replicat" in args.stages:
            results += bench_replicat(rows, engines, work, defs, servers)
        if "pump" in args.stages:
            results += bench_pump(rows, engines, work, servers)
        if "capture" in args.stages:
            results += bench_capture(rows, engines, work, servers)
        if "trailwrite" in args.stages:
            results += bench_trailwrite(rows, engines, work)
        if "br" in args.stages:
            results += bench_bounded_recovery(rows, next(iter(engines.values())), work, servers)
        if "live" in args.stages:
            results += bench_live(rows, next(iter(engines.values())), work, servers)
    command = "PYTHONPATH=include .venv/bin/python tests/bench/bench_huge_transaction.py " + " ".join(sys.argv[1:])
    text = report(results, command)
    print(text)
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    if not args.no_write:
        write_report(RESULTS, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
