"""The Airflow layer: DAG integrity, and the DAGs run for real with `airflow dags test`
(Airflow 3, its own SQLite metadata database in a temporary AIRFLOW_HOME, Spark through
SparkSubmitOperator and the spark_default connection set to local[*])."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import psycopg2.extensions
import pytest

from capture_kit import T0, committed_trail, transactions
from test_bounded_recovery import long_running_archive
from trailbound import config as configuration
from trailbound import dagfiles

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def airflow_env(home: Path, dags: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False", "PYTHONPATH": str(REPO / "plugins"),
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
        "               'doc': bool(d.doc_md), 'max_active_runs': d.max_active_runs} for d in bag.dags.values()}}))\n")
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
    assert dags["capture_ext1"]["schedule"] == "DeltaDataIntervalTimetable(delta=datetime.timedelta(seconds=900))"
    assert catcher.connections == 0, "parsing DAG files must not connect anywhere"


@pytest.fixture
def airflow_world(tmp_path, store, spark):
    """An archive with a long transaction, its configuration and DAG files, and an
    initialised Airflow home; returns a runner for `airflow dags test`."""
    long_running_archive(tmp_path, total_hours=8, commit_hour=7)
    config_path = tmp_path / "trailbound.yaml"
    config_path.write_text(
        f"home: {tmp_path}\nsources:\n  SRC:\n    altarchivelogdest: archive\n"
        "extracts:\n  EXT1:\n    source: SRC\n    exttrail: dirdat/lt\n    table: ['shop.*']\n    interval: 1h\n"
        "    br:\n      brdir: brfiles\n      brinterval: 1h\n"
        "    warnlongtrans:\n      duration: 3h\n      checkinterval: 1h\n"
        f"airflow:\n  start_date: {T0.isoformat()}\n")
    config = configuration.load(config_path)
    dags = tmp_path / "dags"
    dagfiles.generate(config, dags)
    env = airflow_env(tmp_path / "airflow", dags, {
        "TRAILBOUND_CONFIG": str(config_path), "TRAILBOUND_METADATA_DSN": store.connection.dsn,
        "AIRFLOW_CONN_TRAILBOUND_METADATA": as_uri(store.connection.dsn)})
    migrated = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True,
                              timeout=300)
    assert migrated.returncode == 0, migrated.stderr[-2000:]

    def dags_test(dag_id: str, hour: int, conf: dict | None = None) -> tuple[str, str]:
        command = [str(VENV_BIN / "airflow"), "dags", "test", dag_id, (T0 + timedelta(hours=hour)).isoformat()]
        if conf:
            command += ["--conf", json.dumps(conf)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        output = done.stdout + done.stderr
        finished = [line for line in output.splitlines() if "DagRun Finished" in line]
        assert finished, output[-3000:]
        return ("success" if "state=success" in finished[-1] else "failed"), output

    return config, dags_test


def test_capture_monitor_and_control_dags_end_to_end(airflow_world, store):
    config, dags_test = airflow_world
    state, output = dags_test("capture_ext1", 4)
    assert state == "success", output[-3000:]
    assert "PASSED: " in output, "the Great Expectations validation ran on the new trail files"
    assert [xid for xid, _ in transactions(committed_trail(store, config))] == ["S0", "S1", "S2", "S3"]

    state, output = dags_test("longtrans_ext1", 4)
    assert state == "failed", "the monitor alerts: LONG is open 3.5 h, the limit is 3 h"
    assert "'LONG'" in output and "start position 1:1:2" in output

    state, output = dags_test("control", 4, {"command": "skiptrans", "group": "EXT1", "xid": "LONG", "value": ""})
    assert state == "success" and "recorded as directive" in output
    state, _ = dags_test("capture_ext1", 5)
    assert state == "success"
    state, output = dags_test("longtrans_ext1", 5)
    assert state == "success", "quiet once the long transaction is skipped"

    state, _ = dags_test("capture_ext1", 8)
    assert state == "success"
    written = [xid for xid, _ in transactions(committed_trail(store, config))]
    assert written == [f"S{h}" for h in range(8)], "the skipped transaction never reaches the trail"
