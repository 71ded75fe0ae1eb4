"""The Airflow UI plugin, on the real Airflow API server app: Airflow's plugin manager loads it, `create_app` mounts it
at /abpo beside Airflow's own routes, and the SimpleAuthManager (a configured user with a password) authenticates
every request: no token 401, a forged one 403, a token from POST /auth/token (header or the UI's _token cookie) 200.
Then: only whitelisted report names and files are served (404 otherwise, never 500), the latest report and GX
result are one redirect away, and the champions page reads a real MLflow registry or says it could not."""

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

# Airflow reads AIRFLOW_HOME (and so its SQLite database) when first imported: keep it out of ~/airflow
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="abpo-airflow-home-"))
PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
USER, PASSWORD = "reader", "reader-password-for-tests"
JWT_SECRET = "abpo-plugin-tests-jwt-secret-" + "0123456789abcdef" * 4  # >= 64 bytes for HS512

ROUTES = [
    "/abpo/",
    "/abpo/reports/",
    "/abpo/reports/latest",
    "/abpo/reports/2026-03/report.html",
    "/abpo/reports/%00/report.html",
    "/abpo/validation/",
    "/abpo/validation/latest",
    "/abpo/validation/2026-03",
    "/abpo/validation/2026-03.json",
    "/abpo/champions",
]


def _ensure_airflow_db():
    """The API server's database (tokens are checked against revoked ones, DAG access against teams): created from
    Airflow's models (what `airflow db migrate` does on an empty database, in ~4 s) unless it already exists."""
    from airflow import settings
    from sqlalchemy import inspect

    if not inspect(settings.engine).has_table("dag"):
        from airflow.utils.db import initdb

        initdb()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """A TestClient on airflow.api_fastapi.app.create_app() with the repo's plugins folder and the SimpleAuthManager
    (user `reader`, role viewer, password from a passwords file; not all-admins, which would authenticate everyone)."""
    from airflow import plugins_manager, settings

    mp = pytest.MonkeyPatch()
    passwords = tmp_path_factory.mktemp("auth") / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    for key, value in {
        "AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "SIMPLE_AUTH_MANAGER_USERS": f"{USER}:viewer",
        "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "LOAD_EXAMPLES": "False",
    }.items():
        mp.setenv(f"AIRFLOW__CORE__{key}", value)
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", JWT_SECRET)
    mp.setattr(settings, "PLUGINS_FOLDER", str(PLUGINS), raising=False)
    plugins_manager._get_plugins.cache_clear()
    _ensure_airflow_db()
    from airflow.api_fastapi.app import create_app, purge_cached_app
    from fastapi.testclient import TestClient

    purge_cached_app()
    try:
        with TestClient(create_app("core")) as client:
            yield client
    finally:
        purge_cached_app()
        plugins_manager._get_plugins.cache_clear()
        mp.undo()


@pytest.fixture(scope="module")
def token(api):
    r = api.post("/auth/token", json={"username": USER, "password": PASSWORD})
    assert r.status_code == 201, r.text
    return r.json()["access_token"]


@pytest.fixture
def get(api, token):
    """GET as the authenticated user (Bearer header), without following redirects."""
    return lambda url: api.get(url, headers={"Authorization": f"Bearer {token}"}, follow_redirects=False)


@pytest.fixture
def plugin():
    """The module Airflow's plugin manager loaded (the one the mounted app reads its constants from)."""
    from airflow import plugins_manager

    abpo = next(p for p in plugins_manager._get_plugins()[0] if p.name == "abpo")
    return sys.modules[abpo.__module__]


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("ABPO_STATE", str(tmp_path))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    monkeypatch.setenv("ABPO_MLFLOW_UI", "http://mlflow.example:5000/")
    return tmp_path


def _report(state: Path, name: str, body: str = "abpo", age: float = 0.0) -> Path:
    d = state / "reports" / name
    d.mkdir(parents=True)
    (d / "report.html").write_text(f"<html><body><table><tr><td>{body}</td></tr></table></body></html>")
    (d / "report.json").write_text("{}")
    t = time.time() - age
    os.utime(d / "report.html", (t, t))
    return d


# ---- the plugin as Airflow loads it ----


