"""trailbound: GoldenGate-style change-data-capture replication on Spark and PostgreSQL.

The engine package. It never imports Airflow: DAGs, operators and sensors under
dags/ and plugins/ call into it, as do the spark-submit entry points under jobs/ and
the `trailbound` command line. docs/architecture.md maps each step (source -> archive
-> capture -> trail -> pump -> replicat -> target) and each GoldenGate concept to the
module that owns it; `sources/` and `devtools/` stand outside the engine.

The steps: `archive/` (the redo archive), `capture/`, `trail/`, `pump/`, `replicat/`,
`load/` (the initial load), `compare/`, `retention.py` (the archive's purge), and the
metadata store, `metadata.py` with its migrations in `sql/`. Around them: `cli/` (the
`trailbound` command), `dagfiles.py` (the DAG files), `status.py` (INFO ALL and lag as
data), `runlog.py` (every run's outcome), `runcounts.py` (each run's operations per
table), `stats.py` (STATS, LAG, VIEW REPORT, SEND REPLICAT ... STATUS as text),
`metrics.py` (Prometheus text), `heartbeat.py` (the heartbeat's names, stamps and
end-to-end lag, docs/heartbeat.md), `idle.py` (the checks made before starting Spark),
`overlap.py` (`trailbound replicate`: a source's stages at once, each a loop of runs),
`quality.py` (data checks: Great Expectations' expectations, evaluated with Arrow).
Shared by all: `positions.py`, `errors.py`, `config.py`, `durable.py`, `files.py` (the one file-system layer),
`tables.py` (TABLE patterns), `keyranges.py` (key ranges for the load and the
compare), `grouplock.py`, `ggsci.py` (how INFO writes times and
lags), `copytext.py` (COPY text from JSON images), `crash.py` (named crash points),
`spark.py` (the SparkSession).
"""

__version__ = "0.1.0"
