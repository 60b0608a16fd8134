"""What every verb of the command line shares: the Context a handler gets (configuration,
metadata store and Spark, each opened on first use), `verb` that adds a verb's parser
with its handler, and the argument types of times and positions."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Callable

from trailbound import config as configuration


def utc_time(text: str) -> datetime:
    """--until and friends: ISO-8601; a time without a zone is UTC, like the archive's."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time") from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; positions and counts start at 0")
    return value


class Context:
    """What a verb needs, opened lazily: a verb that needs no database opens none."""

    def __init__(self, args: argparse.Namespace, dsns: dict[str, str] | None = None):
        self.args = args
        self.dsns = dict(dsns or {})  # variable -> DSN, given by the caller (see main)
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

            variable = self.config.metadata.dsn_env
            self._store = MetadataStore.open(self.dsns.get(variable) or dsn_from_env(variable))
        return self._store

    @property
    def target_dsn(self) -> str | None:
        """The target's DSN when the caller gave it; None: the engine reads the variable."""
        return self.dsns.get(self.config.target.dsn_env)

    @property
    def spark(self):
        if self._spark is None:
            from trailbound import spark

            self._spark = spark.session(f"trailbound {' '.join(sys.argv[1:3])}".strip(),
                                        remote=getattr(self.args, "remote", None))
        return self._spark

    def source_name(self) -> str:
        return self.config.source_name(getattr(self.args, "source", None))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def airflow_run_argument(run: argparse.ArgumentParser) -> None:
    """`extract|pump|replicat run ... --airflow-run DAG_ID RUN_ID`: the Airflow task that
    starts a run names its DAG run, recorded with the run's outcome (trailbound.runlog)."""
    run.add_argument("--airflow-run", nargs=2, metavar=("DAG_ID", "RUN_ID"),
                     help="the Airflow DAG run this run belongs to (the DAGs' tasks pass it)")


def poll_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                         help="how long to wait when there is nothing to do (default 1)")


def loop_argument(command: argparse.ArgumentParser, what: str) -> None:
    """`--loop` (and `--poll`) of `extract|pump|replicat run` and `archive pull`: the runs
    `trailbound replicate` starts (trailbound.overlap)."""
    command.add_argument("--loop", action="store_true",
                         help=f"run again {what}, each time an ordinary run, until SIGTERM or SIGINT (the run in "
                              "progress ends first)")
    poll_argument(command)


def verb(group, name: str, handler: Callable[[Context], int], help_text: str) -> argparse.ArgumentParser:
    """A verb (or a verb's action or kind) that runs `handler`; its help is its description too."""
    sub = group.add_parser(name, help=help_text, description=help_text)
    sub.set_defaults(handler=handler)
    return sub
