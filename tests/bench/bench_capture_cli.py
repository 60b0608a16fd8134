"""Capture through the command line against a plain PySpark job over the same records
(issue 38: capture at least 0.8x a plain read + sort + write, the JVM's start counted on
both sides).

    .venv/bin/python tests/bench/bench_capture_cli.py [--records 2000000] [--repeat 2]

One simulated archive (var/bench/capture-N, shared with bench_capture.py). Each variant is
a whole process, timed from its start to its exit, so a JVM's start is inside the figure
when the process starts one:

- `cold`: each side starts its own local Spark (local[*], 1 GB driver): the plain job is a
  Python process that builds a SparkSession with trailbound's settings, reads the
  segments, sorts them by (scn, rba) and writes Parquet; the capture is
  `trailbound extract run EXT1` (which also catalogs the archive on its first run).
- `connect`: both sides are clients of one Spark Connect server started before them (its
  start reported apart, as a service's): the plain job and `trailbound extract run` with
  SPARK_REMOTE. Neither side starts a JVM; both pay the client's start.

Capture always starts from a fresh metadata database and an empty trail. CPU-seconds are
the process tree's (a cpuacct cgroup per run, as /work/tools/cgtime counts; the server's
own tree beside it for `connect`). The ratio is plain time / capture time (1.0 = capture as
fast as a job that does nothing but read, sort and write). Results are appended to
docs/benchmarks/capture-cli.md.

Needs TRAILBOUND_METADATA_DSN (make bench provides its throwaway server).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_capture import _archive  # noqa: E402  the same deterministic archives
from bench_live_postgres import CpuGroup  # noqa: E402  a cpuacct cgroup per process tree
from benchdb import fresh_database  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "capture-cli.md"
# Named by checkout: the same bench run from another worktree against the same server drops
# and recreates its own database, not this one (a 10M capture lost its metadata session so).
METADATA_DB = f"trailbound_bench_cli_{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}"

PLAIN_JOB = """
import sys
from pathlib import Path
from trailbound import spark as spark_session
archive, out = Path(sys.argv[1]), sys.argv[2]
spark = spark_session.session("plain-read-sort-write")
paths = sorted(str(p) for p in archive.glob("*.parquet"))
spark.read.parquet(*paths).orderBy("scn", "rba").write.mode("overwrite").parquet(out)
print("plain: wrote", out)
"""


class PeakRss:
    """While a process runs, every 0.5 s, the peak RSS of the processes in its cgroup and in
    the Connect server's: each process's VmHWM (the kernel's own high-water mark, so nothing
    between samples is missed while it lives), by kind (a JVM, or Python: the client itself,
    or the server's Python workers, whose live RSS is also summed). The server's JVM lives
    across runs: its figure is its high-water mark since its start."""

    def __init__(self, client: CpuGroup, server: CpuGroup | None):
        self.groups = {"client": client, **({"server": server} if server is not None else {})}
        self.peak_kb: dict[str, int] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "PeakRss":
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stopped.set()
        self.thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self.stopped.wait(0.5):
            self.sample()

    def sample(self) -> None:
        for where, group in self.groups.items():
            together = 0
            for pid in (group.path / "cgroup.procs").read_text().split():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue  # gone meanwhile
                kind = "JVM" if re.search(r"^Name:\s+java", status, re.M) else "Python"
                hwm, rss = (int(m.group(1)) if (m := re.search(rf"{field}:\s+(\d+)", status)) else 0
                            for field in ("VmHWM", "VmRSS"))
                key = f"{where} {kind}"
                self.peak_kb[key] = max(self.peak_kb.get(key, 0), hwm)
                together += rss if kind == "Python" else 0
            key = f"{where} Python together"
            self.peak_kb[key] = max(self.peak_kb.get(key, 0), together)

    def mb(self, key: str) -> float | None:
        return self.peak_kb[key] / 1024 if self.peak_kb.get(key) else None


def timed(name: str, command: list[str], env: dict[str, str], server: CpuGroup | None = None) -> dict:
    """Run `command` as a whole process: its wall time, its tree's CPU-s and peak RSS and,
    with `server`, the Connect server's CPU-s meanwhile and its peak RSS."""
    group = CpuGroup(name)
    server_before = server.seconds() if server is not None else None
    started = time.perf_counter()
    with PeakRss(group, server) as memory:
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, preexec_fn=group.enter)
    wall = time.perf_counter() - started
    cpu = group.seconds()
    server_cpu = server.seconds() - server_before if server is not None else None
    group.close()
    if done.returncode:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    last = [line for line in done.stdout.splitlines() if line.strip()]
    said = last[-1] if last else ""
    if len(said) > 160:  # its end too: a capture's summary line ends with how its records were assembled
        said = f"{said[:90]} ... {said[-70:]}"
    return {"wall_s": wall, "cpu_s": cpu, "server_cpu_s": server_cpu, "said": said,
            "rss_mb": {key: memory.mb(key) for key in RSS_COLUMNS}}


# The peak RSS columns of the report: the client process (Python), the JVM it starts (cold),
# the Connect server's JVM and its Python workers (one's peak; all live ones summed).
RSS_COLUMNS = ("client Python", "client JVM", "server JVM", "server Python", "server Python together")


def _environment(work: Path, remote: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["TRAILBOUND_CONFIG"] = str(work / "trailbound.yaml")
    env["PYSPARK_SUBMIT_ARGS"] = "--driver-memory 1g pyspark-shell"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "include"), env.get("PYTHONPATH", "")])
    env.pop("SPARK_REMOTE", None)
    if remote:
        env["SPARK_REMOTE"] = remote
    return env


