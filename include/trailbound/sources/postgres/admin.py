"""Setting a PostgreSQL source up and looking at it: `add source` (publication, slot,
defs.json, the slot's consistent point), `delete source` (drops the slot, which would
otherwise hold the source's WAL forever) and `info source`.

`add source` checks everything before it creates anything: a refusal writes nothing,
on the server or in the archive.
"""

from __future__ import annotations

import json
import re
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC

import psycopg2
from psycopg2 import sql

from trailbound import heartbeat
from trailbound.archive import segments as archive_segments
from trailbound.archive.contract import DEFS_FILE
from trailbound.archive.segments import Column, TableDef
from trailbound.archive.writer import write_defs
from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.ggsci import utc
from trailbound.positions import Scn
from trailbound.metadata import connection_error, dsn_from_env
from trailbound.sources.postgres import continuity
from trailbound.sources.postgres import heartbeat as heartbeat_table
from trailbound.sources.postgres import state as miner_state
from trailbound.sources.postgres.lsn import Lsn
from trailbound.sources.postgres.reader import ROWS_PREFIX, session_options

_TABLES = """
SELECT c.oid, n.nspname, c.relname, c.relreplident,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) AS has_primary_key
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
 ORDER BY n.nspname, c.relname
"""
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       CASE WHEN a.atthasmissing THEN array_to_string(a.attmissingval, '') END
  FROM pg_attribute a
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY a.attnum
"""
_PRIMARY_KEY = """
SELECT a.attname
  FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, position)
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
 WHERE i.indrelid = %s AND i.indisprimary
 ORDER BY k.position