def test_airflow_loads_the_plugin(api):
    from airflow import plugins_manager

    plugins, import_errors = plugins_manager._get_plugins()
    assert import_errors == {}
    plugin = next(p for p in plugins if p.name == "abpo")
    views = {v["name"]: v for v in plugin.external_views}
    assert {n: v["href"] for n, v in views.items()} == {
        "A/B reports": "/abpo/reports/",
        "Latest A/B report": "/abpo/reports/latest",
        "GX validation": "/abpo/validation/latest",
        "Arm champions": "/abpo/champions",
        "MLflow": os.environ.get("ABPO_MLFLOW_UI", "http://localhost:5000").rstrip("/"),
    }
    assert all(v["destination"] == "nav" and v["category"] == "abpo" for v in views.values())
    assert plugin.fastapi_apps[0]["url_prefix"] == "/abpo"
    # Airflow's own plugins endpoint describes it (and requires a token as well)
    assert api.get("/api/v2/plugins").status_code == 401


def test_the_plugin_imports_only_abpos_leaf_modules_and_its_pages():
    """Every Airflow process that loads plugins imports the plugin file: of abpo, only the pages' module
    (abpo.monthly.pages, cheap until a page is asked for) and the leaf modules it names; no MLflow, Jinja or numpy.
    Where the routes' logic and HTML live is tested in tests/monthly/test_pages.py."""
    import subprocess

    probe = (
        "import importlib.util, sys; s = importlib.util.spec_from_file_location('p', sys.argv[1]); "
        "m = importlib.util.module_from_spec(s); before = set(sys.modules); s.loader.exec_module(m); "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(PLUGINS / "abpo_plugin.py")], capture_output=True, text=True, check=True
    )
    loaded = set(out.stdout.split())
    assert {m for m in loaded if m == "abpo" or m.startswith("abpo.")} == {
        "abpo",
        "abpo.arms",
        "abpo.arms.names",
        "abpo.errors",
        "abpo.months",
        "abpo.monthly",
        "abpo.monthly.pages",
        "abpo.paths",
    }
    assert not {m.split(".")[0] for m in loaded} & {"mlflow", "numpy", "pandas", "duckdb", "torch"}


# ---- authentication through Airflow's auth manager ----


def test_every_route_requires_an_airflow_user(api, state):
    _report(state, "2026-03")
    for url in ROUTES:
        r = api.get(url, follow_redirects=False)
        assert r.status_code == 401, (url, r.status_code, r.text[:200])
        assert r.json() == {"detail": "Not authenticated"}


def test_forged_token_is_refused(api, state):
    import jwt

    _report(state, "2026-03")
    forged = jwt.encode(
        {"sub": USER, "role": "admin", "exp": int(time.time()) + 600, "aud": "apache-airflow"},
        "not-the-secret-" * 5,
        algorithm="HS512",
    )
    for headers in (
        {"Authorization": f"Bearer {forged}"},
        {"Cookie": f"_token={forged}"},
        {"Authorization": "Bearer not-a-jwt"},
    ):
        r = api.get("/abpo/reports/2026-03/report.html", headers=headers)
        assert r.status_code == 403, (headers, r.status_code, r.text[:200])
        assert "<td>abpo</td>" not in r.text


def test_token_from_the_login_endpoint_works_as_header_and_cookie(api, token, state):
    _report(state, "2026-03")
    for headers in ({"Authorization": f"Bearer {token}"}, {"Cookie": f"_token={token}"}):
        r = api.get("/abpo/reports/2026-03/report.html", headers=headers)
        assert r.status_code == 200, (headers, r.text[:200])
        assert "<td>abpo</td>" in r.text
    assert api.post("/auth/token", json={"username": USER, "password": "wrong"}).status_code == 401


# ---- reports ----


def test_lists_and_serves_reports_only(get, state):
    assert "No report yet" in get("/abpo/reports/").text
    assert get("/abpo/reports/latest").status_code == 404
    _report(state, "2026-02..2026-04", body="range", age=60)
    _report(state, "2026-03", body="march", age=120)
    _report(state, "csv-counts_v2", body="csv", age=180)
    _report(state, ".2026-05.tmp-123-abc", body="half-written")  # write_report's temporary directory
    _report(state, "notes", body="not a report name")
    (state / "secret.txt").write_text("no")
    listing = get("/abpo/reports/").text
    assert (
        'href="2026-02..2026-04/report.html"' in listing
        and 'href="2026-03/report.html"' in listing
        and 'href="csv-counts_v2/report.html"' in listing
    )
    assert listing.index("2026-02..2026-04") < listing.index("2026-03/") < listing.index("csv-counts_v2")
    assert "tmp" not in listing and "notes" not in listing
    r = get("/abpo/reports/latest")
    assert r.status_code == 307 and r.headers["location"] == "2026-02..2026-04/report.html"
    served = get("/abpo/reports/2026-02..2026-04/report.html")
    assert served.status_code == 200 and "<td>range</td>" in served.text
    assert get("/abpo/reports/2026-03/report.json").json() == {}


