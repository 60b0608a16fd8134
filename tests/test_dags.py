"""The Airflow layer: DAG integrity, and the DAGs run for real with `airflow dags test`
(Airflow 3, its own SQLite metadata database in a temporary AIRFLOW_HOME, Spark through
SparkSubmitOperator and the spark_default connection set to local[*])."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2.extensions
import pytest

from capture_kit import T0, committed_trail, transactions
from pg_source_kit import source_dsn, source_server  # noqa: F401 (fixtures)
from process_kit import stop_process_groups
from test_bounded_recovery import long_running_archive
from trailbound import cli, runlog, status
from trailbound import config as configuration
from trailbound import dagfiles
from trailbound.trail import format as trail
from trailbound.capture import checkpoints as capture_checkpoints
from trailbound.capture.run import run_extract
from trailbound.metadata import MetadataStore
from pg_source_kit import SOURCE_ENV, execute, slot_confirmed, write_config as write_pg_config

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def airflow_env(home: Path, dags: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        # The default sqlite database, but waiting up to a minute for a lock (Python's
        # default is 5 s): a world's Airflow process, triggerer and API server share it, and
        # on two loaded CPUs a writer can hold it longer ("database is locked").
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}?timeout=60",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # This tree's engine and plugins, whatever an editable install of the venv points at.
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False", "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    })
    env.update(extra or {})
    return env


def as_uri(dsn: str) -> str:
    """An Airflow connection needs a URI; the stores' DSNs are key=value strings."""
    parts = psycopg2.extensions.parse_dsn(dsn)
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


def parse_in_subprocess(dags: Path, env: dict) -> dict:
    """Load a DAG folder with Airflow's DagBag in a fresh interpreter; describe each DAG."""
    script = (
        "import json, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(dags)!r})\n"
        "print(json.dumps({'errors': {k: str(v) for k, v in bag.import_errors.items()}, 'dags': {\n"
        "    d.dag_id: {'tasks': sorted(t.task_id for t in d.tasks), 'schedule': repr(d.timetable),\n"
        "               'doc': bool(d.doc_md), 'max_active_runs': d.max_active_runs,\n"
        "               'alerts': d.has_on_failure_callback} for d in bag.dags.values()}}))\n")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


class ConnectionCatcher:
    """A TCP listener that counts connections: every DSN points here while DAGs parse."""

    def __init__(self):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.port = self.server.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()


def test_dag_files_are_up_to_date_with_the_configuration():
    config = configuration.load(REPO / "include" / "config" / "trailbound.yaml")
    for name, text in dagfiles.dag_files(config).items():
        assert (REPO / "dags" / name).read_text() == text, f"dags/{name} is stale: run `trailbound dags generate`"


def test_an_error_raised_in_a_spark_task_of_a_worker_task_names_the_file_not_a_traceback(tmp_path):
    """compare, load and the replica check run the engine on a Spark session inside the
    Airflow task (TrailboundHook.spark): a TrailboundError raised in a Spark task (a file
    and its position) reaches the task log as that error, as the command line prints it,
    not as the PythonException that carries a worker's traceback."""
    script = (
        "from trailbound.errors import ArchiveError, TrailboundError\n"
        "from trailbound_airflow.hooks import TrailboundHook\n"
        "def damaged(_):\n"
        "    raise ArchiveError('/archive/thread_1_seq_7.parquet', 'op is not one of the contract', rba=12)\n"
        "try:\n"
        "    with TrailboundHook().spark('hook test') as spark:\n"
        "        spark.sparkContext.parallelize([0], 1).map(damaged).collect()\n"
        "except TrailboundError as exc:\n"
        "    print(f'RAISED {type(exc).__name__}: {exc}')\n")
    env = airflow_env(tmp_path / "airflow", tmp_path, {"SPARK_MASTER": "local[1]"})
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stdout.splitlines() if line.startswith("RAISED")] == [
        "RAISED TrailboundError: /archive/thread_1_seq_7.parquet rba 12: op is not one of the contract"]


