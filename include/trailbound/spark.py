"""Building the SparkSession. Jobs and the CLI build one and pass it down; library code
never creates its own."""

from __future__ import annotations

import os
from typing import Callable

# Settings every trailbound session needs, whoever builds it (spark-submit passes the
# same ones as --conf from the job entry points).
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",  # the contract's times are UTC; never the host's zone
    "spark.log.level": "WARN",            # keep task logs readable
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",  # staging files read by pyarrow
}
# Tuning for backlog-sized batches. Unlike the settings above these change no result, so
# a deployment's spark-defaults.conf (or a --conf) wins over each of them.
TUNING_DEFAULTS = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
}


def session(app_name: str = "trailbound", master: str | None = None):
    """A SparkSession with trailbound's settings. `master` defaults to $SPARK_MASTER or
    local[*]; under spark-submit the master given there wins."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master or "SPARK_MASTER" in os.environ or not _under_spark_submit():
        builder = builder.master(master or os.environ.get("SPARK_MASTER", "local[*]"))
    for key, value in SESSION_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    given = spark.sparkContext.getConf()  # spark-defaults.conf and --conf, as the JVM started
    for key, value in TUNING_DEFAULTS.items():
        if not given.contains(key):
            spark.conf.set(key, value)
    return spark


def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ or "SPARK_SUBMIT" in os.environ


def on_demand(spark) -> Callable[[], object]:
    """`spark` as a function that gives the session: a SparkSession itself, or a function
    that starts one (called only when a run turns out to need Spark, so that a run that
    does not never pays for a JVM)."""
    return spark if callable(spark) else (lambda: spark)
