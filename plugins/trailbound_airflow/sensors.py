"""Sensors: each answers one question, in reschedule mode so waiting holds no worker slot."""

from __future__ import annotations

from datetime import timedelta
from typing import Sequence

from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk import BaseSensorOperator

from trailbound_airflow.hooks import TrailboundHook


class ArchiveCoversIntervalSensor(BaseSensorOperator):
    """Has every redo thread archived its log up to `until` (the run's data interval end)?
    Reads manifests only: a closed thread counts as covering everything."""

    template_fields: Sequence[str] = ("until",)

    def __init__(self, *, source: str, until: str = "{{ data_interval_end }}",
                 trailbound_conn_id: str = TrailboundHook.default_conn_name, **kwargs):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.source, self.until, self.trailbound_conn_id = source, until, trailbound_conn_id

    def poke(self, context) -> bool:
        from datetime import datetime

        from trailbound.archive.segments import discover

        hook = TrailboundHook(self.trailbound_conn_id)
        until = datetime.fromisoformat(str(self.until))
        last = {}
        for segment in discover(hook.config.archive_dir(self.source)):
            last[segment.thread] = segment
        waiting = [t for t, s in sorted(last.items()) if not s.closed and s.next_time < until]
        if waiting:
            self.log.info("archive of %s not yet past %s on thread(s) %s", self.source, until, waiting)
        return bool(last) and not waiting


class LongRunningTransactionSensor(BaseSensorOperator):
    """Once capture has read past the interval, is any transaction open longer than
    WARNLONGTRANS? Waits (reschedule) for the capture, then succeeds quietly, or fails
    (no retry) naming each long transaction, which fires the DAG's failure callbacks."""

    template_fields: Sequence[str] = ("until",)

    def __init__(self, *, group: str, until: str = "{{ data_interval_end }}", duration: timedelta | None = None,
                 trailbound_conn_id: str = TrailboundHook.default_conn_name, **kwargs):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.group, self.until, self.duration = group, until, duration
        self.trailbound_conn_id = trailbound_conn_id

    def poke(self, context) -> bool:
        from datetime import datetime

        from trailbound.capture import checkpoints as ckpt

        hook = TrailboundHook(self.trailbound_conn_id)
        duration = self.duration or hook.config.extract(self.group).warnlongtrans.duration
        with hook.store() as store, store.transaction() as cur:
            state = ckpt.load(cur, self.group)
        until = datetime.fromisoformat(str(self.until))
        if state is None or state.read_time is None or state.read_time < until:
            self.log.info("waiting for capture %s to read past %s", self.group, until)
            return False
        long_ones = [t for t in state.open if t.skip_reason is None and state.read_time - t.start.ts > duration]
        for txn in long_ones:
            self.log.error("long-running transaction in %s: xid %r thread %s open %s (since %s, start position %s, "
                           "scn %s), %s records", self.group, txn.xid, txn.thread, state.read_time - txn.start.ts,
                           txn.start.ts, txn.start.position, txn.start.scn, txn.records)
        if long_ones:
            raise AirflowFailException(
                f"{len(long_ones)} transaction(s) in {self.group} open longer than {duration}: "
                + ", ".join(f"{t.xid!r} (thread {t.thread}, since {t.start.ts:%Y-%m-%d %H:%M})" for t in long_ones))
        return True
