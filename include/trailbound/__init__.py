"""trailbound: GoldenGate-style change-data-capture replication on Spark and PostgreSQL.

The engine package. It never imports Airflow: DAGs, operators and sensors under
dags/ and plugins/ call into it, as do the spark-submit entry points under jobs/ and
the `trailbound` command line. docs/architecture.md maps each step (source -> archive
-> capture -> trail -> pump -> replicat -> target) and each GoldenGate concept to the
module that owns it; `sources/` and `devtools/` stand outside the engine.
"""

__version__ = "0.1.0"
