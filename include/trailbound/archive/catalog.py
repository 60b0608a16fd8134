"""The archive catalog: which segments of a source have been discovered and verified,
and the horizon up to which the archive is complete.

Scanning is the door into the pipeline: a segment is cataloged only after its data file
matches its manifest, it follows its thread's previous segment, and every record passes
the contract's checks. One metadata transaction records a whole scan, so a bad segment
leaves the catalog exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from psycopg2 import sql

from trailbound.archive import segments as seg
from trailbound.archive.segments import Segment
from trailbound.errors import ArchiveError
from trailbound.metadata import MetadataStore
from trailbound.positions import Scn
from trailbound.spark import parallelism, run_tasks

AVAILABLE, PURGED = "available", "purged"


@dataclass(frozen=True)
class CatalogEntry:
    segment: Segment
    state: str
    cataloged_at: datetime
    purged_at: datetime | None = None
    purge_reason: str | None = None
    purge_scn: Scn | None = None         # the required SCN that allowed the purge (None: forced)
    backed_up_count: int = 0
    restored_at: datetime | None = None  # its files came back after a purge

    @property
    def status(self) -> str:
        """The state, or 'missing' when an available segment's file has gone from disk."""
        if self.state == AVAILABLE and not self.segment.path.exists():
            return "missing"
        return self.state


@dataclass(frozen=True)
class Horizon:
    """The archive is complete below `scn`: every thread that can still write has
    archived all its records with a lower SCN. None when nothing is archived."""

    scn: Scn
    # thread -> (next_scn of its last visible segment, closed)
    threads: dict[int, tuple[Scn, bool]] = field(default_factory=dict)
    limiting_thread: int | None = None
    time: datetime | None = None  # log time the horizon stands for: next_time of the limiting segment


def compute_horizon(segments: Sequence[Segment], until: datetime | None = None) -> Horizon | None:
    """The lowest next_scn over the threads' last segments archived (next_time) at or
    before `until`. A closed thread stops counting after its last segment; when every
    thread is closed the whole archive is complete."""
    last: dict[int, Segment] = {}
    for segment in segments:
        if until is not None and segment.next_time > until:
            continue
        if segment.thread not in last or segment.sequence > last[segment.thread].sequence:
            last[segment.thread] = segment
    if not last:
        return None
    threads = {t: (s.next_scn, s.closed) for t, s in sorted(last.items())}
    open_threads = {t: s.next_scn for t, s in last.items() if not s.closed}
    if open_threads:
        limiting = min(open_threads, key=lambda t: (open_threads[t], t))
        return Horizon(open_threads[limiting], threads, limiting, last[limiting].next_time)
    return Horizon(max(s.next_scn for s in last.values()), threads, None,
                   max(s.next_time for s in last.values()))


_COLUMNS = sql.SQL(", ").join(map(sql.Identifier, (
    "thread", "sequence", "first_scn", "next_scn", "first_time", "next_time", "records", "bytes", "sha256", "format",
    "path", "closed", "state", "cataloged_at", "purged_at", "purge_reason", "purge_scn", "backed_up_count",
    "restored_at")))


def _entry(row: dict) -> CatalogEntry:
    segment = Segment(
        thread=row["thread"], sequence=row["sequence"], first_scn=Scn(row["first_scn"]),
        next_scn=Scn(row["next_scn"]),
        first_time=row["first_time"], next_time=row["next_time"], records=row["records"], bytes=row["bytes"],
        sha256=row["sha256"], format=row["format"], path=Path(row["path"]), closed=row["closed"],
    )
    return CatalogEntry(segment, row["state"], row["cataloged_at"], row["purged_at"], row["purge_reason"],
                        _scn(row["purge_scn"]), row["backed_up_count"], row["restored_at"])


def _scn(value: int | None) -> Scn | None:
    return None if value is None else Scn(value)


