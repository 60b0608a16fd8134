"""Replicat groups and the target: `trailbound replicat run`, `add checkpointtable`,
`alter|info replicat`, `target create`, `discards`."""

from __future__ import annotations

from trailbound.cli.context import Context, airflow_run_argument, loop_argument, utc_time, verb
from trailbound.cli.status import info_groups


def replicat_run(ctx: Context) -> int:
    from trailbound.replicat.run import run_replicat

    ctx.config.replicat_name(ctx.args.group)  # an unknown group is said at once
    # Spark started only if the run needs it: a local trail of plain DML needs no JVM.
    print(run_replicat(lambda: ctx.spark, ctx.store, ctx.config, ctx.args.group, target_dsn=ctx.target_dsn).describe())
    return 0


def add_checkpointtable(ctx: Context) -> int:
    from trailbound.replicat import checkpoint_table, discards, target

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
                discards.create(cur, name)
            connection.commit()
            print(f"Checkpoint table {name} (and {name}_lox, and the discard table {discards.name_of(name)}) "
                  + ("created." if created else "already exists."))
    finally:
        connection.close()
    return 0


def alter_replicat(ctx: Context) -> int:
    from trailbound.replicat.alter import reposition

    print(reposition(ctx.store, ctx.config, ctx.args.group, ctx.args.change, target_dsn=ctx.target_dsn))
    return 0


def info_replicat(ctx: Context) -> int:
    from trailbound.replicat.info import describe_replicat

    return info_groups(ctx, "replicat", lambda name: describe_replicat(ctx.store, ctx.config, name, showch=ctx.args.showch,
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


def arguments(verbs, kinds) -> None:
    """The `replicat` and `target` verbs; the `replicat` kind of alter and info, and
    `add checkpointtable`."""
    replicat = verbs.add_parser("replicat", help="replicat runs (apply)").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    run = verb(replicat, "run", replicat_run, "apply the trail from the checkpoint to its committed end")
    run.add_argument("group")
    airflow_run_argument(run)
    loop_argument(run, "whenever pump has shipped more")
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


def discards(ctx: Context) -> int:
    """`trailbound discards REP1 [--since TS] [--table P] [--reapply]`."""
    if ctx.args.reapply:
        from trailbound.replicat.reapply import reapply

        result = reapply(ctx.store, ctx.config, ctx.args.group, target_dsn=ctx.target_dsn, since=ctx.args.since,
                         table=ctx.args.table)
        print(result.describe())
        return 1 if result.refused else 0
    from trailbound.replicat.discards import listing

    name, rows = listing(ctx.config, ctx.args.group, target_dsn=ctx.target_dsn, since=ctx.args.since,
                         table=ctx.args.table)
    for row in rows:
        print(row.shown() + "\n")
    group = ctx.config.replicat_name(ctx.args.group)
    print(f"{len(rows)} discarded operation(s) of replicat {group} outstanding in {name}"
          + (f"; reapply them after fixing the target: trailbound discards {group} --reapply" if rows else ""))
    return 0


def discards_arguments(verbs) -> None:
    command = verb(verbs, "discards", discards, "a replicat's discarded operations (REPERROR discard), and "
                                                "--reapply them once the target is fixed")
    command.add_argument("group")
    command.add_argument("--since", type=utc_time, metavar="TS", help="discarded at or after this time (UTC)")
    command.add_argument("--table", metavar="PATTERN", help="only these source or target tables (shop.*)")
    command.add_argument("--reapply", action="store_true",
                         help="apply them again, each in its own transaction that removes its row; exit 1 if some "
                              "are still refused")
