"""Transaction assembly: redo records in, commit-ordered trail records out.

A pure transform (DataFrames in, DataFrames out, no I/O), so it is tested on its own.
Given the records a run reads and what earlier runs decided, it:

- groups records by top-level transaction (a subtransaction's records belong to its
  parent_xid) within a thread;
- drops rolled-back transactions and rolled-back subtransactions (savepoints);
- leaves alone transactions that ended below `read_scn`: earlier runs decided them;
- never writes a transaction marked skip (in flight at the begin point, skiptrans);
- writes each newly committed transaction whole, with its captured-table records in log
  order, marked with its transaction indicator, in CSN order;
- reports the transactions still open (their start is the recovery position).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from trailbound.archive import contract
from trailbound.positions import Csn
from trailbound.trail import BEGIN, END, MIDDLE, WHOLE

OPEN, WRITE, SKIP, DONE_EARLIER, ROLLED_BACK, ALREADY_WRITTEN = (
    "open", "write", "skip", "done earlier", "rolled back", "already written")

_SKIPS = T.StructType([T.StructField("thread", T.IntegerType()), T.StructField("txid", T.StringType()),
                       T.StructField("skip_reason", T.StringType())])


def _at_or_below(columns: list, values: list):
    """Lexicographic (c1, c2, ...) <= (v1, v2, ...) for columns against constants."""
    condition = F.lit(True)
    for column, value in reversed(list(zip(columns, values))):
        condition = (column < F.lit(value)) | ((column == F.lit(value)) & condition)
    return condition


def table_regex(patterns: list[str]) -> str:
    """TABLE patterns (`shop.*`, `hr.emp?`) as one Java regex matching whole names.
    Everything but * and ? is literal, so names with dots, quotes or brackets are safe."""
    def one(pattern: str) -> str:
        parts = re.split(r"([*?])", pattern)
        return "".join(".*" if p == "*" else "." if p == "?" else
                       ("\\Q" + p.replace("\\E", "\\E\\\\E\\Q") + "\\E" if p else "") for p in parts)
    return "^(?:" + "|".join(one(p) for p in patterns) + ")$"


@dataclass(frozen=True)
class Decisions:
    """What earlier runs left for this one."""

    read_scn: int | None               # everything below was read before (None: first run)
    begin_scn: int                     # transactions starting below it are never written
    last_written: Csn | None           # the write checkpoint's last CSN
    skips: list[tuple[int, str, str]]  # (thread, xid, reason) never to be written


@dataclass
class Assembly:
    trail: DataFrame          # trail columns except rba, in commit order
    transactions: DataFrame   # one row per transaction seen: thread, txid, start, end, fate, ...
    violations: DataFrame     # records after their transaction's end: (thread, sequence, rba, file, message)


def assemble(spark: SparkSession, records: DataFrame, decisions: Decisions, tables: list[str], log_bsn: int) -> Assembly:
    r = records.withColumn("txid", F.coalesce("parent_xid", "xid"))
    position = F.struct("sequence", "rba")

    ends = (r.where(F.col("op").isin(*contract.END_OPS) & F.col("parent_xid").isNull())
            .groupBy("thread", "txid")
            .agg(F.min(F.struct("sequence", "rba", "scn", "ts", "op")).alias("end")))
    sub_rollbacks = (r.where((F.col("op") == "ROLLBACK") & F.col("parent_xid").isNotNull())
                     .groupBy("thread", "xid").agg(F.min(position).alias("sub_end")))
    skips = spark.createDataFrame(decisions.skips, _SKIPS)

    size = F.coalesce(F.length("before"), F.lit(0)) + F.coalesce(F.length("after"), F.lit(0))
    txns = (r.groupBy("thread", "txid")
            .agg(F.min(F.struct("sequence", "rba", "scn", "ts")).alias("start"),
                 F.count(F.lit(1)).alias("records"), F.sum(size).alias("bytes"))
            .join(ends, ["thread", "txid"], "left")
            .join(F.broadcast(skips), ["thread", "txid"], "left"))
    skip_reason = F.coalesce(
        F.col("skip_reason"),
        F.when(F.col("start.scn") < F.lit(decisions.begin_scn), F.lit("in flight at the begin point")))
    already = F.lit(False)
    if decisions.last_written is not None:
        already = _at_or_below([F.col("end.scn"), F.col("thread"), F.col("end.sequence"), F.col("end.rba")],
                               list(decisions.last_written.__dict__.values()))
    ended_earlier = F.lit(False) if decisions.read_scn is None else F.col("end.scn") < F.lit(decisions.read_scn)
    fate = (F.when(F.col("end").isNull(), F.lit(OPEN))
            .when(ended_earlier, F.lit(DONE_EARLIER))
            .when(skip_reason.isNotNull(), F.lit(SKIP))
            .when(F.col("end.op") == "ROLLBACK", F.lit(ROLLED_BACK))
            .when(already, F.lit(ALREADY_WRITTEN))
            .otherwise(F.lit(WRITE)))
    txns = txns.withColumn("skip_reason", skip_reason).withColumn("fate", fate)

    # Records after their transaction ended (or after their savepoint rolled back) break
    # the contract; capture is the only reader that sees every segment in between.
    after_end = (r.join(ends, ["thread", "txid"]).where(position > F.struct("end.sequence", "end.rba"))
                 .select("thread", "sequence", "rba", "file", F.format_string(
                     "record of transaction %s after its %s at sequence %d rba %d",
                     "txid", "end.op", "end.sequence", "end.rba").alias("message")))
    after_rollback = (r.join(sub_rollbacks, ["thread", "xid"]).where(position > F.col("sub_end"))
                      .select("thread", "sequence", "rba", "file", F.format_string(
                          "record of subtransaction %s after its ROLLBACK", "xid").alias("message")))

    written = txns.where(F.col("fate") == WRITE).select(
        "thread", "txid", F.col("end.scn").alias("csn"), F.col("end.sequence").alias("csn_sequence"),
        F.col("end.rba").alias("csn_rba"), F.col("end.ts").alias("commit_ts"))
    kept = (r.where(F.col("op").isin(*contract.DML_OPS) & F.col("table").rlike(table_regex(tables)))
            .join(F.broadcast(sub_rollbacks.select("thread", "xid")), ["thread", "xid"], "left_anti")
            .join(written, ["thread", "txid"]))
    in_txn = Window.partitionBy("thread", "txid")
    ordinal = F.row_number().over(in_txn.orderBy("sequence", "rba"))
    count = F.count(F.lit(1)).over(in_txn)
    trail = (kept.withColumn("n", ordinal).withColumn("of", count)
             .select(
                 F.when(F.col("of") == 1, WHOLE).when(F.col("n") == 1, BEGIN)
                  .when(F.col("n") == F.col("of"), END).otherwise(MIDDLE).cast("byte").alias("trans_ind"),
                 "csn", F.col("thread").cast("int").alias("csn_thread"), "csn_sequence", "csn_rba",
                 F.col("txid").alias("xid"), "commit_ts", "op", "table", "before", "after",
                 F.col("thread").cast("int").alias("src_thread"), F.col("sequence").alias("src_sequence"),
                 F.col("rba").alias("src_rba"), F.col("scn").alias("src_scn"),
                 F.lit(log_bsn).cast("long").alias("log_bsn"))
             .orderBy("csn", "csn_thread", "csn_sequence", "csn_rba", "src_sequence", "src_rba"))
    return Assembly(trail=trail, transactions=txns, violations=after_end.unionByName(after_rollback))
