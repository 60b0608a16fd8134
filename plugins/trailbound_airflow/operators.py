"""TrailboundSparkSubmitOperator: spark-submit a group's run, unless it has nothing to do
or needs no Spark.

A scheduled run with nothing new used to cost a spark-submit, a JVM and a SparkSession
to find that out. This operator asks TrailboundHook.nothing_to_do first (the metadata
store, no Spark) and skips the task when there is nothing: downstream tasks are skipped
with it and no Asset event is published, so nothing downstream is triggered for nothing.
When the check cannot tell, the job runs as before.

Pump and replicat of local trails need no Spark (replicat starts it only to net more
key-changing UPDATEs than netpython.LIMIT in a chunk): with a local Spark master they
run in the task itself (TrailboundHook.runs_in_the_task), sparing each run
spark-submit's JVM start (docs/architecture.md, "Where each stage runs"). Capture, and
every run for a cluster master or a trail out of the local filesystem, is submitted.
"""

from __future__ import annotations

import time

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException, AirflowSkipException

from trailbound_airflow.hooks import TrailboundHook


class TrailboundSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator for one capture/pump/replicat run of `group` (`kind`)."""

    def __init__(self, *, kind: str, group: str, **kwargs):
        super().__init__(**kwargs)
        self.kind, self.group = kind, group

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
        master = self._spark_master()
        if self.kind in ("pump", "replicat") and hook.runs_in_the_task(self.kind, self.group, master):
            self.log.info("%s %s needs no spark-submit: running in this task", self.kind, self.group)
            hook.run_in_the_task(self.kind, self.group, master)
            return None
        return super().execute(context)

    def _spark_master(self) -> str | None:
        """The Spark connection's master (None if there is no such connection)."""
        try:
            connection = BaseHook.get_connection(self._conn_id)
        except AirflowNotFoundException:
            return None
        return (connection.host or "").strip() or None
