"""REPERROR: what replicat does with an operation the target refuses.

The replicat's `reperror:` rules (config.RepErrorRule) name an action per SQLSTATE code
(`23505`) or class (`23`), optionally per MAP pattern of source tables, and a default:

    abend         stop the run, naming the record (the default, and replicat's behaviour
                  without rules); its source transaction rolls back
    discard       set the operation aside in the discard table and go on with the rest of
                  its transaction
    ignore        go on without it, recording nothing (a warning in the log)
    retryop       try the operation again `retries` times, `delay` apart; then abend
    transabend    roll back the whole source transaction and stop (as abend: replicat
                  applies each source transaction in one target transaction)
    transdiscard  roll back the whole source transaction and set every operation of it
                  aside in the discard table; the run goes on after it

The most specific rule wins: a rule with a `map` that selects the table over one without,
then a code over its class over `default`; among equals, the first written.

A record that is not a database error has a SQLSTATE of its own here: an UPDATE or DELETE
whose row is missing on the target is `02000`, SQL's "no data" (apply.MissingRow), so
`{sqlstate: "02000", action: discard}` sets such records aside (GoldenGate's REPERROR (1403, DISCARD)). Any
other error without a SQLSTATE (a lost connection, a column the target lacks) abends.

The actions apply where replicat applies one record at a time: a group the fast path
cannot apply is replayed transaction by transaction (run.py), and with rules each record
runs under a savepoint (`apply_transaction`), so a discarded or ignored record leaves the
rest of its transaction applied, and transdiscard rolls back to the transaction's start.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg2

from trailbound.config import RepErrorRule
from trailbound.errors import TrailboundError
from trailbound.tables import python_regex

log = logging.getLogger("trailbound.replicat")


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE an error stands for here (a psycopg2 error's, apply.MissingRow's), or
    None: then no rule applies and the run stops (`Policy.action`)."""
    return getattr(exc, "pgcode", None) or None


@dataclass(frozen=True)
class Action:
    name: str              # one of config.RepErrorAction
    retries: int = 0
    delay: float = 0.0     # seconds


ABEND = Action("abend")


def _action(rule: RepErrorRule) -> Action:
    return Action(rule.resolved, rule.retries or 0, rule.delay.total_seconds())


class Policy:
    """A replicat's rules, asked for the action of one error on one source table."""

    def __init__(self, rules: list[RepErrorRule]):
        # (MAP rule, specificity: code 2, class 1, default 0, the order written), best first
        ranked = sorted(enumerate(rules), key=lambda item: (item[1].map is None,
                                                            -len(item[1].sqlstate or ""), item[0]))
        self._rules = [(rule, python_regex([rule.map]) if rule.map else None) for _, rule in ranked]
        self.active = any(rule.resolved != "abend" for rule in rules)

    def action(self, exc: BaseException, table: str) -> Action:
        """The action for `exc` raised applying a record of source table `table`. An error
        without a SQLSTATE (a lost session, a record that does not fit the target's
        definition) always abends: nothing says what it is."""
        code = sqlstate(exc)
        if code is None:
            return ABEND
        for rule, pattern in self._rules:
            if pattern is not None and not pattern.fullmatch(table):
                continue
            if _matches(rule, code):
                return _action(rule)
        return ABEND

    def may_handle(self, exc: BaseException) -> bool:
        """Whether some rule would not abend on `exc` (for some table): a group the fast
        path could not apply because of it is then replayed record by record, where the
        rules act. (A constraint violation is replayed anyway.)"""
        code = sqlstate(exc)
        return code is not None and any(rule.resolved != "abend" and _matches(rule, code) for rule, _ in self._rules)


def _matches(rule: RepErrorRule, code: str) -> bool:
    return rule.sqlstate is None or code == rule.sqlstate or (len(rule.sqlstate) == 2 and code[:2] == rule.sqlstate)


# ---------------------------------------------------------------- one transaction, record by record

@dataclass
class Failure:
    """A record the target refused, and what the rules made of it."""

    record: dict
    error: BaseException
    action: Action

    @property
    def sqlstate(self) -> str | None:
        return sqlstate(self.error)

    @property
    def message(self) -> str:
        text = (self.error.pgerror or str(self.error)) if isinstance(self.error, psycopg2.Error) else str(self.error)
        return " ".join(text.split())  # libpq's messages span lines


class Stop(Exception):
    """The rules say stop (abend, transabend, retries spent) at `failure.record`."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


class DiscardTransaction(Exception):
    """transdiscard: the whole source transaction is to be set aside."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


@dataclass
class Outcome:
    """What the rules did to one transaction's records (the ones applied are the rest)."""

    discarded: list[Failure]
    ignored: list[Failure]
    retries: int = 0


def apply_transaction(cur, records: list[dict], apply, policy: Policy, *, alive) -> Outcome:
    """Apply `records` one by one with `apply(cur, record)`, each under a savepoint, and
    act on each error by the rules. Raises Stop (the caller rolls back and stops, naming
    the record) or DiscardTransaction (the caller rolls back to the transaction's start).
    `alive()` says whether the session is still there: an error that took it away is not
    the record's, and is raised as it is."""
    outcome = Outcome([], [])
    for record in records:
        attempt = 0
        while True:
            cur.execute("SAVEPOINT tb_op")
            try:
                apply(cur, record)
            except (psycopg2.Error, TrailboundError) as exc:
                if not alive():
                    raise
                cur.execute("ROLLBACK TO SAVEPOINT tb_op")
                action = policy.action(exc, record["table"])
                failure = Failure(record, exc, action)
                if action.name == "retryop" and attempt < action.retries:
                    attempt += 1
                    outcome.retries += 1
                    log.warning("REPERROR retryop: %s on %s refused (SQLSTATE %s), attempt %d of %d again in %.1f s:"
                                " %s", record["op"], record["table"], failure.sqlstate, attempt, action.retries,
                                action.delay, failure.message)
                    time.sleep(action.delay)
                    continue
                if action.name == "discard":
                    outcome.discarded.append(failure)
                elif action.name == "ignore":
                    outcome.ignored.append(failure)
                    log.warning("REPERROR ignore: %s on %s at rba %s skipped (SQLSTATE %s): %s", record["op"],
                                record["table"], record["rba"], failure.sqlstate, failure.message)
                elif action.name == "transdiscard":
                    raise DiscardTransaction(failure) from None
                else:  # abend, transabend, retryop with its retries spent
                    raise Stop(failure) from None
            else:
                cur.execute("RELEASE SAVEPOINT tb_op")
            break
    return outcome
