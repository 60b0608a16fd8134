"""A local Spark Connect server: the Spark that outlives the runs, for the demo, Airflow
and the test suite.

    python -m trailbound.devtools.sparkconnect start DIR    # start (or find running), print its address
    python -m trailbound.devtools.sparkconnect env DIR      # print SPARK_REMOTE=sc://127.0.0.1:PORT
    python -m trailbound.devtools.sparkconnect status DIR   # "running sc://..." (exit 0) or "stopped" (exit 1)
    python -m trailbound.devtools.sparkconnect stop DIR

The server is Spark 4's own (`org.apache.spark.sql.connect.service.SparkConnectServer`,
shipped in pyspark's jars), started with pyspark's spark-submit. It listens on 127.0.0.1
only, on a free port chosen at start and kept in DIR/port; DIR/pid is its process and
DIR/server.log its output. The master is $SPARK_MASTER, else local[*] (point it at a
cluster's master to run there). A client's commands run trailbound's Python code in the
server's Python workers, so the server starts them with this interpreter
(PYSPARK_PYTHON) and a PYTHONPATH that holds trailbound's package. On a cluster the
executors need trailbound too: ship it as an artifact (`spark.addArtifacts(zip,
pyfile=True)` from a client, or `--py-files trailbound.zip` here).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trailbound.devtools.localpg import accepts, free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_submit() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-submit"


def server_conf(master: str) -> dict[str, str]:
    """The server's --conf: trailbound's session settings (the JVM-wide ones can only be
    given here), and the parallelism a client reads (trailbound.spark.parallelism)."""
    from trailbound.spark import SESSION_CONF, TUNING_DEFAULTS

    conf = dict(SESSION_CONF) | dict(TUNING_DEFAULTS)
    conf["spark.connect.grpc.binding.address"] = "127.0.0.1"
    # C1 only: the server compiles new generated classes for every capture run (each run's
    # literals differ), and C2's compiling cost more than its faster code saved. Measured on
    # the 1M live backlog (docs/benchmarks/live-postgres.md): capture 69.7 and 72.2 CPU-s of
    # the server against 90.1 and 98.7, its start 10-11 against 20 CPU-s.
    conf["spark.driver.extraJavaOptions"] = "-XX:TieredStopAtLevel=1"
    # The clients share one session (trailbound.spark.connect_session): keep it through a
    # night or a weekend without runs (Spark's default closes it after an idle hour, and each
    # closing leaves its Python daemon behind until the server stops).
    conf["spark.connect.session.manager.defaultSessionTimeout"] = "7d"
    if master.startswith("local"):
        inside = master[master.find("[") + 1:master.find("]")] if "[" in master else "1"
        conf["spark.default.parallelism"] = inside if inside.isdigit() else str(os.cpu_count() or 1)
    return conf


@dataclass(frozen=True)
class ConnectServer:
    directory: Path

    @property
    def pid_file(self) -> Path:
        return self.directory / "pid"

    @property
    def port_file(self) -> Path:
        return self.directory / "port"

    @property
    def log_file(self) -> Path:
        return self.directory / "server.log"

    @property
    def port(self) -> int:
        return int(self.port_file.read_text())

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def _pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text())
            os.kill(pid, 0)
            return pid
        except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            return None

    def is_running(self) -> bool:
        return self._pid() is not None and self.port_file.exists() and accepts(self.port)

    def environment(self) -> dict[str, str]:
        """The server's environment: its Python workers import trailbound (see the module's
        docstring)."""
        from trailbound.spark import workers_import_trailbound

        env = dict(os.environ)
        env.pop("SPARK_REMOTE", None)
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env["PYSPARK_PYTHON"] = env.get("PYSPARK_PYTHON") or sys.executable
        return workers_import_trailbound(env)

    def start(self, master: str | None = None, timeout: float = 180.0, *, port: int | None = None,
              warm: bool = True) -> "ConnectServer":
        """Starts the server (unless it runs), on `port` (a restart keeps the address its
        clients know) or a free one, and warms it (`warm_up`)."""
        if self.is_running():
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        master = master or os.environ.get("SPARK_MASTER", "local[*]")
        port = port or free_port()
        self.port_file.write_text(str(port))
        command = [str(spark_submit()), "--class", SERVER_CLASS, "--master", master, "--name", "trailbound-connect",
                   "--conf", f"spark.connect.grpc.binding.port={port}"]
        for key, value in server_conf(master).items():
            command += ["--conf", f"{key}={value}"]
        command.append("spark-internal")
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=self.environment(), start_new_session=True)
        self.pid_file.write_text(str(process.pid))
        deadline = time.monotonic() + timeout
        while not accepts(port):
            if process.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited ({process.returncode}); see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not listen on {self.url} within {timeout:.0f} s; "
                                   f"see {self.log_file}")
            time.sleep(0.25)
        if warm:
            self.warm_up()
        return self

    def warm_up(self) -> None:
        """One small job in the clients' shared session, so that the first run does not pay
        the server's first job: the Python worker daemon's start, the engine's imports in a
        worker per core, the JVM's first compilations. A capture's first job on a server
        just started took 9.5 s more than on one that had run anything
        (docs/benchmarks/live-postgres.md); a service is ready when it is warm."""
        from trailbound.spark import connect_session, parallelism, run_tasks

        spark = connect_session(self.url)
        try:
            run_tasks(spark, _import_the_engine, list(range(parallelism(spark))))
        finally:
            spark.stop()

    def stop(self, timeout: float = 30.0) -> None:
        pid = self._pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return
        try:
            os.killpg(pid, signal.SIGTERM)  # its own session: spark-submit and the JVM it runs
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while self._pid() is not None and time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)  # reap it when this process started it
            except ChildProcessError:
                pass
            time.sleep(0.2)
        if self._pid() is not None:
            os.killpg(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)


def _import_the_engine(_) -> None:
    """What every run's tasks import first (run in the server's Python workers)."""
    import pyarrow.compute  # noqa: F401
    import pyarrow.json  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import trailbound.archive.segments  # noqa: F401
    import trailbound.capture.onetask  # noqa: F401
    import trailbound.capture.logread  # noqa: F401
    import trailbound.trail.format  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trailbound.devtools.sparkconnect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "status", "env"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--master", help="Spark master (default $SPARK_MASTER, else local[*])")
    args = parser.parse_args(argv)
    server = ConnectServer(args.directory.resolve())
    if args.action == "start":
        began = time.monotonic()
        server.start(args.master)
        print(f"Spark Connect server on {server.url} (log {server.log_file}; up after "
              f"{time.monotonic() - began:.1f} s)")
    elif args.action == "stop":
        server.stop()
    elif args.action == "status":
        running = server.is_running()
        print(f"running {server.url}" if running else "stopped")
        return 0 if running else 1
    elif args.action == "env":
        if not server.port_file.exists():
            print(f"no Spark Connect server in {server.directory}; start it first", file=sys.stderr)
            return 1
        print(f"SPARK_REMOTE={server.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
