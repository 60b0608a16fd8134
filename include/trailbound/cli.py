"""The `trailbound` command line. Its verbs mirror GGSCI's where GoldenGate has one
(INFO EXTRACT ... SHOWCH, SEND EXTRACT ... SKIPTRANS, ALTER REPLICAT ... ATCSN, LOGDUMP).

    trailbound archive scan|list|verify      the redo archive and its catalog
    trailbound archive mark-backed-up        count a backup of segments (the backedup policy)
    trailbound extract run EXT1 [--until T]  one capture batch (--pull: pull a PostgreSQL source meanwhile)
    trailbound add|delete extract EXT1       add a capture group (ADD EXTRACT), or delete its checkpoints
    trailbound alter extract EXT1 begin ...  reposition capture
    trailbound send extract EXT1 showtrans|skiptrans XID|forcetrans XID   directives for the next run
    trailbound start extract EXT1 --brreset  start options for the next run
    trailbound info all                      every group: status, lag at checkpoint, time since it
    trailbound info extract EXT1 [--showch]  status and checkpoints (EXT* or *: every matching group)
    trailbound logdump TRAILFILE [--json]    print trail records (--from RBA, --count N)
    trailbound pump run PMP1                 ship committed trail files to the remote trail
    trailbound add|delete|info pump PMP1     manage pump groups (info: --showch)
    trailbound purge trails [--dry-run]      delete trail files every reader has passed (PURGEOLDEXTRACTS)
    trailbound register|unregister extract EXT1 logretention   keep the log EXT1 needs (or stop)
    trailbound retention run [--dry-run]     purge redo segments no registered capture needs
    trailbound info retention                required SCNs, what is purgeable, why the rest stays
    trailbound replicat run REP1             apply the trail to the target, exactly once
    trailbound add checkpointtable [S.NAME]  create the checkpoint table in the target
    trailbound alter replicat REP1 atcsn N   reposition (atcsn|aftercsn N, extseqno S extrba R)
    trailbound info replicat REP1 [--showch] checkpoint table row and file checkpoint
    trailbound target create [--source S]    create target tables from defs.json
    trailbound dags generate [--directory D] write one Airflow DAG file per configured group
    trailbound simulate                      write the simulated source's archive
    trailbound add|delete|info source SRC    a live PostgreSQL source: publication, slot, defs.json
    trailbound archive pull SRC              archive a PostgreSQL source's WAL through its slot
    trailbound compare SRC REP1 [--table P]  compare source and target tables (Veridata-style), confirm
                                             differences once replicat is past them; --repair-script FILE
    trailbound load SRC REP1 [--table P]     initial load on Spark: at the slot's snapshot, or between watermarks

Every verb reads the configuration file (--config, else $TRAILBOUND_CONFIG) and the
metadata store's DSN from the variable the file names. Errors a user can act on are
printed as one `ERROR` paragraph naming the file, key or position, exit status 1; a
command line that does not parse prints its usage, exit status 2. Times are UTC.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from trailbound import config as configuration
from trailbound.errors import TrailboundError, spark_task_errors_as_ours


def _utc_time(text: str) -> datetime:
    """--until and friends: ISO-8601; a time without a zone is UTC, like the archive's."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time") from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; positions and counts start at 0")
    return value


class Context:
    """What a verb needs, opened lazily: a verb that needs no database opens none."""

    def __init__(self, args: argparse.Namespace, dsns: dict[str, str] | None = None):
        self.args = args
        self.dsns = dict(dsns or {})  # variable -> DSN, given by the caller (see main)
        self._config = None
        self._store = None
        self._spark = None

    @property
    def config(self) -> configuration.Config:
        if self._config is None:
            self._config = configuration.load(self.args.config)
        return self._config

    @property
    def store(self):
        if self._store is None:
            from trailbound.metadata import MetadataStore, dsn_from_env

            variable = self.config.metadata.dsn_env
            self._store = MetadataStore.open(self.dsns.get(variable) or dsn_from_env(variable))
        return self._store

    @property
    def target_dsn(self) -> str | None:
        """The target's DSN when the caller gave it; None: the engine reads the variable."""
        return self.dsns.get(self.config.target.dsn_env)

    @property
    def spark(self):
        if self._spark is None:
            from trailbound import spark

            self._spark = spark.session(f"trailbound {' '.join(sys.argv[1:3])}".strip())
        return self._spark

    def source_name(self) -> str:
        return self.config.source_name(getattr(self.args, "source", None))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


# ---------------------------------------------------------------- archive

def archive_scan(ctx: Context) -> int:
    from trailbound.archive.catalog import ArchiveCatalog

    source = ctx.source_name()
    result = ArchiveCatalog(ctx.store, source).scan(ctx.config.archive_dir(source), ctx.spark)
    print(f"Source {source}: {result.describe()}")
    return 0


