"""A run through spark-submit (its own JVM, as the DAGs submitted capture before) against
the same run as a client of a warm Spark Connect server (`trailbound ... ` with
SPARK_REMOTE): a capture with work, the same capture with nothing new (an idle scheduled
run's own work), and a replicat run. Same input each time: every pair starts from fresh
databases and an empty trail over one simulated archive, and the variants alternate.

    .venv/bin/python tests/bench/bench_spark_connect.py [--records 200000] [--repeat 2]

Needs TRAILBOUND_METADATA_DSN and TRAILBOUND_TARGET_DSN (make bench provides its throwaway
server); uses databases trailbound_bench_connect_meta and ..._target, dropped and created
afresh. Starts its own Spark Connect server (trailbound.devtools.sparkconnect, local[*])
under var/bench/connect and stops it at the end. Per run: wall seconds, the CPU seconds
of the command's process tree (spark-submit's JVM included), and the CPU seconds the
server's process tree used meanwhile. Results go to docs/benchmarks/spark-connect.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchdb import fresh_database

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "spark-connect.md"
VENV_BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds of `root` and its live descendants (and of the children they reaped)."""
    parents, cpu = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = sum(int(f) for f in fields[11:15]) / TICK
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += [child for child, parent in parents.items() if parent == pid]
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class World:
    def __init__(self, work: Path, records: int, hours: int):
        from trailbound.sources.simulator import simulate

        self.work = work
        simulate(work / "archive", work / "truth.json", records=records, hours=hours, seed=11)
        self.config_path = work / "trailbound.yaml"
        self.config_path.write_text(
            f"home: {work}\nsources:\n  SRC:\n    altarchivelogdest: archive\n"
            "extracts:\n  EXT1:\n    source: SRC\n    exttrail: dirdat/lt\n    table: ['shop.*']\n"
            "replicats:\n  REP1:\n    exttrail: dirdat/lt\n    source: SRC\n    map: [{source: 'shop.*', target: 'shop.*'}]\n")

    def reset(self, metadata_server: str, target_server: str) -> dict:
        for name in ("dirdat", "brfiles"):
            shutil.rmtree(self.work / name, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_MASTER")}
        env.update({"TRAILBOUND_METADATA_DSN": fresh_database(metadata_server, "trailbound_bench_connect_meta"),
                    "TRAILBOUND_TARGET_DSN": fresh_database(target_server, "trailbound_bench_connect_target"),
                    "TRAILBOUND_CONFIG": str(self.config_path), "PYSPARK_PYTHON": sys.executable,
                    "SPARK_LOCAL_IP": "127.0.0.1", "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
        return env


def run(argv: list[str], env: dict, server_pid: int) -> tuple[float, float, float, str]:
    """Wall, the command's CPU, the server's CPU meanwhile, and its output."""
    # Output to a file, not a pipe: a Python worker that outlives spark-submit's JVM for a
    # moment would hold a pipe open and keep the wait going (seen once).
    import tempfile

    with tempfile.TemporaryFile("w+") as output:
        cpu, server, began = children_cpu(), tree_cpu(server_pid), time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=output, stderr=subprocess.STDOUT, text=True, timeout=1800)
        wall = time.perf_counter() - began
        output.seek(0)
        text = output.read()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {text[-3000:]}")
    return wall, children_cpu() - cpu, tree_cpu(server_pid) - server, text


def command(variant: str, verb: list[str], job: str, remote: str) -> tuple[list[str], dict]:
    if variant == "spark-submit":
        return [str(VENV_BIN / "spark-submit"), "--master", "local[*]", str(REPO / "jobs" / job), *verb[2:]], {}
    return [sys.executable, "-m", "trailbound.cli", *verb], {"SPARK_REMOTE": remote}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--hours", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from trailbound.devtools.sparkconnect import ConnectServer
    from trailbound.metadata import dsn_from_env

    os.environ.setdefault("PYTHONPATH", f"{REPO / 'include'}")
    work = REPO / "var" / "bench" / "connect"
    shutil.rmtree(work, ignore_errors=True)
    world = World(work / "home", args.records, args.hours)
    server = ConnectServer(work / "server")
    began = time.perf_counter()
    server.start()
    started = time.perf_counter() - began
    server_pid = int(server.pid_file.read_text())
    metadata_server, target_server = dsn_from_env("TRAILBOUND_METADATA_DSN"), dsn_from_env("TRAILBOUND_TARGET_DSN")
    rows, loads = [], [os.getloadavg()[0]]
    try:
        for attempt in range(args.repeat):
            order = ("spark-submit", "connect") if attempt % 2 == 0 else ("connect", "spark-submit")
            for variant in order:
                env = world.reset(metadata_server, target_server)
                setup = [sys.executable, "-m", "trailbound.cli"]
                run([*setup, "target", "create"], env, server_pid)
                run([*setup, "archive", "scan"], {**env, "SPARK_REMOTE": server.url}, server_pid)  # untimed
                for label, verb, job in (("capture", ["extract", "run", "EXT1"], "extract.py"),
                                         ("idle capture", ["extract", "run", "EXT1"], "extract.py"),
                                         ("replicat", ["replicat", "run", "REP1"], "replicat.py")):
                    argv, more = command(variant, verb, job, server.url)
                    wall, cpu, server_cpu, out = run(argv, {**env, **more}, server_pid)
                    said = next((line.strip() for line in out.splitlines()
                                 if line.startswith(("Extract EXT1", "Replicat REP1"))), "")
                    rows.append((attempt + 1, label, variant, wall, cpu, server_cpu, said[:90]))
                    print(f"{attempt + 1} {label:12} {variant:12} wall {wall:6.1f} s  cpu {cpu:6.1f} s  "
                          f"server cpu {server_cpu:6.1f} s  {said[:90]}", flush=True)
                loads.append(os.getloadavg()[0])
    finally:
        server.stop()
    write_results(args, rows, started, loads)
    return 0


def write_results(args, rows, started: float, loads: list[float]) -> None:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Spark Connect: a run as a client of a warm server, against spark-submit",
        "",
        f"`.venv/bin/python tests/bench/bench_spark_connect.py --records {args.records} --hours {args.hours} "
        f"--repeat {args.repeat}` (with TRAILBOUND_METADATA_DSN / TRAILBOUND_TARGET_DSN), {now}, "
        f"{platform.node()}, {os.cpu_count()} CPUs, load average {min(loads):.1f}-{max(loads):.1f} during the runs.",
        "",
        f"One simulated archive ({args.records:,} records, {args.hours} hours). Each variant starts from fresh "
        "databases and an empty trail; the variants alternate. `spark-submit`: `spark-submit --master local[*] "
        "jobs/extract.py EXT1` (a JVM per run, as the DAGs submitted capture before); `connect`: `trailbound "
        "extract run EXT1` with SPARK_REMOTE naming a warm local[*] Spark Connect server "
        "(trailbound.devtools.sparkconnect). \"idle capture\" is the same command again with nothing new. CPU: "
        "the command's process tree (spark-submit's JVM and its Python workers included); server CPU: the "
        "Connect server's process tree meanwhile (for spark-submit runs: nothing of theirs).",
        "",
        f"The server itself took {started:.1f} s to start (once, before the runs).",
        "",
        "| repeat | run | variant | wall s | CPU s (command) | CPU s (server) | what it did |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {a} | {label} | {variant} | {wall:.1f} | {cpu:.1f} | {server:.1f} | {said} |"
              for a, label, variant, wall, cpu, server, said in rows]
    lines += ["", "Best of the repeats:", "", "| run | spark-submit wall / CPU s | connect wall / CPU s (client + server) |",
              "| --- | --- | --- |"]
    for label in dict.fromkeys(r[1] for r in rows):
        best = {}
        for _, lab, variant, wall, cpu, server, _ in rows:
            if lab == label and (variant not in best or wall < best[variant][0]):
                best[variant] = (wall, cpu, server)
        s, c = best.get("spark-submit"), best.get("connect")
        if s and c:
            lines.append(f"| {label} | {s[0]:.1f} / {s[1]:.1f} | {c[0]:.1f} / {c[1]:.1f} + {c[2]:.1f} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous = RESULTS.read_text() if RESULTS.exists() else ""
    kept = previous.split("\n## Notes", 1)[1] if "\n## Notes" in previous else ""
    RESULTS.write_text("\n".join(lines) + "\n" + ("\n## Notes" + kept if kept else ""))


if __name__ == "__main__":
    sys.exit(main())
