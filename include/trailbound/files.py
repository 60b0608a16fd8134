"""The one file-system layer: every file the engine keeps (redo archive, trail files, the
Bounded Recovery directory, Spark's staging output) is opened, listed, renamed, deleted
and verified here, at a local path or at a Hadoop-compatible URI.

A location is text: a plain path or `file://` URI (the local filesystem, through
Python), or any other URI Spark's Hadoop FileSystem can write (`s3a://bucket/dirdat/rt`,
`hdfs://nn/dirdat/rt`, `viewfs://...`), reached through `spark._jvm`. The SparkSession is
always passed in; nothing here creates one, and local files need none.

Bulk bytes never cross the Python/JVM bridge (py4j moves a few MB/s): uploads, downloads
and checksums of a Hadoop file run inside the JVM.

No silent loss: a writer states what it wrote (`WrittenFile`: records, bytes, SHA-256)
and the process that commits a checkpoint over the file checks it through its own view
(`verify_written`) first. On a cluster, the file a Spark executor wrote to a local path
exists on that executor's machine only; the driver would otherwise commit over a file
it cannot see. `write_dataset` is how Spark's executors write files the driver then
reads: each task reports its file, the driver verifies every one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlsplit

from trailbound.durable import CHUNK as _CHUNK
from trailbound.durable import file_sha256, fsync_directory
from trailbound.errors import TrailboundError, TrailError

PARQUET = ".parquet"


# ---------------------------------------------------------------- locations (pure text)

def is_local(location: str) -> bool:
    """A plain path or a file: URI. (A one-letter "scheme" is a Windows drive, not a URI.)"""
    scheme = urlsplit(str(location)).scheme
    return len(scheme) <= 1 or scheme.lower() == "file"


def local_path(location: str) -> Path:
    """The filesystem path of a local location (a plain path or a file: URI)."""
    text = str(location)
    parts = urlsplit(text)
    if len(parts.scheme) > 1 and parts.scheme.lower() == "file":
        if parts.netloc not in ("", "localhost"):
            raise TrailboundError(f"{text}: a file: URI names a path on this machine, not on {parts.netloc}")
        return Path(unquote(parts.path))
    return Path(text)


def split(location: str) -> tuple[str, str]:
    """(directory, file name) of a location."""
    text = str(location)
    if is_local(text):
        path = local_path(text)
        return str(path.parent), path.name
    parent, _, name = text.rstrip("/").rpartition("/")
    if parent.endswith(":/") or parent.count("/") == 2 and "://" in parent:  # scheme://authority
        parent += "/"
    return parent, name


def file_location(prefix: str, seqno: int) -> str:
    """The location of trail file `seqno` of the trail at `prefix` (like format.trail_path)."""
    return f"{prefix}{seqno:09d}"


def temporary_location(location: str) -> str:
    """Where a file is written before it is verified and renamed into place: a hidden
    name in the same directory (a rename never crosses filesystems or buckets)."""
    parent, name = split(location)
    return f"{parent.rstrip('/')}/.{name}.tmp" if not is_local(location) else str(Path(parent) / f".{name}.tmp")


def seqno_of(prefix_name: str, file_name: str) -> int | None:
    """The seqno of `file_name` if it is a file of the trail named `prefix_name`."""
    rest = file_name[len(prefix_name):] if file_name.startswith(prefix_name) else ""
    return int(rest) if len(rest) == 9 and rest.isdigit() else None


# ---------------------------------------------------------------- filesystems

class LocalFS:
    """Files on this machine's filesystem."""

    def read_bytes(self, location: str) -> bytes:
        try:
            return local_path(location).read_bytes()
        except OSError as exc:
            raise TrailError(location, f"cannot read: {exc.strerror}") from None

    def download(self, location: str, destination: Path) -> None:
        try:
            shutil.copyfile(local_path(location), destination)
        except OSError as exc:
            raise TrailError(location, f"cannot read: {exc.strerror}") from None

    def upload(self, source: Path, location: str, *, on_chunk: Callable[[], None] | None = None) -> None:
        """Copy a local file to `location`, durably (fsync). `on_chunk` runs after each
        chunk is written, so a test can kill the copy half-way."""
        target = local_path(location)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(source, "rb") as reader, open(target, "wb") as writer:
                while chunk := reader.read(_CHUNK):
                    writer.write(chunk)
                    writer.flush()
                    if on_chunk is not None:
                        on_chunk()
                os.fsync(writer.fileno())
        except OSError as exc:
            raise TrailError(location, f"cannot write: {exc.strerror}") from None

    def sha256(self, location: str) -> str:
        try:
            return file_sha256(local_path(location))
        except OSError as exc:
            raise TrailError(location, f"cannot read: {exc.strerror}") from None

    def size(self, location: str) -> int:
        return local_path(location).stat().st_size

    def exists(self, location: str) -> bool:
        return local_path(location).exists()

    def rename(self, source: str, target: str) -> None:
        """Replace `target` with `source` atomically, and make the rename durable."""
        os.replace(local_path(source), local_path(target))
        fsync_directory(local_path(target).parent)

    def delete(self, location: str) -> bool:
        """False when there was nothing to delete."""
        try:
            local_path(location).unlink()
            return True
        except FileNotFoundError:
            return False

    def list_names(self, directory: str) -> list[str]:
        path = local_path(directory)
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


