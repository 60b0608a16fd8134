"""Archive-log retention: `trailbound register|unregister extract G logretention`,
`retention run`, `info retention` (docs/retention.md)."""

from __future__ import annotations

from trailbound.cli.context import Context, verb


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


def arguments(verbs, kinds) -> None:
    """The `register`, `unregister` and `retention` verbs, and `info retention`."""
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
    command = verb(kinds["info"], "retention", info_retention, "registrations and their required SCNs, what is "
                                                               "purgeable now and why the rest is kept")
    command.add_argument("--source", help="only this source (default: every configured one)")
