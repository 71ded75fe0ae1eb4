"""The UI plugin's pages without Airflow (abpo.monthly.pages): what each page reads from a real state directory and a
real SQLite MLflow store, what it refuses, and its HTML, escaped from end to end. The plugin's routes, with Airflow's
authentication in front, are tested in tests/plugins/test_abpo_plugin.py."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from html import unescape
from pathlib import Path

import pytest

from abpo.monthly import pages

SCRIPT = "<script>alert('x')</script>"


@pytest.fixture
def cfg(state, monkeypatch):
    from abpo.config import load_config

    monkeypatch.delenv("ABPO_NAMESPACE", raising=False)
    monkeypatch.setenv("ABPO_MLFLOW_UI", "http://mlflow.example:5000/")
    return load_config("tiny")


@pytest.fixture
def client(cfg):
    """An MlflowClient on the config's SQLite store (the store made as a task makes it)."""
    from mlflow import MlflowClient

    from abpo import registry

    uri = cfg.paths.tracking_uri()
    registry.ensure_store(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_importing_the_pages_loads_no_heavy_module():
    """Every Airflow process that loads plugins imports the plugin, and so this module: only the standard library
    and abpo's leaf modules, never the config, Jinja, MLflow or numpy."""
    probe = (
        "import sys; before = set(sys.modules); import abpo.monthly.pages; print(' '.join(set(sys.modules) - before))"
    )
    loaded = set(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    )
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
    assert not {m.split(".")[0] for m in loaded} & {"jinja2", "mlflow", "numpy", "pandas", "duckdb", "torch"}


# ------------------------------------------------------------------------------------------------------ reports
def _report(root: Path, name: str, age: float = 0.0) -> Path:
    d = root / "reports" / name
    d.mkdir(parents=True)
    (d / "report.html").write_text("<html></html>")
    (d / "report.json").write_text("{}")
    t = time.time() - age
    os.utime(d / "report.html", (t, t))
    return d


def test_reports_lists_the_whitelisted_reports_newest_first(cfg, state):
    empty = pages.reports(cfg)
    assert empty.names == [] and "No report yet under " + str(state / "reports") in pages.html(empty)
    _report(state, "2026-03", age=120)
    _report(state, "2026-02..2026-04", age=60)
    _report(state, "csv-counts_v2", age=180)
    _report(state, ".2026-05.tmp-123-abc")  # write_report's temporary directory
    _report(state, "notes")
    (state / "reports" / "2026-06").mkdir()  # no report.html: not a report
    page = pages.reports(cfg)
    assert page.names == ["2026-02..2026-04", "2026-03", "csv-counts_v2"]
    assert '<li><a href="2026-02..2026-04/report.html">2026-02..2026-04</a></li>' in pages.html(page)


@pytest.mark.parametrize(
    "name, filename",
    [
        ("2026-03", "secret.txt"),
        ("2026-03", "report.md"),  # a report file, not written
        ("..", "secret.txt"),
        ("2026-03/../..", "report.html"),
        ("2026-03\x00", "report.html"),
        (".2026-05.tmp-123-abc", "report.html"),
        ("notes", "report.html"),
        ("2026-13", "report.html"),
        ("outside", "report.html"),
        ("2026-06", "report.html"),  # a link out of the reports directory
        ("csv-..", "report.html"),
    ],
)
def test_report_file_refuses_anything_but_a_report_file_inside(cfg, state, name, filename):
    _report(state, "2026-03")
    _report(state, ".2026-05.tmp-123-abc")
    _report(state, "notes")
    (state / "secret.txt").write_text("no")
    outside = state / "elsewhere"
    outside.mkdir()
    (outside / "report.html").write_text("outside")
    (state / "reports" / "2026-06").symlink_to(outside)
    (state / "reports" / "outside").symlink_to(outside)
    with pytest.raises(pages.Refused) as e:
        pages.report_file(cfg, name, filename)
    assert (e.value.status, e.value.detail) == (404, "no such report file")
    assert pages.report_file(cfg, "2026-03", "report.json") == (state / "reports" / "2026-03" / "report.json").resolve()


# ------------------------------------------------------------------------------------------ Great Expectations
def _summary(month: str, success: bool = True) -> dict:
    bad = {
        "expectation": "expect_column_values_to_be_in_set",
        "column": "arm",
        "success": False,
        "unexpected_count": 3,
        "partial_unexpected": [SCRIPT, 7],
        "observed_value": None,
    }
    ok = {
        "expectation": "expect_table_row_count_to_be_between",
        "column": None,
        "success": True,
        "unexpected_count": 0,
        "partial_unexpected": [],
        "observed_value": "1200",
    }
    results = [ok] if success else [ok, bad]
    return {
        "month": month,
        "success": success,
        "rows": 1200,
        "evaluated": len(results),
        "failed": [] if success else [bad],
        "results": results,
        "seconds": 0.44,
    }


def test_validation_pages_read_the_saved_summaries(cfg, state):
    assert pages.validations(cfg) == pages.Validations([], False)
    assert "No validation yet." in pages.html(pages.validations(cfg))
    out = state / "validation"  # abpo.monthly.ingest: <paths.root>/validation/impressions_<month>.json
    out.mkdir(parents=True)
    (out / "impressions_2026-03.json").write_text(json.dumps(_summary("2026-03")))
    (out / "impressions_2026-04.json").write_text(json.dumps(_summary("2026-04", success=False)))
    (out / "impressions_2026-05.json").symlink_to(out / "impressions_2026-03.json")  # never listed nor served
    (out / "notes.json").write_text("{}")
    (out / "data_docs").mkdir()
    listing = pages.validations(cfg)
    assert listing == pages.Validations(["2026-04", "2026-03"], True)
    assert '<li><a href="2026-04">2026-04</a> (<a href="2026-04.json">JSON</a>)</li>' in pages.html(listing)
    assert '<a href="docs/index.html">GX Data Docs</a>' in pages.html(listing)
    assert json.loads(pages.validation_json(cfg, "2026-03")) == _summary("2026-03")
    april = pages.validation(cfg, "2026-04")
    assert april.line == "1/2 expectations, 1200 rows, 0.4 s" and not april.passed
    assert april.results[1] == ("expect_column_values_to_be_in_set", "arm", "NO", "3", f"{SCRIPT}, 7", "")
    page = pages.html(april)
    assert "<p><b>FAILED</b>: 1/2 expectations, 1200 rows, 0.4 s." in page and "<script" not in page
    assert "<td>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;, 7</td>" in page
    assert "<title>Great Expectations suite impressions_2026-04</title>" in page
    assert "<b>PASSED</b>: 1/1 expectations" in pages.html(pages.validation(cfg, "2026-03"))
    for month in ("2026-05", "2026-06"):  # a link, and no file
        for read in (pages.validation, pages.validation_json):
            with pytest.raises(pages.Refused) as e:
                read(cfg, month)
            assert e.value.status == 404 and f"impressions_{month}.json" in e.value.detail


@pytest.mark.parametrize(
    "content, status, says",
    [
        ("{half a fi", 404, "unreadable validation result impressions_2026-03.json: "),
        ("[" * 100_000 + "]" * 100_000, 422, "nested deeper than the JSON reader goes"),
        ("[]", 422, "malformed validation result impressions_2026-03.json: top level is list; rule: a JSON object"),
        (json.dumps({**_summary("2026-03"), "seconds": 10**400}), 422, "seconds is 1000"),
        (json.dumps({**_summary("2026-03"), "results": [{"column": 3}]}), 422, "results[0].column is 3; rule: a "),
    ],
)
def test_a_summary_that_is_not_one_is_refused_naming_the_file_and_rule(cfg, state, content, status, says):
    (state / "validation").mkdir(parents=True)
    (state / "validation" / "impressions_2026-03.json").write_text(content)
    with pytest.raises(pages.Refused) as e:
        pages.validation(cfg, "2026-03")
    assert e.value.status == status and says in e.value.detail, e.value.detail
    assert pages.validation_json(cfg, "2026-03") == content.encode()  # as saved, still served


def test_a_summary_larger_than_the_limit_is_a_422(tmp_path):
    (tmp_path / "impressions_2026-03.json").write_text("x" * 101)
    assert pages.read_inside(tmp_path, "impressions_2026-03.json", limit=101) == b"x" * 101
    with pytest.raises(pages.Refused) as e:
        pages.read_inside(tmp_path, "impressions_2026-03.json", limit=100)
    assert (e.value.status, e.value.detail) == (
        422,
        "impressions_2026-03.json: larger than 100 bytes; rule: a validation summary is small",
    )


def test_data_docs_files_only_inside_the_site(cfg, state):
    site = state / "validation" / "data_docs"
    (site / "static").mkdir(parents=True)
    (site / "index.html").write_text("<html>docs</html>")
    (state / "secret.html").write_text("no")
    (site / "static" / "out.html").symlink_to(state / "secret.html")
    assert pages.data_docs_file(cfg, "index.html") == (site / "index.html").resolve()
    for bad in (
        "../../secret.html",
        "static/../../../secret.html",
        "static/out.html",  # a link out of the site
        "index.html\x00",
        "missing.html",
        "index.py",
        "a/" * 3000 + "index.html",
        "x" * 5000 + ".html",
    ):
        with pytest.raises(pages.Refused) as e:
            pages.data_docs_file(cfg, bad)
        assert (e.value.status, e.value.detail) == (404, "no such Data Docs file"), bad[:40]


# ------------------------------------------------------------------------------------------------ arm champions
def test_champions_read_each_arm_from_the_registry(cfg, client, state, monkeypatch):
    """Each arm of the config: its champion (or none), the approver, a pin set by hand, the promotion history
    (newest first) and the latest gate, read from a real store; a <script> approver name and a 20,000-character pin
    reason set by hand in MLflow reach the page escaped, the reason whole."""
    from abpo.arms import promotion

    monkeypatch.setenv("ABPO_ACTOR", "alice")
    comment = ('<img src=x onerror="alert(1)"> & ' * 700)[:20_000]
    client.create_registered_model("abpo-arm-abpo")
    for tags in ({}, {"approved_by": SCRIPT, "approved_at": "2026-03-02"}, {"gate.verdict": "fail"}):
        client.create_model_version("abpo-arm-abpo", source=state.as_uri(), tags={"months": "2026-03", **tags})
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
    promotion.promote(cfg, "abpo", "2", reason="<b>looks better</b>")
    client.set_registered_model_tag("abpo-arm-abpo", "abpo.pinned", f"2|<b>bob</b>|2026-03-03|{comment}")
    client.create_registered_model("abpo-arm-grpo")  # a model without a champion; ml_retrain: no model at all
    page = pages.champions(cfg, timeout=30)
    assert page.status == 200 and page.error == "" and page.store == cfg.paths.tracking_uri()
    by_arm = {r["arm"]: r for r in page.rows}
    assert list(by_arm) == list(cfg.arms.names)
    abpo = by_arm["abpo"]
    assert (abpo["version"], abpo["months"], abpo["approved"]) == ("2", "2026-03", f"{SCRIPT} at 2026-03-02")
    assert [e["action"] for e in abpo["history"]] == ["promote", "baseline"]
    assert abpo["gate"] == {"version": "3", "gate.verdict": "fail"}
    assert page.pin(abpo) == {"version": "2", "actor": "<b>bob</b>", "at": "2026-03-03", "reason": comment}
    assert [by_arm[a]["version"] for a in ("grpo", "ml_retrain")] == [None, None]
    html = pages.html(page)
    assert "<script" not in html and "<img" not in html and "<b>bob" not in html and "<b>looks" not in html
    assert "approved by &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; at 2026-03-02" in html
    shown = html.split("at 2026-03-03: ", 1)[1].split(")</td>", 1)[0]
    assert shown.count("&lt;img src=x onerror=&#34;alert(1)&#34;&gt; &amp; ") == comment.count("<img")
    assert 'href="http://mlflow.example:5000/#/models/abpo-arm-abpo/versions/2"' in html
    assert html.count("no champion yet") == 3 and "<td>v3 vs vn/a</td><td>FAIL</td>" in html
    assert "<td>abpo</td><td>2</td>" in html and "&lt;b&gt;looks better&lt;/b&gt;" in html  # the history's promote


def test_champions_without_a_store_say_so_and_create_none(cfg, state):
    page = pages.champions(cfg, timeout=30)
    db = state / "mlflow.db"
    assert page.status == 503 and page.error == f"no MLflow store at {db} yet (nothing registered)"
    assert f"<p>The MLflow registry sqlite:///{db} could not be read: no MLflow store at {db}" in pages.html(page)
    assert not db.exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_champions_when_the_registry_refuses_redact_its_password(cfg, monkeypatch):
    from abpo.config import load_config

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("ABPO_TRACKING_URI", f"http://abpo:hunter2@127.0.0.1:{_closed_port()}")
    page = pages.champions(load_config("tiny"), timeout=30)
    html = pages.html(page)
    assert page.status == 503 and page.store.startswith("http://abpo:***@127.0.0.1:") and page.error
    assert "hunter2" not in html and "could not be read" in html
    assert '<a href="http://mlflow.example:5000" target="_blank" rel="noopener">MLflow UI</a>' in html


def test_a_lookup_past_its_deadline_and_lookups_past_the_limit_are_refused():
    release = threading.Event()
    with pytest.raises(pages.RegistryUnreachable, match=r"^no answer within 0\.2 s$"):
        pages.with_deadline(release.wait, 0.2)
    for _ in range(3):  # four stuck lookups in all: the semaphore's limit
        with pytest.raises(pages.RegistryUnreachable):
            pages.with_deadline(release.wait, 0.01)
    with pytest.raises(pages.RegistryUnreachable, match="earlier lookups are still waiting for the registry"):
        pages.with_deadline(lambda: 1, 5)
    release.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the stuck threads end and give their places back
        try:
            assert pages.with_deadline(lambda: 1, 5) == 1
            break
        except pages.RegistryUnreachable:
            time.sleep(0.05)
    else:
        pytest.fail("the lookups' places were not given back")
    with pytest.raises(pages.RegistryUnreachable, match="^ZeroDivisionError: division by zero$"):
        pages.with_deadline(lambda: 1 / 0, 5)


# ------------------------------------------------------------------------------------------------- the HTML
def test_every_value_a_page_shows_is_escaped():
    """Every field of every page holding markup: none reaches the HTML as an element."""
    row = {
        "arm": SCRIPT,
        "model": SCRIPT,
        "version": SCRIPT,
        "months": SCRIPT,
        "approved": SCRIPT,
        "pinned": "|".join([SCRIPT] * 4),
        "history": [{c: SCRIPT for c in pages.HISTORY_COLUMNS}],
        "gate": {"version": SCRIPT, **{f"gate.{k}": SCRIPT for k in ("verdict", "offline.method", "ope.estimator")}},
    }
    summary = _summary("2026-03", success=False)
    for r in summary["results"]:
        r.update(expectation=SCRIPT, column=SCRIPT, partial_unexpected=[SCRIPT], observed_value=SCRIPT)
    shown = {
        "champions": pages.html(pages.Champions([row], SCRIPT)),
        "unreachable": pages.html(pages.Champions([], SCRIPT, error=SCRIPT)),
        "validation": pages.html(pages.Validation("2026-03", pages.check_summary("f", summary))),
        "reports": pages.html(pages.Reports(Path(SCRIPT), [])),
        "notice": pages.html(pages.Notice(SCRIPT, SCRIPT)),
    }
    for name, html in shown.items():
        assert "<script" not in html.lower() and "&lt;script&gt;" in html.lower(), name
    # the row's 5 cells, the pin's 4 fields, the gate's arm, challenger, verdict and estimator, the history's 10 cells
    assert shown["champions"].lower().count("&lt;script&gt;") == 5 + 4 + 4 + 10
    assert "/#/models/%3Cscript%3Ealert%28%27x%27%29%3C%2Fscript%3E/versions/" in shown["champions"]


def test_the_index_links_every_page():
    html = pages.html(pages.Index())
    assert "<title>abpo</title>" in html and "<h1>abpo</h1>" in html
    for href in ("reports/", "reports/latest", "validation/", "champions"):
        assert f'<li><a href="{href}">' in html


def test_gate_cells_name_the_test_and_what_the_gate_did_not_write():
    assert pages.gate_cells({"version": "3"}) == (
        "v3 vs vn/a",
        "N/A",
        "n/a",
        "n/a",
        "n/a (n/a/n/a)",
        "n/a vs -n/a",
        "n/a, n/a",
        "not run",
        "n/a [n/a, n/a] vs -n/a",
        "n/a",
        "n/a",
    )
    cells = pages.gate_cells({"version": "4", "gate.offline.method": "Wald z", "gate.ope.estimator": "snips"})
    assert cells[3] == "Wald" and cells[7] == "snips (n/a, n/a)" and cells[2] == "both"
    assert pages.gate_cells({"version": "4", "gate.offline.method": "Tango score (paired)"})[3] == "Tango score"
    # the redesign: the off-policy half decided, the offline half a guardrail read by its upper bound
    guarded = {
        "version": "5",
        "gate.decided_by": "off-policy",
        "gate.offline.upper": "0.0123",
        "gate.guardrail.margin": "0.1",
        "gate.offline.lower": "-0.03",
    }
    cells = pages.gate_cells(guarded)
    assert cells[2] == "off-policy" and cells[5] == "upper 0.0123 vs -0.1 (guardrail)"


def test_redact_and_model_page(monkeypatch):
    monkeypatch.setenv("ABPO_MLFLOW_UI", "http://mlflow:5000/")
    assert pages.redact("postgresql://mlflow:s3cret@db:5432/mlflow") == "postgresql://mlflow:***@db:5432/mlflow"
    assert pages.redact("http://mlflow:5000") == "http://mlflow:5000"
    assert pages.redact("sqlite:////var/abpo/mlflow.db") == "sqlite:////var/abpo/mlflow.db"
    assert pages.model_page("abpo-arm-abpo", "3") == "http://mlflow:5000/#/models/abpo-arm-abpo/versions/3"
    assert pages.model_page("a/b") == "http://mlflow:5000/#/models/a%2Fb"


PWN_PROBE = """<script>
window.addEventListener('load', function () {
  var out = document.createElement('pre');
  out.id = 'probe';
  var cells = document.querySelectorAll('table')[0].querySelectorAll('tbody td');
  out.textContent = JSON.stringify({
    pwned: window.pwned || 0,
    scripts: document.scripts.length,
    images: document.images.length,
    bold: document.querySelectorAll('b').length,
    champion: cells[2].textContent
  });
  document.body.appendChild(out);
});
</script>
"""


def test_the_champions_page_runs_nothing_a_tag_holds_in_headless_chromium(tmp_path):
    """The page in a real browser: a <script> approver name and a 20,000-character pin reason full of <img onerror>
    run nothing, add no element, and read back as the text they are (the reason whole)."""
    from tests.abtest.test_render import _chromium, _chromium_cmd

    exe = _chromium()
    script = "<script>window.pwned = 1</script>"
    comment = ('<img src=x onerror="window.pwned = 2"> & ' * 600)[:20_000]
    row = {
        "arm": "abpo",
        "model": "abpo-arm-abpo",
        "version": "2",
        "months": "2026-03",
        "approved": f"{script} at 2026-03-02",
        "pinned": f"2|{script}|2026-03-03|{comment}",
        "history": [],
        "gate": None,
    }
    page = tmp_path / "champions.html"
    page.write_text(pages.html(pages.Champions([row], "sqlite:///x")).replace("</body>", PWN_PROBE + "</body>"))
    dom = subprocess.run(
        _chromium_cmd(exe, tmp_path) + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert m, f"probe did not run; DOM tail: {dom.stdout[-1000:]!r} stderr: {dom.stderr[-1000:]!r}"
    probe = json.loads(unescape(m.group(1)))
    assert (probe["pwned"], probe["scripts"], probe["images"], probe["bold"]) == (0, 1, 0, 1)  # the probe, "pinned"
    assert probe["champion"] == (
        f"version 2 approved by {script} at 2026-03-02 pinned (v2 by {script} at 2026-03-03: {comment})"
    )