@pytest.mark.parametrize(
    "path",
    [
        "2026-03/secret.txt",
        "2026-03/report.md",  # not a report file / not written
        "../secret.txt",
        "..%2F/secret.txt",
        "2026-03%2F..%2F..%2Fsecret.txt/report.html",
        "%2e%2e/report.html",
        "%00/report.html",
        "2026-03%00/report.html",
        "2026-03/report.html%00",
        "2026-03/%00",
        ".2026-05.tmp-123-abc/report.html",
        "notes/report.html",
        "2026-13/report.html",
        "2026-3/report.html",
        "outside/report.html",
        "2026-06/report.html",  # symlinks out of the reports directory
        "csv-../report.html",
        "csv-%00/report.html",
    ],
)
def test_bad_names_are_404_never_500(get, state, path):
    _report(state, "2026-03")
    _report(state, ".2026-05.tmp-123-abc")
    _report(state, "notes")
    (state / "secret.txt").write_text("no")
    outside = state / "elsewhere"
    outside.mkdir()
    (outside / "report.html").write_text("outside")
    (state / "reports" / "2026-06").symlink_to(outside)
    (state / "reports" / "outside").symlink_to(outside)
    r = get(f"/abpo/reports/{path}")
    assert r.status_code == 404, (path, r.status_code, r.text[:200])
    assert "outside" not in r.text and "<td>" not in r.text


# ---- Great Expectations results ----


def _summary(month: str, success: bool = True) -> dict:
    failed = (
        []
        if success
        else [
            {
                "expectation": "expect_column_values_to_be_in_set",
                "column": "arm",
                "success": False,
                "unexpected_count": 3,
                "partial_unexpected": ["<b>bogus</b>"],
                "observed_value": None,
            }
        ]
    )
    ok = [
        {
            "expectation": "expect_table_row_count_to_be_between",
            "column": None,
            "success": True,
            "unexpected_count": 0,
            "partial_unexpected": [],
            "observed_value": "1200",
        }
    ]
    return {
        "month": month,
        "success": success,
        "rows": 1200,
        "evaluated": len(ok + failed),
        "failed": failed,
        "results": ok + failed,
        "seconds": 0.4,
    }


def test_validation_results(get, state):
    assert "No validation yet" in get("/abpo/validation/").text
    assert get("/abpo/validation/latest").status_code == 404
    out = state / "validation"  # abpo.monthly.ingest.ingest: <paths.root>/validation/impressions_<month>.json
    out.mkdir()
    (out / "impressions_2026-03.json").write_text(json.dumps(_summary("2026-03")))
    (out / "impressions_2026-04.json").write_text(json.dumps(_summary("2026-04", success=False)))
    (out / "impressions_2026-05.json").write_text("{half a fi")
    assert get("/abpo/validation/").text.count("<li>") == 3
    r = get("/abpo/validation/latest")
    assert r.status_code == 307 and r.headers["location"] == "2026-05"
    april = get("/abpo/validation/2026-04")
    assert april.status_code == 200 and "FAILED" in april.text and "1/2 expectations" in april.text
    assert "&lt;b&gt;bogus&lt;/b&gt;" in april.text and "<b>bogus</b>" not in april.text
    assert "PASSED" in get("/abpo/validation/2026-03").text
    assert get("/abpo/validation/2026-03.json").json() == _summary("2026-03")
    assert get("/abpo/validation/2026-05").status_code == 404  # unreadable
    for bad in ("2026-06", "2026-13", "%2e%2e", "%00", "2026-03%00", "impressions_2026-03.json", "2026-03.json%00"):
        assert get(f"/abpo/validation/{bad}").status_code == 404, bad


# ---- the arms' champions in MLflow ----


