"""A live source's heartbeat table (trailbound/heartbeat.py, docs/heartbeat.md):
`trailbound add heartbeattable SRC` creates it on the source; the next pull publishes it
(admin.widen_scope: it is always in the source's scope) and every pull writes its row
before it reads the slot.

Each pull's write is a change of a published table even when the published tables are
idle and the server is busy with others: the slot's confirmed position moves on every
pull (the WAL it holds for the source does not pile up behind unpublished writes), and
the row carries its stamps to the target.
"""

from __future__ import annotations

from psycopg2 import sql

from trailbound import heartbeat
from trailbound.errors import TrailboundError

_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {table} (
    source      text        PRIMARY KEY,
    seq         bigint      NOT NULL,
    written_at  timestamptz NOT NULL
)"""
# clock_timestamp(), not now(): the moment of the write, whatever the session did before.
_BEAT = ("INSERT INTO {table} AS h (source, seq, written_at) VALUES (%s, 1, clock_timestamp())"
         " ON CONFLICT (source) DO UPDATE SET seq = h.seq + 1, written_at = EXCLUDED.written_at")


def create(connection, source: str, schema: str) -> str:
    """The heartbeat table in `schema` (created with it if needed), holding the source's
    first row. Publishing it is the next pull's."""
    table = sql.Identifier(schema, heartbeat.TABLE)
    with connection.cursor() as cur:
        cur.execute(sql.SQL(_DDL).format(schema=sql.Identifier(schema), table=table))
        cur.execute(sql.SQL("INSERT INTO {} (source, seq, written_at) VALUES (%s, 1, clock_timestamp())"
                            " ON CONFLICT (source) DO NOTHING").format(table), (source,))
    return f"{schema}.{heartbeat.TABLE}"


def drop(connection, source: str, schema: str) -> str:
    """DELETE HEARTBEATTABLE: the heartbeat table dropped (with it, from every publication,
    so no pull writes or re-publishes it). Refused while it holds another source's row:
    the table is theirs too."""
    table = sql.Identifier(schema, heartbeat.TABLE)
    name = f"{schema}.{heartbeat.TABLE}"
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (table.as_string(cur),))
        if cur.fetchone()[0] is None:
            raise TrailboundError(f"no heartbeat table {name} on source {source}")
        cur.execute(sql.SQL("SELECT source FROM {} WHERE source <> %s ORDER BY source").format(table), (source,))
        others = [row[0] for row in cur.fetchall()]
        if others:
            raise TrailboundError(f"heartbeat table {name} also holds the heartbeat of {', '.join(others)}: "
                                  "drop it when no source uses it (nothing was changed)")
        cur.execute(sql.SQL("DROP TABLE {}").format(table))
    return name


def published(connection, publication: str) -> list[str]:
    """The heartbeat tables the publication holds (schema names)."""
    with connection.cursor() as cur:
        cur.execute("SELECT schemaname FROM pg_publication_tables WHERE pubname = %s AND tablename = %s"
                    " ORDER BY schemaname", (publication, heartbeat.TABLE))
        return [schema for (schema,) in cur.fetchall()]


def beat(connection, source: str, publication: str) -> int:
    """The source's row written (seq + 1, written now) in each published heartbeat
    table, each in its own committed transaction; how many were written."""
    schemas = published(connection, publication)
    with connection.cursor() as cur:
        for schema in schemas:
            cur.execute(sql.SQL(_BEAT).format(table=sql.Identifier(schema, heartbeat.TABLE)), (source,))
    return len(schemas)
