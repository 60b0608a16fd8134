"""`trailbound load SRC REP1`: the initial load on Spark (docs/initial-load.md)."""

from __future__ import annotations

from trailbound.cli.context import Context, verb


def load(ctx: Context) -> int:
    from trailbound.load.run import run_load

    def say(line: str) -> None:  # as it happens: the Airflow task log shows the load moving
        print(line, flush=True)

    result = run_load(ctx.spark, ctx.store, ctx.config, ctx.args.source, ctx.args.replicat, mode=ctx.args.mode,
                      pattern=ctx.args.table, chunk_rows=ctx.args.chunk_rows, say=say)
    print(result.describe())
    return 0


def arguments(verbs) -> None:
    command = verb(verbs, "load", load, "copy the source tables' current rows into the target on Spark, in key-range "
                                        "chunks without locks, and hand over to the replicat (docs/initial-load.md)")
    command.add_argument("source", help="the PostgreSQL source")
    command.add_argument("replicat", help="the replicat whose MAP names the target tables")
    command.add_argument("--table", default="*.*", metavar="PATTERN",
                         help="source tables to load, schema.table with * and ? (default: every mapped table)")
    command.add_argument("--chunk-rows", type=int, default=50_000, metavar="N", help="rows per key-range chunk "
                                                                                    "(default 50000)")
    command.add_argument("--mode", choices=["snapshot", "watermark"], default="snapshot",
                         help="snapshot: before the first pull, at the slot's exported snapshot (default); "
                              "watermark: at any time, between watermarks, resumable")
