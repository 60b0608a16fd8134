"""The trailbound console inside the Airflow UI: what a GoldenGate operator looks at first.

A FastAPI app (mounted by the plugin under /trailbound) that feeds the console page, a
React app of Airflow's UI (console.js, shown under Browse -> Trailbound at
/plugin/trailbound):

    GET /trailbound/static/console.js   the React app the UI imports
    GET /trailbound/api/console         the page's data: INFO ALL, each group's runs (lag
                                        at checkpoint, throughput, the DAG run that
                                        committed each), STATS per table, discards,
                                        SHOWCH; open transactions with BR state; each
                                        source's retention and slot lag; heartbeat lag
    GET /trailbound/api/info-all        INFO ALL as JSON
    GET /trailbound/api/heartbeat       each replicat's heartbeats (trailbound.heartbeat.snapshot):
                                        the last per source, its lag per hop and end to end,
                                        and the history
    GET /trailbound/metrics             Prometheus text (trailbound.metrics)
    GET /trailbound/                    sends to the page in the UI

It reads state and never acts: actions go through the control DAG, so every one has a
run, a log and an owner. Every endpoint but the redirect checks the user through
Airflow's auth manager (the API server's JWT, from the UI's cookie or a bearer header):
401 without one. `/metrics` also takes the token in the API server's
TRAILBOUND_METRICS_TOKEN variable (`Authorization: Bearer TOKEN`), for a Prometheus that
cannot renew Airflow's short-lived JWTs. Database reads run in a worker thread, off the
event loop. Links are relative to the UI's base URL, so the page works under a proxy's
base path. Times are UTC and say so.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

URL_PREFIX = "/trailbound"
BUNDLE = Path(__file__).with_name("console.js")


# ---------------------------------------------------------------- authentication

async def authorized_user(request: Request):
    """The signed-in user, allowed to read DAG runs (the view shows what is behind them);
    401 without a valid token, 403 without the permission."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials

    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    bearer = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if token else None
    user = await get_user(request, None, bearer)
    if not get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, user=user):
        raise HTTPException(status_code=403, detail="not allowed to read DAG runs")
    return user


User = Annotated[object, Depends(authorized_user)]

METRICS_TOKEN_ENV = "TRAILBOUND_METRICS_TOKEN"


async def metrics_reader(request: Request):
    """A scraper with the configured metrics token, else a user Airflow lets read DAG runs."""
    token = os.environ.get(METRICS_TOKEN_ENV)
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
        return "metrics token"
    return await authorized_user(request)


# ---------------------------------------------------------------- the data

@dataclass
class Snapshot:
    """Everything the page shows, read in one go (in a worker thread)."""

    now: datetime
    groups: list = field(default_factory=list)          # trailbound.status.GroupStatus
    checkpoints: dict = field(default_factory=dict)     # (program, group) -> INFO ... SHOWCH text
    transactions: list = field(default_factory=list)    # trailbound.status.OpenTransaction
    retention: list = field(default_factory=list)       # dicts per source
    lags: dict = field(default_factory=dict)            # (program, group) -> [LagPoint]
    dags: dict = field(default_factory=dict)            # (program, group) -> dag ids behind it
    warnlongtrans: dict = field(default_factory=dict)   # extract -> its WARNLONGTRANS
    sources: list = field(default_factory=list)         # live PostgreSQL sources: SlotLag, or (source, error)
    stats: dict = field(default_factory=dict)           # (program, group) -> [trailbound.stats.TableStats], total
    # End-to-end lag from the heartbeat table, once it exists: [{"path": ..., "lag_seconds":
    # ..., "at": ...}] (None: no heartbeat yet; the page keeps its panel and says so).
    heartbeat: list | None = None


def run_href(dag_id: str, run_id: str) -> str:
    """The Airflow UI's page of one DAG run, relative to the UI's base URL (the page's
    <base href>), like every link of the console."""
    return f"dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def read_slot_lags(hook) -> list:
    """Each live PostgreSQL source's slot lag (`info source`), read from its server (its
    DSN as TrailboundHook resolves it)."""
    from trailbound.sources.postgres.admin import slot_lag

    config = hook.config
    found = []
    for name, source in config.sources.items():
        if source.postgres is None:
            continue
        try:
            found.append(slot_lag(config, name, hook.source_dsn(name)))
        except Exception as exc:  # noqa: BLE001 - an unreachable source must not hide the page
            found.append((name, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__))
    return found


