"""Every run's outcome, recorded whatever happens (trailbound.run_outcome).

A stage's own history (extract_run, pump_run, replicat_run) holds only runs that
committed something; a run that failed leaves nothing there. `recorded_run` wraps a
whole run: it writes a row when the run starts and completes it when the run ends, ok or
with the error it ended on.

A group's run state (`run_state`, what INFO ALL and INFO's header show): RUNNING while a
process holds the group (trailbound.grouplock); ABENDED when its last run failed, until
a run succeeds; STOPPED otherwise. A run killed outright leaves its row without an end;
once nothing holds the group any more, it is ABENDED too.

The error text is what the user saw, with any password in it redacted: an error can
quote a DSN. A run started by an Airflow task records its DAG id and run id (the task
passes them: `--airflow-run DAG_ID RUN_ID`), so what a run committed links to its DAG
run (`committed_by`).
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Iterator

from trailbound.errors import TrailboundError
from trailbound.grouplock import GroupBusy, is_running
from trailbound.metadata import MetadataStore, redact

KINDS = ("extract", "pump", "replicat")
_ERROR_LIMIT = 4000  # characters kept of an error: a Spark trace can run to pages


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    kind: str
    group: str
    command: str
    started_at: datetime
    ended_at: datetime | None
    outcome: str            # running | ok | error | refused
    error: str | None
    airflow_dag_id: str | None = None   # the Airflow DAG run that started it; None: the command line
    airflow_run_id: str | None = None


@dataclass(frozen=True)
class RunState:
    """What INFO's header says of a group: its status and, when ABENDED, why and since when;
    else the last run that ended well."""

    status: str                      # RUNNING | STOPPED | ABENDED
    error: str | None = None
    error_time: datetime | None = None
    last_run: RunOutcome | None = None


def error_text(exc: BaseException) -> str:
    """What a failed run says: the message a user saw, no password, bounded."""
    if isinstance(exc, TrailboundError):
        text = str(exc)
    elif isinstance(exc, KeyboardInterrupt):
        text = "interrupted (KeyboardInterrupt)"
    elif isinstance(exc, SystemExit):
        text = f"exited with status {exc.code}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = redact(re.sub(r"(?i)(password\s*[:=]\s*)\S+", r"\1***", text))
    return text if len(text) <= _ERROR_LIMIT else text[:_ERROR_LIMIT] + " ..."


class _Recorder:
    def __init__(self, store: MetadataStore, run_id: int):
        self.store, self.run_id = store, run_id

    def finish(self, outcome: str, error: str | None = None) -> None:
        with self.store.transaction() as cur:
            cur.execute("UPDATE trailbound.run_outcome SET ended_at = clock_timestamp(), outcome = %s, error = %s"
                        " WHERE run_id = %s", (outcome, error, self.run_id))


@contextmanager
def recorded_run(store: MetadataStore, kind: str, group: str, command: str,
                 airflow_run: tuple[str, str] | None = None) -> Iterator[int]:
    """Record the run in the block: its start now, its outcome when the block ends (an
    exception is recorded and re-raised). `refused` is a run turned away because another
    process holds the group: it says nothing about the group's health. `airflow_run`:
    (DAG id, run id) of the Airflow DAG run whose task started it."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    dag_id, dag_run_id = airflow_run or (None, None)
    with store.transaction() as cur:
        cur.execute("INSERT INTO trailbound.run_outcome (kind, group_name, command, started_at, airflow_dag_id,"
                    " airflow_run_id) VALUES (%s, %s, %s, clock_timestamp(), %s, %s) RETURNING run_id",
                    (kind, group.upper(), command, dag_id, dag_run_id))
        run_id = cur.fetchone()["run_id"]
    recorder = _Recorder(store, run_id)
    try:
        yield run_id
    except BaseException as exc:
        _finish_quietly(recorder, "refused" if isinstance(exc, GroupBusy) else "error", error_text(exc))
        raise
    recorder.finish("ok")


def _finish_quietly(recorder: _Recorder, outcome: str, error: str) -> None:
    """Recording must not hide the run's own error: a store that went away with the run
    leaves the row open (status then says the run ended without a word)."""
    if recorder.store.connection.closed:
        return  # the run's own error says the store went away; a warning would only repeat it
    try:
        recorder.finish(outcome, error)
    except Exception as exc:  # noqa: BLE001 - the run's error is the one to report
        print(f"WARNING the outcome of run {recorder.run_id} was not recorded: {exc}", file=sys.stderr)


def last_outcomes(store: MetadataStore) -> dict[tuple[str, str], RunOutcome]:
    """Per (kind, GROUP): its last run that was not refused."""
    with store.transaction() as cur:
        cur.execute("SELECT DISTINCT ON (kind, group_name) * FROM trailbound.run_outcome"
                    " WHERE outcome <> 'refused' ORDER BY kind, group_name, run_id DESC")
        rows = cur.fetchall()
    return {(r["kind"], r["group_name"]): _outcome(r) for r in rows}


def group_state(store: MetadataStore, program: str, group: str, last: RunOutcome | None) -> RunState:
    """A group's run state given its last run that was not refused (last_outcomes)."""
    if is_running(store, program, group):
        return RunState("RUNNING", last_run=last)
    if last is None or last.outcome == "ok":
        return RunState("STOPPED", last_run=last)
    if last.outcome == "error":
        return RunState("ABENDED", last.error, last.ended_at, last)
    # `running` with nothing holding the group: the process died without a word.
    return RunState("ABENDED", f"run {last.run_id} ({last.command}) ended without recording an outcome (killed?)",
                    last.started_at, last)


def run_state(store: MetadataStore, program: str, group: str) -> RunState:
    """One group's status, the rule INFO ALL applies: what INFO EXTRACT|PUMP|REPLICAT shows."""
    last = last_outcomes(store).get((program, group.upper()))
    return group_state(store, program, group, last)


def history(store: MetadataStore, kind: str, group: str, limit: int = 50) -> list[RunOutcome]:
    """A group's last runs, newest first."""
    with store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.run_outcome WHERE kind = %s AND group_name = upper(%s)"
                    " ORDER BY run_id DESC LIMIT %s", (kind, group, limit))
        return [_outcome(r) for r in cur.fetchall()]


def committed_by(cur, kind: str, group: str, committed_at: datetime) -> RunOutcome | None:
    """The run that committed a stage's history row at `committed_at` (its ended_at): the
    group's run whose start and end enclose it. Exact, because a group has one run at a
    time (trailbound.grouplock): a run turned away meanwhile is `refused` and left out,
    and of runs that ended in an error before taking the lock the one that ended well
    is preferred."""
    cur.execute("SELECT * FROM trailbound.run_outcome WHERE kind = %s AND group_name = upper(%s)"
                " AND outcome <> 'refused' AND started_at <= %s AND (ended_at IS NULL OR ended_at >= %s)"
                " ORDER BY outcome = 'ok' DESC, run_id DESC LIMIT 1", (kind, group, committed_at, committed_at))
    row = cur.fetchone()
    return None if row is None else _outcome(row)


def _outcome(row: dict) -> RunOutcome:
    return RunOutcome(row["run_id"], row["kind"], row["group_name"], row["command"], row["started_at"],
                      row["ended_at"], row["outcome"], row["error"], row.get("airflow_dag_id"),
                      row.get("airflow_run_id"))
