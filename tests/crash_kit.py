"""Processes killed at a crash point, as Spark Connect clients of the worker's warm server.

A capture or replicat run that is to die with kill -9's status is a subprocess: the
crash must take its database sessions and its Python state with it. It need not start a
JVM of its own (half a minute on two CPUs, and every Spark job in it cold), nor a fresh
SparkContext (every Spark job cold again): it runs its Spark work on the Spark Connect
service of the test session's own JVM (conftest's `spark_remote`), as production runs
capture against a long-lived Connect server (SPARK_REMOTE).

What a killed client leaves on the server. Its Connect session is isolated from the
others (its SQL settings, temporary views, its operations), but **not its cached data**:
`DataFrame.cache()` registers the plan in the CacheManager that every session of the
SparkContext shares (Spark's SharedState), and a killed run never reaches its
`unpersist()`. Checked (Spark 4.2, 2026-11-27): a client that cached a parquet read and
died with os._exit(137) left the entry, and a new Connect session's read of the same
files planned an InMemoryTableScan of it, as did the classic session. Nor does a killed
client's operation end with it: the server keeps it (and its session) until they time
out (checked the same way: one execution and one session left after the kill). So the
killed run is a child of a small driver process, and once it is dead the driver, through
the py4j gateway of the test session's JVM, closes the server's Connect sessions (which
interrupts their operations), cancels any job left and drops every cached plan: the
next run, killed or in the test's process, starts from the files and checkpoints alone,
as after a machine's restart. Nothing else runs on the worker's JVM meanwhile (the test
waits for the driver; no other Connect client is running then).
"""

from __future__ import annotations

import sys

# What the killed child runs: an optional prelude (the crash matrix's thread filter),
# then trailbound's command line as a Connect client ($SPARK_REMOTE).
_CHILD = """
import sys
from trailbound.cli import main
sys.exit(main(sys.argv[1:]))
"""

# What the driver runs: the child, then the server's JVM forgets what the child left.
_DRIVER = """
import os
import subprocess
import sys

port, secret = (os.environ.pop(name) for name in ("CRASH_KIT_GATEWAY_PORT", "CRASH_KIT_GATEWAY_SECRET"))
status = subprocess.call([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])

from py4j.java_gateway import GatewayParameters, JavaGateway

gateway = JavaGateway(gateway_parameters=GatewayParameters(port=int(port), auth_token=secret))
connect = getattr(getattr(gateway.jvm.org.apache.spark.sql.connect.service, "SparkConnectService$"), "MODULE$")
connect.sessionManager().invalidateAllSessions()  # closes the dead client's session, interrupts its operations
session = gateway.jvm.org.apache.spark.sql.SparkSession.getDefaultSession().get()
session.sparkContext().cancelAllJobs()
session.sharedState().cacheManager().clearCache()  # not the session's: the SparkContext's, shared
gateway.close()
sys.exit(status if status >= 0 else 128 - status)
"""


class ConnectCrashDriver:
    """Runs `trailbound ...` processes that a test kills, as Connect clients of the
    worker's server (`remote`, served by the JVM of the classic session `spark`)."""

    def __init__(self, spark, remote: str):
        gateway = spark.sparkContext._gateway.gateway_parameters
        self.env = {"SPARK_REMOTE": remote, "CRASH_KIT_GATEWAY_PORT": str(gateway.port),
                    "CRASH_KIT_GATEWAY_SECRET": gateway.auth_token}

    def cli(self, *args: str, prelude: str = "") -> list[str]:
        """The command line of `trailbound ARGS` run this way (give it `env` too)."""
        return [sys.executable, "-c", _DRIVER, prelude + _CHILD, *args]
