"""Airflow UI plugin: the A/B reports, the Great Expectations results and each arm's champion in MLflow, one click
away in the Airflow UI, for Airflow users only.

A FastAPI app mounted at /abpo on the Airflow API server:

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

Names are whitelisted (a report directory: YYYY-MM, YYYY-MM..YYYY-MM or csv-<name>; a file: :data:`REPORT_FILES`;
a month: YYYY-MM); anything else (NUL bytes, ``..``, encoded slashes) is a 404. Reports are written atomically
(abpo.abtest.render.write_report), so a half-written one is never served.

Nav links (Airflow 3 ``external_views``, category abpo): the report list, the latest report, the latest GX results,
the arms' champions, and the MLflow UI.

The app is built on its first request (:class:`LazyApp`): every process that loads plugins imports this module (the
scheduler, the dag processor, each task's process), and only the API server needs Airflow's API security module.
The directories come from the config ($ABPO_CONFIG preset, $ABPO_STATE state directory, $ABPO_TRACKING_URI).
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import threading
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote, urlsplit, urlunsplit

from airflow.plugins_manager import AirflowPlugin

from abpo.arms.names import model_name  # one registered model per arm (abpo.arms.names: dependency-free)
from abpo.months import MONTH_PATTERN as _MONTH  # the one month grammar (abpo.months: a leaf module, cheap to import)

DAG_ID = "abpo_monthly"
REPORT_FILES = ("report.html", "report.md", "ctr_by_arm.png", "report.json")
# abpo.abtest.report: months_label (YYYY-MM or first..last) for the warehouse, csv-<stem> for a CSV
REPORT_NAME = re.compile(rf"{_MONTH}(?:\.\.{_MONTH})?|csv-[A-Za-z0-9_][A-Za-z0-9_.-]{{0,99}}")
MONTH = re.compile(_MONTH)
# a Data Docs file: path segments of letters, digits, '_', '-', '.', '=' (no segment of dots only), a known extension
DOCS_FILE = re.compile(
    r"(?:(?!\.+/)[A-Za-z0-9_.=-]+/)*(?!\.+$)[A-Za-z0-9_.=-]+\.(?:html|css|js|png|gif|ico|otf|ttf|woff2?|svg|json)"
)
VALIDATION_FILE = re.compile(rf"impressions_({_MONTH})\.json")  # abpo.monthly.ingest (the GX summary per month)
CHAMPION = "champion"  # abpo.registry.CHAMPION
LOOKUP_TIMEOUT_S = 5.0  # an MLflow server that is down retries for minutes: the page answers after this


def mlflow_ui() -> str:
    return os.environ.get("ABPO_MLFLOW_UI", "http://localhost:5000").rstrip("/")


def _cfg():
    from abpo.config import load_config

    return load_config(os.environ.get("ABPO_CONFIG", "tiny"))


def reports_dir() -> Path:
    return _cfg().paths.resolve("reports")


def validation_dir() -> Path:
    return _cfg().paths.resolve("root") / "validation"


def list_reports(root: Path) -> list[Path]:
    """The report directories under ``root`` with a report.html and a whitelisted name, newest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if REPORT_NAME.fullmatch(p.name) and (p / "report.html").is_file()]
    return sorted(found, key=lambda p: (p / "report.html").stat().st_mtime, reverse=True)


def list_validations(root: Path) -> list[str]:
    """The months with a saved GX summary (a regular file, not a symbolic link), newest month first."""
    if not root.is_dir():
        return []
    months = (
        m.group(1)
        for p in root.iterdir()
        if (m := VALIDATION_FILE.fullmatch(p.name)) and p.is_file() and not p.is_symlink()
    )
    return sorted(months, reverse=True)


MAX_DOCS_PATH = 512  # characters of a Data Docs path (GX's longest are ~150); longer is a 404, not an OSError
MAX_SUMMARY_BYTES = 16 * 1024 * 1024


