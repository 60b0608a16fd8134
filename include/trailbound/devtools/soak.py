"""`make soak`: the live pipeline on Airflow's real scheduler for a while, with faults.

    python -m trailbound.devtools.soak [--minutes 30] [--interval 60] [--rate 50] [--accounts 100000]
                                       [--fault-every 150] [--faults task,scheduler,source,target]
                                       [--spark connect|submit] [--no-triggerer] [--seed N] [--home var/soak]
                                       [--report docs/benchmarks/soak.md]

Two throwaway servers of its own under HOME (pg-source, wal_level=logical; pg-target, the
metadata store and the target), pgbench's tables published, and Airflow as a deployment
runs it: `airflow api-server`, `airflow scheduler` (LocalExecutor) and `airflow triggerer`,
the capture DAG on a schedule of INTERVAL (each run pulls the slot first), pump and
replicat on the trail Assets. pgbench writes -R RATE the whole time (its TPC-B-like
transaction; ACCOUNTS rows in pgbench_accounts: pgbench's own data load of 100,000 by
default, a smaller one for a cheaper first backlog, as the test suite's soak). Every FAULT-EVERY
seconds (jittered) one fault, in a shuffled rotation of:

- task       kill -9 of a running task's process (the task runner or its spark-submit JVM)
- scheduler  kill -9 of the scheduler; a new one is started 10 s later
- source     `pg_ctl restart -m fast` of the source server (pgbench is started again)
- target     `pg_ctl restart -m fast` of the metadata-store and target server
- spark      kill -9 of the Spark Connect server; a new one on the same address 10 s later

The tasks' Spark work runs on a Spark Connect server of the soak's own (HOME/spark-connect,
local[*]) through the Spark provider's `spark_connect_default` connection, as `make
airflow` and docker-compose.yaml run it; `--spark submit` makes each capture task
spark-submit its job instead (a JVM per run, as before Spark Connect). `--no-triggerer`
starts no triggerer: none of the soak's DAGs defers a task, so it only idles (~20 CPU-s
over a short soak; the test suite's soak leaves it out, `make soak` runs it).

Lag is sampled every 5 s: the source's newest pgbench_history row minus the newest applied
to the target (pgbench stamps each with its transaction's time): end-to-end lag while
pgbench writes, falling to 0 as the target catches up after it stops. After the last fault
pgbench stops, and the run waits for the target to converge. Then it checks what a user
relies on: every table equal to the source (an order-independent digest per table; a
duplicate or a lost row changes a count), the checkpoint row at the archive's last
COMMIT, the slot never confirmed past the archive, and after each fault the lag back
under its bound (BOUND, default 4 intervals + 2 minutes). With --report it writes the
results, the faults and the lag curve (a PNG beside the report). Exit 0 when all hold.

Everything under HOME starts from scratch on each run; the servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2

from trailbound import config as configuration
from trailbound import dagfiles
from trailbound.archive.segments import discover
from trailbound.devtools.livedemo import LOGICAL_OPTIONS, table_digests
from trailbound.devtools.localpg import LocalServer, accepts, free_port
from trailbound.devtools.sparkconnect import ConnectServer
from trailbound.positions import Csn

REPO = Path(__file__).resolve().parents[3]
SOURCE_DB, META_DB, TARGET_DB = "soak_source", "soak_meta", "soak_target"
TABLES = [("public", name) for name in ("pgbench_accounts", "pgbench_branches", "pgbench_history", "pgbench_tellers")]
DAGS = ("capture_esoak", "pump_psoak", "replicat_rsoak")
FAULTS = ("task", "scheduler", "source", "target", "spark")
SAMPLE_SECONDS = 5
PGBENCH_ACCOUNTS = 100_000   # pgbench -i at scale 1
# pgbench's built-in tpcb-like transaction, its accounts drawn from the first ACCOUNTS
# (the built-in one draws from 100,000 x scale, and scale is at least 1).
TPCB_LIKE = """\
\\set aid random(1, {accounts})
\\set tid random(1, 10)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = 1;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, 1, :aid, :delta, CURRENT_TIMESTAMP);
END;
"""
TASK_TITLE = re.compile(r"airflow worker -- [0-9a-f]{8}-[0-9a-f]{4}-")

CONFIG = """\
# Written by trailbound.devtools.soak: the live pipeline that `make soak` runs.
home: .
metadata: {{dsn_env: TRAILBOUND_METADATA_DSN, conn_id: trailbound_metadata}}
target: {{dsn_env: TRAILBOUND_TARGET_DSN, conn_id: trailbound_target}}
sources:
  PGSOAK:
    altarchivelogdest: archive
    postgres:
      dsn_env: TRAILBOUND_SOURCE_DSN
      conn_id: trailbound_source
      slot: trailbound_soak
      publication: trailbound_soak
      table: ["public.pgbench_*"]
      segment: {{records: 100000, bytes: 64M, seconds: 900}}
