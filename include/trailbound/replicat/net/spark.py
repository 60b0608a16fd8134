"""The Spark backend, for a chunk with more records of key-changing (unit, table)s than
python.LIMIT (the contract: net/__init__.py). `net_changes` and `copy_lines` are pure
DataFrame transforms (no I/O, no session of their own); `net_table`, the backend, runs
them over a chunk's records through Parquet files.

- Every expression is static: per-table CASE over positional columns (v0, v1, ... are
  the table's columns in order), which Spark compiles; no higher-order functions, which
  it would interpret row by row, and images parsed into their table's struct rather than
  a map (measured: each several times slower).
- Linked lifetimes (rows moved by key updates) come out as kind L, their lifetime as
  JSON; `net_table` resolves their chains on the driver (net.resolve_chains).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from trailbound.copytext import COPY_ESCAPES, COPY_NULL
from trailbound.spark import parallelism
from trailbound.replicat.net import (CARRIES_IMAGE, DELETED, ENDS, LINES_SCHEMA, MODIFY, MOVED_IN, MOVED_OUT, NEW,
                                     STEP, Backend, Shapes, lifetime_of, lines_of, resolve_chains)


def _per_table(shapes: Shapes, build, default=None) -> Column:
    """CASE table WHEN t THEN build(shape of t) ... END."""
    expression = None
    for table, shape in shapes.items():
        value = build(shape)
        expression = F.when(F.col("table") == table, value) if expression is None else \
            expression.when(F.col("table") == table, value)
    return expression if default is None else expression.otherwise(default)


def _widths(shapes: Shapes) -> tuple[int, int]:
    return max(len(s.columns) for s in shapes.values()), max(len(s.key) for s in shapes.values())


def _touches(records: DataFrame, shapes: Shapes) -> DataFrame:
    """One row per (record, key it touches): a key-changing UPDATE touches two keys.
    Columns: unit, seq, table, key (array), role, and v0.. / p0.. (the table's columns:
    value, present in the image).

    Each image is parsed once, into the struct of its own table (a CASE picks it); an
    UPDATE's after image is also listed for which columns it carries (a column absent
    from it keeps its value, which differs from a column set to NULL)."""
    width, key_width = _widths(shapes)
    tables = list(shapes)
    op = F.col("op")
    struct_of = {t: T.StructType([T.StructField(c, T.StringType()) for c in shapes[t].columns]) for t in tables}

    def parse(image: str, t: str) -> Column:
        return F.when(F.col("table") == t, F.from_json(image, struct_of[t]))

    parsed = records.where(F.col("table").isin(tables)).select(
        "unit", "seq", "table", "op",
        *[parse("after", t).alias(f"a{k}") for k, t in enumerate(tables)],
        *[F.when(op != "INSERT", parse("before", t)).alias(f"b{k}") for k, t in enumerate(tables)],
        F.when(op == "UPDATE", F.json_object_keys("after")).alias("carried"))

    def case(build) -> Column:
        expression = None
        for k, t in enumerate(tables):
            value = build(k, shapes[t])
            expression = F.when(F.col("table") == t, value) if expression is None else \
                expression.when(F.col("table") == t, value)
        return expression

    none = F.lit(None).cast("string")
    carries = lambda column: F.array_contains(F.col("carried"), column)  # noqa: E731

    def value(i):
        return case(lambda k, s: F.col(f"a{k}")[s.columns[i]] if i < len(s.columns) else none)

    def present(i):
        return case(lambda k, s: (F.when(op == "INSERT", F.lit(True)).when(op == "UPDATE", carries(s.columns[i]))
                                  .otherwise(F.lit(False))) if i < len(s.columns) else F.lit(False))

    def from_part(j):
        return case(lambda k, s: F.col(f"b{k}")[s.key[j]] if j < len(s.key) else none)

    def to_part(j):  # an UPDATE's after image holds the key; a key column it leaves out keeps its value
        return case(lambda k, s: F.when((op == "INSERT") | carries(s.key[j]), F.col(f"a{k}")[s.key[j]])
                    .otherwise(F.col(f"b{k}")[s.key[j]]) if j < len(s.key) else none)

    keyed = parsed.select(
        "unit", "seq", "table", "op",
        F.when(op != "INSERT", F.array(*[from_part(j) for j in range(key_width)])).alias("from_key"),
        F.when(op != "DELETE", F.array(*[to_part(j) for j in range(key_width)])).alias("to_key"),
        *[value(i).alias(f"v{i}") for i in range(width)],
        *[F.coalesce(present(i), F.lit(False)).alias(f"p{i}") for i in range(width)])
    from_key, to_key = F.col("from_key"), F.col("to_key")

    def touch(key, role):
        return F.struct(key.alias("key"), F.lit(role).alias("role"))

    touches = (F.when(op == "INSERT", F.array(touch(to_key, NEW)))
               .when(op == "DELETE", F.array(touch(from_key, DELETED)))
               .when(from_key == to_key, F.array(touch(to_key, MODIFY)))
               .otherwise(F.array(touch(from_key, MOVED_OUT), touch(to_key, MOVED_IN))))
    values = [f"v{i}" for i in range(width)] + [f"p{i}" for i in range(width)]
    return (keyed.select("unit", "seq", "table", F.explode(touches).alias("t"), *values)
            .select("unit", "seq", "table", "t.key", "t.role", *values))


def _lifetimes(touches: DataFrame, width: int) -> DataFrame:
    by_key = Window.partitionBy("unit", "table", "key").orderBy("seq")
    ended_before = F.sum(F.col("role").isin(*ENDS).cast("int")).over(
        by_key.rowsBetween(Window.unboundedPreceding, -1))
    carries = F.col("role").isin(*CARRIES_IMAGE)
    numbered = touches.withColumn("lifetime", F.coalesce(ended_before, F.lit(0)))
    folded = []
    for i in range(width):
        carried = carries & F.col(f"p{i}")
        # The last value an image carried for the column, and whether any did.
        folded += [F.max_by(F.col(f"v{i}"), F.when(carried, F.col("seq"))).alias(f"v{i}"),
                   F.max(carried).alias(f"p{i}")]
    return (numbered.groupBy("unit", "table", "key", "lifetime")
            .agg(F.min("seq").alias("first_seq"), F.min_by("role", "seq").alias("first_role"),
                 F.max("seq").alias("last_seq"), F.max_by("role", "seq").alias("last_role"), *folded))


def net_changes(records: DataFrame, shapes: Shapes) -> DataFrame:
    """records: unit, seq (commit order, unique), table, op (INSERT/UPDATE/DELETE),
    before, after (JSON text). Returns one row per surviving change: unit, table, kind,
    okey (the origin key), v0../p0.. (the table's columns: value, carried by the
    images), and for kind L the lifetime's first/last record and role."""
    width, _ = _widths(shapes)
    lifetimes = _lifetimes(_touches(records, shapes), width)
    first, last = F.col("first_role"), F.col("last_role")
    linked = (first == MOVED_IN) | (last == MOVED_OUT)
    kind = (F.when(linked, "L")
            .when((first == NEW) & (last == DELETED), None)
            .when(first == NEW, "I")
            .when(last == DELETED, "D")
            .otherwise("U"))
    keeps_values = kind.isin("I", "U", "L")
    return (lifetimes.select(
        "unit", "table", kind.alias("kind"), F.when(kind != "I", F.col("key")).alias("okey"),
        *[F.when(keeps_values, F.col(f"v{i}")).alias(f"v{i}") for i in range(width)],
        *[(keeps_values & F.col(f"p{i}")).alias(f"p{i}") for i in range(width)],
        "first_seq", "first_role", "last_seq", "last_role")
        .where(F.col("kind").isNotNull()))


