"""Archive-log retention: purge redo segments only below the lowest SCN that every
registered capture still needs (docs/retention.md).

Oracle keeps archived logs for GoldenGate through REGISTER EXTRACT ... LOGRETENTION:
each registered capture publishes the lowest SCN it can still need (DBA_CAPTURE's
REQUIRED_CHECKPOINT_SCN), the database takes the minimum (V$DATABASE's
MIN_REQUIRED_CAPTURE_CHANGE#) and RMAN deletes no archived log above it, unless the
recovery area is full. Here:

- `capture_registration` rows are the registrations. A capture run updates its row's
  required SCN in the same metadata transaction as its checkpoints
  (`capture.recovery.required_scn`, Bounded-Recovery-aware).
- `plan_retention` is the policy, a pure function: catalog entries, registrations and
  the configured policy in; for every available segment out, whether it goes (with the
  reason and the SCN that allowed it) or why it stays.
- `run_retention` applies a plan per source in one metadata transaction: catalog rows
  marked purged, then the files deleted (data file, then manifest), then the commit. A
  crash after some files are gone but before the commit leaves rows `available` whose
  file is gone; the next run decides them again and marks them purged ("already gone").
  The run holds a lock on the registrations, so no capture can commit a new required SCN
  while a plan made from the old one is being applied.

Retention needs no Spark: the catalog and the files are all it touches.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable, Sequence

from psycopg2 import sql

from trailbound.archive.catalog import AVAILABLE, ArchiveCatalog, CatalogEntry, load_entries
from trailbound.archive.segments import Segment
from trailbound.capture import checkpoints as ckpt
from trailbound.capture import recovery
from trailbound.config import Config, RetentionConfig
from trailbound.crash import crashpoint
from trailbound.errors import ConfigError, TrailboundError
from trailbound.ggsci import times_note, utc
from trailbound.metadata import MetadataStore
from trailbound.positions import Scn

log = logging.getLogger(__name__)

CRASH_POINTS = ("retention_mid_purge", "retention_after_delete")


# ---------------------------------------------------------------- the policy (pure)

@dataclass(frozen=True)
class Registration:
    """A capture registered with LOGRETENTION, as retention sees it now."""

    group: str
    source: str
    first_scn: Scn
    required_scn: Scn               # what retention keeps for it: min(committed, as recomputed now)
    read_scn: Scn | None            # every record below was read (None: never ran, or repositioned)
    enabled: bool = True
    committed_scn: Scn | None = None  # as its last capture run committed it
    note: str | None = None         # why required_scn is below the committed one
    added: bool = True              # False: no extract group of that name exists (deleted, or never added)
    registered_at: datetime | None = None
    updated_at: datetime | None = None
    needs_restore: str | None = None

    def holds(self, segment: Segment) -> str | None:
        """Why this capture keeps `segment`, or None if it has no use for it."""
        if self.read_scn is None:
            return (f"extract {self.group} has not run yet (a first run reads from the archive's oldest segment)"
                    if self.added else f"extract {self.group} is registered but not added")
        if segment.next_scn > self.read_scn:
            return f"not read yet by extract {self.group} (read below scn {self.read_scn})"
        if segment.next_scn > self.required_scn:
            return f"needed by extract {self.group} from scn {self.required_scn}"
        return None

    def needs(self, segment: Segment) -> bool:
        """Whether this capture's next run stops without `segment` (a segment with no
        record is never read; see capture.run._segments_to_read)."""
        return segment.records > 0 and segment.next_scn > self.required_scn


@dataclass(frozen=True)
class Decision:
    """One available segment: purged (with the reason and the SCN that allowed it) or
    kept (with why)."""

    entry: CatalogEntry
    purge: bool
    reason: str
    allowing_scn: Scn | None = None   # the minimum required SCN that allowed the purge (None: kept, or forced)
    forced: bool = False              # purged by the space limit
    needed_by: tuple[str, ...] = ()   # captures whose next run stops without it
    gone: bool = False                # its data file had already left the archive directory

    @property
    def segment(self) -> Segment:
        return self.entry.segment


@dataclass
class RetentionPlan:
    source: str
    policy: RetentionConfig
    registrations: list[Registration]
    required_scn: Scn | None          # minimum over enabled registrations (None: none registered)
    decisions: list[Decision]
    archive_bytes: int                # bytes of available segments on disk before the plan
    newest_time: datetime | None      # log time the archive reaches (minkeephours counts back from it)

    @property
    def purged(self) -> list[Decision]:
        return [d for d in self.decisions if d.purge]

    @property
    def kept(self) -> list[Decision]:
        return [d for d in self.decisions if not d.purge]

    @property
    def forced(self) -> list[Decision]:
        return [d for d in self.decisions if d.forced]

    @property
    def remaining_bytes(self) -> int:
        return sum(d.segment.bytes for d in self.kept if not d.gone)

    @property
    def needed_purged(self) -> list[Decision]:
        """Purged although a capture needs them (only the space limit does that)."""
        return [d for d in self.purged if d.needed_by]

    def needs_restore(self) -> dict[str, list[Decision]]:
        """Capture -> the needed segments this plan purges."""
        affected: dict[str, list[Decision]] = {}
        for d in self.needed_purged:
            for group in d.needed_by:
                affected.setdefault(group, []).append(d)
        return affected

    def over_limit(self) -> str | None:
        limit = self.policy.maxbytes
        if limit is None or self.remaining_bytes <= limit:
            return None
        return (f"the archive of source {self.source} still holds {self.remaining_bytes} bytes, over maxbytes {limit}: "
                f"what is left is not backed up {self.policy.backedup} time(s) (backedup), or was restored for a "
                f"capture that still needs it")

    def alert(self, archive_dir: Path | str) -> str | None:
        """The loud warning when needed segments go, modelled on Oracle's alert-log message
        when the recovery area deletes logs a Streams capture needs."""
        needed = self.needed_purged
        if not needed:
            return None
        bar = "*" * 78
        lines = [bar,
                 f"WARNING: the following redo segments of source {self.source} are needed by capture but",
                 f"are being purged to bring the archive under maxbytes {self.policy.maxbytes} (it held "
                 f"{self.archive_bytes} bytes).",
                 "The captures named will stop with \"missing log segment\" until the segments are back.",
                 "To process them, restore each segment's data file AND manifest, unchanged (same sha256),",
                 f"from a backup into the archive directory {archive_dir}",
                 "and run the capture again: its scan makes them available, it resumes where it stopped.",
                 "(Or move the capture past them: alter extract GROUP begin ..., losing what they hold.)"]
        for d in needed:
            s = d.segment
            who = ", ".join(f"{g} (from scn {self._required(g)})" for g in d.needed_by)
            lines.append(f"  {s.path}  (and {s.manifest_path.name}): thread {s.thread} sequence {s.sequence}, "
                         f"scn {s.first_scn}..{s.next_scn}, needed by {who}")
        lines.append(bar)
        return "\n".join(lines)

    def _required(self, group: str) -> Scn | None:
        return next((r.required_scn for r in self.registrations if r.group == group), None)


def plan_retention(source: str, entries: Sequence[CatalogEntry], registrations: Sequence[Registration],
                   policy: RetentionConfig, *, gone: Iterable[tuple[int, int]] = ()) -> RetentionPlan:
    """Decide, for every available segment of `source`, whether it is purged and why.

    A segment goes when its next_scn is at or below the minimum required SCN over the
    enabled registrations, every registered capture has read it, it has been backed up
    `backedup` times and it ends before the newest `minkeephours` of log. With no
    registration nothing goes. Then, if what stays exceeds `maxbytes`, the oldest
    segments go anyway (even if needed), except those not backed up enough (they could
    never be restored) and those restored for a capture that still needs them (else a
    restore would be undone before the capture could read it). `gone` names the
    (thread, sequence) of available segments whose data file is no longer on disk."""
    gone = set(gone)
    enabled = [r for r in registrations if r.enabled and r.source.upper() == source.upper()]
    required = min((r.required_scn for r in enabled), default=None)
    available = sorted((e for e in entries if e.state == AVAILABLE),
                       key=lambda e: (e.segment.thread, e.segment.sequence))
    newest = max((e.segment.next_time for e in entries), default=None)
    cutoff = newest - timedelta(hours=policy.minkeephours) if newest is not None else None
    holders = ", ".join(f"{r.group} {r.required_scn}" for r in enabled)
    purge_reason = (f"below required scn {required} (the minimum over {holders}), read by every registered capture; "
                    f"minkeephours {policy.minkeephours:g} and backedup {policy.backedup} satisfied")

    decisions = []
    for entry in available:
        s = entry.segment
        why = []
        if not enabled:
            why.append(f"no capture of source {source} is registered (register extract GROUP logretention): "
                       "nothing is purged without one")
        why += [reason for r in enabled if (reason := r.holds(s))]
        if entry.backed_up_count < policy.backedup:
            why.append(f"backed up {entry.backed_up_count} of {policy.backedup} time(s) (backedup)")
        if cutoff is not None and s.next_time > cutoff:
            why.append(f"within the newest {policy.minkeephours:g} hour(s) of log (minkeephours)")
        needed_by = tuple(r.group for r in enabled if r.needs(s))
        is_gone = (s.thread, s.sequence) in gone
        if why:
            decisions.append(Decision(entry, False, "; ".join(why), needed_by=needed_by, gone=is_gone))
        else:
            decisions.append(Decision(entry, True, purge_reason, allowing_scn=required, gone=is_gone))

    archive_bytes = sum(d.segment.bytes for d in decisions if not d.gone)
    plan = RetentionPlan(source, policy, list(registrations), required, decisions, archive_bytes, newest)
    limit = policy.maxbytes
    if limit is not None and plan.remaining_bytes > limit:
        remaining = over = plan.remaining_bytes
        index = {id(d): n for n, d in enumerate(decisions)}
        oldest_first = sorted((d for d in decisions if not d.purge and not d.gone),
                              key=lambda d: (d.segment.next_time, d.segment.first_scn, d.segment.thread,
                                             d.segment.sequence))
        for d in oldest_first:
            if remaining <= limit:
                break
            if d.entry.backed_up_count < policy.backedup:
                continue  # no backup to restore it from: deleting it would lose it for good
            if d.entry.restored_at is not None and d.needed_by:
                continue  # restored on purpose for a capture that has not read it yet
            decisions[index[id(d)]] = replace(
                d, purge=True, forced=True,
                reason=f"space: {over} bytes would stay, over maxbytes {limit}; oldest first, although kept "
                       f"for: {d.reason}")
            remaining -= d.segment.bytes
    return plan


def advice(config: Config, source: str) -> list[str]:
    """GoldenGate's advice: keep at least two BR intervals of log, so that Bounded
    Recovery's worst-case re-read is always on disk even if a registration lags."""
    policy = config.retention
    notes = []
    for name, extract in config.extracts.items():
        if extract.source.upper() != source.upper() or extract.br.broff:
            continue
        advised = 2 * extract.effective_brinterval
        if timedelta(hours=policy.minkeephours) < advised:
            notes.append(f"minkeephours {policy.minkeephours:g} is below 2 x the BR interval of extract {name} "
                         f"({advised.total_seconds() / 3600:g} hours), the log Bounded Recovery may re-read; "
                         f"consider minkeephours {advised.total_seconds() / 3600:g}")
    return notes


