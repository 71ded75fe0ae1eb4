"""Airflow UI plugin: the A/B reports and MLflow one click away from the abpo_monthly DAG.

- a FastAPI app mounted at /abpo on the Airflow API server: /abpo/reports/ lists the reports written by
  `abpo report` (newest first) and serves each self-contained report.html;
- nav links (Airflow 3 `external_views`) to that list and to the MLflow UI ($ABPO_MLFLOW_UI, default
  http://localhost:5000).

The reports directory is the config's paths.reports ($ABPO_CONFIG preset, $ABPO_STATE state directory).
"""

from __future__ import annotations

import html
import os
from pathlib import Path

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse

REPORT_FILES = ("report.html", "report.md", "ctr_by_arm.png", "report.json")


def reports_dir() -> Path:
    from abpo.config import load_config

    return load_config(os.environ.get("ABPO_CONFIG", "tiny")).paths.resolve("reports")


def create_app() -> FastAPI:
    app = FastAPI(title="abpo reports", description="A/B reports of the abpo_monthly pipeline")

    @app.get("/reports/", response_class=HTMLResponse)
    def list_reports() -> str:
        root = reports_dir()
        found = sorted(
            (p for p in root.glob("*/report.html") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True
        ) if root.is_dir() else []
        rows = "".join(
            f'<li><a href="{html.escape(p.parent.name)}/report.html">{html.escape(p.parent.name)}</a></li>'
            for p in found
        )
        body = f"<ul>{rows}</ul>" if rows else f"<p>No report yet under {html.escape(str(root))}.</p>"
        return f"<!doctype html><html><head><title>abpo A/B reports</title></head><body><h1>A/B reports</h1>{body}</body></html>"

    @app.get("/reports/{name}/{filename}")
    def report_file(name: str, filename: str) -> FileResponse:
        root = reports_dir().resolve()
        path = (root / name / filename).resolve()
        if filename not in REPORT_FILES or path.parent.parent != root or not path.is_file():
            raise HTTPException(status_code=404, detail=f"no report file {name}/{filename}")
        return FileResponse(path)

    return app


class AbpoPlugin(AirflowPlugin):
    name = "abpo"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/abpo", "name": "abpo reports"}]
    external_views = [
        {"name": "A/B reports", "href": "/abpo/reports/", "destination": "nav", "category": "abpo",
         "url_route": "abpo-reports"},
        {"name": "MLflow", "href": os.environ.get("ABPO_MLFLOW_UI", "http://localhost:5000"), "destination": "nav",
         "category": "abpo"},
    ]