"""


@dataclass(frozen=True)
class SourceTable:
    oid: int
    schema: str
    name: str
    replica_identity: str
    has_primary_key: bool

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


def connect(config: Config, source: str, dsn: str | None = None):
    pg = config.postgres(source)
    dsn = dsn or dsn_from_env(pg.dsn_env)
    try:
        connection = psycopg2.connect(dsn, options=session_options())
    except psycopg2.Error as exc:
        raise connection_error(f"source {source}", dsn, exc) from None
    connection.autocommit = True
    return connection


def _query(connection, text, args=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(text, args)
        return cur.fetchall()


def _matches(pattern: str, name: str) -> bool:
    # * and ? as wildcards, everything else literal (a [ in a name is not a character class)
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, re.DOTALL) is not None


def _in_scope(patterns: list[str], name: str) -> bool:
    """Whether the source publishes table `name`: the `table:` patterns match it, or it
    is a heartbeat table (always published, like GoldenGate's heartbeat table)."""
    return heartbeat.is_heartbeat(name) or any(_matches(p, name) for p in patterns)


def published_tables(connection, patterns: list[str]) -> list[SourceTable]:
    """The source's tables that the `table:` patterns name, checked: each needs a primary
    key or REPLICA IDENTITY FULL (an index identity will do too), else its updates and
    deletes could not be told apart."""
    tables = [SourceTable(*row) for row in _query(connection, _TABLES)]
    chosen = [t for t in tables if _in_scope(patterns, t.qualified)]
    if not any(not heartbeat.is_heartbeat(t.qualified) for t in chosen):
        raise TrailboundError(f"no table of the source matches table: {', '.join(patterns)}")
    for table in chosen:
        if table.replica_identity == "n" or (table.replica_identity == "d" and not table.has_primary_key):
            raise TrailboundError(
                f"table {table.qualified} has neither a primary key nor REPLICA IDENTITY FULL: its updates and deletes "
                f"could not name their row. Add a primary key, or `ALTER TABLE {table.qualified} REPLICA IDENTITY "
                "FULL`, or leave it out of table:")
    return chosen


def table_definitions(connection, tables: list[SourceTable]) -> list[dict]:
    """defs.json's tables: PostgreSQL type names, NOT NULL, the value rows older than a
    column hold in it (attmissingval: an ADD COLUMN ... DEFAULT), the primary key (none:
    the row is its key, as REPLICA IDENTITY FULL says)."""
    defs = []
    for table in tables:
        columns = [{"name": name, "type": kind, "nullable": not not_null, **({"default": missing} if missing else {})}
                   for name, kind, not_null, missing in _query(connection, _COLUMNS, (table.oid,))]
        key = [name for (name,) in _query(connection, _PRIMARY_KEY, (table.oid,))]
        defs.append({"name": table.qualified, "columns": columns, "key": key})
    return defs


def check_wal_level(connection, source: str) -> None:
    (level,), = _query(connection, "SHOW wal_level")
    if level != "logical":
        raise TrailboundError(f"source {source}: the server runs with wal_level = {level}; logical decoding needs "
                              "wal_level = logical (set it in postgresql.conf and restart the server)")


def _publication_sql(verb: str, publication: str, tables: list[SourceTable]) -> sql.Composed:
    names = sql.SQL(", ").join(sql.Identifier(t.schema, t.name) for t in tables)
    return sql.SQL(verb + " PUBLICATION {} " + ("FOR" if verb == "CREATE" else "SET") + " TABLE {}").format(
        sql.Identifier(publication), names)


def add_source(config: Config, name: str, *, refresh_defs: bool = False) -> str:
    source = config.source_name(name)
    pg = config.postgres(source)
    archive = config.archive_dir(source)
    connection = connect(config, source)
    try:
        check_wal_level(connection, source)
        tables = published_tables(connection, pg.table)
        defs = table_definitions(connection, tables)
        slot_exists = bool(_query(connection, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (pg.slot,)))
        publication_exists = bool(_query(connection, "SELECT 1 FROM pg_publication WHERE pubname = %s",
                                         (pg.publication,)))
        if refresh_defs:
            if not slot_exists or not publication_exists:
                raise TrailboundError(f"source {source}: slot {pg.slot} or publication {pg.publication} is missing; "
                                      f"`trailbound add source {source}` (without --refresh-defs) creates them")
            _query_none(connection, _publication_sql("ALTER", pg.publication, tables))
            kept = archive_segments.load_defs(archive) if (archive / DEFS_FILE).exists() else {}
            merged, changed = refreshed_defs(kept, defs, miner_state.load(archive).next_scn.value)
            write_defs(archive, [table.as_json() for table in merged.values()])
            return (f"SOURCE {source}: defs.json refreshed from the catalog ({len(defs)} table(s); "
                    + (f"new version(s): {', '.join(changed)}" if changed else "no table changed")
                    + f"; every table's earlier versions kept); publication {pg.publication} holds them")
        if slot_exists:
            raise TrailboundError(f"source {source}: replication slot {pg.slot} already exists on the server "
                                  f"(`trailbound delete source {source}` drops it)")
        if publication_exists:
            raise TrailboundError(f"source {source}: publication {pg.publication} already exists on the server; "
                                  "drop it or name another")
        if (archive / DEFS_FILE).exists() or miner_state.state_dir(archive).exists() or (
                archive.is_dir() and archive_segments.discover(archive)):
            raise TrailboundError(f"source {source}: {archive} already holds an archive; a new slot starts a new "
                                  "archive in an empty directory")
        _query_none(connection, _publication_sql("CREATE", pg.publication, tables))
        try:
            (lsn, now), = _query(connection, "SELECT lsn::text, now() FROM pg_create_logical_replication_slot(%s, "
                                             "'pgoutput')", (pg.slot,))
        except psycopg2.Error:
            _query_none(connection, sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(pg.publication)))
            raise
        consistent = Lsn.parse(lsn)
        write_defs(archive, defs)
        miner_state.save(archive, miner_state.MinerState(0, consistent, now.astimezone(UTC), pg.slot))
        return (f"SOURCE {source} added: publication {pg.publication} ({len(tables)} table(s)), slot {pg.slot} "
                f"(pgoutput) consistent at {consistent} (scn {consistent.scn}); defs.json written to {archive}")
    finally:
        connection.close()


def refreshed_defs(kept: dict[str, TableDef], catalog: list[dict], scn: int) -> tuple[dict[str, TableDef], list[str]]:
    """defs.json after `add source --refresh-defs`: every table's recorded versions kept
    (the archive's records were written under them); a table whose columns or key in the
    catalog differ from its latest version gets a new one, from `scn` (the archive's end:
    the first scn not archived yet); a table new to defs.json is added as `add source`
    adds it; one no longer published stays as it was. Returns the definitions and "table
    vN" for each version added.

    A version from the archive's end is one no archived record uses yet: the next pull
    treats it as the miner treats its own that a kill left there (not yet held) and
    records the table's version itself at its first change under the new columns, at the
    exact position. History is never lost either way."""
    merged, changed = dict(kept), []
    for document in catalog:
        name = document["name"]
        columns = tuple(Column(c["name"], c["type"], c["nullable"], c.get("default")) for c in document["columns"])
        key = tuple(document["key"])
        table = kept.get(name)
        if table is None:
            merged[name] = TableDef(name, columns, key)  # as `add source` writes it: no record of it yet
            changed.append(f"{name} v1")
        elif [(c.name, c.type, c.nullable) for c in table.columns] != [(c.name, c.type, c.nullable) for c in columns] \
                or table.key != key:
            known = {c.name: c for c in table.columns}
            # a column the archive knows keeps what it recorded (its old rows' value)
            columns = tuple(known.get(c.name, c) if known.get(c.name, c).type == c.type else c for c in columns)
            merged[name] = table.with_version(columns, key, max(scn, table.latest.scn + 1))
            changed.append(f"{name} v{merged[name].latest.version}")
    return merged, changed


