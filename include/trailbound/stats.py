"""What GGSCI answers about one group, as text: STATS (operations per table, from
trailbound.run_table_counts), LAG (from the checkpoints), VIEW REPORT (a run: what it
did and its counts) and SEND REPLICAT ... STATUS (a batch replicat's run in progress and
its checkpoint).

Times are UTC (ggsci.py). STATS' periods, GoldenGate's: total (every counted run),
daily (counts committed since midnight), hourly (since the hour began), latest (the
group's last run that counted anything). A run's counts are those its checkpoints
committed: a run that failed records none (its replicat_run row is missing too), a
pump's run counts each file it committed. Discards are the operations replicat's REPERROR
rules set aside (discard, transdiscard), not counted as inserts, updates or deletes;
collisions are HANDLECOLLISIONS' where replicat applies a group one statement at a time
(the fast path applies a colliding group that way).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from fnmatch import fnmatchcase

from psycopg2 import sql

from trailbound import ggsci, heartbeat, idle, runlog
from trailbound import status as group_status
from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.metadata import MetadataStore
from trailbound.runcounts import COLUMNS, column_sums

STAGES = ("extract", "pump", "replicat")
PERIODS = ("total", "daily", "hourly", "latest")
_VERB = {"extract": "Extracting", "pump": "Extracting", "replicat": "Replicating"}
_RUN_TABLE = {"extract": "extract_run", "pump": "pump_run", "replicat": "replicat_run"}


def group_name(config: Config, stage: str, group: str) -> str:
    """The configured name of `group` (its own error when no such group is configured)."""
    if stage not in STAGES:
        raise TrailboundError(f"{stage!r} is not one of {', '.join(STAGES)}")
    return getattr(config, f"{stage}_name")(group)


# ---------------------------------------------------------------- STATS


@dataclass(frozen=True)
class TableStats:
    """One table's counts over one period."""

    table: str
    target: str | None
    counts: dict[str, int]

    @property
    def operations(self) -> int:
        return sum(self.counts[c] for c in ("inserts", "updates", "deletes", "truncates"))


def table_stats(store: MetadataStore, stage: str, group: str, *, since: datetime | None = None,
                run_id: int | None = None) -> list[TableStats]:
    """Counts per table of the group's runs whose counts were committed at or after
    `since` (None: all), or of one run."""
    where, params = ["stage = %s", "group_name = upper(%s)"], [stage, group]
    if since is not None:
        where.append("recorded_at >= %s")
        params.append(since)
    if run_id is not None:
        where.append("run_id = %s")
        params.append(run_id)
    with store.transaction() as cur:
        cur.execute(sql.SQL("SELECT table_name, max(target_table) AS target_table, {} FROM trailbound.run_table_counts"
                            " WHERE {} GROUP BY table_name ORDER BY table_name").format(
                                column_sums(), sql.SQL(" AND ".join(where))), params)
        return [TableStats(r["table_name"], r["target_table"], {c: r[c] for c in COLUMNS}) for r in cur.fetchall()]


def _period_starts(store: MetadataStore, stage: str, group: str,
                   now: datetime) -> dict[str, tuple[datetime | None, int | None]]:
    """Each period's start, and the run it is limited to (latest)."""
    with store.transaction() as cur:
        cur.execute("SELECT min(run_started_at) AS first, max(run_id) AS last_run FROM trailbound.run_table_counts"
                    " WHERE stage = %s AND group_name = upper(%s)", (stage, group))
        row = cur.fetchone()
        latest_start = None
        if row["last_run"] is not None:
            cur.execute("SELECT min(run_started_at) AS started FROM trailbound.run_table_counts WHERE stage = %s"
                        " AND group_name = upper(%s) AND run_id = %s", (stage, group, row["last_run"]))
            latest_start = cur.fetchone()["started"]
    day = now.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return {"total": (row["first"], None), "daily": (day, None), "hourly": (day.replace(hour=now.hour), None),
            "latest": (latest_start, row["last_run"])}


