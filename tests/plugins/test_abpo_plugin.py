"""The Airflow UI plugin: Airflow's own plugin manager loads it, and its app lists and serves reports
(and nothing outside the reports directory)."""

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="abpo-airflow-home-"))
PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    monkeypatch.setenv("ABPO_STATE", str(tmp_path))
    spec = importlib.util.spec_from_file_location("abpo_plugin", PLUGINS / "abpo_plugin.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["abpo_plugin"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_airflow_loads_the_plugin(monkeypatch):
    from airflow import plugins_manager

    monkeypatch.setattr(plugins_manager.settings, "PLUGINS_FOLDER", str(PLUGINS), raising=False)
    plugins_manager._get_plugins.cache_clear()
    plugins, import_errors = plugins_manager._get_plugins()
    assert import_errors == {}
    plugin = next(p for p in plugins if p.name == "abpo")
    assert {v["name"] for v in plugin.external_views} == {"A/B reports", "MLflow"}
    assert plugin.fastapi_apps[0]["url_prefix"] == "/abpo"
    plugins_manager._get_plugins.cache_clear()


def test_lists_and_serves_reports_only(plugin_module, tmp_path):
    from fastapi.testclient import TestClient

    client = TestClient(plugin_module.create_app())
    assert "No report yet" in client.get("/reports/").text
    report = tmp_path / "reports" / "2026-02..2026-04"
    report.mkdir(parents=True)
    (report / "report.html").write_text("<html><body><table><tr><td>abpo</td></tr></table></body></html>")
    (tmp_path / "secret.txt").write_text("no")
    listing = client.get("/reports/").text
    assert 'href="2026-02..2026-04/report.html"' in listing
    served = client.get("/reports/2026-02..2026-04/report.html")
    assert served.status_code == 200 and "<td>abpo</td>" in served.text
    assert client.get("/reports/2026-02..2026-04/secret.txt").status_code == 404
    assert client.get("/reports/../secret.txt").status_code == 404
    assert client.get("/reports/..%2F/secret.txt").status_code == 404
