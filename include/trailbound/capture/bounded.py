"""Bounded Recovery's files: persisted long-running transactions and BR boundaries. The
choice between bounded and normal recovery for a run is capture.recovery's.

Every capture run is a restart. Without BR it re-reads each thread from the start of
its oldest open transaction; with BR, transactions open longer than one BR interval at
a BR checkpoint are persisted (one file per transaction under BRDIR/<group>/, named by
a hash of the xid), and a run re-reads only from
    min(oldest open transaction that is not persisted, the last BR checkpoint),
restoring the persisted ones from their files. Whatever the age of the oldest open
transaction, that is at most two BR intervals of log (docs/bounded-recovery.md).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from trailbound.capture import checkpoints as ckpt
from trailbound.crash import crashpoint
from trailbound.durable import file_sha256, publish, temporary_path
from trailbound.positions import LogPosition, Scn
from trailbound.spark import parallelism

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Spark and Arrow are imported where files are written or read, not here: INFO and
# retention use this module's names and checks and should not start up Spark's modules.

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

CRASH_POINTS = ("mid_br_persist",)


def group_directory(brdir: Path, group: str) -> Path:
    # Group names are validated identifiers (a letter, then letters, digits, _): safe as a
    # path component. Xids are never used in a path without hashing.
    return brdir / group.upper()


def object_name(thread: int, xid: str, checkpoint_scn: Scn) -> str:
    digest = hashlib.sha256(f"{thread}\x00{xid}".encode("utf-8")).hexdigest()[:40]
    return f"{digest}.{checkpoint_scn}.parquet"


def crosses_boundary(previous: datetime | None, current: datetime, interval: timedelta) -> bool:
    """Whether the log time read moved past a BR boundary (a multiple of the interval
    since the Unix epoch, so every run of every backfill sees the same boundaries)."""
    if previous is None:
        return (current - _EPOCH) // interval > 0
    return (current - _EPOCH) // interval > (previous - _EPOCH) // interval


def fault(persisted: ckpt.PersistedObject) -> str | None:
    """Why a persisted object cannot be restored (its file missing or changed), or None."""
    path = persisted.file
    if not path.is_file():
        return f"persisted file {path} is missing"
    if file_sha256(path) != persisted.sha256:
        return f"persisted file {path} is corrupt (sha256 differs)"
    return None


def persist(records: DataFrame, keys: list[tuple[int, str]], directory: Path, checkpoint_scn: Scn,
            spark: SparkSession) -> dict[tuple[int, str], ckpt.PersistedObject]:
    """Write each listed transaction's records (all it has so far) to its own file, from
    Spark tasks: the records never pass through the driver, which gets one row per file
    and checks that it sees each file as its task wrote it (SHA-256). Files are written
    completely (temporary name, fsync, rename, fsync the directory) before the BR
    checkpoint that names them commits; until then the previous checkpoint stays valid."""
    from pyspark.sql import functions as F

    from trailbound.archive.reader import RECORD_COLUMNS
    from trailbound.errors import TrailboundError

    if not keys:
        return {}
    directory.mkdir(parents=True, exist_ok=True)
    location, scn = str(directory), checkpoint_scn.value

    def write(batches):
        """Each transaction's records streamed into its file as Spark's batches come (a
        Parquet row group each): a task holds one batch, never a whole transaction."""

        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([("thread", pa.int32()), ("txid", pa.string()), ("path", pa.string()),
                            ("sha256", pa.string()), ("records", pa.int64()), ("last_sequence", pa.int64()),
                            ("last_rba", pa.int64())])
        current: dict | None = None  # the transaction being written: its key, file, writer, count, last record

        def start(thread: int, txid: str, columns: pa.Schema) -> dict:
            path = Path(location) / object_name(thread, txid, Scn(scn))
            temporary = temporary_path(path)
            return {"key": (thread, txid), "path": path, "temporary": temporary, "records": 0, "last": None,
                    "writer": pq.ParquetWriter(temporary, columns, compression="zstd")}

        def finish(done: dict):
            # The whole file on disk before its name appears.
            done["writer"].close()
            publish(done["path"])
            thread, txid = done["key"]
            return pa.RecordBatch.from_pylist([{
                "thread": thread, "txid": txid, "path": str(done["path"]), "sha256": file_sha256(done["path"]),
                "records": done["records"], "last_sequence": done["last"]["sequence"],
                "last_rba": done["last"]["rba"]}], schema=schema)

        for batch in batches:
            threads = batch.column("thread").to_numpy(zero_copy_only=False)
            txids = np.asarray(batch.column("txid").to_pylist(), dtype=object)
            cuts = np.flatnonzero((threads[1:] != threads[:-1]) | (txids[1:] != txids[:-1])) + 1
            for first, stop in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(batch)]])):
                key = (int(threads[first]), str(txids[first]))
                if current is not None and key != current["key"]:
                    yield finish(current)
                    crashpoint("mid_br_persist")  # some files of this checkpoint written, not all
                    current = None
                rows = pa.Table.from_batches([batch.slice(first, stop - first)]).drop_columns(["txid"])
                if current is None:
                    current = start(*key, rows.schema)
                current["writer"].write_table(rows)
                current["records"] += len(rows)
                current["last"] = rows.slice(len(rows) - 1).to_pylist()[0]
        if current is not None:
            yield finish(current)

    wanted = spark.createDataFrame(keys, "thread int, txid string")
    tasks = max(1, min(len(keys), 2 * parallelism(spark)))
    try:
        written = (records.withColumn("txid", F.coalesce("parent_xid", "xid"))
                   .join(F.broadcast(wanted), ["thread", "txid"])
                   .repartition(tasks, "thread", "txid")
                   .sortWithinPartitions("thread", "txid", "sequence", "rba")
                   .select("txid", *RECORD_COLUMNS)
                   .mapInArrow(write, "thread int, txid string, path string, sha256 string, records long,"
                                      " last_sequence long, last_rba long")
                   .collect())
    finally:
        crashpoint("mid_br_persist")  # a task killed half-way kills the run with it
    persisted, asked = {}, set(keys)
    for row in written:
        key, path = (row["thread"], row["txid"]), Path(row["path"])
        if key in persisted or key not in asked:
            raise TrailboundError(f"{path}: persisted object written twice or not asked for")
        if not path.is_file() or file_sha256(path) != row["sha256"]:
            raise TrailboundError(f"{path}: written by a Spark task, but the driver does not see that file (missing "
                                  "or different); the BR directory must be shared by every node and the driver")
        persisted[key] = ckpt.PersistedObject(path, row["sha256"], row["records"],
                                              LogPosition(row["thread"], row["last_sequence"], row["last_rba"]),
                                              checkpoint_scn)
    return persisted


def remove_stale_files(directory: Path, keep: set[Path]) -> list[Path]:
    """After a run commits: remove every persisted file no open transaction refers to
    (superseded objects, transactions that ended, leftovers of a run that died)."""
    removed = []
    if directory.is_dir():
        for path in directory.iterdir():
            if path not in keep:
                path.unlink()
                removed.append(path)
    return removed
