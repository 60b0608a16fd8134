"""Transaction assembly: redo records in, commit-ordered trail records out.

A transform of DataFrames: the records a run reads come from capture.logread (its
per-transaction summaries, and its records for the trail), and nothing here writes.
Given them and what earlier runs decided, it:

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

from trailbound.capture.logread import LogRead, packed, unpacked
from trailbound.positions import CSN_COLUMNS, Csn, Scn, csn_at_or_below

OPEN, WRITE, SKIP, DONE_EARLIER, ROLLED_BACK, ALREADY_WRITTEN = (
    "open", "write", "skip", "done earlier", "rolled back", "already written")

# What the trail write needs of a captured record.
_KEPT_COLUMNS = ("thread", "txid", "xid", "sequence", "rba", "scn", "op", "table", "before", "after")
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
    subtransactions: DataFrame  # per subtransaction: thread, xid, rolled_back_at, last (packed; worth caching)
    broken: DataFrame         # non-empty when some record comes after its transaction's end
    violations: Callable[[], DataFrame]  # those records: (thread, sequence, rba, file, message)
    # Per thread read from the log (restored records aside): first and last record
    # (sequence, rba, scn, ts), n records, reread (below read_scn), from_time.
    log_reads: DataFrame
    cached: list[DataFrame]   # what assemble cached: the caller unpersists it after the run


def _earliest(prefix: str, *fields: str) -> list:
    """Aggregates: the least `<prefix>_at` (a packed position) and the `fields` there."""
    at = f"{prefix}_at"
    return [F.min(at).alias(at)] + [F.min_by(f"{prefix}_{f}", at).alias(f"{prefix}_{f}") for f in fields]


def _latest(prefix: str, *fields: str) -> list:
    at = f"{prefix}_at"
    return [F.max(at).alias(at)] + [F.max_by(f"{prefix}_{f}", at).alias(f"{prefix}_{f}") for f in fields]


def _record(prefix: str):
    """A struct (sequence, rba, scn, ts) of the record at `<prefix>_at`."""
    return F.struct(*unpacked(f"{prefix}_at"), F.col(f"{prefix}_scn").alias("scn"), F.col(f"{prefix}_ts").alias("ts"))


def assemble(spark: SparkSession, log: LogRead, decisions: Decisions, tables: list[str], log_bsn: Scn) -> Assembly:
    # Per (sub)transaction id, merged from the reading tasks' summaries (capture.logread):
    # its start, its last record (which must not come after the end), its end (first
    # top-level COMMIT or ROLLBACK), its first ROLLBACK (a subtransaction's savepoint
    # rollback), and the size of what it would put in the trail. Everything per
    # transaction is rolled up from these rows, one per xid (and per restored or read
    # from the log): a few per transaction, not one per record. Positions are packed
    # longs, so every aggregate here hashes (a struct's min would sort its input).
    per_xid = (log.summaries(tables, decisions.read_scn).groupBy("thread", "txid", "xid", "restored")
               .agg(*_earliest("start", "scn", "ts"), *_latest("last", "scn", "ts"),
                    *_earliest("end", "scn", "ts", "committed"), F.min("rollback_at").alias("rollback_at"),
                    *[F.sum(c).alias(c) for c in ("records", "bytes", "kept_records", "kept_bytes", "reread")],
                    F.min("from_time").alias("from_time"))
               .cache())
    is_sub = F.col("xid") != F.col("txid")  # a record with a parent_xid (one naming itself is refused earlier)
    end = F.struct(*unpacked("end_at"), F.col("end_scn").alias("scn"), F.col("end_ts").alias("ts"),
                   F.when(F.col("end_committed"), F.lit("COMMIT")).otherwise(F.lit("ROLLBACK")).alias("op"))
    txns = (per_xid.groupBy("thread", "txid")
            .agg(*_earliest("start", "scn", "ts"), F.max("last_at").alias("last_at"),
                 *_earliest("end", "scn", "ts", "committed"), F.sum("records").alias("records"),
                 F.sum("bytes").alias("bytes"))
            .select("thread", "txid", _record("start").alias("start"), F.struct(*unpacked("last_at")).alias("last"),
                    F.when(F.col("end_at").isNotNull(), end).alias("end"), "records", "bytes"))
    # Per subtransaction: its first ROLLBACK and its last record, packed positions.
    subs = (per_xid.where(is_sub).groupBy("thread", "xid")
            .agg(F.min("rollback_at").alias("rolled_back_at"), F.max("last_at").alias("last")))
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
    nested_txids = per_xid.where(is_sub).join(sub_xids, ["thread", "txid"], "left_semi")

    def violations() -> DataFrame:
        """The offending records themselves; only computed when a check above fails."""
        r = log.records()
        nested = r.where(F.col("parent_xid").isNotNull()).join(sub_xids, ["thread", "txid"], "left_semi")
        after_end = (r.join(broken_txns, ["thread", "txid"])
                     .where((F.col("sequence") > F.col("end_sequence")) |
                            ((F.col("sequence") == F.col("end_sequence")) & (F.col("rba") > F.col("end_rba"))))
                     .select("thread", "sequence", "rba", "file", F.format_string(
                         "record of transaction %s after its %s at sequence %d rba %d",
                         "txid", "end_op", "end_sequence", "end_rba").alias("message")))
        after_rollback = (r.join(broken_subs, ["thread", "xid"])
                          .where(packed("sequence", "rba") > F.col("rolled_back_at"))
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
    kept = (log.records(captured=tables, columns=_KEPT_COLUMNS)
            .join(F.broadcast(sub_rollbacks.select("thread", "xid")), ["thread", "xid"], "left_anti"))
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

    # Per thread, what the run read from the log (restored records aside): the read checkpoints.
    log_reads = (per_xid.where(~F.col("restored")).groupBy("thread")
                 .agg(*_earliest("start", "scn", "ts"), *_latest("last", "scn", "ts"), F.sum("records").alias("n"),
                      F.sum("reread").alias("reread"), F.min("from_time").alias("from_time"))
                 .select("thread", "n", "reread", "from_time", _record("start").alias("first"),
                         _record("last").alias("last")))
    return Assembly(written=written.join(sizes, ["thread", "txid"]), trail=trail, transactions=txns, subtransactions=subs,
                    broken=broken_txns.select("thread").unionByName(broken_subs.select("thread"))
                    .unionByName(nested_txids.select("thread")), violations=violations, log_reads=log_reads,
                    cached=[per_xid])
