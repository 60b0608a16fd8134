"""The `trailbound` command line (GGSCI's verbs where GoldenGate has one); `trailbound
--help` lists the verbs (parser.py's USAGE).

    __init__.py   main(): parse, run the verb's handler, turn errors into one ERROR line;
                  a run's outcome goes to the run log
    __main__.py   `python -m trailbound.cli`
    context.py    the Context a handler gets (configuration, store, Spark, opened on first
                  use), `verb`, argument types
    parser.py     the top-level parser: the verbs in `--help`'s order, the add, delete,
                  alter and info verbs
    archive.py    archive scan|list|verify|mark-backed-up
    source.py     a live PostgreSQL source: archive pull, add|delete|alter|info source
    load.py       load (the initial load)
    extract.py    extract run, add|delete|alter|info extract, send extract, start extract
    status.py     info all, and INFO of the groups a wildcard matches
    pump.py       pump run, add|delete|info pump, purge trails
    retention.py  register|unregister extract ... logretention, retention run, info retention
    replicat.py   replicat run, add checkpointtable, alter|info replicat, target create, discards
    stats.py      stats extract|pump|replicat (STATS), lag extract|pump|replicat (LAG)
    report.py     view report (VIEW REPORT), send replicat ... status
    compare.py    compare
    replicate.py  replicate (a source's stages at once), and --loop of the run verbs
    dags.py       dags generate
    logdump.py    logdump
    simulate.py   simulate

Each family's module holds its handlers (`def handler(ctx) -> int`) and, in
`arguments`, its verbs' words, options and help. Handlers import the engine inside
their bodies, so a verb loads only what it uses.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from trailbound.cli.context import Context
from trailbound.cli.extract import extract_run
from trailbound.cli.parser import build_parser
from trailbound.cli.pump import pump_run
from trailbound.cli.replicat import replicat_run
from trailbound.errors import TrailboundError, spark_task_errors_as_ours

__all__ = ["Context", "build_parser", "main"]


RUN_VERBS = {extract_run: "extract", pump_run: "pump", replicat_run: "replicat"}


@contextmanager
def _outcome_recorded(ctx: Context, argv: list[str]):
    """`extract|pump|replicat run`: the run's outcome goes to the run log (trailbound.runlog)
    whatever it is; a group whose last run failed is ABENDED until a run succeeds."""
    kind = RUN_VERBS.get(ctx.args.handler)
    name = None
    if kind is not None:
        try:
            name = getattr(ctx.config, f"{kind}_name")(ctx.args.group)
        except TrailboundError:
            pass  # not a configured group: the run itself says so, and there is no group to mark
    if name is None:
        yield
        return
    from trailbound import runlog

    airflow_run = getattr(ctx.args, "airflow_run", None)
    with runlog.recorded_run(ctx.store, kind, name, " ".join(["trailbound", *argv]),
                             tuple(airflow_run) if airflow_run else None):
        yield


def _once(ctx: Context, argv: list[str]) -> int:
    with _outcome_recorded(ctx, argv):
        with spark_task_errors_as_ours():
            return ctx.args.handler(ctx)


def _looped(ctx: Context, argv: list[str]) -> int:
    """`... run --loop` (and `archive pull --loop`): ordinary runs, one after another, each
    recorded on its own; between them the wait trailbound.overlap.repeat makes."""
    from trailbound.overlap import idle_check, repeat

    if getattr(ctx.args, "pull", False) or getattr(ctx.args, "until", None):
        raise TrailboundError("--loop runs each capture up to what is archived then: it takes neither --pull "
                              "(`trailbound replicate` pulls beside the loops) nor --until")
    kind = RUN_VERBS.get(ctx.args.handler)
    group = getattr(ctx.config, f"{kind}_name")(ctx.args.group) if kind else None
    check = idle_check(kind, ctx.store, ctx.config, group, ctx.target_dsn) if kind else None

    def run_once() -> None:
        _once(ctx, argv)
        sys.stdout.flush()  # a supervisor relays each run's line as it comes

    repeat(run_once, check, ctx.args.poll)
    return 0


def _shell_expanded(argv: list[str], args, extra: list[str]) -> str | None:
    """What to say when a group name came as several words that are file names here: an
    unquoted `info extract *` that the shell expanded before we saw it. None otherwise."""
    group = getattr(args, "group", None)
    if not isinstance(group, str) or group not in argv:
        return None
    words = [group, *extra]
    if any(word.startswith("-") for word in extra) or not any(os.path.lexists(word) for word in words):
        return None
    verb_words, skip = [], False
    for word in argv[:argv.index(group)]:  # the verb's words, without --config FILE
        if not skip and not word.startswith("-"):
            verb_words.append(word)
        skip = word == "--config"
    command = " ".join(["trailbound", *verb_words])
    shown = ", ".join(words[:5]) + (", ..." if len(words) > 5 else "")
    return (f"{command}: {len(words)} words where one group name goes ({shown}): the shell expanded an unquoted "
            f"* or ? into the file names here. Quote the wildcard: {command} '*'")


def main(argv: list[str] | None = None, *, dsns: dict[str, str] | None = None) -> int:
    """Run one command line. `dsns` (environment variable name -> DSN) stands in for
    those variables: the Airflow hook passes the DSNs it resolved this way instead of
    writing them into the process environment."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        expanded = _shell_expanded(argv, args, extra)
        if expanded:
            print(f"ERROR {expanded}", file=sys.stderr)
            return 2
        parser.parse_args(argv)  # argparse's own usage error, exit status 2
    ctx = Context(args, dsns)
    try:
        status = _looped(ctx, argv) if getattr(args, "loop", False) else _once(ctx, argv)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's exit
        return status
    except TrailboundError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`trailbound info all | head`): stop quietly, as `cat` does;
        # stdout goes to /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command the pipe ended
    except Exception as exc:
        # A database's refusal that no step turned into one of ours (those name the server):
        # still one line, the server's own words, not a traceback. The driver's text for a
        # session already open never holds a DSN; every connect names its server itself.
        if not type(exc).__module__.startswith("psycopg2"):
            raise
        words = " ".join((getattr(exc, "pgerror", None) or str(exc)).split())
        for severity in ("ERROR: ", "FATAL: "):  # the server's own prefix: ours says ERROR already
            words = words.removeprefix(severity)
        print(f"ERROR {args.handler.__name__.replace('_', ' ')}: {words}", file=sys.stderr)
        return 1
    finally:
        ctx.close()
