"""The confirm-out-of-sync step: a row that differs is only reported once the replicat
has applied past the source's WAL position at which the row was read.

A round, for the differences whose position the replicat has passed: read the target's
row, then the source's again. The target now equal to what the source showed: it was in
flight, and it is in sync. The target still different and the source unchanged since
that read (the same image and the same row version, its xmin): out of sync, confirmed.
The source changed meanwhile: still in flight; the new source image, with its new
position, goes to the next round. Rounds go on until
every difference is decided or the wait is over; what is left is reported as in flight,
never as out of sync.

How far the replicat has applied (`applied_through`): every commit at or below the
checkpoint table's log_csn; and, when the replicat has applied everything the source's
extracts wrote, everything below the position those extracts have read to (an idle
source's pulls move that on although nothing commits).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from trailbound.compare import sides
from trailbound.compare.sides import RowDifference, TableSpec
from trailbound.config import Config
from trailbound.positions import Scn


def lsn_text(scn: Scn) -> str:
    """A WAL position as PostgreSQL prints it (X/Y); the archive's scn is the integer."""
    value = scn.value
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}" if value >= 0 else "none"


def applied_through(store, config: Config, group: str, target_connection) -> Scn:
    """The source position through which the replicat has applied every commit (Scn(0):
    nothing known)."""
    from trailbound.capture import checkpoints as capture_checkpoints
    from trailbound.replicat import checkpoint_table as ckt

    replicat = config.replicat(group)
    with target_connection.cursor() as cur:
        row = ckt.read(cur, ckt.CheckpointTableName.parse(replicat.checkpointtable), group)
    log_csn = row.log_csn if row else None
    through = log_csn.scn if log_csn else 0
    source = config.source_name(replicat.source)
    names = [name for name, extract in config.extracts.items() if config.source_name(extract.source) == source]
    with store.transaction() as cur:
        states = [capture_checkpoints.load(cur, name) for name in names]
    read_to = []
    for state in states:
        if state is None or state.read_scn is None:
            return Scn(through)
        written = state.write.last_csn
        if written is not None and (log_csn is None or log_csn < written):
            return Scn(through)  # that extract wrote something the replicat has not applied yet
        read_to.append(state.read_scn.value - 1)
    return Scn(max(through, min(read_to))) if read_to else Scn(through)


@dataclass
class Outcome:
    confirmed: list[RowDifference]
    in_flight: list[RowDifference]
    rounds: int
    applied: Scn
    note: str | None


def confirm(pending: list[RowDifference], specs: dict[str, TableSpec], source_connection, target_connection,
            applied: Callable[[], Scn], *, wait_seconds: float, catch_up: Callable[[], None] | None = None,
            poll_seconds: float = 5.0, max_rounds: int = 10) -> Outcome:
    """Decide every difference (see the module's docstring). `applied` says how far the
    replicat has applied; while nothing pending is behind it, `catch_up` runs (a test
    runs the pipeline's stages there), else the step sleeps, up to `wait_seconds`."""
    deadline = time.monotonic() + wait_seconds
    confirmed: list[RowDifference] = []
    rounds = 0
    through = applied()
    while pending and rounds < max_rounds:
        ready = [d for d in pending if d.lsn <= through]
        if not ready:
            if time.monotonic() >= deadline:
                break
            if catch_up is not None:
                catch_up()
            else:
                time.sleep(max(0.0, min(poll_seconds, deadline - time.monotonic())))
            through = applied()
            continue
        rounds += 1
        pending = [d for d in pending if d.lsn > through]
        for table in sorted({d.table for d in ready}):
            spec = specs[table]
            mine = [d for d in ready if d.table == table]
            keys = [d.key_values for d in mine if d.key_values is not None]
            target_rows = sides.rows(target_connection, spec, spec.target_rel, keys=keys)
            source_rows = sides.rows(source_connection, spec, spec.source_rel, keys=keys, versions=True)
            lsn = sides.current_lsn(source_connection)
            for d in mine:
                now_target = target_rows.get(d.key, (None, None))[1]
                _, now_source, *version = source_rows.get(d.key, (None, None))
                now_version = version[0] if version else None
                if now_target == d.source:
                    continue  # the replicat brought it in line: it was in flight
                # Unchanged means the same version, not only the same image: a row changed
                # and changed back (pgbench's balances do) showed its first image again while
                # the target held the change between, and that was reported out of sync.
                if now_source == d.source and (d.source_version is None or now_version == d.source_version):
                    confirmed.append(RowDifference(d.table, d.key, d.key_values, d.source, now_target, d.lsn,
                                                   d.source_version))
                else:
                    pending.append(RowDifference(d.table, d.key, d.key_values, now_source, now_target, lsn,
                                                 now_version))
        through = applied()
    note = None
    if pending:
        waited = max(d.lsn for d in pending)
        note = (f"{sum(d.count() for d in pending)} row(s) still in flight: read at source positions up to "
                f"{lsn_text(waited)} (scn {waited}), and the replicat has applied through {lsn_text(through)} "
                f"(scn {through}); "
                + (f"they kept changing over {rounds} round(s)" if rounds >= max_rounds else
                   f"it did not get past them within {wait_seconds:g} s")
                + ". Is the pipeline running (archive pull, extract, pump, replicat)? Compare again later: a row "
                  "still different once the replicat is past it is then confirmed")
    return Outcome(confirmed, pending, rounds, through, note)
