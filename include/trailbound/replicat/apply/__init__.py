"""Applying a chunk's net rows to the target: the contract every way of applying keeps,
and what they share (the errors that decide what happens to a group).

    serial.py     the run's own session: the fast path (staged rows merged set-wise, new
                  rows COPY'd: `FastApplier`) and the record-by-record replay it falls
                  back to (`Replayer`)
    parallel.py   insert-only groups on several sessions ("lanes") at once, committed in
                  trail order (APPLY_PARALLELISM)
    copychain.py  a lane's group as one query of chained COPYs, its checkpoint row and
                  COMMIT riding on the last COPY's end

The contract, whichever way applies a group:

- **One group, one target transaction**: its TRUNCATEs and units in trail order (a
  unit's staged rows D, U, M, then its new rows I: the net-row contract of
  replicat/net/), the load windows its records touch (replicat/windows.py), then its
  checkpoint row and COMMIT. The committed groups are always a prefix of the trail: a
  crash anywhere rolls back the groups not committed, and the next run starts after the
  last one that was.
- **Every step counts the rows it touched.** A step that finds a different count raises
  `Collision`; a unit the net change could not resolve set-wise raises `NeedsReplay`; a
  row the target refuses raises one of `DATA_ERRORS`. On any of these the group rolls
  back and is replayed transaction by transaction (serial.Replayer), each its own target
  transaction with its checkpoint row; a record the target still refuses stops the run
  with `ApplyError`, which names it (trail file, rba, CSN, xid, table, key).
- **Any other error of the target** rolls the group back too. On a lane, a lock wait
  ended by lock_timeout or a deadlock has the group applied again alone (parallel.py);
  anything else (a missing grant, a lost session) stops the run, naming the group.

Which way: the run applies every group on its own session unless its apply_parallelism
is above 1 (then parallel.ParallelApply takes the groups that only insert, in a chunk
no load window can touch); a lane sends its group through copychain.py where
`copychain.available()` (psycopg2's own libpq found), else with psycopg2's calls.
"""

from __future__ import annotations

import json

import psycopg2

from trailbound.errors import TrailboundError

# Errors that say "this group's data does not fit the target as it is": replay the group
# record by record to find (or, with HANDLECOLLISIONS, absorb) the record responsible.
DATA_ERRORS = (psycopg2.IntegrityError, psycopg2.DataError)


class Collision(Exception):
    """A fast-path step touched a different number of rows than the net change expects."""


class NeedsReplay(Exception):
    """The net change could not be computed set-wise for a unit (a chain of key updates
    too long to resolve): apply it record by record."""


class MissingRow(TrailboundError):
    """A replayed UPDATE or DELETE found no row with its key on the target. Its SQLSTATE,
    for REPERROR rules (replicat/reperror.py), is SQL's "no data"."""

    pgcode = "02000"


class ApplyError(TrailboundError):
    """A trail record the target refuses. Names the trail file, rba, CSN, table and key."""

    def __init__(self, path: str, rba: int, csn, xid: str, op: str, table: str, key: dict | None, message: str):
        self.path, self.rba, self.csn, self.xid, self.op, self.table, self.key = path, rba, csn, xid, op, table, key
        shown_key = json.dumps(key, ensure_ascii=False) if key is not None else "-"
        super().__init__(f"{path} rba {rba}: CSN {csn} xid {xid!r}: {op} on {table} key {shown_key}: {message}")
