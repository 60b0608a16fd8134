"""A live PostgreSQL source: `trailbound archive pull SRC`, `add|delete|alter|info source SRC`
and `add|delete heartbeattable SRC`."""

from __future__ import annotations

from trailbound.cli.context import Context, loop_argument, verb


def archive_pull(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import pull

    print(pull(ctx.config, ctx.args.source).describe())
    return 0


def add_source(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import add_source as add

    print(add(ctx.config, ctx.args.source, refresh_defs=ctx.args.refresh_defs))
    return 0


def add_heartbeattable(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import add_heartbeat_table

    print(add_heartbeat_table(ctx.config, ctx.args.source, ctx.args.schema))
    return 0


def delete_heartbeattable(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import delete_heartbeat_table

    print(delete_heartbeat_table(ctx.config, ctx.args.source, ctx.args.schema))
    return 0


def delete_source(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import delete_source as delete

    print(delete(ctx.config, ctx.args.source))
    return 0


def alter_source(ctx: Context) -> int:
    from trailbound.sources.postgres.admin import accept_gap

    print(accept_gap(ctx.config, ctx.args.source))
    return 0


def info_source(ctx: Context) -> int:
    source = ctx.config.source_name(ctx.args.source)
    if ctx.config.source(source).postgres is None:
        # an archive written by someone else (the simulator): what defs.json says of its tables
        from trailbound.archive.segments import describe_versions, load_defs

        archive = ctx.config.archive_dir(source)
        defs = load_defs(archive)
        changed = describe_versions(defs)
        print(f"SOURCE {source}   archive {archive} (written by the simulator or another writer, not pulled)\n"
              f"  Tables: {len(defs)}" + (f", {len(changed)} of them changed while the archive was written:"
                                          if changed else ", none changed while the archive was written"))
        for line in changed:
            print(line)
        return 0
    from trailbound.sources.postgres.admin import describe_source

    print(describe_source(ctx.config, source))
    return 0


def arguments(archive, kinds) -> None:
    """`archive pull` among the archive's actions, and the `source` kind of add, delete,
    alter and info."""
    command = verb(archive, "pull", archive_pull, "archive a PostgreSQL source's WAL: read its slot up to the "
                                                   "server's position now, write segments, then confirm the slot")
    command.add_argument("source", nargs="?", help="source name (default: the only one configured)")
    loop_argument(command, "after --poll seconds")

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
    for word, handler, text in (
            ("add", add_heartbeattable, "a PostgreSQL source's heartbeat table (ADD HEARTBEATTABLE): each pull "
                                        "writes it, replicat records its lag end to end (docs/heartbeat.md)"),
            ("delete", delete_heartbeattable, "drop a PostgreSQL source's heartbeat table (DELETE HEARTBEATTABLE): "
                                              "pulls stop writing it")):
        command = verb(kinds[word], "heartbeattable", handler, text)
        command.add_argument("source", nargs="?", help="source name (default: the only one configured)")
        command.add_argument("--schema", default="trailbound", help="the table's schema (default trailbound)")