def _query_none(connection, statement) -> None:
    with connection.cursor() as cur:
        cur.execute(statement)


def delete_source(config: Config, name: str) -> str:
    source = config.source_name(name)
    pg = config.postgres(source)
    connection = connect(config, source)
    try:
        rows = _query(connection, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (pg.slot,))
        if rows and rows[0][0] is not None:
            raise TrailboundError(f"source {source}: slot {pg.slot} is in use by server process {rows[0][0]} "
                                  "(a pull is running); try again when it ends")
        if rows:
            _query(connection, "SELECT pg_drop_replication_slot(%s)", (pg.slot,))
        _query_none(connection, sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(pg.publication)))
    finally:
        connection.close()
    said = f"slot {pg.slot} dropped" if rows else f"slot {pg.slot} did not exist"
    return (f"SOURCE {source}: {said}, publication {pg.publication} dropped; the archive is left in place "
            f"(a new `add source` starts a new archive in an empty directory)")


def accept_gap(config: Config, name: str) -> str:
    """`alter source S --accept-gap`: the user's consent to a gap continuity.py refused.
    The slot is made again if it is gone or invalidated; the archive gets one segment
    spanning the gap (miner.archive_gap) and remembers it; the next pull reads on from
    where the slot resumes. The target misses the gap's changes until the tables are
    loaded again."""
    from trailbound.sources.postgres.miner import archive_gap

    source = config.source_name(name)
    pg = config.postgres(source)
    archive = config.archive_dir(source)
    end = miner_state.load(archive).next_scn
    connection = connect(config, source)
    try:
        with connection.cursor() as cur:
            slot, gap = continuity.inspect(cur, pg.slot, end)
            if gap is None:
                return (f"SOURCE {source}: slot {pg.slot} resumes at {slot.confirmed}, within the archive (which ends "
                        f"at {end}): there is no gap to accept")
            if slot is not None and slot.active_pid is not None:
                raise TrailboundError(f"source {source}: slot {pg.slot} is in use by server process "
                                      f"{slot.active_pid}; try again when it ends")
            if gap.reason == "foreign":
                raise TrailboundError(f"source {source}: {gap.describe()}; it may be another tool's: drop it "
                                      "yourself if it is not in use, or name another slot, then run this again")
            if gap.reason == "invalidated":
                cur.execute("SELECT pg_drop_replication_slot(%s)", (pg.slot,))
            if gap.reason in ("gone", "invalidated"):
                cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (pg.slot,))
                resume = Lsn.parse(cur.fetchone()[0])
            else:
                resume = slot.confirmed
            cur.execute("SELECT now()")
            (now,), = cur.fetchall()
    finally:
        connection.close()
    state = archive_gap(archive, resume, gap.reason, now.astimezone(UTC))
    made = f"slot {pg.slot} created again at {resume}; " if gap.reason in ("gone", "invalidated") else ""
    closed = state.gaps[-1]["closed"]
    return (f"SOURCE {source}: gap accepted: {made}LSN {end}..{resume} is not in the archive (segment "
            f"{state.sequence} spans it"
            + (f"; {len(closed)} open streamed transaction(s) closed as rolled back" if closed else "")
            + f"). The target misses the changes in the gap: load the tables again (`trailbound load {source} "
            "REPLICAT --mode watermark`, docs/initial-load.md)")


@dataclass(frozen=True)
class SlotLag:
    """How far a source's archive is behind its server (`info source`, the console)."""

    source: str
    slot: str
    exists: bool
    confirmed: str | None = None       # the slot's confirmed LSN, X/Y
    restart: str | None = None
    current: str | None = None         # the server's WAL position
    active_pid: int | None = None
    lag_bytes: int | None = None       # WAL not yet archived (current - confirmed)
    held_bytes: int | None = None      # WAL the slot keeps on the server (current - restart)
    last_segment: archive_segments.Segment | None = None
    behind_seconds: float | None = None  # the server's clock minus the archive's last next_time
    open_streamed: dict | None = None  # xid -> the miner's state of an open streamed transaction
    start_scn: Lsn | None = None       # where the archive starts when it has no segment yet
    wal_status: str | None = None      # reserved | extended | unreserved | lost (pg_replication_slots)
    gap: continuity.Gap | None = None  # why the slot cannot continue the archive, if it cannot
    gaps: tuple = ()                   # the gaps accepted so far (miner state)


