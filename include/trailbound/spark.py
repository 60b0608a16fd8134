"""Building the SparkSession, and the few things the engine asks of any session. Jobs and
the CLI build one and pass it down; library code never creates its own.

Two kinds of session run the same engine code:

- a classic session, whose JVM this process starts (local[*], $SPARK_MASTER, or the
  master spark-submit was given), and
- a Spark Connect session (`SPARK_REMOTE=sc://host:port`, or the CLI's `--remote`): a
  client of a server that outlives the run (`python -m trailbound.devtools.sparkconnect`),
  with no JVM in this process.

Connect has no SparkContext and no RDDs, so the engine asks this module instead:
`parallelism` instead of `sparkContext.defaultParallelism`, `numbered` (one row per task)
and `run_tasks` instead of `parallelize(...).map(...)`.
"""

from __future__ import annotations

import getpass
import os
import pickle
import socket
import sys
import uuid
from pathlib import Path
from typing import Callable, Sequence
from urllib.parse import urlsplit

from trailbound.errors import TrailboundError

# Settings every trailbound session needs, whoever builds it (spark-submit passes the
# same ones as --conf from the job entry points; the Connect server is started with them).
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",  # the contract's times are UTC; never the host's zone
    "spark.log.level": "WARN",            # keep task logs readable
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",  # staging files read by pyarrow
}
# The SESSION_CONF entries a Connect client may set on its own session (SQL settings);
# the others belong to the server's JVM and are given when it starts.
CONNECT_SESSION_CONF = ("spark.sql.session.timeZone", "spark.sql.execution.arrow.pyspark.enabled",
                        "spark.sql.parquet.outputTimestampType")
# Tuning for backlog-sized batches. Unlike the settings above these change no result, so
# a deployment's spark-defaults.conf (or a --conf) wins over each of them.
TUNING_DEFAULTS = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
}
REMOTE_ENV = "SPARK_REMOTE"


class SparkConnectUnavailable(TrailboundError):
    """The Spark Connect server named by SPARK_REMOTE / --remote does not answer."""


def session(app_name: str = "trailbound", master: str | None = None, remote: str | None = None):
    """A SparkSession with trailbound's settings. With `remote` (else $SPARK_REMOTE, unless
    a `master` is given or spark-submit already started this process's JVM) a Spark
    Connect session; otherwise a classic one whose master defaults to $SPARK_MASTER or
    local[*] (under spark-submit the master given there wins)."""
    if not remote and not master and not _under_spark_submit():
        remote = os.environ.get(REMOTE_ENV) or None
    if remote:
        return connect_session(remote)
    return _classic_session(app_name, master)


def _classic_session(app_name: str, master: str | None):
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if not _under_spark_submit():
        workers_import_trailbound(os.environ)
    builder = SparkSession.builder.appName(app_name)
    if master or "SPARK_MASTER" in os.environ or not _under_spark_submit():
        builder = builder.master(master or os.environ.get("SPARK_MASTER", "local[*]"))
    for key, value in SESSION_CONF.items():
        builder = builder.config(key, value)
    # pyspark's builder turns into a Connect client whenever SPARK_REMOTE is set; here
    # a classic session was asked for (an explicit master, the test suite's own session).
    remote = os.environ.pop(REMOTE_ENV, None)
    try:
        spark = builder.getOrCreate()
    finally:
        if remote is not None:
            os.environ[REMOTE_ENV] = remote
    spark.sparkContext.setLogLevel("WARN")
    given = spark.sparkContext.getConf()  # spark-defaults.conf and --conf, as the JVM started
    for key, value in TUNING_DEFAULTS.items():
        if not given.contains(key):
            spark.conf.set(key, value)
    return spark