def _describe(store, config, program: str, group: str) -> str:
    try:
        if program == "extract":
            from trailbound.capture.info import describe_extract

            return describe_extract(store, config, group, showch=0, br=True)
        if program == "pump":
            from trailbound.pump.info import describe_pump

            return describe_pump(store, config, group, showch=0)
        from trailbound.replicat.info import describe_replicat

        return describe_replicat(store, config, group, showch=0)
    except Exception as exc:  # noqa: BLE001 - one group's broken report must not hide the others
        return f"(not available: {exc})"


def _ranges(decisions) -> str:
    """thread T sequences a..b, ... of purgeable segments."""
    by_thread: dict[int, list[int]] = {}
    for d in decisions:
        by_thread.setdefault(d.segment.thread, []).append(d.segment.sequence)
    parts = []
    for thread, sequences in sorted(by_thread.items()):
        sequences.sort()
        start = prev = sequences[0]
        for s in sequences[1:] + [None]:
            if s is not None and s == prev + 1:
                prev = s
                continue
            parts.append(f"thread {thread} sequence {start}" + (f"..{prev}" if prev != start else ""))
            if s is not None:
                start = prev = s
    return ", ".join(parts) or "none"


def read_snapshot(config_path: str | None = None) -> Snapshot:
    """Blocking: reads the configuration and the metadata store, through TrailboundHook
    (the API server's secrets backends hold the connections it finds first)."""
    from trailbound import status
    from trailbound.dagfiles import group_dag_ids
    from trailbound.stats import table_stats

    from trailbound_airflow.hooks import TrailboundHook

    hook = TrailboundHook(config_path=config_path)
    config = hook.config
    now = datetime.now(timezone.utc)
    snap = Snapshot(now=now)
    with hook.store() as store:
        snap.groups = status.info_all(store, config, now=now)
        for g in snap.groups:
            key = (g.program, g.group)
            if g.added:
                snap.checkpoints[key] = _describe(store, config, g.program, g.group)
            snap.lags[key] = status.lag_history(store, g.program, g.group)
            snap.stats[key] = table_stats(store, g.program, g.group)
            snap.dags[key] = group_dag_ids(g.program, g.group)
            if g.program == "extract" and g.group.upper() in {n.upper() for n in config.extracts}:
                snap.warnlongtrans[g.group] = config.extract(g.group).warnlongtrans.duration
                snap.transactions += status.open_transactions(store, config, g.group)
        try:
            from trailbound.retention import run_retention

            result = run_retention(store, config, dry_run=True)
            for outcome in result.sources:
                plan = outcome.plan
                snap.retention.append({
                    "source": plan.source, "required_scn": plan.required_scn,
                    "registrations": [f"{r.group} {'enabled' if r.enabled else 'unregistered'} required scn "
                                      f"{r.required_scn}" for r in plan.registrations],
                    "purgeable": len(plan.purged), "purgeable_bytes": sum(d.segment.bytes for d in plan.purged),
                    "purgeable_ranges": _ranges(plan.purged), "kept": len(plan.kept),
                    "warning": plan.over_limit()})
        except Exception as exc:  # noqa: BLE001 - shown in its section
            snap.retention.append({"source": "?", "error": str(exc)})
        from trailbound import heartbeat

        with store.transaction() as cur:
            beats = heartbeat.latest(cur)
        snap.heartbeat = [{"path": f"{beat.source} -> {beat.group}", "lag_seconds": beat.lags()["total"],
                           "hops": beat.lags(), "at": beat.applied_at.isoformat() if beat.applied_at else None}
                          for beat in beats] or None
    snap.sources = read_slot_lags(hook)
    snap.transactions.sort(key=lambda t: (t.start_time, t.start_scn))
    return snap


def read_heartbeats(config_path: str | None = None) -> dict:
    """Blocking: the heartbeats' JSON (trailbound.heartbeat.snapshot), from the metadata store."""
    from trailbound import heartbeat

    from trailbound_airflow.hooks import TrailboundHook

    with TrailboundHook(config_path=config_path).store() as store, store.transaction() as cur:
        return heartbeat.snapshot(cur, datetime.now(timezone.utc))


