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

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from trailbound.capture.logread import LogRead, spark_schema, packed, unpacked
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
    # Given a column of a written transaction's file number (from its CSN), the trail
    # records (every column but rba and trans_ind, which the writer adds) with their
    # file_no; in no particular order.
    trail: Callable[[Column], DataFrame]
    transactions: DataFrame   # one row per transaction seen: thread, txid, start, end, fate, ...
    subtransactions: DataFrame  # per subtransaction: thread, txid, xid, rolled_back_at, last (packed positions)
    broken: DataFrame         # non-empty when some record comes after its transaction's end
    violations: Callable[[], DataFrame]  # those records: (thread, sequence, rba, file, message)
    # Per thread read from the log (restored records aside): first and last record
    # (sequence, rba, scn, ts), n records, reread (below read_scn), from_time.
    log_reads: DataFrame
    cached: list[DataFrame]   # what assemble cached: the caller unpersists it after the run


# The roll-up of one transaction's summaries (capture.logread.SUMMARIES), and one row
# per subtransaction (xid set; only thread, txid, xid, rolled_back_at, last_at filled):
# its start and last record, its end (first top-level COMMIT or ROLLBACK; end_committed:
# a COMMIT), its record count and size (bytes), what it puts in the trail (the captured
# records of subtransactions that did not roll back), and what was read of it from the
# log (restored records aside), for the per-thread read checkpoints.
_ROLLED_UP = pa.schema([
    ("thread", pa.int32()), ("txid", pa.string()), ("xid", pa.string()), ("rolled_back_at", pa.int64()),
    ("start_at", pa.int64()), ("start_scn", pa.int64()), ("start_ts", pa.timestamp("us", "UTC")),
    ("last_at", pa.int64()),
    ("end_at", pa.int64()), ("end_scn", pa.int64()), ("end_ts", pa.timestamp("us", "UTC")),
    ("end_committed", pa.bool_()),
    ("records", pa.int64()), ("bytes", pa.int64()), ("kept_records", pa.int64()), ("kept_bytes", pa.int64()),
    ("log_records", pa.int64()), ("log_first_at", pa.int64()), ("log_first_scn", pa.int64()),
    ("log_first_ts", pa.timestamp("us", "UTC")), ("log_last_at", pa.int64()), ("log_last_scn", pa.int64()),
    ("log_last_ts", pa.timestamp("us", "UTC")), ("reread", pa.int64()), ("from_time", pa.timestamp("us", "UTC")),
])
_TRANSACTION = ["thread", "txid"]


