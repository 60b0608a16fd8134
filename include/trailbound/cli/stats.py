"""GGSCI's monitoring verbs for one group: `trailbound stats extract|pump|replicat GROUP`
(operations per table) and `trailbound lag extract|pump|replicat GROUP`; `trailbound lag`
alone: every replicat's heartbeat lag, end to end and per hop, over time."""

from __future__ import annotations

from trailbound.cli.context import Context, verb

STAGES = ("extract", "pump", "replicat")


def stats(ctx: Context) -> int:
    from trailbound import stats as reports

    periods = tuple(p for p in reports.PERIODS if getattr(ctx.args, p)) or reports.PERIODS
    print(reports.stats_report(ctx.store, ctx.config, ctx.args.kind, ctx.args.group, table=ctx.args.table,
                               totalsonly=ctx.args.totalsonly, periods=periods))
    return 0


def lag(ctx: Context) -> int:
    from trailbound import stats as reports

    if ctx.args.kind is None:
        print(reports.heartbeat_report(ctx.store))
        return 0
    print(reports.lag_report(ctx.store, ctx.config, ctx.args.kind, ctx.args.group))
    return 0


def arguments(verbs) -> None:
    kinds = verbs.add_parser("stats", help="operations per table of a group's runs (STATS ...)").add_subparsers(
        dest="kind", required=True, metavar="KIND")
    for stage in STAGES:
        command = verb(kinds, stage, stats, f"{stage} GROUP: inserts, updates, deletes, truncates, discards, "
                                            "collisions per table, in total, today, this hour and the latest run")
        command.add_argument("group")
        command.add_argument("--table", metavar="PATTERN", help="only the tables matching PATTERN (* and ?)")
        command.add_argument("--totalsonly", nargs="?", const="*", metavar="PATTERN",
                             help="one summary of the tables matching PATTERN (default every table)")
        periods = command.add_mutually_exclusive_group()
        for period in ("latest", "hourly", "daily", "total"):
            periods.add_argument(f"--{period}", action="store_true", help=f"only the {period} statistics")
    command = verb(verbs, "lag", lag, "a group's last record lag, and whether it is at EOF (LAG ...); alone: "
                                      "every replicat's heartbeat lag, end to end and per hop, over time")
    kinds = command.add_subparsers(dest="kind", required=False, metavar="KIND")
    for stage in STAGES:
        verb(kinds, stage, lag, f"{stage} GROUP: last record lag at its checkpoint; at EOF or records waiting"
             ).add_argument("group")
