"""`trailbound replicate SRC`: a source's pull, capture, pump and replicat at once
(trailbound.overlap), each stage a `... run --loop` process (context.loop_argument)."""

from __future__ import annotations

from trailbound.cli.context import Context, poll_argument, verb


def replicate(ctx: Context) -> int:
    from trailbound.overlap import pipeline, replicate as run

    pipeline(ctx.config, ctx.source_name())  # what the configuration cannot do, refused before any connection
    result = run(ctx.store, ctx.config, ctx.source_name(), config_file=ctx.args.config, remote=ctx.args.remote,
                 follow=ctx.args.follow, poll=ctx.args.poll, target_dsn=ctx.target_dsn)
    print(result.describe())
    return 130 if result.interrupted and not ctx.args.follow else 0


def arguments(verbs) -> None:
    command = verb(verbs, "replicate", replicate,
                   "run a source's pull, capture, pump and replicat at once, each in a loop of ordinary runs, until "
                   "the target holds the source's end as of now (START ER *)")
    command.add_argument("source", nargs="?", help="source name (default: the only one configured)")
    command.add_argument("--follow", action="store_true",
                         help="keep pulling and applying until interrupted (Ctrl-C) instead of stopping once caught up")
    poll_argument(command)
