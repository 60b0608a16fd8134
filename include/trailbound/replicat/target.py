"""The target database: connecting, how source tables map to target tables, the target
catalog's column types, and `target create` (tables from defs.json, for a quick start).

Replicat never guesses a type: every value travels as PostgreSQL text input and is
parsed by the target into the type its catalog gives the column. Keys come from the
source's defs.json (the images carry them); a keyless table is keyed by all its columns.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from trailbound import heartbeat
from trailbound.archive.contract import split_table_name
from trailbound.archive.segments import Column, TableDef
from trailbound.config import Config, MapRule
from trailbound.errors import TrailboundError
from trailbound.metadata import connection_error, dsn_from_env

IDENTITY = (MapRule(source="*.*", target="*.*"),)
# A defs.json type that may be written into DDL as it is: a type name, optional modifiers,
# array brackets. Anything else is refused rather than pasted into SQL.
_TYPE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_ ]*(\(\s*\d+\s*(,\s*\d+\s*)?\))?( ?\[\])*$")


def connect(config: Config, dsn: str | None = None):
    """A connection to the target (DSN from the variable `target.dsn_env` names)."""
    dsn = dsn or dsn_from_env(config.target.dsn_env)
    try:
        connection = psycopg2.connect(dsn, application_name="trailbound replicat", client_encoding="UTF8")
    except psycopg2.Error as exc:
        raise connection_error("the target", dsn, exc) from None
    return connection


def map_name(rules, source_table: str) -> tuple[str, str] | None:
    """The (schema, table) a source table maps to, or None if no rule selects it. A
    heartbeat table is never mapped: replicat writes its rows into its heartbeat tables."""
    if heartbeat.is_heartbeat(source_table):
        return None
    schema, table = split_table_name(source_table)
    for rule in rules:
        if fnmatch.fnmatchcase(source_table, rule.source):
            target_schema, _, target_table = rule.target.partition(".")
            return (schema if target_schema == "*" else target_schema,
                    table if target_table == "*" else target_table)
    return None


@dataclass(frozen=True)
class TablePlan:
    """How one source table is applied: its target and the target's types for its columns."""

    source: str
    schema: str
    name: str
    columns: tuple[str, ...]     # the source's columns, in defs.json order (the COPY order)
    types: tuple[str, ...]       # their types in the target's catalog
    not_null: tuple[bool, ...]
    key: tuple[str, ...]         # the source's key; all columns for a keyless table
    keyless: bool

    @property
    def target(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    def type_of(self, column: str) -> str:
        return self.types[self.columns.index(column)]

    def nullable(self, column: str) -> bool:
        return not self.not_null[self.columns.index(column)]


def catalog(cur, names: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, tuple[str, bool]]]:
    """The target tables' columns: (schema, table) -> column -> (format_type, NOT NULL)."""
    if not names:
        return {}
    cur.execute("SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull"
                " FROM unnest(%s::text[], %s::text[]) AS w(s, t)"
                " JOIN pg_namespace n ON n.nspname = w.s JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t"
                " JOIN pg_attribute a ON a.attrelid = c.oid"
                " WHERE c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                ([s for s, _ in names], [t for _, t in names]))
    found: dict[tuple[str, str], dict[str, tuple[str, bool]]] = {}
    for schema, table, column, type_name, not_null in cur.fetchall():
        found.setdefault((schema, table), {})[column] = (type_name, not_null)
    return found


def plan_tables(cur, defs: dict[str, TableDef], rules) -> dict[str, TablePlan | None]:
    """Every source table's plan (None: no map rule selects it). A mapped table missing
    from the target, or missing one of the source's columns, stops replicat here, before
    anything is applied."""
    return plans_from(catalog(cur, sorted({m for m in (map_name(rules, n) for n in defs) if m})), defs, rules)


def plans_from(found: dict[tuple[str, str], dict[str, tuple[str, bool]]], defs: dict[str, TableDef],
               rules) -> dict[str, TablePlan | None]:
    """plan_tables from the target's catalog as read (`catalog`), or as it will be once a
    table version's statements ran (replicat/ddl.py)."""
    mapped = {name: map_name(rules, name) for name in defs}
    plans: dict[str, TablePlan | None] = {}
    for source, target in mapped.items():
        if target is None:
            plans[source] = None
            continue
        table = defs[source]
        columns = found.get(target)
        shown = f"{target[0]}.{target[1]}"
        if columns is None:
            raise TrailboundError(f"target table {shown} (mapped from source table {source}) does not exist: create "
                                  f"it, or run `trailbound target create`")
        names = tuple(c.name for c in table.columns)
        missing = [c for c in names if c not in columns]
        if missing:
            raise TrailboundError(f"target table {shown} has no column(s) {', '.join(repr(c) for c in missing)} of "
                                  f"source table {source}")
        plans[source] = TablePlan(source, target[0], target[1], names, tuple(columns[c][0] for c in names),
                                  tuple(columns[c][1] for c in names), table.effective_key, not table.key)
    return plans


def type_sql(table: str, column) -> sql.SQL:
    """A defs.json column's type as DDL text, refused unless it is a plain type name."""
    if not _TYPE_NAME.match(column.type):
        raise TrailboundError(f"defs.json: table {table} column {column.name!r} has type {column.type!r}, "
                              "which trailbound will not write into DDL; create or alter this table yourself")
    return sql.SQL(column.type)


def as_replicated(table: TableDef) -> TableDef:
    """The table as replicat leaves a target that followed every version from the first
    (replicat/ddl.py under `ddl: {mode: apply, drop_columns: keep}`): the first version's
    columns, each later version's new ones after them, types as the latest says, a column
    a later version dropped kept nullable; the latest key. `target create` makes this, so
    a replicat starting anywhere in the archive finds every column a record of any version
    writes, and an added column's DEFAULT gives the rows written before it the source's value."""
    columns = {}
    for version in table.versions:
        columns.update({column.name: column for column in version.columns})
        for name in [name for name in columns if name not in version.names]:
            columns[name] = Column(name, columns[name].type, True, columns[name].default)
    return TableDef(table.name, tuple(columns.values()), table.latest.key)


def create_statements(table: TableDef, target: tuple[str, str]) -> list[sql.Composed]:
    """CREATE SCHEMA / TABLE IF NOT EXISTS for `table` at `target`: the source's types,
    NOT NULL, DEFAULT (the value the source's rows from before an added column hold) and
    primary key."""
    columns = [sql.SQL("{} {}{}{}").format(
        sql.Identifier(c.name), type_sql(table.name, c),
        sql.SQL("") if c.default is None else sql.SQL(" DEFAULT {}::{}").format(sql.Literal(c.default),
                                                                                type_sql(table.name, c)),
        sql.SQL("" if c.nullable else " NOT NULL")) for c in table.columns]
    if table.key:
        columns.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, table.key))))
    return [sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(target[0])),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(sql.Identifier(*target), sql.SQL(", ").join(columns))]


def create_tables(cur, defs: dict[str, TableDef], rules) -> list[tuple[str, str, bool]]:
    """CREATE TABLE IF NOT EXISTS for every mapped source table as replicat would have
    made it following its versions (`as_replicated`), with the source's types, NOT NULL,
    defaults and primary key. Returns (source, target, created now)."""
    done = []
    existing = catalog(cur, sorted({m for m in (map_name(rules, n) for n in defs) if m}))
    for name, table in defs.items():
        target = map_name(rules, name)
        if target is None:
            continue
        for statement in create_statements(as_replicated(table), target):
            cur.execute(statement)
        done.append((name, f"{target[0]}.{target[1]}", target not in existing))
    return done