def connect_session(url: str):
    """A Spark Connect session on the server at `url` (sc://host:port), with the session
    settings Connect lets a client set. A server that does not answer is one clear error
    naming the address, not a gRPC traceback after minutes of retries.

    Unless the URL names a session (`;session_id=...`), every trailbound client of a server
    joins one shared session (`shared_session_id`), which none of them releases: a server
    keeps each session's Python daemon until it stops (measured: every CLI run's own session
    left a 48 MB `pyspark.daemon` behind, released or not), and a session's Python workers
    serve only its own jobs (a new session's first job forked a daemon and imported the
    engine anew: 1.1 s idle against 0.1 s in a session whose workers are up). So nothing
    may interrupt all of the session's operations (`interruptAll`): they are every client's."""
    from pyspark.sql import SparkSession

    address = _address(url)
    named = f"sc://{address[0]}:{address[1]}"  # never the URL's parameters: a token may be among them
    try:
        socket.create_connection(address, timeout=5).close()
    except OSError as exc:
        raise SparkConnectUnavailable(_down(named, exc.strerror or str(exc))) from None
    shared = ";session_id=" not in url
    first = _generation_hint(address) if shared else 0
    try:
        for generation in range(first, SHARED_SESSION_GENERATIONS) if shared else [None]:
            session_url = url if generation is None else _with_session(url, shared_session_id(address, generation))
            spark = SparkSession.builder.remote(session_url).getOrCreate()
            spark.release_session_on_close = not shared  # stop() leaves the shared session to the others
            try:
                for key in CONNECT_SESSION_CONF:  # the first call that reaches the server
                    spark.conf.set(key, SESSION_CONF[key])
            except Exception as exc:
                if not (shared and _closed(exc)):
                    raise
                spark.stop()  # a session released or expired on the server: the next generation
                continue
            if shared and generation != first:
                _remember_generation(address, generation)
            for key, value in TUNING_DEFAULTS.items():
                if spark.conf.get(key, None) in (None, _SPARK_DEFAULTS.get(key)):
                    spark.conf.set(key, value)
            return spark
    except Exception as exc:  # grpc's errors and pyspark's wrappers of them
        if type(exc).__module__.startswith(("grpc", "pyspark.errors")) and _unavailable(exc):
            raise SparkConnectUnavailable(_down(named, " ".join(str(exc).split())[:200])) from None
        raise
    raise TrailboundError(f"Spark Connect server {named}: the shared sessions of generations {first} to "
                          f"{SHARED_SESSION_GENERATIONS - 1} are all closed; restart the server, or name a session "
                          "in the URL (;session_id=UUID)")


# How many successive shared sessions clients go through: the server closes an idle
# session after spark.connect.session.manager.defaultSessionTimeout (Spark's default an
# hour; the devtool's server a week), and an operator or a test may close it; a closed
# session's id is never usable again, so each closing moves the clients on to the next
# generation (one Python daemon more on the server). Each client probes from the
# generation it last used (`_generation_hint`), one quick refused call per closed one; a
# restarted server has closed none, and its clients go on from their hints.
SHARED_SESSION_GENERATIONS = 100_000
_SESSIONS = uuid.UUID("5f1c0d2e-7a43-4b8e-9c61-2e0b7d4a9f35")  # the namespace of the shared ids


def shared_session_id(address: tuple[str, int], generation: int = 0) -> str:
    """The session every trailbound client of the server at `address` joins (per OS user:
    one user's runs never see another's session state)."""
    return str(uuid.uuid5(_SESSIONS, f"{_user()}@{address[0]}:{address[1]}#{generation}"))


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        return str(os.getuid())


def _hint_file(address: tuple[str, int]) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "trailbound" / f"connect-session-{_user()}-{address[0]}-{address[1]}"


def _generation_hint(address: tuple[str, int]) -> int:
    """The shared session's generation this user's clients last moved to (0: none known).
    Only a hint: the sessions before it are closed for every client, whichever host."""
    try:
        return max(0, int(_hint_file(address).read_text()))
    except (OSError, ValueError):
        return 0


def _remember_generation(address: tuple[str, int], generation: int) -> None:
    try:  # best effort: a home that cannot be written only costs the next client its probes
        path = _hint_file(address)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(generation))
    except OSError:
        pass


def _with_session(url: str, session_id: str) -> str:
    base, _, params = url.partition(";")
    return f"{base.rstrip('/')}/;{params + ';' if params else ''}session_id={session_id}"


def _closed(exc: Exception) -> bool:
    text = str(exc)
    return "SESSION_CLOSED" in text or "SESSION_NOT_FOUND" in text


# Spark's own values of TUNING_DEFAULTS: a server that reports these was not tuned by
# its deployment, and trailbound's defaults apply as on a classic session.
_SPARK_DEFAULTS = {"spark.sql.shuffle.partitions": "200", "spark.sql.adaptive.enabled": "true"}


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "sc" or not parts.hostname:
        raise TrailboundError(f"{REMOTE_ENV} / --remote {url.split(';')[0]!r}: expected sc://HOST:PORT")
    return parts.hostname, parts.port or 15002