def read_metrics(config_path: str | None = None) -> str:
    """Blocking: the Prometheus text, from the metadata store and each live source's slot."""
    from trailbound import metrics

    from trailbound_airflow.hooks import TrailboundHook

    hook = TrailboundHook(config_path=config_path)
    slots = [metrics.SlotLag(s[0], None) if isinstance(s, tuple) else metrics.SlotLag(s.source, s.lag_bytes)
             for s in read_slot_lags(hook)]
    with hook.store() as store:
        return metrics.render(store, hook.config, slot_lags=slots)


# ---------------------------------------------------------------- the page's data

def _plain(value):
    """JSON-ready: datetimes as ISO 8601 in UTC, durations in seconds, positions (SCNs)
    in their text form."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _slot(lag) -> dict:
    if isinstance(lag, tuple):
        return {"source": lag[0], "error": lag[1]}
    return {"source": lag.source, "slot": lag.slot, "exists": lag.exists, "confirmed": lag.confirmed,
            "current": lag.current, "lag_bytes": lag.lag_bytes, "held_bytes": lag.held_bytes,
            "behind_seconds": lag.behind_seconds, "open_streamed": len(lag.open_streamed)}


def console_data(snap: Snapshot) -> dict:
    """The page's JSON (GET /trailbound/api/console): one object per group with its INFO
    ALL line, its runs (lag, throughput, the DAG run that committed each), its DAGs, STATS
    per table and SHOWCH report; the open transactions, slot lags and retention."""
    groups = []
    for g in snap.groups:
        key = (g.program, g.group)
        tables = snap.stats.get(key, [])
        groups.append({
            **{k: v for k, v in asdict(g).items() if k != "last_run"},
            "dags": [{"dag_id": d, "href": f"dags/{quote(d, safe='')}/runs"} for d in snap.dags.get(key, [])],
            "runs": [{"at": p.at, "lag": p.lag, "records": p.records, "seconds": p.seconds,
                      "records_per_second": p.records_per_second, "dag_id": p.airflow_dag_id,
                      "run_id": p.airflow_run_id,
                      "href": run_href(p.airflow_dag_id, p.airflow_run_id) if p.airflow_run_id else None}
                     for p in snap.lags.get(key, [])],
            "tables": [{"table": t.table, "target": t.target, **t.counts, "operations": t.operations}
                       for t in tables],
            "discards": sum(t.counts.get("discards", 0) for t in tables),
            "checkpoint_report": snap.checkpoints.get(key)})
    transactions = [{**asdict(t), "start_scn": t.start_scn,
                     "warnlongtrans": snap.warnlongtrans.get(t.group)} for t in snap.transactions]
    return _plain({"as_of": snap.now, "groups": groups, "transactions": transactions,
                   "sources": [_slot(lag) for lag in snap.sources], "retention": snap.retention,
                   "heartbeat": snap.heartbeat,
                   "links": {"control": "dags/control", "retention": "dags/retention/runs",
                             "metrics": f"{URL_PREFIX.lstrip('/')}/metrics"}})


# ---------------------------------------------------------------- the app

def create_app() -> FastAPI:
    app = FastAPI(title="trailbound console", description=__doc__, docs_url=None, redoc_url=None)

    @app.get("/")
    async def page() -> RedirectResponse:
        """The console is a page of Airflow's UI now (the plugin's React app): old links land there."""
        return RedirectResponse("../plugin/trailbound")

    @app.get("/static/console.js")
    async def bundle(user: User) -> FileResponse:
        """The React app Airflow's UI imports (no build step: plain JavaScript on the UI's React)."""
        return FileResponse(BUNDLE, media_type="text/javascript", headers={"Cache-Control": "no-cache"})

    @app.get("/api/console")
    async def console(user: User) -> JSONResponse:
        return JSONResponse(console_data(await run_in_threadpool(read_snapshot)))

    @app.get("/api/info-all")
    async def info_all(user: User) -> JSONResponse:
        snap = await run_in_threadpool(read_snapshot)
        groups = [{k: v for k, v in asdict(g).items() if k != "last_run"} for g in snap.groups]
        return JSONResponse(_plain({"as_of": snap.now, "groups": groups}))

    @app.get("/api/heartbeat")
    async def heartbeats(user: User) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(read_heartbeats))

    @app.get("/metrics")
    async def metrics(reader: Annotated[object, Depends(metrics_reader)]) -> Response:
        from trailbound.metrics import CONTENT_TYPE

        return Response(await run_in_threadpool(read_metrics), media_type=CONTENT_TYPE)

    return app


app = create_app()
