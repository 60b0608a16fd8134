"""Durable local files: the one way the engine writes a file atomically, and hashes one.

`atomic_write` writes to a hidden temporary name beside the file, fsyncs it, renames it
over the file and fsyncs the directory, so after a crash the file is either the old one
or the complete new one, and the rename itself survives a power loss. Trail files, the
redo archive's segments and manifests, and Bounded Recovery's persisted objects all go
through it. Imports nothing from trailbound; anything may import it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

CHUNK = 1 << 20


def temporary_path(path: Path, writer: str = "") -> Path:
    """Where `path` is written before the rename: hidden, so no file pattern matches it.
    `writer` names the write, so that two writers of one file (a run and an abandoned
    one still running: see trail.format.claim) never write into each other's."""
    return path.with_name(f".{path.name}.{writer}.tmp" if writer else f".{path.name}.tmp")


def fsync_directory(directory: Path) -> None:
    """Make a rename (or a new name) in `directory` durable."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def atomic_write(path: Path, content: bytes | memoryview | Callable[[Path], None]) -> None:
    """Replace `path` with `content`: bytes (or a buffer), or a function that writes the
    file at the path it is given (a Parquet writer)."""
    temporary = temporary_path(path)
    if callable(content):
        content(temporary)
    else:
        with open(temporary, "wb") as handle:
            handle.write(content)
    publish(path)


def publish(path: Path, *, writer: str = "", fence: Callable[[], None] | None = None) -> None:
    """Make the complete file at `temporary_path(path, writer)` durable as `path`: fsync
    it, rename it over `path`, fsync the directory (for a writer that streams into the
    temporary file itself). `fence`, called just before the rename, raises when this
    write may no longer publish (trail.format.claim)."""
    temporary = temporary_path(path, writer)
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    if fence is not None:
        try:
            fence()
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    os.replace(temporary, path)
    fsync_directory(path.parent)


def file_sha256(path: Path, *, each_chunk: Callable[[bytes], None] | None = None) -> str:
    """SHA-256 of a file, read in chunks; `each_chunk` sees every chunk too (to count
    lines in the same pass)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            if each_chunk is not None:
                each_chunk(chunk)
    return digest.hexdigest()
