"""The trailbound console inside the Airflow UI: what a GoldenGate operator looks at first.

A FastAPI app (mounted by the plugin under /trailbound, shown in the navigation as an
external view) with one page and its JSON twin:

    GET /trailbound/               the page: INFO ALL, each group's checkpoints (and the
                                   replicat's checkpoint table row), open transactions
                                   oldest first with age and BR state (alert rows past
                                   WARNLONGTRANS), each source's retention, a lag chart
                                   per group, links to the DAG runs and the control DAG
    GET /trailbound/api/info-all   INFO ALL as JSON
    GET /trailbound/api/heartbeat  each replicat's heartbeats as JSON (trailbound.heartbeat.snapshot):
                                   the last per source with its lag per hop and end to end, and
                                   the history (lag over time)
    GET /trailbound/metrics        Prometheus text (trailbound.metrics): lag per group,
                                   runs, operations, open transactions, slot lag

It reads state and never acts: actions go through the control DAG, so every one has a
run, a log and an owner. Every endpoint checks the user through Airflow's auth manager
(the API server's JWT, from the UI's cookie or a bearer header): an unauthenticated page
request is sent to the login page, an API request gets 401. `/metrics` also takes the
token in the API server's TRAILBOUND_METRICS_TOKEN variable (`Authorization: Bearer
TOKEN`), for a Prometheus that cannot renew Airflow's short-lived JWTs. Database reads run in a
worker thread, off the event loop. Links are relative, so the view works under a proxy's
base path. Times are UTC and say so.
"""

from __future__ import annotations

import hmac
import html
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

URL_PREFIX = "/trailbound"


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


def run_href(dag_id: str, run_id: str) -> str:
    """The Airflow UI's page of one DAG run (relative, like every link of the view)."""
    return f"../dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


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


# ---------------------------------------------------------------- the page

def _utc(value: datetime | None) -> str:
    return "" if value is None else f"{value.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def _hms(value: timedelta | None) -> str:
    if value is None:
        return ""
    seconds = max(0, int(value.total_seconds()))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def lag_chart(points, width: int = 420, height: int = 120) -> str:
    """Lag at checkpoint over the group's runs, as inline SVG (no script, no CDN); each
    point links to the DAG run that committed it, when one did: the run id its task
    recorded with the run (trailbound.runlog), not a guess from time windows."""
    if not points:
        return '<p class="muted">no committed run yet</p>'
    pad = 34
    seconds = [p.lag.total_seconds() for p in points]
    top = max(max(seconds), 1.0)
    t0, t1 = points[0].at, points[-1].at
    span = max((t1 - t0).total_seconds(), 1.0)

    def xy(p) -> str:
        x = pad + (width - 2 * pad) * ((p.at - t0).total_seconds() / span if len(points) > 1 else 0.5)
        y = height - pad + (pad * 2 - height) * (p.lag.total_seconds() / top)
        return f"{x:.1f},{y:.1f}"

    def dot(p) -> str:
        x, y = xy(p).split(",")
        run = p.airflow_run_id is not None and p.airflow_dag_id is not None
        title = f"{_utc(p.at)}: lag {_hms(p.lag)}" + (f", DAG run {p.airflow_dag_id} {p.airflow_run_id}" if run
                                                      else ", a run from the command line")
        circle = f'<circle cx="{x}" cy="{y}" r="{3.5 if run else 2.5}"><title>{html.escape(title)}</title></circle>'
        if not run:
            return circle
        return f'<a href="{html.escape(run_href(p.airflow_dag_id, p.airflow_run_id))}" class="run">{circle}</a>'

    dots = "".join(dot(p) for p in points)
    return (f'<svg class="lag" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="lag at checkpoint per run">'
            f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" class="axis"/>'
            f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" class="axis"/>'
            f'<polyline points="{" ".join(xy(p) for p in points)}" class="line"/>{dots}'
            f'<text x="2" y="{pad + 4}">{_hms(timedelta(seconds=top))}</text>'
            f'<text x="2" y="{height - pad}">0</text>'
            f'<text x="{pad}" y="{height - 8}">{_utc(t0)}</text>'
            f'<text x="{width - pad}" y="{height - 8}" text-anchor="end">{_utc(t1)[11:]}</text></svg>')


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.2rem; color: #1b1f24; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; }
table { border-collapse: collapse; margin: .4rem 0; } td, th { border: 1px solid #ccd; padding: .25rem .5rem;
  text-align: left; font-variant-numeric: tabular-nums; }