class Refused(Exception):
    """A file the plugin will not serve: ``status`` (404: absent, outside its directory, a link; 422: there but not a
    validation summary) and a message naming the file and the rule."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def read_inside(root: Path, name: str, limit: int = MAX_SUMMARY_BYTES) -> bytes:
    """The bytes of the regular file ``root/name``: refused (404) when it is missing, a symbolic link, or resolves
    outside ``root``. Opened with O_NOFOLLOW after the checks, so a link swapped in between is refused too."""
    path = root / name
    try:
        real_root = root.resolve()
        if path.is_symlink() or not path.is_file() or path.resolve().parent != real_root:
            raise Refused(404, f"no {name} under {root.name}/ (rule: a regular file inside the directory, no links)")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise Refused(404, f"no readable {name} ({e.strerror or type(e).__name__})") from None
    if len(data) > limit:
        raise Refused(422, f"{name}: larger than {limit} bytes; rule: a validation summary is small")
    return data


SCALARS = (str, int, float, bool, type(None))


def check_summary(name: str, s) -> dict:
    """``s`` when it has the shape abpo.validation.ValidationSummary.as_dict() writes; Refused(422) naming the file,
    the field and the rule otherwise (a hand-edited or foreign file must not reach the page as a 500). Every value the
    page shows is checked here, so :func:`validation_page` meets only the types it formats: a number where a list
    was expected, a list where text was expected, a float that overflows or text that cannot be sent as UTF-8 are
    each a 422."""

    def bad(field: str, rule: str):
        return Refused(422, f"malformed validation result {name}: {field}; rule: {rule}")

    def shown(v) -> str:
        text = repr(v) if isinstance(v, SCALARS) else type(v).__name__
        return text if len(text) <= 80 else text[:77] + "..."

    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    def text(v) -> bool:  # sendable as UTF-8 (json.loads lets a lone surrogate "\ud800" through)
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    def scalar(v) -> bool:
        return isinstance(v, SCALARS) and (not isinstance(v, str) or text(v))

    if not isinstance(s, dict):
        raise bad(f"top level is {type(s).__name__}", "a JSON object")
    if not isinstance(s.get("success"), bool):
        raise bad(f"success is {shown(s.get('success'))}", "true or false")
    for key in ("rows", "evaluated"):
        if not count(s.get(key)):
            raise bad(f"{key} is {shown(s.get(key))}", "a non-negative integer")
    seconds = s.get("seconds", 0.0)
    try:
        finite = (
            isinstance(seconds, (int, float))
            and not isinstance(seconds, bool)
            and math.isfinite(float(seconds))
            and seconds >= 0
        )
    except OverflowError:
        finite = False
    if not finite:
        raise bad(f"seconds is {shown(seconds)}", "a finite non-negative number")
    for key in ("failed", "results"):
        v = s.get(key, [])
        if not isinstance(v, list) or not all(isinstance(r, dict) for r in v):
            raise bad(f"{key} is not a list of objects", "a list of expectation results")
        for i, r in enumerate(v):
            where = f"{key}[{i}]"
            if not isinstance(r.get("expectation", ""), str) or not text(r.get("expectation", "")):
                raise bad(f"{where}.expectation is {shown(r.get('expectation'))}", "a string")
            if not (r.get("column") is None or isinstance(r.get("column"), str) and text(r["column"])):
                raise bad(f"{where}.column is {shown(r.get('column'))}", "a string or null")
            if not isinstance(r.get("success", False), bool):
                raise bad(f"{where}.success is {shown(r.get('success'))}", "true or false")
            if not count(r.get("unexpected_count", 0)):
                raise bad(f"{where}.unexpected_count is {shown(r.get('unexpected_count'))}", "a non-negative integer")
            examples = r.get("partial_unexpected", [])
            if not (examples is None or isinstance(examples, list) and all(scalar(x) for x in examples)):
                raise bad(f"{where}.partial_unexpected is {shown(examples)}", "a list of values (strings or numbers)")
            if not scalar(r.get("observed_value")):
                raise bad(f"{where}.observed_value is {shown(r.get('observed_value'))}", "a string, a number or null")
    return s


def redact(uri: str) -> str:
    """``uri`` without the password of its user info (a database URI shown on a page)."""
    try:
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
        host = parts.hostname or ""
        netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unparsable URI>"


def model_page(name: str, version: str | None = None) -> str:
    """The MLflow 3 UI page of a registered model (or of one of its versions)."""
    url = f"{mlflow_ui()}/#/models/{quote(name, safe='')}"
    return url + (f"/versions/{quote(str(version), safe='')}" if version is not None else "")


class RegistryUnreachable(RuntimeError):
    """The MLflow registry did not answer (down, too slow, misconfigured)."""


def namespace() -> str:
    """The deployment's environment prefix of MLflow names (paths.namespace), from $ABPO_NAMESPACE like the DAG's."""
    return os.environ.get("ABPO_NAMESPACE", "")


def lookup_champions(tracking_uri: str, arms: list[str]) -> list[dict]:
    """Each arm's champion: {arm, model, version (None: no champion yet), months, approved ("<who> at <when>" when
    a human approved its promotion, arms.approval = required; else "")}. Raises RegistryUnreachable."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from abpo.registry import ensure_store, is_not_found

    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():  # MLflow would create (and migrate) an empty store: say there is none
            raise RegistryUnreachable(f"no MLflow store at {db} yet (nothing registered)")
        ensure_store(tracking_uri)  # a store a task is creating right now: wait for its schema, never migrate it twice
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    rows = []
    for arm in arms:
        name = model_name(arm, namespace())
        try:
            v = client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException as e:
            if not is_not_found(e):
                raise RegistryUnreachable(f"{getattr(e, 'error_code', '')}: {str(e)[:300]}") from e
            rows.append({"arm": arm, "model": name, "version": None, "months": ""})
            continue
        tags = v.tags or {}
        # arms.approval = required: who let the gate's challenger become champion (abpo.monthly.promote)
        approved = f"{tags['approved_by']} at {tags.get('approved_at', '')}" if tags.get("approved_by") else ""
        rows.append(
            {
                "arm": arm,
                "model": name,
                "version": str(v.version),
                "months": tags.get("months", ""),
                "approved": approved,
            }
        )
    for r in rows:  # the pin (a registered-model tag) and the promotion history (abpo.arms.history)
        r["pinned"], r["history"] = promotion_record(client, r["model"], r["arm"])
        r["gate"] = latest_gate(client, r["model"])
    return rows


