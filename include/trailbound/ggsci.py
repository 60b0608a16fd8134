"""How the GGSCI-like reports (INFO ... SHOWCH) write their header line, times and lags, as GGSCI does."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


# One rule for every time the console prints: UTC, saying so. Times come from the metadata
# store (whose session runs in UTC, see metadata.py), the archive and the trail, all zone-aware;
# none follows the local or the database session's time zone.

def timestamp(value: datetime | str | None) -> str:
    """UTC with microseconds, saying its zone; "Not Available" for a time not known yet."""
    if value is None:
        return "Not Available"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def times_note(log: str, wall: str) -> str:
    """The line under a report saying which of its times are log time (when the source wrote
    a record) and which wall time (when trailbound did something), all in UTC."""
    return f"Times are UTC. Log time: {log}. Wall time: {wall}."


def lag(seconds: float) -> str:
    """HH:MM:SS, never negative (clocks of two machines may disagree a little)."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def header(kind: str, group: str, last_started: datetime | None, state) -> str:
    """INFO's first lines: `EXTRACT    EXT1      Last Started 2026-11-02 00:00 UTC   Status STOPPED`,
    then what the run log knows (`state`, a trailbound.runlog.RunState): an ABENDED group's
    error and its time, else when the last run ended well."""
    started = f"{last_started.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC" if last_started else "never"
    lines = [f"{kind.upper():<10} {group:<9} Last Started {started}   Status {state.status}"]
    if state.status == "ABENDED":
        lines.append(f"Last Error           {utc(state.error_time)}  {state.error}")
    elif state.last_run is not None and state.last_run.outcome == "ok":
        lines.append(f"Last Run             ended {utc(state.last_run.ended_at)}, ok")
    return "\n".join(lines)


def utc(value: datetime | str | None) -> str:
    """A wall or log time, to the second, in UTC saying so."""
    if value is None:
        return "Not Available"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return f"{value.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def duration(value: timedelta | None) -> str:
    """A lag or an age as GGSCI writes them (HH:MM:SS, hours past 99 as they come)."""
    return "" if value is None else lag(value.total_seconds())


def info_all(groups, now: datetime) -> str:
    """INFO ALL: one line per group (trailbound.status.GroupStatus), then what each
    ABENDED group's last run said."""
    lines = [f"Program     Status      Group       Lag at Chkpt  Time Since Chkpt      (as of {utc(now)})", ""]
    for g in groups:
        note = ("" if g.added else "  (not added yet)") + \
            ("" if g.configured else "  (not in this configuration)")
        lines.append(f"{g.program.upper():<11} {g.status:<11} {g.group:<11} {duration(g.lag):<13} "
                     f"{duration(g.since_checkpoint)}{note}".rstrip())
    abended = [g for g in groups if g.status == "ABENDED"]
    if abended:
        lines.append("")
    for g in abended:
        lines.append(f"{g.program.upper()} {g.group} ABENDED {utc(g.error_time)}: {g.error}")
    lines += ["", "Lag at Chkpt: the checkpoint's wall time minus the log time of the last record it covers; "
                  "Time Since Chkpt: now minus the checkpoint's wall time."]
    return "\n".join(lines)