def archive_list(ctx: Context) -> int:
    from trailbound.archive.catalog import ArchiveCatalog, sequence_ranges
    from trailbound.ggsci import utc

    source = ctx.source_name()
    archive_dir = ctx.config.archive_dir(source)
    catalog = ArchiveCatalog(ctx.store, source)
    entries = [e for e in catalog.entries() if ctx.args.thread is None or e.segment.thread == ctx.args.thread]
    print(f"Source {source}, archive {archive_dir}")
    if not ctx.args.summary:
        print(f"{'THREAD':>6} {'SEQUENCE':>9} {'FIRST_SCN':>12} {'NEXT_SCN':>12} {'FIRST_TIME (UTC)':<20} {'NEXT_TIME (UTC)':<20} " \
              f"{'RECORDS':>9} {'BYTES':>11} STATUS")
    for entry in [] if ctx.args.summary else entries:
        s = entry.segment
        flags = entry.status + (" closed" if s.closed else "")
        flags += f" backed-up x{entry.backed_up_count}" if entry.backed_up_count else ""
        if entry.purge_reason and entry.state != "available":
            flags += f" {utc(entry.purged_at)}: {entry.purge_reason}" if entry.purged_at else \
                f": {entry.purge_reason}"
        elif entry.restored_at:
            flags += f" (restored {utc(entry.restored_at)} after a purge)"
        print(f"{s.thread:>6} {s.sequence:>9} {s.first_scn:>12} {s.next_scn:>12} "
              f"{utc(s.first_time)[:19]}  {utc(s.next_time)[:19]}  "
              f"{s.records:>9} {s.bytes:>11} {flags}")
    by_thread: dict[int, list] = {}
    for entry in entries:
        by_thread.setdefault(entry.segment.thread, []).append(entry)
    for thread, thread_entries in sorted(by_thread.items()):
        segments = [e.segment for e in thread_entries]
        states = []
        for state in ("available", "missing", "purged"):
            numbers = [e.segment.sequence for e in thread_entries if e.status == state]
            if numbers:
                states.append(f"{sequence_ranges(numbers)} {state}")
        print(f"Thread {thread}: sequences {', '.join(states)}, "
              f"scn {segments[0].first_scn}..{segments[-1].next_scn}, "
              f"{utc(segments[0].first_time)}..{utc(segments[-1].next_time)}, "
              f"{sum(s.records for s in segments)} records" + (", closed" if segments[-1].closed else ""))
    horizon = catalog.horizon(ctx.args.until)
    if horizon is None:
        print("Horizon: nothing cataloged yet")
    else:
        limit = f"limited by thread {horizon.limiting_thread}" if horizon.limiting_thread else "every thread closed"
        print(f"Horizon: scn {horizon.scn} ({limit})")
    pending = catalog.pending(archive_dir) if archive_dir.is_dir() else []
    if pending:
        print(f"{len(pending)} segment(s) on disk not cataloged yet: run `trailbound archive scan`")
    return 0


def archive_verify(ctx: Context) -> int:
    from trailbound.archive.catalog import ArchiveCatalog

    source = ctx.source_name()
    archive_dir = ctx.config.archive_dir(source)
    result = ArchiveCatalog(ctx.store, source).verify(archive_dir, ctx.spark)
    print(f"Source {source}: {result.describe(archive_dir)}")
    return 0


def archive_mark_backed_up(ctx: Context) -> int:
    from trailbound.archive.catalog import ArchiveCatalog

    source = ctx.source_name()
    marked = ArchiveCatalog(ctx.store, source).mark_backed_up(ctx.args.thread, ctx.args.through_sequence)
    print(f"Source {source}: {marked} available segment(s) marked backed up once more")
    return 0


# ---------------------------------------------------------------- a live PostgreSQL source

