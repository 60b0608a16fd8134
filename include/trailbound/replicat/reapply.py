"""`trailbound discards GROUP --reapply`: apply discarded operations again once the target
has been fixed (a constraint dropped, a missing row restored).

Each discarded operation is applied as replicat's record-by-record replay would apply it,
in a target transaction of its own that also deletes its discard row: it is applied and
gone from the discard table, or neither. They go in the order they were discarded. What
the target still refuses keeps its row and is reported with its SQLSTATE. The group is
held meanwhile (on the metadata store and the target), so no replicat run applies at the
same time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import psycopg2

from trailbound.archive.segments import load_defs
from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.metadata import MetadataStore
from trailbound.replicat import discards as dsc
from trailbound.replicat import target as tgt
from trailbound.replicat.apply.serial import Replayer, ReplayStats
from trailbound.replicat.checkpoint_table import CheckpointTableName
from trailbound.replicat.reperror import Failure, ABEND
from trailbound.replicat.run import group_lock, hold_target, release_target


@dataclass
class Reapplied:
    group: str
    table: str                                       # the discard table
    applied: list[dsc.Discard] = field(default_factory=list)
    refused: list[Failure] = field(default_factory=list)   # Failure.record is the Discard

    def describe(self) -> str:
        total = len(self.applied) + len(self.refused)
        if not total:
            return f"Replicat {self.group}: no discarded operations to reapply in {self.table}."
        head = f"Replicat {self.group}: reapplied {len(self.applied)} of {total} discarded operation(s) from {self.table}"
        if not self.refused:
            return head + "."
        lines = [f"{head}; {len(self.refused)} still refused (their rows stay):"]
        for failure in self.refused:
            row = failure.record
            lines.append(f"  discard {row.discard_id}: {row.op} on {row.source_table} (seqno {row.seqno} rba "
                         f"{row.rba}, CSN {row.csn}): SQLSTATE {failure.sqlstate or '-'}: {failure.message}")
        return "\n".join(lines)


def reapply(store: MetadataStore, config: Config, group: str, *, target_dsn: str | None = None,
            since: datetime | None = None, table: str | None = None) -> Reapplied:
    name = config.replicat_name(group)
    replicat = config.replicat(name)
    checkpoint_table = CheckpointTableName.parse(replicat.checkpointtable)
    result = Reapplied(name, dsc.name_of(checkpoint_table))
    with group_lock(store, name):
        connection = tgt.connect(config, target_dsn)
        try:
            hold_target(connection, name)
            with connection.cursor() as cur:
                rows = dsc.select(cur, checkpoint_table, name, since=since, table=table)
                plans = tgt.plan_tables(cur, load_defs(config.archive_dir(replicat.source)), replicat.map) if rows else {}
            connection.commit()
            replayer, delete = Replayer(plans, handlecollisions=False), dsc.delete_statement(checkpoint_table)
            for row in rows:
                try:
                    with connection.cursor() as cur:
                        replayer.apply(cur, row.record, ReplayStats())
                        cur.execute(delete, (row.discard_id,))
                    connection.commit()
                    result.applied.append(row)
                except (psycopg2.Error, TrailboundError) as exc:
                    if connection.closed:
                        raise TrailboundError(f"the target went away reapplying discard {row.discard_id}: "
                                              f"{' '.join(str(exc).split())}") from None
                    connection.rollback()
                    result.refused.append(Failure(row, exc, ABEND))
        finally:
            release_target(connection, name)
    return result
