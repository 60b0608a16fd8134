"""`trailbound archive scan|list|verify|mark-backed-up`: the redo archive and its catalog."""

from __future__ import annotations

from trailbound.cli.context import Context, utc_time, verb


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


def arguments(verbs):
    """The `archive` verb and its actions; returns its actions, which `archive pull` joins."""
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
            sub.add_argument("--until", type=utc_time, help="horizon over segments archived by this time")

    return archive