# ---------------------------------------------------------------- registrations

def _archive_start(cur, source: str) -> Scn:
    cur.execute("SELECT min(first_scn) AS scn FROM trailbound.archive_segment WHERE source = %s", (source,))
    return Scn(cur.fetchone()["scn"] or 0)


def _live_required(state: ckpt.ExtractState, config: Config) -> tuple[Scn, str | None]:
    """The group's required SCN recomputed from its committed state and the current
    configuration and BR files. Bounded Recovery counts only if the next run would
    really use it (recovery.plan: not broff, no brreset pending, not suspended, the same
    table selection, every persisted file present and intact); otherwise the next run
    re-reads from the true start of its oldest open transaction, and that log stays."""
    normal = recovery.RecoveryPlan(recovery.NORMAL, [])
    if state.read_scn is None or not any(t.persisted for t in state.open):
        return recovery.required_scn(state, normal), None
    try:
        extract = config.extract(state.group)
    except ConfigError:
        return recovery.required_scn(state, normal), "not in the configuration: Bounded Recovery not counted on"
    plan = recovery.plan(state, extract)
    usable = plan.mode == recovery.BOUNDED
    return recovery.required_scn(state, plan), None if usable else f"its next run uses normal recovery ({plan.reason})"


def load_registrations(cur, config: Config, source: str | None = None) -> list[Registration]:
    """Every registration (of one source), each with its required SCN as committed and as
    recomputed now; retention holds to the lower."""
    where = sql.SQL(" WHERE upper(source) = upper(%s)") if source else sql.SQL("")
    cur.execute(sql.SQL("SELECT * FROM trailbound.capture_registration{} ORDER BY group_name").format(where),
                (source,) if source else ())
    rows = cur.fetchall()
    registrations = []
    for row in rows:
        state = ckpt.load(cur, row["group_name"])
        committed = Scn(row["required_scn"])
        required, note, read_scn = committed, None, None
        if state is not None:
            live, note = _live_required(state, config)
            read_scn = state.read_scn
            if live < committed:
                required = live
                note = note or "recomputed from its checkpoints"
            else:
                note = None
        registrations.append(Registration(
            row["group_name"], row["source"], Scn(row["first_scn"]), required, read_scn, row["enabled"], committed, note,
            state is not None, row["registered_at"], row["updated_at"], row["needs_restore"]))
    return registrations


