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


def connection_error(what: str, dsn: str, exc: Exception) -> TrailboundError:
    """`cannot connect to <what>`, naming the DSN without its password. The driver's own
    text is kept only when the DSN parses (it may quote a piece of a DSN that does not,
    such as a password with an unquoted space), with the password taken out of it too."""
    try:
        password = psycopg2.extensions.parse_dsn(dsn).get("password")
    except psycopg2.Error:
        return TrailboundError(f"cannot connect to {what}: its DSN does not parse (not shown: it may hold a password)")
    text = str(exc).strip()
    if password:
        text = text.replace(password, "***")
    return TrailboundError(f"cannot connect to {what} {redact(dsn)}: {' '.join(text.split())}")


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
        except psycopg2.Error as exc:
            raise connection_error("the metadata store", dsn, exc) from None
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
        """One metadata transaction: everything in the block commits together or not at all.
        A connection the server dropped (a restart, pg_terminate_backend, a network cut)
        ends the run with one error saying so, not a driver traceback; nothing of the
        transaction committed, so a re-run starts from the last committed checkpoint."""
        try:
            with self.connection:  # commits on success, rolls back on any exception
                with self.connection.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cursor:
                    yield cursor
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            if not self.connection.closed:
                raise
            # The rollback on the way out fails too ("connection already closed"): the
            # server's own reason is in the error that started it.
            cause = exc.__context__ if isinstance(exc.__context__, psycopg2.OperationalError) else exc
            reason = " ".join(str(cause).split()) or type(cause).__name__
            raise TrailboundError(f"lost the connection to the metadata store: {reason}; nothing of the "
                                  "interrupted step was committed, run again") from None

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
