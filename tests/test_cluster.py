"""No silent loss on a real cluster (docs/reliability.md).

The suite starts a Spark standalone cluster on 127.0.0.1: a master and one worker with
its own work directory (one core, small memory), stopped at the end. Jobs reach it the
way Airflow's tasks do: SparkSubmitHook through the `spark_default` connection, given
as AIRFLOW_CONN_SPARK_DEFAULT = spark://127.0.0.1:PORT.

- capture, pump and replicat run as spark-submit jobs against the cluster (capture's
  executors on the worker; pump and replicat of local trails start no session) and the
  target reaches the simulator's truth;
- Spark tasks write files on the worker and the driver verifies each one before a
  checkpoint may count on it (`trailbound.files.write_dataset`). The worker runs in its
  own mount namespace in which one directory, `private/`, is a tmpfs of its own: a real
  directory the driver does not share, as a worker's local disk is on a real cluster.
  Written there, the files exist on the worker only, and the driver refuses with one line
  naming the file; written to a shared directory, every record is there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import psycopg2
import pytest

from process_kit import stop_process_groups
from replicat_kit import differences, row_counts

pytestmark = [pytest.mark.pg]

REPO = Path(__file__).resolve().parents[1]
START = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class Cluster:
    """A standalone master and one worker, as subprocesses of this test session (each in
    a process group of its own, so stopping it stops the executors it started)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.private = directory / "private"      # the worker's own: a tmpfs in its mount namespace
        self.shared = directory / "shared"
        self.work = directory / "worker-work"
        self.port = self.ui_port = 0  # known once the master has bound them (start)
        self.master = ""
        self.processes: list[subprocess.Popen] = []
        self.logs = directory / "logs"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
                "SPARK_HOME": str(_spark_home()), "SPARK_NO_DAEMONIZE": "1"}

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")
        process = subprocess.Popen(argv, env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def start(self) -> "Cluster":
        for directory in (self.private, self.shared, self.work, self.logs):
            directory.mkdir(parents=True)
        spark_class = str(_spark_home() / "bin" / "spark-class")
        # Port 0: the master and the web UIs bind free ports themselves, and the master's are
        # read from its log. A port probed free here could be taken before the JVM binds it
        # (Spark then moves to the next one, and the worker and the test would look for the
        # master where it is not).
        self._start("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", "0", "--webui-port", "0"])
        self.port = self._bound_port("master", "sparkMaster")
        self.ui_port = self._bound_port("master", "MasterUI")
        self.master = f"spark://127.0.0.1:{self.port}"
        worker = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "1g", "--work-dir", str(self.work), "--webui-port", "0", self.master]
        # The worker's own mount namespace: `private` is a tmpfs only it (and the
        # executors it starts) sees; everything else is the machine's one filesystem.
        self._start("worker", ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               'mount -t tmpfs -o size=64m trailbound-private "$0" && exec "$@"',
                               str(self.private), *worker])
        self._wait_for_worker()
        return self

    def _check_running(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"a cluster process exited ({process.args[:2]}): "
                                   + "".join(p.read_text()[-2000:] for p in self.logs.iterdir()))

    def _bound_port(self, name: str, service: str, seconds: float = 300) -> int:
        """The port process `name` says (in its log) that `service` bound."""
        bound = re.compile(rf"Successfully started service '{service}' on port (\d+)")
        deadline = time.monotonic() + seconds
        while not (found := bound.search((self.logs / f"{name}.log").read_text(errors="replace"))):
            self._check_running()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {name} never said which port {service} bound")
            time.sleep(0.5)
        return int(found.group(1))

    def _wait_for_worker(self, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._check_running()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
                    state = json.load(response)
                if any(w["state"] == "ALIVE" for w in state.get("workers", [])):
                    return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError("the standalone worker never registered with the master")

    def worker_sees(self, path: Path) -> list[str]:
        """The names in `path` as the worker's mount namespace shows them."""
        pid = self.processes[1].pid
        listing = subprocess.run(["nsenter", "-t", str(pid), "-m", "ls", "-1", str(path)], capture_output=True,
                                 text=True, check=True)
        return sorted(listing.stdout.split())

    def applications(self) -> list[str]:
        """The applications whose executors ran on the worker (its work directory)."""
        return sorted(p.name for p in self.work.iterdir() if p.name.startswith("app-"))

    def stop(self) -> None:
        stop_process_groups(list(reversed(self.processes)), grace=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the worker's private directory needs a mount namespace (root and unshare)")
    started = Cluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def spark_default(cluster, monkeypatch):
    """The `spark_default` connection pointed at the cluster, as Airflow reads it."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT",
                       json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster.port}))
    return cluster


def _submit(application: Path, args: list[str], name: str) -> tuple[bool, str]:
    """One job through SparkSubmitHook and `spark_default`, as SparkSubmitOperator runs
    it: the same conf as the DAGs' tasks, and small executors. Returns whether it
    succeeded, and its output."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk.exceptions import AirflowException

    from trailbound_airflow.dags import SPARK_CONF

    class Recording(SparkSubmitHook):
        """Keeps the job's output lines (the hook only logs them)."""

        lines: list[str] = []

        def _process_spark_submit_log(self, itr):
            def tee():
                for line in itr:
                    self.lines.append(line.rstrip("\n"))
                    yield line
            return super()._process_spark_submit_log(tee())

    conf = {**SPARK_CONF, "spark.executor.memory": "512m", "spark.driver.memory": "512m", "spark.cores.max": "1",
            # What --py-files ships in a deployment: the engine, on the executors' path.
            "spark.executorEnv.PYTHONPATH": f"{REPO / 'include'}:{REPO / 'plugins'}",
            "spark.sql.shuffle.partitions": "2"}
    hook = Recording(conn_id="spark_default", conf=conf, name=name, application_args=args)
    hook.lines = []
    assert hook._connection["master"].startswith("spark://127.0.0.1:"), hook._connection
    try:
        hook.submit(str(application))
    except AirflowException:
        return False, "\n".join(hook.lines)
    return True, "\n".join(hook.lines)


# ---------------------------------------------------------------- the driver verifies what tasks wrote

WRITE_JOB = '''
import sys
from trailbound import files, spark
from trailbound.errors import TrailboundError

session = spark.session("trailbound write_dataset on a cluster")
df = session.range(0, 3000, numPartitions=3).selectExpr("id", "concat('row ', id) AS text")
for directory in sys.argv[1:]:
    try:
        written = files.write_dataset(df, directory, session)
    except TrailboundError as error:
        print(f"ERROR {error}")
        sys.exit(1)
    print("WROTE", sum(f.records for f in written), "records in", len(written), "files to", directory)
'''


@pytest.mark.long_running(150)
def test_the_driver_refuses_files_a_worker_wrote_where_it_cannot_read_them(spark_default, tmp_path):
    cluster = spark_default
    job = tmp_path / "write_job.py"
    job.write_text(WRITE_JOB)
    shared, private = cluster.shared / "staging", cluster.private / "staging"
    # One job (one driver, one executor on the worker): first a directory both see, then
    # one only the worker sees.
    ok, output = _submit(job, [str(shared), str(private)], "trailbound-write")
    assert f"WROTE 3000 records in 3 files to {shared}" in output, output[-3000:]
    assert sorted(p.name for p in shared.iterdir()) == [f"part-0000{n}.parquet" for n in range(3)]

    errors = [line for line in output.splitlines() if line.startswith("ERROR ")]
    assert not ok and len(errors) == 1, output[-3000:]
    assert errors[0].startswith(f"ERROR {private}/part-00000.parquet: a Spark task wrote 1000 records, sha256 ")
    assert "not there as this process sees it" in errors[0] and "nothing was committed" in errors[0]
    assert not private.exists() or not any(private.iterdir()), "the driver's view holds nothing"
    assert cluster.worker_sees(private) == [f"part-0000{n}.parquet" for n in range(3)], \
        "the worker did write them, where only it can read them"


# ---------------------------------------------------------------- the pipeline on the cluster

def _config_text(home: Path) -> str:
    return f"""home: {home}
sources:
  SRC:
    altarchivelogdest: archive
extracts:
  EXT1:
    source: SRC
    exttrail: dirdat/lt
    table: ["shop.*", "hr.*"]
    megabytes: 0.1
pumps:
  PMP1: {{exttrail: dirdat/lt, rmttrail: dirrmt/rt}}
replicats:
  REP1: {{exttrail: dirrmt/rt, source: SRC, grouptransops: 200}}
"""


@pytest.mark.long_running(300)
def test_capture_pump_and_replicat_on_a_standalone_cluster_reach_the_truth(spark_default, tmp_path, metadata_dsn,
                                                                          target_dsn, monkeypatch):
    from trailbound import config as configuration
    from trailbound.archive.segments import load_defs
    from trailbound.replicat import target as tgt
    from trailbound.sources.simulator import simulate

    cluster = spark_default
    home = cluster.shared / "home"
    simulate(home / "archive", tmp_path / "truth.json", seed=5, records=2000, hours=3, segment_minutes=60,
             start=START)
    truth = json.loads((tmp_path / "truth.json").read_text())
    config_path = home / "trailbound.yaml"
    config_path.write_text(_config_text(home))
    config = configuration.load(config_path)
    connection = psycopg2.connect(target_dsn)
    with connection, connection.cursor() as cur:
        tgt.create_tables(cur, load_defs(config.archive_dir("SRC")), config.replicat("REP1").map)
    connection.close()
    for name, value in (("TRAILBOUND_CONFIG", str(config_path)), ("TRAILBOUND_METADATA_DSN", metadata_dsn),
                        ("TRAILBOUND_TARGET_DSN", target_dsn)):
        monkeypatch.setenv(name, value)

    before = set(cluster.applications())
    outputs = []
    for job, group in (("extract.py", "EXT1"), ("pump.py", "PMP1"), ("replicat.py", "REP1")):
        ok, output = _submit(REPO / "jobs" / job, [group], f"trailbound-{job}")
        assert ok, output[-3000:]
        outputs.append(output)
    assert any(line.startswith("Extract EXT1:") and "wrote" in line for line in outputs[0].splitlines()), outputs[0]
    assert "Pump PMP1 (PASSTHRU): read" in outputs[1], outputs[1]
    assert "Replicat REP1:" in outputs[2] and "applied" in outputs[2], outputs[2]
    # Capture ran on the cluster (its one application); pump and replicat needed no Spark
    # session: the trails are local, and replicat nets a few key changes in Python.
    assert len(set(cluster.applications()) - before) == 1

    # Counted, not read from pg_stat_user_tables: a backend reports its row counts there
    # when it has been idle a while or as it exits, and the replicat's sessions may not
    # have exited yet when spark-submit has.
    applied = sum(row_counts(target_dsn, truth).values())
    found = differences(target_dsn, truth)
    assert {name: (extra, missing) for name, (extra, missing, _) in found.items() if extra or missing} == {}
    assert applied and applied > 100, "the target holds real data"
