"""The `trailbound` command line. Its verbs mirror GGSCI's where GoldenGate has one
(INFO EXTRACT ... SHOWCH, SEND EXTRACT ... SKIPTRANS, ALTER REPLICAT ... ATCSN, LOGDUMP).

    trailbound archive scan|list|verify      the redo archive and its catalog
    trailbound simulate                      write the simulated source's archive

Every verb reads the configuration file (--config, else $TRAILBOUND_CONFIG) and the
metadata store's DSN from the variable the file names. Errors a user can act on are
printed as one `ERROR` paragraph naming the file, key or position, exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from trailbound import config as configuration
from trailbound.errors import TrailboundError


def _utc_time(text: str) -> datetime:
    """--until and friends: ISO-8601; a time without a zone is UTC, like the archive's."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time") from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class Context:
    """What a verb needs, opened lazily: a verb that needs no database opens none."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
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

            self._store = MetadataStore.open(dsn_from_env(self.config.metadata.dsn_env))
        return self._store

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
    from trailbound.archive.catalog import ArchiveCatalog

    source = ctx.source_name()
    archive_dir = ctx.config.archive_dir(source)
    catalog = ArchiveCatalog(ctx.store, source)
    entries = [e for e in catalog.entries() if ctx.args.thread is None or e.segment.thread == ctx.args.thread]
    print(f"Source {source}, archive {archive_dir}")
    if not ctx.args.summary:
        print(f"{'THREAD':>6} {'SEQUENCE':>9} {'FIRST_SCN':>12} {'NEXT_SCN':>12} {'FIRST_TIME':<20} {'NEXT_TIME':<20} " \
              f"{'RECORDS':>9} {'BYTES':>11} STATUS")
    for entry in [] if ctx.args.summary else entries:
        s = entry.segment
        flags = entry.status + (" closed" if s.closed else "")
        print(f"{s.thread:>6} {s.sequence:>9} {s.first_scn:>12} {s.next_scn:>12} "
              f"{s.first_time:%Y-%m-%d %H:%M:%S}  {s.next_time:%Y-%m-%d %H:%M:%S}  "
              f"{s.records:>9} {s.bytes:>11} {flags}")
    by_thread: dict[int, list] = {}
    for entry in entries:
        by_thread.setdefault(entry.segment.thread, []).append(entry.segment)
    for thread, segments in sorted(by_thread.items()):
        print(f"Thread {thread}: sequences {segments[0].sequence}..{segments[-1].sequence}, "
              f"scn {segments[0].first_scn}..{segments[-1].next_scn}, "
              f"{segments[0].first_time:%Y-%m-%d %H:%M:%S}..{segments[-1].next_time:%Y-%m-%d %H:%M:%S}, "
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
    checked = ArchiveCatalog(ctx.store, source).verify(ctx.config.archive_dir(source), ctx.spark)
    records = sum(s.records for s in checked)
    print(f"Source {source}: {len(checked)} segment(s), {records} records verified: manifests, sequence, records OK")
    return 0


# ---------------------------------------------------------------- simulate

def simulate(ctx: Context) -> int:
    from trailbound import simulator

    args = ctx.args
    archive = args.archive or ctx.config.archive_dir(ctx.source_name())
    truth = args.truth or Path(archive).parent / "truth.json"
    summary = simulator.simulate(Path(archive), Path(truth), seed=args.seed, records=args.records,
                                 hours=args.hours, threads=args.threads, fmt=args.format)
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
                                ("verify", archive_verify, "check every segment and record again; writes nothing")):
        sub = verb(archive, name, handler, text)
        sub.add_argument("--source", help="source name (default: the only one configured)")
        if name == "list":
            sub.add_argument("--thread", type=int, help="only this thread")
            sub.add_argument("--summary", action="store_true", help="one line per thread, no segment lines")
            sub.add_argument("--until", type=_utc_time, help="horizon over segments archived by this time")

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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ctx = Context(args)
    try:
        return args.handler(ctx)
    except TrailboundError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
