"""Shared fixtures: a real PostgreSQL server and a real local Spark session.

PostgreSQL: the server named by $TRAILBOUND_METADATA_DSN when set (`make test` sets it
to its throwaway server), else one this suite starts under var/test-pg/<pid> and removes
at the end. Each test that needs the metadata store gets its own database, cloned from a
template that the project's own migrations built once per session.

Spark: one local[2] session for the whole run, UI off; starting one costs seconds.

Scheduling: the suite runs on pytest-xdist workers (pyproject.toml). Tests marked
`long_running(seconds)` are started first, longest first, so that the long ones run side
by side rather than one after another at the end; the seconds are a rough ordering hint,
never an assertion.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import psycopg2
import psycopg2.extensions
import pytest
from psycopg2 import sql

from trailbound.devtools.localpg import LocalServer
from trailbound.grouplock import GroupLock
from trailbound.metadata import MetadataStore

REPO = Path(__file__).resolve().parent.parent


# The suite's Spark jobs read a few dozen records each, so every spark-submit and session
# is dominated by start-up: the JVM's JIT, code generation (Janino compiles the generated
# Java of every new plan, whole-stage and per expression), adaptive query planning. Spark's
# own configuration file (what a deployment would use) switches them to small-batch
# settings for every JVM the suite starts, in-process sessions, spark-submit from Airflow
# and the standalone cluster alike. None of them changes a result; the benchmarks run with
# the defaults. A cold JVM also verifies the bytecode of every class it loads (Spark's and
# Scala's jars, thousands of classes): these are released jars, so the suite's JVMs skip
# that (BytecodeVerificationRemote off), about a tenth of a cold spark-submit's CPU
# (docs/benchmarks/test-suite.md).
SMALL_BATCH_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
SMALL_BATCH_SPARK_DEFAULTS = f"""\
spark.driver.defaultJavaOptions {SMALL_BATCH_JVM}
spark.executor.defaultJavaOptions {SMALL_BATCH_JVM}
spark.sql.codegen.wholeStage false
spark.sql.codegen.factoryMode NO_CODEGEN
spark.sql.adaptive.enabled false
spark.sql.shuffle.partitions 4
"""


def pytest_configure(config):
    conf_dir = REPO / "var" / "test-spark-conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(SMALL_BATCH_SPARK_DEFAULTS)
    os.environ.setdefault("SPARK_CONF_DIR", str(conf_dir))
    # The Connect clients' hints of their shared session (trailbound.spark) under var/, not
    # in the home directory: each test server's port is new.
    os.environ.setdefault("XDG_CACHE_HOME", str(REPO / "var" / "test-cache"))


def pytest_collection_modifyitems(config, items):
    """Longest first (see the module's docstring). xdist's load scheduler hands each
    worker two tests to begin with, so the first 2 x workers places are dealt so that
    each worker begins with one of the longest."""
    def seconds(item) -> float:
        marker = item.get_closest_marker("long_running")
        return marker.args[0] if marker else 0

    ordered = sorted(items, key=seconds, reverse=True)  # stable: the rest keep their order
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    head = ordered[:2 * workers]
    dealt = [head[i // 2 + (i % 2) * workers] for i in range(len(head))] if len(head) == 2 * workers else head
    items[:] = dealt + ordered[2 * workers:]


def _admin(dsn: str):
    connection = psycopg2.connect(psycopg2.extensions.make_dsn(dsn, dbname="postgres"))
    connection.autocommit = True
    return connection


@pytest.fixture(scope="session")
def pg_server_dsn():
    """DSN of a PostgreSQL server where the suite may create and drop databases."""
    given = os.environ.get("TRAILBOUND_METADATA_DSN")
    if given:
        yield psycopg2.extensions.make_dsn(given, dbname="postgres")
        return
    # One cluster per test session: two suites running at once must not share (or stop)
    # each other's server.
    server = LocalServer(REPO / "var" / "test-pg" / str(os.getpid())).start()
    try:
        yield server.dsn("postgres")
    finally:
        server.remove()


@pytest.fixture(scope="session")
def metadata_template(pg_server_dsn):
    """A database migrated once, cloned for every test that needs a metadata store."""
    name = f"tb_template_{os.getpid()}"
    admin = _admin(pg_server_dsn)
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    store = MetadataStore.open(psycopg2.extensions.make_dsn(pg_server_dsn, dbname=name))
    store.close()
    yield name
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
    admin.close()


def _fresh_database(pg_server_dsn: str, template: str | None = None):
    name = f"tb_test_{uuid.uuid4().hex[:12]}"
    admin = _admin(pg_server_dsn)
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
                    + (sql.SQL(" TEMPLATE {}").format(sql.Identifier(template)) if template else sql.SQL("")))
    return name, admin


def _drop(admin, name: str) -> None:
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.close()


@pytest.fixture(scope="session")
def new_metadata_database(pg_server_dsn, metadata_template):
    """Factory for metadata databases that outlive one test (module-scoped references);
    all are dropped at the end of the session."""
    made = []

    def make() -> str:
        name, admin = _fresh_database(pg_server_dsn, metadata_template)
        made.append((admin, name))
        return psycopg2.extensions.make_dsn(pg_server_dsn, dbname=name)

    yield make
    for admin, name in made:
        _drop(admin, name)


@pytest.fixture
def metadata_dsn(pg_server_dsn, metadata_template):
    """DSN of a per-test metadata database with every migration applied."""
    name, admin = _fresh_database(pg_server_dsn, metadata_template)
    yield psycopg2.extensions.make_dsn(pg_server_dsn, dbname=name)
    _drop(admin, name)


@pytest.fixture
def empty_database_dsn(pg_server_dsn):
    """DSN of a per-test database with nothing in it (to watch migrations run)."""
    name, admin = _fresh_database(pg_server_dsn)
    yield psycopg2.extensions.make_dsn(pg_server_dsn, dbname=name)
    _drop(admin, name)


@pytest.fixture
def target_dsn(pg_server_dsn):
    """DSN of a per-test empty database standing for replicat's target."""
    name, admin = _fresh_database(pg_server_dsn)
    yield psycopg2.extensions.make_dsn(pg_server_dsn, dbname=name)
    _drop(admin, name)


@pytest.fixture
def store(metadata_dsn):
    with MetadataStore.open(metadata_dsn) as opened:
        yield opened


@pytest.fixture
def group_held_elsewhere(metadata_dsn):
    """`with group_held_elsewhere("extract", "EXT1"):` holds the group as a running process
    does, on a session of its own. The lock is released at the block's end, not by closing
    the session: a closed session's backend lets its locks go a moment later, and a status
    read right after the block must not race it (it did once in CI)."""
    @contextlib.contextmanager
    def hold(kind: str, group: str):
        with MetadataStore.open(metadata_dsn) as other, GroupLock(other, kind, group, wait=None):
            yield
    return hold


@pytest.fixture(scope="session")
def spark():
    from trailbound import spark as spark_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = spark_session.session("trailbound-tests", master="local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_remote(spark):
    """sc://127.0.0.1:PORT of a Spark Connect service run by the suite's own JVM (the
    `spark` session's): a `trailbound` process given it as SPARK_REMOTE runs its Spark work
    there and starts no JVM of its own. The same server class as
    trailbound.devtools.sparkconnect's, started inside a running SparkContext."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    jvm = spark._jvm
    conf = jvm.org.apache.spark.SparkEnv.get().conf()  # read by the service as it starts
    conf.set("spark.connect.grpc.binding.address", "127.0.0.1")
    conf.set("spark.connect.grpc.binding.port", str(port))
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(spark.sparkContext._jsc.sc())
    yield f"sc://127.0.0.1:{port}"
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.stop(jvm.scala.Option.empty(),
                                                                      jvm.scala.Option.empty())


@pytest.fixture(scope="session")
def crash_driver(spark, spark_remote):
    """Runs the processes a test kills at a crash point as Connect clients of the
    worker's warm server (crash_kit)."""
    from crash_kit import ConnectCrashDriver

    return ConnectCrashDriver(spark, spark_remote)


def pytest_terminal_summary(terminalreporter):
    """The crash matrix (tests/test_crash_matrix.py, docs/reliability.md): crash points x
    seeds, each cell's divergence count, then the totals. Each seed's test hands its row
    over as a user property, which pytest-xdist carries back from the workers."""
    import json

    seeds = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()) or ():
                if name == "crash_matrix":
                    row = json.loads(value)
                    seeds[row["seed"]] = row
    if not seeds:
        return
    ordered = [seeds[s] for s in sorted(seeds)]
    cells = list(dict.fromkeys(c for row in ordered for c in row["cells"]))
    width = max(len(c) for c in cells) + 2
    write = terminalreporter.write_line
    terminalreporter.section("crash matrix: divergences per crash point and seed")
    write("crash point".ljust(width) + "".join(f"seed {row['seed']:<6}" for row in ordered))
    for cell in cells:
        write(cell.ljust(width) + "".join(f"{row['cells'].get(cell, '-')!s:<11}" for row in ordered))
    for total in ordered[0]["totals"]:
        write(total.ljust(width) + "".join(f"{row['totals'].get(total, '-')!s:<11}" for row in ordered))
    for point, where in ordered[0].get("elsewhere", {}).items():
        write(f"{point}: covered in {where}")
    write(f"{len(cells)} cells x {len(ordered)} seeds; divergences in all: "
          f"{sum(sum(row['cells'].values()) for row in ordered)}")
