"""The Airflow plugin: the trailbound console, a page of Airflow's UI (a React app, Airflow
3.1+ `react_apps`, under Browse -> Trailbound) fed by a FastAPI app mounted under
/trailbound (no Flask or FAB)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from trailbound_airflow.console import URL_PREFIX, app


class TrailboundPlugin(AirflowPlugin):
    name = "trailbound"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "trailbound console"}]
    # bundle_url is relative to the UI's base URL, which the UI resolves it against.
    react_apps = [{"name": "Trailbound", "bundle_url": f"{URL_PREFIX.lstrip('/')}/static/console.js",
                   "destination": "nav", "url_route": "trailbound", "category": "browse"}]
