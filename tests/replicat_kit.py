"""Helpers for replicat tests: a configuration with capture and replicat, the target
compared with the simulator's truth inside PostgreSQL, the checkpoint row, and a small
archive captured into the trail with the target tables created (`captured`)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg2
from psycopg2 import sql

from trailbound import config as configuration
from capture_kit import ins, new_archive, rec
from trailbound.archive.contract import split_table_name
from trailbound.archive.segments import load_defs


def write_config(tmp_path: Path, *, tables=("shop.*", "hr.*"), megabytes: float = 64, grouptransops: int = 1000,
                 handlecollisions: bool = False, checkpointtable: str | None = None, maps=None,
                 home: Path | None = None, exttrail: str = "dirdat/lt", apply_parallelism: int | None = None,
                 chunk_records: int | None = None) -> Path:
    """A configuration with capture EXT1 and replicat REP1 on one trail; `home` (default
    tmp_path) holds the archive and the trail."""
    path = tmp_path / "trailbound.yaml"
    table_list = ", ".join(json.dumps(t) for t in tables)
    text = (f"home: {home or tmp_path}\nsources:\n  SRC:\n    altarchivelogdest: archive\n"
            f"extracts:\n  EXT1:\n    source: SRC\n    exttrail: {exttrail}\n    table: [{table_list}]\n"
            f"    megabytes: {megabytes}\n"
            f"replicats:\n  REP1:\n    exttrail: {exttrail}\n    source: SRC\n    grouptransops: {grouptransops}\n"
            f"    handlecollisions: {str(handlecollisions).lower()}\n")
    if apply_parallelism is not None:
        text += f"    apply_parallelism: {apply_parallelism}\n"
    if chunk_records is not None:
        text += f"    chunk_records: {chunk_records}\n"
    if checkpointtable:
        text += f"    checkpointtable: {json.dumps(checkpointtable)}\n"
    if maps:
        text += "    map:\n" + "".join(f"      - {{source: {json.dumps(s)}, target: {json.dumps(t)}}}\n" for s, t in maps)
    path.write_text(text)
    return path


def load_config(tmp_path: Path, **kwargs) -> configuration.Config:
    return configuration.load(write_config(tmp_path, **kwargs))


def _text(value):
    """A truth value as PostgreSQL text input (independently of replicat's own code)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def differences(target_dsn: str, truth: dict, schema_map=lambda schema: schema) -> dict[str, tuple[int, int, list]]:
    """Per table: (rows only in the target, rows only in the truth, a few examples),
    comparing each row's text form in PostgreSQL: the target's types parse the truth's
    text input forms, so numeric scale, NULL vs '', bytea, timestamptz, arrays, jsonb and
    float sign are all compared as the target stores them."""
    found = {}
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'")
        for name, table in truth["tables"].items():
            schema, table_name = split_table_name(name)
            target = sql.Identifier(schema_map(schema), table_name)
            cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
                        " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                        (target.as_string(cur),))
            types = dict(cur.fetchall())
            assert list(types) == table["columns"], f"{name}: target columns {list(types)}"
            cur.execute(sql.SQL("CREATE TEMP TABLE truth_rows (LIKE {}) ON COMMIT DROP").format(target))
            if table["rows"]:
                values = sql.SQL(", ").join(sql.SQL("CAST(%s AS {})").format(sql.SQL(types[c])) for c in table["columns"])
                cur.executemany(sql.SQL("INSERT INTO truth_rows VALUES ({})").format(values),
                                [[_text(row[c]) for c in table["columns"]] for row in table["rows"]])
            cur.execute(sql.SQL("SELECT t::text FROM {} t EXCEPT ALL SELECT t::text FROM truth_rows t").format(target))
            extra = [r[0] for r in cur.fetchall()]
            cur.execute(sql.SQL("SELECT t::text FROM truth_rows t EXCEPT ALL SELECT t::text FROM {} t").format(target))
            missing = [r[0] for r in cur.fetchall()]
            cur.execute("DROP TABLE truth_rows")
            if extra or missing:
                found[name] = (len(extra), len(missing), (extra[:2], missing[:2]))
    return found


def row_counts(target_dsn: str, truth: dict) -> dict[str, int]:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        counts = {}
        for name in truth["tables"]:
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*split_table_name(name))))
            counts[name] = cur.fetchone()[0]
        return counts


def checkpoint_row(target_dsn: str, table: str = "trailbound.ggcheckpoint", group: str = "REP1") -> dict | None:
    schema, name = table.split(".", 1)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT * FROM {} WHERE group_name = %s").format(sql.Identifier(schema, name)), (group,))
        row = cur.fetchone()
        return dict(zip([d.name for d in cur.description], row)) if row else None


def checkpoint_row_if_created(target_dsn: str) -> dict | None:
    """The checkpoint table row, None also when no run has created the table yet."""
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT to_regclass('trailbound.ggcheckpoint') IS NOT NULL")
        exists = cur.fetchone()[0]
    return checkpoint_row(target_dsn) if exists else None


def orders(target_dsn: str) -> dict[int, str]:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT id, note FROM shop.orders ORDER BY id")
        return dict(cur.fetchall())


def captured(tmp_path, spark, store, target_dsn, records, **options):
    """An archive of `records` captured into the trail; target tables created."""
    from trailbound.capture.run import run_extract
    from trailbound.replicat import target as tgt

    archive = new_archive(tmp_path)
    archive.segment(1, records, max(1000, max(r["scn"] for r in records) + 1))
    config_path = write_config(tmp_path, tables=("shop.*",), **options)
    config = configuration.load(config_path)
    run_extract(spark, store, config, "EXT1")
    connection = psycopg2.connect(target_dsn)
    with connection, connection.cursor() as cur:
        tgt.create_tables(cur, load_defs(config.archive_dir("SRC")), config.replicat("REP1").map)
    connection.close()
    return config_path, config


# Four transactions on shop.orders, and the target they leave.
FOUR = [ins(10, "T1", 1), rec(11, "T1", "COMMIT"), ins(20, "T2", 2), ins(21, "T2", 3), rec(22, "T2", "COMMIT"),
        ins(30, "T3", 4), rec(31, "T3", "COMMIT"), rec(40, "T4", "UPDATE", "shop.orders", key=1, note="changed"),
        rec(41, "T4", "COMMIT")]
FOUR_APPLIED = {1: "changed", 2: "n2", 3: "n3", 4: "n4"}
