"""Begin points (ADD EXTRACT ... BEGIN, ALTER EXTRACT ... BEGIN) as SCNs.

A capture writes the transactions that start at or after its begin SCN; a transaction
already in flight there is never written (as GoldenGate, which asks you to let such
transactions finish before an initial load).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

from trailbound.archive.catalog import compute_horizon
from trailbound.archive.segments import Segment
from trailbound.errors import TrailboundError
from trailbound.positions import Scn

SPECS = "earliest | now | an ISO-8601 time | scn N"


def resolve_begin(spec: str, segments: Sequence[Segment]) -> Scn:
    """earliest: the whole archive; now: the current horizon; a time: the first segment
    boundary at or before it (segments are the archive's granularity of time); scn N."""
    text = spec.strip()
    lowered = text.lower()
    if lowered == "earliest":
        return Scn(0)
    if lowered == "now":
        horizon = compute_horizon(segments)
        return Scn(0) if horizon is None else horizon.scn
    if lowered.startswith("scn"):
        try:
            value = int(text[3:].strip())
        except ValueError:
            raise TrailboundError(f"begin {spec!r}: expected {SPECS}") from None
        if value < 0:
            raise TrailboundError(f"begin {spec!r}: an SCN is not negative")
        return Scn(value)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise TrailboundError(f"begin {spec!r}: expected {SPECS}") from None
    moment = moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment
    covering = [s.first_scn for s in segments if s.next_time > moment]
    if covering:
        return min(covering)
    horizon = compute_horizon(segments)
    return horizon.scn if horizon else Scn(0)