def latest_gate(client, model: str) -> dict | None:
    """The gate's tags (gate.*, docs/gate.md "Reading the verdict") of the model's latest gated version, with its
    ``version``; None when no version was gated. Raises RegistryUnreachable."""
    from mlflow.exceptions import MlflowException

    from abpo.registry import is_not_found

    try:
        versions = client.search_model_versions(f"name = '{model}'")
    except MlflowException as e:
        if is_not_found(e):
            return None
        raise RegistryUnreachable(f"{getattr(e, 'error_code', '')}: {str(e)[:300]}") from e
    gated = [v for v in versions if (v.tags or {}).get("gate.verdict")]
    if not gated:
        return None
    v = max(gated, key=lambda v: int(v.version))
    return {"version": str(v.version), **{k: str(x) for k, x in (v.tags or {}).items() if k.startswith("gate.")}}


def gate_table(rows: list[dict]) -> str:
    """Each arm's latest gate, both halves (issue 42): the offline test (which one, its difference with won/lost
    users, its bound against -margin, statistic and p) and the off-policy estimator that decided (its interval
    against -margin, the rows it read, the ESS) with every estimator's numbers; "" when no arm was gated."""
    gated = [r for r in rows if r.get("gate")]
    if not gated:
        return ""
    cols = (
        "Arm",
        "Challenger",
        "Verdict",
        "Offline test",
        "Offline diff (won/lost)",
        "Bound vs -margin",
        "z, p",
        "Off-policy estimator (rows)",
        "Off-policy diff [interval] vs -margin",
        "ESS",
        "Every estimator",
    )
    out = [
        "<h2>Latest gate</h2><p>Each arm's latest gated challenger (docs/gate.md): both halves must pass; the "
        "off-policy half is decided by the estimator shown (<code>arms.gate_ope_estimator</code>), the others are "
        "recorded beside it.</p><table><thead><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr></thead><tbody>"
    ]
    for r in gated:
        g = r["gate"]

        def t(k: str, g=g) -> str:
            return g.get(f"gate.{k}", "n/a")

        method = t("offline.method")
        test = "Tango score" if method.startswith("Tango") else "Wald" if method != "n/a" else "n/a"
        cells = (
            f"v{g['version']} vs v{t('champion_version')}",
            t("verdict").upper(),
            test,
            f"{t('offline.diff')} ({t('offline.wins')}/{t('offline.losses')})",
            f"{t('offline.lower')} vs -{t('offline.margin')}",
            f"{t('offline.statistic')}, {t('offline.p_value')}",
            f"{t('ope.estimator')} ({t('ope.rows')}, {t('ope.n')})" if "gate.ope.estimator" in g else "not run",
            f"{t('ope.diff')} [{t('ope.ci_low')}, {t('ope.ci_high')}] vs -{t('ope.margin')}",
            t("ope.challenger_ess"),
            t("ope.estimates"),
        )
        out.append(
            f"<tr><td>{html.escape(r['arm'])}</td>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


HISTORY_SHOWN = 20  # the latest entries per arm on the page (`abpo arms history` prints them all)


def promotion_record(client, model: str, arm: str) -> tuple[str, list[dict]]:
    """The arm's pin ("" when none) and its latest promotion-history entries, newest first. Raises
    RegistryUnreachable."""
    from mlflow.exceptions import MlflowException

    from abpo.arms import history
    from abpo.arms.promotion import PIN_TAG
    from abpo.paths import namespaced
    from abpo.registry import is_not_found

    try:
        try:
            pin = (client.get_registered_model(model).tags or {}).get(PIN_TAG, "")
        except MlflowException as e:
            if not is_not_found(e):
                raise
            pin = ""
        entries = history.read(client, arm, namespaced(history.EXPERIMENT, namespace()))
    except MlflowException as e:
        raise RegistryUnreachable(f"{getattr(e, 'error_code', '')}: {str(e)[:300]}") from e
    return pin, [e.to_json() for e in reversed(entries[-HISTORY_SHOWN:])]


_LOOKUPS = threading.BoundedSemaphore(4)  # lookups in flight (a stuck one keeps its thread until MLflow gives up)


def with_deadline(fn, timeout: float):
    """``fn()`` in a daemon thread, or RegistryUnreachable when it has not returned within ``timeout`` seconds."""
    if not _LOOKUPS.acquire(blocking=False):
        raise RegistryUnreachable("earlier lookups are still waiting for the registry")
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        finally:
            _LOOKUPS.release()

    t = threading.Thread(target=run, name="abpo-mlflow-lookup", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise RegistryUnreachable(f"no answer within {timeout:g} s")
    if "error" in box:
        e = box["error"]
        if isinstance(e, RegistryUnreachable):
            raise e
        raise RegistryUnreachable(f"{type(e).__name__}: {str(e)[:300]}") from e
    return box["value"]


def page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


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

    def not_found(what: str) -> HTTPException:
        return HTTPException(status_code=404, detail=f"no {what}")

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        links = [
            ("reports/", "A/B reports"),
            ("reports/latest", "latest A/B report"),
            ("validation/", "Great Expectations results"),
            ("champions", "arm champions in MLflow"),
        ]
        rows = "".join(f'<li><a href="{h}">{t}</a></li>' for h, t in links)
        return page("abpo", f"<ul>{rows}</ul>")

    @app.get("/reports/", response_class=HTMLResponse)
    def reports() -> str:
        root = reports_dir()
        rows = "".join(
            f'<li><a href="{html.escape(p.name)}/report.html">{html.escape(p.name)}</a></li>'
            for p in list_reports(root)
        )
        body = f"<ul>{rows}</ul>" if rows else f"<p>No report yet under {html.escape(str(root))}.</p>"
        return page("A/B reports", body)

    @app.get("/reports/latest")
    def latest_report():
        found = list_reports(reports_dir())
        if not found:
            return HTMLResponse(page("A/B reports", "<p>No report yet.</p>"), status_code=404)
        return RedirectResponse(f"{quote(found[0].name)}/report.html", status_code=307)

    @app.get("/reports/{name}/{filename}")
    def report_file(name: str, filename: str) -> FileResponse:
        if not REPORT_NAME.fullmatch(name) or filename not in REPORT_FILES:
            raise not_found("such report file")
        try:
            root = reports_dir().resolve()
            path = root / name / filename
            if not path.is_file() or path.resolve().parent.parent != root:  # no symlink out of the reports directory
                raise not_found("such report file")
        except OSError:
            raise not_found("such report file") from None
        return FileResponse(path.resolve())

    @app.get("/validation/", response_class=HTMLResponse)
    def validations() -> str:
        months = list_validations(validation_dir())
        rows = "".join(f'<li><a href="{m}">{m}</a> (<a href="{m}.json">JSON</a>)</li>' for m in months)
        docs = '<p><a href="docs/index.html">GX Data Docs</a></p>' if (validation_dir() / "data_docs").is_dir() else ""
        return page("Great Expectations results", (f"<ul>{rows}</ul>" if rows else "<p>No validation yet.</p>") + docs)

    @app.get("/validation/docs/{path:path}")
    def data_docs(path: str) -> FileResponse:
        """The GX Data Docs site the ingest's Checkpoint builds (abpo.validation): static files under
        validation/data_docs, nothing outside it (every path resolved; a link out of the site is a 404)."""
        if len(path) > MAX_DOCS_PATH or "\x00" in path or not DOCS_FILE.fullmatch(path):
            raise not_found("such Data Docs file")
        try:
            root = (validation_dir() / "data_docs").resolve()
            target = (root / path).resolve()
            if not target.is_relative_to(root) or not target.is_file():
                raise not_found("such Data Docs file")
        except OSError:  # a name too long for the file system, a loop of links: not a file we serve
            raise not_found("such Data Docs file") from None
        return FileResponse(target)

    @app.get("/validation/latest")
    def latest_validation():
        months = list_validations(validation_dir())
        if not months:
            return HTMLResponse(page("Great Expectations results", "<p>No validation yet.</p>"), status_code=404)
        return RedirectResponse(months[0], status_code=307)

    @app.get("/validation/{name}")
    def validation(name: str):
        m = re.fullmatch(rf"({_MONTH})(\.json)?", name)
        if not m:
            raise not_found("such validation result")
        file = f"impressions_{m.group(1)}.json"
        try:
            data = read_inside(validation_dir(), file)  # no symlink, nothing outside validation/
            if m.group(2):
                return Response(data, media_type="application/json")
            try:
                summary = json.loads(data)
            except ValueError as e:
                raise Refused(404, f"unreadable validation result {file}: {e}") from None
            except RecursionError:  # json's decoder recurses per level: 100,000 nested [ exhaust the stack
                raise Refused(
                    422,
                    f"malformed validation result {file}: nested deeper than the JSON reader goes; "
                    "rule: a validation summary is a flat object of expectation results",
                ) from None
            return HTMLResponse(validation_page(m.group(1), check_summary(file, summary)))
        except Refused as e:
            raise HTTPException(status_code=e.status, detail=e.detail) from None

    @app.get("/champions", response_class=HTMLResponse)
    def champions():
        cfg = _cfg()
        uri = cfg.paths.tracking_uri()
        try:
            rows = with_deadline(lambda: lookup_champions(uri, list(cfg.arms.names)), LOOKUP_TIMEOUT_S)
        except RegistryUnreachable as e:
            body = (
                f"<p>The MLflow registry {html.escape(redact(uri))} could not be read: "
                f"{html.escape(str(e).replace(uri, redact(uri)))}</p>"
                f'<p><a href="{html.escape(mlflow_ui())}" target="_blank" rel="noopener">MLflow UI</a></p>'
            )
            return HTMLResponse(page("Arm champions", body), status_code=503)
        return page("Arm champions", champions_table(rows))

    return app


def champions_table(rows: list[dict]) -> str:
    out = [
        (
            "<table><thead><tr><th>Arm</th><th>Registered model</th><th>Champion</th><th>Months trained on</th>"
            "</tr></thead><tbody>"
        )
    ]
    for r in rows:
        model = (
            f'<a href="{html.escape(model_page(r["model"]))}" target="_blank" rel="noopener">'
            f"{html.escape(r['model'])}</a>"
        )
        if r["version"] is None:
            champ = "no champion yet"
        else:
            champ = (
                f'<a href="{html.escape(model_page(r["model"], r["version"]))}" target="_blank" '
                f'rel="noopener">version {html.escape(r["version"])}</a>'
            )
        if r.get("approved"):
            champ += f" approved by {html.escape(r['approved'])}"
        if r.get("pinned"):
            version, actor, at, reason = (str(r["pinned"]).split("|", 3) + ["", "", "", ""])[:4]
            champ += (
                f" <b>pinned</b> (v{html.escape(version)} by {html.escape(actor)} at {html.escape(at)}: "
                f"{html.escape(reason)})"
            )
        out.append(
            f"<tr><td>{html.escape(r['arm'])}</td><td>{model}</td><td>{champ}</td>"
            f"<td>{html.escape(str(r['months']))}</td></tr>"
        )
    out.append("</tbody></table>")
    out.append(gate_table(rows))
    out.append(
        "<h2>Promotion history</h2><p>Every champion move (the gate, a refit, <code>abpo arms promote</code>, "
        "a rollback, or by hand in MLflow), pins and refused promotions; newest first, the latest "
        f"{HISTORY_SHOWN} per arm (<code>abpo arms history</code> prints them all).</p>"
    )
    cols = ("seq", "at", "action", "actor", "from", "to", "reason", "verdict", "month")
    out.append("<table><thead><tr><th>Arm</th>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr></thead><tbody>")
    for r in rows:
        for e in r.get("history") or []:
            out.append(
                f"<tr><td>{html.escape(r['arm'])}</td>"
                + "".join(f"<td>{html.escape(str(e.get(c, '')))}</td>" for c in cols)
                + "</tr>"
            )
    out.append("</tbody></table>")
    return "".join(out)


def validation_page(month: str, s: dict) -> str:
    ok = bool(s.get("success"))
    head = (
        f"<p><b>{'PASSED' if ok else 'FAILED'}</b>: {int(s.get('evaluated', 0)) - len(s.get('failed') or [])}"
        f"/{int(s.get('evaluated', 0))} expectations, {int(s.get('rows', 0))} rows, "
        f"{float(s.get('seconds', 0.0)):.1f} s. <a href='{month}.json'>JSON</a></p>"
    )
    rows = []
    for r in s.get("results") or []:
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(v))}</td>"
                for v in (
                    r.get("expectation", ""),
                    r.get("column") or "",
                    "yes" if r.get("success") else "NO",
                    r.get("unexpected_count", 0),
                    ", ".join(map(str, r.get("partial_unexpected") or [])),
                    r.get("observed_value") or "",
                )
            )
            + "</tr>"
        )
    table = (
        "<table><thead><tr><th>Expectation</th><th>Column</th><th>Passed</th><th>Unexpected</th>"
        "<th>Examples</th><th>Observed</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
    return page(f"Great Expectations suite impressions_{month}", head + table)


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
        _nav("MLflow", mlflow_ui()),
    ]