def register(store: MetadataStore, config: Config, group: str) -> Registration:
    """REGISTER EXTRACT group LOGRETENTION: from now on retention keeps every segment the
    group can still need. Its first and required SCN start at what it needs now: the
    begin point if it has not run (the archive's start for `earliest`), else its
    restart position."""
    name = config.extract_name(group)
    source = config.source_name(config.extract(name).source)
    with store.transaction() as cur:
        cur.execute("SELECT enabled FROM trailbound.capture_registration WHERE upper(group_name) = upper(%s)"
                    " FOR UPDATE", (name,))
        row = cur.fetchone()
        if row is not None and row["enabled"]:
            raise TrailboundError(f"extract {name} is already registered with logretention")
        state = ckpt.load(cur, name)
        if state is None:
            from trailbound.capture.begin import resolve_begin

            first = resolve_begin(config.extract(name).begin, [e.segment for e in load_entries(cur, source)])
        else:
            first = _live_required(state, config)[0]
        if state is None or state.read_scn is None:
            first = max(first, _archive_start(cur, source))
        cur.execute("DELETE FROM trailbound.capture_registration WHERE upper(group_name) = upper(%s)", (name,))
        cur.execute("INSERT INTO trailbound.capture_registration (group_name, source, first_scn, required_scn)"
                    " VALUES (%s, %s, %s, %s)", (name, source, first.value, first.value))
        return next(r for r in load_registrations(cur, config, source) if r.group == name)


