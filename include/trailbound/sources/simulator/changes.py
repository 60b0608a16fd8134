"""The simulated source's schema changes: what each one is, when it happens, and what it
does to the model (the table's columns, its committed rows, the rows of the transaction
that makes it).

A change is one transaction, as it would be on PostgreSQL: it waits until no open
transaction has used the table (ALTER TABLE's lock; the simulator lets newcomers go
first instead of queueing them behind it), then writes a row under the old definition,
changes the table, writes a row under the new one, and commits; a CREATE TABLE writes its
first rows. So every ALTER also puts two versions of one table inside one source
transaction, the older row holding what PostgreSQL gives it: the new column's DEFAULT.

Each change is recorded as a new table version in defs.json, exactly as the PostgreSQL
miner records one (sources/postgres/miner.py, docs/redo-archive.md "Table versions"): from
the scn after the last one handed out, so above every record written under the old
definition and at or below the first under the new; defs.json is rewritten at once,
before any segment holding a record of the new version has its manifest.

Opt-in (`simulate(schema_changes=...)`, `trailbound simulate --schema-changes`): without
changes an archive is byte for byte what it always was.
"""

from __future__ import annotations

from dataclasses import dataclass

from trailbound.sources.simulator.tables import CUSTOMERS, REVIEWS, TIMESHEETS

KINDS = ("add_column", "drop_column", "widen", "create_table")


@dataclass(frozen=True)
class SchemaChange:
    """One DDL statement, `at` a fraction of the duration."""

    at: float
    kind: str
    table: str
    column: str | None = None
    type: str | None = None        # add_column, widen: the column's (new) type
    default: str | None = None     # add_column: DEFAULT, the value existing rows get (a text column's)
    values: tuple = ()             # add_column: what later rows put in it

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"schema change kind must be one of {KINDS}, not {self.kind!r}")
        if not 0 < self.at < 1:
            raise ValueError(f"schema change at {self.at}: a fraction of the duration, strictly between 0 and 1")

    def describe(self) -> str:
        if self.kind == "add_column":
            default = f" DEFAULT '{self.default}'" if self.default is not None else ""
            return f"ALTER TABLE {self.table} ADD COLUMN {self.column} {self.type}{default}"
        if self.kind == "drop_column":
            return f"ALTER TABLE {self.table} DROP COLUMN {self.column}"
        if self.kind == "widen":
            return f"ALTER TABLE {self.table} ALTER COLUMN {self.column} TYPE {self.type}"
        return f"CREATE TABLE {self.table}"


LOYALTY = SchemaChange(0.40, "add_column", CUSTOMERS, "loyalty_tier", "text", default="standard",
                       values=("standard", "silver", "gold", None))
CREATE_REVIEWS = SchemaChange(0.55, "create_table", REVIEWS)
WIDEN_TIMESHEETS = SchemaChange(0.30, "widen", TIMESHEETS, "emp_id", "bigint")
DROP_NOTES = SchemaChange(0.65, "drop_column", CUSTOMERS, "notes")

# The sets `trailbound simulate --schema-changes` offers: the demo's one ADD COLUMN and
# one CREATE TABLE; every kind (a table with three versions among them).
PRESETS: dict[str, tuple[SchemaChange, ...]] = {
    "none": (),
    "demo": (LOYALTY, CREATE_REVIEWS),
    "all": (WIDEN_TIMESHEETS, LOYALTY, CREATE_REVIEWS, DROP_NOTES),
}