th { background: #eef1f6; } .ABENDED { background: #fde2e1; font-weight: bold; } .RUNNING { background: #e3f6e4; }
tr.alert td { background: #fff0c2; } .muted { color: #667; } pre { background: #f6f8fa; padding: .5rem;
  overflow-x: auto; font-size: .8rem; } svg.lag { background: #fafbfd; border: 1px solid #dde; }
svg .axis { stroke: #99a; } svg .line { fill: none; stroke: #1f6feb; stroke-width: 2; } svg circle { fill: #1f6feb; }
svg text { font-size: 9px; fill: #556; } .grid { display: flex; flex-wrap: wrap; gap: 1rem; }
"""


def render(snap: Snapshot) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>trailbound console</title>"
           f"<meta http-equiv='refresh' content='60'><style>{_STYLE}</style></head><body>",
           f"<h1>trailbound console</h1><p class='muted'>As of {_utc(snap.now)}. Read-only: act through the "
           f"<a href='../dags/control'>control DAG</a> (Trigger, then its form: skiptrans, forcetrans, alter ...). "
           f"<a href='api/info-all'>INFO ALL as JSON</a>.</p>",
           "<h2 id='info-all'>INFO ALL</h2><table id='info-all-table'><tr><th>Program</th><th>Status</th>"
           "<th>Group</th><th>Lag at Chkpt</th><th>Time Since Chkpt</th><th>Last checkpoint</th><th>Last error</th>"
           "<th>DAG runs</th></tr>"]
    for g in snap.groups:
        links = " ".join(f"<a href='../dags/{e(d)}/runs'>{e(d)}</a>" for d in snap.dags.get((g.program, g.group), []))
        error = f"{_utc(g.error_time)}: {e(g.error)}" if g.error else ""
        out.append(f"<tr class='group {g.status}' data-group='{e(g.group)}'><td>{g.program.upper()}</td>"
                   f"<td class='status'>{g.status}</td><td>{e(g.group)}"
                   f"{'' if g.configured else ' <span class=muted>(not in this configuration)</span>'}</td>"
                   f"<td class='lag'>{_hms(g.lag)}</td>"
                   f"<td>{_hms(g.since_checkpoint)}</td><td>{_utc(g.checkpoint_time) or 'not added yet'}</td>"
                   f"<td class='error'>{error}</td><td>{links}</td></tr>")
    out.append("</table><p class='muted'>Lag at Chkpt: the checkpoint's wall time minus the log time of the last "
               "record it covers. Time Since Chkpt: now minus the checkpoint's wall time. Ages of open "
               "transactions are log time.</p>")

    out.append("<h2 id='transactions'>Open transactions (oldest first)</h2>")
    if snap.transactions:
        out.append("<table id='transactions-table'><tr><th>Group</th><th>XID</th><th>Thread</th><th>Start position"
                   "</th><th>Start SCN</th><th>Started (log time)</th><th>Age</th><th>Records</th><th>BR state</th>"
                   "<th>Alert</th></tr>")
        for t in snap.transactions:
            alert = (f"open longer than WARNLONGTRANS {_hms(snap.warnlongtrans.get(t.group))}: "
                     f"control DAG skiptrans or forcetrans {e(t.xid)}") if t.long_running else ""
            out.append(f"<tr class='txn{' alert' if t.long_running else ''}'><td>{e(t.group)}</td><td>{e(t.xid)}</td>"
                       f"<td>{t.thread}</td><td>{e(t.start_position)}</td><td>{t.start_scn}</td>"
                       f"<td>{_utc(t.start_time)}</td><td>{_hms(t.age)}</td><td>{t.records}</td>"
                       f"<td>{e(t.br_state)}</td><td>{alert}</td></tr>")
        out.append("</table>")
    else:
        out.append("<p class='muted'>none</p>")

    if snap.sources:
        out.append("<h2 id='sources'>Live sources: slot lag</h2><table id='sources-table'><tr><th>Source</th>"
                   "<th>Slot</th><th>Confirmed LSN</th><th>Server WAL</th><th>Not yet archived</th>"
                   "<th>WAL held</th><th>Archive behind the server's clock</th><th>Open streamed transactions</th>"
                   "</tr>")
        for lag in snap.sources:
            if isinstance(lag, tuple):
                out.append(f"<tr class='source'><td>{e(lag[0])}</td><td colspan='7'>not available: {e(lag[1])}</td>"
                           "</tr>")
            elif not lag.exists:
                out.append(f"<tr class='source alert'><td>{e(lag.source)}</td><td>{e(lag.slot)}</td>"
                           f"<td colspan='6'>slot missing: trailbound add source {e(lag.source)}</td></tr>")
            else:
                behind = f"{lag.behind_seconds:.0f} s" if lag.behind_seconds is not None else "no segment yet"
                out.append(f"<tr class='source'><td>{e(lag.source)}</td><td>{e(lag.slot)}</td><td>{e(lag.confirmed)}"
                           f"</td><td>{e(lag.current)}</td><td class='lag'>{lag.lag_bytes} bytes</td>"
                           f"<td>{lag.held_bytes} bytes</td><td>{behind}</td><td>{len(lag.open_streamed)}</td></tr>")
        out.append("</table><p class='muted'>Not yet archived: WAL the slot has not confirmed (the next pull's "
                   "work). WAL held: what the slot keeps on the source's disk. A forgotten slot holds WAL forever: "
                   "trailbound delete source.</p>")

    out.append("<h2 id='retention'>Archive-log retention</h2><table id='retention-table'><tr><th>Source</th>"
               "<th>Required SCN</th><th>Registrations</th><th>Purgeable now</th><th>Kept</th><th>Warning</th></tr>")
    for r in snap.retention:
        if "error" in r:
            out.append(f"<tr><td colspan='6'>not available: {e(r['error'])}</td></tr>")
            continue
        out.append(f"<tr><td>{e(r['source'])}</td><td>{r['required_scn'] if r['required_scn'] is not None else 'none'}"
                   f"</td><td>{e('; '.join(r['registrations']) or 'none')}</td><td>{r['purgeable']} segment(s), "
                   f"{r['purgeable_bytes']} bytes: {e(r['purgeable_ranges'])}</td><td>{r['kept']}</td>"
                   f"<td>{e(r['warning'] or '')}</td></tr>")
    out.append("</table><p><a href='../dags/retention/runs'>retention DAG runs</a></p>")

    out.append("<h2 id='lag'>Lag at checkpoint per run</h2><div class='grid'>")
    for g in snap.groups:
        out.append(f"<figure><figcaption>{g.program.upper()} {e(g.group)}</figcaption>"
                   f"{lag_chart(snap.lags.get((g.program, g.group), []))}</figure>")
    out.append("</div><h2 id='checkpoints'>Checkpoints</h2>")
    for (program, group), text in snap.checkpoints.items():
        out.append(f"<h3>INFO {program.upper()} {e(group)} SHOWCH</h3><pre>{e(text)}</pre>")
    out.append("</body></html>")
    return "".join(out)


def _plain(value):
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---------------------------------------------------------------- the app

def create_app() -> FastAPI:
    app = FastAPI(title="trailbound console", description=__doc__, docs_url=None, redoc_url=None)

    @app.exception_handler(HTTPException)
    async def to_login(request: Request, exc: HTTPException):
        """A page request without a valid session goes to Airflow's login, and back."""
        if exc.status_code == 401 and not request.url.path.rstrip("/").endswith(("/api/info-all", "/api/heartbeat",
                                                                                  "/metrics")):
            from airflow.api_fastapi.app import get_auth_manager

            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.get("/", response_class=HTMLResponse)
    async def page(user: User) -> HTMLResponse:
        snap = await run_in_threadpool(read_snapshot)
        return HTMLResponse(render(snap))

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
