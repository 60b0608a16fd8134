"""Discarded operations (REPERROR ... DISCARD, TRANSDISCARD): the discard table in the target,
each run's discard file, and `trailbound discards GROUP [--reapply]`.

The discard table lives beside the checkpoint table (same schema, `discards`), created
with it. A discarded operation's row is written in the same target transaction as the
checkpoint row that moves past it, so exactly-once holds for discards as for data: a
crash before the commit loses neither (the next run meets the record again), a crash
after it duplicates neither (the next run skips the transaction).

The discard file (GoldenGate's DISCARDFILE) is a readable view of the table, one per run,
`<discarddir>/<group>_<run start>.dsc`, written after the commit. A row notes the file it
went to (`in_file`); a run first writes the rows an earlier run committed but did not get
to write (it was killed in between), so every discard reaches a file. A row written to a
file whose note then failed to commit is written again by the next run: a file can repeat
a row, the table never does.

`--reapply` applies the discarded operations again after the target has been fixed, each
in its own transaction that also deletes its row, in the order they were discarded; what
the target still refuses stays, and is reported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from psycopg2 import sql

from trailbound.ggsci import timestamp, utc
from trailbound.positions import Csn
from trailbound.replicat.checkpoint_table import CheckpointTableName
from trailbound.tables import python_regex

TABLE = "discards"

_DDL = sql.SQL("""
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {table} (
    discard_id      bigserial     PRIMARY KEY,
    group_name      varchar(8)    NOT NULL,
    trail_file      text          NOT NULL,
    seqno           bigint        NOT NULL,
    rba             bigint        NOT NULL,
    csn             varchar(129)  NOT NULL,
    xid             varchar(129)  NOT NULL,
    commit_ts       timestamptz,
    source_table    text          NOT NULL,
    target_table    text,
    op              text          NOT NULL,
    before_image    text,
    after_image     text,
    action          text          NOT NULL,
    sqlstate        varchar(5),
    message         text          NOT NULL,
    discarded_at    timestamptz   NOT NULL DEFAULT now(),
    in_file         text
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (group_name, target_table);
""")

_COLUMNS = ("discard_id", "group_name", "trail_file", "seqno", "rba", "csn", "xid", "commit_ts", "source_table",
            "target_table", "op", "before_image", "after_image", "action", "sqlstate", "message", "discarded_at",
            "in_file")


def table_of(checkpoint_table: CheckpointTableName) -> sql.Identifier:
    return sql.Identifier(checkpoint_table.schema, TABLE)


def name_of(checkpoint_table: CheckpointTableName) -> str:
    return f"{checkpoint_table.schema}.{TABLE}"


def create(cur, checkpoint_table: CheckpointTableName) -> None:
    """Create the discard table if missing (no DDL at all when it exists: a replicat's role
    may lack the right to create in the database)."""
    if exists(cur, checkpoint_table):
        return
    cur.execute(_DDL.format(schema=sql.Identifier(checkpoint_table.schema), table=table_of(checkpoint_table),
                            index=sql.Identifier(f"{TABLE}_group_target")))


def exists(cur, checkpoint_table: CheckpointTableName) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table_of(checkpoint_table).as_string(cur),))
    return cur.fetchone()[0]


@dataclass(frozen=True)
class Discard:
    """One discarded operation, as the discard table holds it."""

    discard_id: int
    group_name: str
    trail_file: str
    seqno: int
    rba: int
    csn: str
    xid: str
    commit_ts: datetime | None
    source_table: str
    target_table: str | None
    op: str
    before_image: str | None
    after_image: str | None
    action: str
    sqlstate: str | None
    message: str
    discarded_at: datetime
    in_file: str | None

    @property
    def record(self) -> dict:
        """The trail record it was (what the replayer applies)."""
        return {"table": self.source_table, "op": self.op, "before": self.before_image, "after": self.after_image,
                "seqno": self.seqno, "rba": self.rba, "xid": self.xid}

    def shown(self) -> str:
        """Its entry in a discard file and in `trailbound discards`."""
        def image(text: str | None) -> str:
            return json.dumps(json.loads(text), ensure_ascii=False) if text else "-"
        target = f" (target {self.target_table})" if self.target_table and self.target_table != self.source_table else ""
        return "\n".join([
            f"Discard {self.discard_id} ({self.action}) at {utc(self.discarded_at)}, replicat {self.group_name}",
            f"  SQLSTATE {self.sqlstate or '-'}: {self.message}",
            f"  Operation: {self.op} on {self.source_table}{target}",
            f"  Trail file {self.trail_file} seqno {self.seqno} rba {self.rba}",
            f"  CSN {self.csn}, xid {self.xid!r}, committed at the source {timestamp(self.commit_ts)}",
            f"  Before image: {image(self.before_image)}",
            f"  After image:  {image(self.after_image)}",
        ])


def insert_statement(cur, checkpoint_table: CheckpointTableName, group: str, rows: list[dict]) -> bytes:
    """The INSERT of discarded records, values bound, to run in the target transaction that
    writes the checkpoint row moving past them. `rows`: the trail record (as the replayer
    got it) with `trail_file`, `target_table`, `action`, `sqlstate`, `message`."""
    values = b", ".join(cur.mogrify("(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", (
        group, row["trail_file"], row["seqno"], row["rba"], str(Csn.from_row(row)), row["xid"][:129], row["commit_ts"],
        row["table"], row["target_table"], row["op"], row["before"], row["after"], row["action"], row["sqlstate"],
        row["message"])) for row in rows)
    return cur.mogrify(sql.SQL(
        "INSERT INTO {} (group_name, trail_file, seqno, rba, csn, xid, commit_ts, source_table, target_table, op,"
        " before_image, after_image, action, sqlstate, message) VALUES ").format(table_of(checkpoint_table))) + values


def select(cur, checkpoint_table: CheckpointTableName, group: str, *, since: datetime | None = None,
           table: str | None = None, unfiled: bool = False) -> list[Discard]:
    """The group's discards in the order they were discarded: since a time, of the source
    or target tables a pattern matches (`shop.*`), or only those no file shows yet."""
    if not exists(cur, checkpoint_table):
        return []
    cur.execute(sql.SQL("SELECT {} FROM {} WHERE group_name = %s AND (%s::timestamptz IS NULL OR discarded_at >= %s)"
                        " AND (NOT %s OR in_file IS NULL) ORDER BY discard_id").format(
        sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)), table_of(checkpoint_table)),
        (group, since, since, unfiled))
    found = [Discard(*row) for row in cur.fetchall()]
    if table is not None:
        pattern = python_regex([table])
        found = [d for d in found if pattern.fullmatch(d.source_table) or pattern.fullmatch(d.target_table or "")]
    return found


def outstanding(cur, checkpoint_table: CheckpointTableName, group: str | None = None) -> dict[str, int]:
    """Discarded operations not reapplied, per target table (every group's, or one's)."""
    if not exists(cur, checkpoint_table):
        return {}
    cur.execute(sql.SQL("SELECT coalesce(target_table, source_table), count(*) FROM {} WHERE %s::text IS NULL"
                        " OR group_name = %s GROUP BY 1 ORDER BY 1").format(table_of(checkpoint_table)),
                (group, group))
    return dict(cur.fetchall())


def delete_statement(checkpoint_table: CheckpointTableName) -> sql.Composed:
    return sql.SQL("DELETE FROM {} WHERE discard_id = %s").format(table_of(checkpoint_table))


# ---------------------------------------------------------------- the discard file

def file_path(directory: Path, group: str, run_started: datetime) -> Path:
    """The run's discard file (a group name is letters, digits and _: safe in a path)."""
    return directory / f"{group}_{run_started.astimezone(timezone.utc):%Y%m%dT%H%M%S}Z.dsc"


def write_file(connection, checkpoint_table: CheckpointTableName, group: str, path: Path,
               run_started: datetime) -> int:
    """Append the group's committed discards no file shows yet to the run's file, then note
    the file on their rows (committed). Returns how many were written."""
    with connection.cursor() as cur:
        rows = select(cur, checkpoint_table, group, unfiled=True)
    connection.rollback()
    if not rows:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with open(path, "a", encoding="utf-8") as out:
        if new:
            out.write(f"trailbound replicat {group} discard file, run started {utc(run_started)}\n"
                      f"(the discard table {name_of(checkpoint_table)} in the target is the record; "
                      f"`trailbound discards {group}` lists it)\n\n")
        for row in rows:
            out.write(row.shown() + "\n\n")
        out.flush()
        os.fsync(out.fileno())
    with connection.cursor() as cur:
        cur.execute(sql.SQL("UPDATE {} SET in_file = %s WHERE discard_id = ANY(%s)").format(table_of(checkpoint_table)),
                    (str(path), [row.discard_id for row in rows]))
    connection.commit()
    return len(rows)


def listing(config, group: str, *, target_dsn: str | None = None, since: datetime | None = None,
            table: str | None = None) -> tuple[str, list[Discard]]:
    """`trailbound discards GROUP`: (the discard table's name, the group's discards)."""
    from trailbound.replicat import target as tgt  # the CLI's listing only

    name = config.replicat_name(group)
    checkpoint_table = CheckpointTableName.parse(config.replicat(name).checkpointtable)
    connection = tgt.connect(config, target_dsn)
    try:
        with connection.cursor() as cur:
            return name_of(checkpoint_table), select(cur, checkpoint_table, name, since=since, table=table)
    finally:
        connection.close()