def unregister(store: MetadataStore, group: str) -> str:
    """UNREGISTER EXTRACT group LOGRETENTION: the group holds no log any more. The row
    stays, disabled, as a record; registering again starts afresh."""
    with store.transaction() as cur:
        cur.execute("UPDATE trailbound.capture_registration SET enabled = false, needs_restore = NULL,"
                    " updated_at = now() WHERE upper(group_name) = upper(%s) AND enabled RETURNING group_name",
                    (group,))
        row = cur.fetchone()
    if row is None:
        raise TrailboundError(f"extract {group} is not registered with logretention")
    return row["group_name"]


def registered_source(cur, group: str) -> str | None:
    """The source whose log the group holds against retention, None if it is not
    registered (or no longer: unregistered)."""
    cur.execute("SELECT source FROM trailbound.capture_registration"
                " WHERE upper(group_name) = upper(%s) AND enabled", (group,))
    row = cur.fetchone()
    return None if row is None else row["source"]


# ---------------------------------------------------------------- the run

@dataclass
class SourceOutcome:
    plan: RetentionPlan
    archive_dir: Path
    run_id: int | None = None
    readmitted: list[Segment] = field(default_factory=list)   # restored files made available again
    restorable: list[Segment] = field(default_factory=list)   # dry run: restored files a run would readmit
    advice: list[str] = field(default_factory=list)
    alert: str | None = None


