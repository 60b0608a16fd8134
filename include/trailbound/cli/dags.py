"""`trailbound dags generate`: one Airflow DAG file per configured group."""

from __future__ import annotations

from pathlib import Path

from trailbound.cli.context import Context, verb


def dags_generate(ctx: Context) -> int:
    from trailbound import dagfiles

    for path in dagfiles.generate(ctx.config, ctx.args.directory):
        print(path)
    return 0


def arguments(verbs) -> None:
    dags = verbs.add_parser("dags", help="Airflow DAG files").add_subparsers(dest="action", required=True,
                                                                            metavar="ACTION")
    generate = verb(dags, "generate", dags_generate, "write one DAG file per configured group (no I/O at parse)")
    generate.add_argument("--directory", type=Path, default=Path("dags"), help="where (default: dags/)")
