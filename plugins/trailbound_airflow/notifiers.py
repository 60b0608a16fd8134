"""Notifiers: how a trailbound alert reaches people.

LongTransactionNotifier is what the long-transaction monitor alerts through. It logs the
alert (one ERROR line naming group, xid, age, start position and the commands that deal
with it) and hands it to the notifiers you already have: each is called with the task's
context plus `trailbound_alert` (the message) and `long_transactions` (the list), so a
SlackNotifier(text="{{ trailbound_alert }}") or SmtpNotifier(subject=..., html_content=
"{{ trailbound_alert }}") sends it as is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta

from airflow.sdk import BaseNotifier

log = logging.getLogger("trailbound.alerts")


def long_transaction_message(group: str, transactions: Sequence[dict], duration_seconds: float) -> str:
    """The alert: each long transaction with what to do about it."""
    lines = [f"{len(transactions)} transaction(s) in EXTRACT {group} open longer than WARNLONGTRANS "
             f"{timedelta(seconds=duration_seconds)} (log time):"]
    for t in transactions:
        lines.append(f"  xid {t['xid']!r} thread {t['thread']} open {timedelta(seconds=round(t['age_seconds']))} "
                     f"(since {t['start_time']}, start position {t['start_position']}, scn {t['start_scn']}), "
                     f"{t['records']} records")
        lines.append(f"    to skip it:  trailbound send extract {group} skiptrans {t['xid']} --thread {t['thread']}"
                     f"   (SEND EXTRACT {group}, SKIPTRANS {t['xid']} THREAD {t['thread']})")
        lines.append(f"    to write it: trailbound send extract {group} forcetrans {t['xid']} --thread {t['thread']}"
                     f"   (SEND EXTRACT {group}, FORCETRANS {t['xid']} THREAD {t['thread']})")
    lines.append("  (or trigger the control DAG with command skiptrans|forcetrans, the group and the xid)")
    return "\n".join(lines)


class LongTransactionNotifier(BaseNotifier):
    """Logs a long-transaction alert and passes it on to `notifiers` (notifier instances
    or any callables taking the context)."""

    template_fields = ("message",)

    def __init__(self, *, notifiers: Sequence[Callable] = (), message: str = "{{ trailbound_alert }}"):
        super().__init__()
        self.notifiers, self.message = list(notifiers), message

    def notify(self, context) -> None:
        log.error("trailbound alert: %s", self.message)
        for notifier in self.notifiers:
            notifier(context)