def _rolled_up(summaries: pa.Table) -> pa.Table:
    """_ROLLED_UP rows for every transaction of `summaries` (all the rows of each)."""
    def first(table: pa.Table, order: str, columns: list[str], names: list[str], how: str = "first") -> pa.Table:
        table = table.take(pc.sort_indices(table, [(order, "ascending")]))
        rolled = table.group_by(_TRANSACTION, use_threads=False).aggregate([(c, how) for c in columns])
        return rolled.rename_columns(_TRANSACTION + names)

    start = ["start_at", "start_scn", "start_ts"]
    whole = first(summaries, "start_at", start, start)
    whole = whole.join(summaries.group_by(_TRANSACTION, use_threads=False).aggregate(
        [("last_at", "max"), ("records", "sum"), ("bytes", "sum")]).rename_columns(
        _TRANSACTION + ["last_at", "records", "bytes"]), _TRANSACTION)
    ends = summaries.filter(pc.is_valid(summaries["end_at"]))
    end = ["end_at", "end_scn", "end_ts", "end_committed"]
    whole = whole.join(first(ends, "end_at", end, end), _TRANSACTION, join_type="left outer")
    log = summaries.filter(pc.invert(summaries["restored"]))
    whole = whole.join(first(log, "start_at", start, ["log_first_at", "log_first_scn", "log_first_ts"]),
                       _TRANSACTION, join_type="left outer")
    whole = whole.join(first(log, "last_at", ["last_at", "last_scn", "last_ts"],
                             ["log_last_at", "log_last_scn", "log_last_ts"], how="last"), _TRANSACTION,
                       join_type="left outer")
    whole = whole.join(log.group_by(_TRANSACTION, use_threads=False).aggregate(
        [("records", "sum"), ("reread", "sum"), ("from_time", "min")]).rename_columns(
        _TRANSACTION + ["log_records", "reread", "from_time"]), _TRANSACTION, join_type="left outer")
    # Subtransactions (a parent_xid): the first ROLLBACK (a savepoint's) and the last record.
    xids = _TRANSACTION + ["xid"]
    subs = (summaries.filter(pc.not_equal(summaries["xid"], summaries["txid"])).group_by(xids, use_threads=False)
            .aggregate([("rollback_at", "min"), ("last_at", "max")])
            .rename_columns(xids + ["rolled_back_at", "last_at"]))
    rolled_back = subs.filter(pc.is_valid(subs["rolled_back_at"])).select(xids)
    kept = summaries.join(rolled_back, xids, join_type="left anti") if len(rolled_back) else summaries
    whole = whole.join(kept.group_by(_TRANSACTION, use_threads=False).aggregate(
        [("kept_records", "sum"), ("kept_bytes", "sum")]).rename_columns(
        _TRANSACTION + ["kept_records", "kept_bytes"]), _TRANSACTION, join_type="left outer")
    for name in ("kept_records", "kept_bytes", "log_records", "reread"):
        whole = whole.set_column(whole.schema.get_field_index(name), name, pc.fill_null(whole[name], 0))
    whole = whole.append_column("xid", pa.nulls(len(whole), pa.string()))
    whole = whole.append_column("rolled_back_at", pa.nulls(len(whole), pa.int64()))
    both = pa.concat_tables([whole.select(_ROLLED_UP.names).cast(_ROLLED_UP),
                             subs.select(xids + ["rolled_back_at", "last_at"])], promote_options="default")
    return both.select(_ROLLED_UP.names).cast(_ROLLED_UP)


