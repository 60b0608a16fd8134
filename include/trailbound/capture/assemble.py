"""Transaction assembly: redo records in, commit-ordered trail records out.

A pure transform (DataFrames in, DataFrames out, no I/O), so it is tested on its own.
Given the records a run reads and what earlier runs decided, it:

- groups records by top-level transaction (a subtransaction's records belong to its
  parent_xid) within a thread;
- drops rolled-back transactions and rolled-back subtransactions (savepoints);
- leaves alone transactions that ended below `read_scn`: earlier runs decided them;
- never writes a transaction marked skip (in flight at the begin point, skiptrans);
- gives each newly committed transaction's captured-table records with its CSN, and
  each such transaction's record count and size (capture.trailwrite cuts them into
  files, orders them and marks their transaction indicators);
- reports the transactions still open (their start is the recovery position).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from trailbound.archive import contract
from trailbound.positions import CSN_COLUMNS, Csn, Scn, csn_at_or_below
from trailbound.tables import java_regex
from trailbound.trail.format import FIXED_ROW_BYTES

OPEN, WRITE, SKIP, DONE_EARLIER, ROLLED_BACK, ALREADY_WRITTEN = (
    "open", "write", "skip", "done earlier", "rolled back", "already written")

_SKIPS = T.StructType([T.StructField("thread", T.IntegerType()), T.StructField("txid", T.StringType()),
                       T.StructField("skip_reason", T.StringType())])


@dataclass(frozen=True)
class Decisions:
    """What earlier runs left for this one."""

    read_scn: Scn | None               # everything below was read before (None: first run)
    begin_scn: Scn                     # transactions starting below it are never written
    last_written: Csn | None           # the write checkpoint's last CSN
    skips: list[tuple[int, str, str]]  # (thread, xid, reason) never to be written
    forced: list[tuple[int, str, int]] = ()  # (thread, xid, k): FORCETRANS, commit it now as the k-th
    horizon_scn: Scn = Scn(0)          # this run reads below it; forced commits sort at it
    read_time: datetime | None = None  # the log time of the horizon: a forced commit's time


@dataclass
class Assembly:
    # The transactions to write that have records for the trail: thread, txid, the CSN
    # columns, commit_ts, records, bytes (their size as trail.format counts it).
    written: DataFrame
    # Given `written` with a file_no per transaction, the trail records (every column but
    # rba and trans_ind, which the writer adds) with their file_no; in no particular order.
    trail: Callable[[DataFrame], DataFrame]
    transactions: DataFrame   # one row per transaction seen: thread, txid, start, end, fate, ...
    subtransactions: DataFrame  # one row per subtransaction: thread, xid, rolled_back_at, last (worth caching)
    broken: DataFrame         # non-empty when some record comes after its transaction's end
    violations: Callable[[], DataFrame]  # those records: (thread, sequence, rba, file, message)
    cached: list[DataFrame]   # what assemble cached: the caller unpersists it after the run


def assemble(spark: SparkSession, records: DataFrame, decisions: Decisions, tables: list[str],
             log_bsn: Scn) -> Assembly:
    r = records.withColumn("txid", F.coalesce("parent_xid", "xid"))
    position = F.struct("sequence", "rba")

    top_level_end = F.col("op").isin(*contract.END_OPS) & F.col("parent_xid").isNull()
    size = F.coalesce(F.length("before"), F.lit(0)) + F.coalesce(F.length("after"), F.lit(0))
    captured = F.col("op").isin(*contract.DML_OPS) & F.col("table").rlike(java_regex(tables))
    # A trail record's size (trail.format.FIXED_ROW_BYTES plus its strings' bytes): what
    # rollover counts. The xid column holds the top-level transaction id.
    row_bytes = F.lit(FIXED_ROW_BYTES) + sum(F.coalesce(F.octet_length(c), F.lit(0))
                                              for c in ("txid", "op", "table", "before", "after"))
    # The one pass over every record: per (sub)transaction id, its start, its end (first
    # top-level COMMIT or ROLLBACK), its last record (which must not come after the end),
    # its first ROLLBACK (a subtransaction's savepoint rollback) and the size of what it
    # would put in the trail. Everything per transaction is rolled up from these rows,
    # one per xid: a few per transaction, not one per record.
    per_xid = (r.groupBy("thread", "txid", "xid")
               .agg(F.min(F.struct("sequence", "rba", "scn", "ts")).alias("start"),
                    F.max(position).alias("last"),
                    F.min(F.when(top_level_end, F.struct("sequence", "rba", "scn", "ts", "op"))).alias("end"),
                    F.count(F.lit(1)).alias("records"), F.sum(size).alias("bytes"),
                    F.min(F.when(F.col("op") == "ROLLBACK", position)).alias("rolled_back_at"),
                    F.sum(F.when(captured, 1).otherwise(0)).alias("kept_records"),
                    F.sum(F.when(captured, row_bytes).otherwise(0)).alias("kept_bytes"))
               .cache())
    is_sub = F.col("xid") != F.col("txid")  # a record with a parent_xid (one naming itself is refused earlier)
    txns = (per_xid.groupBy("thread", "txid")
            .agg(F.min("start").alias("start"), F.max("last").alias("last"), F.min("end").alias("end"),
                 F.sum("records").alias("records"), F.sum("bytes").alias("bytes")))
    subs = per_xid.where(is_sub).select("thread", "xid", "rolled_back_at", "last")
    skips = spark.createDataFrame(decisions.skips, _SKIPS)
    txns = txns.join(F.broadcast(skips), ["thread", "txid"], "left")
    # FORCETRANS: an open transaction is committed now, at CSN horizon@0:0:k, after every
    # real commit of this run (all below the horizon) and before any later one.
    forced = spark.createDataFrame(list(decisions.forced), "thread int, txid string, force_k long")
    txns = txns.join(F.broadcast(forced), ["thread", "txid"], "left")
    is_forced = F.col("end").isNull() & F.col("force_k").isNotNull()
    forced_end = F.struct(F.lit(0).cast("long").alias("sequence"), F.col("force_k").alias("rba"),
                          F.lit(decisions.horizon_scn.value).cast("long").alias("scn"),
                          F.lit(decisions.read_time).cast("timestamp").alias("ts"), F.lit("COMMIT").alias("op"))
    txns = (txns.withColumn("forced", is_forced)
            .withColumn("end", F.when(is_forced, forced_end).otherwise(F.col("end"))))
    skip_reason = F.coalesce(
        F.col("skip_reason"),
        F.when(F.col("start.scn") < F.lit(decisions.begin_scn.value), F.lit("in flight at the begin point")))
    already = F.lit(False)
    if decisions.last_written is not None:
        already = csn_at_or_below([F.col("end.scn"), F.col("thread"), F.col("end.sequence"), F.col("end.rba")],
                                  decisions.last_written)
    ended_earlier = (F.lit(False) if decisions.read_scn is None
                     else F.col("end.scn") < F.lit(decisions.read_scn.value))
    fate = (F.when(F.col("end").isNull(), F.lit(OPEN))
            .when(ended_earlier, F.lit(DONE_EARLIER))
            .when(skip_reason.isNotNull(), F.lit(SKIP))
            .when(F.col("end.op") == "ROLLBACK", F.lit(ROLLED_BACK))
            .when(already, F.lit(ALREADY_WRITTEN))
            .otherwise(F.lit(WRITE)))
    txns = txns.withColumn("skip_reason", skip_reason).withColumn("fate", fate)

    # Records after their transaction ended (or after their savepoint rolled back) break
    # the contract; capture is the only reader that sees every segment in between.
    end_position = F.struct(F.col("end.sequence").alias("sequence"), F.col("end.rba").alias("rba"))
    broken_txns = txns.where(F.col("end").isNotNull() & ~F.col("forced") & (F.col("last") > end_position)).select(
        "thread", "txid", F.col("end.sequence").alias("end_sequence"), F.col("end.rba").alias("end_rba"),
        F.col("end.op").alias("end_op"))
    broken_subs = subs.where(F.col("last") > F.col("rolled_back_at")).select("thread", "xid", "rolled_back_at")
    # A parent_xid naming a subtransaction would make that subtransaction a transaction
    # of its own that never ends (an open transaction pinning recovery and retention).
    sub_xids = subs.select("thread", F.col("xid").alias("txid"))
    nested = r.where(F.col("parent_xid").isNotNull()).join(sub_xids, ["thread", "txid"], "left_semi")
    nested_txids = per_xid.where(is_sub).join(sub_xids, ["thread", "txid"], "left_semi")

    def violations() -> DataFrame:
        """The offending records themselves; only computed when a check above fails."""
        after_end = (r.join(broken_txns, ["thread", "txid"])
                     .where((F.col("sequence") > F.col("end_sequence")) |
                            ((F.col("sequence") == F.col("end_sequence")) & (F.col("rba") > F.col("end_rba"))))
                     .select("thread", "sequence", "rba", "file", F.format_string(
                         "record of transaction %s after its %s at sequence %d rba %d",
                         "txid", "end_op", "end_sequence", "end_rba").alias("message")))
        after_rollback = (r.join(broken_subs, ["thread", "xid"]).where(position > F.col("rolled_back_at"))
                          .select("thread", "sequence", "rba", "file", F.format_string(
                              "record of subtransaction %s after its ROLLBACK", "xid").alias("message")))
        nested_parent = nested.select("thread", "sequence", "rba", "file", F.format_string(
            "parent_xid %s of %s names a subtransaction, not a top-level transaction", "parent_xid", "xid")
            .alias("message"))
        return after_end.unionByName(after_rollback).unionByName(nested_parent)

    sub_rollbacks = subs.where(F.col("rolled_back_at").isNotNull()).select("thread", "xid")
    written = txns.where(F.col("fate") == WRITE).select(
        "thread", "txid", F.col("end.scn").alias("csn"),
        F.when(F.col("forced"), F.lit(0)).otherwise(F.col("thread")).cast("int").alias("csn_thread"),
        F.when(F.col("forced"), F.lit(0)).otherwise(F.col("end.sequence")).alias("csn_sequence"),
        F.col("end.rba").alias("csn_rba"), F.col("end.ts").alias("commit_ts"))
    kept = r.where(captured).join(F.broadcast(sub_rollbacks.select("thread", "xid")), ["thread", "xid"], "left_anti")
    sizes = (per_xid.join(F.broadcast(sub_rollbacks), ["thread", "xid"], "left_anti")
             .groupBy("thread", "txid").agg(F.sum("kept_records").alias("records"), F.sum("kept_bytes").alias("bytes"))
             .where(F.col("records") > 0))

    def trail(planned: DataFrame) -> DataFrame:
        trail_columns = ("csn", "csn_thread", "csn_sequence", "csn_rba", "xid", "commit_ts", "op", "table",
                         "before", "after", "src_thread", "src_sequence", "src_rba", "src_scn", "log_bsn")
        return (kept.join(planned.select("thread", "txid", *CSN_COLUMNS, "commit_ts", "file_no"), ["thread", "txid"])
                .select(*CSN_COLUMNS, F.col("txid").alias("xid"), "commit_ts", "op", "table", "before", "after",
                        F.col("thread").cast("int").alias("src_thread"), F.col("sequence").alias("src_sequence"),
                        F.col("rba").alias("src_rba"), F.col("scn").alias("src_scn"),
                        F.lit(log_bsn.value).cast("long").alias("log_bsn"), "file_no")
                .select(*trail_columns, "file_no"))

    return Assembly(written=written.join(sizes, ["thread", "txid"]), trail=trail, transactions=txns, subtransactions=subs,
                    broken=broken_txns.select("thread").unionByName(broken_subs.select("thread"))
                    .unionByName(nested_txids.select("thread")), violations=violations, cached=[per_xid])
