"""Recovery rules: where the next capture run restarts in the redo archive, the lowest SCN
it can need from it, and whether it uses Bounded Recovery.

Every capture run is a restart (GoldenGate: Extract's recovery). Normal recovery re-reads
each thread from the start of its oldest open transaction, or where the last run
stopped. Bounded Recovery restores the transactions persisted at the last BR checkpoint
from their files and re-reads only from that checkpoint (docs/bounded-recovery.md). The
run (capture.run), INFO EXTRACT --br (capture.info) and archive-log retention
(retention, capture.checkpoints' registration) all ask this module, with the same
inputs, so what INFO predicts and what retention keeps is what the next run does.

Imports checkpoints (the state) and bounded (the persisted files); no Spark, no I/O
beyond checking persisted files.
"""

from __future__ import annotations

from dataclasses import dataclass

from trailbound.capture import bounded
from trailbound.capture import checkpoints as ckpt
from trailbound.config import ExtractConfig
from trailbound.positions import Scn
from trailbound.tables import table_spec

NORMAL, BOUNDED = "normal", "bounded"


@dataclass(frozen=True)
class RecoveryPlan:
    mode: str                                  # NORMAL or BOUNDED
    restored: list[ckpt.OpenTransaction]       # whose persisted object is restored
    reason: str | None = None                  # why BR was not used although it could have been (a warning)

    @property
    def describe(self) -> str:
        return self.mode if self.reason is None else f"{self.mode} (fallback: {self.reason})"


def brreset_pending(state: ckpt.ExtractState) -> bool:
    """START EXTRACT ... BRRESET left a directive the next run carries out."""
    return any(d.kind == "brreset" for d in state.directives)


def plan(state: ckpt.ExtractState, extract: ExtractConfig, *, brreset: bool = False) -> RecoveryPlan:
    """The next run's recovery: bounded when there are persisted transactions and
    everything about them can be trusted; otherwise normal (with the reason as a
    warning). `brreset`: this run was asked for normal recovery; a pending BRRESET
    directive counts the same."""
    persisted = [t for t in state.open if t.persisted is not None and t.skip_reason is None]
    if not persisted:
        return RecoveryPlan(NORMAL, [])
    if extract.br.broff:
        return RecoveryPlan(NORMAL, [], "BR is off (broff)")
    if brreset or brreset_pending(state):
        return RecoveryPlan(NORMAL, [], "brreset requested")
    if state.br_suspended:
        return RecoveryPlan(NORMAL, [], f"BR suspended after a failure (broffonfailure): {state.br_suspended}")
    if state.br_checkpoint is None or state.br_checkpoint.table_spec != table_spec(extract.table):
        return RecoveryPlan(NORMAL, [], "the table selection changed since the BR checkpoint")
    for txn in persisted:
        fault = bounded.fault(txn.persisted)
        if fault:
            return RecoveryPlan(NORMAL, [], fault)
    return RecoveryPlan(BOUNDED, persisted)


def committed_plan(state: ckpt.ExtractState) -> RecoveryPlan:
    """The plan a run that is committing `state` leaves for its successor, without the
    configuration or the files: persisted objects survive a run only when BR was on for
    it (restored, or written by its checkpoint), so the state itself says whether they
    are usable. Retention re-plans with `plan` before it purges anything."""
    persisted = [t for t in state.open if t.persisted is not None and t.skip_reason is None]
    if persisted and state.br_suspended is None and state.br_checkpoint is not None:
        return RecoveryPlan(BOUNDED, persisted)
    return RecoveryPlan(NORMAL, [])


@dataclass(frozen=True)
class RestartPoint:
    """Where a run starts reading: every thread from `from_scn` (None: from the start of
    the archive), and the threads in `starts` from those positions when earlier."""

    from_scn: Scn | None
    starts: dict[int, ckpt.ReadCheckpoint]

    def floor(self, thread: int) -> Scn | None:
        """The lowest SCN needed from a thread (segments wholly below it are not read)."""
        if self.from_scn is None:
            return None
        start = self.starts.get(thread)
        return self.from_scn if start is None else min(start.scn, self.from_scn)

    def describe(self) -> str:
        if self.from_scn is None:
            return "reads from the archive's start"
        return (f"re-reads every thread from scn {self.from_scn}"
                + "".join(f"; thread {t} from {p.position} (scn {p.scn})" for t, p in sorted(self.starts.items())))


def _reread(state: ckpt.ExtractState, plan: RecoveryPlan) -> list[ckpt.OpenTransaction]:
    """The open transactions the next run rebuilds from the log: all that will be
    written (not skipped), except those it restores from their persisted files."""
    restored = {(t.thread, t.xid) for t in plan.restored}
    return [t for t in state.open if t.skip_reason is None and (t.thread, t.xid) not in restored]


def restart_point(state: ckpt.ExtractState, plan: RecoveryPlan) -> RestartPoint:
    """Normal recovery: each thread from its oldest open transaction that will be
    written, else where the last run stopped. Bounded recovery: restored transactions
    need no re-read from their start, only from the BR checkpoint that persisted them."""
    if state.read_scn is None:
        return RestartPoint(None, {})
    starts: dict[int, ckpt.ReadCheckpoint] = {}
    for txn in _reread(state, plan):
        current = starts.get(txn.thread)
        if current is None or txn.start.position < current.position:
            starts[txn.thread] = txn.start
    from_scn = state.read_scn
    if plan.restored:
        from_scn = min(from_scn, state.br_checkpoint.scn)
    return RestartPoint(from_scn, starts)


def required_scn(state: ckpt.ExtractState, plan: RecoveryPlan) -> Scn:
    """The lowest SCN the next run, recovering by `plan`, needs from the archive:
    archive-log retention's REQUIRED_CHECKPOINT_SCN. Before the first run (or after
    `alter extract ... begin`), the begin SCN."""
    if state.read_scn is None:
        return state.begin_scn
    return min([restart_point(state, plan).from_scn, *(t.start.scn for t in _reread(state, plan))])


def normal_restart_scn(state: ckpt.ExtractState) -> Scn:
    """Where a restart without Bounded Recovery reads from: what a trail file's log_bsn
    carries (GoldenGate's recovery SCN for the transactions in it)."""
    return required_scn(state, RecoveryPlan(NORMAL, []))
