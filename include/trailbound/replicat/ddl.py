"""A source table's new version on the target: which change replicat makes, or why it stops.

Every trail record carries the version of its table's definition it was written under
(`table_version`, trail format 3; the versions are in the redo archive's defs.json).
A run plans each mapped table for one version (`Versions.expected`); the first record of
another version is a *fence*: the run applies everything before it, then this module
compares the target's catalog with the new version and either

- composes the statements that make the target fit it (`Step.statements`): a new column
  added (nullable, or with the value the source's old rows hold as its default), a
  dropped column kept (its NOT NULL dropped, so rows without it fit) or dropped
  (`ddl.drop_columns`), a widened type altered, a new table a MAP selects created. They
  run in the same target transaction as, and before, the first row that uses the version
  (run.py executes `Versions.pending` there), so a crash leaves both or neither; or
- stops the run before that row (`DdlStop`, one line naming the table, version, trail
  position and the runbook) for anything else: a narrowing or incompatible type change,
  a renamed column, a new key, a new NOT NULL column without a default, or any change
  under `ddl: {mode: abend}`. Nothing past the fence is applied. Once the target has been
  made to fit by hand (docs/live-postgres.md, "When a table changes"), the next run
  finds nothing to do and goes on.

The decision reads the target's catalog, not a record of what was done: a run killed
after the change committed finds the target already fitting, and composes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql

from trailbound.archive.segments import Column, TableDef, TableVersion
from trailbound.config import DdlConfig
from trailbound.errors import TrailboundError
from trailbound.replicat import target as tgt

RUNBOOK = 'docs/live-postgres.md, "When a table changes"'


class DdlStop(TrailboundError):
    """A table's new version that replicat does not apply on its own."""


@dataclass
class Fence:
    """Where the run stopped planning: the first record of a version its plans are not for."""

    seqno: int
    rba: int               # the first record of the transaction that holds it
    csn: str
    path: str
    changed: dict[str, int]  # source table -> the version its records there carry

    def where(self) -> str:
        return f"trail file {self.path} rba {self.rba} (CSN {self.csn})"


@dataclass
class Versions:
    """The version each table is planned for in this pass, the plans, and the statements
    still to run before the first row of the pass."""

    defs: dict[str, TableDef]
    rules: tuple
    policy: DdlConfig
    expected: dict[str, int]
    plans: dict[str, tgt.TablePlan | None] = field(default_factory=dict)
    pending: list[sql.Composable] = field(default_factory=list)
    described: list[str] = field(default_factory=list)   # what the pending statements do, for the log
    # The target tables' columns as they will be once the pending statements ran.
    predicted: dict[tuple[str, str], dict[str, tuple[str, bool]] | None] = field(default_factory=dict)

    def mapped(self, table: str) -> bool:
        return tgt.map_name(self.rules, table) is not None

    def definition(self, table: str) -> TableDef:
        """The table as its expected version defines it."""
        version = self.defs[table].version(self.expected[table])
        return TableDef(table, version.columns, version.key)

    def run_pending(self, cur) -> None:
        """The version's statements, inside the target transaction of its first row."""
        for statement in self.pending:
            cur.execute(statement)

    def committed(self) -> None:
        self.pending, self.described, self.predicted = [], [], {}


def start(cur, defs: dict[str, TableDef], rules, policy: DdlConfig, log_scn: int | None) -> Versions:
    """The versions a run starts with: each table's version in effect at the checkpoint's
    log CSN (the first one before any), planned against the target as it is. Under
    `mode: apply` a new table (one that appeared in the archive after it began) is
    created before the run's first row; a missing column of that version stops the run
    here in either mode (only a version change adds a column: `_Change.decide`)."""
    expected = {name: (table.version_at(log_scn) if log_scn is not None else table.versions[0]).version
                for name, table in defs.items()}
    versions = Versions(defs, tuple(rules), policy, expected)
    _plan(cur, versions, {name: None for name in defs}, None)
    return versions


def advance(cur, versions: Versions, fence: Fence, defs: dict[str, TableDef] | None = None) -> Versions:
    """The versions after `fence`: the changed tables planned for their new version, with
    the statements that make the target fit it, or DdlStop. `defs`: the source's
    definitions read again (a table may have entered the archive since the run began)."""
    if defs is not None:
        versions.defs = defs
    expected = {name: versions.expected.get(name, table.versions[0].version) for name, table in versions.defs.items()}
    previous = {}
    for table, number in fence.changed.items():
        if table not in versions.defs:
            raise DdlStop(f"source table {table} at {fence.where()} is not in the source's defs.json: its archive's "
                          f"definitions are older than the trail; see {RUNBOOK}")
        previous[table] = versions.defs[table].version(versions.expected[table]) \
            if table in versions.expected else None
        expected[table] = number
    advanced = Versions(versions.defs, versions.rules, versions.policy, expected)
    # Statements no row has run yet (the pass ended before its first group) come first.
    advanced.pending, advanced.described = list(versions.pending), list(versions.described)
    advanced.predicted = dict(versions.predicted)
    _plan(cur, advanced, previous, fence)
    return advanced


