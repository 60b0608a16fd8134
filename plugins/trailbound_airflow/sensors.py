"""Sensors: each answers one question, in reschedule mode so waiting holds no worker slot."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Sequence

from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk import BaseSensorOperator

from trailbound_airflow.hooks import TrailboundHook


class ArchiveCoversIntervalSensor(BaseSensorOperator):
    """Has every redo thread archived its log up to `until` (the run's data interval end)?
    Reads manifests only: a closed thread counts as covering everything."""

    template_fields: Sequence[str] = ("until",)

    def __init__(self, *, source: str, until: str = "{{ data_interval_end }}",
                 trailbound_conn_id: str | None = None, **kwargs):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.source, self.until, self.trailbound_conn_id = source, until, trailbound_conn_id

    def poke(self, context) -> bool:
        from datetime import datetime

        from trailbound.archive.segments import discover, threads_short_of

        hook = TrailboundHook(self.trailbound_conn_id)
        until = datetime.fromisoformat(str(self.until))
        waiting = threads_short_of(discover(hook.config.archive_dir(self.source)), until)
        if waiting:
            self.log.info("archive of %s not yet past %s on thread(s) %s", self.source, until, waiting)
        return waiting == []


class LongRunningTransactionSensor(BaseSensorOperator):
    """Once capture has read past the interval, is any transaction open longer than
    WARNLONGTRANS? Deferrable (the default): the waiting happens in the triggerer
    (LongRunningTransactionTrigger), polling every WARNLONGTRANS CHECKINTERVAL, and holds
    no worker slot. Then it succeeds quietly, or alerts through `notifier` (a
    LongTransactionNotifier by default: an ERROR line, and your notifiers) and fails (no
    retry) naming each long transaction, which fires the DAG's failure callbacks too."""

    template_fields: Sequence[str] = ("until",)

    def __init__(self, *, group: str, until: str = "{{ data_interval_end }}", duration: timedelta | None = None,
                 checkinterval: timedelta | None = None, deferrable: bool = True, notifier=None,
                 trailbound_conn_id: str | None = None, **kwargs):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.group, self.until, self.duration, self.checkinterval = group, until, duration, checkinterval
        self.deferrable, self.notifier = deferrable, notifier
        self.trailbound_conn_id = trailbound_conn_id

    def execute(self, context):
        if not self.deferrable:
            return super().execute(context)
        from trailbound_airflow.triggers import LongRunningTransactionTrigger

        hook = TrailboundHook(self.trailbound_conn_id)
        settings = hook.config.extract(self.group).warnlongtrans
        trigger = LongRunningTransactionTrigger(
            group=self.group, until=datetime.fromisoformat(str(self.until)).isoformat(),
            duration_seconds=(self.duration or settings.duration).total_seconds(),
            checkinterval_seconds=(self.checkinterval or settings.checkinterval).total_seconds(),
            trailbound_conn_id=self.trailbound_conn_id, config_path=hook.config_path)
        self.defer(trigger=trigger, method_name="execute_complete",
                   timeout=timedelta(seconds=self.timeout) if self.timeout else None)

    def execute_complete(self, context, event: dict) -> None:
        self.alert(context, event["group"], event["long"], event["duration_seconds"])

    def alert(self, context, group: str, long_ones: list[dict], duration_seconds: float) -> None:
        from trailbound_airflow.notifiers import LongTransactionNotifier, long_transaction_message

        if not long_ones:
            self.log.info("no transaction in %s open longer than %s", group, timedelta(seconds=duration_seconds))
            return
        message = long_transaction_message(group, long_ones, duration_seconds)
        notifier = self.notifier or LongTransactionNotifier()
        notifier({**context, "trailbound_alert": message, "long_transactions": long_ones})
        raise AirflowFailException(message)

    def poke(self, context) -> bool:
        from trailbound_airflow.triggers import long_transactions

        hook = TrailboundHook(self.trailbound_conn_id)
        duration = self.duration or hook.config.extract(self.group).warnlongtrans.duration
        state = hook.extract_state(self.group)
        until = datetime.fromisoformat(str(self.until))
        if state is None or state.read_time is None or state.read_time < until:
            self.log.info("waiting for capture %s to read past %s", self.group, until)
            return False
        self.alert(context, self.group, long_transactions(state, duration), duration.total_seconds())
        return True
