"""Pump groups and the trails' purge: `trailbound pump run`, `add|delete|info pump`,
`purge trails`."""

from __future__ import annotations

from trailbound.cli.context import Context, airflow_run_argument, loop_argument, verb
from trailbound.cli.status import info_groups
from trailbound.errors import TrailboundError


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

    return info_groups(ctx, "pump", lambda name: describe_pump(ctx.store, ctx.config, name, showch=ctx.args.showch))


def purge_trails(ctx: Context) -> int:
    from trailbound.trail import purge as trailpurge

    spark = ctx.spark if trailpurge.needs_spark(ctx.store) else None
    print(trailpurge.purge_trails(ctx.store, ctx.config, spark=spark, dry_run=ctx.args.dry_run).describe())
    return 0


def arguments(verbs, kinds) -> None:
    """The `pump` verb, the `pump` kind of add, delete and info, and the `purge` verb."""
    pump = verbs.add_parser("pump", help="pump runs (trail shipping)").add_subparsers(dest="action", required=True,
                                                                                     metavar="ACTION")
    run = verb(pump, "run", pump_run, "ship the committed trail files a pump has not shipped")
    run.add_argument("group")
    airflow_run_argument(run)
    loop_argument(run, "whenever capture has committed more")
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