class HadoopFS:
    """Files behind a Hadoop FileSystem URI (s3a://, hdfs://, ...), through the
    JVM of the SparkSession passed in; the session's Hadoop configuration (credentials,
    endpoints, `spark.hadoop.*`) applies."""

    def __init__(self, spark):
        self._jvm = spark._jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def _fs(self, location: str):
        path = self._jvm.org.apache.hadoop.fs.Path(str(location))
        return path.getFileSystem(self._conf), path

    def _call(self, location: str, what: str, action):
        from py4j.protocol import Py4JJavaError

        try:
            return action()
        except Py4JJavaError as exc:
            java = exc.java_exception
            raise TrailError(location, f"cannot {what}: {java.getClass().getName()}: {java.getMessage()}") from None

    def read_bytes(self, location: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="trailbound-read-") as scratch:
            copy = Path(scratch) / "file"
            self.download(location, copy)
            return copy.read_bytes()

    def download(self, location: str, destination: Path) -> None:
        def copy():
            fs, path = self._fs(location)
            local = self._jvm.org.apache.hadoop.fs.Path(destination.resolve().as_uri())
            fs.copyToLocalFile(False, path, local, True)  # raw local filesystem: no .crc beside it
        self._call(location, "read", copy)

    def upload(self, source: Path, location: str, *, on_chunk: Callable[[], None] | None = None) -> None:
        def copy():
            fs, path = self._fs(location)
            fs.copyFromLocalFile(False, True, self._jvm.org.apache.hadoop.fs.Path(source.resolve().as_uri()), path)
        self._call(location, "write", copy)
        if on_chunk is not None:
            on_chunk()

    def sha256(self, location: str) -> str:
        def digest():
            fs, path = self._fs(location)
            stream = fs.open(path)
            try:
                return self._jvm.org.apache.commons.codec.digest.DigestUtils.sha256Hex(stream)
            finally:
                stream.close()
        return self._call(location, "read", digest)

    def size(self, location: str) -> int:
        def length():
            fs, path = self._fs(location)
            return fs.getFileStatus(path).getLen()
        return self._call(location, "stat", length)

    def exists(self, location: str) -> bool:
        def exists():
            fs, path = self._fs(location)
            return fs.exists(path)
        return self._call(location, "stat", exists)

    def rename(self, source: str, target: str) -> None:
        """Replace `target` with `source`. Atomic on HDFS; on object stores a copy and a
        delete, which is why only a committed checkpoint makes the file part of the trail."""
        def rename():
            fs, src = self._fs(source)
            _, dst = self._fs(target)
            if fs.exists(dst):
                fs.delete(dst, False)
            return fs.rename(src, dst)
        if not self._call(target, "rename into place", rename):
            raise TrailError(target, f"cannot rename {source} into place")

    def delete(self, location: str) -> bool:
        def delete():
            fs, path = self._fs(location)
            return fs.exists(path) and fs.delete(path, False)
        return bool(self._call(location, "delete", delete))

    def list_names(self, directory: str) -> list[str]:
        def names():
            fs, path = self._fs(directory)
            if not fs.exists(path):
                return []
            return sorted(status.getPath().getName() for status in fs.listStatus(path))
        return self._call(directory, "list", names)