@dataclass
class RetentionResult:
    dry_run: bool
    sources: list[SourceOutcome] = field(default_factory=list)

    @property
    def purged(self) -> list[Decision]:
        return [d for o in self.sources for d in o.plan.purged]

    def summary(self) -> dict:
        """Per source, what the run did, as plain values (the retention Asset event's extra)."""
        return {o.plan.source: {
            "run_id": o.run_id, "required_scn": _value(o.plan.required_scn),
            "purged_segments": len(o.plan.purged), "purged_bytes": sum(d.segment.bytes for d in o.plan.purged),
            "forced_segments": len(o.plan.forced), "kept_segments": len(o.plan.kept),
            "remaining_bytes": o.plan.remaining_bytes, "alert": o.alert} for o in self.sources}

    def describe(self) -> str:
        verb = "would purge" if self.dry_run else "purged"
        lines = []
        for o in self.sources:
            p = o.plan
            run = f" (retention run #{o.run_id})" if o.run_id else ""
            lines.append(f"Source {p.source}{run}: minimum required scn {_scn(p.required_scn)}; {verb} "
                         f"{len(p.purged)} segment(s), {sum(d.segment.bytes for d in p.purged)} bytes; "
                         f"kept {len(p.kept)}")
            for s in o.readmitted:
                lines.append(f"  thread {s.thread} sequence {s.sequence} was restored: available again")
            for s in o.restorable:
                lines.append(f"  thread {s.thread} sequence {s.sequence} is back on disk: a run makes it available")
            lines += [f"  {verb} {text}" for text in _ranges(p.purged, gone_note=True)]
            lines += [f"  kept {text}" for text in _ranges(p.kept)]
            if p.over_limit():
                lines.append(f"  WARNING: {p.over_limit()}")
            lines += [f"  advice: {note}" for note in o.advice]
            if o.alert:
                lines.append(o.alert)
        return "\n".join(lines) or "No source is configured"


def _scn(value: Scn | None) -> str:
    return "none (no capture registered)" if value is None else str(value)


def _value(scn: Scn | None) -> int | None:
    """An SCN as the metadata store and the Asset event keep it (a number)."""
    return None if scn is None else scn.value