def _plan(cur, versions: Versions, previous: dict[str, TableVersion | None], fence: Fence | None) -> None:
    """Plans for every table; statements and predicted catalog entries for the tables in
    `previous` (those whose version is new: None for the run's start or a new table)."""
    names = sorted({m for m in (tgt.map_name(versions.rules, n) for n in versions.defs) if m})
    catalog = tgt.catalog(cur, names)
    catalog.update({target: columns for target, columns in versions.predicted.items() if columns is not None})
    keys = _primary_keys(cur, [tgt.map_name(versions.rules, n) for n in previous if versions.mapped(n)])
    for table, before in previous.items():
        target = tgt.map_name(versions.rules, table)
        if target is None:
            continue
        version = versions.defs[table].version(versions.expected[table])
        change = _Change(table, version, before, target, catalog.get(target), keys.get(target), versions, fence)
        catalog[target] = versions.predicted[target] = change.decide()
    versions.plans = tgt.plans_from(catalog, {name: versions.definition(name) for name in versions.defs},
                                    versions.rules)


@dataclass
class _Change:
    table: str
    version: TableVersion
    before: TableVersion | None       # the version planned until now; None at the start of a run
    target: tuple[str, str]
    columns: dict[str, tuple[str, bool]] | None   # the target's columns: name -> (type, NOT NULL); None: no table
    target_key: tuple[str, ...] | None
    versions: Versions
    fence: Fence | None

    @property
    def shown(self) -> str:
        return f"{self.target[0]}.{self.target[1]}"

    def stop(self, what: str) -> DdlStop:
        where = (f"before {self.fence.where()}, its first record of version {self.version.version}"
                 if self.fence else "before its first record")
        return DdlStop(f"source table {self.table} version {self.version.version} (from source scn "
                       f"{self.version.scn}): {what}; replicat stopped {where} and applied nothing past it. "
                       f"Make target table {self.shown} fit version {self.version.version} "
                       f"({_described(self.version)}) by hand, then run replicat again; see {RUNBOOK}")

    def decide(self) -> dict[str, tuple[str, bool]] | None:
        """Compose the statements (into versions.pending); the target's columns as they
        will be once they ran."""
        versions, policy = self.versions, self.versions.policy
        new_table = self.versions.defs[self.table].versions[0].scn > 0  # appeared in the archive after it began
        if self.columns is None:
            if policy.mode == "apply" and new_table:
                return self._create()
            if self.fence is None:  # as plan_tables always said
                raise TrailboundError(f"target table {self.shown} (mapped from source table {self.table}) does not "
                                      "exist: create it, or run `trailbound target create`")
            raise self.stop(f"target table {self.shown} does not exist")
        columns = dict(self.columns)
        ident = sql.Identifier(*self.target)
        if self.before is None:
            # The run's start: the target must already hold the version's columns. One it
            # lacks came with no version change replicat is following (a DBA dropped it, or
            # the table was made by hand): adding it back would silently undo the DBA's
            # change and leave its old rows empty, so the run stops, whatever the mode.
            missing = [c for c in self.version.columns if c.name not in columns]
            if missing:
                raise TrailboundError(f"target table {self.shown} has no column(s) "
                                      f"{', '.join(repr(c.name) for c in missing)} of source table {self.table} "
                                      f"(version {self.version.version}): replicat adds a column only when a source "
                                      f"version brings it; add it to the target, or map the table elsewhere")
            return columns
        if self.version.key != self.before.key and self.target_key != self.version.effective_key:
            raise self.stop(f"its key changes from ({', '.join(self.before.effective_key)}) to "
                            f"({', '.join(self.version.effective_key)})")
        statements_before = len(versions.pending)
        before_names = self.before.names
        before_types = {c.name: c.type for c in self.before.columns}
        for position, column in enumerate(self.version.columns):
            have = columns.get(column.name)
            if have is None:
                if column.name in before_names:  # not new in this version: see the run's start above
                    raise self.stop(f"target table {self.shown} has no column {column.name!r}, which version "
                                    f"{self.before.version} already had: replicat adds only the columns a version "
                                    "change brings")
                if column.name not in before_names and position < len(before_names) \
                        and before_names[position] not in self.version.names:
                    raise self.stop(f"column {before_names[position]!r} is renamed to {column.name!r} (or dropped "
                                    "and another added in its place)")
                if not column.nullable and column.default is None:
                    raise self.stop(f"new column {column.name!r} is NOT NULL without a default")
                self._add(ident, column, columns)
            elif have[0] != column.type and before_types.get(column.name) != column.type:
                # (a type the source did not change stands as the target spells it:
                # defs.json may name it by an alias, timestamptz for timestamp with time zone)
                if not widens(have[0], column.type):
                    raise self.stop(f"column {column.name!r} changes type from {have[0]} to {column.type} "
                                    "(narrowing or incompatible)")
                versions.pending.append(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(
                    ident, sql.Identifier(column.name), tgt.type_sql(self.table, column)))
                versions.described.append(f"{self.shown}: column {column.name} widened from {have[0]} to "
                                          f"{column.type}")
                columns[column.name] = (column.type, have[1])
        for name in before_names:
            if name in self.version.names or name not in columns:
                continue
            if policy.drop_columns == "drop":
                versions.pending.append(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(ident, sql.Identifier(name)))
                versions.described.append(f"{self.shown}: column {name} dropped (ddl.drop_columns: drop)")
                del columns[name]
            elif columns[name][1]:
                versions.pending.append(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL").format(
                    ident, sql.Identifier(name)))
                versions.described.append(f"{self.shown}: column {name} kept, its NOT NULL dropped (the source no "
                                          "longer sends it)")
                columns[name] = (columns[name][0], False)
        if policy.mode == "abend" and len(versions.pending) > statements_before:
            del versions.pending[statements_before:]
            raise self.stop("ddl mode is abend")
        return columns

    def _add(self, ident, column: Column, columns: dict) -> None:
        parts = [sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(ident, sql.Identifier(column.name),
                                                                  tgt.type_sql(self.table, column))]
        if column.default is not None:
            # the value the source's rows from before the column hold: the target's old rows get it too
            parts.append(sql.SQL("DEFAULT {}::{}").format(sql.Literal(column.default), tgt.type_sql(self.table, column)))
            if not column.nullable:
                parts.append(sql.SQL("NOT NULL"))
        self.versions.pending.append(sql.SQL(" ").join(parts))
        self.versions.described.append(f"{self.shown}: column {column.name} {column.type} added"
                                       + (f" (old rows: {column.default})" if column.default is not None else ""))
        columns[column.name] = (column.type, not column.nullable and column.default is not None)

    def _create(self) -> dict[str, tuple[str, bool]]:
        definition = TableDef(self.table, self.version.columns, self.version.key)
        self.versions.pending.extend(tgt.create_statements(definition, self.target))
        self.versions.described.append(f"{self.shown}: created from source table {self.table} version "
                                       f"{self.version.version}")
        return {c.name: (c.type, not c.nullable) for c in self.version.columns}


