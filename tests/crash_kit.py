"""Processes killed at a crash point, on a warm Spark JVM.

A capture or replicat run that is to die with kill -9's status is a subprocess: the
crash must take its database sessions and its Python state with it. It need not start a
JVM of its own (half a minute on two CPUs, and every Spark job in it cold): it drives a
Spark JVM the test session started once (`DriverJvm`), the way spark-submit hands a Python
driver its JVM (PYSPARK_GATEWAY_PORT). Each such process first stops the Spark context a
killed predecessor left in that JVM (its cached data, its jobs), so every run starts from
the files and checkpoints alone, as after a machine's restart.
"""

from __future__ import annotations

import sys

# What a killed process runs: connect to the JVM, stop whatever Spark context a killed
# predecessor left running in it, then trailbound's command line.
CRASH_DRIVER = """
import sys
from pyspark import SparkContext
from pyspark.java_gateway import launch_gateway

gateway = launch_gateway()  # PYSPARK_GATEWAY_PORT: the running JVM, as under spark-submit
sessions = gateway.jvm.org.apache.spark.sql.SparkSession
left = sessions.getDefaultSession()
if left.isDefined():
    left.get().sparkContext().stop()
sessions.clearDefaultSession()
sessions.clearActiveSession()
SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm
from trailbound.cli import main
sys.exit(main(sys.argv[1:]))
"""


class DriverJvm:
    """One Spark JVM (a py4j gateway, as pyspark starts it) that killed processes drive
    one after another, instead of starting one each."""

    def __init__(self):
        from pyspark.java_gateway import launch_gateway

        self.gateway = launch_gateway()
        self.env = {"PYSPARK_GATEWAY_PORT": str(self.gateway.gateway_parameters.port),
                    "PYSPARK_GATEWAY_SECRET": self.gateway.gateway_parameters.auth_token,
                    "SPARK_MASTER": "local[2]"}

    def cli(self, *args: str) -> list[str]:
        """The command line of `trailbound ARGS` run on this JVM (give it `env` too)."""
        return [sys.executable, "-c", CRASH_DRIVER, *args]

    def close(self) -> None:
        left = self.gateway.jvm.org.apache.spark.sql.SparkSession.getDefaultSession()
        if left.isDefined():
            left.get().sparkContext().stop()
        process = self.gateway.proc
        self.gateway.shutdown()
        process.stdin.close()  # the gateway JVM exits when its stdin closes
        process.wait(timeout=120)
