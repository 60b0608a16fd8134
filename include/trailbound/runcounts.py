"""Per table operation counts of a run (what STATS EXTRACT|PUMP|REPLICAT reports), counted
from Arrow tables a stage already holds and written beside its checkpoint.

Each stage counts where it has the records anyway, never in a second pass over them:
capture in the Spark tasks that write the trail files (per file, as the batches pass),
pump from the copy it reads back to verify, replicat from each chunk's records (one
Arrow group-by per chunk, per group of target transaction) and, for a group replayed
transaction by transaction, from the records it applies. `record` adds them to
trailbound.run_table_counts inside the caller's metadata transaction, the one that
commits the checkpoint covering them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
from psycopg2 import sql
from psycopg2.extras import execute_values

COLUMNS = ("inserts", "updates", "deletes", "truncates", "discards", "collisions")
# The trail's operations (archive/contract.py's DML_OPS) and the column each is counted in.
OP_COLUMNS = {"INSERT": "inserts", "UPDATE": "updates", "DELETE": "deletes", "TRUNCATE": "truncates"}
STAGES = ("extract", "pump", "replicat")


@dataclass
class TableCounts:
    """Counts per table (the trail's source table name): column name -> number."""

    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)   # replicat: source table -> MAP target

    def add(self, table: str, column: str, n: int = 1) -> None:
        row = self.tables.setdefault(table, dict.fromkeys(COLUMNS, 0))
        row[column] += n

    def add_op(self, table: str, op: str, n: int = 1) -> None:
        column = OP_COLUMNS.get(op)
        if column is not None:
            self.add(table, column, n)

    def add_rows(self, rows) -> None:
        """(table, op, n) triples, as `count_ops` gives them."""
        for table, op, n in rows:
            self.add_op(table, op, n)

    def merge(self, other: "TableCounts") -> None:
        for table, row in other.tables.items():
            for column, n in row.items():
                if n:
                    self.add(table, column, n)
        self.targets.update(other.targets)

    def total(self, column: str) -> int:
        return sum(row[column] for row in self.tables.values())

    def __bool__(self) -> bool:
        return bool(self.tables)


def count_ops(records: pa.Table | pa.RecordBatch, *, keys: tuple[str, ...] = ()) -> list[tuple]:
    """(*keys, table, op, n) per distinct value of `keys`, `table` and `op` in `records`
    (an Arrow table or batch): one Arrow group-by, in C++ (faster here than integer
    codes counted with numpy: tests/bench/bench_run_counts.py)."""
    names = [*keys, "table", "op"]
    if not len(records):
        return []
    table = records.select(names) if isinstance(records, pa.Table) else pa.Table.from_batches([records]).select(names)
    grouped = table.group_by(names).aggregate([([], "count_all")])
    columns = [grouped.column(name).to_pylist() for name in names] + [grouped.column("count_all").to_pylist()]
    return list(zip(*columns))


def record(cur, stage: str, group: str, run_id: int, run_started_at: datetime, counts: TableCounts) -> None:
    """Add `counts` to the run's rows (a pump adds once per file it commits). Inside the
    transaction that commits the checkpoint covering them."""
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r} is not one of {STAGES}")
    if not counts:
        return
    rows = [(stage, group.upper(), run_id, table, counts.targets.get(table), run_started_at,
             *(row[c] for c in COLUMNS)) for table, row in sorted(counts.tables.items())]
    columns = [sql.Identifier(c) for c in COLUMNS]
    added = sql.SQL(", ").join(sql.SQL("{0} = run_table_counts.{0} + EXCLUDED.{0}").format(c) for c in columns)
    statement = sql.SQL("INSERT INTO trailbound.run_table_counts (stage, group_name, run_id, table_name, target_table,"
                        " run_started_at, {}) VALUES %s ON CONFLICT (stage, group_name, run_id, table_name) DO UPDATE"
                        " SET recorded_at = now(), target_table = coalesce(EXCLUDED.target_table,"
                        " run_table_counts.target_table), {}").format(sql.SQL(", ").join(columns), added)
    execute_values(cur, statement.as_string(cur), rows)


def column_sums() -> sql.Composed:
    """`sum(inserts)::bigint AS inserts, ...` for every count column."""
    return sql.SQL(", ").join(sql.SQL("sum({0})::bigint AS {0}").format(sql.Identifier(c)) for c in COLUMNS)


def last_run_id(cur, table: str) -> int:
    """The run_id the caller's transaction just inserted into `table` (extract_run or
    replicat_run, whose INSERT returns nothing)."""
    if table not in ("extract_run", "replicat_run"):
        raise ValueError(table)
    qualified = sql.Identifier("trailbound", table).as_string(cur)
    cur.execute("SELECT currval(pg_get_serial_sequence(%s, 'run_id')) AS run_id", (qualified,))
    return cur.fetchone()["run_id"]
