"""TrailboundSparkSubmitOperator: spark-submit a group's run, unless it has nothing to do
or needs no Spark.

A scheduled run with nothing new used to cost a spark-submit, a JVM and a SparkSession
to find that out. This operator asks TrailboundHook.nothing_to_do first (the metadata
store, no Spark) and skips the task when there is nothing: downstream tasks are skipped
with it and no Asset event is published, so nothing downstream is triggered for nothing.
When the check cannot tell, the job runs as before.

Every run names the DAG run it belongs to (`--airflow-run DAG_ID RUN_ID`, recorded with
its outcome), so the console links what it committed to this run.

Pump and replicat of local trails need no Spark (replicat starts it only to net more
key-changing UPDATEs than replicat/net/python.py's LIMIT in a chunk): with a local Spark master they
run in the task itself (TrailboundHook.runs_in_the_task), sparing each run
spark-submit's JVM start (docs/architecture.md, "Where each stage runs"). Capture, and
every run for a cluster master or a trail out of the local filesystem, is submitted,
unless there is a Spark Connect server (TrailboundHook.spark_remote: the
`spark_connect_default` connection, else $SPARK_REMOTE): then every run is that server's
client in the task, with no spark-submit and no JVM in the worker.

A submitted job gets its DSNs (the metadata store's, and a replicat's the target's) as
TrailboundHook resolves them, in the spark-submit child process's environment: a dict
given to that one subprocess, never the Airflow worker's os.environ. Only for a local
or standalone client-mode master: for YARN and Kubernetes the provider would put each
variable on the spark-submit command line (`--conf ...Env.X=...`), so there the job
reads them from the worker's environment, as before.
"""

from __future__ import annotations

import time

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException, AirflowSkipException

from trailbound_airflow.hooks import TrailboundHook


# A kind of group -> its verb on the command line (what jobs/extract.py, pump.py, replicat.py run).
VERBS = {"capture": "extract", "pump": "pump", "replicat": "replicat"}


class TrailboundSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator for one capture/pump/replicat run of `group` (`kind`)."""

    def __init__(self, *, kind: str, group: str, **kwargs):
        super().__init__(**kwargs)
        self.kind, self.group = kind, group

    def _options(self) -> list[str]:
        """The job's arguments after the group (jobs/*.py put the verb before them)."""
        args = [str(a) for a in self.application_args or []]
        return args[1:] if args[:1] == [self.group] else args

    def _until(self) -> str | None:
        args = list(self.application_args or [])
        return args[args.index("--until") + 1] if "--until" in args[:-1] else None

    def execute(self, context):
        began = time.perf_counter()
        hook = TrailboundHook()
        reason = hook.nothing_to_do(self.kind, self.group, self._until())
        self.log.info("%s (checked in %.1f s)", reason or "work to do", time.perf_counter() - began)
        if reason:
            raise AirflowSkipException(reason)
        # The DAG run this run belongs to, recorded with it (the console links each run to it).
        ti = context.get("ti")
        airflow_run = [ti.dag_id, context["run_id"]] if ti is not None else []
        remote = hook.spark_remote()
        if remote:
            # A warm Spark Connect server: the run is its client, in this task, with no
            # spark-submit and no JVM here (docs/architecture.md, "Where each stage runs").
            self.log.info("%s %s runs in this task on the Spark Connect server", self.kind, self.group)
            hook.run_command([VERBS[self.kind], "run", self.group, *self._options(),
                              *(["--airflow-run", *airflow_run] if airflow_run else [])], remote=remote)
            return None
        master = self._spark_master()
        if self.kind in ("pump", "replicat") and hook.runs_in_the_task(self.kind, self.group, master):
            self.log.info("%s %s needs no spark-submit: running in this task", self.kind, self.group)
            hook.run_in_the_task(self.kind, self.group, master, airflow_run=airflow_run or None)
            return None
        self.application_args = [*(self.application_args or []), *(["--airflow-run", *airflow_run] if airflow_run else [])]
        # The job's DSNs go in the child's environment only (see the module's docstring).
        self._job_env = hook.dsns(target=self.kind == "replicat") if self._env_stays_local(master) else {}
        return super().execute(context)

    def _env_stays_local(self, master: str | None) -> bool:
        """Does SparkSubmitHook hand env_vars to the spark-submit process only (a local or
        standalone master in client mode), rather than writing them on its command line
        (YARN, Kubernetes) or refusing them (standalone cluster mode)?"""
        if master is None or "yarn" in master or "k8s" in master:
            return False
        try:
            extra = BaseHook.get_connection(self._conn_id).extra_dejson
        except AirflowNotFoundException:
            extra = {}
        return (self._deploy_mode or extra.get("deploy-mode")) != "cluster"

    def _get_hook(self):
        """SparkSubmitHook with the job's DSNs added to env_vars for this submit only: the
        operator's own env_vars (a rendered template field) never holds them."""
        job_env = getattr(self, "_job_env", None)
        if not job_env:
            return super()._get_hook()
        own = self.env_vars
        self.env_vars = {**(own or {}), **job_env}
        try:
            return super()._get_hook()
        finally:
            self.env_vars = own

    def _spark_master(self) -> str | None:
        """The Spark connection's master (None if there is no such connection)."""
        try:
            connection = BaseHook.get_connection(self._conn_id)
        except AirflowNotFoundException:
            return None
        return (connection.host or "").strip() or None
