"""A group's runs as GGSCI reports them: `trailbound view report GROUP [--run N]` (a run:
command, outcome, what it committed, its counts per table) and `trailbound send replicat
GROUP status` (a batch replicat's run in progress and its checkpoint)."""

from __future__ import annotations

import argparse

from trailbound.cli.context import Context, non_negative, verb


def view_report(ctx: Context) -> int:
    from trailbound import stats as reports

    print(reports.view_report(ctx.store, ctx.config, ctx.args.group, run=ctx.args.run))
    return 0


def send_replicat(ctx: Context) -> int:
    from trailbound import stats as reports

    print(reports.replicat_status(ctx.store, ctx.config, ctx.args.group))
    return 0


def _subcommands(parser: argparse.ArgumentParser):
    """The KIND subparsers of a verb another family added (`send`, by extract.py)."""
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))


def arguments(verbs) -> None:
    """`view report`, and the `replicat` kind of `send` (after extract.py added `send`)."""
    view = verbs.add_parser("view", help="a group's run report (VIEW REPORT)").add_subparsers(
        dest="kind", required=True, metavar="KIND")
    command = verb(view, "report", view_report, "a run of GROUP (the last, or --run N): its command, outcome, "
                                                "what it committed, and its operations per table")
    command.add_argument("group")
    command.add_argument("--run", type=non_negative, metavar="N", help="run N (run ids are listed in the report)")
    command = verb(_subcommands(verbs.choices["send"]), "replicat", send_replicat,
                   "status: whether a run is in progress, its checkpoint, what waits (SEND REPLICAT ... STATUS)")
    command.add_argument("group")
    command.add_argument("command", choices=["status"], metavar="status")
