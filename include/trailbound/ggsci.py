"""How the GGSCI-like reports (INFO ... SHOWCH) write times and lags, as GGSCI does."""

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
