"""Triggers: waiting that runs in the triggerer, holding no worker slot.

LongRunningTransactionTrigger polls the metadata store every WARNLONGTRANS CHECKINTERVAL
until the capture group has read past the interval's end, then fires one event listing
the transactions open longer than WARNLONGTRANS (empty when there are none). The reads
are blocking psycopg2 calls: they run in a thread (sync_to_async), never on the
triggerer's event loop, which every deferred task of the deployment shares.

Its kwargs are stored in Airflow's database: they name the connection and configuration
file, never a DSN (a password would sit in the trigger table); the triggerer resolves the
DSN through TrailboundHook, as a task does.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, AsyncIterator

from asgiref.sync import sync_to_async
from airflow.triggers.base import BaseTrigger, TriggerEvent


def long_transactions(state, duration: timedelta) -> list[dict]:
    """The capture's open transactions older than `duration` in log time, oldest first,
    as the event carries them."""
    found = [t for t in state.open if t.skip_reason is None and state.read_time - t.start.ts > duration]
    return [{"xid": t.xid, "thread": t.thread, "age_seconds": (state.read_time - t.start.ts).total_seconds(),
             "start_time": t.start.ts.isoformat(), "start_position": str(t.start.position),
             "start_scn": t.start.scn.value, "records": t.records}
            for t in sorted(found, key=lambda t: t.start.ts)]


class LongRunningTransactionTrigger(BaseTrigger):
    def __init__(self, *, group: str, until: str, duration_seconds: float, checkinterval_seconds: float,
                 trailbound_conn_id: str | None, config_path: str | None = None):
        super().__init__()
        self.group, self.until = group, until
        self.duration_seconds, self.checkinterval_seconds = duration_seconds, checkinterval_seconds
        self.trailbound_conn_id, self.config_path = trailbound_conn_id, config_path

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"group": self.group, "until": self.until, "duration_seconds": self.duration_seconds,
                 "checkinterval_seconds": self.checkinterval_seconds,
                 "trailbound_conn_id": self.trailbound_conn_id, "config_path": self.config_path})

    def check(self) -> dict | None:
        """Blocking: None while the capture has not read past `until`, else the event."""
        from trailbound_airflow.hooks import TrailboundHook

        hook = TrailboundHook(self.trailbound_conn_id, config_path=self.config_path)
        state = hook.extract_state(self.group)
        until = datetime.fromisoformat(self.until)
        if state is None or state.read_time is None or state.read_time < until:
            self.log.info("waiting for capture %s to read past %s (checking every %ss)", self.group, until,
                          self.checkinterval_seconds)
            return None
        return {"group": self.group, "read_time": state.read_time.isoformat(),
                "duration_seconds": self.duration_seconds,
                "long": long_transactions(state, timedelta(seconds=self.duration_seconds))}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            event = await sync_to_async(self.check)()
            if event is not None:
                yield TriggerEvent(event)
                return
            await asyncio.sleep(self.checkinterval_seconds)