def test_champions_link_to_the_mlflow_model_versions(get, state):
    from mlflow import MlflowClient

    uri = f"sqlite:///{state / 'mlflow.db'}"  # the config's default tracking URI under paths.root
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for arm, versions, champion in (("abpo", 2, "2"), ("grpo", 1, "1"), ("ml_retrain", 1, None)):
        name = f"abpo-arm-{arm}"
        client.create_registered_model(name)
        for _ in range(versions):
            v = client.create_model_version(name, source=state.as_uri(), tags={"months": "2026-02,2026-03"})
        client.set_registered_model_alias(name, "challenger", v.version)
        if champion:
            client.set_registered_model_alias(name, "champion", champion)
    r = get("/abpo/champions")
    assert r.status_code == 200, r.text
    page = r.text
    assert 'href="http://mlflow.example:5000/#/models/abpo-arm-abpo/versions/2"' in page
    assert 'href="http://mlflow.example:5000/#/models/abpo-arm-grpo/versions/1"' in page
    assert "abpo-arm-ml_retrain/versions" not in page and "abpo-arm-popularity/versions" not in page
    assert page.count("no champion yet") == 2  # ml_retrain (no alias), popularity (no registered model)
    assert 'href="http://mlflow.example:5000/#/models/abpo-arm-popularity"' in page


def test_champions_show_who_approved_the_promotion(get, state):
    """arms.approval = required: the champion's approver and when (its tags approved_by / approved_at, set by the
    promote step), escaped; a champion promoted without approval says nothing of it."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for arm, tags in (
        ("abpo", {"approved_by": "<i>alice</i>", "approved_at": "2026-03-02T09:30:00+00:00"}),
        ("grpo", {}),
    ):
        client.create_registered_model(f"abpo-arm-{arm}")
        v = client.create_model_version(f"abpo-arm-{arm}", source=state.as_uri(), tags=tags)
        client.set_registered_model_alias(f"abpo-arm-{arm}", "champion", v.version)
    page = get("/abpo/champions").text
    assert "approved by &lt;i&gt;alice&lt;/i&gt; at 2026-03-02T09:30:00+00:00" in page and "<i>alice" not in page
    assert page.count("approved by") == 1


def test_champions_escape_what_a_hand_in_mlflow_wrote(get, state):
    """Tags set by hand in MLflow reach the page as text: a <script> approver name and a 20,000-character pin reason
    (a registered-model tag may hold 100,000) are escaped, the reason shown whole, and no tag opens an element."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    script = "<script>alert('approver')</script>"
    comment = ('<img src=x onerror="alert(1)"> & ' * 700)[:20_000]
    client.create_registered_model("abpo-arm-abpo")
    v = client.create_model_version("abpo-arm-abpo", source=state.as_uri(), tags={"approved_by": script})
    client.set_registered_model_alias("abpo-arm-abpo", "champion", v.version)
    client.set_registered_model_tag("abpo-arm-abpo", "abpo.pinned", f"1|<b>bob</b>|2026-03-02|{comment}")
    r = get("/abpo/champions")
    assert r.status_code == 200, r.text[:300]
    page = r.text
    assert "<script" not in page and "<img" not in page and "<b>bob" not in page
    assert "approved by &lt;script&gt;alert(" in page and "&lt;/script&gt; at " in page
    assert "by &lt;b&gt;bob&lt;/b&gt; at 2026-03-02: &lt;img src=x onerror=" in page
    shown = page.split("at 2026-03-02: ", 1)[1].split(")</td>", 1)[0]
    assert len(shown) > 20_000 and shown.count("&lt;img src=x") == comment.count("<img src=x")
    assert "&amp; &lt;img" in shown


def test_champions_show_the_pin_and_the_promotion_history(get, state, monkeypatch):
    from mlflow import MlflowClient

    from abpo.arms import promotion
    from abpo.config import load_config

    monkeypatch.setenv("ABPO_ACTOR", "alice")
    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("abpo-arm-abpo")
    for _ in range(3):
        client.create_model_version("abpo-arm-abpo", source=state.as_uri())
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
    cfg = load_config("tiny")
    promotion.promote(cfg, "abpo", "2", reason="<b>looks better</b>")
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "3")  # by hand
    promotion.check_champion(cfg, "abpo", "2026-04")
    page = get("/abpo/champions").text
    assert "Promotion history" in page and "<b>pinned</b> (v3 by mlflow-ui" in page
    rows = [r for r in page.split("<tr>") if r.startswith("<td>abpo</td><td>")]
    assert [r.split("<td>")[4].split("<")[0] for r in rows[1:]] == ["mlflow-ui", "promote", "baseline"]  # newest first
    assert "&lt;b&gt;looks better&lt;/b&gt;" in page and "<b>looks better</b>" not in page


