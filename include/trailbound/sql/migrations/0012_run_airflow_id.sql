-- The Airflow DAG run behind a run (issue 41): the task passes its DAG id and run id
-- (`--airflow-run DAG_ID RUN_ID`), so the console links each lag point to the DAG run
-- that committed it instead of guessing from time windows. Null: a run from the
-- command line.
ALTER TABLE trailbound.run_outcome ADD COLUMN airflow_dag_id text, ADD COLUMN airflow_run_id text;
