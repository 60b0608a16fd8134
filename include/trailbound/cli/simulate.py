"""`trailbound simulate`: write the simulated source's redo archive and its truth."""

from __future__ import annotations

from pathlib import Path

from trailbound.cli.context import Context, verb
from trailbound.errors import TrailboundError


def simulate(ctx: Context) -> int:
    from trailbound.sources import simulator

    args = ctx.args
    archive = args.archive or ctx.config.archive_dir(ctx.source_name())
    truth = args.truth or Path(archive).parent / "truth.json"
    try:
        summary = simulator.simulate(Path(archive), Path(truth), seed=args.seed, records=args.records,
                                     hours=args.hours, threads=args.threads, fmt=args.format,
                                     schema_changes=args.schema_changes, heartbeat_seconds=args.heartbeat_seconds,
                                     heartbeat_source=ctx.source_name())
    except FileExistsError as exc:
        raise TrailboundError(f"{archive}: already holds an archive ({exc}); simulate writes into an empty "
                              "directory") from None
    print(summary.describe())
    print(f"Archive: {archive}\nTruth:   {truth}")
    return 0


def arguments(verbs) -> None:
    sim = verb(verbs, "simulate", simulate, "write a simulated busy OLTP source's redo archive and its truth")
    sim.add_argument("--source", help="write into this source's archive directory (default: the only one)")
    sim.add_argument("--archive", type=Path, help="archive directory (default: the source's)")
    sim.add_argument("--truth", type=Path, help="truth file (default: truth.json beside the archive)")
    sim.add_argument("--seed", type=int, default=7)
    sim.add_argument("--records", type=int, default=200_000)
    sim.add_argument("--hours", type=float, default=48.0, help="log time covered")
    sim.add_argument("--threads", type=int, default=3)
    sim.add_argument("--format", choices=["parquet", "jsonl", "mixed"], default="mixed")
    sim.add_argument("--schema-changes", choices=["none", "demo", "all"], default="none",
                     help="ALTER / CREATE TABLE mid-archive, each a table version in defs.json: demo: one ADD "
                          "COLUMN and one CREATE TABLE; all: also a widened type and a dropped column")
    sim.add_argument("--heartbeat-seconds", type=float, metavar="S",
                     help="write a heartbeat row every S seconds of log time (docs/heartbeat.md; default none)")