def test_pump_and_replicat_run_in_the_task_only_when_they_need_no_spark_submit(tmp_path):
    """Local trails and, for replicat, a local Spark master: the run goes in the task (no
    JVM to start); a trail behind a Hadoop URI or a cluster master: spark-submit."""
    config = tmp_path / "trailbound.yaml"
    config.write_text(f"""home: {tmp_path}
sources:
  SRC: {{altarchivelogdest: archive}}
extracts:
  EXT1: {{source: SRC, exttrail: dirdat/lt, table: ["shop.*"]}}
pumps:
  PMP1: {{exttrail: dirdat/lt, rmttrail: dirrmt/rt}}
  PMPS: {{exttrail: dirdat/lt, rmttrail: "s3a://bucket/dirrmt/st"}}
replicats:
  REP1: {{exttrail: dirrmt/rt, source: SRC}}
  REPS: {{exttrail: "s3a://bucket/dirrmt/st", source: SRC}}
""")
    cases = [("pump", "PMP1", None), ("pump", "PMPS", "local[*]"), ("replicat", "REP1", "local[*]"),
             ("replicat", "REP1", "local[2]"), ("replicat", "REP1", "local"),
             ("replicat", "REP1", "spark://127.0.0.1:7077"), ("replicat", "REP1", None),
             ("replicat", "REPS", "local[*]"), ("capture", "EXT1", "local[*]")]
    script = ("import json, sys\n"
              "from trailbound_airflow.hooks import TrailboundHook\n"
              "hook = TrailboundHook()\n"
              f"print(json.dumps([hook.runs_in_the_task(*case) for case in {cases!r}]))\n")
    env = airflow_env(tmp_path / "airflow", tmp_path, {"TRAILBOUND_CONFIG": str(config)})
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    decided = dict(zip(cases, json.loads(result.stdout.strip().splitlines()[-1])))
    assert [case for case, in_task in decided.items() if in_task] == [
        ("pump", "PMP1", None), ("replicat", "REP1", "local[*]"), ("replicat", "REP1", "local[2]"),
        ("replicat", "REP1", "local")]


def test_every_dag_imports_with_its_tasks_and_schedule_and_opens_no_connection(tmp_path):
    catcher = ConnectionCatcher()
    dsn = f"postgresql://nobody@127.0.0.1:{catcher.port}/none"
    env = airflow_env(tmp_path / "airflow", REPO / "dags", {
        "TRAILBOUND_METADATA_DSN": dsn, "TRAILBOUND_TARGET_DSN": dsn, "AIRFLOW_CONN_TRAILBOUND_METADATA": dsn,
        "TRAILBOUND_CONFIG": str(tmp_path / "absent.yaml"),  # a DAG file that read the configuration would fail
    })
    parsed = parse_in_subprocess(REPO / "dags", env)
    assert parsed["errors"] == {}
    dags = parsed["dags"]
    assert dags["capture_ext1"]["tasks"] == ["capture", "validate_trail", "wait_for_archive", "write_checkpoint_before"]
    assert dags["capture_ext1"]["max_active_runs"] == 1 and dags["capture_ext1"]["doc"]
    assert dags["longtrans_ext1"]["tasks"] == ["long_running_transactions"]
    assert dags["control"]["tasks"] == ["run_command"]
    assert dags["pump_pmp1"]["tasks"] == ["pump"]
    assert dags["replicat_rep1"]["tasks"] == ["check_replica", "replicat"]
    assert dags["retention"]["tasks"] == ["purge_archive"]
    assert "AssetTriggeredTimetable" in dags["pump_pmp1"]["schedule"], "pump runs when its trail is published"
    assert "AssetTriggeredTimetable" in dags["replicat_rep1"]["schedule"]
    assert dags["retention"]["schedule"] == "DeltaDataIntervalTimetable(delta=datetime.timedelta(seconds=14400))"
    assert "NullTimetable" in dags["control"]["schedule"], "control runs only when triggered"
    assert dags["capture_ext1"]["schedule"] == "DeltaDataIntervalTimetable(delta=datetime.timedelta(seconds=900))"
    assert all(dag["alerts"] for dag in dags.values()), "every DAG fires the configured failure callbacks"
    assert catcher.connections == 0, "parsing DAG files must not connect anywhere"


