"""Where the command line's Spark work runs: on a Spark Connect server named by
SPARK_REMOTE / --remote (one clear line when it is down), and, with a local Spark, in
Python workers that import trailbound however the command was started (issue 40 item 6).

The Connect server here is the suite's own JVM (conftest's `spark_remote`), so these
tests start no server of their own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from capture_kit import ins, new_archive, rec, write_config

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def _archive_and_config(home: Path) -> Path:
    archive = new_archive(home)
    archive.segment(1, [ins(10, "A", 1), ins(11, "A", 2), rec(20, "A", "COMMIT"), ins(30, "B", 3),
                        rec(40, "B", "COMMIT")], 100)
    archive.segment(1, [ins(110, "C", 4), rec(120, "C", "ROLLBACK"), ins(130, "D", 5), rec(140, "D", "COMMIT")], 200)
    return write_config(home)


def _cli(config: Path, metadata_dsn: str, *argv: str, env: dict | None = None, command: list[str] | None = None):
    env = {**(os.environ if env is None else env), "TRAILBOUND_METADATA_DSN": metadata_dsn}
    return subprocess.run([*(command or [sys.executable, "-m", "trailbound.cli"]), "--config", str(config), *argv],
                          env=env, capture_output=True, text=True, timeout=600)


def _trail(home: Path) -> list[dict]:
    files = sorted((home / "dirdat").glob("lt*"))
    assert files, f"no trail files under {home / 'dirdat'}"
    return [row for path in files for row in pq.read_table(path).to_pylist()]


def test_a_cli_started_by_its_absolute_path_without_the_venv_on_path_runs_spark_work(tmp_path, metadata_dsn):
    """cron, systemd, a BashOperator: `/path/.venv/bin/trailbound archive scan` with a PATH
    that holds no virtualenv and no PYSPARK_PYTHON. Spark's Python workers used to run
    `python3` from PATH, which cannot import trailbound (nor pyarrow)."""
    config = _archive_and_config(tmp_path)
    console_script = Path(sys.executable).with_name("trailbound")
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_REMOTE", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    # PYTHONPATH stays: it is how this checkout (not the installed one) is under test.
    done = _cli(config, metadata_dsn, "archive", "scan", env=env, command=[str(console_script)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cataloged 2 new segment(s), 9 records" in done.stdout


def test_a_run_whose_spark_connect_server_is_down_fails_with_one_line_naming_it(tmp_path, metadata_dsn):
    config = _archive_and_config(tmp_path)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        address = f"sc://127.0.0.1:{sock.getsockname()[1]}"
    for how in (["--remote", address], []):
        env = {**os.environ, "SPARK_REMOTE": address}
        done = _cli(config, metadata_dsn, *how, "archive", "scan", env=env)
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"ERROR Spark Connect server {address} is not reachable (Connection refused); start it (`python -m "
            "trailbound.devtools.sparkconnect start DIR`, `make connect`) or unset SPARK_REMOTE"], done.stderr
    assert "cataloged" not in done.stdout


def test_capture_on_a_spark_connect_server_writes_the_trail_a_local_spark_writes(
        tmp_path, metadata_dsn, empty_database_dsn, spark, spark_remote, monkeypatch, capsys):
    """One code path for both kinds of session: the same archive captured by a CLI that is
    a Connect client (no JVM in its process) and by the CLI on a local Spark (this
    process's) gives the same trail, record for record."""
    from trailbound import cli

    connect_home, local_home = tmp_path / "connect", tmp_path / "local"
    config = _archive_and_config(connect_home)
    for argv in (["archive", "scan"], ["extract", "run", "EXT1"]):
        # A JAVA_HOME with no Java: a client that tried to start a JVM would fail.
        env = {**os.environ, "SPARK_REMOTE": spark_remote, "JAVA_HOME": str(tmp_path / "no-java")}
        done = _cli(config, metadata_dsn, *argv, env=env)
        assert done.returncode == 0, done.stderr[-3000:]

    config = _archive_and_config(local_home)
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", empty_database_dsn)
    for argv in (["archive", "scan"], ["extract", "run", "EXT1"]):
        assert cli.main(["--config", str(config), *argv]) == 0, capsys.readouterr()
    connect, local = _trail(connect_home), _trail(local_home)
    assert [r["xid"] for r in connect] == ["A", "A", "B", "D"]
    assert connect == local


def test_the_airflow_operator_runs_capture_in_the_task_on_the_spark_connect_connection(
        tmp_path, metadata_dsn, spark_remote):
    """With the Spark provider's `spark_connect_default` connection defined, a capture task
    is that server's client in the task: no spark-submit (its application does not even
    exist here, and the task's JAVA_HOME has no Java), the trail written. The task is a
    process of its own, as an Airflow task is (pyspark refuses a Connect session in a
    process that already runs a local one, as this test process does)."""
    config = _archive_and_config(tmp_path)
    host, port = spark_remote.removeprefix("sc://").split(":")
    task = (
        "import sys\n"
        "from trailbound_airflow.hooks import TrailboundHook\n"
        "from trailbound_airflow.operators import TrailboundSparkSubmitOperator\n"
        "remote = TrailboundHook().spark_remote()\n"
        "print('remote', remote)\n"
        "TrailboundHook().run_command(['archive', 'scan'], remote=remote)\n"
        "task = TrailboundSparkSubmitOperator(kind='capture', group='EXT1', task_id='capture',\n"
        "    application=sys.argv[1], conn_id='spark_default',\n"
        "    application_args=['EXT1', '--until', '2026-11-01T01:00:00+00:00'])\n"
        "assert task.execute({}) is None\n")
    env = {name: value for name, value in os.environ.items() if name != "SPARK_REMOTE"}
    env.update({"AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": host,
                                                                  "port": int(port)}),
                "TRAILBOUND_METADATA_DSN": metadata_dsn, "TRAILBOUND_CONFIG": str(config),
                "JAVA_HOME": str(tmp_path / "no-java"),
                # The plugin package, as Airflow's plugins folder puts it on the task's path.
                "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent / "plugins"),
                                               os.environ.get("PYTHONPATH", "")])})
    done = subprocess.run([sys.executable, "-c", task, str(tmp_path / "no-such-job.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"remote {spark_remote}/" in done.stdout
    assert [r["xid"] for r in _trail(tmp_path)] == ["A", "A", "B", "D"]


_CLIENT = """
import os, sys
from trailbound import spark as sessions
if sys.argv[2:] == ["forget-hint"]:
    sessions._hint_file(sessions._address(sys.argv[1])).unlink(missing_ok=True)
spark = sessions.connect_session(sys.argv[1])
print("workers", sorted(set(sessions.run_tasks(spark, lambda _: os.getpid(), [0, 1]))))
if sys.argv[2:] == ["release"]:  # as a client that closes its session on the server would
    spark.release_session_on_close = True
spark.stop()
"""


def _python_daemons_of(pid: int) -> set[int]:
    """The `pyspark.daemon` processes whose parent is `pid` (the JVM that runs the server)."""
    daemons = set()
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        parent = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if parent == pid and b"pyspark.daemon" in command:
            daemons.add(int(entry.name))
    return daemons


def test_every_client_of_a_server_joins_one_session_so_runs_leave_no_python_daemon_behind(tmp_path):
    """A Connect server keeps a Python daemon per session for as long as it runs, released
    or not: with a session per client, every run of a long-lived server left one more (48 MB
    each). The clients share one session instead: five runs, one daemon, and each run's
    tasks in the Python workers the last one left warm. A client that closes the shared
    session on the server moves the next ones to the next session, not to an error.
    (A server of its own, as `make connect` starts it: the suite's, inside its test JVM,
    runs every session's Python in one daemon.)"""
    from trailbound.devtools.sparkconnect import ConnectServer

    server = ConnectServer(tmp_path / "connect")
    server.start(warm=False)
    try:
        jvm = int(server.pid_file.read_text())

        def client(*argv: str) -> str:
            done = subprocess.run([sys.executable, "-c", _CLIENT, server.url, *argv], capture_output=True,
                                  text=True, timeout=300, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
            assert done.returncode == 0, done.stderr[-3000:]
            return next(line for line in done.stdout.splitlines() if line.startswith("workers"))

        runs = [client() for _ in range(5)]
        assert len(_python_daemons_of(jvm)) == 1
        assert runs[1:] == runs[:-1], runs  # the same warm workers served every run
        client("release")
        client()  # the next generation's session: one daemon more, once
        client()
        assert len(_python_daemons_of(jvm)) == 2
        client("release")
        # A client with no hint of the generation (another host, another home) probes its way
        # past the closed ones to the same session as the others.
        client("forget-hint")
        client()
        assert len(_python_daemons_of(jvm)) == 3
    finally:
        server.stop()
