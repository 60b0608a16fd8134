"""INFO EXTRACT [SHOWCH [N]]: a group's status and checkpoints, laid out like GGSCI's."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from trailbound.archive.catalog import ArchiveCatalog
from trailbound.archive.segments import describe_versions, load_defs
from trailbound.capture import bounded
from trailbound.capture import checkpoints as ckpt
from trailbound.capture import recovery
from trailbound.config import Config
from trailbound.errors import ArchiveError, TrailboundError
from trailbound.ggsci import header, lag, timestamp, times_note, utc
from trailbound.metadata import MetadataStore
from trailbound.runlog import run_state

_TIMES = times_note("the read checkpoints' Timestamp and the times of open transactions and BR checkpoints "
                    "(when the source wrote the record)", "Last Started, Start Time, Last Update Time, the write "
                    "checkpoint's Timestamp and the run history")

_KIND_TITLES = {
    "startup": "Startup Checkpoint (starting position in data source)",
    "recovery": "Recovery Checkpoint (position of oldest unprocessed transaction in data source)",
    "current": "Current Checkpoint (position of last record read in the data source)",
}


def _read_block(kind: str, c: ckpt.ReadCheckpoint) -> list[str]:
    return [f"    {_KIND_TITLES[kind]}:",
            f"        Thread #: {c.position.thread}",
            f"        Sequence #: {c.position.sequence}",
            f"        RBA: {c.position.rba}",
            f"        Timestamp: {timestamp(c.ts)}",
            f"        SCN: {c.scn}",
            f"        Redo File: {c.segment or 'Not Available'}"]


def _as_used(kind: str, stored: ckpt.ReadCheckpoint, start: ckpt.ReadCheckpoint | None) -> ckpt.ReadCheckpoint:
    """The recovery checkpoint the next run uses. The stored one was written for Bounded
    Recovery (persisted transactions need no re-read); when the next run falls back to
    normal recovery, it re-reads from the start of its oldest open transaction, which may
    be earlier (GoldenGate's recovery checkpoint is that start)."""
    if kind == "recovery" and start is not None and start.position < stored.position:
        return start
    return stored


def _redo_file(store: MetadataStore, source: str, position) -> str | None:
    """The archived segment a log position is in (a transaction's start carries no file name)."""
    found = [g.path.name for g in ArchiveCatalog(store, source).segments()
             if (g.thread, g.sequence) == (position.thread, position.sequence)]
    return found[0] if found else None


def describe_bounded_recovery(store: MetadataStore, config: Config, state: ckpt.ExtractState) -> list[str]:
    """INFO EXTRACT ... --br: the last BR checkpoint, what is persisted, where the next run
    restarts and the bound Bounded Recovery guarantees."""
    extract = config.extract(state.group)
    interval = extract.effective_brinterval
    status = ("off (broff)" if extract.br.broff else
              f"suspended after a failure (broffonfailure): {state.br_suspended}" if state.br_suspended else "on")
    lines = ["", "Bounded Recovery:", f"    Status: {status}",
             f"    BR interval: {interval} (brinterval {extract.br.brinterval} rounded up to a multiple of the "
             f"capture interval {extract.interval}), measured in log time",
             f"    Directory: {bounded.group_directory(config.path(extract.br.brdir), state.group)}"]
    b = state.br_checkpoint
    if b is None:
        lines.append("    Last BR checkpoint: none yet")
    else:
        lines.append(f"    Last BR checkpoint: #{b.checkpoint_id} at scn {b.scn}, log time {utc(b.log_time)}, "
                     f"{b.persisted} persisted transaction(s), {b.persisted_bytes} bytes")
        for thread, oldest in sorted(b.oldest_nonpersisted.items(), key=lambda item: int(item[0])):
            lines.append(f"        oldest non-persisted open transaction, thread {thread}: xid {oldest['xid']!r} "
                         f"from scn {oldest['scn']} ({utc(oldest['ts'])})")
    persisted = [t for t in state.open if t.persisted]
    lines.append(f"    Persisted transactions: {len(persisted)}")
    for txn in persisted:
        p = txn.persisted
        lines.append(f"        xid {txn.xid!r} thread {txn.thread} started scn {txn.start.scn} "
                     f"({utc(txn.start.ts)}), {p.records} records through sequence {p.through.sequence} "
                     f"rba {p.through.rba}, file {p.file.name}")
    if state.read_scn is None:
        lines.append("    Next run: a first run (reads from the archive's start)")
        return lines
    # The very rules (and inputs: a pending BRRESET directive counts) the next run uses.
    plan = recovery.plan(state, extract)
    restart = recovery.restart_point(state, plan)
    lines.append(f"    Next run: {plan.describe} recovery, {restart.describe()}")
    times = [p.ts for p in restart.starts.values() if p.ts]
    if plan.restored and b is not None:
        times.append(b.log_time)
    elif state.read_time:
        times.append(state.read_time)
    if state.read_time and times:
        reread = state.read_time - min(times)
        lines.append(f"    Re-read from the last read position: {reread} of log"
                     + (f" (Bounded Recovery guarantees at most {2 * interval})" if plan.mode == recovery.BOUNDED
                        or not persisted else ""))
    return lines


def _table_versions(config: Config, group: str) -> list[str]:
    """Each source table whose definition changed while the archive was written: its
    current version and since when (defs.json; an unreadable one is capture's to report)."""
    try:
        defs = load_defs(config.archive_dir(config.source_name(config.extract(group).source)))
    except ArchiveError:
        return []
    changed = describe_versions(defs)
    return ["Table Versions       " + changed[0].strip(), *("                     " + line.strip()
                                                           for line in changed[1:])] if changed else []


def describe_extract(store: MetadataStore, config: Config, group: str, *, showch: int | None = None,
                     br: bool = False) -> str:
    name = config.extract_name(group)
    with store.transaction() as cur:
        state = ckpt.load(cur, name)
        runs = ckpt.history(cur, name, showch) if showch else []
    if state is None:
        raise TrailboundError(f"extract {name} is not added (it is added by its first run or `trailbound add extract`)")
    lines = [header("extract", name, state.last_started, run_state(store, "extract", name))]
    current = state.read["current"]
    if current and state.last_run_end:
        newest = max((c.ts for c in current.values() if c.ts), default=None)
        if newest is not None:
            ago = (datetime.now(timezone.utc) - state.last_run_end).total_seconds()
            lines.append(f"Checkpoint Lag       {lag((state.last_run_end - newest).total_seconds())} "
                         f"(updated {lag(ago)} ago)")
    for thread, c in sorted(current.items()):
        lines.append(f"Log Read Checkpoint  File {c.segment}")
        lines.append(f"                     {utc(c.ts)}  Thread {thread}, Seqno {c.position.sequence}, "
                     f"RBA {c.position.rba}")
    if not current:
        lines.append(f"Log Read Checkpoint  not yet read; begins at {state.begin_spec} (scn {state.begin_scn})")
    w = state.write
    lines.append(f"Write Checkpoint     Trail {state.exttrail}, Seqno {w.position.seqno}, RBA {w.position.rba}, "
                 f"last CSN {w.last_csn or 'none'}")
    waiting = [t for t in state.open if t.skip_reason is None]
    lines.append(f"Open Transactions    {len(waiting)}" + (f" (+{len(state.open) - len(waiting)} skipped)"
                                                           if len(state.open) > len(waiting) else ""))
    lines += _table_versions(config, name)
    if br:
        lines += describe_bounded_recovery(store, config, state)
    if showch is None:
        return "\n".join(lines + ["", _TIMES])

    lines += ["", "Current Checkpoint Detail:"]
    # What the next run does, by the very rules it uses (capture.recovery).
    plan = recovery.plan(state, config.extract(name))
    restart = recovery.restart_point(state, plan)
    threads = sorted(set().union(*(state.read[k].keys() for k in ckpt.READ_KINDS)))
    for index, thread in enumerate(threads, start=1):
        lines += ["", f"Read Checkpoint #{index}", "", "    Redo Archive"]
        for kind in ckpt.READ_KINDS:
            if thread in state.read[kind]:
                used = _as_used(kind, state.read[kind][thread], restart.starts.get(thread))
                if used.segment is None:
                    used = dataclasses.replace(used, segment=_redo_file(store, state.source, used.position))
                lines += _read_block(kind, used)
    if state.read_scn is not None:
        b = state.br_checkpoint
        if plan.mode == recovery.BOUNDED and b is not None:
            lines += ["", "    Bounded Recovery Checkpoint (where the next run restarts; persisted transactions "
                          "are restored from their files):",
                      f"        Checkpoint #: {b.checkpoint_id}", f"        SCN: {b.scn}",
                      f"        Timestamp: {timestamp(b.log_time)}",
                      f"        Persisted transactions: {b.persisted}"]
        lines += ["", f"    Next run: {plan.describe} recovery, {restart.describe()}"]
    lines += ["", "Write Checkpoint #1", "", "    Trail", "    Current Checkpoint (current write position):",
              f"        Sequence #: {w.position.seqno}", f"        RBA: {w.position.rba}", f"        Timestamp: {timestamp(w.written_at)}",
              f"        Last CSN: {w.last_csn or 'none'}", f"        Extract Trail: {state.exttrail}",
              "", "    Status:", f"        Begin = {state.begin_spec} (scn {state.begin_scn})",
              f"        Read below SCN = {state.read_scn if state.read_scn is not None else 'Not Available'}",
              f"        Start Time = {utc(state.last_started)}",
              f"        Last Update Time = {utc(state.last_run_end)}"]
    for run in runs:
        lines += ["", f"Checkpoint history: run {run['run_id']} ended {utc(run['ended_at'])}, "
                      f"read scn {run['read_from_scn']}..{run['horizon_scn']}, {run['records_read']} records read, "
                      f"{run['transactions']} transactions written"]
        read = run["checkpoints"]["read"]
        for thread in sorted(read.get("current", {}), key=int):
            c = read["current"][thread]
            r = read["recovery"].get(thread, c)
            lines.append(f"    Thread {thread}: current Seqno {c['sequence']} RBA {c['rba']} SCN {c['scn']}; "
                         f"recovery Seqno {r['sequence']} RBA {r['rba']} SCN {r['scn']}")
        wr = run["checkpoints"]["write"]
        lines.append(f"    Write: Seqno {wr['seqno']} RBA {wr['rba']} last CSN {wr['last_csn']}")
    return "\n".join(lines + ["", _TIMES])
