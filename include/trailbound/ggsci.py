"""How the GGSCI-like reports (INFO ... SHOWCH) write their header line, times and lags, as GGSCI does."""

from __future__ import annotations

from datetime import datetime, timezone


def timestamp(value: datetime | str | None) -> str:
    """UTC with microseconds; "Not Available" for a time not known yet."""
    if value is None:
        return "Not Available"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def lag(seconds: float) -> str:
    """HH:MM:SS, never negative (clocks of two machines may disagree a little)."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def header(kind: str, group: str, last_started: datetime | None, running: bool) -> str:
    """INFO's first line: `EXTRACT    EXT1      Last Started 2026-11-02 00:00   Status STOPPED`."""
    started = f"{last_started:%Y-%m-%d %H:%M}" if last_started else "never"
    return f"{kind.upper():<10} {group:<9} Last Started {started}   Status {'RUNNING' if running else 'STOPPED'}"
