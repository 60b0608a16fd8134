"""TrailboundHook: the one place Airflow code reaches trailbound's configuration and
metadata store. The connection is resolved lazily, never in __init__."""

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


class TrailboundHook(BaseHook):
    """Reads the configuration file ($TRAILBOUND_CONFIG) and opens the metadata store
    through an Airflow connection (postgres), falling back to the environment variable
    the configuration names when the connection is not defined."""

    conn_name_attr = "trailbound_conn_id"
    default_conn_name = "trailbound_metadata"
    conn_type = "postgres"
    hook_name = "trailbound"

    def __init__(self, trailbound_conn_id: str = default_conn_name, config_path: str | None = None):
        super().__init__()
        self.trailbound_conn_id = trailbound_conn_id
        self.config_path = config_path
        self._config: configuration.Config | None = None

    @property
    def config(self) -> configuration.Config:
        if self._config is None:
            self._config = configuration.load(self.config_path or os.environ.get(configuration.CONFIG_ENV))
        return self._config

    def _connection_dsn(self, conn_id: str, dsn_env: str) -> str | None:
        """The DSN of an Airflow connection, else of the variable the configuration names."""
        try:
            connection = self.get_connection(conn_id)
        except Exception:  # not defined: the jobs' own variable, as the CLI uses it
            return os.environ.get(dsn_env)
        uri = connection.get_uri()
        return "postgresql://" + uri.split("://", 1)[1] if "://" in uri else uri

    def dsn(self) -> str:
        from trailbound.metadata import dsn_from_env

        metadata = self.config.metadata
        return self._connection_dsn(self.trailbound_conn_id, metadata.dsn_env) or dsn_from_env(metadata.dsn_env)

    def run_command(self, argv: list[str]) -> str:
        """Run one `trailbound` command line (the same verbs as the CLI, so the UI and the
        shell speak one language) against the stores this hook resolves; return what it
        printed, or raise with it when the command fails."""
        from trailbound import cli

        config = self.config
        os.environ[config.metadata.dsn_env] = self.dsn()
        target = self._connection_dsn(config.target.conn_id, config.target.dsn_env)
        if target:
            os.environ[config.target.dsn_env] = target
        output = io.StringIO()
        with redirect_stdout(output), redirect_stderr(output):
            status = cli.main([*(["--config", self.config_path] if self.config_path else []), *argv])
        self.log.info("trailbound %s\n%s", " ".join(argv), output.getvalue())
        if status != 0:
            raise AirflowException(f"trailbound {' '.join(argv)} failed: {output.getvalue().strip()}")
        return output.getvalue().strip()

    def export_source_dsn(self, source: str) -> None:
        """Put a live source's DSN where the engine reads it (its `dsn_env` variable), from
        its Airflow connection (`conn_id`) when defined; the DSN itself is never logged."""
        pg = self.config.postgres(source)
        dsn = self._connection_dsn(pg.conn_id, pg.dsn_env)
        if not dsn:
            raise AirflowException(f"source {source}: no DSN: define the Airflow connection {pg.conn_id} "
                                   f"or set ${pg.dsn_env}")
        os.environ[pg.dsn_env] = dsn

    def export_target_dsn(self) -> None:
        target = self.config.target
        dsn = self._connection_dsn(target.conn_id, target.dsn_env)
        if dsn:
            os.environ[target.dsn_env] = dsn

    def pull_archive(self, source: str) -> str:
        """`trailbound archive pull SOURCE`, the source's DSN from its Airflow connection."""
        self.export_source_dsn(source)
        return self.run_command(["archive", "pull", source])

    def compare(self, source: str, replicat: str, *, pattern: str = "*", wait_seconds: float = 0.0):
        """`trailbound compare SOURCE REPLICAT` on a local Spark session in this task (the
        source's DSN stays in this process: a spark-submit job would need it on its
        command line or in its rendered environment); returns the CompareReport."""
        from trailbound.compare.run import compare

        self.export_source_dsn(source)
        self.export_target_dsn()
        with self.spark(f"trailbound compare {source} {replicat}") as spark, self.store() as store:
            return compare(spark, store, self.config, source, replicat, pattern=pattern, wait_seconds=wait_seconds)

    def load(self, source: str, replicat: str, *, mode: str = "snapshot", pattern: str = "*.*",
             chunk_rows: int = 50_000, say: Callable[[str], None] = print):
        """`trailbound load SOURCE REPLICAT` on a local Spark session in this task (the
        source's DSN stays in this process, as for the compare); `say` gets each progress
        line as it happens. Returns the LoadResult."""
        from trailbound.load.run import run_load

        self.export_source_dsn(source)
        self.export_target_dsn()
        with self.spark(f"trailbound load {source} {replicat}") as spark, self.store() as store:
            return run_load(spark, store, self.config, source, replicat, mode=mode, pattern=pattern,
                            chunk_rows=chunk_rows, say=say)

    @contextmanager
    def spark(self, name: str):
        """A Spark session for work that runs inside the task (local unless $SPARK_MASTER)."""
        from trailbound import spark as spark_session

        session = spark_session.session(name)
        try:
            with spark_task_errors_as_ours():  # the task log's error names the file, not a worker's traceback
                yield session
        finally:
            session.stop()

    def runs_in_the_task(self, kind: str, group: str, spark_master: str | None) -> bool:
        """Whether a pump or replicat run can run in this task instead of a spark-submit
        job (whose JVM costs 3-4 s here before our code runs, for work that needs none;
        docs/architecture.md, "Where each stage runs"): its trails
        are on the local filesystem, and for replicat, which starts Spark only to net many
        key-changing UPDATEs (netpython.LIMIT), the Spark connection's master is local, so the session it may
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

    def run_in_the_task(self, kind: str, group: str, spark_master: str) -> str:
        """`trailbound pump|replicat run GROUP` in this task (see runs_in_the_task); a Spark
        session it turns out to need uses `spark_master`."""
        os.environ["SPARK_MASTER"] = spark_master
        return self.run_command([kind, "run", group])

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
                config = self.config
                return idle.replicat_idle(store, config, group,
                                          self._connection_dsn(config.target.conn_id, config.target.dsn_env))
        raise ValueError(f"unknown kind of group {kind!r}")

    @contextmanager
    def store(self) -> Iterator[MetadataStore]:
        store = MetadataStore.open(self.dsn())
        try:
            yield store
        finally:
            store.close()
