"""Many tables of every key kind for the many-tables test and benchmark
(tests/test_many_tables.py, tests/bench/bench_many_tables.py): tables spread over
schemas in five shapes in turn (an integer key, a composite key (bigint, text), a uuid
key, no key with REPLICA IDENTITY FULL, and 64 columns of mixed types: int, bigint,
numeric, text, varchar, bool, date, timestamptz, jsonb, bytea, uuid, int[], text[],
float8), and a seeded random workload of transactions touching 1 to 20 of them."""

from __future__ import annotations

import random

import psycopg2
from psycopg2 import sql

SCHEMAS = ("sales", "stock", "people", "ledger", "events", "misc")
SHAPES = ("intkey", "compkey", "uuidkey", "keyless", "wide")


# The wide shape's columns beyond its key: 63 of them, every type in turn.
WIDE_TYPES = [("i", "int", "{n} % 1000"), ("b", "bigint", "{n}::bigint * 1000003"), ("n", "numeric(14,4)", "{n} / 7.0"),
              ("t", "text", "'t ' || {n} || ' é'"), ("v", "varchar(40)", "'v' || ({n} % 97)"),
              ("f", "boolean", "{n} % 2 = 0"), ("d", "date", "date '2026-01-01' + ({n} % 300)"),
              ("ts", "timestamptz", "timestamptz '2026-11-01 10:00+00' + {n} * interval '1 second'"),
              ("j", "jsonb", "jsonb_build_object('n', {n}, 'a', jsonb_build_array({n}, 'x'))"),
              ("by", "bytea", "decode(md5({n}::text), 'hex')"), ("u", "uuid", "md5('u' || {n})::uuid"),
              ("ai", "int[]", "ARRAY[{n}, {n} + 1]"), ("at", "text[]", "ARRAY['a' || {n}, 'b']"),
              ("fl", "float8", "{n} / 3.0")]
WIDE_COLUMNS = [(f"{name}{k}", kind, value) for k in range(5) for name, kind, value in WIDE_TYPES][:63]


def shape_of(index: int) -> str:
    return SHAPES[index % len(SHAPES)]


def tables_for(count: int, schemas: int = len(SCHEMAS)) -> list[tuple[str, str, str]]:
    """(schema, table, shape): `count` tables over the first `schemas` schemas, the shapes in turn."""
    return [(SCHEMAS[i % schemas], f"t{i:03d}_{shape_of(i)}", shape_of(i)) for i in range(count)]


def create_tables(dsn: str, tables: list[tuple[str, str, str]]) -> None:
    connection = psycopg2.connect(dsn)
    with connection.cursor() as cur:
        for schema in sorted({s for s, _, _ in tables}):
            cur.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for table in tables:
            cur.execute(create_statement(*table))
    connection.commit()
    connection.close()


def create_statement(schema: str, table: str, shape: str) -> sql.Composed:
    name = sql.Identifier(schema, table)
    common = "val int, note text, amount numeric(12,2), at timestamptz"
    if shape == "intkey":
        body = f"id bigint PRIMARY KEY, {common}"
    elif shape == "compkey":
        body = f"id bigint, part text, {common}, PRIMARY KEY (id, part)"
    elif shape == "uuidkey":
        body = f"uid uuid PRIMARY KEY, id bigint NOT NULL, {common}"
    elif shape == "keyless":
        body = f"id bigint, {common}"
    else:
        body = "id bigint PRIMARY KEY, " + ", ".join(f"{column} {kind}" for column, kind, _ in WIDE_COLUMNS)
    statement = sql.SQL("CREATE TABLE {} (" + body + ")").format(name)
    if shape == "keyless":
        statement = sql.Composed([statement, sql.SQL("; ALTER TABLE {} REPLICA IDENTITY FULL").format(name)])
    return statement


def insert_statement(schema: str, table: str, shape: str) -> sql.Composed:
    """INSERT of the rows with ids %(first)s..%(last)s."""
    values = {"intkey": "g, g % 1000, 'row ' || g, g * 1.25, now()",
              "compkey": "g, 'p' || (g % 7), g % 1000, 'row ' || g, g * 1.25, now()",
              "uuidkey": "md5(g::text)::uuid, g, g % 1000, 'row ' || g, g * 1.25, now()",
              "keyless": "g, g % 1000, 'row ' || g, g * 1.25, now()",
              "wide": "g, " + ", ".join(value.format(n="g") for _, _, value in WIDE_COLUMNS)}[shape]
    return sql.SQL("INSERT INTO {} SELECT " + values.replace("%", "%%") + " FROM generate_series(%(first)s, %(last)s) g").format(
        sql.Identifier(schema, table))


def update_statement(schema: str, table: str, shape: str) -> sql.Composed:
    changes = ("i0 = i0 + 1, t1 = t1 || '+', j2 = j2 || jsonb_build_object('u', 1), ts3 = now()" if shape == "wide" else
               "val = val + 1, note = note || '+', at = now()")
    return sql.SQL("UPDATE {} SET " + changes + " WHERE id = ANY(%(ids)s)").format(sql.Identifier(schema, table))


def delete_statement(schema: str, table: str) -> sql.Composed:
    return sql.SQL("DELETE FROM {} WHERE id = ANY(%(ids)s)").format(sql.Identifier(schema, table))


def workload(dsn: str, tables: list[tuple[str, str, str]], changes: int, seed: int, *,
             keyless_changes: bool = True, first_ids: list[int] | None = None) -> int:
    """Random transactions until `changes` row changes: each touches 1 to 20 tables (one
    may be touched twice) with an INSERT, UPDATE or DELETE of 1 to 5 rows (an INSERT while
    the table has fewer than 5 rows it knows of); the draws are the same whatever the table
    count except the table a touch picks. Without `keyless_changes`, the keyless tables
    only get INSERTs (replicat then applies every group as a set). `first_ids`: each
    table's next id, kept from one call to the next (updates and deletes touch only rows
    this call inserted). Returns the number of transactions."""
    draws, picks = random.Random(seed), random.Random(seed + 1)
    live: list[list[int]] = [[] for _ in tables]
    next_id = first_ids if first_ids is not None else [1] * len(tables)
    statements = {i: (insert_statement(*t), update_statement(*t), delete_statement(*t[:2]))
                  for i, t in enumerate(tables)}
    connection = psycopg2.connect(dsn)
    done = transactions = 0
    with connection.cursor() as cur:
        while done < changes:
            for _ in range(draws.randint(1, 20)):
                i = picks.randrange(len(tables))
                rows = min(draws.randint(1, 5), changes - done) or 1
                kind = draws.random()
                insert, update, delete = statements[i]
                if len(live[i]) < 5 or kind < 0.5 or (tables[i][2] == "keyless" and not keyless_changes):
                    first = next_id[i]
                    next_id[i] += rows
                    cur.execute(insert, {"first": first, "last": first + rows - 1})
                    live[i].extend(range(first, first + rows))
                elif kind < 0.85:
                    cur.execute(update, {"ids": draws.sample(live[i], rows)})
                else:
                    gone = draws.sample(live[i], rows)
                    cur.execute(delete, {"ids": gone})
                    gone_set = set(gone)
                    live[i] = [k for k in live[i] if k not in gone_set]
                done += rows
                if done >= changes:
                    break
            connection.commit()
            transactions += 1
    connection.close()
    return transactions
