"""Net change: trail records in, one row per surviving change per table and key out.

Pure DataFrame transforms (no I/O, no session of their own) plus the small pure-Python
step that finishes them. Replicat groups many source transactions into one target
transaction and splits each group into *units* (a TRUNCATE is applied on its own, never
inside a unit). Inside a unit only the net effect on each row matters:

- A row's *lifetime* on a key runs from where it appears (INSERT, an UPDATE that moves a
  row onto the key, or the start of the unit for a row the target already has) to where
  it goes (DELETE, an UPDATE that moves it to another key, or the end of the unit). The
  source's keys are unique at every moment, so the lifetimes on one key follow each
  other; a key inserted, updated and deleted inside the unit leaves nothing.
- Column values fold in commit order. A column absent from every image of a row the
  target already holds keeps the target's value: the row carries which columns are
  present (the mask of its COPY line).
- Every expression is static: per-table CASE over positional columns (v0, v1, ... are
  the table's columns in order), which Spark compiles; no higher-order functions, which
  it would interpret row by row, and images parsed into their table's struct rather than
  a map (measured: each several times slower).
- A primary-key UPDATE ends one lifetime and starts another: the two are *linked*, and a
  chain of linked lifetimes is one row wandering through keys. Spark marks linked
  lifetimes as kind L; `resolve_chains` (plain Python: key updates are rare, and a chain
  is a walk, which a join-per-step plan would do badly) turns them into net rows.

Net rows, per (unit, table):

| kind | meaning | okey | vals |
|---|---|---|---|
| I | insert a new row | - | every column |
| D | delete the target's row at okey | origin key | - |
| U | update the target's row at okey in place | origin key | present columns |
| M | move the target's row at okey: delete it, insert it merged at its new key | origin key | present columns |
| X | input no source could produce (a broken chain): apply the unit record by record | - | - |

A key is the list of the key columns' values as the images carry them (PostgreSQL text
input forms); a keyless table is keyed by all its columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from trailbound.copytext import COPY_ESCAPES, COPY_NULL


# Touch roles: what a record does to one key.
NEW, MOVED_IN, MODIFY, DELETED, MOVED_OUT = "new", "moved_in", "modify", "deleted", "moved_out"
ENDS = (DELETED, MOVED_OUT)               # a lifetime ends at these
CARRIES_IMAGE = (NEW, MOVED_IN, MODIFY)   # these fold the record's image into the row



@dataclass(frozen=True)
class Shape:
    """A source table as the transform sees it: its columns in order and its key (all
    columns when the table has none)."""

    columns: tuple[str, ...]
    key: tuple[str, ...]

    @classmethod
    def of(cls, columns, key) -> "Shape":
        return cls(tuple(columns), tuple(key) or tuple(columns))


Shapes = dict[str, Shape]


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


def lifetime_of(row: dict, shape: Shape) -> dict:
    """A kind L row (as `copy_lines` sends it: JSON) in the form `resolve_chains` takes."""
    return {"unit": row["unit"], "table": row["table"], "first_seq": row["first_seq"],
            "first_role": row["first_role"], "last_seq": row["last_seq"], "last_role": row["last_role"],
            "okey": list(row["okey"] or [])[:len(shape.key)],
            "vals": {c: row["v"][i] for i, c in enumerate(shape.columns) if row["p"][i]}}


def resolve_chains(lifetimes: list[dict]) -> list[dict]:
    """Kind L rows (lifetimes linked by key-changing UPDATEs: rare) -> net rows.

    A key-changing UPDATE is the last record of one lifetime (moved out) and the first of
    the next (moved in): follow each chain from its head (a lifetime that was not moved
    in) to its tail, folding the images in order. The result row has the head's origin
    (a new row, or the target's row at the head's key) and the tail's fate. A lifetime
    no chain reaches (input the source could not have produced) becomes kind X."""
    by_unit_table: dict[tuple, list[dict]] = {}
    for row in lifetimes:
        by_unit_table.setdefault((row["unit"], row["table"]), []).append(row)
    out = []
    for (unit, table), rows in by_unit_table.items():
        moved_in = {row["first_seq"]: row for row in rows if row["first_role"] == MOVED_IN}
        reached = 0
        for head in sorted((r for r in rows if r["first_role"] != MOVED_IN), key=lambda r: r["first_seq"]):
            vals, node = dict(head["vals"] or {}), head
            reached += 1
            while node["last_role"] == MOVED_OUT and node["last_seq"] in moved_in:
                node = moved_in.pop(node["last_seq"])
                reached += 1
                vals.update(node["vals"] or {})
            if node["last_role"] == MOVED_OUT:
                kind = "X"
            elif head["first_role"] == NEW:
                kind = None if node["last_role"] == DELETED else "I"
            elif node["last_role"] == DELETED:
                kind = "D"
            else:
                kind = "U" if list(node["okey"]) == list(head["okey"]) else "M"
            if kind is not None:
                out.append({"unit": unit, "table": table, "kind": kind,
                            "okey": list(head["okey"]) if kind in ("D", "U", "M") else None,
                            "vals": vals if kind in ("I", "U", "M") else None})
        if reached < len(rows):
            out.append({"unit": unit, "table": table, "kind": "X", "okey": None, "vals": None})
    return out


def _escaped(value: Column) -> Column:
    for raw, escaped in COPY_ESCAPES:
        value = F.replace(value, F.lit(raw), F.lit(escaped))
    return F.coalesce(value, F.lit(COPY_NULL))


def copy_escape(value: str | None) -> str:
    """The same escaping in Python (chains resolved on the driver, tests)."""
    if value is None:
        return COPY_NULL
    for raw, escaped in COPY_ESCAPES:
        value = value.replace(raw, escaped)
    return value


STAGED_KINDS = ("D", "U", "M")
# Order of application within a unit and table: 0 X (replay), 1 staged D/U/M, 2 I; 3 is a
# linked lifetime Spark hands back for `resolve_chains`.
STEP = {"X": 0, "D": 1, "U": 1, "M": 1, "I": 2, "L": 3}


def copy_lines(net: DataFrame, shapes: Shapes) -> DataFrame:
    """unit, table, kind, step and `line`: one line of COPY text format.

    An I line is the row's columns in the table's column order, for COPY straight into
    the target. A staged line is: kind, mask (1/0 per column: carried by the images?),
    the origin key's columns, then every column (\\N where absent), for the staging table.
    An L line is the lifetime as JSON, for `resolve_chains`; `format_line` formats what
    that returns exactly as this does."""
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


def format_line(row: dict, shape: Shape) -> str:
    """A net row (as `resolve_chains` returns it) as `copy_lines` would format it."""
    kind, vals = row["kind"], row["vals"] or {}
    values = "\t".join(copy_escape(vals.get(c)) for c in shape.columns)
    if kind == "I":
        return values + "\n"
    if kind == "X":
        return ""
    mask = "".join("1" if c in vals else "0" for c in shape.columns)
    return "\t".join([kind, mask, "\t".join(copy_escape(v) for v in row["okey"]), values]) + "\n"


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