LocalTrailFS, HadoopTrailFS = LocalFS, HadoopFS  # their names while they served trails only
LOCAL = LocalFS()


def for_location(location: str, spark=None):
    """The filesystem of a location. A non-local one needs the SparkSession whose
    Hadoop configuration reaches it."""
    if is_local(location):
        return LOCAL
    if spark is None:
        raise TrailboundError(f"{location}: not a local path; reaching it needs Spark's Hadoop filesystem "
                              "(run through spark-submit, or a command that starts Spark)")
    if not hasattr(spark, "_jvm"):  # a Spark Connect session: no JVM in this process
        raise TrailboundError(f"{location}: not a local path; reaching it needs Spark's Hadoop filesystem in this "
                              "process, which a Spark Connect session does not have (unset SPARK_REMOTE, or run the "
                              "stage through spark-submit)")
    return HadoopFS(spark)


def join(directory: str, name: str) -> str:
    """`name` inside `directory`, for a path or a URI alike."""
    return str(local_path(directory) / name) if is_local(directory) else f"{str(directory).rstrip('/')}/{name}"


# ---------------------------------------------------------------- what was written, checked

@dataclass(frozen=True)
class WrittenFile:
    """What a writer says it wrote: the reader checks the file against it before any
    checkpoint relies on the file. `sha256` None: the writer could not compute it (Spark's
    own Parquet writer), and only the records are checked."""

    location: str
    records: int
    bytes: int | None = None
    sha256: str | None = None


