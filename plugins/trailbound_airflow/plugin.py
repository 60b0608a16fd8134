"""The Airflow plugin: the trailbound console (a FastAPI app, no Flask or FAB) mounted
under /trailbound and shown in the navigation as an external view, and the triggers the
deferrable sensors hand their waiting to."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from trailbound_airflow.console import URL_PREFIX, app


class TrailboundPlugin(AirflowPlugin):
    name = "trailbound"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "trailbound console"}]
    external_views = [{"name": "Trailbound", "href": f"{URL_PREFIX}/", "destination": "nav",
                       "url_route": "trailbound", "category": "browse"}]