def _described(version: TableVersion) -> str:
    return ", ".join(f"{c.name} {c.type}" for c in version.columns) + \
        (f"; key {', '.join(version.key)}" if version.key else "")


def _primary_keys(cur, targets) -> dict[tuple[str, str], tuple[str, ...]]:
    targets = [t for t in targets if t]
    if not targets:
        return {}
    cur.execute("SELECT n.nspname, c.relname, array_agg(a.attname ORDER BY k.position)"
                " FROM unnest(%s::text[], %s::text[]) AS w(s, t)"
                " JOIN pg_namespace n ON n.nspname = w.s JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t"
                " JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary"
                " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, position)"
                " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum GROUP BY 1, 2",
                ([s for s, _ in targets], [t for _, t in targets]))
    return {(schema, table): tuple(columns) for schema, table, columns in cur.fetchall()}


# ---------------------------------------------------------------- widening

_INTEGERS = ("smallint", "integer", "bigint")
_VARCHAR = re.compile(r"^character varying(?:\((\d+)\))?$")
_NUMERIC = re.compile(r"^numeric(?:\((\d+)(?:,(\d+))?\))?$")


def widens(old: str, new: str) -> bool:
    """Whether every value of type `old` is a value of type `new`, unchanged (PostgreSQL's
    format_type names): a longer varchar (or text), a wider integer, real to double,
    more numeric digits on either side of the point."""
    if old == new:
        return True
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS.index(new) > _INTEGERS.index(old)
    if (old, new) == ("real", "double precision"):
        return True
    if (varchar := _VARCHAR.match(old)) and (new == "text" or (wider := _VARCHAR.match(new))):
        if new == "text" or wider.group(1) is None:
            return True
        return varchar.group(1) is not None and int(wider.group(1)) >= int(varchar.group(1))
    if (numeric := _NUMERIC.match(old)) and (wider := _NUMERIC.match(new)):
        if wider.group(1) is None:
            return True
        if numeric.group(1) is None:
            return False
        precision, scale = int(numeric.group(1)), int(numeric.group(2) or 0)
        precision2, scale2 = int(wider.group(1)), int(wider.group(2) or 0)
        return scale2 >= scale and precision2 - scale2 >= precision - scale
    return False