def parquet_records(fs, location: str) -> int:
    """The row count in a Parquet file's footer, read through `fs`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(pa.BufferReader(fs.read_bytes(location))).metadata.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise TrailError(location, f"not a readable Parquet file: {exc}") from None


def check_written(file: WrittenFile, fs, count_records: Callable[[str], int] | None = None,
                  writer: str = "the writer") -> str | None:
    """What is wrong with `file` as this process sees it through `fs`, against what its
    writer said it wrote (there, of that size and SHA-256, holding that many records:
    `count_records(location)`, a Parquet footer by default); None when nothing is."""
    count = count_records or (lambda location: parquet_records(fs, location))
    said = f"{writer} wrote {file.records} records" + (f", sha256 {file.sha256}" if file.sha256 else "")
    if not fs.exists(file.location):
        return (f"{said}, but the file is not there as this process sees it (written to a path this machine "
                "does not share?); nothing was committed")
    if file.bytes is not None and (size := fs.size(file.location)) != file.bytes:
        return f"{said} in {file.bytes} bytes, but this process reads {size} bytes; nothing was committed"
    if file.sha256 is not None and (digest := fs.sha256(file.location)) != file.sha256:
        return f"{said}, but this process reads sha256 {digest}; nothing was committed"
    if (records := count(file.location)) != file.records:
        return f"{said}, but this process reads {records} records; nothing was committed"
    return None


def verify_written(written: list[WrittenFile], fs, *, count_records: Callable[[str], int] | None = None,
                   writer: str = "the writer") -> None:
    """Check every file through `fs` (this process's view) before a checkpoint counts on
    it (`check_written`). The first difference stops the run with one line naming the
    file; nothing past it may be committed."""
    for file in written:
        if (problem := check_written(file, fs, count_records, writer)) is not None:
            raise TrailError(file.location, problem)


# ---------------------------------------------------------------- Spark writes, the driver verifies

def write_dataset(df, directory: str, spark=None, *, prefix: str = "part") -> list[WrittenFile]:
    """Have Spark's executors write `df` under `directory`, one Parquet file per
    non-empty partition named by its partition number (in name order the files hold
    the DataFrame's order), and return the files after checking every one through this
    process's view: a file an executor wrote where the driver cannot read it stops the
    run here, before any checkpoint counts on it. The directory is replaced.

    Local locations: each task writes its file with pyarrow (durably, under a temporary
    name) and reports its records, bytes and SHA-256. Hadoop URIs: Spark's own writer, and
    Spark's per-partition record counts, checked against the files' footers."""
    fs = for_location(directory, spark)
    for name in fs.list_names(directory):
        fs.delete(join(directory, name))
    if is_local(directory):
        written = _write_local(df, str(local_path(directory)), prefix)
    else:
        written = _write_hadoop(df, directory)
    verify_written(written, fs, writer="a Spark task")
    return written


_REPORT = "name string, records long, bytes long, sha256 string"


def _write_local(df, directory: str, prefix: str) -> list[WrittenFile]:
    rows = df.mapInArrow(_partition_writer(directory, prefix), _REPORT).collect()
    return sorted((WrittenFile(str(Path(directory) / r["name"]), r["records"], r["bytes"], r["sha256"]) for r in rows),
                  key=lambda f: f.location)


def _partition_writer(directory: str, prefix: str):
    """The function each Spark task runs over its partition's Arrow batches (on an
    executor: it must import nothing the executor lacks beyond pyarrow and this module)."""
    def write(batches):
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        from trailbound.durable import file_sha256, fsync_directory, temporary_path

        path = Path(directory) / f"{prefix}-{TaskContext.get().partitionId():05d}{PARQUET}"
        temporary, writer, records = temporary_path(path), None, 0
        try:
            for batch in batches:
                if len(batch) == 0:
                    continue
                if writer is None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    writer = pq.ParquetWriter(temporary, batch.schema, compression="zstd")
                writer.write_batch(batch)
                records += len(batch)
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            return
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        fsync_directory(path.parent)
        yield pa.RecordBatch.from_pydict({"name": [path.name], "records": [records], "bytes": [path.stat().st_size],
                                          "sha256": [file_sha256(path)]})
    return write


def _write_hadoop(df, directory: str) -> list[WrittenFile]:
    from pyspark.sql import functions as F

    df = df.cache()
    try:
        counts = {r["p"]: r["n"] for r in df.groupBy(F.spark_partition_id().alias("p")).count()
                  .withColumnRenamed("count", "n").collect()}
        df.write.mode("overwrite").parquet(directory)
    finally:
        df.unpersist()
    # Spark names each task's file part-<partition>-<job uuid>-c000...: one per non-empty partition.
    names = for_location(directory, df.sparkSession).list_names(directory)
    written = []
    for partition, records in sorted(counts.items()):
        stem = f"part-{partition:05d}-"
        name = next((n for n in names if n.startswith(stem) and n.endswith(PARQUET)), f"{stem}*{PARQUET}")
        written.append(WrittenFile(join(directory, name), records))
    return written


def read_batches(written: list[WrittenFile], spark=None, *, columns: list[str] | None = None,
                 batch_size: int = 65536):
    """The record batches of verified Parquet files, file after file (a Hadoop file is
    read into memory first: staging files are a run's bounded share of the data)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for file in written:
        source = (local_path(file.location) if is_local(file.location)
                  else pa.BufferReader(for_location(file.location, spark).read_bytes(file.location)))
        yield from pq.ParquetFile(source).iter_batches(batch_size=batch_size, columns=columns)
