"""The Airflow 3 plugin: mounts the Carbon page app at ``/carbonflow`` and adds "Carbon" to the UI's nav.

Registered twice on purpose, and loaded once (Airflow skips a plugin name already registered): through the
``airflow.plugins`` entry point of the installed package and through the thin ``plugins/carbonflow_plugin.py``
for deployments that mount the repository's ``plugins/`` folder.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

from carbonflow.settings import UI_AUTH_ENV, ui_auth_mode
from carbonflow.web.app import airflow_auth_dependency, airflow_readable_dags, create_app, everything
from carbonflow.web.data import airflow_upcoming

URL_PREFIX = "/carbonflow"
AUTH_ENV = UI_AUTH_ENV  # "airflow" (default): the page needs an Airflow login; "none": open


def _dependencies() -> list:
    return [airflow_auth_dependency()] if ui_auth_mode() == "airflow" else []


def _readable_dags():
    """Which DAGs a user may read: Airflow's auth manager decides (everything when the page is open)."""
    return airflow_readable_dags() if ui_auth_mode() == "airflow" else everything


carbon_app = create_app(upcoming_source=airflow_upcoming, dependencies=_dependencies(), readable_dags=_readable_dags())


class CarbonflowPlugin(AirflowPlugin):
    """Carbon page (forecast, planned windows, latest runs from MLflow) inside the Airflow UI."""

    name = "carbonflow"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [{"app": carbon_app, "url_prefix": URL_PREFIX, "name": "carbonflow"}]
    external_views: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "Carbon",
            "href": f"{URL_PREFIX}/carbon",
            "destination": "nav",
            "url_route": "carbon",
            "icon": f"{URL_PREFIX}/static/leaf.svg",
            "category": "browse",
        }
    ]