def test_champions_show_the_latest_gate_and_what_decided(get, state):
    """Issue 42 point 5: each arm's latest gated challenger with both halves, from its gate.* tags as the gate writes
    them (abpo.monthly.gate.offline_tags / ope_tags): the offline test, its bound and p, the off-policy estimator that
    decided with its interval, and every estimator's line."""
    from mlflow import MlflowClient

    from abpo.monthly.gate import offline_tags, ope_tags
    from abpo.monthly.gate_verdict import gate_verdict

    v = gate_verdict(
        metric="HR@5",
        challenger_ranks=[3] * 2 + [40] * 398,
        champion_ranks=[9] * 2 + [3] * 3 + [40] * 395,
        margin=0.02,
        challenger_version="3",
        champion_version="2",
    )
    dr = {"diff": 0.0187, "ci_low": 0.0135, "ci_high": 0.024, "rows": "all"}
    ope = {"estimator": "dr", "rows": "all", "n": 7320, "challenger_ess": 3052.0, **dr}
    ope["estimates"] = {"dr": dr, "snips": {"diff": 0.01, "ci_low": -0.002, "ci_high": 0.022, "rows": "own"}}
    tags = {"gate.verdict": "fail", "gate.champion_version": "2", **offline_tags("HR@5", v.offline)}
    tags.update(ope_tags(ope, 0.05))
    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("abpo-arm-abpo")
    client.create_model_version("abpo-arm-abpo", source=state.as_uri())
    client.create_model_version("abpo-arm-abpo", source=state.as_uri(), tags={"gate.verdict": "pass"})  # older gate
    client.create_model_version("abpo-arm-abpo", source=state.as_uri(), tags=tags)
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "2")
    page = get("/abpo/champions").text
    assert "<h2>Latest gate</h2>" in page and page.count("<td>v3 vs v2</td>") == 1
    row = page.split("<td>v3 vs v2</td>")[1].split("</tr>")[0]
    cells = [c.split("</td>")[0] for c in row.split("<td>")[1:]]
    # a gate recorded without gate.decided_by, with its off-policy half: both halves decided
    assert cells[:3] == ["FAIL", "both", "Tango score"] and cells[4] == f"{v.offline['lower']:.6g} vs -0.02"
    assert cells[6:9] == ["dr (all, 7320)", "0.0187 [0.0135, 0.024] vs -0.05", "3052"]
    assert cells[9] == "dr +0.0187 [+0.0135, +0.0240] all; snips +0.0100 [-0.0020, +0.0220] own"


def test_champions_of_the_namespace_in_abpo_namespace(get, state, monkeypatch):
    """$ABPO_NAMESPACE (paths.namespace) picks the environment's models, pins and promotion history on a shared store:
    another environment's (here the un-namespaced one) are not shown."""
    from mlflow import MlflowClient

    from abpo.arms import promotion
    from abpo.config import load_config

    monkeypatch.setenv("ABPO_NAMESPACE", "staging")
    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for name, versions in (("abpo-arm-abpo", 1), ("staging-abpo-arm-abpo", 2)):
        client.create_registered_model(name)
        for _ in range(versions):
            client.create_model_version(name, source=state.as_uri())
        client.set_registered_model_alias(name, "champion", "1")
    cfg = load_config("tiny")
    assert cfg.paths.namespace == "staging"
    promotion.promote(cfg, "abpo", "2", reason="staging only", actor="alice")
    promotion.pin(cfg, "abpo", reason="freeze", actor="alice")
    page = get("/abpo/champions").text
    assert 'href="http://mlflow.example:5000/#/models/staging-abpo-arm-abpo/versions/2"' in page
    assert "#/models/abpo-arm-abpo/" not in page and "<b>pinned</b> (v2 by alice" in page
    rows = [r for r in page.split("<tr>") if r.startswith("<td>abpo</td><td>")]
    assert [r.split("<td>")[4].split("<")[0] for r in rows[1:]] == ["pin", "promote", "baseline"]
    assert "abpo.pinned" not in (client.get_registered_model("abpo-arm-abpo").tags or {})


