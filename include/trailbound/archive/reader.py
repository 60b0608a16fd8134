"""The Spark reader of redo segments: one DataFrame of records, and the record-level
checks of the contract.

Both encodings land in the same columns: thread, sequence, rba, scn, ts, xid,
parent_xid, op, table, before, after, plus `file` (the data file's name) so that every
error can name the file and rba. `before`/`after` stay JSON text; a JSON Lines writer
may give them as strings or as nested objects, Spark hands both back as text.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from trailbound.archive import contract
from trailbound.archive.segments import Segment
from trailbound.errors import ArchiveError

_PARQUET_SCHEMA = T.StructType([
    T.StructField("rba", T.LongType()),
    T.StructField("scn", T.LongType()),
    T.StructField("ts", T.TimestampType()),
    T.StructField("xid", T.StringType()),
    T.StructField("parent_xid", T.StringType()),
    T.StructField("op", T.StringType()),
    T.StructField("table", T.StringType()),
    T.StructField("before", T.StringType()),
    T.StructField("after", T.StringType()),
])
_CORRUPT = "_corrupt_record"
_MALFORMED = "malformed JSON line: "
_JSON_SCHEMA = T.StructType(
    [T.StructField(f.name, T.StringType() if f.name == "ts" else f.dataType) for f in _PARQUET_SCHEMA]
    + [T.StructField(_CORRUPT, T.StringType())]
)
_SEGMENT_COLUMNS = T.StructType([
    T.StructField("thread", T.IntegerType()),
    T.StructField("sequence", T.LongType()),
    T.StructField("file", T.StringType()),
    T.StructField("first_scn", T.LongType()),
    T.StructField("next_scn", T.LongType()),
])
RECORD_COLUMNS = ["thread", "sequence", "rba", "scn", "ts", "xid", "parent_xid", "op", "table", "before", "after", "file"]


def _segment_frame(spark: SparkSession, segments: Sequence[Segment]) -> DataFrame:
    rows = [(s.thread, s.sequence, s.path.name, s.first_scn.value, s.next_scn.value) for s in segments]
    return spark.createDataFrame(rows, _SEGMENT_COLUMNS)


def _read_format(spark: SparkSession, segments: Sequence[Segment], fmt: str) -> DataFrame | None:
    paths = [str(s.path) for s in segments if s.format == fmt and s.records > 0]
    if not paths:
        return None
    if fmt == "parquet":
        frame = spark.read.schema(_PARQUET_SCHEMA).parquet(*paths).withColumn(_CORRUPT, F.lit(None).cast("string"))
    else:
        frame = (spark.read.schema(_JSON_SCHEMA)
                 .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", _CORRUPT)
                 .json(paths)
                 .withColumn("ts", F.col("ts").try_cast("timestamp")))  # not a time: null, refused by the checks
    return frame.withColumn("file", F.regexp_extract(F.col("_metadata.file_path"), r"([^/]+)$", 1))


def read_records(spark: SparkSession, segments: Sequence[Segment], *, keep_corrupt: bool = False) -> DataFrame:
    """All records of `segments`, with their thread, sequence and file name. Unordered:
    order by (thread, sequence, rba) for log order, by scn across threads."""
    frames = [f for f in (_read_format(spark, segments, fmt) for fmt in contract.FORMATS) if f is not None]
    if not frames:
        empty = spark.createDataFrame([], _JSON_SCHEMA).withColumn("file", F.lit(None).cast("string"))
        frames = [empty.withColumn("ts", F.col("ts").cast("timestamp"))]
    records = frames[0]
    for frame in frames[1:]:
        records = records.unionByName(frame)
    records = records.join(F.broadcast(_segment_frame(spark, segments)), "file")
    columns = RECORD_COLUMNS + (["first_scn", "next_scn", _CORRUPT] if keep_corrupt else [])
    return records.select(*columns)


def _not_an_object(column: str):
    """True when an image is present but is not JSON object text (a JSON string, an
    array, a number, or no JSON at all): replicat could not read a row from it."""
    value = F.col(column)
    return value.isNotNull() & (~F.ltrim(value).startswith("{") | F.from_json(value, _IMAGE).isNull())


_IMAGE = T.MapType(T.StringType(), T.StringType())


def _record_violations(records: DataFrame) -> DataFrame:
    """One row per record that breaks a rule checkable from the record and its
    predecessor in the segment: (thread, sequence, rba, file, message)."""
    in_segment = Window.partitionBy("thread", "sequence").orderBy("rba")
    checked = (records
               .withColumn("prev_rba", F.lag("rba").over(in_segment))
               .withColumn("prev_scn", F.lag("scn").over(in_segment)))
    rba, scn, op, xid = F.col("rba"), F.col("scn"), F.col("op"), F.col("xid")
    text = F.format_string
    message = (
        F.when(F.col(_CORRUPT).isNotNull(), F.concat(F.lit(_MALFORMED), F.substring(F.col(_CORRUPT), 1, 120)))
        .when(rba.isNull(), F.lit("record without an rba"))
        .when(F.col("prev_rba").isNull() & (rba != 0), text("rba gap: the segment starts at rba %d, not 0", rba))
        .when(rba == F.col("prev_rba"), text("rba %d appears twice", rba))
        .when(rba != F.col("prev_rba") + 1, text("rba gap: rba %d follows rba %d", rba, F.col("prev_rba")))
        .when(scn.isNull(), F.lit("record without an scn"))
        .when(scn < F.col("prev_scn"), text("scn goes backwards: %d after %d", scn, F.col("prev_scn")))
        .when((scn < F.col("first_scn")) | (scn >= F.col("next_scn")),
              text("scn %d is outside the segment's range [%d, %d)", scn, F.col("first_scn"), F.col("next_scn")))
        .when(F.col("ts").isNull(), F.lit("record without a valid ts"))
        .when(xid.isNull() | (F.length(xid) < 1) | (F.length(xid) > contract.MAX_XID_LENGTH),
              F.lit(f"xid must be 1 to {contract.MAX_XID_LENGTH} characters"))
        .when(op.isNull() | ~op.isin(*contract.OPS), text("unknown op %s", F.coalesce(op, F.lit("null"))))
        .when(op.isin(*contract.DML_OPS) & (F.col("table").isNull() | (F.col("table") == "")),
              text("%s without a table", op))
        .when((op == "COMMIT") & F.col("parent_xid").isNotNull(),
              text("COMMIT of subtransaction %s (of transaction %s)", xid, F.col("parent_xid")))
        .when(F.col("parent_xid") == xid, text("parent_xid of %s names itself", xid))
        .when(_not_an_object("before"), text("before is not a JSON object: %s", F.substring("before", 1, 80)))
        .when(_not_an_object("after"), text("after is not a JSON object: %s", F.substring("after", 1, 80)))
    )
    return (checked.withColumn("message", message)
            .where(F.col("message").isNotNull())
            .select("thread", "sequence", "rba", "file", "message"))


def _records_after_end(records: DataFrame) -> DataFrame:
    """Records of a transaction (or of one of its subtransactions) that come after the
    transaction's COMMIT or ROLLBACK, in the thread's log order."""
    ends = (records.where(F.col("op").isin(*contract.END_OPS))
            .groupBy("thread", "xid")
            .agg(F.min(F.struct("sequence", "rba", "op", "parent_xid")).alias("end")))
    position = F.struct("sequence", "rba")
    end_position = F.struct(F.col("end.sequence"), F.col("end.rba"))
    own = (records.join(ends, ["thread", "xid"])
           .where(position > end_position)
           .select("thread", "sequence", "rba", "file", F.format_string(
               "record of transaction %s after its %s at sequence %d rba %d",
               "xid", "end.op", "end.sequence", "end.rba").alias("message")))
    top_level_ends = ends.where(F.col("end.parent_xid").isNull()).withColumnRenamed("xid", "parent_xid")
    children = (records.join(top_level_ends, ["thread", "parent_xid"])
                .where(position > end_position)
                .select("thread", "sequence", "rba", "file", F.format_string(
                    "record of subtransaction %s after its transaction %s ended (%s at sequence %d rba %d)",
                    "xid", "parent_xid", "end.op", "end.sequence", "end.rba").alias("message")))
    return own.unionByName(children)


def _nested_subtransactions(records: DataFrame) -> DataFrame:
    """Records whose parent_xid names a subtransaction instead of its top-level
    transaction. Grouping by parent_xid would make that subtransaction a transaction of
    its own that never commits: an open transaction pinning recovery and retention."""
    subtransactions = (records.where(F.col("parent_xid").isNotNull())
                       .select(F.col("thread").alias("sub_thread"), F.col("xid").alias("sub"),
                               F.col("parent_xid").alias("top")).distinct())
    return (records.join(subtransactions, (F.col("thread") == F.col("sub_thread"))
                         & (F.col("parent_xid") == F.col("sub")) & (F.col("xid") != F.col("sub")))
            .select("thread", "sequence", "rba", "file", F.format_string(
                "parent_xid %s of %s names a subtransaction (of transaction %s), not a top-level transaction",
                "parent_xid", "xid", "top").alias("message")))


def _json_line_error(path, text_prefix: str | None) -> tuple[int | None, str]:
    """(rba, message) for the first line of a JSON Lines file that is not a JSON object:
    Spark's reader says that a line is malformed, not which line it is."""
    import json

    try:
        with open(path, "rb") as handle:
            for number, line in enumerate(handle):
                try:
                    parsed = json.loads(line)
                except ValueError as exc:
                    return number, f"line {number + 1} is not well-formed JSON ({exc})"
                if not isinstance(parsed, dict):
                    return number, f"line {number + 1} is not a JSON object"
    except OSError:
        pass
    return None, f"malformed JSON line: {text_prefix}"


def first_violation(spark: SparkSession, segments: Sequence[Segment]) -> ArchiveError | None:
    """The first record (by thread, sequence, rba) that breaks the contract, or None."""
    if not any(s.records for s in segments):
        return None
    records = read_records(spark, segments, keep_corrupt=True).cache()
    try:
        violations = (_record_violations(records).unionByName(_records_after_end(records))
                      .unionByName(_nested_subtransactions(records)))
        first = violations.orderBy("thread", "sequence", F.col("rba").asc_nulls_first()).limit(1).collect()
    finally:
        records.unpersist()
    if not first:
        return None
    row = first[0]
    paths = {s.path.name: s.path for s in segments}
    path, message, rba = paths.get(row["file"], row["file"]), row["message"], row["rba"]
    if message.startswith(_MALFORMED) and rba is None:
        rba, message = _json_line_error(path, message[len(_MALFORMED):])
    return ArchiveError(path, message, rba=rba)


def check_records(spark: SparkSession, segments: Sequence[Segment]) -> None:
    """Raise the first contract violation among the records of `segments`."""
    error = first_violation(spark, segments)
    if error is not None:
        raise error