def _down(url: str, why: str) -> str:
    return (f"Spark Connect server {url} is not reachable ({why}); start it "
            "(`python -m trailbound.devtools.sparkconnect start DIR`, `make connect`) or unset SPARK_REMOTE")


def _unavailable(exc: BaseException) -> bool:
    text = str(exc)
    return any(word in text for word in ("UNAVAILABLE", "failed to connect", "Connection refused",
                                         "Deadline Exceeded", "DEADLINE_EXCEEDED"))


def is_connect(spark) -> bool:
    """A Spark Connect session (no SparkContext here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ or "SPARK_SUBMIT" in os.environ


def workers_import_trailbound(env: dict) -> dict:
    """Make `env` (the environment a JVM about to start inherits) start Spark's Python
    workers with this interpreter and a path that finds trailbound. Without it a CLI run
    by its absolute path with no virtualenv on PATH (cron, systemd, a BashOperator) had
    its workers run `python3` from PATH: "No module named 'trailbound'". A PYSPARK_PYTHON
    already set (a cluster's) is kept."""
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    here = str(Path(__file__).resolve().parents[1])  # the directory that holds trailbound/
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in paths:
        env["PYTHONPATH"] = os.pathsep.join([here, *paths])
    return env


def parallelism(spark) -> int:
    """How many tasks the session runs at once: spark.default.parallelism when set (the
    Connect server devtool sets it), else the SparkContext's on a classic session, else
    the cores a local[N] / local[*] master names."""
    given = spark.conf.get("spark.default.parallelism", None)
    if given:
        return max(int(given), 1)
    if not is_connect(spark):
        return max(spark.sparkContext.defaultParallelism, 1)
    master = spark.conf.get("spark.master", "local[*]") or "local[*]"
    inside = master[master.find("[") + 1:master.find("]")] if master.startswith("local[") else ""
    if inside.isdigit():
        return max(int(inside), 1)
    return max(os.cpu_count() or 1, 1) if master.startswith("local") else 8


def numbered(spark, count: int):
    """A frame of `count` rows (`n`: 0..count-1), one per partition: a task each for a
    mapInArrow over it. A range, whose size the planner takes for a few bytes, and so the
    size of what a mapInArrow makes of it (every record of a log): a join with such a
    frame on one side names its build side with a hint (`F.broadcast` of the other side,
    or `.hint("shuffle_hash")` on it), else the planner may broadcast the records (a
    trail's join did once and ran out of a 1 GB heap). It was a frame of unknown size: an
    RDD's rows, and on Connect a Python data source's, whose planning cost the server
    three Python daemons a run (about 5 CPU-s: docs/benchmarks/capture-cli.md)."""
    return spark.range(0, count, 1, count).withColumnRenamed("id", "n")


def run_tasks(spark, function: Callable[[object], object], items: Sequence[object]) -> list:
    """`function(item)` for each item in a Spark task of its own, the results in the
    items' order: `parallelize(items, len(items)).map(function).collect()` on any session.
    The items travel pickled with the function, so keep them small (task descriptions)."""
    import pyarrow as pa

    if not items:
        return []
    shipped = pickle.dumps(list(items))

    def run(batches):
        todo = pickle.loads(shipped)
        for batch in batches:
            numbers = batch.column(0).to_pylist()
            yield pa.RecordBatch.from_pydict(
                {"n": numbers, "result": [pickle.dumps(function(todo[n])) for n in numbers]},
                schema=pa.schema([("n", pa.int64()), ("result", pa.binary())]))

    numbers = numbered(spark, len(items))  # nothing joins it (see numbered)
    rows = numbers.mapInArrow(run, "n long, result binary").collect()
    return [pickle.loads(row["result"]) for row in sorted(rows, key=lambda row: row["n"])]


def on_demand(spark) -> Callable[[], object]:
    """`spark` as a function that gives the session: a SparkSession itself, or a function
    that starts one (called only when a run turns out to need Spark, so that a run that
    does not never pays for a JVM)."""
    return spark if callable(spark) else (lambda: spark)