def _ranges(decisions: Sequence[Decision], gone_note: bool = False) -> list[str]:
    """Runs of consecutive sequences of one thread with the same reason, one line each."""
    lines: list[str] = []
    run: list[Decision] = []

    def flush():
        if run:
            first, last = run[0].segment, run[-1].segment
            span = (f"sequence {first.sequence}" if first.sequence == last.sequence
                    else f"sequences {first.sequence}..{last.sequence}")
            gone = [str(d.segment.sequence) for d in run if d.gone]
            note = f" (already gone from disk: {', '.join(gone)})" if gone and gone_note else \
                f" (file missing from disk: {', '.join(gone)})" if gone else ""
            lines.append(f"thread {first.thread} {span}, scn {first.first_scn}..{last.next_scn}: {run[0].reason}{note}")
            run.clear()

    for d in decisions:
        if run and (d.segment.thread != run[-1].segment.thread or d.segment.sequence != run[-1].segment.sequence + 1
                    or d.reason != run[-1].reason):
            flush()
        run.append(d)
    flush()
    return lines


def _missing(entries: Sequence[CatalogEntry]) -> set[tuple[int, int]]:
    return {(e.segment.thread, e.segment.sequence) for e in entries
            if e.state == AVAILABLE and not e.segment.path.exists()}


def _delete(segment: Segment) -> bool:
    """Data file, then manifest (while the manifest exists the segment is still
    described, so an interrupted purge is never left with a data file nothing names).
    Returns whether anything was on disk."""
    existed = False
    for path in (segment.path, segment.manifest_path):
        try:
            path.unlink()
            existed = True
        except FileNotFoundError:
            pass
    return existed


def run_retention(store: MetadataStore, config: Config, dry_run: bool = False, *,
                  source: str | None = None) -> RetentionResult:
    """One retention run over every configured source (or one). With `dry_run`, change
    nothing and say what would go. The function the Airflow retention DAG calls."""
    names = [config.source_name(source)] if source else list(config.sources)
    result = RetentionResult(dry_run)
    for name in names:
        result.sources.append(_run_source(store, config, name, dry_run))
    return result


def _run_source(store: MetadataStore, config: Config, source: str, dry_run: bool) -> SourceOutcome:
    started_at = datetime.now(timezone.utc)
    archive_dir = config.archive_dir(source)
    catalog = ArchiveCatalog(store, source)
    readmitted, restorable = [], []
    if archive_dir.is_dir():
        if dry_run:
            restorable = catalog.restorable(archive_dir)
        else:
            readmitted = catalog.readmit(archive_dir)
    with store.transaction() as cur:
        if not dry_run:
            # Captures cannot commit a new required SCN (nor another retention run start)
            # until this plan is applied and committed; reading is not blocked.
            cur.execute("LOCK TABLE trailbound.capture_registration IN SHARE ROW EXCLUSIVE MODE")
        registrations = load_registrations(cur, config, source)
        entries = load_entries(cur, source)
        plan = plan_retention(source, entries, registrations, config.retention, gone=_missing(entries))
        outcome = SourceOutcome(plan, archive_dir, readmitted=readmitted, restorable=restorable,
                                advice=advice(config, source), alert=plan.alert(archive_dir))
        if dry_run:
            return outcome
        cur.execute(
            "INSERT INTO trailbound.retention_run (source, started_at, required_scn, registrations, policy,"
            " purged_segments, purged_bytes, forced_segments, warning) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " RETURNING run_id",
            (source, started_at, _value(plan.required_scn),
             json.dumps([{"group": r.group, "enabled": r.enabled, "required_scn": r.required_scn.value,
                          "committed_scn": _value(r.committed_scn), "read_scn": _value(r.read_scn)}
                         for r in registrations]),
             json.dumps(config.retention.model_dump()), len(plan.purged),
             sum(d.segment.bytes for d in plan.purged), len(plan.forced), outcome.alert))
        outcome.run_id = run_id = cur.fetchone()["run_id"]
        cur.executemany(
            "UPDATE trailbound.archive_segment SET state = 'purged', purged_at = now(), purge_reason = %s,"
            " purge_scn = %s, purge_run_id = %s, restored_at = NULL"
            " WHERE source = %s AND thread = %s AND sequence = %s AND state = 'available'",
            [(d.reason + (" (its file was already gone)" if d.gone else ""), _value(d.allowing_scn), run_id, source,
              d.segment.thread, d.segment.sequence) for d in plan.purged])
        for group, decisions in plan.needs_restore().items():
            text = (f"retention run #{run_id} purged, over maxbytes {config.retention.maxbytes}: "
                    + ", ".join(f"thread {d.segment.thread} sequence {d.segment.sequence}" for d in decisions)
                    + f"; restore them (data file and manifest) to {archive_dir}")
            cur.execute("UPDATE trailbound.capture_registration SET needs_restore ="
                        " concat_ws('; ', needs_restore, %s::text) WHERE group_name = %s", (text, group))
        # Files last, inside the transaction: if this dies before the commit, the rows stay
        # available with their files (partly) gone and the next run purges them again.
        for number, d in enumerate(plan.purged):
            if number:
                crashpoint("retention_mid_purge")  # some segments deleted, nothing committed
            _delete(d.segment)
        crashpoint("retention_after_delete")
    if outcome.alert:
        log.warning("%s", outcome.alert)
    return outcome


