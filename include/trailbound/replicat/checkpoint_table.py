"""The checkpoint table in the target database (ADD CHECKPOINTTABLE), GoldenGate's columns.

One row per replicat group (group_key 0: a group applies on one thread; a parallel apply
would use one key per thread). The row is written in the same target transaction as the
data it covers, so it always says exactly which transactions the target holds:

    seqno, rba       the trail position reached (the next record to read)
    log_csn          every transaction with a CSN at or below it is applied (full CSN text,
                     scn@thread:sequence:rba; log_cmplt_csn equals it: one thread)
    log_cmplt_xids   the transactions applied at that commit SCN (a JSON array of xids;
                     text beyond 2000 characters continues in <name>_lox rows)
    log_xid          the last transaction applied
    audit_ts         its commit time at the source
    log_bsn          the recovery SCN of the capture run that wrote it: capture sent back
                     there re-creates every transaction after log_csn (lost trails)

Identifiers are always composed with psycopg2.sql.Identifier.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from psycopg2 import sql

from trailbound.errors import TrailboundError
from trailbound.positions import Csn, Scn, TrailPosition

GROUP_KEY = 0
VERSION = 1
XIDS_WIDTH = 2000


@dataclass(frozen=True)
class CheckpointTableName:
    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> "CheckpointTableName":
        """[SCHEMA.]NAME; the schema ends at the first dot and defaults to public."""
        schema, dot, name = text.strip().partition(".")
        if not dot:
            schema, name = "public", schema
        if not schema or not name:
            raise TrailboundError(f"{text!r} is not a checkpoint table name ([schema.]name)")
        return cls(schema, name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def table(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    @property
    def lox(self) -> sql.Identifier:
        return sql.Identifier(self.schema, f"{self.name}_lox")


@dataclass(frozen=True)
class CheckpointRow:
    group_name: str
    group_key: int
    seqno: int
    rba: int
    audit_ts: datetime | None
    create_ts: datetime
    last_update_ts: datetime
    current_dir: str
    log_bsn: Scn | None
    log_csn: Csn | None
    log_xid: str | None
    log_cmplt_csn: Csn | None
    log_cmplt_xids: list[str]
    version: int | None

    @property
    def position(self) -> TrailPosition:
        return TrailPosition(self.seqno, self.rba)


_DDL = sql.SQL("""
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {table} (
    group_name      varchar(8)    NOT NULL,
    group_key       bigint        NOT NULL,
    seqno           bigint,
    rba             bigint        NOT NULL,
    audit_ts        timestamptz,
    create_ts       timestamptz   NOT NULL DEFAULT now(),
    last_update_ts  timestamptz   NOT NULL DEFAULT now(),
    current_dir     text          NOT NULL,
    log_bsn         varchar(129),
    log_csn         varchar(129),
    log_xid         varchar(129),
    log_cmplt_csn   varchar(129),
    log_cmplt_xids  varchar(2000),
    version         integer,
    PRIMARY KEY (group_name, group_key)
);
CREATE TABLE IF NOT EXISTS {lox} (
    group_name          varchar(8)    NOT NULL,
    group_key           bigint        NOT NULL,
    log_cmplt_csn       varchar(129)  NOT NULL,
    log_cmplt_xids_seq  integer       NOT NULL,
    log_cmplt_xids      varchar(2000) NOT NULL,
    PRIMARY KEY (group_name, group_key, log_cmplt_csn, log_cmplt_xids_seq)
);
""")


def exists(cur, name: CheckpointTableName) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                (sql.Identifier(name.schema, name.name).as_string(cur),
                 sql.Identifier(name.schema, f"{name.name}_lox").as_string(cur)))
    return cur.fetchone()[0]


def create(cur, name: CheckpointTableName) -> bool:
    """Create the checkpoint table and its _lox table if missing; True if created now."""
    if exists(cur, name):
        return False
    cur.execute(_DDL.format(schema=sql.Identifier(name.schema), table=name.table, lox=name.lox))
    return True


def read(cur, name: CheckpointTableName, group: str) -> CheckpointRow | None:
    """The group's row, or None (no row yet, or no checkpoint table at all)."""
    if not exists(cur, name):
        return None
    cur.execute(sql.SQL("SELECT group_name, group_key, seqno, rba, audit_ts, create_ts, last_update_ts, current_dir,"
                        " log_bsn, log_csn, log_xid, log_cmplt_csn, log_cmplt_xids, version FROM {}"
                        " WHERE group_name = %s AND group_key = %s").format(name.table), (group, GROUP_KEY))
    row = cur.fetchone()
    if row is None:
        return None
    xids_text = row[12] or ""
    cur.execute(sql.SQL("SELECT log_cmplt_xids FROM {} WHERE group_name = %s AND group_key = %s"
                        " AND log_cmplt_csn = %s ORDER BY log_cmplt_xids_seq").format(name.lox),
                (group, GROUP_KEY, row[11] or ""))
    xids_text += "".join(part for (part,) in cur.fetchall())
    try:
        xids = json.loads(xids_text) if xids_text else []
    except ValueError:
        xids = [xids_text]  # written by something else: show it as it is
    parse = lambda text: Csn.parse(text) if text else None  # noqa: E731
    return CheckpointRow(row[0], row[1], row[2] or 0, row[3], row[4], row[5], row[6], row[7],
                         Scn(int(row[8])) if row[8] else None, parse(row[9]), row[10], parse(row[11]), xids, row[13])


