"""Group status: `trailbound info all`, and INFO of the groups a wildcard matches."""

from __future__ import annotations

import os
from datetime import timezone
from typing import Callable

from trailbound.cli.context import Context, verb
from trailbound.errors import TrailboundError


def info_groups(ctx: Context, program: str, describe: Callable[[str], str]) -> int:
    """INFO EXTRACT|PUMP|REPLICAT GROUP, where GROUP may hold GGSCI's wildcards (* ?):
    each group's report."""
    from trailbound import status

    pattern = ctx.args.group
    if not any(c in pattern for c in "*?"):
        try:
            print(describe(pattern))  # its own error when the group is not configured or added
        except TrailboundError as exc:
            if not os.path.lexists(pattern):
                raise
            # `info extract *` in a directory holding one file: the shell gave us its name.
            raise TrailboundError(f"{exc}. {pattern!r} is a file here: if you typed an unquoted * or ?, the shell "
                                  f"expanded it; quote the wildcard: trailbound info {program} '*'") from None
        return 0
    # A group of another configuration on the same store has no report here (INFO ALL lists it).
    added = [g for g in status.info_all(ctx.store, ctx.config, pattern=pattern, programs=(program,))
             if g.added and g.configured]
    if not added:
        raise TrailboundError(f"no {program} group matching {pattern!r} is added")
    print("\n\n".join(describe(g.group) for g in added))
    return 0


def info_all(ctx: Context) -> int:
    """INFO ALL: every extract, pump and replicat; status, lag at checkpoint, time since;
    then each replicat's last heartbeat: end-to-end lag and each hop's share."""
    from datetime import datetime as _datetime

    from trailbound import ggsci, heartbeat, status

    now = _datetime.now(timezone.utc)
    print(ggsci.info_all(status.info_all(ctx.store, ctx.config, now=now), now))
    with ctx.store.transaction() as cur:
        beats = heartbeat.latest(cur)
    if beats:  # the true end-to-end lag, beside each hop's lag at checkpoint above
        print("\n" + "\n".join(f"REPLICAT {beat.group}  {heartbeat.describe(beat, now)}" for beat in beats))
    return 0


def arguments(kinds) -> None:
    verb(kinds["info"], "all", info_all, "every extract, pump and replicat: status (RUNNING, STOPPED, ABENDED), "
                                         "lag at checkpoint, time since checkpoint (INFO ALL)")
