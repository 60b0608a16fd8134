"""`trailbound compare SRC REP1`: compare a source's tables with a replicat's (docs/compare.md)."""

from __future__ import annotations

from pathlib import Path

from trailbound.cli.context import Context, verb
from trailbound.errors import TrailboundError


def compare(ctx: Context) -> int:
    from trailbound.compare.run import compare as run_compare, resolve

    args = ctx.args
    resolve(ctx.config, args.source, args.replicat)  # refuse before Spark starts
    report = run_compare(ctx.spark, ctx.store, ctx.config, args.source, args.replicat, pattern=args.table,
                         chunk_rows=args.chunk_rows, wait_seconds=args.wait, report_dir=args.report_dir)
    print(report.describe())
    if args.repair_script:
        from trailbound.compare import repair
        from trailbound.compare.sides import connect
        from trailbound.metadata import dsn_from_env

        connection = connect(dsn_from_env(ctx.config.target.dsn_env), "the target")
        try:
            text = repair.script(report, connection)
        finally:
            connection.close()
        if args.repair_script == "-":
            print(text, end="")
        else:
            Path(args.repair_script).write_text(text, encoding="utf-8")
            print(f"Repair script: {args.repair_script} ({report.out_of_sync} row(s))")
    if args.fail_on_difference and report.out_of_sync:
        raise TrailboundError(f"{report.out_of_sync} row(s) out of sync (report {report.report_file})")
    return 0


def arguments(verbs) -> None:
    command = verb(verbs, "compare", compare, "compare a PostgreSQL source's tables with a replicat's target "
                                              "tables (docs/compare.md)")
    command.add_argument("source")
    command.add_argument("replicat")
    command.add_argument("--table", default="*", metavar="PATTERN",
                         help="source tables, schema.table with * and ? (default: every mapped table)")
    command.add_argument("--repair-script", metavar="FILE",
                         help="write the SQL that brings the target in line to FILE (- : print it)")
    command.add_argument("--chunk-rows", type=int, default=50_000, metavar="N",
                         help="about N source rows per key range, one Spark task each (default 50000)")
    command.add_argument("--wait", type=float, default=300.0, metavar="SECONDS",
                         help="how long to wait for the replicat to get past a difference (default 300)")
    command.add_argument("--report-dir", type=Path, help="where the report files go (default: var/compare/ "
                                                         "under home)")
    command.add_argument("--fail-on-difference", action="store_true",
                         help="exit with status 1 when rows are out of sync")
