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
from trailbound.durable import atomic_write, file_sha256
from trailbound.positions import LogPosition, Scn

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


def restore(spark: SparkSession, restored: list[ckpt.OpenTransaction]) -> DataFrame | None:
    """The persisted transactions' records, as a records DataFrame."""
    from trailbound.archive.reader import RECORD_COLUMNS

    if not restored:
        return None
    paths = [str(t.persisted.file) for t in restored]
    return spark.read.parquet(*paths).select(*RECORD_COLUMNS)


def persist(records: DataFrame, keys: list[tuple[int, str]], directory: Path, checkpoint_scn: Scn,
            spark: SparkSession) -> dict[tuple[int, str], ckpt.PersistedObject]:
    """Write each listed transaction's records (all it has so far) to its own file.
    Files are written completely (temporary name, fsync, rename, fsync the directory) before the BR
    checkpoint that names them commits; until then the previous checkpoint stays valid."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from trailbound.archive.reader import RECORD_COLUMNS

    if not keys:
        return {}
    directory.mkdir(parents=True, exist_ok=True)
    wanted = spark.createDataFrame(keys, "thread int, txid string")
    table = (records.withColumn("txid", F.coalesce("parent_xid", "xid"))
             .join(F.broadcast(wanted), ["thread", "txid"])
             .orderBy("thread", "txid", "sequence", "rba")
             .select("txid", *RECORD_COLUMNS).toArrow())
    persisted = {}
    for thread, txid in keys:
        if persisted:
            crashpoint("mid_br_persist")  # some files of this checkpoint written, not all
        mask = pc.and_(pc.equal(table["thread"], pa.scalar(thread, table["thread"].type)),
                       pc.equal(table["txid"], txid))
        rows = table.filter(mask).drop_columns(["txid"])
        path = directory / object_name(thread, txid, checkpoint_scn)
        atomic_write(path, lambda temporary: pq.write_table(rows, temporary, compression="zstd"))
        last = rows.slice(len(rows) - 1).to_pylist()[0]
        persisted[(thread, txid)] = ckpt.PersistedObject(path, file_sha256(path), len(rows),
                                                         LogPosition(thread, last["sequence"], last["rba"]),
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
