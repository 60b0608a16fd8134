"""Trail purge: GoldenGate's PURGEOLDEXTRACTS ... USECHECKPOINTS (docs/pump.md).

A committed file of trail T goes when every reader of T has passed it by its checkpoint
(its trail_reader position is in a later file, or at the end of this one), it was
committed more than `minkeephours` ago, and it is not among T's newest `minkeepfiles`
files. A reader registered but never started (seqno 0) holds the whole trail, and so
does a pump that is configured for T but not added yet. A trail no reader is registered
for keeps every file: unlike GoldenGate, purge does not take "nobody reads it" as "nobody
needs it".

Each deletion is recorded (trailbound.trail_purge: the file, why, every reader's position
at the time) and the file's trail_file row is marked purged, never deleted. The decision
and the deletions for one trail run under a SHARE lock on trail_reader, so no reader can
register or move while purge decides what it no longer needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from trailbound.config import Config
from trailbound.crash import crashpoint
from trailbound.ggsci import utc
from trailbound.metadata import MetadataStore
from trailbound.positions import TrailPosition
from trailbound.trail import catalog
from trailbound import files as trailfs

CRASH_POINTS = ("mid_purge",)


@dataclass(frozen=True)
class Reader:
    kind: str
    group: str
    position: TrailPosition
    registered: bool = True      # False: a configured pump not added yet, which holds everything

    def has_passed(self, seqno: int, records: int) -> bool:
        return self.position.seqno > seqno or (self.position.seqno == seqno and self.position.rba >= records)

    def __str__(self) -> str:
        where = f"at {self.position}" if self.registered else "configured, not added yet"
        return f"{self.kind} {self.group} {where}"

    def as_json(self) -> dict:
        return {"kind": self.kind, "group": self.group, "seqno": self.position.seqno, "rba": self.position.rba,
                "registered": self.registered}


@dataclass(frozen=True)
class Verdict:
    seqno: int
    path: str
    records: int
    purge: bool
    reason: str


@dataclass
class TrailOutcome:
    trail: str
    readers: list[Reader]
    verdicts: list[Verdict] = field(default_factory=list)
    already_gone: list[int] = field(default_factory=list)   # purged files that were not on disk any more

    @property
    def purged(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.purge]

    @property
    def kept(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.purge]


@dataclass
class PurgeResult:
    dry_run: bool
    trails: list[TrailOutcome] = field(default_factory=list)

    def summary(self) -> dict:
        """Per trail, what the purge did, as plain values (the retention Asset event's extra)."""
        return {t.trail: {"purged_files": [v.seqno for v in t.purged], "purged_records": sum(v.records for v in t.purged),
                          "kept_files": len(t.kept), "dry_run": self.dry_run} for t in self.trails}

    def describe(self) -> str:
        if not self.trails:
            return "No trail has committed files"
        verb = "would purge" if self.dry_run else "purged"
        lines = []
        for t in self.trails:
            readers = ", ".join(str(r) for r in t.readers) or "none registered"
            lines.append(f"Trail {t.trail}: {len(t.verdicts)} file(s); readers: {readers}")
            for v in t.purged:
                gone = " (was already gone)" if v.seqno in t.already_gone else ""
                lines.append(f"  {verb} seqno {v.seqno} {v.path} ({v.records} records){gone}")
            kept = t.kept
            if kept:
                span = f"seqno {kept[0].seqno}" + (f"..{kept[-1].seqno}" if len(kept) > 1 else "")
                lines.append(f"  kept {span}: {kept[0].reason}")
        return "\n".join(lines)


def _readers(cur, config: Config, trail: str) -> list[Reader]:
    readers = [Reader(r["reader_kind"], r["group_name"], TrailPosition(r["seqno"], r["rba"]))
               for r in catalog.reader_positions(cur, trail)]
    registered = {r.group.upper() for r in readers if r.kind == "pump"}
    for name, pump in config.pumps.items():
        if config.trail_location(pump.exttrail) == trail and name.upper() not in registered:
            readers.append(Reader("pump", name, TrailPosition(0, 0), registered=False))
    return readers


def decide(files: list[dict], readers: list[Reader], *, minkeephours: float, minkeepfiles: int,
           now: datetime) -> list[Verdict]:
    """Which of a trail's files (trail_file rows, in seqno order) may go, and why each
    one stays. Pure: the rules of USECHECKPOINTS, MINKEEPHOURS and MINKEEPFILES."""
    newest = {f["seqno"] for f in files[max(0, len(files) - minkeepfiles):]} if minkeepfiles else set()
    cutoff = now - timedelta(hours=minkeephours)
    verdicts = []
    for f in files:
        holders = [r for r in readers if not r.has_passed(f["seqno"], f["records"])]
        if not readers:
            reason, purge = "no reader is registered for this trail", False
        elif holders:
            reason, purge = f"still needed by {', '.join(str(r) for r in holders)}", False
        elif f["seqno"] in newest:
            reason, purge = f"minkeepfiles {minkeepfiles} keeps the newest {minkeepfiles} file(s)", False
        elif f["created_at"] > cutoff:
            reason, purge = (f"minkeephours {minkeephours:g}: committed {utc(f['created_at'])}, "
                             f"not before {utc(cutoff)}"), False
        else:
            reason, purge = (f"every reader has passed it ({', '.join(str(r) for r in readers)}); committed "
                             f"{utc(f['created_at'])} (minkeephours {minkeephours:g}); not among the "
                             f"newest {minkeepfiles} file(s)"), True
        verdicts.append(Verdict(f["seqno"], f["path"], f["records"], purge, reason))
    return verdicts


def trails_with_files(store: MetadataStore) -> list[str]:
    with store.transaction() as cur:
        return catalog.trails_with_files(cur)


def needs_spark(store: MetadataStore) -> bool:
    """Whether some trail with files left is out of the local filesystem's reach."""
    return any(not trailfs.is_local(trail) for trail in trails_with_files(store))


def purge_trails(store: MetadataStore, config: Config, *, spark=None, dry_run: bool = False,
                 now: datetime | None = None) -> PurgeResult:
    """Purge every trail the metadata store knows. With `dry_run`, change nothing and say
    what would go. `spark` is needed only for trails at a non-local URI."""
    now = now or datetime.now(timezone.utc)
    rules = config.purgeoldextracts
    result = PurgeResult(dry_run)
    for trail in trails_with_files(store):
        with store.transaction() as cur:
            if not dry_run:
                # Readers may neither register nor move until this trail's purge commits.
                catalog.lock_readers(cur)
            readers = _readers(cur, config, trail)
            files = catalog.unpurged_files(cur, trail)
            outcome = TrailOutcome(trail, readers, decide(files, readers, minkeephours=rules.minkeephours,
                                                          minkeepfiles=rules.minkeepfiles, now=now))
            result.trails.append(outcome)
            if dry_run or not outcome.purged:
                continue
            fs = trailfs.for_location(trail, spark)
            positions = json.dumps([r.as_json() for r in readers])
            for number, verdict in enumerate(outcome.purged):
                if number:
                    crashpoint("mid_purge")  # some files deleted, nothing committed
                # The file first: a crash after it leaves a row whose file is gone, which the
                # next purge marks; the other order could leave a file nothing tracks.
                if not fs.delete(verdict.path):
                    outcome.already_gone.append(verdict.seqno)
                catalog.mark_purged(cur, trail, verdict.seqno)
                cur.execute("INSERT INTO trailbound.trail_purge (trail, seqno, path, records, reason, readers)"
                            " VALUES (%s, %s, %s, %s, %s, %s)",
                            (trail, verdict.seqno, verdict.path, verdict.records, verdict.reason, positions))
    return result