def slot_lag(config: Config, name: str, dsn: str | None = None) -> SlotLag:
    """The slot's positions and the archive's end, read from the source server (its DSN
    from `dsn_env`, or `dsn`) and the archive directory."""
    source = config.source_name(name)
    pg = config.postgres(source)
    archive = config.archive_dir(source)
    state = miner_state.load(archive)
    connection = connect(config, source, dsn)
    try:
        with connection.cursor() as cur:
            slot, gap = continuity.inspect(cur, pg.slot, state.next_scn)
            cur.execute("SELECT pg_current_wal_lsn()::text, now()")
            current, now = cur.fetchone()
    finally:
        connection.close()
    if slot is None:
        return SlotLag(source, pg.slot, False, gap=gap, gaps=tuple(state.gaps), start_scn=state.next_scn)
    current = Lsn.parse(current)
    segments = [s for s in archive_segments.discover(archive) if s.thread == miner_state.THREAD] \
        if archive.is_dir() else []
    last = segments[-1] if segments else None
    return SlotLag(source, pg.slot, True, _text(slot.confirmed), _text(slot.restart), str(current), slot.active_pid,
                   _behind(current, slot.confirmed), _behind(current, slot.restart), last,
                   (now - last.next_time).total_seconds() if last else None, state.open_streamed(), state.next_scn,
                   slot.wal_status, gap, tuple(state.gaps))


