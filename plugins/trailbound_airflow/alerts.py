"""Failure callbacks a DAG can fire (configured as `airflow.on_failure_callbacks`).

`log_alert` is the default: one ERROR line per failed run, in the log of whichever
Airflow component runs DAG callbacks (the DAG processor for scheduled runs, the console
for `airflow dags test`), naming the DAG, the run, the failed task and where its log
explains why. Point the setting at any notifier as well (an SmtpNotifier or
SlackNotifier instance in a module of yours, say) to page someone.
"""

from __future__ import annotations

import logging

log = logging.getLogger("trailbound.alerts")


def log_alert(context) -> None:
    # `dag` and `run_id` are in every callback context; `ti` only when a task is to blame.
    ti = context.get("ti")
    task = f"task {ti.task_id} (try {ti.try_number})" if ti is not None else "no task named"
    log.error("trailbound alert: DAG %s run %s failed (%s): %s; its log says why",
              context["dag"].dag_id, context["run_id"], context.get("reason", "failure"), task)