extracts:
  ESOAK:
    source: PGSOAK
    exttrail: dirdat/lt
    table: ["public.pgbench_*"]
    interval: {interval}s
    br: {{brdir: br, brinterval: 20m}}
pumps:
  PSOAK: {{exttrail: dirdat/lt, rmttrail: remote/rt}}
replicats:
  RSOAK:
    exttrail: remote/rt
    source: PGSOAK
    map: [{{source: "public.pgbench_*", target: "public.*"}}]
    grouptransops: 1000
    checkpointtable: trailbound.ggcheckpoint
airflow:
  start_date: {start}
"""


@dataclass
class Fault:
    kind: str
    at: float               # seconds since the soak began
    detail: str
    recovered_after: float | None = None  # seconds until lag was back under the bound


@dataclass
class Soak:
    home: Path
    interval: int
    rate: int
    bound: float
    spark_mode: str = "connect"   # or "submit"
    accounts: int = PGBENCH_ACCOUNTS
    triggerer: bool = True        # none of DAGS defers: the triggerer is there as in a deployment
    pgbench_script: list[str] = field(default_factory=list)   # pgbench's built-in transaction, or -f FILE
    started: float = field(default_factory=time.monotonic)
    began: float = 0.0      # seconds from the start to the pipeline's first applied change
    lag: list[tuple[float, float]] = field(default_factory=list)   # (seconds since start, lag seconds)
    faults: list[Fault] = field(default_factory=list)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    groups: list[int] = field(default_factory=list)  # every process group started: a killed scheduler's children too

    def __post_init__(self):
        self.source = LocalServer(self.home / "pg-source", options=LOGICAL_OPTIONS, databases=(SOURCE_DB,))
        self.target = LocalServer(self.home / "pg-target", databases=(META_DB, TARGET_DB))
        self.spark = ConnectServer(self.home / "spark-connect")
        self.logs = self.home / "logs"

    def now(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        print(f"[{self.now():7.1f}s] {text}", flush=True)

    # -- set-up --------------------------------------------------------------------------
    def prepare(self) -> None:
        for server in (self.source, self.target):
            server.remove()
        subprocess.run(["rm", "-rf", str(self.home)], check=True)
        self.logs.mkdir(parents=True)
        self.source.start()
        self.target.start()
        self.env = self._environment()
        if self.spark_mode == "connect":
            self.spark.start()
            self.env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
                {"conn_type": "spark_connect", "host": "127.0.0.1", "port": self.spark.port})
        start = (datetime.now(UTC) - timedelta(seconds=self.interval)).replace(microsecond=0)
        config_path = self.home / "trailbound.yaml"
        config_path.write_text(CONFIG.format(interval=self.interval, start=start.isoformat()))
        self.env["TRAILBOUND_CONFIG"] = str(config_path)
        self.config = configuration.load(config_path)
        dags = self.home / "dags"
        dags.mkdir()
        for name, text in dagfiles.dag_files(self.config).items():
            if Path(name).stem in DAGS:
                (dags / name).write_text(text)
        self.env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)

        source_dsn = self.env["TRAILBOUND_SOURCE_DSN"]
        self.run(["pgbench", "-i", "-I", "dtp", "-q", source_dsn])
        with psycopg2.connect(source_dsn) as connection, connection.cursor() as cur:
            cur.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")  # it has no primary key
        connection.close()
        self.run(["trailbound", "add", "source", "PGSOAK"])
        self.run(["trailbound", "target", "create"])
        self.load_pgbench_data(source_dsn)
        self.say("servers up, pgbench's tables loaded, source added, target created")

        self.run(["airflow", "db", "migrate"])
        self.run(["airflow", "dags", "reserialize"])  # unpaused as they are created (the environment)
        self.start_api_server()
        for name in ("scheduler", "triggerer") if self.triggerer else ("scheduler",):
            self.start_airflow(name)
        self.start_pgbench()
        self.say(f"Airflow's api-server, {'scheduler and triggerer' if self.triggerer else 'scheduler'} running; "
                 f"pgbench writing {self.rate} tps")

    def load_pgbench_data(self, source_dsn: str) -> None:
        """The first backlog: pgbench's own data load (COPY of 100,000 accounts), or the
        same rows for fewer accounts, written by pgbench's transaction from a script."""
        if self.accounts == PGBENCH_ACCOUNTS:
            self.run(["pgbench", "-i", "-I", "g", "-q", source_dsn])
            return
        with psycopg2.connect(source_dsn) as connection, connection.cursor() as cur:
            cur.execute("INSERT INTO pgbench_branches (bid, bbalance) VALUES (1, 0)")
            cur.execute("INSERT INTO pgbench_tellers (tid, bid, tbalance) SELECT t, 1, 0 FROM generate_series(1, 10) t")
            cur.execute("INSERT INTO pgbench_accounts (aid, bid, abalance, filler)"
                        " SELECT a, 1, 0, '' FROM generate_series(1, %s) a", (self.accounts,))
        connection.close()
        script = self.home / "tpcb-like.sql"
        script.write_text(TPCB_LIKE.format(accounts=self.accounts))
        self.pgbench_script = ["-f", str(script)]

    def _environment(self) -> dict[str, str]:
        venv_bin = Path(sys.executable).parent
        airflow_home = self.home / "airflow"
        airflow_home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRAILBOUND"))}
        env.update({
            "TRAILBOUND_SOURCE_DSN": self.source.dsn(SOURCE_DB),
            "TRAILBOUND_METADATA_DSN": self.target.dsn(META_DB), "TRAILBOUND_TARGET_DSN": self.target.dsn(TARGET_DB),
            "AIRFLOW_HOME": str(airflow_home),
            # sqlite, waiting up to a minute for a lock: the three Airflow processes share it.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}?timeout=60",
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # Unpaused as `airflow dags reserialize` creates them: no `airflow dags
            # unpause` per DAG (an interpreter and Airflow's imports each).
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__PARALLELISM": "3", "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # A task's calls to the API server time out after 5 s by default: the server's
            # first execution-API answer (its lazy start) takes longer on a loaded host,
            # and the task's first try failed for it, a retry and its 30 s delay later.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "90",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}", "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        })
        return env

    def run(self, argv: list[str]) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, cwd=self.home)
        if done.returncode != 0:
            raise SystemExit(f"{shlex.join(argv[:4])} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout + done.stderr

    def start_airflow(self, name: str) -> None:
        log = open(self.logs / f"{name}.log", "a")
        self.processes[name] = subprocess.Popen(["airflow", name], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True, cwd=self.home)
        self.groups.append(self.processes[name].pid)

    def start_api_server(self) -> None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        self.env.update({"AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port),
                         "AIRFLOW__API__BASE_URL": url, "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/"})
        self.start_airflow("api-server")
        deadline = time.monotonic() + 240
        while not accepts(port):
            if self.processes["api-server"].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the API server did not start: see {self.logs / 'api-server.log'}")
            time.sleep(1)

    def start_pgbench(self) -> None:
        log = open(self.logs / "pgbench.log", "a")
        self.processes["pgbench"] = subprocess.Popen(
            ["pgbench", "-n", "-c", "2", "-j", "1", "-R", str(self.rate), "-T", "100000", *self.pgbench_script,
             self.env["TRAILBOUND_SOURCE_DSN"]], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.groups.append(self.processes["pgbench"].pid)

    # -- faults --------------------------------------------------------------------------
    def inject(self, kind: str) -> Fault | None:
        """One fault of `kind`; None when there was nothing to strike (no task running)."""
        if kind == "task":
            waited_until = time.monotonic() + 2 * self.interval  # a run comes every interval
            while not (victims := self._task_processes()) and time.monotonic() < waited_until:
                time.sleep(1)
            if not victims:
                self.say(f"FAULT task: no task ran for {2 * self.interval} s; tried again later")
                return None
            victim = random.choice(victims)
            detail = f"kill -9 {victim.pid} ({' '.join(victim.cmdline())[:90]})"
            _kill(victim.pid)
        elif kind == "scheduler":
            scheduler = self.processes["scheduler"]
            _kill(scheduler.pid)
            scheduler.wait()
            time.sleep(10)
            self.start_airflow("scheduler")
            detail = f"kill -9 {scheduler.pid} (the scheduler); a new one started 10 s later"
        elif kind == "spark":
            if self.spark_mode != "connect":
                raise SystemExit("the spark fault needs the Spark Connect server (--spark connect)")
            pid = int(self.spark.pid_file.read_text())
            os.killpg(pid, signal.SIGKILL)  # spark-submit's session: the JVM and its Python workers
            time.sleep(10)
            self.spark.start(port=self.spark.port)
            detail = f"kill -9 {pid} (the Spark Connect server); a new one on the same address 10 s later"
        elif kind == "source":
            self.source.restart()
            detail = "pg_ctl restart -m fast of the source server"
        else:
            self.target.restart()
            detail = "pg_ctl restart -m fast of the metadata store and target server"
        fault = Fault(kind, self.now(), detail)
        self.say(f"FAULT {kind}: {detail}")
        return fault

    def _task_processes(self) -> list:
        import psutil

        found = []
        for root in (self.processes["scheduler"].pid,):
            try:
                tree = psutil.Process(root).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for process in tree:
                try:
                    words = " ".join(process.cmdline())
                except psutil.Error:
                    continue
                # A task's own process ("airflow worker -- <task instance id>", Airflow 3's
                # title for it; the executor's idle workers say "LocalExecutor") or its
                # spark-submit JVM (--spark submit).
                if TASK_TITLE.match(words) or ("java" in words and "SparkSubmit" in words):
                    found.append(process)
        return found

    # -- observation ---------------------------------------------------------------------
    def sample_lag(self) -> float | None:
        """How far the target is behind the source, in seconds: the newest pgbench_history
        row on the source minus the newest applied to the target (pgbench stamps each with
        its transaction's time). While pgbench writes that is end-to-end lag; once it has
        stopped it falls to 0 as the target catches up, so a fault's recovery shows even
        at the end. None while either server is restarting or nothing is applied yet."""
        newest = []
        for dsn in (self.env["TRAILBOUND_SOURCE_DSN"], self.env["TRAILBOUND_TARGET_DSN"]):
            try:
                with psycopg2.connect(dsn, connect_timeout=3) as connection, connection.cursor() as cur:
                    cur.execute("SELECT extract(epoch FROM max(mtime)) FROM public.pgbench_history")
                    newest.append(cur.fetchone()[0])
                connection.close()
            except psycopg2.Error:
                return None  # a server is restarting: no sample
        if None in newest:
            return None
        value = max(float(newest[0] - newest[1]), 0.0)
        self.lag.append((self.now(), value))
        with open(self.logs / "lag.csv", "a") as samples:  # kept whatever happens to the run after
            samples.write(f"{self.now():.1f},{value:.1f}\n")
        return value

    def keep_pgbench_writing(self) -> None:
        if self.processes["pgbench"].poll() is not None:  # a source restart ends its sessions
            self.start_pgbench()

    def converged(self) -> bool:
        try:
            return table_digests(self.env["TRAILBOUND_SOURCE_DSN"], TABLES) == \
                table_digests(self.env["TRAILBOUND_TARGET_DSN"], TABLES)
        except psycopg2.Error:
            return False

    def checkpoint_at_last_commit(self) -> tuple[bool, str]:
        archive = self.config.archive_dir("PGSOAK")
        import pyarrow.parquet as pq

        last_commit = 0
        for segment in discover(archive):
            table = pq.read_table(segment.path, columns=["scn", "op"]).to_pylist()
            last_commit = max([last_commit, *[r["scn"] for r in table if r["op"] == "COMMIT"]])
        with psycopg2.connect(self.env["TRAILBOUND_TARGET_DSN"]) as connection, connection.cursor() as cur:
            cur.execute("SELECT log_csn FROM trailbound.ggcheckpoint WHERE group_name = 'RSOAK'")
            row = cur.fetchone()
        connection.close()
        applied = Csn.parse(row[0]).scn if row else None  # Csn.scn is the SCN as an integer
        with psycopg2.connect(self.env["TRAILBOUND_SOURCE_DSN"]) as connection, connection.cursor() as cur:
            cur.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
                        " WHERE slot_name = 'trailbound_soak'")
            confirmed = int(cur.fetchone()[0])
        connection.close()
        archive_end = discover(archive)[-1].next_scn.value
        ok = applied == last_commit and confirmed <= archive_end
        return ok, (f"checkpoint row at SCN {applied}, the archive's last COMMIT at SCN {last_commit}; "
                    f"slot confirmed at {confirmed}, the archive ends at {archive_end}")

    def stop(self) -> None:
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass
        # Ten seconds to go quietly, then SIGKILL: what the soak checks is already read, and
        # Airflow's processes took 40-50 s to stop on SIGTERM (its tasks failing their runs and
        # then failing to report it to the gone API server), a sixth of the suite's soak.
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.spark.stop()
        for server in (self.source, self.target):
            server.stop()
        self.say("every process and server stopped")

    def task_errors(self) -> list[str]:
        """The distinct error lines the tasks printed (what the operator read)."""
        seen = []
        for log in sorted((self.home / "airflow" / "logs").rglob("*.log")):
            for line in log.read_text(errors="replace").splitlines():
                for marker in ("ERROR source", "ERROR lost the connection", "ERROR "):
                    at = line.find(marker)
                    if at >= 0:
                        # A task log's line is JSON: the message ends at its string's end.
                        text = re.split(r'\\n|",', line[at:at + 300])[0].rstrip('",}')
                        if text not in seen and "Traceback" not in text:
                            seen.append(text)
                        break
        return seen



def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def recovery_times(soak: Soak) -> None:
    """For each fault, the seconds until the lag was back under the bound (None: never)."""
    for fault in soak.faults:
        after = [(t, lag) for t, lag in soak.lag if t >= fault.at]
        fault.recovered_after = next((t - fault.at for t, lag in after if lag <= soak.bound), None)


def plot(soak: Soak, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 4), dpi=100)
    axes.plot([t / 60 for t, _ in soak.lag], [lag for _, lag in soak.lag], color="#017cee", linewidth=1.2,
              label="lag: source's newest pgbench_history row minus the target's")
    axes.axhline(soak.bound, color="#cc0000", linestyle="--", linewidth=1, label=f"bound ({soak.bound:.0f} s)")
    colours = {"task": "#7f7f7f", "scheduler": "#ff7f0e", "source": "#2ca02c", "target": "#9467bd",
               "spark": "#e377c2"}
    for kind in FAULTS:
        times = [f.at / 60 for f in soak.faults if f.kind == kind]
        if times:
            axes.vlines(times, 0, soak.bound, colors=colours[kind], linewidth=1, label=f"fault: {kind}")
    axes.set_xlabel("minutes since the soak began")
    axes.set_ylabel("lag (seconds)")
    axes.set_ylim(bottom=0)
    axes.legend(loc="upper right", fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def report(soak: Soak, path: Path, command: str, outcome: dict) -> None:
    picture = path.with_suffix(".png")
    plot(soak, picture)
    lines = [
        "# Soak: the live pipeline under Airflow's scheduler, with faults",
        "",
        f"Command: `{command}` (written by trailbound.devtools.soak on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs).",
        "",
        f"pgbench -R {soak.rate} on the source for {outcome['minutes']:.1f} minutes, counted from the pipeline's "
        f"first applied change ({outcome['setup_seconds']:.0f} s of set-up before it: the servers, Airflow's "
        f"database, the first backlog with pgbench's {soak.accounts:,} accounts); the capture DAG every "
        f"{soak.interval} s (pulling first), pump and replicat on the trail Assets, run by `airflow scheduler` "
        f"(LocalExecutor), {'`airflow triggerer` and ' if soak.triggerer else ''}`airflow api-server`; "
        "the tasks' Spark "
        + ("on a Spark Connect server (local[*]) through the `spark_connect_default` connection. "
           if soak.spark_mode == "connect" else "by spark-submit, a JVM per capture run. ")
        + "The lag bound: "
        f"{soak.bound:.0f} s.",
        "",
        "## Outcome",
        "",
        "| check | result |",
        "| --- | --- |",
        f"| faults injected | {len(soak.faults)} ({', '.join(f'{k} {sum(f.kind == k for f in soak.faults)}' for k in FAULTS)}) |",
        f"| tables equal to the source at the end | {outcome['equal']} ({outcome['converge_seconds']:.0f} s after pgbench stopped) |",
        f"| divergences / duplicates / losses | {outcome['divergences']} / {outcome['duplicates']} / {outcome['losses']} |",
        f"| checkpoint row and slot | {outcome['checkpoint']} |",
        f"| lag back under the bound after every fault | {outcome['recovered']} |",
        f"| lag: median / max (seconds) | {outcome['median_lag']:.0f} / {outcome['max_lag']:.0f} |",
        "",
        "## Faults",
        "",
        "| at (s) | fault | what was done | lag back under the bound after (s) |",
        "| ---: | --- | --- | ---: |",
    ]
    for fault in soak.faults:
        back = "never" if fault.recovered_after is None else f"{fault.recovered_after:.0f}"
        lines.append(f"| {fault.at:.0f} | {fault.kind} | {fault.detail.replace('|', '/')} | {back} |")
    lines += ["", "## What the tasks printed (distinct error lines)", ""]
    lines += [f"- `{line}`" for line in outcome["errors"][:20]] or ["- none"]
    lines += ["", f"![end-to-end lag over the soak]({picture.name})", ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trailbound.devtools.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30, help="how long pgbench writes and faults come (30); at least until each kind of fault came once")
    parser.add_argument("--interval", type=int, default=60, help="the capture DAG's schedule, seconds (60)")
    parser.add_argument("--rate", type=int, default=50, help="pgbench transactions per second (50)")
    parser.add_argument("--accounts", type=int, default=PGBENCH_ACCOUNTS,
                        help="rows in pgbench_accounts, the first backlog (pgbench's data load: 100,000)")
    parser.add_argument("--fault-every", type=float, default=150, help="seconds between faults, jittered (150)")
    parser.add_argument("--faults", default=",".join(FAULTS), help="the kinds of fault, in rotation")
    parser.add_argument("--bound", type=float, help="the lag bound in seconds (4 intervals + 120)")
    parser.add_argument("--converge-minutes", type=float, default=10, help="how long to wait for convergence (10)")
    parser.add_argument("--first-apply-minutes", type=float, default=15,
                        help="how long the set-up and the first backlog may take to reach the target (15)")
    parser.add_argument("--spark", choices=["connect", "submit"], default="connect",
                        help="the tasks' Spark: a Spark Connect server of the soak's (default) or spark-submit per run")
    parser.add_argument("--no-triggerer", dest="triggerer", action="store_false",
                        help="start no `airflow triggerer` (no soak DAG defers; the test suite's soak)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--home", type=Path, default=REPO / "var" / "soak")
    parser.add_argument("--report", type=Path, help="write the results here (Markdown) and the lag curve beside it")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault kind(s) {', '.join(unknown)}: choose from {', '.join(FAULTS)}")
    soak = Soak(args.home.resolve(), args.interval, args.rate, args.bound or 4 * args.interval + 120, args.spark,
                accounts=args.accounts, triggerer=args.triggerer)
    command = shlex.join(["python", "-m", "trailbound.devtools.soak", *(argv if argv is not None else sys.argv[1:]),
                          *([] if args.seed is not None else ["--seed", str(seed)])])
    print(f"== soak: {command}")
    # A SIGTERM (a timeout, Ctrl-C's sibling) still stops the servers and processes it started.
    # Only the first: a second one (`timeout` passes its own on) must not cut the clean-up short.
    def terminated(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit("soak: terminated")

    signal.signal(signal.SIGTERM, terminated)
    try:
        soak.prepare()
        # The soak's minutes count from the pipeline's first applied change: the set-up
        # (Airflow's database, the servers, the first backlog) is not what is soaked.
        first_apply_deadline = soak.now() + args.first_apply_minutes * 60
        while soak.sample_lag() is None:
            soak.keep_pgbench_writing()
            if soak.now() > first_apply_deadline:
                raise SystemExit(f"nothing applied to the target within {args.first_apply_minutes} minutes: "
                                 f"see {soak.logs} and {soak.home / 'airflow' / 'logs'}")
            time.sleep(SAMPLE_SECONDS)
        soak.say("the pipeline applied its first changes: the soak begins")
        soak.began = soak.now()
        # The soak lasts its minutes, and at least until each kind of fault has come once
        # (on a slow machine a fault and its recovery take longer than FAULT-EVERY).
        end = soak.now() + args.minutes * 60
        rotation: list[str] = []
        next_fault = soak.now() + args.fault_every * random.uniform(0.7, 1.3)
        last_said = soak.now()
        while soak.now() < end or (set(kinds) - {fault.kind for fault in soak.faults} and soak.now() < end + 600):
            soak.keep_pgbench_writing()
            lag = soak.sample_lag()
            if soak.now() - last_said >= 60:
                soak.say(f"lag {'?' if lag is None else f'{lag:.0f} s'}")
                last_said = soak.now()
            if kinds and soak.now() >= next_fault:
                if not rotation:
                    rotation = random.sample(kinds, len(kinds))
                kind = rotation.pop()
                fault = soak.inject(kind)
                if fault is None:
                    rotation.insert(0, kind)  # nothing to strike now: it comes again later
                else:
                    soak.faults.append(fault)
                next_fault = soak.now() + args.fault_every * random.uniform(0.7, 1.3)
            time.sleep(SAMPLE_SECONDS)
        soak.say("the faults are done: pgbench stops")
        pgbench = soak.processes.pop("pgbench")
        if pgbench.poll() is None:
            os.killpg(pgbench.pid, signal.SIGINT)
            try:
                pgbench.wait(timeout=3)
            except subprocess.TimeoutExpired:
                # A pgbench started again after a source restart did not heed SIGINT in 20 s
                # (twice in a row); what it committed is on the source either way, and that is
                # what is compared.
                os.killpg(pgbench.pid, signal.SIGKILL)
                pgbench.wait()
        stopped = soak.now()
        soak.say("pgbench stopped; waiting for the target to converge")
        deadline = stopped + args.converge_minutes * 60
        equal = False
        while soak.now() < deadline:
            soak.sample_lag()
            if soak.converged():
                equal = True
                break
            time.sleep(SAMPLE_SECONDS)
        converge_seconds = soak.now() - stopped
        source = table_digests(soak.env["TRAILBOUND_SOURCE_DSN"], TABLES)
        target = table_digests(soak.env["TRAILBOUND_TARGET_DSN"], TABLES)
        try:
            checkpoint_ok, checkpoint = soak.checkpoint_at_last_commit() if equal else (False, "not converged")
        except Exception as exc:  # reported, not lost with the lag samples
            checkpoint_ok, checkpoint = False, f"could not be checked: {type(exc).__name__}: {exc}"
    finally:
        soak.stop()
    errors = soak.task_errors() if (soak.home / "airflow" / "logs").exists() else []
    recovery_times(soak)
    lags = sorted(lag for t, lag in soak.lag if soak.began <= t < stopped)
    history = "public.pgbench_history"
    extra = target[history][0] - source[history][0]
    outcome = {
        "minutes": (stopped - soak.began) / 60, "setup_seconds": soak.began, "equal": "yes" if equal else "NO", "converge_seconds": converge_seconds,
        "divergences": sum(source[t] != target[t] for t in source),
        "duplicates": max(extra, 0), "losses": max(-extra, 0),
        "checkpoint": checkpoint, "recovered": "yes" if all(f.recovered_after is not None for f in soak.faults)
        else "NO", "median_lag": lags[len(lags) // 2] if lags else float("nan"),
        "max_lag": lags[-1] if lags else float("nan"), "errors": errors,
    }
    for key in ("equal", "divergences", "duplicates", "losses", "checkpoint", "recovered", "median_lag", "max_lag"):
        print(f"  {key}: {outcome[key]}")
    print(f"  faults: {len(soak.faults)}; the lines the tasks printed: {len(errors)} distinct")
    if args.report:
        report(soak, args.report, command, outcome)
        print(f"  report: {args.report} (lag curve {args.report.with_suffix('.png')})")
    ok = equal and checkpoint_ok and outcome["recovered"] == "yes" and not outcome["divergences"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