def _text(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(lsn)


def _behind(current: Lsn, lsn: Lsn | None) -> int | None:
    """Bytes of WAL from `lsn` to `current` (pg_wal_lsn_diff)."""
    return None if lsn is None else current.value - lsn.value


def describe_source(config: Config, name: str) -> str:
    source = config.source_name(name)
    pg = config.postgres(source)
    lag = slot_lag(config, source)
    lines = [f"SOURCE {source}   slot {pg.slot}, publication {pg.publication}, archive {config.archive_dir(source)}"]
    if lag.gap is not None:
        lines.append(f"  GAP: {lag.gap.describe()}; pulls refuse until `trailbound alter source {source} "
                     f"--accept-gap` ({continuity.RUNBOOK})")
    for gap in lag.gaps:
        lines.append(f"  Gap accepted {gap['accepted'][:19]}Z: LSN {gap['from']}..{gap['to']} ({gap['reason']}) is "
                     f"not in the archive (segment {gap['segment']})")
    if not lag.exists:
        lines.append("  Slot: missing")
        return "\n".join(lines)
    if lag.wal_status == "unreserved":
        lines.append("  Slot at risk:   wal_status unreserved: the WAL it keeps is past max_slot_wal_keep_size; the "
                     "next checkpoint may invalidate it (pull now)")
    lines.append(f"  Confirmed LSN:  {lag.confirmed}   restart LSN {lag.restart}   server WAL at {lag.current}   "
                 + (f"in use by process {lag.active_pid}" if lag.active_pid else "idle"))
    lines.append(f"  Slot lag:       {lag.lag_bytes} bytes not yet archived; {lag.held_bytes} bytes of WAL held on "
                 "the server")
    last = lag.last_segment
    if last:
        lines.append(f"  Last segment:   thread 1 sequence {last.sequence}, scn {last.first_scn}..{last.next_scn} "
                     f"({Lsn.of(last.first_scn)}..{Lsn.of(last.next_scn)}), {last.records} records, ends "
                     f"{utc(last.next_time)}")
        lines.append(f"  Time lag:       the archive reaches {lag.behind_seconds:.1f} s before the server's clock")
    else:
        lines.append(f"  Last segment:   none yet (the slot starts at scn {lag.start_scn.scn}, {lag.start_scn})")
    lines.extend(_versions(config.archive_dir(source)))
    lines.append(f"  Open streamed transactions: {len(lag.open_streamed)}")
    for xid, txn in sorted(lag.open_streamed.items()):
        lines.append(f"    xid {xid}: first change {txn.first_time}, last archived change at {Lsn(txn.last_lsn)}"
                     + (f", {len(txn.aborted_subxids)} subtransaction(s) rolled back" if txn.aborted_subxids else ""))
    return "\n".join(lines)


_JSON_AS_IS = {"smallint", "integer", "bigint", "oid", "boolean", "real", "double precision"}


def widen_scope(connection, source: str, pg) -> list[str]:
    """The `table:` patterns evaluated again: each table that matches them now and is
    not in the publication yet is added to it. Its rows as they are at that moment go
    into the WAL in the same transaction (a transactional logical message, `ROWS_PREFIX`,
    with its definition), the table locked against writes meanwhile: the miner archives
    them as that transaction's inserts, so the rows written before the table was
    published are not lost and none is archived twice. A table without a primary key or
    REPLICA IDENTITY FULL is left out (as `add source` refuses it). Returns what was added."""
    published = {f"{schema}.{table}" for schema, table in _query(
        connection, "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (pg.publication,))}
    tables = [SourceTable(*row) for row in _query(connection, _TABLES)]
    new = [t for t in tables if t.qualified not in published and _in_scope(pg.table, t.qualified)
           and not (t.replica_identity == "n" or (t.replica_identity == "d" and not t.has_primary_key))]
    added = []
    for table in new:
        (definition,) = table_definitions(connection, [table])
        ident = sql.Identifier(table.schema, table.name)
        values = sql.SQL(", ").join(
            sql.SQL("{}, {}{}").format(sql.Literal(c["name"]), sql.Identifier(c["name"]),
                                       sql.SQL("" if c["type"] in _JSON_AS_IS else "::text"))
            for c in definition["columns"])
        with connection.cursor() as cur:
            cur.execute("BEGIN")
            try:
                cur.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(ident))
                cur.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(sql.Identifier(pg.publication), ident))
                cur.execute(sql.SQL("SELECT pg_logical_emit_message(true, %s, json_build_object("
                                    "'table', %s::json, 'rows', coalesce((SELECT json_agg(json_build_object({})) "
                                    "FROM {}), '[]'::json))::text)").format(values, ident),
                            (ROWS_PREFIX, json.dumps(definition)))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        added.append(table.qualified)
    return added


def _versions(archive) -> list[str]:
    """A line per table whose definition changed, or that entered the scope, while the
    archive was written: its current version and the position from which it holds."""
    try:
        defs = archive_segments.load_defs(archive)
    except TrailboundError:
        return []
    return [f"  Table {name}: version {table.latest.version} since scn {table.latest.scn} "
            f"({Lsn.of(Scn(table.latest.scn))}" + (f", {table.latest.time})" if table.latest.time else ")")
            for name, table in defs.items() if len(table.versions) > 1 or table.latest.scn]


def add_heartbeat_table(config: Config, name: str, schema: str = heartbeat.DEFAULT_SCHEMA) -> str:
    """`add heartbeattable SRC`: the source's heartbeat table, published by the next pull
    (or by `add source`), written by every pull."""
    source = config.source_name(name)
    pg = config.postgres(source)
    with closing(connect(config, source)) as connection:
        table = heartbeat_table.create(connection, source, schema)
    return (f"SOURCE {source}: heartbeat table {table} ready; the next pull publishes it in {pg.publication} and "
            "every pull writes its row before it reads the slot (`trailbound lag replicat G` shows the lag)")


def delete_heartbeat_table(config: Config, name: str, schema: str = heartbeat.DEFAULT_SCHEMA) -> str:
    """`delete heartbeattable SRC`: the source's heartbeat table dropped (heartbeat.drop)."""
    source = config.source_name(name)
    with closing(connect(config, source)) as connection:
        table = heartbeat_table.drop(connection, source, schema)
    return (f"SOURCE {source}: heartbeat table {table} dropped; pulls no longer write a heartbeat (the target keeps "
            "the heartbeats it applied)")


def pull(config: Config, name: str, *, patience: float = 60.0, dsn: str | None = None):
    """`archive pull`: the slot's changes into archive segments (the source's DSN from
    `dsn_env`, or `dsn`). Tables that came to match `table:` since the last pull, and a
    heartbeat table, are published first (`widen_scope`); then the heartbeat row is
    written (sources/postgres/heartbeat.py)."""
    from trailbound.sources.postgres.miner import Limits, pull as run_pull

    source = config.source_name(name)
    pg = config.postgres(source)
    dsn = dsn or dsn_from_env(pg.dsn_env)
    limits = Limits(pg.segment.records, pg.segment.bytes, pg.segment.seconds)
    connection = connect(config, source, dsn)
    try:
        added = widen_scope(connection, source, pg)
        # before the slot is read: this pull archives it, whatever else the server wrote
        heartbeat_table.beat(connection, source, pg.publication)
    finally:
        connection.close()
    result = run_pull(source, config.archive_dir(source), dsn, pg.slot, pg.publication, limits, patience=patience)
    result.published = added
    return result
