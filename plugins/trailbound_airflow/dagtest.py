"""`airflow dags test` for the demos, with the run's real start.

    python -m trailbound_airflow.dagtest DAG_ID LOGICAL_DATE [--conf JSON]

Airflow's DAG.test (what `airflow dags test` runs) stores a run's logical date as its
start date (airflow/sdk/definitions/dag.py: get_or_create_dagrun(start_date=logical_date
...)). The demos run past intervals, weeks before now, so the UI showed each run as
lasting weeks ("Total: 24d 16h" in the grid; a 15-second pump as 1:28 hours). This runs
the same DAG.test and then records the moment the run began as its start: the run's end
is already its real end, so the duration the UI shows is the real one. The output, and
the "DagRun Finished ... state=..." line the demos read, are DAG.test's own.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone


def test_run(dag_id: str, logical_date: datetime, conf: dict | None = None):
    """Run the DAG once for `logical_date` as `airflow dags test` does; returns the DagRun,
    whose start date is then when this run began (not its logical date)."""
    from airflow.utils.cli import get_bagged_dag

    dag = get_bagged_dag(None, dag_id)
    began = datetime.now(timezone.utc)
    run = dag.test(logical_date=logical_date, run_conf=conf)
    record_real_start(dag_id, run.run_id, began)
    return run


def record_real_start(dag_id: str, run_id: str, began: datetime) -> None:
    """Set the run's start date in Airflow's database to `began`."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
                        .values(start_date=began))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trailbound_airflow.dagtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dag_id")
    parser.add_argument("logical_date", type=datetime.fromisoformat)
    parser.add_argument("--conf", type=json.loads, help="the run's configuration, as JSON")
    args = parser.parse_args(argv)
    run = test_run(args.dag_id, args.logical_date, args.conf)
    state = getattr(run.state, "value", str(run.state))
    return 0 if state == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
