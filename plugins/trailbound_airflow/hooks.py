"""TrailboundHook: the one place Airflow code reaches trailbound's configuration, its
databases and the engine. Operators, sensors, triggers, the DAG factories' tasks and the
console all go through it; the connection is resolved lazily, never in __init__.

Connections. Every DSN trailbound needs (the metadata store, the target, a live
PostgreSQL source) is resolved by `resolve_dsn`, with one precedence:

1. the Airflow connection the configuration names for it (`conn_id`; for the metadata
   store, the hook's `trailbound_conn_id` when one is given), when it is defined
   (the API server's, the worker's or the triggerer's secrets backends);
2. else the environment variable the configuration names (`dsn_env`), as the command
   line reads it.

Resolved DSNs are handed to the engine as arguments (`dsn=`, `source_dsn=`,
`target_dsn=`, `cli.main(..., dsns=)`), never written to `os.environ`, and never logged.
The one process that gets them in its environment is a spark-submit job's, as a dict
given to that child process (operators.py).

Spark. With a Spark Connect server (`spark_remote`: the `spark_connect_default`
connection, else $SPARK_REMOTE) every run that needs Spark runs in the task as a client
of that server, with no JVM of its own; without one, capture is a spark-submit job and
the work in the task starts a local session.
"""

from __future__ import annotations

import io
import os
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from typing import Callable, Iterator

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException

from trailbound import config as configuration
from trailbound.errors import spark_task_errors_as_ours
from trailbound.metadata import MetadataStore


# The Spark provider's Spark Connect connection (conn type `spark_connect`) that names the
# server every stage's Spark work runs on (docs/orchestration.md).
SPARK_CONNECT_CONN_ID = "spark_connect_default"