def write_world(tmp_path: Path, *, long_xids=("LONG",), commit_hour=7, total_hours=8) -> Path:
    """An archive with long transactions, a truth file of what the replica must end as
    (the short transactions S<h> and the long ones except SKIPME), and a configuration
    with capture, pump and replicat."""
    long_running_archive(tmp_path, total_hours=total_hours, long_xids=long_xids, commit_hour=commit_hour)
    rows = [{"id": 100_000 + h, "note": f"n{100_000 + h}"} for h in range(total_hours)]
    rows += [{"id": 1000 * (n + 1) + h, "note": f"n{1000 * (n + 1) + h}"} for n, xid in enumerate(long_xids)
             if xid != "SKIPME" for h in range(commit_hour)]
    last_csn = max(h * 3600 + 20 for h in range(total_hours))
    last_csn = max([last_csn] + [commit_hour * 3600 + 1900 + n for n, xid in enumerate(long_xids) if xid != "SKIPME"])
    (tmp_path / "truth.json").write_text(json.dumps({"last_csn": last_csn, "tables": {
        "shop.orders": {"columns": ["id", "note"], "rows": sorted(rows, key=lambda r: r["id"])}}}))
    config_path = tmp_path / "trailbound.yaml"
    config_path.write_text(
        f"home: {tmp_path}\nsources:\n  SRC:\n    altarchivelogdest: archive\n    truth: truth.json\n"
        "extracts:\n  EXT1:\n    source: SRC\n    exttrail: dirdat/lt\n    table: ['shop.*']\n    interval: 1h\n"
        "    br:\n      brdir: brfiles\n      brinterval: 1h\n"
        "    warnlongtrans:\n      duration: 3h\n      checkinterval: 1h\n"
        "pumps:\n  PMP1:\n    exttrail: dirdat/lt\n    rmttrail: remote/rt\n"
        "replicats:\n  REP1:\n    exttrail: remote/rt\n    source: SRC\n    map: [{source: 'shop.*', target: 'shop.*'}]\n"
        "retention:\n  minkeephours: 1\n"
        f"airflow:\n  start_date: {T0.isoformat()}\n"
        "  on_failure_callbacks: [trailbound_airflow.alerts.log_alert, pager.page]\n")
    # A user's notifier: records each page beside it.
    (tmp_path / "pager.py").write_text(
        "import json, pathlib\n"
        "def page(context):\n"
        "    with open(pathlib.Path(__file__).with_name('pages.jsonl'), 'a') as pages:\n"
        "        pages.write(json.dumps([context['dag_run'].dag_id, context['ti'].task_id]) + '\\n')\n")
    return config_path