def one_round(work: Path, variant: str, remote: str | None, server: CpuGroup | None = None) -> list[dict]:
    archive = work / "archive"
    env = _environment(work, remote)
    shutil.rmtree(work / "plain", ignore_errors=True)
    plain = timed(f"plain-{variant}", [sys.executable, "-c", PLAIN_JOB, str(archive), str(work / "plain")], env, server)
    for leftover in ("dirdat", "brfiles"):
        shutil.rmtree(work / leftover, ignore_errors=True)
    env["TRAILBOUND_METADATA_DSN"] = fresh_database(os.environ["TRAILBOUND_METADATA_DSN"], METADATA_DB)
    capture = timed(f"capture-{variant}", [sys.executable, "-m", "trailbound.cli", "extract", "run", "EXT1"], env,
                    server)
    return [dict(plain, variant=variant, side="plain read+sort+write"),
            dict(capture, variant=variant, side="trailbound extract run")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=["cold", "connect"], choices=["cold", "connect"])
    args = parser.parse_args()
    if "TRAILBOUND_METADATA_DSN" not in os.environ:
        raise SystemExit("TRAILBOUND_METADATA_DSN: not set (make bench provides it)")

    work = _archive(args.records)
    (work / "trailbound.yaml").write_text(
        f"home: {work}\nsources:\n  BENCH:\n    altarchivelogdest: archive\n"
        "extracts:\n  EXT1:\n    source: BENCH\n    exttrail: dirdat/lt\n"
        "    table: [\"shop.*\", \"hr.*\"]\n    megabytes: 256\n")
    server, server_group, remote, server_start = None, None, None, None
    if "connect" in args.variants:
        from trailbound.devtools.sparkconnect import ConnectServer

        server = ConnectServer(REPO / "var" / "bench" / "capture-cli-connect")
        shutil.rmtree(server.directory, ignore_errors=True)
        server_group = CpuGroup("server")  # the server's JVM and its Python workers stay in it
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "trailbound.devtools.sparkconnect", "start", str(server.directory)],
                       check=True, env=_environment(work, None), cwd=REPO, preexec_fn=server_group.enter)
        server_start = time.perf_counter() - started
        remote = server.url
    load_before = os.getloadavg()[0]
    rows = []
    try:
        for repeat in range(1, args.repeat + 1):
            for variant in args.variants:
                # The server's CPU-s are read around each process (the rounds' both rows got
                # them together before: the plain job's row had the capture's too).
                connect = variant == "connect"
                for row in one_round(work, variant, remote if connect else None, server_group if connect else None):
                    row["repeat"] = repeat
                    rows.append(row)
                    print(f"{repeat} {variant:8} {row['side']:24} {row['wall_s']:7.1f} s wall "
                          f"{row['cpu_s'] or 0:7.1f} CPU-s server {row.get('server_cpu_s') or 0:6.1f}  {row['said']}",
                          flush=True)
    finally:
        if server is not None:
            subprocess.run([sys.executable, "-m", "trailbound.devtools.sparkconnect", "stop", str(server.directory)],
                           env=_environment(work, None), cwd=REPO)
            server_group.close()
    report(rows, args, server_start, load_before, os.getloadavg()[0])
    return 0


def report(rows: list[dict], args, server_start: float | None, load_before: float, load_after: float) -> None:
    lines = [f"## {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {args.records:,} simulated records",
             "", f"Command: `.venv/bin/python tests/bench/bench_capture_cli.py --records {args.records} "
             f"--repeat {args.repeat} --variants {' '.join(args.variants)}`; 2 CPUs; load average "
             f"{load_before:.1f} before, {load_after:.1f} after.", ""]
    if server_start is not None:
        lines += [f"The Spark Connect server started once before the runs in {server_start:.1f} s.", ""]
    lines += ["| repeat | variant | process | wall s | CPU-s (process tree) | CPU-s (Connect server) | "
              "peak RSS MB: the process / its JVM | the Connect server's JVM (since its start) / a Python worker / "
              "its Python workers together |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        server = f"{row['server_cpu_s']:.1f}" if row.get("server_cpu_s") is not None else ""
        cpu = f"{row['cpu_s']:.1f}" if row["cpu_s"] is not None else "?"
        rss = {key: "-" if mb is None else f"{mb:,.0f}" for key, mb in row["rss_mb"].items()}
        server_rss = (f"{rss['server JVM']} / {rss['server Python']} / {rss['server Python together']}"
                      if row.get("server_cpu_s") is not None else "")
        lines.append(f"| {row['repeat']} | {row['variant']} | {row['side']} | {row['wall_s']:.1f} | {cpu} | {server} | "
                     f"{rss['client Python']} / {rss['client JVM']} | {server_rss} |")
    lines += ["", "| variant | best plain wall | best capture wall | **plain / capture** |", "|---|---:|---:|---:|"]
    for variant in args.variants:
        plain = min(r["wall_s"] for r in rows if r["variant"] == variant and r["side"].startswith("plain"))
        capture = min(r["wall_s"] for r in rows if r["variant"] == variant and r["side"].startswith("trailbound"))
        lines.append(f"| {variant} | {plain:.1f} s | {capture:.1f} s | **{plain / capture:.2f}x** |")
    text = "\n".join(lines) + "\n"
    print(text)
    # The newest run goes first, under the title and the page's introduction (everything
    # before its first section).
    page = RESULTS.read_text() if RESULTS.exists() else "# Capture through the CLI against a plain PySpark read + sort + write\n\n"
    cut = page.find("\n## ") + 1 or len(page)
    RESULTS.write_text(page[:cut] + text + "\n" + page[cut:])


if __name__ == "__main__":
    sys.exit(main())