class TrailboundHook(BaseHook):
    """Reads the configuration file ($TRAILBOUND_CONFIG, or `config_path`), resolves the
    DSNs (see the module's docstring) and calls the engine with them."""

    conn_name_attr = "trailbound_conn_id"
    default_conn_name = "trailbound_metadata"
    conn_type = "postgres"
    hook_name = "trailbound"

    def __init__(self, trailbound_conn_id: str | None = None, config_path: str | None = None):
        """`trailbound_conn_id`: the metadata store's Airflow connection; None: the one the
        configuration names (`metadata.conn_id`, by default trailbound_metadata)."""
        super().__init__()
        self.trailbound_conn_id = trailbound_conn_id
        self.config_path = config_path
        self._config: configuration.Config | None = None

    @property
    def config(self) -> configuration.Config:
        if self._config is None:
            self._config = configuration.load(self.config_path or os.environ.get(configuration.CONFIG_ENV))
        return self._config

    # ------------------------------------------------------------ connections

    def resolve_dsn(self, conn_id: str, dsn_env: str) -> str | None:
        """The DSN of the Airflow connection `conn_id` when it is defined, else the value of
        the variable `dsn_env`; None when neither is there."""
        try:
            connection = self.get_connection(conn_id)
        except Exception:  # not defined (or no backend can say): the variable, as the CLI reads it
            return os.environ.get(dsn_env) or None
        uri = connection.get_uri()
        return "postgresql://" + uri.split("://", 1)[1] if "://" in uri else uri

    def dsn(self) -> str:
        """The metadata store's DSN (a TrailboundError naming the variable when none is found)."""
        from trailbound.metadata import dsn_from_env

        metadata = self.config.metadata
        return self.resolve_dsn(self.trailbound_conn_id or metadata.conn_id, metadata.dsn_env) or \
            dsn_from_env(metadata.dsn_env)

    def target_dsn(self) -> str | None:
        """The target's DSN; None when neither is there (the engine then says the variable
        is not set, when it needs the target)."""
        target = self.config.target
        return self.resolve_dsn(target.conn_id, target.dsn_env)

    def source_dsn(self, source: str) -> str:
        """A live source's DSN, or AirflowException naming where it is looked for."""
        pg = self.config.postgres(source)
        dsn = self.resolve_dsn(pg.conn_id, pg.dsn_env)
        if not dsn:
            raise AirflowException(f"source {source}: no DSN: define the Airflow connection {pg.conn_id} "
                                   f"or set ${pg.dsn_env}")
        return dsn

    def dsns(self, *, target: bool = True) -> dict[str, str]:
        """The metadata store's (and the target's, when found and `target`) DSN by the
        variable the engine would read it from: for `cli.main(dsns=)` and a spark-submit
        job's environment."""
        found = {self.config.metadata.dsn_env: self.dsn()}
        if target and (target_dsn := self.target_dsn()):
            found[self.config.target.dsn_env] = target_dsn
        return found

    @contextmanager
    def store(self) -> Iterator[MetadataStore]:
        """The metadata store, open for the block (as the Postgres provider's get_conn())."""
        store = MetadataStore.open(self.dsn())
        try:
            yield store
        finally:
            store.close()

    def spark_remote(self) -> str | None:
        """The Spark Connect server's URL (sc://host:port): the `spark_connect_default`
        connection (the Spark provider's `spark_connect` type, read by its
        SparkConnectHook) when defined, else $SPARK_REMOTE; None: no server, each run
        starts its own Spark (spark-submit, or a local session in the task)."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        try:
            return SparkConnectHook(SPARK_CONNECT_CONN_ID).get_connection_url()
        except Exception:  # not defined (or no backend can say): the variable, as the CLI reads it
            return os.environ.get("SPARK_REMOTE") or None

    @contextmanager
    def spark(self, name: str):
        """A Spark session for work that runs inside the task: on the Spark Connect server
        when there is one (spark_remote), else local unless $SPARK_MASTER."""
        from trailbound import spark as spark_session

        session = spark_session.session(name, remote=self.spark_remote())
        try:
            with spark_task_errors_as_ours():  # the task log's error names the file, not a worker's traceback
                yield session
        finally:
            session.stop()

    # ------------------------------------------------------------ the command line

    def run_command(self, argv: list[str], *, remote: str | None = None) -> str:
        """Run one `trailbound` command line in this process (the same verbs as the CLI, so
        the UI and the shell speak one language) with the DSNs this hook resolves; return
        what it printed, or raise with it when the command fails. For the control DAG and
        the runs in the task: what these commands print is their result (INFO, SHOWTRANS,
        a directive recorded), and the CLI records a run's outcome as the shell's would.
        `remote`: the Spark Connect server the command's Spark work runs on."""
        from trailbound import cli

        output = io.StringIO()
        with redirect_stdout(output), redirect_stderr(output):
            status = cli.main([*(["--config", self.config_path] if self.config_path else []),
                               *(["--remote", remote] if remote else []), *argv], dsns=self.dsns())
        self.log.info("trailbound %s\n%s", " ".join(argv), output.getvalue())
        if status != 0:
            raise AirflowException(f"trailbound {' '.join(argv)} failed: {output.getvalue().strip()}")
        return output.getvalue().strip()

    def runs_in_the_task(self, kind: str, group: str, spark_master: str | None) -> bool:
        """Whether a pump or replicat run can run in this task instead of a spark-submit
        job (whose JVM costs 3-4 s here before our code runs, for work that needs none;
        docs/architecture.md, "Where each stage runs"): its trails
        are on the local filesystem, and for replicat, which starts Spark only to net many
        key-changing UPDATEs (replicat/net/python.py's LIMIT), the Spark connection's master is local, so the session it may
        start in the task is the one spark-submit would have made. Capture always submits."""
        from trailbound import files as trailfs
        from trailbound.pump.run import needs_spark

        config = self.config
        if kind == "pump":
            return not needs_spark(config, group)
        if kind == "replicat":
            local_master = spark_master is not None and (spark_master == "local" or spark_master.startswith("local["))
            return local_master and trailfs.is_local(config.replicat(config.replicat_name(group)).exttrail)
        return False

    def run_in_the_task(self, kind: str, group: str, spark_master: str, airflow_run: list[str] | None = None) -> str:
        """`trailbound pump|replicat run GROUP` in this task (see runs_in_the_task): the
        command line the spark-submit job runs (jobs/pump.py, jobs/replicat.py), so the
        run is recorded and locked the same way, with its DAG run (`airflow_run`: DAG id,
        run id); a Spark session it turns out to need uses `spark_master` (not a secret:
        the task's own environment may say it)."""
        os.environ["SPARK_MASTER"] = spark_master
        return self.run_command([kind, "run", group, *(["--airflow-run", *airflow_run] if airflow_run else [])])

    # ------------------------------------------------------------ the engine, called with the DSNs

    def pull_archive(self, source: str):
        """`trailbound archive pull SOURCE`: the slot's changes into the archive; returns
        the PullResult."""
        from trailbound.sources.postgres.admin import pull

        return pull(self.config, source, dsn=self.source_dsn(source))

    def compare(self, source: str, replicat: str, *, pattern: str = "*", wait_seconds: float = 0.0):
        """`trailbound compare SOURCE REPLICAT` on a local Spark session in this task (the
        DSNs stay in this process: a spark-submit job would need them on its command line
        or in its rendered environment); returns the CompareReport."""
        from trailbound.compare.run import compare

        source_dsn, target_dsn = self.source_dsn(source), self.target_dsn()
        with self.spark(f"trailbound compare {source} {replicat}") as spark, self.store() as store:
            return compare(spark, store, self.config, source, replicat, pattern=pattern, wait_seconds=wait_seconds,
                           source_dsn=source_dsn, target_dsn=target_dsn)

    def load(self, source: str, replicat: str, *, mode: str = "snapshot", pattern: str = "*.*",
             chunk_rows: int = 50_000, say: Callable[[str], None] = print):
        """`trailbound load SOURCE REPLICAT` on a local Spark session in this task (the
        DSNs stay in this process, as for the compare); `say` gets each progress line as
        it happens. Returns the LoadResult."""
        from trailbound.load.run import run_load

        source_dsn, target_dsn = self.source_dsn(source), self.target_dsn()
        with self.spark(f"trailbound load {source} {replicat}") as spark, self.store() as store:
            return run_load(spark, store, self.config, source, replicat, mode=mode, pattern=pattern,
                            chunk_rows=chunk_rows, say=say, source_dsn=source_dsn, target_dsn=target_dsn)

    def extract_state(self, group: str):
        """The extract's checkpoints (capture.checkpoints.ExtractState), None if not added."""
        from trailbound.capture import checkpoints

        with self.store() as store:
            return checkpoints.read(store, group)

    def validate_new_trail(self, group: str, source: str, after_seqno: int):
        """Great Expectations on the extract's trail files committed after `after_seqno`
        (quality.validate_new_trail); returns the TrailCheck."""
        from trailbound import quality

        with self.store() as store:
            return quality.validate_new_trail(store, group, source, after_seqno)

    def check_replica(self, group: str):
        """The replica check after a replicat run (quality.validate_replica); for a live
        source a compare on a Spark session in this task. Returns the QualityReport."""
        from contextlib import nullcontext

        from trailbound import quality

        config = self.config
        source = config.replicat(group).source
        live = config.source(source).postgres is not None
        source_dsn = self.source_dsn(source) if live else None
        target_dsn = self.target_dsn()
        with (self.spark(f"trailbound replica check {group}") if live else nullcontext()) as spark, \
                self.store() as store:
            return quality.validate_replica(config, store, group, spark=spark, source_dsn=source_dsn,
                                            target_dsn=target_dsn)

    def purge(self):
        """Archive-log retention, then the trail purge (PURGEOLDEXTRACTS), with a Spark
        session only for a trail out of the local filesystem's reach (s3a://, hdfs://).
        Returns (RetentionResult, PurgeResult)."""
        from contextlib import nullcontext

        from trailbound.retention import run_retention
        from trailbound.trail import purge as trailpurge

        with self.store() as store:
            retained = run_retention(store, self.config)
            with (self.spark("trailbound purge trails") if trailpurge.needs_spark(store) else nullcontext()) as spark:
                return retained, trailpurge.purge_trails(store, self.config, spark=spark)

    def nothing_to_do(self, kind: str, group: str, until: str | None = None) -> str | None:
        """Why a capture/pump/replicat run of `group` has nothing to do (trailbound.idle:
        the metadata store, the archive's manifests, the target's checkpoint table; no
        Spark), or None when it must run."""
        from datetime import datetime

        from trailbound import idle

        with self.store() as store:
            if kind == "capture":
                return idle.capture_idle(store, self.config, group, datetime.fromisoformat(until) if until else None)
            if kind == "pump":
                return idle.pump_idle(store, self.config, group)
            if kind == "replicat":
                return idle.replicat_idle(store, self.config, group, self.target_dsn())
        raise ValueError(f"unknown kind of group {kind!r}")