def load_entries(cur, source: str) -> list[CatalogEntry]:
    """A source's catalog rows through an open cursor (inside a caller's transaction)."""
    cur.execute(sql.SQL("SELECT {} FROM trailbound.archive_segment WHERE source = %s ORDER BY thread, sequence")
                .format(_COLUMNS), (source,))
    return [_entry(row) for row in cur.fetchall()]


@dataclass
class ScanResult:
    added: list[Segment]
    known: int
    restored: list[Segment] = field(default_factory=list)

    def describe(self) -> str:
        back = "".join(f"; thread {s.thread} sequence {s.sequence} restored, available again" for s in self.restored)
        if not self.added:
            return f"no new segments ({self.known} already cataloged){back}"
        records = sum(s.records for s in self.added)
        return f"cataloged {len(self.added)} new segment(s), {records} records ({self.known} already cataloged){back}"


def sequence_ranges(sequences: Sequence[int]) -> str:
    """`1..160, 170` for sorted sequence numbers: what an operator reads in a summary."""
    parts: list[str] = []
    for number in sequences:
        if parts and number == last + 1:
            parts[-1] = f"{parts[-1].split('..')[0]}..{number}"
        else:
            parts.append(str(number))
        last = number
    return ", ".join(parts)


@dataclass
class VerifyResult:
    checked: list[Segment]
    purged: list[Segment]
    elsewhere: list[str]  # directories the catalog's stored paths name other than the one checked

    def describe(self, archive_dir: Path) -> str:
        records = sum(s.records for s in self.checked)
        lines = [f"{len(self.checked)} segment(s), {records} records verified in {archive_dir}: "
                 "manifests, sequence, records OK"]
        for thread in sorted({s.thread for s in self.purged}):
            numbers = sorted(s.sequence for s in self.purged if s.thread == thread)
            lines.append(f"thread {thread}: sequences {sequence_ranges(numbers)} purged, not checked")
        for directory in self.elsewhere:
            lines.append(f"note: the catalog recorded segments in {directory}, not in the configured {archive_dir}; "
                         "the configured directory was checked")
        return "\n".join(lines)


@dataclass
class PendingScan:
    """New segments found and in sequence, their files and records not checked yet."""

    catalog: "ArchiveCatalog"
    known: list[CatalogEntry]
    new: list[Segment]
    restored: list[Segment]
    done: bool = False

    def entries(self) -> list[CatalogEntry]:
        """The catalog as it will be once the new segments pass (they are AVAILABLE)."""
        now = datetime.now(timezone.utc)
        return self.known + [CatalogEntry(s, AVAILABLE, now) for s in self.new]

    def files_present(self) -> bool:
        """Whether every new segment's data file is there with its manifest's size (a
        missing or cut file is found by `finish`, which names it, before anything reads it)."""
        for segment in self.new:
            try:
                if segment.path.stat().st_size != segment.bytes:
                    return False
            except OSError:
                return False
        return True

    def runs(self, spark) -> list[list[Segment]]:
        """The new segments cut into runs, a Spark task's each (segments.check_run)."""
        return _check_runs(self.new, parallelism(spark))

    def finish(self, spark, results: list | None = None) -> ScanResult:
        """Check the new segments (or judge `results`, check_run's of `runs()`, computed
        by the caller's tasks) and catalog them. Raises ArchiveError, cataloging nothing."""
        if not self.done and self.new:
            check_segments(spark, self.new, results)
            self.catalog._insert(self.new)
        self.done = True
        return ScanResult(added=self.new, known=len(self.known), restored=self.restored)