def test_champions_without_a_store(get, state):
    r = get("/abpo/champions")
    assert r.status_code == 503 and "no MLflow store" in r.text
    assert not (state / "mlflow.db").exists()  # not created by looking


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_champions_when_the_registry_refuses(get, state, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("ABPO_TRACKING_URI", f"http://abpo:hunter2@127.0.0.1:{_closed_port()}")
    r = get("/abpo/champions")
    assert r.status_code == 503 and "could not be read" in r.text
    assert "hunter2" not in r.text and "abpo:***@127.0.0.1" in r.text
    assert 'href="http://mlflow.example:5000"' in r.text


def test_champions_when_the_registry_does_not_answer(get, state, plugin, monkeypatch):
    monkeypatch.setattr(plugin, "LOOKUP_TIMEOUT_S", 0.5)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("ABPO_TRACKING_URI", f"http://127.0.0.1:{silent.getsockname()[1]}")
        t0 = time.monotonic()
        r = get("/abpo/champions")
        assert time.monotonic() - t0 < 3
    assert r.status_code == 503 and "no answer within 0.5 s" in r.text


def test_gx_data_docs_built_by_the_ingest_checkpoint_are_served(get, state):
    from abpo.data.schemas import write_impressions
    from abpo.data.synthetic import synthetic_impressions
    from abpo.validation import validate_month
    from abpo.warehouse import Warehouse

    table, _ = synthetic_impressions(200, "2026-03", seed=1)
    write_impressions(table, state / "gx-landing", "2026-03", part="a")
    with Warehouse(state / "gx-wh.duckdb") as wh:
        wh.ingest_month(state / "gx-landing", "2026-03", ["abpo", "grpo", "ml_retrain", "popularity"])
        validate_month(wh, "2026-03", ["abpo", "grpo", "ml_retrain", "popularity"], out_dir=state / "validation")
    assert "GX Data Docs" in get("/abpo/validation/").text
    index = get("/abpo/validation/docs/index.html")
    assert index.status_code == 200 and "impressions_2026-03" in index.text
    page = next((state / "validation" / "data_docs" / "validations").rglob("*.html"))
    rel = page.relative_to(state / "validation" / "data_docs").as_posix()
    assert get(f"/abpo/validation/docs/{rel}").status_code == 200
    (state / "secret.html").write_text("no")
    for bad in (
        "../../secret.html",
        "%2e%2e/%2e%2e/secret.html",
        "..%2F..%2Fsecret.html",
        "index.html%00",
        "missing.html",
        "index.py",
        "static/../../../secret.html",
    ):
        assert get(f"/abpo/validation/docs/{bad}").status_code == 404, bad


# ---- faults (issue 18): links out of the state directory, malformed summaries, absurd paths ----


def test_a_symlinked_validation_summary_is_never_served(get, state, tmp_path_factory):
    secret = tmp_path_factory.mktemp("elsewhere") / "secret.json"
    secret.write_text(json.dumps({"password": "hunter2"}))
    out = state / "validation"
    out.mkdir()
    (out / "impressions_2026-03.json").symlink_to(secret)
    for url in ("/abpo/validation/2026-03.json", "/abpo/validation/2026-03"):
        r = get(url)
        assert r.status_code == 404 and "hunter2" not in r.text, (url, r.status_code, r.text)
    assert "2026-03" not in get("/abpo/validation/").text  # not listed either
    (out / "impressions_2026-04.json").write_text(json.dumps(_summary("2026-04")))
    assert get("/abpo/validation/2026-04.json").json() == _summary("2026-04")


@pytest.mark.parametrize(
    "content, says",
    [
        ("[]", "top level is list"),
        ('{"success": "yes"}', "success is 'yes'"),
        (json.dumps({**_summary("2026-03"), "evaluated": "many"}), "evaluated is 'many'"),
        (json.dumps({**_summary("2026-03"), "results": [1, 2]}), "results is not a list of objects"),
    ],
)
def test_a_malformed_summary_is_a_clear_422(get, state, content, says):
    out = state / "validation"
    out.mkdir()
    (out / "impressions_2026-03.json").write_text(content)
    r = get("/abpo/validation/2026-03")
    assert r.status_code == 422 and "malformed validation result impressions_2026-03.json" in r.text and says in r.text


def test_a_3000_segment_docs_path_is_a_404(get, state):
    (state / "validation" / "data_docs").mkdir(parents=True)
    for path in ("a/" * 3000 + "index.html", "x" * 5000 + ".html", "a/" * 200 + "index.html"):
        r = get(f"/abpo/validation/docs/{path}")
        assert r.status_code == 404, (len(path), r.status_code)


# ---- issue 32 item 13: no summary, however malformed, is a 500 ----

DEEP = "[" * 100_000 + "]" * 100_000


def _with_result(**changes) -> str:
    """A failed summary whose failed expectation (listed in both failed and results) has ``changes``."""
    s = _summary("2026-03", success=False)
    s["results"][1].update(changes)
    return json.dumps(s)


@pytest.mark.parametrize(
    "content, says",
    [
        (DEEP, "nested deeper than the JSON reader goes"),  # RecursionError inside json.loads before
        (
            '{"success": true, "rows": 1, "evaluated": 1, "results": [{"observed_value": ' + DEEP + "}]}",
            "nested deeper than the JSON reader goes",
        ),
        (_with_result(partial_unexpected=7), "failed[0].partial_unexpected is 7"),  # TypeError in the page before
        (_with_result(partial_unexpected=[[1, [2]]]), "failed[0].partial_unexpected is list"),
        (_with_result(observed_value=json.loads("[" * 500 + "]" * 500)), "failed[0].observed_value is list"),
        (_with_result(observed_value={"a": 1}), "failed[0].observed_value is dict"),
        (_with_result(unexpected_count="3"), "failed[0].unexpected_count is '3'"),
        (_with_result(unexpected_count=-1), "failed[0].unexpected_count is -1"),
        (_with_result(success="no"), "failed[0].success is 'no'"),
        (_with_result(expectation=["x"]), "failed[0].expectation is list"),
        (_with_result(column=3), "failed[0].column is 3"),
        (_with_result(column="\ud800"), "failed[0].column is '\\ud800'"),  # UnicodeEncodeError in the response before
        (json.dumps({**_summary("2026-03"), "seconds": 10**400}), "seconds is 1000"),  # OverflowError in float()
        (json.dumps({**_summary("2026-03"), "seconds": "0.4"}), "seconds is '0.4'"),
        (json.dumps({**_summary("2026-03"), "rows": True}), "rows is True"),
        (json.dumps({**_summary("2026-03"), "failed": {"a": 1}}), "failed is not a list of objects"),
    ],
)
def test_a_malformed_summary_is_a_422_never_a_500(get, state, content, says):
    out = state / "validation"
    out.mkdir()
    (out / "impressions_2026-03.json").write_text(content)
    r = get("/abpo/validation/2026-03")
    assert r.status_code == 422, (r.status_code, r.text[:300])
    detail = r.json()["detail"]
    assert detail.startswith("malformed validation result impressions_2026-03.json: ") and says in detail, detail
    assert get("/abpo/validation/2026-03.json").status_code == 200  # the file as saved is still served as it is


WRONG = [7, -1, 2.5, float("nan"), 10**30, "x", "", "\ud800", True, None, [], [1, [2]], {"a": 1}, [{"b": [3]}]]


def test_any_field_of_any_shape_gives_200_or_422(get, state):
    """Every field of a summary and of an expectation result replaced by each value of WRONG: the page is either
    shown (the value is one the page can show) or refused with a 422 naming the file; never a 500."""
    out = state / "validation"
    out.mkdir()
    seen = set()
    for where in ("top", "result"):
        keys = _summary("2026-03") if where == "top" else _summary("2026-03", success=False)["results"][1]
        for key in [*keys, "extra"]:
            for value in WRONG:
                s = _summary("2026-03", success=False)
                (s if where == "top" else s["results"][1])[key] = value
                (out / "impressions_2026-03.json").write_text(json.dumps(s))
                r = get("/abpo/validation/2026-03")
                assert r.status_code in (200, 422), (where, key, value, r.status_code, r.text[:300])
                assert r.status_code == 200 or "malformed validation result impressions_2026-03.json" in r.text
                seen.add(r.status_code)
    assert seen == {200, 422}
