"""The metadata store: the PostgreSQL database holding every checkpoint and catalog.

Its schema comes from forward-only SQL migrations (sql/migrations/NNNN_name.sql),
applied at open under an advisory lock so concurrent jobs starting together apply each
migration exactly once. `trailbound.schema_migration` records which ran.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from importlib import resources
from typing import Iterator

import psycopg2
import psycopg2.extensions
import psycopg2.extras
from psycopg2 import sql

from trailbound.errors import TrailboundError

SCHEMA = "trailbound"
# Any constant: it only has to be the same for every process migrating this database.
_MIGRATION_LOCK = 0x7472_6169_6C62  # "trailb"
_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def dsn_from_env(variable: str) -> str:
    dsn = os.environ.get(variable)
    if not dsn:
        raise TrailboundError(
            f"{variable} is not set: point it at a PostgreSQL database "
            "(for example `export $(make -s env)` after `make db`)"
        )
    return dsn


def redact(dsn: str) -> str:
    """A DSN fit for a log line: the password replaced, in both DSN syntaxes."""
    dsn = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", dsn)


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every migration shipped with the package, in order."""
    found = []
    for entry in resources.files("trailbound.sql").joinpath("migrations").iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [version for version, _, _ in found]
    if len(set(versions)) != len(versions):
        raise TrailboundError("two migrations share a version number")
    return found


class MetadataStore:
    """A connection to the metadata database. Use `open()`; it migrates on the way in."""

    def __init__(self, connection: psycopg2.extensions.connection):
        self.connection = connection

    @classmethod
    def open(cls, dsn: str) -> "MetadataStore":
        try:
            connection = psycopg2.connect(dsn, application_name="trailbound")
        except psycopg2.OperationalError as exc:
            raise TrailboundError(f"cannot connect to the metadata store {redact(dsn)}: {exc}".strip()) from None
        # Times read back from timestamptz columns come in the session's zone; the console's
        # rule is UTC everywhere, so the session is UTC whatever PGTZ or the server says.
        with connection, connection.cursor() as cur:
            cur.execute("SET TimeZone TO 'UTC'")
        store = cls(connection)
        store.migrate()
        return store

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> "MetadataStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[psycopg2.extras.RealDictCursor]:
        """One metadata transaction: everything in the block commits together or not at all."""
        with self.connection:  # commits on success, rolls back on any exception
            with self.connection.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cursor:
                yield cursor

    def applied_migrations(self) -> list[int]:
        with self.transaction() as cur:
            cur.execute("SELECT version FROM trailbound.schema_migration ORDER BY version")
            return [row["version"] for row in cur.fetchall()]

    def migrate(self) -> list[int]:
        """Apply every migration not yet recorded; returns the versions applied now."""
        applied_now = []
        with self.transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            cur.execute("CREATE SCHEMA IF NOT EXISTS trailbound")
            cur.execute(
                "CREATE TABLE IF NOT EXISTS trailbound.schema_migration ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur.execute("SELECT version FROM trailbound.schema_migration")
            done = {row["version"] for row in cur.fetchall()}
            # All pending migrations go in the lock-holding transaction: a failure in any
            # leaves the schema exactly as it was.
            for version, name, sql_text in migrations():
                if version in done:
                    continue
                cur.execute(sql_text)
                cur.execute(
                    "INSERT INTO trailbound.schema_migration (version, name) VALUES (%s, %s)", (version, name)
                )
                applied_now.append(version)
        return applied_now


def load_group_row(cur, kind: str, group: str, checkpoint_columns: tuple[str, ...]) -> dict | None:
    """A pump's or replicat's group row joined with its checkpoint row (tables
    trailbound.<kind>_group and <kind>_checkpoint), the group name matched case-blind."""
    cur.execute(sql.SQL("SELECT g.*, {} FROM {} g JOIN {} c USING (group_name)"
                        " WHERE upper(g.group_name) = upper(%s)").format(
                    sql.SQL(", ").join(sql.Identifier("c", column) for column in checkpoint_columns),
                    sql.Identifier(SCHEMA, f"{kind}_group"), sql.Identifier(SCHEMA, f"{kind}_checkpoint")),
                (group,))
    return cur.fetchone()