def archive_pull(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import pull

    print(pull(ctx.config, ctx.args.source).describe())
    return 0


def add_source(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import add_source as add

    print(add(ctx.config, ctx.args.source, refresh_defs=ctx.args.refresh_defs))
    return 0


def delete_source(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import delete_source as delete

    print(delete(ctx.config, ctx.args.source))
    return 0


def alter_source(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import accept_gap

    print(accept_gap(ctx.config, ctx.args.source))
    return 0


def load(ctx: Context) -> int:
    from trailbound.load.run import run_load

    def say(line: str) -> None:  # as it happens: the Airflow task log shows the load moving
        print(line, flush=True)

    result = run_load(ctx.spark, ctx.store, ctx.config, ctx.args.source, ctx.args.replicat, mode=ctx.args.mode,
                      pattern=ctx.args.table, chunk_rows=ctx.args.chunk_rows, say=say)
    print(result.describe())
    return 0


def info_source(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import describe_source

    print(describe_source(ctx.config, ctx.args.source))
    return 0


# ---------------------------------------------------------------- archive-log retention

def register_extract(ctx: Context) -> int:
    from trailbound import retention

    registration = retention.register(ctx.store, ctx.config, ctx.args.group)
    print(f"EXTRACT {registration.group} registered with logretention on source {registration.source}: first scn "
          f"{registration.first_scn}; retention keeps every segment it can still need")
    return 0


def unregister_extract(ctx: Context) -> int:
    from trailbound import retention

    name = retention.unregister(ctx.store, ctx.args.group)
    print(f"EXTRACT {name} unregistered: it no longer holds redo log against retention")
    return 0


def retention_run(ctx: Context) -> int:
    from trailbound import retention

    print(retention.run_retention(ctx.store, ctx.config, dry_run=ctx.args.dry_run,
                                  source=ctx.args.source).describe())
    return 0


def info_retention(ctx: Context) -> int:
    from trailbound import retention

    print(retention.describe_retention(ctx.store, ctx.config, source=ctx.args.source))
    return 0


# ---------------------------------------------------------------- extract

def extract_run(ctx: Context) -> int:
    from trailbound.capture.run import run_extract

    if ctx.args.pull:
        return _extract_run_pulling(ctx)
    result = run_extract(ctx.spark, ctx.store, ctx.config, ctx.args.group, until=ctx.args.until,
                         brreset=ctx.args.brreset)
    print(result.describe())
    return 0


def _extract_run_pulling(ctx: Context) -> int:
    """`extract run G --pull`: `archive pull` of the extract's PostgreSQL source in a child
    process, and capture here at the same time: a round over what the archive holds
    whenever the last one ends, and one more once the pull has ended. The rounds keep
    Spark's JVM busy (and warm) while the WAL is still being read, instead of starting it
    cold after the pull; each round is an ordinary run over complete segments (the pull
    writes the manifest last), so the trail is what a pull then a run would write."""
    import subprocess
    import tempfile

    from trailbound.capture.run import run_extract

    if ctx.args.until:
        raise TrailboundError("--pull reads the source up to now: it cannot be given with --until (a past interval "
                              "is captured from what is archived already)")
    name = ctx.config.extract_name(ctx.args.group)
    source = ctx.config.source_name(ctx.config.extract(name).source)
    ctx.config.postgres(source)  # a ConfigError unless the source is a PostgreSQL database
    config = ["--config", str(ctx.args.config)] if ctx.args.config else []  # else the child's environment names it
    # The child's output goes to files, not pipes: nothing reads it until the end.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        pulling = subprocess.Popen([sys.executable, "-m", "trailbound.cli", *config, "archive", "pull", source],
                                   stdout=out, stderr=err, text=True)
        ended: list[float] = []  # when the pull ended, noted by a thread that waits for it
        waiter = threading.Thread(target=lambda: (pulling.wait(), ended.append(time.monotonic())), daemon=True)
        waiter.start()
        rounds, brreset = [], ctx.args.brreset
        try:
            while True:
                pull_ended = bool(ended)
                rounds.append(run_extract(ctx.spark, ctx.store, ctx.config, name, brreset=brreset))
                brreset = False  # one normal recovery: the first round's
                if pull_ended:
                    break
                if rounds[-1].note:  # nothing new archived yet
                    waiter.join(timeout=0.5)
        except BaseException:
            pulling.kill()
            waiter.join()
            raise
        out.seek(0)
        err.seek(0)
        pulled, errors = out.read().strip(), err.read()
    print(f"{pulled}; pulled in {ended[0] - started:.1f} s, beside {len(rounds) - 1} capture round(s)")
    for result in [r for r in rounds[:-1] if not r.note] + rounds[-1:]:
        print(result.describe())
    if pulling.returncode:
        failed = [line.removeprefix("ERROR ") for line in errors.splitlines() if line.startswith("ERROR ")]
        reason = failed[-1] if failed else f"exit status {pulling.returncode}: {errors.strip()[-500:]}"
        raise TrailboundError(f"archive pull {source}: {reason}")
    return 0


def send_extract(ctx: Context) -> int:
    from trailbound.capture import directives
    from trailbound.config import parse_duration

    name = ctx.config.extract_name(ctx.args.group)
    command, words = ctx.args.command[0].lower(), ctx.args.command[1:]
    if command == "showtrans":
        print(directives.show_transactions(ctx.store, name, count=ctx.args.count,
                                           duration=parse_duration(ctx.args.duration) if ctx.args.duration else None))
    elif command in ("skiptrans", "forcetrans") and len(words) == 1:
        print(directives.request(ctx.store, name, command, words[0], ctx.args.thread))
    else:
        raise TrailboundError("usage: trailbound send extract GROUP showtrans [--duration D] [--count N] | "
                              "skiptrans XID [--thread T] | forcetrans XID [--thread T]")
    return 0


def start_extract(ctx: Context) -> int:
    from trailbound.capture import directives

    name = ctx.config.extract_name(ctx.args.group)
    if not ctx.args.brreset:
        print(f"EXTRACT {name}: capture runs are started by its schedule (Airflow) or `trailbound extract run "
              f"{name}`; nothing to do without --brreset")
        return 0
    print(directives.request(ctx.store, name, "brreset"))
    return 0


def add_extract(ctx: Context) -> int:
    from trailbound.capture import checkpoints as ckpt
    from trailbound.capture.run import ensure_group

    name = ctx.config.extract_name(ctx.args.group)
    with ctx.store.transaction() as cur:
        if ckpt.load(cur, name) is not None:
            raise TrailboundError(f"extract {name} is already added; use alter extract {name} begin ... to move it")
    state = ensure_group(ctx.store, ctx.config, name, begin=" ".join(ctx.args.begin) if ctx.args.begin else None)
    print(f"EXTRACT {name} added, begin {state.begin_spec} (scn {state.begin_scn}), trail {state.exttrail}")
    return 0


def delete_extract(ctx: Context) -> int:
    from trailbound.capture.run import group_lock

    name = ctx.config.extract_name(ctx.args.group)
    with group_lock(ctx.store, name), ctx.store.transaction() as cur:
        cur.execute("DELETE FROM trailbound.extract_group WHERE group_name = %s", (name,))
        if cur.rowcount == 0:
            raise TrailboundError(f"extract {name} is not added")
        # The registration outlives the group on purpose: delete then add again (a lost
        # trail's runbook) must not let retention purge the log in between. Say so.
        cur.execute("SELECT source FROM trailbound.capture_registration"
                    " WHERE upper(group_name) = upper(%s) AND enabled", (name,))
        registered = cur.fetchone()
    print(f"EXTRACT {name} deleted (its trail files are left in place)")
    if registered:
        print(f"EXTRACT {name} is still registered with logretention: retention keeps every segment of source "
              f"{registered['source']} until it is added again and runs, or until "
              f"`trailbound unregister extract {name} logretention`")
    return 0


def alter_extract(ctx: Context) -> int:
    from trailbound.archive.catalog import ArchiveCatalog
    from trailbound.capture import checkpoints as ckpt
    from trailbound.capture.begin import resolve_begin
    from trailbound.capture.run import group_lock

    name = ctx.config.extract_name(ctx.args.group)
    words = ctx.args.change
    if not words or words[0].lower() != "begin" or len(words) < 2:
        raise TrailboundError("usage: trailbound alter extract GROUP begin now|TIME|scn N")
    spec = " ".join(words[1:])
    with group_lock(ctx.store, name):
        with ctx.store.transaction() as cur:
            state = ckpt.load(cur, name)
        if state is None:
            raise TrailboundError(f"extract {name} is not added")
        begin_scn = resolve_begin(spec, ArchiveCatalog(ctx.store, state.source).segments())
        with ctx.store.transaction() as cur:
            ckpt.reposition(cur, name, begin_scn, spec)
    print(f"EXTRACT {name} altered: begin {spec} (scn {begin_scn}); the next run starts there")
    return 0


def info_extract(ctx: Context) -> int:
    from trailbound.capture.info import describe_extract

    return _info(ctx, "extract", lambda name: describe_extract(ctx.store, ctx.config, name, showch=ctx.args.showch,
                                                               br=ctx.args.br))


def _info(ctx: Context, program: str, describe: Callable[[str], str]) -> int:
    """INFO EXTRACT|PUMP|REPLICAT GROUP, where GROUP may hold GGSCI's wildcards (* ?):
    each group's report."""
    from trailbound import status

    pattern = ctx.args.group
    if not any(c in pattern for c in "*?"):
        print(describe(pattern))  # its own error when the group is not configured or added
        return 0
    added = [g for g in status.info_all(ctx.store, ctx.config, pattern=pattern, programs=(program,)) if g.added]
    if not added:
        raise TrailboundError(f"no {program} group matching {pattern!r} is added")
    print("\n\n".join(describe(g.group) for g in added))
    return 0


def info_all(ctx: Context) -> int:
    """INFO ALL: every extract, pump and replicat; status, lag at checkpoint, time since."""
    from datetime import datetime as _datetime

    from trailbound import ggsci, status

    now = _datetime.now(timezone.utc)
    print(ggsci.info_all(status.info_all(ctx.store, ctx.config, now=now), now))
    return 0


def logdump(ctx: Context) -> int:
    import json as _json

    from trailbound.positions import Csn
    from trailbound.trail import format as trail

    path = Path(ctx.args.file)
    seqno = int(path.name[-9:]) if path.name[-9:].isdigit() else None
    records = trail.read_file(path).num_rows
    if ctx.args.from_rba >= max(records, 1):
        raise TrailboundError(f"{path}: --from {ctx.args.from_rba} is past the file's end: it holds {records} "
                              f"record(s), rba 0..{records - 1}" if records else f"{path}: the file holds no record")
    for record in trail.iter_records(path, ctx.args.from_rba, ctx.args.count):
        csn = Csn.from_row(record)
        fields = {"seqno": seqno, "rba": record["rba"], "trans_ind": record["trans_ind"], "csn": str(csn),
                  "xid": record["xid"], "commit_ts": record["commit_ts"].isoformat(), "op": record["op"],
                  "table": record["table"], "before": record["before"], "after": record["after"]}
        if ctx.args.json:
            print(_json.dumps(fields, ensure_ascii=False))
        else:
            position = f"{seqno}:{record['rba']}" if seqno is not None else f"rba {record['rba']}"
            print(f"{position:>14}  ind {record['trans_ind']}  csn {csn}  commit "
                  f"{record['commit_ts'].astimezone(timezone.utc):%Y-%m-%d %H:%M:%S.%f} UTC  xid {record['xid']!r}  "
                  f"{record['op']:<8} {record['table']}  before={record['before']}  after={record['after']}")
    return 0


# ---------------------------------------------------------------- pump and trail purge

def pump_run(ctx: Context) -> int:
    from trailbound.pump.run import needs_spark, run_pump

    name = ctx.config.pump_name(ctx.args.group)
    spark = ctx.spark if needs_spark(ctx.config, name) else None  # local trails need no JVM
    print(run_pump(spark, ctx.store, ctx.config, name).describe())
    return 0


def add_pump(ctx: Context) -> int:
    from trailbound.pump.checkpoints import ensure_pump, load

    name = ctx.config.pump_name(ctx.args.group)
    with ctx.store.transaction() as cur:
        if load(cur, name) is not None:
            raise TrailboundError(f"pump {name} is already added")
    state = ensure_pump(ctx.store, ctx.config, name, extseqno=ctx.args.extseqno)
    print(f"PUMP {name} added, reading {state.exttrail} from seqno {state.next_source_seqno()}, "
          f"remote trail {state.rmttrail}")
    return 0


def delete_pump(ctx: Context) -> int:
    from trailbound.pump.checkpoints import delete_pump as delete

    state = delete(ctx.store, ctx.config, ctx.args.group)
    print(f"PUMP {state.group} deleted: it no longer holds {state.exttrail} against purge "
          f"(remote trail files stay)")
    return 0


def info_pump(ctx: Context) -> int:
    from trailbound.pump.info import describe_pump

    return _info(ctx, "pump", lambda name: describe_pump(ctx.store, ctx.config, name, showch=ctx.args.showch))


def purge_trails(ctx: Context) -> int:
    from trailbound.trail import purge as trailpurge

    spark = ctx.spark if trailpurge.needs_spark(ctx.store) else None
    print(trailpurge.purge_trails(ctx.store, ctx.config, spark=spark, dry_run=ctx.args.dry_run).describe())
    return 0


# ---------------------------------------------------------------- replicat

def replicat_run(ctx: Context) -> int:
    from trailbound.replicat.run import run_replicat

    # Spark started only if the run needs it: a local trail of plain DML needs no JVM.
    print(run_replicat(lambda: ctx.spark, ctx.store, ctx.config, ctx.args.group, target_dsn=ctx.target_dsn).describe())
    return 0


def add_checkpointtable(ctx: Context) -> int:
    from trailbound.replicat import checkpoint_table, target

    if ctx.args.name:
        names = [ctx.args.name]
    else:  # ADD CHECKPOINTTABLE with no name: the one(s) the replicats are configured with
        names = sorted({r.checkpointtable for r in ctx.config.replicats.values()}) or ["trailbound.ggcheckpoint"]
    connection = target.connect(ctx.config, ctx.target_dsn)
    try:
        for text in names:
            name = checkpoint_table.CheckpointTableName.parse(text)
            with connection.cursor() as cur:
                created = checkpoint_table.create(cur, name)
            connection.commit()
            print(f"Checkpoint table {name} (and {name}_lox) " + ("created." if created else "already exists."))
    finally:
        connection.close()
    return 0


def alter_replicat(ctx: Context) -> int:
    from trailbound.replicat.alter import reposition

    print(reposition(ctx.store, ctx.config, ctx.args.group, ctx.args.change, target_dsn=ctx.target_dsn))
    return 0


def info_replicat(ctx: Context) -> int:
    from trailbound.replicat.info import describe_replicat

    return _info(ctx, "replicat", lambda name: describe_replicat(ctx.store, ctx.config, name, showch=ctx.args.showch,
                                                                 target_dsn=ctx.target_dsn))


def target_create(ctx: Context) -> int:
    from trailbound.archive.segments import load_defs
    from trailbound.replicat import target

    source = ctx.source_name()
    rules = [rule for r in ctx.config.replicats.values() if r.source.upper() == source.upper() for rule in r.map]
    defs = load_defs(ctx.config.archive_dir(source))
    connection = target.connect(ctx.config, ctx.target_dsn)
    try:
        with connection.cursor() as cur:
            done = target.create_tables(cur, defs, rules or target.IDENTITY)
        connection.commit()
    finally:
        connection.close()
    for source_table, target_table, created in done:
        print(f"{target_table:<40} {'created' if created else 'exists'} (from {source}: {source_table})")
    return 0


# ---------------------------------------------------------------- compare

def compare(ctx: Context) -> int:
    from trailbound.compare.run import compare as run_compare, resolve

    args = ctx.args
    resolve(ctx.config, args.source, args.replicat)  # refuse before Spark starts
    report = run_compare(ctx.spark, ctx.store, ctx.config, args.source, args.replicat, pattern=args.table,
                         chunk_rows=args.chunk_rows, wait_seconds=args.wait, report_dir=args.report_dir)
    print(report.describe())
    if args.repair_script:
        from trailbound.compare import repair
        from trailbound.compare.sides import connect
        from trailbound.metadata import dsn_from_env

        connection = connect(dsn_from_env(ctx.config.target.dsn_env), "the target")
        try:
            text = repair.script(report, connection)
        finally:
            connection.close()
        if args.repair_script == "-":
            print(text, end="")
        else:
            Path(args.repair_script).write_text(text, encoding="utf-8")
            print(f"Repair script: {args.repair_script} ({report.out_of_sync} row(s))")
    if args.fail_on_difference and report.out_of_sync:
        raise TrailboundError(f"{report.out_of_sync} row(s) out of sync (report {report.report_file})")
    return 0


# ---------------------------------------------------------------- airflow

def dags_generate(ctx: Context) -> int:
    from trailbound import dagfiles

    for path in dagfiles.generate(ctx.config, ctx.args.directory):
        print(path)
    return 0


# ---------------------------------------------------------------- simulate

def simulate(ctx: Context) -> int:
    from trailbound.sources import simulator

    args = ctx.args
    archive = args.archive or ctx.config.archive_dir(ctx.source_name())
    truth = args.truth or Path(archive).parent / "truth.json"
    try:
        summary = simulator.simulate(Path(archive), Path(truth), seed=args.seed, records=args.records,
                                     hours=args.hours, threads=args.threads, fmt=args.format)
    except FileExistsError as exc:
        raise TrailboundError(f"{archive}: already holds an archive ({exc}); simulate writes into an empty "
                              "directory") from None
    print(summary.describe())
    print(f"Archive: {archive}\nTruth:   {truth}")
    return 0


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trailbound", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help=f"configuration file (default ${configuration.CONFIG_ENV})")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(group, name: str, handler: Callable[[Context], int], help_text: str) -> argparse.ArgumentParser:
        sub = group.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    archive = verbs.add_parser("archive", help="the redo archive and its catalog").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    for name, handler, text in (("scan", archive_scan, "catalog new segments after checking them"),
                                ("list", archive_list, "segments per thread, SCN and time ranges, status"),
                                ("verify", archive_verify, "check every segment and record again; writes nothing"),
                                ("mark-backed-up", archive_mark_backed_up, "count one more backup of available "
                                                                           "segments (the retention backedup policy)")):
        sub = verb(archive, name, handler, text)
        sub.add_argument("--source", help="source name (default: the only one configured)")
        if name == "mark-backed-up":
            sub.add_argument("--thread", type=int, help="only this thread")
            sub.add_argument("--through-sequence", type=int, metavar="S", help="only sequences up to S")
        if name == "list":
            sub.add_argument("--thread", type=int, help="only this thread")
            sub.add_argument("--summary", action="store_true", help="one line per thread, no segment lines")
            sub.add_argument("--until", type=_utc_time, help="horizon over segments archived by this time")

    command = verb(archive, "pull", archive_pull, "archive a PostgreSQL source's WAL: read its slot up to the "
                                                   "server's position now, write segments, then confirm the slot")
    command.add_argument("source", nargs="?", help="source name (default: the only one configured)")

    command = verb(verbs, "load", load, "copy the source tables' current rows into the target on Spark, in key-range "
                                        "chunks without locks, and hand over to the replicat (docs/initial-load.md)")
    command.add_argument("source", help="the PostgreSQL source")
    command.add_argument("replicat", help="the replicat whose MAP names the target tables")
    command.add_argument("--table", default="*.*", metavar="PATTERN",
                         help="source tables to load, schema.table with * and ? (default: every mapped table)")
    command.add_argument("--chunk-rows", type=int, default=50_000, metavar="N", help="rows per key-range chunk "
                                                                                    "(default 50000)")
    command.add_argument("--mode", choices=["snapshot", "watermark"], default="snapshot",
                         help="snapshot: before the first pull, at the slot's exported snapshot (default); "
                              "watermark: at any time, between watermarks, resumable")

    extract = verbs.add_parser("extract", help="capture runs").add_subparsers(dest="action", required=True,
                                                                              metavar="ACTION")
    run = verb(extract, "run", extract_run, "run one capture batch for an extract group")
    run.add_argument("group")
    run.add_argument("--until", type=_utc_time, help="read only segments archived by this time (a past interval)")
    run.add_argument("--brreset", action="store_true", help="one normal recovery, then Bounded Recovery again")
    run.add_argument("--pull", action="store_true", help="a PostgreSQL source: pull its WAL into the archive (archive "
                     "pull) while capturing what lands, then capture the rest")

    kinds = {}  # add/delete/alter/info -> their KIND subparsers, for the groups below
    for word, handler, text in (("add", add_extract, "add an extract group (ADD EXTRACT)"),
                                ("delete", delete_extract, "delete an extract group's checkpoints"),
                                ("alter", alter_extract, "reposition an extract: alter extract G begin now|TIME|scn N"),
                                ("info", info_extract, "status and checkpoints (INFO EXTRACT ... SHOWCH)")):
        overview = {"add": "add an extract or pump group, or the checkpoint table (ADD ...)",
                    "delete": "delete an extract's or pump's checkpoints (DELETE ...)",
                    "alter": "reposition an extract or a replicat, or accept a lost slot's gap (ALTER ...)",
                    "info": "status and checkpoints: all, extract, pump, replicat, retention (INFO ...)"}[word]
        sub = kinds[word] = verbs.add_parser(word, help=overview).add_subparsers(dest="kind", required=True,
                                                                                 metavar="KIND")
        command = verb(sub, "extract", handler, text)
        command.add_argument("group")
        if word == "add":
            command.add_argument("--begin", nargs="+", help="earliest | now | TIME | scn N (default: the config's)")
        if word == "alter":
            command.add_argument("change", nargs="+", help="begin now | begin TIME | begin scn N")
        if word == "info":
            command.add_argument("--showch", nargs="?", type=int, const=0, default=None, metavar="N",
                                 help="checkpoint detail; N: also the last N runs' checkpoints")
            command.add_argument("--br", action="store_true", help="Bounded Recovery: checkpoint, persisted "
                                                                    "transactions, restart position and its bound")

    send = verbs.add_parser("send", help="directives to a group (SEND EXTRACT)").add_subparsers(
        dest="kind", required=True, metavar="KIND")
    command = verb(send, "extract", send_extract, "showtrans | skiptrans XID | forcetrans XID (applied by the next run)")
    command.add_argument("group")
    command.add_argument("command", nargs="+", metavar="showtrans|skiptrans XID|forcetrans XID")
    command.add_argument("--duration", help="showtrans: only transactions open at least this long (e.g. 2h)")
    command.add_argument("--count", type=int, help="showtrans: at most this many")
    command.add_argument("--thread", type=int, help="skiptrans/forcetrans: the thread, when the xid is ambiguous")
    start = verbs.add_parser("start", help="start options for a group").add_subparsers(dest="kind", required=True,
                                                                                        metavar="KIND")
    command = verb(start, "extract", start_extract, "record start options for the next run (--brreset)")
    command.add_argument("group")
    command.add_argument("--brreset", action="store_true", help="the next run uses normal recovery once")

    for word, handler, text in (("add", add_source, "a PostgreSQL source: create its publication and slot "
                                                    "(pgoutput), write defs.json"),
                                ("delete", delete_source, "drop a PostgreSQL source's slot and publication"),
                                ("alter", alter_source, "accept a gap in a PostgreSQL source's log (its slot was "
                                                        "lost): alter source S --accept-gap"),
                                ("info", info_source, "a PostgreSQL source's slot lag, confirmed LSN, last "
                                                      "segment, open streamed transactions")):
        command = verb(kinds[word], "source", handler, text)
        command.add_argument("source", nargs="?", help="source name (default: the only one configured)")
        if word == "add":
            command.add_argument("--refresh-defs", action="store_true",
                                 help="keep the slot; rewrite defs.json and the publication's tables from the "
                                      "catalog (after an ALTER TABLE, see docs/live-postgres.md)")
        if word == "alter":
            command.add_argument("--accept-gap", action="store_true", required=True,
                                 help="your consent: the changes between the archive's end and where the slot "
                                      "resumes are lost; the slot is made again if it is gone (then load the "
                                      "tables again; docs/live-postgres.md, \"When the slot is lost\")")

    pump = verbs.add_parser("pump", help="pump runs (trail shipping)").add_subparsers(dest="action", required=True,
                                                                                     metavar="ACTION")
    verb(pump, "run", pump_run, "ship the committed trail files a pump has not shipped").add_argument("group")
    for word, handler, text in (("add", add_pump, "add a pump group, registering it as a reader of its source trail"),
                                ("delete", delete_pump, "delete a pump's checkpoints and reader registration"),
                                ("info", info_pump, "a pump's status and checkpoints (INFO EXTRACT ... SHOWCH)")):
        command = verb(kinds[word], "pump", handler, text)
        command.add_argument("group")
        if word == "add":
            command.add_argument("--extseqno", type=int, metavar="N",
                                 help="start at source trail file N (default: its first file)")
        if word == "info":
            command.add_argument("--showch", nargs="?", type=int, const=0, default=None, metavar="N",
                                 help="checkpoint detail; N: also the last N runs")
    purge = verbs.add_parser("purge", help="delete trail files every reader has passed (PURGEOLDEXTRACTS)"
                             ).add_subparsers(dest="action", required=True, metavar="ACTION")
    verb(purge, "trails", purge_trails, "delete trail files every reader has passed (PURGEOLDEXTRACTS "
                                        "USECHECKPOINTS)").add_argument("--dry-run", action="store_true",
                                                                        help="change nothing; say what would go")

    for word, handler, text in (("register", register_extract, "keep the redo log a capture still needs "
                                                               "(REGISTER EXTRACT ... LOGRETENTION)"),
                                ("unregister", unregister_extract, "stop keeping redo log for a capture "
                                                                   "(UNREGISTER EXTRACT ... LOGRETENTION)")):
        kind = verbs.add_parser(word, help=text).add_subparsers(dest="kind", required=True, metavar="KIND")
        command = verb(kind, "extract", handler, text)
        command.add_argument("group")
        command.add_argument("option", choices=["logretention"], type=str.lower, metavar="logretention")
    retention = verbs.add_parser("retention", help="archive-log retention").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    command = verb(retention, "run", retention_run, "purge redo segments below the lowest SCN every registered "
                                                    "capture needs, subject to minkeephours, backedup, maxbytes")
    command.add_argument("--dry-run", action="store_true", help="change nothing; say what would go and why")
    command.add_argument("--source", help="only this source (default: every configured one)")
    verb(kinds["info"], "all", info_all, "every extract, pump and replicat: status (RUNNING, STOPPED, ABENDED), "
                                         "lag at checkpoint, time since checkpoint (INFO ALL)")
    command = verb(kinds["info"], "retention", info_retention, "registrations and their required SCNs, what is "
                                                               "purgeable now and why the rest is kept")
    command.add_argument("--source", help="only this source (default: every configured one)")

    replicat = verbs.add_parser("replicat", help="replicat runs (apply)").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    verb(replicat, "run", replicat_run, "apply the trail from the checkpoint to its committed end").add_argument("group")
    command = verb(kinds["add"], "checkpointtable", add_checkpointtable,
                   "create the checkpoint table (and its _lox table) in the target (ADD CHECKPOINTTABLE)")
    command.add_argument("name", nargs="?", metavar="[SCHEMA.]NAME", help="default: the replicats' checkpointtable")
    command = verb(kinds["alter"], "replicat", alter_replicat,
                   "reposition a replicat: atcsn N | aftercsn N | extseqno S [extrba R]")
    command.add_argument("group")
    command.add_argument("change", nargs="+", metavar="atcsn N|aftercsn N|extseqno S extrba R")
    command = verb(kinds["info"], "replicat", info_replicat, "status and checkpoints (INFO REPLICAT ... SHOWCH)")
    command.add_argument("group")
    command.add_argument("--showch", nargs="?", type=int, const=0, default=None, metavar="N",
                         help="the checkpoint table row and the file checkpoint side by side; N: also the last N runs")
    target_verbs = verbs.add_parser("target", help="the target database").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    verb(target_verbs, "create", target_create, "create the target tables from the source's defs.json (through the "
                                                "replicats' map)").add_argument("--source", help="default: the only one")

    command = verb(verbs, "compare", compare, "compare a PostgreSQL source's tables with a replicat's target "
                                              "tables (docs/compare.md)")
    command.add_argument("source")
    command.add_argument("replicat")
    command.add_argument("--table", default="*", metavar="PATTERN",
                         help="source tables, schema.table with * and ? (default: every mapped table)")
    command.add_argument("--repair-script", metavar="FILE",
                         help="write the SQL that brings the target in line to FILE (- : print it)")
    command.add_argument("--chunk-rows", type=int, default=50_000, metavar="N",
                         help="about N source rows per key range, one Spark task each (default 50000)")
    command.add_argument("--wait", type=float, default=300.0, metavar="SECONDS",
                         help="how long to wait for the replicat to get past a difference (default 300)")
    command.add_argument("--report-dir", type=Path, help="where the report files go (default: var/compare/ "
                                                         "under home)")
    command.add_argument("--fail-on-difference", action="store_true",
                         help="exit with status 1 when rows are out of sync")

    dags = verbs.add_parser("dags", help="Airflow DAG files").add_subparsers(dest="action", required=True,
                                                                            metavar="ACTION")
    generate = verb(dags, "generate", dags_generate, "write one DAG file per configured group (no I/O at parse)")
    generate.add_argument("--directory", type=Path, default=Path("dags"), help="where (default: dags/)")

    dump = verb(verbs, "logdump", logdump, "print the records of a trail file")
    dump.add_argument("file")
    dump.add_argument("--from", dest="from_rba", type=_non_negative, default=0, metavar="RBA",
                      help="the first record to print (0: the file's first)")
    dump.add_argument("--count", type=_non_negative, help="at most this many records")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")

    sim = verb(verbs, "simulate", simulate, "write a simulated busy OLTP source's redo archive and its truth")
    sim.add_argument("--source", help="write into this source's archive directory (default: the only one)")
    sim.add_argument("--archive", type=Path, help="archive directory (default: the source's)")
    sim.add_argument("--truth", type=Path, help="truth file (default: truth.json beside the archive)")
    sim.add_argument("--seed", type=int, default=7)
    sim.add_argument("--records", type=int, default=200_000)
    sim.add_argument("--hours", type=float, default=48.0, help="log time covered")
    sim.add_argument("--threads", type=int, default=3)
    sim.add_argument("--format", choices=["parquet", "jsonl", "mixed"], default="mixed")
    return parser


RUN_VERBS = {extract_run: "extract", pump_run: "pump", replicat_run: "replicat"}


@contextmanager
def _outcome_recorded(ctx: Context, argv: list[str]):
    """`extract|pump|replicat run`: the run's outcome goes to the run log (trailbound.runlog)
    whatever it is; a group whose last run failed is ABENDED until a run succeeds."""
    kind = RUN_VERBS.get(ctx.args.handler)
    name = None
    if kind is not None:
        try:
            name = getattr(ctx.config, f"{kind}_name")(ctx.args.group)
        except TrailboundError:
            pass  # not a configured group: the run itself says so, and there is no group to mark
    if name is None:
        yield
        return
    from trailbound import runlog

    with runlog.recorded_run(ctx.store, kind, name, " ".join(["trailbound", *argv])):
        yield


def main(argv: list[str] | None = None, *, dsns: dict[str, str] | None = None) -> int:
    """Run one command line. `dsns` (environment variable name -> DSN) stands in for
    those variables: the Airflow hook passes the DSNs it resolved this way instead of
    writing them into the process environment."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    ctx = Context(args, dsns)
    try:
        with _outcome_recorded(ctx, argv):
            with spark_task_errors_as_ours():
                status = args.handler(ctx)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's exit
        return status
    except TrailboundError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`trailbound info all | head`): stop quietly, as `cat` does;
        # stdout goes to /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command the pipe ended
    except Exception as exc:
        # A database's refusal that no step turned into one of ours (those name the server):
        # still one line, the server's own words, not a traceback. The driver's text for a
        # session already open never holds a DSN; every connect names its server itself.
        if not type(exc).__module__.startswith("psycopg2"):
            raise
        words = " ".join((getattr(exc, "pgerror", None) or str(exc)).split())
        for severity in ("ERROR: ", "FATAL: "):  # the server's own prefix: ours says ERROR already
            words = words.removeprefix(severity)
        print(f"ERROR {args.handler.__name__.replace('_', ' ')}: {words}", file=sys.stderr)
        return 1
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