def stats_report(store: MetadataStore, config: Config, stage: str, group: str, *, table: str | None = None,
                 totalsonly: str | None = None, periods: tuple[str, ...] = PERIODS,
                 now: datetime | None = None) -> str:
    """STATS EXTRACT|PUMP|REPLICAT GROUP [TABLE pattern] [TOTALSONLY pattern] [TOTAL|DAILY|
    HOURLY|LATEST], laid out as GGSCI does."""
    name = group_name(config, stage, group)
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    starts = _period_starts(store, stage, name, now)
    pattern = (totalsonly or table or "*").upper()
    lines = [f"Sending STATS request to {stage.upper()} {name.upper()} ...", "",
             f"Start of Statistics at {ggsci.utc(now)}.", ""]
    if starts["total"][0] is None:
        lines += [f"No operations have been counted for {stage} {name.upper()} yet (its runs record them as they "
                  "commit).", "", "End of Statistics."]
        return "\n".join(lines)
    by_period = {}
    for period in periods:
        since, run_id = starts[period]
        rows = table_stats(store, stage, name, since=None if period in ("total", "latest") else since, run_id=run_id)
        by_period[period] = (since, [r for r in rows if fnmatchcase(r.table.upper(), pattern)])
    if totalsonly is not None:
        lines += [f"Cumulative totals for the tables matching {totalsonly}:", ""]
        for period in periods:
            since, rows = by_period[period]
            summed = {c: sum(r.counts[c] for r in rows) for c in COLUMNS}
            lines += _section(period, since, TableStats("*", None, summed) if rows else None)
    else:
        tables = sorted({r.table for _, rows in by_period.values() for r in rows})
        if not tables:
            lines += [f"No operations counted for a table matching {table}.", ""]
        for name_of_table in tables:
            found = {p: next((r for r in rows if r.table == name_of_table), None) for p, (_, rows) in by_period.items()}
            target = next((r.target for r in found.values() if r is not None and r.target), None)
            lines += [f"{_VERB[stage]} from {name_of_table} to {target or name_of_table}:", ""]
            for period in periods:
                lines += _section(period, by_period[period][0], found[period])
    lines.append("End of Statistics.")
    if stage == "replicat":
        lines += ["", "Discards: operations REPERROR set aside (discard, transdiscard; `trailbound discards GROUP`), "
                      "not counted as applied. Collisions: HANDLECOLLISIONS, counted where replicat applies records "
                      "one statement at a time."]
    return "\n".join(lines)


def _section(period: str, since: datetime | None, row: TableStats | None) -> list[str]:
    lines = [f"*** {period.capitalize()} statistics since {ggsci.utc(since)} ***"]
    if row is None or not (row.operations or row.counts["discards"] or row.counts["collisions"]):
        return lines + ["\tNo database operations have been performed.", ""]
    for column in COLUMNS:
        lines.append(f"\t{'Total ' + column:<40}{row.counts[column]:>16,.2f}")
    lines.append(f"\t{'Total operations':<40}{row.operations:>16,.2f}")
    return lines + [""]


# ---------------------------------------------------------------- LAG


def _waiting(store: MetadataStore, config: Config, stage: str, name: str) -> tuple[str | None, int | None]:
    """(why the group is at EOF, or None; the trail records past its checkpoint, when known)."""
    if stage == "extract":
        return idle.capture_idle(store, config, name, None), None
    if stage == "pump":
        from trailbound.pump import checkpoints as pck
        from trailbound.pump.run import _pending_files

        with store.transaction() as cur:
            state = pck.load(cur, name)
            if state is None:
                return None, None
            rows = _pending_files(cur, state)
        return (None if rows else "at EOF"), sum(r["records"] for r in rows)
    from trailbound.replicat import checkpoints as rck
    from trailbound.replicat.run import pending_files

    with store.transaction() as cur:
        state = rck.load(cur, name)
        if state is None:
            return None, None
        files, start_rba = pending_files(cur, state, state.checkpoint.position)
    remaining = sum(f.records for f in files) - start_rba if files else 0
    return (None if remaining > 0 else "at EOF"), remaining


def lag_report(store: MetadataStore, config: Config, stage: str, group: str, *, now: datetime | None = None) -> str:
    """LAG EXTRACT|PUMP|REPLICAT GROUP: the last record's lag at the group's checkpoint,
    and whether anything waits for it."""
    name = group_name(config, stage, group)
    now = now or datetime.now(timezone.utc)
    found = group_status.info_all(store, config, now=now, pattern=name, programs=(stage,))
    row = next((g for g in found if g.group.upper() == name.upper()), None)
    lines = [f"Sending GETLAG request to {stage.upper()} {name.upper()} ..."]
    if row is None or not row.added:
        return "\n".join(lines + [f"{stage.upper()} {name.upper()} is not added yet: no checkpoint, no lag."])
    if row.lag is None:
        lines.append("Last record lag: Not Available (no record processed yet).")
    else:
        lines.append(f"Last record lag {int(row.lag.total_seconds())} seconds.")
    lines.append(f"Checkpoint at {ggsci.utc(row.checkpoint_time)} ({ggsci.duration(row.since_checkpoint)} ago); "
                 f"status {row.status}.")
    eof, remaining = _waiting(store, config, stage, name)
    if eof is not None:
        lines.append("At EOF, no more records to process.")
    elif remaining:
        lines.append(f"{remaining} record(s) of the committed trail wait to be processed (the next run takes them).")
    else:
        lines.append("Archived log waits to be read (the next run takes it).")
    lines.append("Lag: the checkpoint's wall time minus the log time of the last record it covers (UTC clocks).")
    if stage == "replicat":
        with store.transaction() as cur:
            beats = heartbeat.latest(cur, name)
        lines += [heartbeat.describe(beat, now) for beat in beats]
    return "\n".join(lines)