# ---------------------------------------------------------------- the fence in a chunk

def first_change(records: pa.Table, versions: Versions) -> int | None:
    """The index of the first record (of `records`, trail records with `table` and
    `table_version`) of a mapped table of a later version than the one planned; None.
    (An earlier version's record can follow only inside the transaction that changed the
    table, the source's locks see to that: it is applied under the later version, its
    image fitted to it by `older_images_fitted`.)"""
    if not len(records):
        return None
    names = records.column("table").combine_chunks().dictionary_encode()
    codes = names.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    numbers = records.column("table_version").fill_null(1).to_numpy()
    first = None
    for code, name in enumerate(names.dictionary.to_pylist()):
        if name is None or not versions.mapped(name):
            continue
        rows = np.flatnonzero(codes == code)
        wanted = versions.expected.get(name)
        other = rows if wanted is None else rows[numbers[rows] > wanted]
        if len(other) and (first is None or int(other[0]) < first):
            first = int(other[0])
    return first


def older_images_fitted(part: pa.Table, decode: Callable[[], pa.ChunkedArray],
                        versions: Versions | None) -> Callable[[], pa.ChunkedArray]:
    """`decode` (a trail part's after images), each INSERT or UPDATE of an earlier version
    than the one planned made to fit the plan's version: a column that version dropped
    left out, and (an INSERT) a column added since with a DEFAULT given that default.

    Such a record is inside the transaction that changed its table (an INSERT, then ALTER
    TABLE ... ADD COLUMN ... DEFAULT, then more): PostgreSQL gives the row already there
    the default, but its image, written before the column existed, does not name it, and
    the plan's COPY line would write NULL; a dropped column it names is not the plan's.
    Its copy_line was dropped by capture (an older version's layout), so it always takes
    the image's way through here. Images are rewritten as JSON: only these few records."""
    if versions is None or not len(part) or "table_version" not in part.column_names:
        return decode
    older = []
    numbers = part.column("table_version").fill_null(1)
    changes = pc.is_in(part.column("op"), value_set=pa.array(["INSERT", "UPDATE"]))
    for name, planned in versions.expected.items():
        if planned == 1 or not versions.mapped(name):
            continue
        mask = pc.and_(pc.and_(changes, pc.equal(part.column("table"), name)), pc.less(numbers, planned))
        mask = mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask
        for index in np.flatnonzero(mask.to_numpy(zero_copy_only=False)):
            index = int(index)
            number, insert = int(numbers[index].as_py()), part.column("op")[index].as_py() == "INSERT"
            older.append((index, *_fitting(versions.defs[name], number, planned, insert)))
    older = [(index, fill, keep) for index, fill, keep in older if fill or keep is not None]
    if not older:
        return decode

    def fitted() -> pa.ChunkedArray:
        images = decode().to_pylist()
        for index, fill, keep in older:
            if images[index] is None:
                continue
            image = json.loads(images[index])
            if keep is not None:
                image = {column: value for column, value in image.items() if column in keep}
            for column, value in fill.items():
                image.setdefault(column, value)
            images[index] = json.dumps(image, ensure_ascii=False, separators=(",", ":"))
        return pa.chunked_array([pa.array(images, pa.string())])
    return fitted


def _fitting(table: TableDef, number: int, planned: int, insert: bool) -> tuple[dict[str, str], set[str] | None]:
    """For a record of version `number` applied under version `planned`: the columns to
    add with their DEFAULT (an INSERT's), and the columns to keep (None: all of them)."""
    have, plan = table.version(number), table.version(planned)
    fill = {c.name: c.default for c in plan.columns
            if insert and c.name not in have.names and c.default is not None}
    dropped = set(have.names) - set(plan.names)
    return fill, (set(plan.names) if dropped else None)


def changed_at(records: pa.Table, start: int, stop: int, versions: Versions) -> dict[str, int]:
    """The versions the fence's transaction (records start..stop) moves its tables to:
    the last of each table's in it."""
    part = records.slice(start, stop - start)
    changed: dict[str, int] = {}
    for name, number in zip(part.column("table").to_pylist(), part.column("table_version").to_pylist()):
        number = number or 1
        if name is not None and versions.mapped(name) and number > versions.expected.get(name, 0):
            changed[name] = max(changed.get(name, 0), number)
    return changed


def prefix(tables: list[pa.Table], files: list, count: int) -> tuple[list, list[pa.Table]]:
    """The first `count` records of a chunk's (files, tables)."""
    kept_files, kept = [], []
    for file, table in zip(files, tables):
        if count <= 0:
            break
        kept_files.append(file)
        kept.append(table.slice(0, min(count, len(table))))
        count -= len(table)
    return kept_files, kept