def _roll_up(batches):
    """mapInArrow: the partition's transactions (each wholly in it) rolled up."""
    batches = list(batches)
    if batches:
        for batch in _rolled_up(pa.Table.from_batches(batches)).to_batches(max_chunksize=65_536):
            yield batch


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
    # The reading tasks' summaries (capture.logread: a few rows per xid), shuffled by
    # transaction and rolled up with pyarrow: one row per transaction and one per
    # subtransaction. Everything below works on these rows, never on the records but
    # for the trail's.
    rolled_up = (log.summaries(tables, decisions.read_scn).repartition(*_TRANSACTION)
                 .mapInArrow(_roll_up, spark_schema(_ROLLED_UP)).cache())
    end = F.struct(*unpacked("end_at"), F.col("end_scn").alias("scn"), F.col("end_ts").alias("ts"),
                   F.when(F.col("end_committed"), F.lit("COMMIT")).otherwise(F.lit("ROLLBACK")).alias("op"))
    base = rolled_up.where(F.col("xid").isNull())
    txns = base.select("thread", "txid", _record("start").alias("start"), F.struct(*unpacked("last_at")).alias("last"),
                       F.when(F.col("end_at").isNotNull(), end).alias("end"), "records", "bytes", "kept_records",
                       "kept_bytes")
    # Per subtransaction: its first ROLLBACK and its last record, packed positions.
    subs = rolled_up.where(F.col("xid").isNotNull()).select("thread", "txid", "xid", "rolled_back_at",
                                                            F.col("last_at").alias("last"))
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
    nested_txids = subs.join(sub_xids, ["thread", "txid"], "left_semi")

    def violations() -> DataFrame:
        """The offending records themselves; only computed when a check above fails."""
        r = log.records()
        nested = r.where(F.col("parent_xid").isNotNull()).join(sub_xids, ["thread", "txid"], "left_semi")
        # Hash the transactions' side: the records' size is unknown to the planner (spark.numbered).
        after_end = (r.join(broken_txns.hint("shuffle_hash"), ["thread", "txid"])
                     .where((F.col("sequence") > F.col("end_sequence")) |
                            ((F.col("sequence") == F.col("end_sequence")) & (F.col("rba") > F.col("end_rba"))))
                     .select("thread", "sequence", "rba", "file", F.format_string(
                         "record of transaction %s after its %s at sequence %d rba %d",
                         "txid", "end_op", "end_sequence", "end_rba").alias("message")))
        after_rollback = (r.join(broken_subs.hint("shuffle_hash"), ["thread", "xid"])
                          .where(packed("sequence", "rba") > F.col("rolled_back_at"))
                          .select("thread", "sequence", "rba", "file", F.format_string(
                              "record of subtransaction %s after its ROLLBACK", "xid").alias("message")))
        nested_parent = nested.select("thread", "sequence", "rba", "file", F.format_string(
            "parent_xid %s of %s names a subtransaction, not a top-level transaction", "parent_xid", "xid")
            .alias("message"))
        return after_end.unionByName(after_rollback).unionByName(nested_parent)

    sub_rollbacks = subs.where(F.col("rolled_back_at").isNotNull()).select("thread", "xid")
    written = txns.where((F.col("fate") == WRITE) & (F.col("kept_records") > 0)).select(
        "thread", "txid", F.col("end.scn").alias("csn"),
        F.when(F.col("forced"), F.lit(0)).otherwise(F.col("thread")).cast("int").alias("csn_thread"),
        F.when(F.col("forced"), F.lit(0)).otherwise(F.col("end.sequence")).alias("csn_sequence"),
        F.col("end.rba").alias("csn_rba"), F.col("end.ts").alias("commit_ts"), F.col("kept_records").alias("records"),
        F.col("kept_bytes").alias("bytes"))
    kept = (log.records(captured=tables, columns=_KEPT_COLUMNS)
            .join(F.broadcast(sub_rollbacks.select("thread", "xid")), ["thread", "xid"], "left_anti"))

    def trail(file_number: Column) -> DataFrame:
        trail_columns = ("csn", "csn_thread", "csn_sequence", "csn_rba", "xid", "commit_ts", "op", "table",
                         "before", "after", "src_thread", "src_sequence", "src_rba", "src_scn", "log_bsn")
        planned = written.select("thread", "txid", *CSN_COLUMNS, "commit_ts", file_number.alias("file_no"))
        # A hash join on the transactions' side: a sort-merge join would sort the records
        # by transaction only for the writer to sort them again by file and commit order.
        return (kept.join(planned.hint("shuffle_hash"), ["thread", "txid"])
                .select(*CSN_COLUMNS, F.col("txid").alias("xid"), "commit_ts", "op", "table", "before", "after",
                        F.col("thread").cast("int").alias("src_thread"), F.col("sequence").alias("src_sequence"),
                        F.col("rba").alias("src_rba"), F.col("scn").alias("src_scn"),
                        F.lit(log_bsn.value).cast("long").alias("log_bsn"), "file_no")
                .select(*trail_columns, "file_no"))

    # Per thread, what the run read from the log (restored records aside): the read checkpoints.
    log_reads = (base.where(F.col("log_records") > 0).groupBy("thread")
                 .agg(*_earliest("log_first", "scn", "ts"), *_latest("log_last", "scn", "ts"),
                      F.sum("log_records").alias("n"), F.sum("reread").alias("reread"),
                      F.min("from_time").alias("from_time"))
                 .select("thread", "n", "reread", "from_time", _record("log_first").alias("first"),
                         _record("log_last").alias("last")))
    return Assembly(written=written, trail=trail, transactions=txns, subtransactions=subs,
                    broken=broken_txns.select("thread").unionByName(broken_subs.select("thread"))
                    .unionByName(nested_txids.select("thread")), violations=violations, log_reads=log_reads,
                    cached=[rolled_up])
