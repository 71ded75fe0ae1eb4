"""Airflow UI plugin: the A/B reports, the Great Expectations results and each arm's champion in MLflow, one click
away in the Airflow UI, for Airflow users only.

A FastAPI app mounted at /abpo on the Airflow API server. This file wires routes to functions: what each page reads
is one function of abpo.monthly.pages (its table names them; they run, and are tested, without Airflow), and its
HTML is a Jinja template beside the report's (abpo/abtest/templates/ui_*.html.j2, autoescaped: every value a page
shows is escaped).

- /abpo/reports/ lists the reports written by `abpo report` and the DAG's report task (newest first);
  /abpo/reports/latest redirects to the newest one; /abpo/reports/<name>/<file> serves a report's files;
- /abpo/validation/ lists the Great Expectations summaries the ingest saves (validation/impressions_<month>.json
  under paths.root); /abpo/validation/<YYYY-MM> shows one as a page, /abpo/validation/<YYYY-MM>.json as saved;
  /abpo/validation/latest redirects to the newest month; /abpo/validation/docs/index.html serves the GX Data Docs
  site the ingest's Checkpoint builds (validation/data_docs);
- /abpo/champions: each arm's champion (alias ``champion`` of the registered model ``abpo-arm-<arm>``, prefixed by
  ``$ABPO_NAMESPACE-`` when set (paths.namespace), read from
  the config's tracking URI) with a link to its MLflow UI page ($ABPO_MLFLOW_UI, default http://localhost:5000);
  a registry that does not answer within :data:`LOOKUP_TIMEOUT_S` gives a page saying so (503), never a 500.

Authentication: Airflow does not authenticate a plugin's FastAPI app, so every route depends on Airflow's own
``requires_access_dag("GET", param_dag_id="abpo_monthly")`` (airflow.api_fastapi.core_api.security): the JWT of the
``Authorization: Bearer`` header or of the ``_token`` cookie the Airflow UI sets is validated by the configured auth
manager (401 without one, 403 for an invalid or revoked one), and the user must be allowed to read the DAG
abpo_monthly, whose outputs these pages are: who cannot see the DAG cannot see its reports either, with any auth
manager (per-DAG permissions, teams). With ``[core] simple_auth_manager_all_admins`` every request is an admin's,
as everywhere in Airflow.

Names are whitelisted (a report directory: YYYY-MM, YYYY-MM..YYYY-MM or csv-<name>; a file: one of
abpo.monthly.pages.REPORT_FILES; a month: YYYY-MM); anything else (NUL bytes, ``..``, encoded slashes) is a 404.
Reports are written atomically (abpo.abtest.render.write_report), so a half-written one is never served.

Nav links (Airflow 3 ``external_views``, category abpo): the report list, the latest report, the latest GX results,
the arms' champions, and the MLflow UI.

The app is built on its first request (:class:`LazyApp`): every process that loads plugins imports this module (the
scheduler, the dag processor, each task's process), and only the API server needs Airflow's API security module;
abpo.monthly.pages imports only the standard library and abpo's leaf modules until a page is asked for.
The directories come from the config ($ABPO_CONFIG preset, $ABPO_STATE state directory, $ABPO_TRACKING_URI).
"""

from __future__ import annotations

import os
import re
import threading
from typing import ClassVar
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin

from abpo.monthly import pages  # what each page reads, and its HTML (cheap to import: see the module's docstring)

DAG_ID = "abpo_monthly"
LOOKUP_TIMEOUT_S = 5.0  # an MLflow server that is down retries for minutes: the page answers after this
VALIDATION_NAME = re.compile(rf"({pages.MONTH.pattern})(\.json)?")  # /validation/<YYYY-MM>[.json]


def _cfg():
    from abpo.config import load_config

    return load_config(os.environ.get("ABPO_CONFIG", "tiny"))


def create_app():
    """The reports app; every route requires an Airflow user who may read the DAG abpo_monthly."""
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

    app = FastAPI(
        title="abpo reports",
        description="A/B reports, GX results and arm champions of the abpo_monthly pipeline",
        dependencies=[Depends(requires_access_dag("GET", param_dag_id=DAG_ID))],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def refused(e: pages.Refused) -> HTTPException:
        return HTTPException(status_code=e.status, detail=e.detail)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return pages.html(pages.Index())

    @app.get("/reports/", response_class=HTMLResponse)
    def reports() -> str:
        return pages.html(pages.reports(_cfg()))

    @app.get("/reports/latest")
    def latest_report():
        names = pages.reports(_cfg()).names
        if not names:
            return HTMLResponse(pages.html(pages.Notice("A/B reports", "No report yet.")), status_code=404)
        return RedirectResponse(f"{quote(names[0])}/report.html", status_code=307)

    @app.get("/reports/{name}/{filename}")
    def report_file(name: str, filename: str) -> FileResponse:
        try:
            return FileResponse(pages.report_file(_cfg(), name, filename))
        except pages.Refused as e:
            raise refused(e) from None

    @app.get("/validation/", response_class=HTMLResponse)
    def validations() -> str:
        return pages.html(pages.validations(_cfg()))

    @app.get("/validation/docs/{path:path}")
    def data_docs(path: str) -> FileResponse:
        try:
            return FileResponse(pages.data_docs_file(_cfg(), path))
        except pages.Refused as e:
            raise refused(e) from None

    @app.get("/validation/latest")
    def latest_validation():
        months = pages.validations(_cfg()).months
        if not months:
            page = pages.Notice("Great Expectations results", "No validation yet.")
            return HTMLResponse(pages.html(page), status_code=404)
        return RedirectResponse(months[0], status_code=307)

    @app.get("/validation/{name}")
    def validation(name: str):
        m = VALIDATION_NAME.fullmatch(name)
        if not m:
            raise HTTPException(status_code=404, detail="no such validation result")
        month, as_saved = m.group(1), bool(m.group(2))
        try:
            if as_saved:
                return Response(pages.validation_json(_cfg(), month), media_type="application/json")
            return HTMLResponse(pages.html(pages.validation(_cfg(), month)))
        except pages.Refused as e:
            raise refused(e) from None

    @app.get("/champions", response_class=HTMLResponse)
    def champions():
        page = pages.champions(_cfg(), LOOKUP_TIMEOUT_S)
        return HTMLResponse(pages.html(page), status_code=page.status)

    return app


class LazyApp:
    """An ASGI app that builds ``factory()`` on its first request (see the module's docstring)."""

    def __init__(self, factory):
        self.factory = factory
        self._app = None
        self._lock = threading.Lock()

    @property
    def app(self):
        if self._app is None:
            with self._lock:
                if self._app is None:
                    self._app = self.factory()
        return self._app

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)


def _nav(name: str, href: str, url_route: str | None = None) -> dict:
    view = {"name": name, "href": href, "destination": "nav", "category": "abpo"}
    if url_route:  # shown inside the Airflow UI (same origin: the browser sends the _token cookie)
        view["url_route"] = url_route
    return view


class AbpoPlugin(AirflowPlugin):
    name = "abpo"
    fastapi_apps: ClassVar[list] = [{"app": LazyApp(create_app), "url_prefix": "/abpo", "name": "abpo reports"}]
    external_views: ClassVar[list] = [
        _nav("A/B reports", "/abpo/reports/", "abpo-reports"),
        _nav("Latest A/B report", "/abpo/reports/latest", "abpo-latest-report"),
        _nav("GX validation", "/abpo/validation/latest", "abpo-validation"),
        _nav("Arm champions", "/abpo/champions", "abpo-champions"),
        _nav("MLflow", pages.mlflow_ui()),
    ]
