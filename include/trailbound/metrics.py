"""The pipeline's figures as Prometheus text (exposition format 0.0.4), read from the
metadata store: what the console's `/trailbound/metrics` serves (docs/console.md).

Per group (label `program` extract|pump|replicat, `group`): lag at checkpoint (each
group is one hop: archive -> capture, trail -> remote trail, trail -> target), time
since the checkpoint, status, the last run's records, trail bytes written, duration and
changes per second, run outcomes, and operations per table (counters: `rate()` of them
is changes per second over any window). Per capture: open transactions, the oldest's
age, how many Bounded Recovery has persisted, and whether BR is suspended. Per replicat
and source, the last heartbeat's lag per hop and end to end (heartbeat.py). Per live
PostgreSQL source: the slot's lag in bytes, which the caller reads from the source
(the engine's layers keep sources/ out of here) and passes in.

Plain text, no client library: every value is a gauge or a counter with labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from psycopg2 import sql

from trailbound import heartbeat
from trailbound import status as group_status
from trailbound.config import Config
from trailbound.metadata import MetadataStore
from trailbound.runcounts import column_sums

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_STATUSES = ("RUNNING", "STOPPED", "ABENDED")
_OUTCOMES = ("ok", "error", "refused", "running")


@dataclass(frozen=True)
class SlotLag:
    """A live source's slot lag, as the caller read it (None: the source could not be read)."""

    source: str
    lag_bytes: int | None


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Text:
    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples) -> None:
        """One metric family: its HELP and TYPE, then `samples`, (labels dict, value) pairs."""
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            if value is None:
                continue
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _number(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(round(float(value), 6))


def _last_runs(cur) -> dict[tuple[str, str], dict]:
    """Each group's last committed run: records, trail bytes written, duration."""
    found = {}
    cur.execute("SELECT DISTINCT ON (group_name) group_name, started_at, ended_at, records_written AS records"
                " FROM trailbound.extract_run ORDER BY group_name, run_id DESC")
    found.update({("extract", r["group_name"].upper()): r for r in cur.fetchall()})
    cur.execute("SELECT DISTINCT ON (group_name) group_name, started_at, ended_at, records_written AS records"
                " FROM trailbound.pump_run ORDER BY group_name, run_id DESC")
    found.update({("pump", r["group_name"].upper()): r for r in cur.fetchall()})
    cur.execute("SELECT DISTINCT ON (group_name) group_name, started_at, ended_at, operations AS records"
                " FROM trailbound.replicat_run ORDER BY group_name, run_id DESC")
    found.update({("replicat", r["group_name"].upper()): r for r in cur.fetchall()})
    for (program, group), run in found.items():
        run["bytes"] = None
        if program != "replicat":  # the trail files the run committed (replicat writes none)
            cur.execute("SELECT coalesce(sum(bytes), 0)::bigint AS bytes FROM trailbound.trail_file"
                        " WHERE upper(written_by) = %s AND created_at BETWEEN %s AND %s",
                        (group, run["started_at"], run["ended_at"]))
            run["bytes"] = cur.fetchone()["bytes"]
    return found


def render(store: MetadataStore, config: Config, *, slot_lags: list[SlotLag] = (),
           now: datetime | None = None) -> str:
    """The metrics text. `slot_lags`: each live PostgreSQL source's slot lag, read by the caller."""
    now = now or datetime.now(timezone.utc)
    groups = [g for g in group_status.info_all(store, config, now=now)]
    with store.transaction() as cur:
        runs = _last_runs(cur)
        cur.execute("SELECT kind, upper(group_name) AS group_name, outcome, count(*)::bigint AS n"
                    " FROM trailbound.run_outcome GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
        outcomes = cur.fetchall()
        cur.execute(sql.SQL("SELECT stage, group_name, table_name, {} FROM trailbound.run_table_counts"
                            " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3").format(column_sums()))
        counts = cur.fetchall()
        cur.execute("SELECT upper(group_name) AS group_name, br_suspended IS NOT NULL AS suspended"
                    " FROM trailbound.extract_group ORDER BY 1")
        br_suspended = cur.fetchall()
        beats = heartbeat.latest(cur)
    out = _Text()

    def of(g) -> dict:
        return {"program": g.program, "group": g.group.upper()}

    added = [g for g in groups if g.added]
    out.family("trailbound_group_lag_seconds", "gauge", "Lag at checkpoint: the checkpoint's wall time minus the "
               "log time of the last record it covers (one hop per group).",
               [(of(g), g.lag.total_seconds() if g.lag is not None else None) for g in added])
    out.family("trailbound_group_since_checkpoint_seconds", "gauge", "Now minus the wall time of the group's last "
               "checkpoint.", [(of(g), g.since_checkpoint.total_seconds() if g.since_checkpoint else None)
                               for g in added])
    out.family("trailbound_group_status", "gauge", "1 for the group's status (RUNNING, STOPPED, ABENDED).",
               [(of(g) | {"status": s}, g.status == s) for g in groups for s in _STATUSES])
    last = [(of(g), runs.get((g.program, g.group.upper()))) for g in groups]
    last = [(labels, run) for labels, run in last if run is not None]
    out.family("trailbound_last_run_records", "gauge", "Records the group's last committed run wrote (extract, "
               "pump) or operations it applied (replicat).", [(labels, run["records"]) for labels, run in last])
    out.family("trailbound_last_run_bytes", "gauge", "Trail bytes the last committed run wrote (extract, pump).",
               [(labels, run["bytes"]) for labels, run in last])
    durations = [(labels, run, (run["ended_at"] - run["started_at"]).total_seconds()) for labels, run in last]
    out.family("trailbound_last_run_duration_seconds", "gauge", "Wall time of the last committed run.",
               [(labels, seconds) for labels, _, seconds in durations])
    out.family("trailbound_last_run_changes_per_second", "gauge", "The last committed run's records per second of "
               "its wall time.", [(labels, run["records"] / seconds if seconds > 0 else None)
                                  for labels, run, seconds in durations])
    out.family("trailbound_last_run_end_timestamp_seconds", "gauge", "When the last committed run ended (Unix time).",
               [(labels, run["ended_at"].timestamp()) for labels, run in last])
    out.family("trailbound_runs_total", "counter", "Runs recorded per outcome (ok, error, refused, running).",
               [({"program": r["kind"], "group": r["group_name"], "outcome": r["outcome"]}, r["n"])
                for r in outcomes])
    out.family("trailbound_operations_total", "counter", "Operations committed per table and kind (insert, update, "
               "delete, truncate), from STATS' counts.",
               [({"program": r["stage"], "group": r["group_name"], "table": r["table_name"],
                  "op": column.removesuffix("s")}, r[column])
                for r in counts for column in ("inserts", "updates", "deletes", "truncates")])
    out.family("trailbound_discards_total", "counter", "Operations set aside by REPERROR discard or transdiscard.",
               [({"program": r["stage"], "group": r["group_name"], "table": r["table_name"]}, r["discards"])
                for r in counts if r["stage"] == "replicat"])
    out.family("trailbound_collisions_total", "counter", "HANDLECOLLISIONS collisions replicat handled.",
               [({"program": r["stage"], "group": r["group_name"], "table": r["table_name"]}, r["collisions"])
                for r in counts if r["stage"] == "replicat"])

    extracts = [g for g in added if g.program == "extract" and g.group.upper() in {n.upper() for n in config.extracts}]
    open_by_group = {g.group.upper(): group_status.open_transactions(store, config, g.group) for g in extracts}
    out.family("trailbound_open_transactions", "gauge", "Transactions open at the capture's last checkpoint, by "
               "Bounded Recovery state (persisted, not_persisted, skipped).",
               [({"group": group, "br_state": state}, sum(1 for t in found if _br_state(t) == state))
                for group, found in open_by_group.items() for state in ("persisted", "not_persisted", "skipped")])
    out.family("trailbound_oldest_open_transaction_age_seconds", "gauge", "Log-time age of the oldest open "
               "transaction (0: none open).",
               [({"group": group}, max((t.age.total_seconds() for t in found), default=0.0))
                for group, found in open_by_group.items()])
    out.family("trailbound_br_suspended", "gauge", "1 while Bounded Recovery is suspended for the capture "
               "(BROFFONFAILURE).", [({"group": r["group_name"]}, r["suspended"]) for r in br_suspended])
    out.family("trailbound_slot_lag_bytes", "gauge", "A live PostgreSQL source's replication slot: WAL bytes not "
               "yet confirmed (archived).", [({"source": s.source}, s.lag_bytes) for s in slot_lags])
    out.family("trailbound_heartbeat_lag_seconds", "gauge", "The last heartbeat a replicat applied: its lag per hop "
               "(archive, capture, pump, replicat: between consecutive stamps) and end to end (total).",
               [({"group": b.group.upper(), "source": b.source, "hop": hop}, seconds)
                for b in beats for hop, seconds in b.lags().items()])
    out.family("trailbound_heartbeat_age_seconds", "gauge", "Now minus when the replicat applied its last heartbeat "
               "(grows while heartbeats stop arriving).",
               [({"group": b.group.upper(), "source": b.source}, (now - b.applied_at).total_seconds())
                for b in beats if b.applied_at is not None])
    out.family("trailbound_scrape_timestamp_seconds", "gauge", "When these figures were read (Unix time).",
               [({}, now.timestamp())])
    return out.text()


def _br_state(transaction) -> str:
    if transaction.br_state.startswith("skipped"):
        return "skipped"
    return "persisted" if transaction.br_state.startswith("persisted") else "not_persisted"
