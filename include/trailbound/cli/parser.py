"""The command line's parser: the top-level usage, the verbs in the order `trailbound
--help` lists them, and the add, delete, alter and info verbs whose kinds (extract,
source, pump, replicat, ...) each family adds beside its handlers."""

from __future__ import annotations

import argparse

from trailbound import config as configuration
from trailbound.cli import (archive, compare, dags, extract, load, logdump, pump, replicat, replicate, report, retention,
                            simulate, source, stats, status)

USAGE = """The `trailbound` command line. Its verbs mirror GGSCI's where GoldenGate has one
(INFO EXTRACT ... SHOWCH, SEND EXTRACT ... SKIPTRANS, ALTER REPLICAT ... ATCSN, LOGDUMP).

    trailbound archive scan|list|verify      the redo archive and its catalog
    trailbound archive mark-backed-up        count a backup of segments (the backedup policy)
    trailbound extract run EXT1 [--until T]  one capture batch (--pull: pull a PostgreSQL source meanwhile)
    trailbound add|delete extract EXT1       add a capture group (ADD EXTRACT), or delete its checkpoints
    trailbound alter extract EXT1 begin ...  reposition capture
    trailbound send extract EXT1 showtrans|skiptrans XID|forcetrans XID   directives for the next run
    trailbound start extract EXT1 --brreset  start options for the next run
    trailbound info all                      every group: status, lag at checkpoint, time since it
    trailbound info extract EXT1 [--showch]  status and checkpoints (EXT* or *: every matching group)
    trailbound logdump TRAILFILE [--json]    print trail records (--from RBA, --count N)
    trailbound pump run PMP1                 ship committed trail files to the remote trail
    trailbound add|delete|info pump PMP1     manage pump groups (info: --showch)
    trailbound purge trails [--dry-run]      delete trail files every reader has passed (PURGEOLDEXTRACTS)
    trailbound register|unregister extract EXT1 logretention   keep the log EXT1 needs (or stop)
    trailbound retention run [--dry-run]     purge redo segments no registered capture needs
    trailbound info retention                required SCNs, what is purgeable, why the rest stays
    trailbound replicat run REP1             apply the trail to the target, exactly once
    trailbound add checkpointtable [S.NAME]  create the checkpoint table in the target
    trailbound alter replicat REP1 atcsn N   reposition (atcsn|aftercsn N, extseqno S extrba R)
    trailbound info replicat REP1 [--showch] checkpoint table row and file checkpoint
    trailbound stats replicat REP1 [--table P] [--totalsonly [P]] [--latest|--hourly|--daily|--total]
                                             operations per table (stats extract|pump|replicat G)
    trailbound lag replicat REP1             last record lag, at EOF or not (lag extract|pump|replicat G);
                                             a replicat's heartbeat: end-to-end lag and each hop's share
    trailbound view report REP1 [--run N]    a run: command, outcome, what it committed, counts per table
    trailbound send replicat REP1 status     a batch replicat: run in progress, checkpoint, what waits
    trailbound discards REP1 [--since TS] [--table P] [--reapply]
                                             discarded operations (REPERROR); --reapply them after a fix
    trailbound target create [--source S]    create target tables from defs.json
    trailbound dags generate [--directory D] write one Airflow DAG file per configured group
    trailbound simulate                      write the simulated source's archive
    trailbound add|delete|info source SRC    a live PostgreSQL source: publication, slot, defs.json
    trailbound archive pull SRC              archive a PostgreSQL source's WAL through its slot
    trailbound add|delete heartbeattable SRC a heartbeat table each pull writes: end-to-end lag (lag, info all)
    trailbound replicate SRC [--follow]      pull, capture, pump and replicat at once until caught up
    trailbound compare SRC REP1 [--table P]  compare source and target tables (Veridata-style), confirm
                                             differences once replicat is past them; --repair-script FILE
    trailbound load SRC REP1 [--table P]     initial load on Spark: at the slot's snapshot, or between watermarks

Every verb reads the configuration file (--config, else $TRAILBOUND_CONFIG) and the
metadata store's DSN from the variable the file names. A verb that needs Spark talks to
the Spark Connect server --remote (else $SPARK_REMOTE) names, else starts a local Spark. Errors a user can act on are
printed as one `ERROR` paragraph naming the file, key or position, exit status 1; a
command line that does not parse prints its usage, exit status 2. Times are UTC.
"""

GROUP_VERBS = {"add": "add an extract or pump group, or the checkpoint table (ADD ...)",
               "delete": "delete an extract's or pump's checkpoints (DELETE ...)",
               "alter": "reposition an extract or a replicat, or accept a lost slot's gap (ALTER ...)",
               "info": "status and checkpoints: all, extract, pump, replicat, retention (INFO ...)"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trailbound", description=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help=f"configuration file (default ${configuration.CONFIG_ENV})")
    parser.add_argument("--remote", metavar="sc://HOST:PORT",
                        help="run Spark work on this Spark Connect server (default $SPARK_REMOTE; unset: a local "
                             "Spark in this process)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    archive_actions = archive.arguments(verbs)
    load.arguments(verbs)
    extract.run_arguments(verbs)
    replicate.arguments(verbs)
    kinds = {word: verbs.add_parser(word, help=overview).add_subparsers(dest="kind", required=True, metavar="KIND")
             for word, overview in GROUP_VERBS.items()}  # add/delete/alter/info -> their KIND subparsers
    extract.arguments(verbs, kinds)
    source.arguments(archive_actions, kinds)
    pump.arguments(verbs, kinds)
    status.arguments(kinds)
    retention.arguments(verbs, kinds)
    replicat.arguments(verbs, kinds)
    replicat.discards_arguments(verbs)
    stats.arguments(verbs)
    report.arguments(verbs)
    compare.arguments(verbs)
    dags.arguments(verbs)
    logdump.arguments(verbs)
    simulate.arguments(verbs)
    _config_after_the_verb(parser)
    return parser


def _config_after_the_verb(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` anywhere on the line: before the verb (the top-level option) or
    after it (`trailbound info all --config FILE`), as a user types it. Each verb's own
    option leaves the top-level value alone unless it is given."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                if not any("--config" in a.option_strings for a in sub._actions):
                    sub.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
                _config_after_the_verb(sub)