class ArchiveCatalog:
    """The catalog rows of one source."""

    def __init__(self, store: MetadataStore, source: str):
        self.store = store
        self.source = source

    def entries(self) -> list[CatalogEntry]:
        with self.store.transaction() as cur:
            return load_entries(cur, self.source)

    def segments(self) -> list[Segment]:
        return [entry.segment for entry in self.entries()]

    def horizon(self, until: datetime | None = None) -> Horizon | None:
        # Purged segments still count: they were archived, their records were read.
        return compute_horizon(self.segments(), until)

    def _split(self, archive_dir: Path) -> tuple[dict[tuple[int, int], CatalogEntry], list[Segment]]:
        """(cataloged entries by (thread, sequence), segments on disk not yet cataloged)."""
        entries = {(e.segment.thread, e.segment.sequence): e for e in self.entries()}
        found = seg.discover(archive_dir)
        for segment in found:
            entry = entries.get((segment.thread, segment.sequence))
            if entry is not None and entry.segment.sha256 != segment.sha256:
                raise ArchiveError(segment.manifest_path,
                                   "segment changed after it was cataloged (sha256 differs); segments are immutable")
        return entries, [s for s in found if (s.thread, s.sequence) not in entries]

    def pending(self, archive_dir: Path) -> list[Segment]:
        """Segments whose manifest exists but that no scan has cataloged yet."""
        return self._split(archive_dir)[1]

    def restorable(self, archive_dir: Path) -> list[Segment]:
        """Purged segments whose manifest and data file are back in the archive directory
        (restored from a backup). Their sha256 is checked against the catalog by `_split`
        (the manifest) and by `readmit` (the data file)."""
        entries, _ = self._split(archive_dir)
        return [e.segment for e in entries.values()
                if e.state == PURGED and e.segment.manifest_path.exists() and e.segment.path.exists()]

    def readmit(self, archive_dir: Path) -> list[Segment]:
        """Make restored segments available again, after checking each data file against
        the manifest the catalog recorded (size, sha256, record count). The records were
        checked when the segment was first cataloged and the bytes are the same, so no
        Spark is needed. A mismatch raises ArchiveError and changes nothing."""
        restored = self.restorable(archive_dir)
        for segment in restored:
            seg.verify_data(segment)
        if restored:
            with self.store.transaction() as cur:
                cur.executemany(
                    "UPDATE trailbound.archive_segment SET state = %s, restored_at = now()"
                    " WHERE source = %s AND thread = %s AND sequence = %s AND state = %s",
                    [(AVAILABLE, self.source, s.thread, s.sequence, PURGED) for s in restored])
        return restored

    def scan(self, archive_dir: Path, spark) -> ScanResult:
        """Discover segments not yet cataloged, check them (files, sequence, every record),
        and record them all in one transaction. Any violation raises ArchiveError and
        records nothing. Purged segments whose files were restored become available
        again first (`readmit`)."""
        return self.begin_scan(archive_dir).finish(spark)

    def begin_scan(self, archive_dir: Path) -> "PendingScan":
        """A scan's first half, without Spark: restored segments readmitted, the new ones
        found and their sequence checked. Their files and records are checked by
        `PendingScan.finish` (or by tasks of a capture's own job: `PendingScan.runs` and
        `finish(spark, results)`); until then they are not cataloged."""
        restored = self.readmit(archive_dir)
        entries, new = self._split(archive_dir)
        last_known = {thread: entries[(thread, sequence)].segment for thread, sequence in sorted(entries)}
        seg.check_sequence(new, last_known)
        return PendingScan(self, list(entries.values()), new, restored)

    def verify(self, archive_dir: Path, spark) -> "VerifyResult":
        """Check everything again in `archive_dir` (the directory the configuration names),
        writing nothing: every available cataloged segment's files there against what the
        catalog recorded, every pending one against its manifest, the sequence of all of
        them, and every record (including records of a transaction after its end, across
        segments). The catalog's stored paths only tell where it last saw the files:
        when they point elsewhere the result says so, and the configured copy is what is
        checked. Purged segments are counted as purged, not read."""
        entries, new = self._split(archive_dir)
        cataloged = [e.segment for e in entries.values()]
        seg.check_sequence(cataloged + new)
        here = archive_dir.resolve()
        elsewhere = sorted({str(e.segment.path.parent) for e in entries.values()
                            if e.segment.path.parent.resolve() != here})
        readable = []
        for entry in entries.values():
            if entry.state != AVAILABLE:
                continue
            segment = replace(entry.segment, path=archive_dir / entry.segment.path.name)
            if not segment.manifest_path.exists():
                raise ArchiveError(segment.manifest_path, "manifest of a cataloged segment is missing")
            readable.append(segment)
        readable += new
        check_segments(spark, readable)
        purged = [e.segment for e in entries.values() if e.state == PURGED]
        return VerifyResult(readable, purged, elsewhere)

    def mark_backed_up(self, thread: int | None = None, through_sequence: int | None = None) -> int:
        """Count one more backup of the available segments (of one thread, up to a
        sequence): what RMAN's BACKED UP n TIMES deletion policy counts. Returns how many."""
        with self.store.transaction() as cur:
            cur.execute("UPDATE trailbound.archive_segment SET backed_up_count = backed_up_count + 1"
                        " WHERE source = %s AND state = %s AND (%s::integer IS NULL OR thread = %s)"
                        " AND (%s::bigint IS NULL OR sequence <= %s)",
                        (self.source, AVAILABLE, thread, thread, through_sequence, through_sequence))
            return cur.rowcount

    def _insert(self, new: Sequence[Segment]) -> None:
        with self.store.transaction() as cur:
            # Two scans of one source racing would both pass the checks; the primary key
            # makes the second fail as a whole rather than interleave.
            cur.executemany(
                "INSERT INTO trailbound.archive_segment (source, thread, sequence, first_scn, next_scn, first_time,"
                " next_time, records, bytes, sha256, format, path, closed)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(self.source, s.thread, s.sequence, s.first_scn.value, s.next_scn.value, s.first_time, s.next_time,
                  s.records, s.bytes, s.sha256, s.format, str(s.path), s.closed) for s in new],
            )