def heartbeat_report(store: MetadataStore, *, now: datetime | None = None, history: int = 10) -> str:
    """`trailbound lag`: per replicat and source, the last heartbeat's end-to-end lag and
    each hop's share, then the last `history` heartbeats applied (lag over time)."""
    now = now or datetime.now(timezone.utc)
    with store.transaction() as cur:
        beats = heartbeat.latest(cur)
        recent = {(b.group, b.source): heartbeat.history(cur, b.group, limit=history, source=b.source) for b in beats}
    if not beats:
        return ("No heartbeat applied yet: `trailbound add heartbeattable SRC` on a live source (or `simulate "
                "--heartbeat-seconds S`), then a pull, capture, pump and replicat (docs/heartbeat.md).")
    lines = []
    for beat in beats:
        lines += [f"REPLICAT {beat.group}: {heartbeat.describe(beat, now)}",
                  f"  {'applied (UTC)':<20} {'seq':>8} {'total':>10} "
                  + " ".join(f"{hop:>10}" for hop in heartbeat.HOPS)]
        for old in recent[beat.group, beat.source]:
            lags = old.lags()
            lines.append(f"  {ggsci.utc(old.applied_at):<20} {old.seq:>8} {_lag_cell(lags['total'])} "
                         + " ".join(_lag_cell(lags[hop]) for hop in heartbeat.HOPS))
    lines.append("Lags in seconds between consecutive stamps (source, archive, capture, pump, replicat); each from "
                 "its own host's clock.")
    return "\n".join(lines)


def _lag_cell(seconds: float | None) -> str:
    return f"{'-' if seconds is None else f'{seconds:.1f}':>10}"


# ---------------------------------------------------------------- VIEW REPORT


def _kind_of(config: Config, store: MetadataStore, group: str) -> tuple[str, str]:
    for stage in STAGES:
        try:
            return stage, group_name(config, stage, group)
        except TrailboundError:
            continue
    with store.transaction() as cur:  # a group since removed from the configuration
        cur.execute("SELECT kind FROM trailbound.run_outcome WHERE group_name = upper(%s) ORDER BY run_id DESC"
                    " LIMIT 1", (group,))
        row = cur.fetchone()
    if row is None:
        raise TrailboundError(f"no extract, pump or replicat named {group!r} in the configuration, and no run of it "
                              "recorded")
    return row["kind"], group.upper()


def _stage_rows(store: MetadataStore, stage: str, name: str, outcome: runlog.RunOutcome) -> list[dict]:
    """The stage's history rows (what the run committed) of the run `outcome` records."""
    with store.transaction() as cur:
        # The table name is one of _RUN_TABLE's fixed names, never user input.
        cur.execute(sql.SQL("SELECT * FROM {} WHERE group_name = upper(%s) AND started_at >= %s"
                            " AND started_at <= coalesce(%s, now()) ORDER BY run_id").format(
                                sql.Identifier("trailbound", _RUN_TABLE[stage])),
                    (name, outcome.started_at, outcome.ended_at))
        return cur.fetchall()


def _summary(stage: str, name: str, row: dict) -> str:
    """The line the run printed, rebuilt from its history row."""
    if stage == "replicat":
        return (f"Replicat {name}: from {row['started_from']} at seqno {row['start_seqno']} rba {row['start_rba']}, "
                f"applied {row['transactions']} transactions ({row['operations']} operations) in {row['groups']} "
                f"target transactions; skipped {row['skipped']} already applied; now at seqno {row['end_seqno']} rba "
                f"{row['end_rba']}, log_csn {row['log_csn'] or 'none'}"
                + (f"; {row['collisions']} collision(s) handled (HANDLECOLLISIONS)" if row["collisions"] else ""))
    if stage == "pump":
        return (f"Pump {name}: read {row['files_read']} file(s), {row['records_read']} records; wrote "
                f"{row['files_written']} file(s), {row['records_written']} records; checkpoints "
                f"read {row['checkpoints'].get('read')} write {row['checkpoints'].get('write')}")
    return (f"Extract {name}: {row.get('recovery') or ''} recovery: read {row['records_read']} records below scn "
            f"{row['horizon_scn']}, wrote {row['transactions']} transactions ({row['records_written']} records)"
            + (f"; records {row['assembly']}" if row.get("assembly") else ""))


