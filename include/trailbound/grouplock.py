"""One process per group at a time.

A run (and every command that changes a group's checkpoints: alter, delete) holds its
group through a session advisory lock on the metadata store, keyed `<kind>:<GROUP>`.
The server drops the lock when the holder's connection goes, so a killed run never
leaves its group locked; `info` peeks at the lock to say RUNNING or STOPPED.
"""

from __future__ import annotations

import psycopg2.errors

from trailbound.errors import TrailboundError
from trailbound.metadata import MetadataStore

NOUNS = {"extract": "capture", "pump": "pump", "replicat": "replicat"}


# How long a run waits for its group before it is refused as held by another process.
CRASH_GRACE = "5s"


class GroupBusy(TrailboundError):
    pass


def lock_key(kind: str, group: str) -> str:
    return f"{kind}:{group.upper()}"


class AdvisoryLock:
    """Holds the session advisory lock `key` on the metadata store while in the `with`
    block, or raises GroupBusy(`busy`). It waits `wait` (a PostgreSQL interval) for the
    lock first: the server frees a killed process's lock only once its backend has noticed
    the connection is gone, and a rerun right after a kill -9 must not be refused for that
    (seen on a loaded CI machine). `wait=None` refuses at once."""

    def __init__(self, store: MetadataStore, key: str, busy: str, *, wait: str | None = CRASH_GRACE):
        self.store, self.key, self.busy, self.wait = store, key, busy, wait

    def __enter__(self):
        busy = GroupBusy(self.busy)
        try:
            with self.store.transaction() as cur:
                if self.wait:
                    cur.execute("SET LOCAL lock_timeout = %s", (self.wait,))
                    cur.execute("SELECT pg_advisory_lock(hashtext(%s))", (self.key,))
                else:
                    cur.execute("SELECT pg_try_advisory_lock(hashtext(%s)) AS got", (self.key,))
                    if not cur.fetchone()["got"]:
                        raise busy
        except psycopg2.errors.LockNotAvailable:
            raise busy from None
        return self

    def __exit__(self, *exc):
        if not self.store.connection.closed:
            with self.store.transaction() as cur:
                cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", (self.key,))


class GroupLock(AdvisoryLock):
    """Holds `kind` group `group` while in the `with` block, or raises GroupBusy."""

    def __init__(self, store: MetadataStore, kind: str, group: str, *, wait: str | None = CRASH_GRACE):
        group = group.upper()
        super().__init__(store, lock_key(kind, group),
                         f"{kind} {group} is held by a running {NOUNS[kind]}; try again when it ends", wait=wait)


def is_running(store: MetadataStore, kind: str, group: str) -> bool:
    """Whether some process holds the group now (INFO's RUNNING / STOPPED)."""
    return is_held(store, lock_key(kind, group))


def is_held(store: MetadataStore, key: str) -> bool:
    """Whether some process holds the advisory lock `key` now (a peek: no wait)."""
    with store.transaction() as cur:
        cur.execute("SELECT pg_try_advisory_lock(hashtext(%s)) AS got", (key,))
        got = cur.fetchone()["got"]
        if got:
            cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))
    return not got
