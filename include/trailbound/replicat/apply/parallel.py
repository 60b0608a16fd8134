"""Parallel apply (GoldenGate's APPLY_PARALLELISM): groups that only insert run on
several target sessions at once and commit one after another, in trail order.

One session spends most of a group's time waiting: for the server to set up each COPY,
for the commit, for the round trips in between. With `apply_parallelism` sessions
("lanes"), group g+1 sends its rows while g is still being applied. What stays as it was:

- **Exactly once.** A lane writes its group's checkpoint row and commits only once the
  group before it has committed (it waits for that group's outcome), so the committed
  groups are always a prefix of the trail and the checkpoint row names its end. A crash
  anywhere rolls back the groups not committed; the next run starts after the last one
  that was.
- **The same result as one at a time.** Only groups whose every unit inserts new rows
  (no staged delete, update or key move, no TRUNCATE) go to the lanes, and only in a
  chunk that no load window can touch. New rows of consecutive groups have different
  keys unless the trail inserts one key twice, which fails as it would have anyway.
- **Failures are handled as before.** When a group fails, every group after it rolls
  back without committing; the failed one is replayed transaction by transaction (a
  row the target refuses) or applied again alone (a lock wait ended by lock_timeout, a
  deadlock), and the rest follow.

Locks: a parallel group waits only for earlier groups (an insert waits for an
uncommitted duplicate key, or for the row a foreign key references). The one way an
earlier group could wait for a later one is a key inserted twice, the later insert first:
the earlier then waits for a lock held by a group that waits for it to commit. The
lanes' `lock_timeout` ends that wait: the earlier is applied alone, the later after it
(where the duplicate fails, or HANDLECOLLISIONS absorbs it, as on one session).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from trailbound.crash import crashpoint
from trailbound.errors import TrailboundError
from trailbound.replicat import target as tgt
from trailbound.replicat.apply import DATA_ERRORS, Collision, NeedsReplay, copychain
from trailbound.replicat.apply.serial import FastApplier
from trailbound.replicat.chunks import Chunk, Group

log = logging.getLogger("trailbound.replicat")
# Long enough for a later group's insert to wait out an earlier group's commit (a
# foreign key to a row it inserts); it only ends a wait that would never end.
LOCK_TIMEOUT = "5s"
# Errors after which a group is applied again alone: lock_timeout, a deadlock, a
# serialization failure. Nothing of the group was committed.
APPLY_ALONE = (psycopg2.errors.LockNotAvailable, psycopg2.extensions.TransactionRollbackError)


@dataclass
class Outcome:
    committed: bool
    error: BaseException | None = None
    statements: float = 0.0     # seconds sending the group's rows
    waiting: float = 0.0        # seconds waiting for the group before it to commit
    committing: float = 0.0     # seconds writing the checkpoint row and committing


class Lane:
    """One target session of its own, and the thread that drives it. The session opens on
    that thread as soon as the lane is made, while the run goes on (`ready` waits)."""

    def __init__(self, number: int, connect, plans):
        self.number, self.connection, self.fast = number, None, None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"replicat-lane-{number}")
        self._opened = self.pool.submit(self._open, connect, plans)

    def _open(self, connect, plans) -> None:
        connection = connect()
        try:
            # The lane opens and ends its transactions itself, each with a statement it
            # sends anyway (see ParallelApply._apply).
            connection.autocommit = True
            with connection.cursor() as cur:
                cur.execute("SET lock_timeout = %s", (LOCK_TIMEOUT,))
        except BaseException:
            connection.close()
            raise
        self.connection, self.fast = connection, FastApplier(connection, plans)

    def ready(self) -> None:
        """Wait for the session; raise what opening it raised."""
        self._opened.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self.connection is not None and not self.connection.closed:
            self.connection.close()


@dataclass
class _Todo:
    chunk: Chunk
    group: Group
    parallel: bool     # its chunk's: no load window in play
    tables: set[str]   # its chunk's source tables (the lanes' statements)


@dataclass
class _InFlight:
    item: _Todo
    lane: Lane
    outcome: Future


class ParallelApply:
    """Applies a chunk's groups, the eligible ones on up to `lanes` sessions at once.
    `run` is the replicat run (replicat/run.py's `_Run`): it applies units, writes
    checkpoint rows, records committed groups and applies a group alone or replays it.

    The lanes are not drained between chunks: the groups still in flight when a chunk's
    last group is sent stay so while the next chunk's groups follow them, as if the two
    chunks were one. Anything else the run does on the target waits for them (`settle`)."""

    def __init__(self, run, lanes: int, connect):
        self.run, self.wanted, self.connect = run, lanes, connect
        self.lanes: list[Lane] = []
        self._numbers = itertools.count()  # lane numbers, never reused
        self._stopping = threading.Event()
        self._window: deque[_InFlight] = deque()  # groups on the lanes, oldest first

    def open_ahead(self) -> None:
        """Start opening every lane's session, so that the first groups find them open
        (the run calls this once it knows it has work, beside its first prepare)."""
        while len(self.lanes) < self.wanted:
            self.lanes.append(Lane(next(self._numbers), self.connect, self.run.plans))

    def close(self) -> None:
        """End the lanes. Groups still in flight (the run stopped on an error) roll back
        unless already committing; either way the committed groups are a prefix."""
        self._stop_in_flight()
        for lane in self.lanes:
            lane.close()
        self.lanes = []

    def apply(self, chunk: Chunk, parallel: bool) -> None:
        """Apply every group of the chunk; with `parallel` (no load window in play), the
        eligible ones on the lanes. The last of them may still be in flight on return."""
        tables = chunk.net.tables() if chunk.net else set()
        self._pump(deque(_Todo(chunk, group, parallel, tables) for group in chunk.groups), drain=False)

    def settle(self) -> None:
        """Wait for the groups in flight and record them, in trail order."""
        self._pump(deque(), drain=True)

    def _pump(self, todo: deque[_Todo], drain: bool) -> None:
        window = self._window
        try:
            while todo or window:
                item = todo[0] if todo else None
                lane = None
                if (item is not None and item.parallel and len(window) < self.wanted
                        and eligible(item.chunk, item.group)):
                    lane = self._free_lane(item.tables, {flight.lane.number for flight in window})
                if lane is not None:
                    todo.popleft()
                    previous = window[-1].outcome if window else None
                    # The checkpoint row is composed here, in trail order: a group whose
                    # xids overflow into _lox rows marks the run's Overflow before any
                    # later group's row is composed (and so deletes them).
                    tail = self.run.group_checkpoint_statements(item.group)
                    window.append(_InFlight(item, lane, lane.pool.submit(self._apply, lane, item.chunk, item.group,
                                                                         tail, previous)))
                elif window:
                    if item is None and not drain:
                        return  # the next chunk's groups follow these
                    flight = window.popleft()
                    outcome = flight.outcome.result()
                    if outcome.committed:
                        self.run.group_committed(group=flight.item.group, statements=outcome.statements,
                                                 waiting=outcome.waiting, committing=outcome.committing)
                        continue
                    # Nothing after it commits (each lane waits for the group before);
                    # they are applied again after it.
                    for later in window:
                        later.outcome.result()
                    todo.extendleft(reversed([later.item for later in window]))
                    window.clear()
                    self._after_failure(flight.item.chunk, flight.item.group, outcome.error)
                else:
                    item = todo.popleft()
                    self.run.apply_group(item.chunk, item.group)
        except BaseException:
            self._stop_in_flight()
            raise

    def _stop_in_flight(self) -> None:
        """The lanes roll back what they hold and commit nothing more."""
        self._stopping.set()
        for flight in self._window:
            flight.outcome.exception()
        self._window.clear()
        self._stopping.clear()

    def _free_lane(self, tables: set[str], busy: set[int]) -> Lane | None:
        """A lane with no group in flight, opened if need be, ready for the chunk's
        `tables`. None when a session cannot be had (the target's connection limit, a
        lost session): the run goes on with the lanes it still has and opens no more, or
        on its own session, which reports a target that is gone as any run does."""
        lane = next((lane for lane in self.lanes if lane.number not in busy), None)
        try:
            if lane is None:
                lane = Lane(next(self._numbers), self.connect, self.run.plans)
                self.lanes.append(lane)
            lane.ready()
            lane.fast.prepare(tables)
            return lane
        except (TrailboundError, psycopg2.Error) as exc:
            if lane is not None:
                self.lanes.remove(lane)
                lane.close()
            self.wanted = len(self.lanes)  # 0: every group on the run's own session from now on
            log.warning("replicat %s: parallel apply goes on with %d session(s): another one could not be had: %s",
                        self.run.state.group, max(1, self.wanted), " ".join(str(exc).split()))
            return None

    def _apply(self, lane: Lane, chunk: Chunk, group: Group, tail: bytes, previous: Future | None) -> Outcome:
        """On the lane's thread: the group's rows, then (once the group before has
        committed, and the files it was read from are known to be the committed ones)
        `tail`, its checkpoint row and COMMIT. Never raises: the outcome says."""
        began = time.perf_counter()
        sent = ready = began

        def ready_to_commit() -> bool:
            nonlocal sent, ready
            sent = time.perf_counter()
            if (previous is not None and not previous.result().committed) or self._stopping.is_set():
                return False
            self.run.verified(group.end)
            ready = time.perf_counter()
            crashpoint("before_target_commit")
            return True

        try:
            rows = list(_rows(chunk, group))
            if copychain.available():
                copies = [(lane.fast.copy_statement(table), data) for table, data in rows]
                committed = copychain.apply(lane.connection, copies, tail, ready_to_commit)
            else:
                committed = self._apply_one_by_one(lane, rows, tail, ready_to_commit)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which decides
            copychain.rollback_quietly(lane.connection)
            return Outcome(False, exc)
        if not committed:
            return Outcome(False)
        crashpoint("after_target_commit")
        return Outcome(True, None, sent - began, ready - sent, time.perf_counter() - ready)

    @staticmethod
    def _apply_one_by_one(lane: Lane, rows: list[tuple[str, memoryview]], tail: bytes, ready_to_commit) -> bool:
        """Where copychain cannot be used: a COPY per table, then the checkpoint row with
        its COMMIT, each a query of psycopg2's. The first COPY carries the transaction's
        BEGIN: seven round trips for a group of three tables (copychain: four)."""
        with lane.connection.cursor() as cur:
            opening = "BEGIN; "
            for table, data in rows:
                lane.fast.copy_rows(cur, table, data, opening)
                opening = ""
            if opening:  # nothing to insert (its records cancelled out): the checkpoint row only
                cur.execute("BEGIN")
            if not ready_to_commit():
                copychain.rollback_quietly(lane.connection)
                return False
            cur.execute(tail)
        return True

    def _after_failure(self, chunk: Chunk, group: Group, error: BaseException | None) -> None:
        """The oldest group in flight did not commit: replay it, apply it alone, or stop."""
        if isinstance(error, (*DATA_ERRORS, Collision, NeedsReplay)) or (
                isinstance(error, psycopg2.Error) and not isinstance(error, APPLY_ALONE)
                and self.run.reperror.may_handle(error)):  # a REPERROR rule acts on it, record by record
            self.run.replay_group(chunk, group, reason=error)
        elif isinstance(error, psycopg2.Error) and not isinstance(error, APPLY_ALONE):
            self.run.flush()
            raise self.run.target_error(chunk, group, error)
        elif error is None or isinstance(error, APPLY_ALONE):  # None: rolled back unasked (never expected)
            self.run.apply_group(chunk, group)
        else:
            raise error


def _rows(chunk: Chunk, group: Group):
    """The group's new rows, (source table, COPY text) per unit and table: all an
    eligible group holds."""
    for unit, _ in group.units:
        for entry in chunk.net.units.get(unit, ()) if chunk.net else ():
            rows = chunk.net.view(entry.inserts)
            if rows is not None and len(rows):
                yield entry.table, rows


def eligible(chunk: Chunk, group: Group) -> bool:
    """A group that only inserts new rows: no TRUNCATE, and no unit with staged rows
    (deletes, updates, key moves) or records left to replay one at a time."""
    for unit, truncated in group.units:
        if truncated is not None:
            return False
        for entry in chunk.net.units.get(unit, ()) if chunk.net else ():
            if entry.staged is not None or entry.unresolved:
                return False
    return True


def lane_connection(config, dsn: str | None):
    """A function that opens one more target session for a lane."""
    return lambda: tgt.connect(config, dsn)