def view_report(store: MetadataStore, config: Config, group: str, *, run: int | None = None) -> str:
    """VIEW REPORT GROUP: a run (the last, or run N of trailbound.run_outcome): its
    command, times, outcome, error, what it committed and its counts per table."""
    stage, name = _kind_of(config, store, group)
    runs = runlog.history(store, stage, name, limit=1000)
    if not runs:
        raise TrailboundError(f"{stage} {name.upper()} has no run recorded yet")
    if run is None:
        outcome = runs[0]
    else:
        outcome = next((r for r in runs if r.run_id == run), None)
        if outcome is None:
            raise TrailboundError(f"{stage} {name.upper()} has no run {run}; its runs: "
                                  + ", ".join(str(r.run_id) for r in runs[:20]))
    took = (outcome.ended_at - outcome.started_at) if outcome.ended_at else None
    bar = "*" * 79
    lines = [bar, f"{'':>20}trailbound {stage.upper()} {name.upper()}: run {outcome.run_id}", bar,
             f"Command:   {outcome.command}",
             f"Started:   {ggsci.utc(outcome.started_at)}",
             f"Ended:     {ggsci.utc(outcome.ended_at)}" + (f" (took {ggsci.duration(took)})" if took else
                                                          " (still running, or killed)"),
             f"Outcome:   {outcome.outcome.upper()}"]
    if outcome.error:
        lines.append(f"Error:     {outcome.error}")
    rows = _stage_rows(store, stage, name, outcome)
    lines.append("")
    if not rows:
        lines.append("The run committed nothing (no checkpoint moved: nothing new, or it failed first).")
    for row in rows:
        lines.append(_summary(stage, name.upper(), row))
        timings = row.get("timings")
        if timings:
            lines.append("Time per phase: " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()))
    counts = [c for row in rows for c in table_stats(store, stage, name, run_id=row["run_id"])]
    if counts:
        lines += ["", "Operations per table:",
                  f"  {'table':<32} {'target':<32} " + " ".join(f"{c:>10}" for c in COLUMNS)]
        for c in counts:
            lines.append(f"  {c.table:<32} {c.target or '':<32} " + " ".join(f"{c.counts[k]:>10}" for k in COLUMNS))
    others = [f"{r.run_id} {r.outcome}" for r in runs[:10] if r.run_id != outcome.run_id]
    if others:
        lines += ["", "Other runs (view report " + name.upper() + " --run N): " + ", ".join(others)]
    return "\n".join(lines)


# ---------------------------------------------------------------- SEND REPLICAT ... STATUS


def replicat_status(store: MetadataStore, config: Config, group: str, *, now: datetime | None = None) -> str:
    """SEND REPLICAT GROUP, STATUS for a batch replicat: whether a run is in progress
    (its group lock), the file checkpoint (written as groups commit, at most a few seconds
    behind the target's checkpoint table) and what waits after it."""
    from trailbound.replicat import checkpoints as rck

    name = group_name(config, "replicat", group)
    now = now or datetime.now(timezone.utc)
    state = runlog.run_state(store, "replicat", name)
    with store.transaction() as cur:
        checkpoint = rck.load(cur, name)
    lines = [f"Sending STATUS request to REPLICAT {name.upper()} ..."]
    last = state.last_run
    if state.status == "RUNNING":
        running = next((r for r in runlog.history(store, "replicat", name, limit=5) if r.outcome == "running"), last)
        since = f" (run {running.run_id} started {ggsci.utc(running.started_at)}, " \
                f"{ggsci.duration(now - running.started_at)} ago)" if running else ""
        lines.append(f"  Current status: Processing data{since}")
    elif state.status == "ABENDED":
        lines.append(f"  Current status: Not running: ABENDED at {ggsci.utc(state.error_time)}: {state.error}")
    else:
        ended = f"; last run {last.run_id} ended {ggsci.utc(last.ended_at)}, ok" if last else "; no run yet"
        lines.append(f"  Current status: Not running (a batch replicat runs when its schedule starts it){ended}")
    if checkpoint is None:
        lines.append("  Checkpoint: none (not added yet: its first run adds it)")
        return "\n".join(lines)
    c = checkpoint.checkpoint
    lines.append(f"  Sequence #: {c.position.seqno}, RBA: {c.position.rba} (file checkpoint, written "
                 f"{ggsci.utc(checkpoint.updated_at)})")
    lines.append(f"  Last applied CSN: {c.log_csn or 'none'}, committed at source {ggsci.utc(c.audit_ts)} (log time)")
    eof, remaining = _waiting(store, config, "replicat", name)
    lines.append("  At EOF, no more records to process" if eof is not None
                 else f"  {remaining} record(s) of the committed trail after this position")
    return "\n".join(lines)