# ---------------------------------------------------------------- INFO RETENTION

def describe_retention(store: MetadataStore, config: Config, source: str | None = None) -> str:
    """Each registration's required SCN, the overall minimum, what a run would purge now
    and why the rest is kept."""
    names = [config.source_name(source)] if source else list(config.sources)
    result = run_retention(store, config, dry_run=True, source=source)
    lines = []
    for name, o in zip(names, result.sources):
        p = o.plan
        with store.transaction() as cur:
            entries = load_entries(cur, name)
        purged = [e for e in entries if e.state != AVAILABLE]
        policy = p.policy
        lines += [f"Source {name}, archive {o.archive_dir}",
                  f"  Segments: {len(p.decisions)} available ({p.archive_bytes} bytes on disk), {len(purged)} purged",
                  f"  Policy: minkeephours {policy.minkeephours:g} (log time), backedup {policy.backedup}, maxbytes "
                  f"{policy.maxbytes if policy.maxbytes is not None else 'none'}"]
        lines += [f"  Advice: {note}" for note in o.advice]
        lines.append("  Registrations (LOGRETENTION):")
        if not p.registrations:
            lines.append("    none: retention purges nothing of this source (register extract GROUP logretention)")
        for r in p.registrations:
            state = "enabled" if r.enabled else "unregistered"
            read = "not run yet" if r.read_scn is None else f"read below scn {r.read_scn}"
            line = (f"    EXTRACT {r.group:<8} {state}, first scn {r.first_scn}, required scn {r.required_scn}, "
                    f"{read}, updated {utc(r.updated_at)}")
            if r.note and r.committed_scn != r.required_scn:
                line += f"\n      (its last run committed required scn {r.committed_scn}; held lower now: {r.note})"
            if not r.added:
                line += "\n      (no extract group of this name is added: it holds the log until unregistered)"
            if r.needs_restore:
                line += f"\n      NEEDS RESTORE: {r.needs_restore}"
            lines.append(line)
        lines.append(f"  Minimum required SCN: {_scn(p.required_scn)}")
        lines.append(f"  Purgeable now: {len(p.purged)} segment(s), {sum(d.segment.bytes for d in p.purged)} bytes")
        lines += [f"    {text}" for text in _ranges(p.purged, gone_note=True)]
        lines.append(f"  Kept: {len(p.kept)} segment(s), {p.remaining_bytes} bytes")
        lines += [f"    {text}" for text in _ranges(p.kept)]
        if p.over_limit():
            lines.append(f"  WARNING: {p.over_limit()}")
        for s in o.restorable:
            lines.append(f"  thread {s.thread} sequence {s.sequence}: purged, its files are back; the next scan or "
                         "retention run makes it available")
        if o.alert:
            lines.append(o.alert)
    lines += ["", times_note("minkeephours counts back from the archive's newest segment", "each registration's "
                             "updated time")]
    return "\n".join(lines)
