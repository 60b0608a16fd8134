"""The slot created again with an exported snapshot: the initial load's consistent point.

`CREATE_REPLICATION_SLOT slot LOGICAL pgoutput (SNAPSHOT 'export')` on a replication
connection returns the slot's consistent point and the name of a snapshot that sees
exactly the transactions committed before it. The snapshot lives while that connection
stays open and runs nothing else: every chunk reader imports it
(`SET TRANSACTION SNAPSHOT`), so all of them read the same state of the database, the
one the slot's first change follows.

Only before anything was pulled: the slot `add source` created is dropped and made
again (nothing of it is in the archive yet), and the miner's state moves to the new
consistent point, where the archive's first segment will start.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg2
import psycopg2.extras
from psycopg2 import sql

from trailbound.errors import TrailboundError
from trailbound.metadata import connection_error
from trailbound.sources.postgres.lsn import Lsn
from trailbound.sources.postgres.reader import session_options


@dataclass
class ExportedSnapshot:
    dsn: str
    slot: str
    consistent: Lsn | None = None
    name: str | None = None
    created_at: datetime | None = None
    _replication = None

    def __enter__(self) -> "ExportedSnapshot":
        try:
            plain = psycopg2.connect(self.dsn, options=session_options())
        except psycopg2.Error as exc:
            raise connection_error("the source", self.dsn, exc) from None
        plain.autocommit = True
        try:
            with plain.cursor() as cur:
                cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
                row = cur.fetchone()
                if row and row[0] is not None:
                    raise TrailboundError(f"replication slot {self.slot} is in use by server process {row[0]} (a "
                                          "pull is running); a snapshot load must come before the first pull")
                if row:
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
            self._replication = psycopg2.connect(self.dsn, options=session_options(),
                                                 connection_factory=psycopg2.extras.LogicalReplicationConnection)
            with self._replication.cursor() as cur:
                cur.execute(sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export')").format(
                    sql.Identifier(self.slot)).as_string(self._replication))
                _, consistent, self.name, _ = cur.fetchone()
            with plain.cursor() as cur:
                cur.execute("SELECT now()")
                self.created_at = cur.fetchone()[0].astimezone(UTC)
        finally:
            plain.close()
        self.consistent = Lsn.parse(consistent)
        return self

    def __exit__(self, *exc) -> None:
        # Closing the replication connection ends the snapshot; the slot stays.
        if self._replication is not None:
            self._replication.close()
            self._replication = None
