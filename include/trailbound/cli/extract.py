"""Capture groups: `trailbound extract run`, `add|delete|alter|info extract`, and the
directives for the next run, `send extract` and `start extract`."""

from __future__ import annotations

from trailbound.cli.context import Context, airflow_run_argument, loop_argument, utc_time, verb
from trailbound.cli.status import info_groups
from trailbound.errors import TrailboundError


def extract_run(ctx: Context) -> int:
    from trailbound.capture.pulling import run_extract_pulling
    from trailbound.capture.run import run_extract

    ctx.config.extract_name(ctx.args.group)  # an unknown group is said before Spark's JVM starts (15 s)
    if ctx.args.pull:
        pulled = run_extract_pulling(lambda: ctx.spark, ctx.store, ctx.config, ctx.args.group,
                                     config_file=ctx.args.config, until=ctx.args.until, brreset=ctx.args.brreset)
        print(pulled.describe())
        pulled.check()
        return 0
    result = run_extract(ctx.spark, ctx.store, ctx.config, ctx.args.group, until=ctx.args.until,
                         brreset=ctx.args.brreset)
    print(result.describe())
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
    from trailbound import retention
    from trailbound.capture import checkpoints as ckpt
    from trailbound.capture.run import group_lock

    name = ctx.config.extract_name(ctx.args.group)
    with group_lock(ctx.store, name), ctx.store.transaction() as cur:
        if not ckpt.delete_group(cur, name):
            raise TrailboundError(f"extract {name} is not added")
        # The registration outlives the group on purpose: delete then add again (a lost
        # trail's runbook) must not let retention purge the log in between. Say so.
        registered = retention.registered_source(cur, name)
    print(f"EXTRACT {name} deleted (its trail files are left in place)")
    if registered:
        print(f"EXTRACT {name} is still registered with logretention: retention keeps every segment of source "
              f"{registered} until it is added again and runs, or until "
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

    return info_groups(ctx, "extract", lambda name: describe_extract(ctx.store, ctx.config, name, showch=ctx.args.showch,
                                                               br=ctx.args.br))


def run_arguments(verbs) -> None:
    """The `extract` verb: extract run."""
    extract = verbs.add_parser("extract", help="capture runs").add_subparsers(dest="action", required=True,
                                                                              metavar="ACTION")
    run = verb(extract, "run", extract_run, "run one capture batch for an extract group")
    run.add_argument("group")
    airflow_run_argument(run)
    loop_argument(run, "whenever the archive holds more")
    run.add_argument("--until", type=utc_time, help="read only segments archived by this time (a past interval)")
    run.add_argument("--brreset", action="store_true", help="one normal recovery, then Bounded Recovery again")
    run.add_argument("--pull", action="store_true", help="a PostgreSQL source: pull its WAL into the archive (archive "
                     "pull) while capturing what lands, then capture the rest")

def arguments(verbs, kinds) -> None:
    """The `extract` kind of add, delete, alter and info; `send extract`, `start extract`."""
    for word, handler, text in (("add", add_extract, "add an extract group (ADD EXTRACT)"),
                                ("delete", delete_extract, "delete an extract group's checkpoints"),
                                ("alter", alter_extract, "reposition an extract: alter extract G begin now|TIME|scn N"),
                                ("info", info_extract, "status and checkpoints (INFO EXTRACT ... SHOWCH)")):
        command = verb(kinds[word], "extract", handler, text)
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