def _escaped(value: Column) -> Column:
    for raw, escaped in COPY_ESCAPES:
        value = F.replace(value, F.lit(raw), F.lit(escaped))
    return F.coalesce(value, F.lit(COPY_NULL))


def copy_lines(net: DataFrame, shapes: Shapes) -> DataFrame:
    """unit, table, kind, step and `line`: one line of COPY text format.

    An I line is the row's columns in the table's column order, for COPY straight into
    the target. A staged line is: kind, mask (1/0 per column: carried by the images?),
    the origin key's columns, then every column (\\N where absent), for the staging table.
    An L line is the lifetime as JSON, for `resolve_chains`; net.format_line formats
    what that returns exactly as this does."""
    width, key_width = _widths(shapes)
    values = _per_table(shapes, lambda s: F.concat_ws("\t", *[_escaped(F.col(f"v{i}")) for i in range(len(s.columns))]))
    mask = _per_table(shapes, lambda s: F.concat(*[F.when(F.col(f"p{i}"), "1").otherwise("0")
                                                   for i in range(len(s.columns))]))
    okey = _per_table(shapes, lambda s: F.concat_ws("\t", *[_escaped(F.col("okey")[j]) for j in range(len(s.key))]))
    kind = F.col("kind")
    lifetime = F.to_json(F.struct("first_seq", "first_role", "last_seq", "last_role", "okey",
                                  F.array(*[F.col(f"v{i}") for i in range(width)]).alias("v"),
                                  F.array(*[F.col(f"p{i}") for i in range(width)]).alias("p")))
    step = F.lit(None).cast("tinyint")
    for name, number in STEP.items():
        step = F.when(kind == name, F.lit(number).cast("tinyint")).otherwise(step)
    return net.select(
        "unit", "table", "kind", step.alias("step"),
        F.when(kind == "I", F.concat(values, F.lit("\n")))
        .when(kind == "L", lifetime)
        .when(kind == "X", F.lit(""))
        .otherwise(F.concat(F.concat_ws("\t", kind, mask, okey, values), F.lit("\n"))).alias("line"))


