"""DAG factories. Each DAG file under dags/ is configuration: it calls one of these with
its group's settings (written there by `trailbound dags generate` from the configuration
file), so that parsing a DAG file reads no file and opens no connection.

Spark jobs run through SparkSubmitOperator and the `spark_default` connection (local[*]
by default, a cluster master when the connection points at one), skipped when the
metadata store says there is nothing to do (TrailboundSparkSubmitOperator); everything
else calls the engine through TrailboundHook, which resolves the connections and hands
the engine its DSNs: no task body opens a database or a transaction itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from importlib import import_module
from pathlib import Path

from airflow.sdk import DAG, Asset, DeltaDataIntervalTimetable, Param, task
from airflow.sdk.exceptions import AirflowFailException

from trailbound_airflow.hooks import TrailboundHook
from trailbound_airflow.operators import TrailboundSparkSubmitOperator
from trailbound_airflow.sensors import ArchiveCoversIntervalSensor, LongRunningTransactionSensor

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "jobs"
# Task logs stay readable: Spark at WARN from the driver's first line (our log4j2
# configuration; spark.log.level alone applies only once the context is up), no console
# progress bars.
SPARK_CONF = {
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{REPO / 'include/config/log4j2.properties'}",
    "spark.log.level": "WARN",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}
# Every step is safe to run again (checkpoints make it exactly once), and capture waits on
# its previous run (depends_on_past): a run that fails for good holds the group until an
# operator clears it. So a transient fault (a server restarting, a task killed, an
# execution API that answered late on a loaded host) gets three retries, 30 s, 60 s and
# 120 s after it, as GoldenGate's AUTORESTART would, before the run fails.
DEFAULT_ARGS = {"retries": 3, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True,
                "max_retry_delay": timedelta(minutes=5), "owner": "trailbound"}


def callbacks(paths: Sequence[str]) -> list[Callable] | None:
    """The configured failure callbacks (`airflow.on_failure_callbacks`, dotted paths to
    functions or notifier instances), imported here: an import is not I/O, and a wrong
    path is an import error the DAG list shows at once."""
    found = []
    for path in paths:
        module, _, name = path.rpartition(".")
        found.append(getattr(import_module(module), name))
    return found or None


def _dag(dag_id: str, doc_md: str, start_date: datetime, on_failure_callbacks: Sequence[str], tags: list[str],
         *, default_args: dict = DEFAULT_ARGS, **settings) -> DAG:
    """What every trailbound DAG shares: no catch-up (a missed interval is covered by the
    next run's data), the trailbound tag, the default args and the configured failure
    callbacks."""
    return DAG(dag_id=dag_id, doc_md=doc_md, start_date=start_date, catchup=False, tags=["trailbound", *tags],
               default_args=default_args, on_failure_callback=callbacks(on_failure_callbacks), **settings)


def trail_asset(trail: str) -> Asset:
    """The Asset a trail is published as: produced by its writer, scheduling its readers."""
    return Asset(name=f"trail {trail}", uri=f"trailbound://trail/{trail.strip('/')}")


def pulls(dag_run, archive_short_of_interval: bool) -> bool:
    """May this run read a live source's slot? A slot has one position, now: a pull
    archives everything not archived yet, whichever run does it. A run pulls when the
    archive does not reach its data interval's end yet (the scheduled run, the catch-up
    run after a pause, a manual trigger, and the retry of any of them after a failed
    pull: without its pull, its wait for the archive would wait for a run that cannot
    start while it runs). A backfill run never pulls (several may run at once, and the
    slot takes one reader), nor does a run whose interval is archived already (an old
    run cleared and run again): its capture reads the archived segments as any run does."""
    run_type = getattr(dag_run, "run_type", None)
    if getattr(run_type, "value", run_type) == "backfill":
        return False
    return archive_short_of_interval


def capture_dag(*, dag_id: str, doc_md: str, group: str, source: str, interval: timedelta, start_date: datetime,
                trail: str, pull: bool = False, on_failure_callbacks: Sequence[str] = ()) -> DAG:
    """Capture per extract group: (for a live PostgreSQL source, `pull`: first archive its
    WAL through the slot) wait until the archive covers the data interval, run one
    capture batch up to its end (a pulling run: up to the pull's end), validate the new
    trail files, publish the trail."""
    with _dag(dag_id, doc_md, start_date, on_failure_callbacks, ["capture", group],
              schedule=DeltaDataIntervalTimetable(interval), max_active_runs=1,
              default_args={**DEFAULT_ARGS, "depends_on_past": True}) as dag:
        # After a skipped pull (a backfill run) the archive may cover the interval already.
        wait = ArchiveCoversIntervalSensor(task_id="wait_for_archive", source=source, poke_interval=30,
                                           timeout=interval.total_seconds() * 4, trigger_rule="none_failed")
        if pull:
            @task
            def pull_archive(dag_run=None, data_interval_end=None) -> str:
                """`trailbound archive pull`: the slot's changes up to the server's WAL
                position now, into archive segments; then the slot is confirmed. Skipped
                by backfill runs and intervals already archived (see `pulls`)."""
                from airflow.sdk.exceptions import AirflowSkipException

                from trailbound.archive.segments import discover, threads_short_of

                hook = TrailboundHook()
                if not pulls(dag_run, threads_short_of(discover(hook.config.archive_dir(source)),
                                                       data_interval_end) != []):
                    raise AirflowSkipException(f"no pull: the archive already reaches this interval's end "
                                               f"({data_interval_end}), or this is a backfill run; capture reads "
                                               f"what is archived and the slot waits for the next run")
                print(hook.pull_archive(source).describe())
                # Capture reads whole segments archived by its --until: up to the end of
                # this pull (later than the interval's end), so that what the run pulled
                # is captured now and not one interval later.
                segments = discover(hook.config.archive_dir(source))
                return max([data_interval_end, *[s.next_time for s in segments[-1:]]]).isoformat()

            pull_archive() >> wait
            until = "{{ ti.xcom_pull(task_ids='pull_archive') or data_interval_end.isoformat() }}"
        else:
            until = "{{ data_interval_end.isoformat() }}"

        @task
        def write_checkpoint_before() -> int:
            """The trail seqno committed before this run: the validation checks what follows."""
            state = TrailboundHook().extract_state(group)
            return state.write.position.seqno if state else 0

        capture = TrailboundSparkSubmitOperator(
            kind="capture", group=group, task_id="capture", application=str(JOBS / "extract.py"),
            conn_id="spark_default", application_args=[group, "--until", until],
            conf=SPARK_CONF, name=f"trailbound-capture-{group}")

        published = trail_asset(trail)

        # A data check: its verdict fails the task at once (retrying finds the same data);
        # a fault on the way to it (a killed process, a lost connection) is retried.
        @task(outlets=[published])
        def validate_trail(after_seqno: int, outlet_events=None) -> str:
            """Great Expectations on the new trail files: commit order, indicators, no
            rolled-back transaction, record counts. The trail's Asset event names the new
            files and the committed write position, for whoever it triggers."""
            checked = TrailboundHook().validate_new_trail(group, source, after_seqno)
            if not checked.report.success:
                raise AirflowFailException(checked.report.describe())
            outlet_events[published].extra = {
                "extract": group, "new_files": [path.name for path in checked.files],
                "write_position": checked.write_position, "last_csn": checked.last_csn}
            return checked.report.describe()

        before = write_checkpoint_before()
        wait >> before >> capture >> validate_trail(before)
    return dag


def monitor_dag(*, dag_id: str, doc_md: str, group: str, interval: timedelta, start_date: datetime,
                on_failure_callbacks: Sequence[str] = (), alert_notifiers: Sequence[str] = ()) -> DAG:
    """Long-running transaction monitor per extract: waits in the triggerer, then alerts
    through LongTransactionNotifier (and `alert_notifiers`, dotted paths to notifier
    instances) and fails, firing the DAG's failure callbacks, when a transaction is open
    longer than WARNLONGTRANS."""
    from trailbound_airflow.notifiers import LongTransactionNotifier

    with _dag(dag_id, doc_md, start_date, on_failure_callbacks, ["monitor", group],
              schedule=DeltaDataIntervalTimetable(interval), max_active_runs=1) as dag:
        LongRunningTransactionSensor(task_id="long_running_transactions", group=group, poke_interval=60,
                                     timeout=interval.total_seconds() * 4, retries=0,
                                     notifier=LongTransactionNotifier(notifiers=callbacks(alert_notifiers) or ()))
    return dag


# Control commands, each one `trailbound` (GGSCI-like) command line: the UI and the shell
# speak one language, and the CLI's validation and messages serve both. name ->
# (kind of group it takes, how it reads the argument, the command line).
CONTROL_COMMANDS = {
    "skiptrans": ("extract", "XID", lambda g, a: ["send", "extract", g, "skiptrans", a]),
    "forcetrans": ("extract", "XID", lambda g, a: ["send", "extract", g, "forcetrans", a]),
    "showtrans": ("extract", "", lambda g, a: ["send", "extract", g, "showtrans"]),
    "brreset": ("extract", "", lambda g, a: ["start", "extract", g, "--brreset"]),
    "alter_extract_begin": ("extract", "now | TIME | scn N", lambda g, a: ["alter", "extract", g, "begin", *a.split()]),
    "register_logretention": ("extract", "", lambda g, a: ["register", "extract", g, "logretention"]),
    "unregister_logretention": ("extract", "", lambda g, a: ["unregister", "extract", g, "logretention"]),
    "alter_replicat": ("replicat", "atcsn N | aftercsn N | extseqno S extrba R",
                       lambda g, a: ["alter", "replicat", g, *a.split()]),
    "purge_trails": ("none", "", lambda g, a: ["purge", "trails"]),
    "info": ("any", "", None),
}


def control_command(command: str, group: str, argument: str, groups: dict[str, str]) -> list[str]:
    """The command line a control run executes, or ValueError saying what is wrong."""
    if command not in CONTROL_COMMANDS:
        raise ValueError(f"unknown command {command!r}; one of {', '.join(CONTROL_COMMANDS)}")
    kind, needs, build = CONTROL_COMMANDS[command]
    if kind == "none":  # not about one group (purge trails: every trail the store knows)
        return build(group, argument.strip())
    if group not in groups:
        raise ValueError(f"unknown group {group!r}; one of {', '.join(groups)}")
    if kind != "any" and groups[group] != kind:
        raise ValueError(f"{command} applies to a {kind} group; {group} is a {groups[group]}")
    if needs and not argument.strip():
        raise ValueError(f"{command} needs an argument: {needs}")
    if build is None:  # info: the group's status and checkpoints
        return ["info", groups[group], group, "--showch"]
    return build(group, argument.strip())


def control_dag(*, dag_id: str, doc_md: str, start_date: datetime, groups: dict[str, str],
                on_failure_callbacks: Sequence[str] = ()) -> DAG:
    """Manual control from the UI: one validated command per run, run through the engine
    (recorded as a directive for the next run, or applied at once); the result is the
    task's return value and log. `groups` maps each group name to extract/pump/replicat."""
    names = sorted(groups)
    params = {
        "command": Param("showtrans", enum=list(CONTROL_COMMANDS), description="what to do: "
                         + "; ".join(f"{name} ({'no group' if kind == 'none' else kind}"
                                     f"{', argument ' + needs if needs else ''})"
                                     for name, (kind, needs, _) in CONTROL_COMMANDS.items())),
        "group": Param(names[0] if names else "", enum=names or [""], description="the group it applies to"),
        "argument": Param("", type="string", maxLength=256,
                          description="XID for skiptrans/forcetrans; now|TIME|scn N for alter_extract_begin; "
                                      "atcsn N|aftercsn N|extseqno S extrba R for alter_replicat"),
    }
    with _dag(dag_id, doc_md, start_date, on_failure_callbacks, ["control"], schedule=None, params=params,
              default_args={**DEFAULT_ARGS, "retries": 0}) as dag:

        @task
        def run_command(params: dict | None = None) -> str:
            argv = control_command(params["command"], params["group"], params["argument"], groups)
            return TrailboundHook().run_command(argv)

        run_command()
    return dag


def pump_dag(*, dag_id: str, doc_md: str, group: str, start_date: datetime, source_trail: str,
             remote_trail: str, on_failure_callbacks: Sequence[str] = ()) -> DAG:
    """Pump per group: runs when the trail it reads is published (and by hand), ships
    what is new, publishes the remote trail."""
    with _dag(dag_id, doc_md, start_date, on_failure_callbacks, ["pump", group],
              schedule=[trail_asset(source_trail)], max_active_runs=1) as dag:
        TrailboundSparkSubmitOperator(kind="pump", group=group, task_id="pump", application=str(JOBS / "pump.py"),
                                      conn_id="spark_default", application_args=[group], conf=SPARK_CONF,
                                      name=f"trailbound-pump-{group}", outlets=[trail_asset(remote_trail)])
    return dag


def replicat_dag(*, dag_id: str, doc_md: str, group: str, start_date: datetime, trail: str,
                 on_failure_callbacks: Sequence[str] = ()) -> DAG:
    """Replicat per group: runs when the trail it applies is published (and by hand),
    applies it exactly once, then checks the replica with Great Expectations."""
    with _dag(dag_id, doc_md, start_date, on_failure_callbacks, ["replicat", group],
              schedule=[trail_asset(trail)], max_active_runs=1) as dag:
        apply = TrailboundSparkSubmitOperator(kind="replicat", group=group, task_id="replicat",
                                              application=str(JOBS / "replicat.py"), conn_id="spark_default",
                                              application_args=[group], conf=SPARK_CONF,
                                              name=f"trailbound-replicat-{group}")

        # The check runs after an idle (skipped) apply too: a target changed behind the
        # replicat's back is found whether or not there was anything new to apply.
        # As validate_trail: a verdict fails at once, a fault is retried.
        @task(trigger_rule="none_failed")
        def check_replica() -> str:
            """Row counts and per-table checksums of the target against what the applied
            trail says should be there (or the source's truth file, once applied through);
            for a live PostgreSQL source, a compare with the source itself."""
            report = TrailboundHook().check_replica(group)
            if not report.success:
                raise AirflowFailException(report.describe())
            return report.describe()

        apply >> check_replica()
    return dag


def compare_dag(*, dag_id: str, doc_md: str, group: str, source: str, interval: timedelta, start_date: datetime,
                wait_seconds: float, on_failure_callbacks: Sequence[str] = ()) -> DAG:
    """Compare per live source and replicat: on its schedule, or triggered from the UI
    with a table pattern, compares the source's tables with the replicat's target tables
    (`trailbound compare`), waits up to `wait_seconds` for the replicat to get past each
    difference, and fails (firing the alerts) when rows are out of sync."""
    params = {
        "table": Param("*", type="string", minLength=1, maxLength=256,
                       description="source tables to compare: schema.table with * and ? (default: every mapped one)"),
        "wait_seconds": Param(wait_seconds, type="number", minimum=0, maximum=86400,
                              description="how long to wait for the replicat to get past a difference before "
                                          "reporting it in flight"),
    }
    with _dag(dag_id, doc_md, start_date, on_failure_callbacks, ["compare", source, group],
              schedule=DeltaDataIntervalTimetable(interval), max_active_runs=1, params=params,
              default_args={**DEFAULT_ARGS, "retries": 0}) as dag:

        @task
        def compare_tables(params: dict | None = None) -> str:
            """The compare, then Great Expectations on its figures: nothing missing, extra
            or different once confirmed. The report file's path is in the log."""
            from trailbound import quality

            report = TrailboundHook().compare(source, group, pattern=params["table"],
                                              wait_seconds=float(params["wait_seconds"]))
            print(report.describe())
            checked = quality.validate_compare(report)
            if not checked.success:
                raise ValueError(checked.describe())
            return checked.describe()

        compare_tables()
    return dag


def load_dag(*, dag_id: str, doc_md: str, group: str, source: str, start_date: datetime,
             on_failure_callbacks: Sequence[str] = ()) -> DAG:
    """Initial load per live source and replicat, triggered by hand only (no schedule):
    `trailbound load` with a table pattern, chunk size and mode; its progress (chunks and
    rows done per table, with an estimate) goes to the task log as it happens."""
    params = {
        "table": Param("*.*", type="string", minLength=1, maxLength=256,
                       description="source tables to load: schema.table with * and ? (default: every mapped one)"),
        "chunk_rows": Param(50_000, type="integer", minimum=1, maximum=100_000_000,
                            description="rows per key-range chunk (one Spark task each)"),
        "mode": Param("snapshot", type="string", enum=["snapshot", "watermark"],
                      description="snapshot: before the first pull, at the slot's exported snapshot; "
                                  "watermark: any time, between low and high watermarks (resumable)"),
    }
    with _dag(dag_id, doc_md, start_date, on_failure_callbacks, ["load", source, group], schedule=None,
              max_active_runs=1, params=params, default_args={**DEFAULT_ARGS, "retries": 0}) as dag:

        @task(task_id="load_tables")
        def load_tables(params: dict | None = None) -> str:
            """The load; each progress line is printed (so logged) the moment it is said."""
            result = TrailboundHook().load(source, group, mode=params["mode"], pattern=params["table"],
                                           chunk_rows=int(params["chunk_rows"]),
                                           say=lambda line: print(line, flush=True))
            print(result.describe())
            return result.describe()

        load_tables()
    return dag


def retention_dag(*, dag_id: str, doc_md: str, interval: timedelta, start_date: datetime,
                  on_failure_callbacks: Sequence[str] = ()) -> DAG:
    """Archive-log retention: purge redo segments below the minimum SCN every registered
    capture still needs, honouring the policies; publishes what it did."""
    with _dag(dag_id, doc_md, start_date, on_failure_callbacks, ["retention"],
              schedule=DeltaDataIntervalTimetable(interval), max_active_runs=1) as dag:

        retention = Asset(name="archive retention", uri="trailbound://retention/archive")

        @task(outlets=[retention])
        def purge_archive(outlet_events=None) -> str:
            """Purge redo segments, then trail files every reader has passed
            (PURGEOLDEXTRACTS); the Asset event carries what was purged and kept per
            source, and per trail under "trail_purge"."""
            result, trails = TrailboundHook().purge()
            outlet_events[retention].extra = {**result.summary(), "trail_purge": trails.summary()}
            report = f"{result.describe()}\n{trails.describe()}"
            print(report)
            return report

        purge_archive()
    return dag