def check_segments(spark, segments: Sequence[Segment], results: list | None = None) -> None:
    """Check new segments' files against their manifests and every record against the
    contract, raising the first ArchiveError in (thread, sequence, rba) order. Each file
    is read once, in Spark tasks that each take a run of one thread's consecutive
    segments (segments.check_run, vectorised; a thread's runs are then checked against
    each other: segments.runs_pass), at least one per core; only when that finds
    something, or for JSON Lines, does the Spark reader look at the records to name the
    first bad one. `results`: check_run's of `_check_runs(segments, ...)`, when the
    caller's own tasks ran them (PendingScan.runs)."""
    from trailbound.archive import reader

    runs = _check_runs(segments, parallelism(spark))
    if results is None:
        results = run_tasks(spark, seg.check_run, runs)
    errors = [result.error for result in results if result.error is not None]
    if errors:
        order = {str(s.path): (s.thread, s.sequence) for s in segments}
        path, message, rba = min(errors, key=lambda e: order.get(e[0], (0, 0)))
        raise ArchiveError(path, message, rba=rba)
    by_thread: dict[int, list] = {}
    for run, result in zip(runs, results):
        by_thread.setdefault(run[0].thread, []).append(result)
    if not all(result.passed for result in results) or not all(map(seg.runs_pass, by_thread.values())):
        reader.check_records(spark, segments)


def _check_runs(segments: Sequence[Segment], cores: int) -> list[list[Segment]]:
    """Each thread's segments cut into runs of consecutive ones, about equal in records,
    so that there are at least as many runs as cores (a single-thread source, such as a
    PostgreSQL slot's, is checked on every core)."""
    threads: dict[int, list[Segment]] = {}
    for segment in sorted(segments, key=lambda s: (s.thread, s.sequence)):
        threads.setdefault(segment.thread, []).append(segment)
    total = sum(s.records for s in segments) or 1
    runs = []
    for of_thread in threads.values():
        share = sum(s.records for s in of_thread)
        pieces = max(1, min(len(of_thread), round(cores * share / total)))
        size = share / pieces
        run, counted, cut = [], 0, 1
        for segment in of_thread:
            if run and counted >= size * cut:
                runs.append(run)
                run, cut = [], cut + 1
            run.append(segment)
            counted += segment.records
        runs.append(run)
    return runs
