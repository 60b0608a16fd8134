"""TrailboundSparkSubmitOperator: spark-submit a group's run, unless it has nothing to do.

A scheduled run with nothing new used to cost a spark-submit, a JVM and a SparkSession
to find that out. This operator asks TrailboundHook.nothing_to_do first (the metadata
store, no Spark) and skips the task when there is nothing: downstream tasks are skipped
with it and no Asset event is published, so nothing downstream is triggered for nothing.
When the check cannot tell, the job runs as before.
"""

from __future__ import annotations

import time

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowSkipException

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
        reason = TrailboundHook().nothing_to_do(self.kind, self.group, self._until())
        self.log.info("%s (checked in %.1f s)", reason or "work to do: submitting", time.perf_counter() - began)
        if reason:
            raise AirflowSkipException(reason)
        return super().execute(context)