@dataclass
class Overflow:
    """Whether the group's _lox table may hold rows. A run that looked at its start
    (`overflow_exists`) writes its checkpoint rows without the DELETE of the _lox rows
    while there can be none (the usual case: a row's xids fit it). Once some may exist it
    stays so for the run: a write that added them may still roll back."""

    may_exist: bool = True


def overflow_exists(cur, name: CheckpointTableName, group: str) -> Overflow:
    cur.execute(sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE group_name = %s AND group_key = %s)").format(name.lox),
                (group, GROUP_KEY))
    return Overflow(cur.fetchone()[0])


def row_statements(cur, name: CheckpointTableName, group: str, *, position: TrailPosition, log_csn: Csn | None,
                   log_bsn: Scn | None, audit_ts: datetime | None, log_xid: str | None, cmplt_xids: list[str],
                   current_dir: str, commit: bool = False, overflow: Overflow | None = None) -> bytes:
    """The statements that upsert the group's row and its _lox overflow, values bound, as
    one text (in `cur`'s session's encoding) to run inside the caller's transaction, in
    one round trip; with `commit`, a COMMIT after them. Without `overflow`, the _lox rows
    may exist and are deleted first."""
    csn = str(log_csn) if log_csn else None
    xids = json.dumps(cmplt_xids, ensure_ascii=False) if cmplt_xids else None
    head, rest = (xids[:XIDS_WIDTH], xids[XIDS_WIDTH:]) if xids else (None, "")
    if overflow is not None and rest:
        overflow.may_exist = True  # before the rows are written
    params = {"group": group, "key": GROUP_KEY, "seqno": position.seqno, "rba": position.rba, "audit_ts": audit_ts,
              "dir": current_dir, "bsn": str(log_bsn) if log_bsn is not None else None, "csn": csn,
              "xid": log_xid[:129] if log_xid else None, "xids": head, "version": VERSION}
    statements = [cur.mogrify(sql.SQL(
        "INSERT INTO {table} AS c (group_name, group_key, seqno, rba, audit_ts, current_dir, log_bsn, log_csn,"
        " log_xid, log_cmplt_csn, log_cmplt_xids, version) VALUES (%(group)s, %(key)s, %(seqno)s, %(rba)s,"
        " %(audit_ts)s, %(dir)s, %(bsn)s, %(csn)s, %(xid)s, %(csn)s, %(xids)s, %(version)s)"
        " ON CONFLICT (group_name, group_key) DO UPDATE SET seqno = EXCLUDED.seqno, rba = EXCLUDED.rba,"
        " audit_ts = EXCLUDED.audit_ts, last_update_ts = now(), current_dir = EXCLUDED.current_dir,"
        " log_bsn = EXCLUDED.log_bsn, log_csn = EXCLUDED.log_csn, log_xid = EXCLUDED.log_xid,"
        " log_cmplt_csn = EXCLUDED.log_cmplt_csn, log_cmplt_xids = EXCLUDED.log_cmplt_xids,"
        " version = EXCLUDED.version").format(table=name.table), params)]
    if overflow is None or overflow.may_exist:
        statements.append(cur.mogrify(sql.SQL("DELETE FROM {} WHERE group_name = %(group)s AND group_key = %(key)s")
                                      .format(name.lox), params))
    if rest:
        parts = [rest[i:i + XIDS_WIDTH] for i in range(0, len(rest), XIDS_WIDTH)]
        insert = sql.SQL("INSERT INTO {} (group_name, group_key, log_cmplt_csn, log_cmplt_xids_seq, log_cmplt_xids)"
                         " VALUES ").format(name.lox)
        statements.append(cur.mogrify(insert) + b", ".join(
            cur.mogrify("(%s, %s, %s, %s, %s)", (group, GROUP_KEY, csn or "", seq, part))
            for seq, part in enumerate(parts, start=1)))
    if commit:
        statements.append(b"COMMIT")
    return b"; ".join(statements)


def set_position(cur, name: CheckpointTableName, group: str, position: TrailPosition, *,
                 log_csn: Csn | None, current_dir: str, keep_log_csn: bool = False) -> None:
    """Move the position and set log_csn: ALTER REPLICAT. With `keep_log_csn` (a run
    that read past transactions it had already applied) an existing row keeps its
    log_csn and only a row created here gets `log_csn`. Keeps the rest of the row."""
    params = {"group": group, "key": GROUP_KEY, "seqno": position.seqno, "rba": position.rba, "dir": current_dir,
              "csn": str(log_csn) if log_csn else None, "version": VERSION}
    set_csn = sql.SQL("") if keep_log_csn else sql.SQL(
        ", log_csn = EXCLUDED.log_csn, log_cmplt_csn = EXCLUDED.log_cmplt_csn, log_cmplt_xids = NULL")
    cur.execute(sql.SQL(
        "INSERT INTO {table} (group_name, group_key, seqno, rba, current_dir, log_csn, log_cmplt_csn, version)"
        " VALUES (%(group)s, %(key)s, %(seqno)s, %(rba)s, %(dir)s, %(csn)s, %(csn)s, %(version)s)"
        " ON CONFLICT (group_name, group_key) DO UPDATE SET seqno = EXCLUDED.seqno, rba = EXCLUDED.rba,"
        " last_update_ts = now(){set_csn}").format(table=name.table, set_csn=set_csn), params)
    if not keep_log_csn:
        cur.execute(sql.SQL("DELETE FROM {} WHERE group_name = %s AND group_key = %s").format(name.lox),
                    (group, GROUP_KEY))
