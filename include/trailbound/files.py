"""Where trail files live: the one place that opens, lists, renames and deletes a trail
file at a local path or at a Hadoop-compatible URI.

A trail location is text: a plain path or `file://` URI (the local filesystem, through
Python), or any other URI Spark's Hadoop FileSystem can write (`s3a://bucket/dirdat/rt`,
`hdfs://nn/dirdat/rt`, `viewfs://...`), reached through `spark._jvm`. The SparkSession is
always passed in; nothing here creates one, and local trails need none.

Bulk bytes never cross the Python/JVM bridge (py4j moves a few MB/s): uploads, downloads
and checksums of a Hadoop file run inside the JVM.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlsplit

from trailbound.durable import CHUNK as _CHUNK
from trailbound.durable import file_sha256, fsync_directory
from trailbound.errors import TrailboundError, TrailError


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

class LocalTrailFS:
    """Trail files on this machine's filesystem."""

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


class HadoopTrailFS:
    """Trail files behind a Hadoop FileSystem URI (s3a://, hdfs://, ...), through the
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


LOCAL = LocalTrailFS()


def for_location(location: str, spark=None):
    """The filesystem of a trail location. A non-local one needs the SparkSession whose
    Hadoop configuration reaches it."""
    if is_local(location):
        return LOCAL
    if spark is None:
        raise TrailboundError(f"{location}: not a local path; reaching it needs Spark's Hadoop filesystem "
                              "(run through spark-submit, or a command that starts Spark)")
    return HadoopTrailFS(spark)