def net_rows(records: DataFrame, shapes: Shapes) -> list[dict]:
    """The whole net change as dicts, chains resolved: for tests and inspection (it
    collects to the driver)."""
    rows, linked = [], []
    width, _ = _widths(shapes)
    for row in net_changes(records, shapes).collect():
        row = row.asDict()
        shape = shapes[row["table"]]
        row["v"], row["p"] = [row[f"v{i}"] for i in range(width)], [row[f"p{i}"] for i in range(width)]
        as_dict = lifetime_of(row, shape)
        if row["kind"] == "L":
            linked.append(as_dict)
        else:
            rows.append({"unit": row["unit"], "table": row["table"], "kind": row["kind"],
                         "okey": as_dict["okey"] if row["kind"] != "I" else None,
                         "vals": as_dict["vals"] if row["kind"] in ("I", "U") else None})
    return rows + resolve_chains(linked)


def net_table(records: pa.Table, shapes: Shapes, start_spark, workdir: Path) -> pa.Table:
    """The backend (net.Backend): the transform over `records` (through Parquet files in
    `workdir`) on the session `start_spark` gives, its chains resolved."""
    spark = start_spark()
    inputs, outputs = workdir / "in", workdir / "out"
    shutil.rmtree(workdir, ignore_errors=True)
    inputs.mkdir(parents=True)
    # Several files, so that Spark reads (and parses the images) in parallel.
    pieces = max(1, min(parallelism(spark), len(records) // 20_000))
    step = -(-len(records) // pieces)
    for number, offset in enumerate(range(0, len(records), step)):
        pq.write_table(records.slice(offset, step), inputs / f"part-{number:05d}.parquet", compression="lz4")
    net = net_changes(spark.read.parquet(str(inputs)), shapes)
    copy_lines(net, shapes).write.mode("overwrite").parquet(str(outputs))
    lines = _with_chains_resolved(pq.read_table(outputs, schema=LINES_SCHEMA), shapes)
    shutil.rmtree(workdir, ignore_errors=True)
    return lines


def _with_chains_resolved(lines: pa.Table, shapes: Shapes) -> pa.Table:
    """Replace the linked lifetimes (kind L: rows moved by key updates) with the net
    rows their chains come to."""
    linked = pc.equal(lines.column("kind"), "L")
    if not pc.any(linked).as_py():
        return lines
    lifetimes = [lifetime_of(json.loads(text) | {"unit": unit, "table": table}, shapes[table])
                 for unit, table, text in zip(*(lines.filter(linked).column(c).to_pylist()
                                                for c in ("unit", "table", "line")))]
    return pa.concat_tables([lines.filter(pc.invert(linked)), lines_of(resolve_chains(lifetimes), shapes)])


BACKEND = Backend("spark", "prepare: net change (Spark)", net_table)