def pages(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "pages.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


_MIGRATED: list[Path] = []


def migrated_airflow_db() -> Path:
    """An Airflow database `airflow db migrate` built, once per test process."""
    if not _MIGRATED:
        home = REPO / "var" / "test-airflow-db" / str(os.getpid())
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        done = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=airflow_env(home, home / "dags"),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        _MIGRATED.append(home / "airflow.db")
    return _MIGRATED[0]


class AirflowWorld:
    """A configuration, its generated DAG files, an initialised Airflow home and the
    environment every Airflow command of the test runs in."""

    def __init__(self, tmp_path: Path, config_path: Path, metadata_dsn: str, target_dsn: str,
                 spark_remote: str | None = None):
        """`spark_remote` (conftest's fixture): the Spark Connect server the tasks' Spark
        work runs on, through the Spark provider's `spark_connect_default` connection, as
        `make airflow` and docker-compose run them; without it each capture task
        spark-submits its job (a cold JVM each: tests/test_cluster.py keeps that path)."""
        self.config_path = config_path
        self.config = configuration.load(config_path)
        self.dags = tmp_path / "dags"
        dagfiles.generate(self.config, self.dags)
        self.home = tmp_path / "airflow"
        self.env = airflow_env(self.home, self.dags, {
            "TRAILBOUND_CONFIG": str(config_path), "TRAILBOUND_METADATA_DSN": metadata_dsn,
            "TRAILBOUND_TARGET_DSN": target_dsn, "AIRFLOW_CONN_TRAILBOUND_METADATA": as_uri(metadata_dsn),
            "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}{os.pathsep}{config_path.parent}"})
        if spark_remote:
            host, port = spark_remote.removeprefix("sc://").split(":")
            self.env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
                {"conn_type": "spark_connect", "host": host, "port": int(port)})
        # An empty Airflow database, migrated once per test process and copied: `airflow db
        # migrate` costs an interpreter and every migration each time.
        self.home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_airflow_db(), self.home / "airflow.db")
        self._runner: subprocess.Popen | None = None

    def airflow(self, *args: str) -> str:
        """An `airflow` command (`airflow dags reserialize`, `airflow backfill create ...`),
        run in this world's one Airflow process by Airflow's own command-line parser."""
        state, output = self._ask(["cli", list(args)])
        assert state == "success", f"airflow {' '.join(args)}: {state}\n{output[-3000:]}"
        return output

    def asset_events(self, uri: str) -> list[dict]:
        """The extras of the Asset's events, oldest first, from Airflow's database."""
        with sqlite3.connect(self.home / "airflow.db") as airflow_db:
            rows = airflow_db.execute("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                                      "WHERE a.uri = ? ORDER BY e.id", (uri,)).fetchall()
        return [json.loads(extra) for extra, in rows]

    def dags_test(self, dag_id: str, hour: int, conf: dict | None = None) -> tuple[str, str]:
        """`airflow dags test` for the interval ending `hour` hours after T0."""
        return self.run_dag(dag_id, T0 + timedelta(hours=hour), conf)

    def run_dag(self, dag_id: str, logical_date: datetime, conf: dict | None = None) -> tuple[str, str]:
        """What `airflow dags test DAG DATE --conf` does (DAG.test), in this world's one
        long-lived Airflow process: each run's DAG is parsed afresh from the folder, and the
        interpreter start, Airflow's imports and its in-process execution API are paid once
        per world, not once per run. Returns the run's state and its output."""
        state, output = self._ask(["test", dag_id, logical_date.isoformat(), conf])
        lines = output.splitlines()
        finished = [line for line in lines if "DagRun Finished" in line]
        assert finished, output[-3000:]
        assert state in ("success", "failed") and f"state={state}" in finished[-1], output[-3000:]
        return state, output

    def _ask(self, request: list) -> tuple[str, str]:
        """Hands the world's Airflow process one request; its state and output."""
        if self._runner is None:
            self._runner = subprocess.Popen([sys.executable, "-u", "-c", AIRFLOW_RUNNER], env=self.env, text=True,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._runner.stdin.write(json.dumps(request) + "\n")
        self._runner.stdin.flush()
        lines = []
        for line in self._runner.stdout:
            if line.startswith(RUN_END):
                return json.loads(line[len(RUN_END):]), "".join(lines)
            lines.append(line)
        raise AssertionError(f"the Airflow process ended: {''.join(lines)[-3000:]}")

    def close(self) -> None:
        if self._runner is not None:
            self._runner.stdin.close()  # it ends at the end of its input
            try:
                self._runner.wait(timeout=60)
            except subprocess.TimeoutExpired:  # slow to end is not what a test asserts
                self._runner.kill()
                self._runner.wait()
            self._runner = None


RUN_END = "TRAILBOUND-TEST-RUN-END "
# One Airflow process per world: reads requests, one JSON line each, and ends each one's
# output with a line naming its state. ["test", dag_id, logical date, conf] runs the DAG
# as the demos do (trailbound_airflow.dagtest: `airflow dags test`'s DAG.test, the run's
# real start recorded); ["cli",
# args] runs `airflow *args` as airflow/__main__.py does. The world's environment (set
# before its first request) is the process's.
AIRFLOW_RUNNER = f"""
import json, sys
from datetime import datetime
from airflow.cli import cli_parser
from airflow.configuration import write_default_airflow_configuration_if_needed
from trailbound_airflow.dagtest import test_run

for line in sys.stdin:
    kind, *request = json.loads(line)
    try:
        if kind == "test":
            dag_id, logical_date, conf = request
            run = test_run(dag_id, datetime.fromisoformat(logical_date), conf)
            state = getattr(run.state, "value", str(run.state))
        else:
            write_default_airflow_configuration_if_needed()
            args = cli_parser.get_parser().parse_args(request[0])
            args.func(args)
            state = "success"
    except BaseException as error:
        state = "error: " + repr(error)
    print(flush=True)
    print({RUN_END!r} + json.dumps(state), flush=True)
"""

def replica_rows(target_dsn: str) -> list[tuple]:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT id, note FROM shop.orders ORDER BY id")
        return cur.fetchall()


@pytest.mark.long_running(115)
def test_capture_pump_replicat_monitor_and_control_dags_reach_the_truth(tmp_path, store, target_dsn, monkeypatch,
                                                                       request, spark_remote):
    config_path = write_world(tmp_path, long_xids=("LONG", "SKIPME"))
    world = AirflowWorld(tmp_path, config_path, store.connection.dsn, target_dsn, spark_remote)
    request.addfinalizer(world.close)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    assert cli.main(["--config", str(config_path), "target", "create"]) == 0

    state, output = world.dags_test("capture_ext1", 4)
    assert state == "success", output[-3000:]
    assert "PASSED: " in output, "the Great Expectations validation ran on the new trail files"
    assert "INFO SparkContext" not in output and "Running Spark version" not in output, "Spark logs at WARN"
    assert [xid for xid, _ in transactions(committed_trail(store, world.config))] == ["S0", "S1", "S2", "S3"]
    published, = world.asset_events("trailbound://trail/dirdat/lt")
    assert published["new_files"] == ["lt000000001"] and published["write_position"].startswith("1:"), published
    assert published["last_csn"].startswith(f"{3 * 3600 + 20}@"), "the last commit written: S3's"

    state, output = world.dags_test("longtrans_ext1", 4)
    assert state == "failed", "the monitor alerts: LONG and SKIPME are open 3.5 h, the limit is 3 h"
    assert "'LONG'" in output and "'SKIPME'" in output and "start position 1:1:2" in output
    assert "trailbound alert: DAG longtrans_ext1 run" in output and "task long_running_transactions" in output
    assert pages(tmp_path) == [["longtrans_ext1", "long_running_transactions"]], "the configured notifier fired"

    state, output = world.dags_test("control", 4, {"command": "skiptrans", "group": "EXT1", "argument": "SKIPME"})
    assert state == "success" and "recorded as directive" in output
    state, output = world.dags_test("control", 4, {"command": "skiptrans", "group": "REP1", "argument": "X"})
    assert state == "failed" and "skiptrans applies to a extract group; REP1 is a replicat" in output
    state, output = world.dags_test("control", 4, {"command": "register_logretention", "group": "EXT1",
                                                   "argument": ""})
    assert state == "success" and "EXTRACT EXT1 registered with logretention" in output

    for dag_id in ("pump_pmp1", "replicat_rep1"):
        state, output = world.dags_test(dag_id, 4)
        assert state == "success", output[-3000:]
        assert f"{dag_id.split('_')[0]} {dag_id.split('_')[1].upper()} runs in this task on the Spark Connect server" \
            in output, "a client of the Connect server: no spark-submit, no JVM in the task"
    assert "PASSED: 1 target tables against the trail as applied through" in output
    assert replica_rows(target_dsn) == [(100_000 + h, f"n{100_000 + h}") for h in range(4)]

    for dag_id in ("capture_ext1", "longtrans_ext1", "pump_pmp1", "replicat_rep1"):
        state, output = world.dags_test(dag_id, 8)
        assert state == "success", f"{dag_id}: {output[-3000:]}"
    assert "PASSED: 1 target tables against truth.json (complete state)" in output
    # Each run of a stage records its own DAG run (the console links each lag point to it),
    # and Airflow shows each DAG run's real start, not its logical date weeks ago.
    with sqlite3.connect(world.home / "airflow.db") as airflow_db:
        dag_runs = airflow_db.execute("SELECT dag_id, run_id, start_date, end_date FROM dag_run WHERE dag_id IN"
                                      " ('capture_ext1', 'pump_pmp1', 'replicat_rep1')").fetchall()
    recorded = {(kind, run.airflow_dag_id, run.airflow_run_id) for kind, group in
                (("extract", "EXT1"), ("pump", "PMP1"), ("replicat", "REP1")) for run in runlog.history(store, kind, group)}
    assert recorded == {({"capture_ext1": "extract", "pump_pmp1": "pump", "replicat_rep1": "replicat"}[dag_id],
                         dag_id, run_id) for dag_id, run_id, _, _ in dag_runs}, (recorded, dag_runs)
    assert len(dag_runs) == 6
    now = datetime.now(timezone.utc)
    for dag_id, run_id, start, end in dag_runs:
        start, end = (datetime.fromisoformat(t).replace(tzinfo=timezone.utc) for t in (start, end))
        assert now - timedelta(minutes=30) < start <= end <= now, (dag_id, run_id, start, end)
    points = status.lag_history(store, "replicat", "REP1")
    assert len({p.airflow_run_id for p in points}) == len(points) == 2 and None not in {p.airflow_run_id
                                                                                         for p in points}
    written = [xid for xid, _ in transactions(committed_trail(store, world.config))]
    assert written == ["S0", "S1", "S2", "S3", "S4", "S5", "S6", "S7", "LONG"], \
        "the skipped transaction never reaches the trail"
    truth = json.loads((tmp_path / "truth.json").read_text())["tables"]["shop.orders"]["rows"]
    assert replica_rows(target_dsn) == [(row["id"], row["note"]) for row in truth]

    segments = sorted(path.name for path in (tmp_path / "archive").glob("arch_*.parquet"))
    state, output = world.dags_test("retention", 8)
    assert state == "success" and "Source SRC (retention run #1)" in output, output[-3000:]
    left = sorted(path.name for path in (tmp_path / "archive").glob("arch_*.parquet"))
    assert "arch_1_000000001.parquet" in segments and "arch_1_000000001.parquet" not in left, \
        "retention purged the segments every registered capture is past"
    assert left and set(left) < set(segments), "the newest hour of log stays (minkeephours 1)"
    published, = world.asset_events("trailbound://retention/archive")
    trail_purge = published["trail_purge"]  # PURGEOLDEXTRACTS on the retention schedule too
    assert trail_purge[str(tmp_path / "dirdat" / "lt")]["purged_files"] == [1], trail_purge
    assert not (tmp_path / "dirdat" / "lt000000001").exists() and (tmp_path / "dirdat" / "lt000000002").exists()
    published = published["SRC"]
    assert published["purged_segments"] == len(segments) - len(left) and published["run_id"] == 1, \
        "the retention Asset event says what was purged"

    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("UPDATE shop.orders SET note = 'changed behind replicat' WHERE id = 1003")
    state, output = world.dags_test("replicat_rep1", 8)
    assert state == "failed" and "differing: shop.orders" in output, "the replica check notices a changed row"
    assert pages(tmp_path) == [["longtrans_ext1", "long_running_transactions"], ["control", "run_command"],
                               ["replicat_rep1", "check_replica"]], "every failed run paged; no successful one did"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serving(log: Path, port: int) -> bool:
    """Has the server logging to `log` bound `port` (uvicorn says so once it has)?"""
    text = log.read_text() if log.exists() else ""
    return any(f":{port}" in line for line in text.splitlines() if "Uvicorn running on" in line)


def start_api_server(env: dict, log: Path) -> tuple[subprocess.Popen, int]:
    """`airflow api-server` on a free port (set in `env` for the processes started after
    it), once its log says it bound that port. A free port may be taken by another
    process before the server binds it (the server then exits, and that process would
    answer in its place): then another port, three times at most."""
    for _ in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env.update({"AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__BASE_URL": url,
                    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/"})
        server = subprocess.Popen([str(VENV_BIN / "airflow"), "api-server"], env=env, stdout=open(log, "w"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 240
        while server.poll() is None and not serving(log, port):
            if time.monotonic() > deadline:
                stop_process_groups([server])
                raise AssertionError(f"the API server did not bind port {port}:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        if server.poll() is None:
            return server, port
    raise AssertionError(f"the API server exited three times:\n{log.read_text()[-3000:]}")


def list_runs(world: AirflowWorld, dag_id: str) -> list[dict]:
    """The DAG's runs (state, logical_date) from Airflow's database: what `airflow dags
    list-runs` prints, read without starting an Airflow process every poll."""
    with sqlite3.connect(world.home / "airflow.db", timeout=30) as airflow_db:
        rows = airflow_db.execute("SELECT state, logical_date FROM dag_run WHERE dag_id = ?", (dag_id,)).fetchall()
    return [{"state": state, "logical_date": str(logical_date).replace(" ", "T", 1)} for state, logical_date in rows]


def trail_contents(directory: Path) -> list[tuple[str, list[dict]]]:
    """Each committed trail file's name and records, for comparing two trails."""
    return [(path.name, trail.read_file(path).to_pylist()) for path in sorted(directory.glob("lt*"))]


@pytest.mark.long_running(180)
def test_a_backfill_over_two_intervals_gives_the_trail_of_the_scheduled_runs_and_reruns_are_no_ops(
        tmp_path, spark, store, new_metadata_database, spark_remote):
    # Scheduled runs, as their job runs them: capture with --until each interval's end.
    scheduled = tmp_path / "scheduled"
    scheduled.mkdir()
    config = configuration.load(write_world(scheduled, total_hours=3, commit_hour=1))
    for hour in (1, 2):
        run_extract(spark, store, config, "EXT1", until=T0 + timedelta(hours=hour))

    # The same archive, backfilled through Airflow: `airflow backfill create` queues one run
    # per interval and a real scheduler (LocalExecutor, the API server for task execution)
    # runs them; the scheduler makes no runs of its own (use_job_schedule off).
    backfilled = tmp_path / "backfilled"
    backfilled.mkdir()
    world = AirflowWorld(backfilled, write_world(backfilled, total_hours=3, commit_hour=1), new_metadata_database(),
                         "postgresql://nobody@127.0.0.1:1/none", spark_remote)
    world.env.update({"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                      "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False", "AIRFLOW__CORE__PARALLELISM": "2"})
    world.airflow("dags", "reserialize")
    world.airflow("dags", "unpause", "capture_ext1")
    world.airflow("backfill", "create", "--dag-id", "capture_ext1", "--from-date", T0.isoformat(),
                  "--to-date", (T0 + timedelta(hours=1)).isoformat(), "--max-active-runs", "1",
                  "--reprocess-behavior", "failed")
    servers = []

    def start(command: str) -> None:
        log = open(backfilled / f"{command}.log", "w")
        servers.append(subprocess.Popen([str(VENV_BIN / "airflow"), command], env=world.env, stdout=log, stderr=log,
                                        start_new_session=True))

    try:
        # The scheduler starts once the API server serves: a task it launched before
        # would fail to reach the execution API and wait out its retry delay.
        servers.append(start_api_server(world.env, backfilled / "api-server.log")[0])
        start("scheduler")
        deadline = time.monotonic() + 600
        while True:
            runs = list_runs(world, "capture_ext1")
            states = sorted(run["state"] for run in runs)
            if states == ["success"] * 2 or "failed" in states or time.monotonic() > deadline:
                break
            time.sleep(1)  # a read of the SQLite file: polling often costs nothing, a late look costs the wait
    finally:
        stop_process_groups(servers)
    assert states == ["success"] * 2, (backfilled / "scheduler.log").read_text()[-3000:]
    assert sorted(run["logical_date"][:19] for run in runs) == [
        (T0 + timedelta(hours=h)).isoformat()[:19] for h in range(2)], "one run per interval"

    expected = trail_contents(scheduled / "dirdat")
    assert [name for name, _ in expected] == ["lt000000001", "lt000000002"]
    assert trail_contents(backfilled / "dirdat") == expected, "the backfill wrote the scheduled runs' trail"

    # Running a past interval again changes nothing: no trail file, the same checkpoints.
    with MetadataStore.open(world.env["TRAILBOUND_METADATA_DSN"]) as backfill_store:
        with backfill_store.transaction() as cur:
            before = capture_checkpoints.load(cur, "EXT1")
        state, output = world.dags_test("capture_ext1", 2)
        world.close()
        assert state == "success", output[-3000:]
        with backfill_store.transaction() as cur:
            after = capture_checkpoints.load(cur, "EXT1")
    assert trail_contents(backfilled / "dirdat") == expected
    assert (after.write, after.read_scn) == (before.write, before.read_scn)


def test_a_run_pulls_while_the_archive_does_not_reach_its_interval_a_backfill_never(tmp_path):
    """The retry of a pull that failed (a source restart) must pull again, however old its
    interval has become: found by `make soak`, where the retry skipped its pull and capture
    waited for an archive only the next run could pull, which could not start."""
    from types import SimpleNamespace

    from trailbound.archive.segments import discover, threads_short_of
    from trailbound_airflow.dags import pulls

    long_running_archive(tmp_path, total_hours=3, long_xids=("LONG",), commit_hour=1)
    segments = discover(tmp_path / "archive")
    end = max(s.next_time for s in segments)
    assert threads_short_of(segments, end) == [] and threads_short_of(segments, T0 + timedelta(hours=1)) == []
    assert threads_short_of(segments, end + timedelta(seconds=1)) == sorted({s.thread for s in segments}) != []
    assert threads_short_of([], end) is None, "nothing archived yet: every run pulls"
    scheduled, backfill = SimpleNamespace(run_type="scheduled"), SimpleNamespace(run_type="backfill")
    assert pulls(scheduled, threads_short_of(segments, end + timedelta(hours=5)) != [])
    assert not pulls(scheduled, threads_short_of(segments, T0 + timedelta(hours=1)) != [])
    assert not pulls(backfill, threads_short_of(segments, end + timedelta(hours=5)) != [])


@pytest.mark.pg
@pytest.mark.long_running(100)
def test_a_postgres_sources_capture_dag_pulls_first_and_a_backfilled_interval_does_not_pull(
        tmp_path, store, target_dsn, source_dsn, monkeypatch, spark_remote):
    from datetime import UTC, datetime


    execute(source_dsn, "CREATE TABLE public.items (id int PRIMARY KEY, note text)")
    config_path = write_pg_config(tmp_path, tables=("public.items",))
    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    assert cli.main(["--config", str(config_path), "add", "source", "PG"]) == 0
    monkeypatch.delenv(SOURCE_ENV)
    world = AirflowWorld(tmp_path, config_path, store.connection.dsn, target_dsn, spark_remote)
    # The DAG's pull finds the source through its Airflow connection (conn_id), not the variable.
    world.env.pop(SOURCE_ENV, None)
    world.env["AIRFLOW_CONN_SOURCE_PG"] = as_uri(source_dsn)
    execute(source_dsn, "INSERT INTO public.items SELECT g, 'n' || g FROM generate_series(1, 300) g",
            "UPDATE public.items SET note = 'changed' WHERE id <= 50")

    # The current interval ends after those commits (a whole second later: the logical date has no fraction).
    now = (datetime.now(UTC) + timedelta(seconds=1)).replace(microsecond=0)
    # This test runs the `airflow dags test` command line itself (the others use run_dag).
    done = subprocess.run([str(VENV_BIN / "airflow"), "dags", "test", "capture_ext1", now.isoformat()],
                          env=world.env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert "DagRun Finished" in output and "state=success" in output.split("DagRun Finished")[-1], output[-3000:]
    assert "Source PG: pulled 350 change(s), 2 commit(s)" in output, output[-3000:]
    records = committed_trail(store, world.config)
    assert sorted(r["op"] for r in records if r["table"] == "public.items") == ["INSERT"] * 300 + ["UPDATE"] * 50, \
        f"the run pulled the slot, then captured what it archived: {output[-3000:]}"
    confirmed = slot_confirmed(source_dsn)
    segments = sorted(path.name for path in (tmp_path / "archive").glob("arch_*"))

    # A past interval already archived (a cleared old run) captures what is archived and
    # does not read the live slot: the new change stays in the slot for the current run.
    execute(source_dsn, "INSERT INTO public.items VALUES (1000, 'later')")
    past = now - timedelta(hours=2)
    done = subprocess.run([str(VENV_BIN / "airflow"), "dags", "test", "capture_ext1", past.isoformat()],
                          env=world.env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert "state=success" in output.split("DagRun Finished")[-1], output[-3000:]
    assert "the archive already reaches this interval's end" in output
    assert slot_confirmed(source_dsn) == confirmed
    assert sorted(path.name for path in (tmp_path / "archive").glob("arch_*")) == segments


@pytest.mark.long_running(60)
def test_every_operator_action_runs_through_the_control_dag(tmp_path, spark, store, target_dsn, spark_remote):
    """One Airflow process runs the control DAG once per command (what `airflow dags
    test control DATE --conf` does, without an interpreter start per command)."""
    config_path = write_world(tmp_path, long_xids=("LONG", "SKIPME"))
    world = AirflowWorld(tmp_path, config_path, store.connection.dsn, target_dsn, spark_remote)
    base = ["--config", str(config_path)]
    os.environ["TRAILBOUND_METADATA_DSN"] = store.connection.dsn
    try:
        for hour in (2, 4):  # two trail files, LONG and SKIPME still open
            assert cli.main([*base, "extract", "run", "EXT1", "--until", (T0 + timedelta(hours=hour)).isoformat()]) == 0
        assert cli.main([*base, "pump", "run", "PMP1"]) == 0  # PMP1 has read both files of dirdat/lt
    finally:
        del os.environ["TRAILBOUND_METADATA_DSN"]
    commands = [("skiptrans", "EXT1", "SKIPME"), ("forcetrans", "EXT1", "LONG"), ("brreset", "EXT1", ""),
                ("showtrans", "EXT1", ""), ("register_logretention", "EXT1", ""),
                ("unregister_logretention", "EXT1", ""), ("alter_replicat", "REP1", "atcsn 3620"),
                ("alter_replicat", "REP1", "aftercsn 7220"), ("purge_trails", "EXT1", ""),
                ("alter_extract_begin", "EXT1", "scn 7200"), ("forcetrans", "REP1", "X")]
    confs = [{"command": c, "group": g, "argument": a} for c, g, a in commands]
    runs, output = [], ""
    for index, conf in enumerate(confs):  # one Airflow process runs them all (AirflowWorld.run_dag)
        state, run_output = world.run_dag("control", T0 + timedelta(hours=5, minutes=index), conf)
        finished = next(line for line in reversed(run_output.splitlines()) if "DagRun Finished" in line)
        runs.append((finished.split("run_id=", 1)[1].split(",", 1)[0], state))
        output += run_output
    world.close()
    assert [state for _, state in runs] == ["success"] * (len(commands) - 1) + ["failed"], output[-4000:]
    with sqlite3.connect(world.home / "airflow.db") as airflow_db:
        returned = dict(airflow_db.execute("SELECT run_id, value FROM xcom WHERE dag_id = 'control' "
                                           "AND task_id = 'run_command' AND key = 'return_value'").fetchall())
    said = [json.loads(returned[run_id]) if run_id in returned else "" for run_id, _ in runs]
    assert "skiptrans for transaction 'SKIPME'" in said[0] and "recorded as directive" in said[0]
    assert "forcetrans for transaction 'LONG'" in said[1]
    assert "brreset recorded as directive" in said[2]
    assert "'LONG'" in said[3] and "'SKIPME'" in said[3]
    assert "registered with logretention" in said[4] and "unregistered" in said[5]
    assert "atcsn 3620" in said[6] and "aftercsn 7220" in said[7]
    assert "purged seqno 1" in said[8] and "kept seqno 2" in said[8]
    assert not (tmp_path / "dirdat" / "lt000000001").exists() and (tmp_path / "dirdat" / "lt000000002").exists()
    assert "forcetrans applies to a extract group; REP1 is a replicat" in output

    with store.transaction() as cur:
        cur.execute("SELECT kind, xid FROM trailbound.extract_directive ORDER BY directive_id")
        assert [(r["kind"], r["xid"]) for r in cur.fetchall()][:3] == [("skiptrans", "SKIPME"), ("forcetrans", "LONG"),
                                                                      ("brreset", None)]
        extract = capture_checkpoints.load(cur, "EXT1")
    assert extract.begin_spec == "scn 7200"
