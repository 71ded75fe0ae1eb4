"""The pages of the Airflow UI plugin (plugins/abpo_plugin.py, mounted at /abpo): what each page reads, one function
per page, and its HTML from the Jinja templates beside the report's (abpo/abtest/templates/ui_*.html.j2), rendered
by the report's own environment (abpo.abtest.render.environment: every value is escaped, so whatever a file or an
MLflow tag holds reaches the page as text). The plugin only wires routes to these functions and answers with what
they return; everything here runs without Airflow.

    page (route under /abpo)           function                 what it reads
    /                                  :class:`Index`           nothing
    /reports/, /reports/latest         :func:`reports`          the report directories under paths.reports
    /reports/<name>/<file>             :func:`report_file`      one file of one report
    /validation/, /validation/latest   :func:`validations`      the GX summaries under <paths.root>/validation
    /validation/<YYYY-MM>              :func:`validation`       one summary, checked (:func:`check_summary`)
    /validation/<YYYY-MM>.json         :func:`validation_json`  one summary as saved
    /validation/docs/<path>            :func:`data_docs_file`   one file of the GX Data Docs site
    /champions                         :func:`champions`        each arm's champion, pin, history, latest gate

A page is a dataclass naming its template; :func:`html` renders it. A file the plugin will not serve is
:class:`Refused` (its HTTP status and a message naming the file and the rule).

Importing this module is cheap (the standard library and abpo's leaf modules: the plugin imports it in every Airflow
process that loads plugins); the config, the registry and Jinja are imported by the functions that use them."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote, urlsplit, urlunsplit

from abpo.arms.names import model_name  # one registered model per arm (abpo.arms.names: dependency-free)
from abpo.months import MONTH_PATTERN as _MONTH  # the one month grammar (abpo.months: a leaf module)

if TYPE_CHECKING:
    from abpo.config import Config

REPORT_FILES = ("report.html", "report.md", "ctr_by_arm.png", "report.json", "expected_ctr.png", "expected_ctr.json")
# expected_ctr.*: the simulator's climb chart and figures of a report of simulated months (abpo.abtest.sim_ctr)
# abpo.abtest.report: months_label (YYYY-MM or first..last) for the warehouse, csv-<stem> for a CSV
REPORT_NAME = re.compile(rf"{_MONTH}(?:\.\.{_MONTH})?|csv-[A-Za-z0-9_][A-Za-z0-9_.-]{{0,99}}")
MONTH = re.compile(_MONTH)
# a Data Docs file: path segments of letters, digits, '_', '-', '.', '=' (no segment of dots only), a known extension
DOCS_FILE = re.compile(
    r"(?:(?!\.+/)[A-Za-z0-9_.=-]+/)*(?!\.+$)[A-Za-z0-9_.=-]+\.(?:html|css|js|png|gif|ico|otf|ttf|woff2?|svg|json)"
)
VALIDATION_FILE = re.compile(rf"impressions_({_MONTH})\.json")  # abpo.monthly.ingest (the GX summary per month)
CHAMPION = "champion"  # abpo.registry.CHAMPION
MAX_DOCS_PATH = 512  # characters of a Data Docs path (GX's longest are ~150); longer is a 404, not an OSError
MAX_SUMMARY_BYTES = 16 * 1024 * 1024
HISTORY_SHOWN = 20  # the latest entries per arm on the page (`abpo arms history` prints them all)


class Refused(Exception):
    """A file the plugin will not serve: ``status`` (404: absent, outside its directory, a link; 422: there but not a
    validation summary) and a message naming the file and the rule."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class RegistryUnreachable(RuntimeError):
    """The MLflow registry did not answer (down, too slow, misconfigured)."""


def mlflow_ui() -> str:
    """The MLflow UI the pages link to: $ABPO_MLFLOW_UI, default http://localhost:5000."""
    return os.environ.get("ABPO_MLFLOW_UI", "http://localhost:5000").rstrip("/")


def namespace() -> str:
    """The deployment's environment prefix of MLflow names (paths.namespace), from $ABPO_NAMESPACE like the DAG's."""
    return os.environ.get("ABPO_NAMESPACE", "")


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


# ---------------------------------------------------------------------------------------------------- rendering
@functools.cache
def _environment():
    from abpo.abtest.render import environment

    return environment()


def html(page: Any) -> str:
    """The HTML of ``page`` (one of the page dataclasses below): its template rendered with ``p`` = the page."""
    return _environment().get_template(page.template).render(p=page)


@dataclasses.dataclass(frozen=True)
class Index:
    """/abpo/: a link to each page."""

    links: tuple[tuple[str, str], ...] = (
        ("reports/", "A/B reports"),
        ("reports/latest", "latest A/B report"),
        ("validation/", "Great Expectations results"),
        ("champions", "arm champions in MLflow"),
    )
    title: str = "abpo"
    template: ClassVar[str] = "ui_index.html.j2"


@dataclasses.dataclass(frozen=True)
class Notice:
    """A page of one sentence (a latest report or result asked for when there is none)."""

    title: str
    text: str
    template: ClassVar[str] = "ui_notice.html.j2"


# ------------------------------------------------------------------------------------------------------ reports
def reports_dir(cfg: Config) -> Path:
    return cfg.paths.resolve("reports")


def list_reports(root: Path) -> list[Path]:
    """The report directories under ``root`` with a report.html and a whitelisted name, newest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if REPORT_NAME.fullmatch(p.name) and (p / "report.html").is_file()]
    return sorted(found, key=lambda p: (p / "report.html").stat().st_mtime, reverse=True)


@dataclasses.dataclass(frozen=True)
class Reports:
    """/abpo/reports/: the reports written by `abpo report` and the DAG's report task, newest first."""

    root: Path
    names: list[str]
    title: str = "A/B reports"
    template: ClassVar[str] = "ui_reports.html.j2"


def reports(cfg: Config) -> Reports:
    """The reports page (and /abpo/reports/latest: its first name)."""
    root = reports_dir(cfg)
    return Reports(root, [p.name for p in list_reports(root)])


def report_file(cfg: Config, name: str, filename: str) -> Path:
    """The file ``filename`` (one of :data:`REPORT_FILES`) of report ``name`` (a :data:`REPORT_NAME`), resolved;
    Refused(404) for any other name, a file that is not there, or one that resolves outside the reports directory."""
    refused = Refused(404, "no such report file")
    if not REPORT_NAME.fullmatch(name) or filename not in REPORT_FILES:
        raise refused
    try:
        root = reports_dir(cfg).resolve()
        path = root / name / filename
        if not path.is_file() or path.resolve().parent.parent != root:  # no symlink out of the reports directory
            raise refused
        return path.resolve()
    except OSError:
        raise refused from None


# ------------------------------------------------------------------------------------------ Great Expectations
def validation_dir(cfg: Config) -> Path:
    return cfg.paths.resolve("root") / "validation"


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


@dataclasses.dataclass(frozen=True)
class Validations:
    """/abpo/validation/: the months with a GX summary, newest first, and whether the Data Docs site exists."""

    months: list[str]
    docs: bool
    title: str = "Great Expectations results"
    template: ClassVar[str] = "ui_validations.html.j2"


def validations(cfg: Config) -> Validations:
    """The validation results page (and /abpo/validation/latest: its first month)."""
    root = validation_dir(cfg)
    return Validations(list_validations(root), (root / "data_docs").is_dir())


def data_docs_file(cfg: Config, path: str) -> Path:
    """A file of the GX Data Docs site the ingest's Checkpoint builds (abpo.validation): static files under
    validation/data_docs, nothing outside it (every path resolved; a link out of the site is Refused(404), and so is
    a path that is not a :data:`DOCS_FILE` or longer than :data:`MAX_DOCS_PATH`)."""
    refused = Refused(404, "no such Data Docs file")
    if len(path) > MAX_DOCS_PATH or "\x00" in path or not DOCS_FILE.fullmatch(path):
        raise refused
    try:
        root = (validation_dir(cfg) / "data_docs").resolve()
        target = (root / path).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            raise refused
    except OSError:  # a name too long for the file system, a loop of links: not a file we serve
        raise refused from None
    return target


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


def validation_json(cfg: Config, month: str) -> bytes:
    """The GX summary of ``month`` as the ingest saved it (no symlink, nothing outside validation/): Refused else."""
    return read_inside(validation_dir(cfg), f"impressions_{month}.json")


SCALARS = (str, int, float, bool, type(None))


def check_summary(name: str, s) -> dict:
    """``s`` when it has the shape abpo.validation.ValidationSummary.as_dict() writes; Refused(422) naming the file,
    the field and the rule otherwise (a hand-edited or foreign file must not reach the page as a 500). Every value the
    page shows is checked here, so :class:`Validation` meets only the types it formats: a number where a list
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


@dataclasses.dataclass(frozen=True)
class Validation:
    """/abpo/validation/<YYYY-MM>: one month's GX summary (checked by :func:`check_summary`) as a page."""

    month: str
    summary: dict
    template: ClassVar[str] = "ui_validation.html.j2"

    @property
    def title(self) -> str:
        return f"Great Expectations suite impressions_{self.month}"

    @property
    def passed(self) -> bool:
        return bool(self.summary.get("success"))

    @property
    def line(self) -> str:
        """e.g. ``1/2 expectations, 1200 rows, 0.4 s``."""
        s = self.summary
        evaluated = int(s.get("evaluated", 0))
        return (
            f"{evaluated - len(s.get('failed') or [])}/{evaluated} expectations, {int(s.get('rows', 0))} rows, "
            f"{float(s.get('seconds', 0.0)):.1f} s"
        )

    @property
    def results(self) -> list[tuple[str, ...]]:
        """One row per expectation result: expectation, column, passed, unexpected count, examples, observed."""
        return [
            tuple(
                str(v)
                for v in (
                    r.get("expectation", ""),
                    r.get("column") or "",
                    "yes" if r.get("success") else "NO",
                    r.get("unexpected_count", 0),
                    ", ".join(map(str, r.get("partial_unexpected") or [])),
                    r.get("observed_value") or "",
                )
            )
            for r in self.summary.get("results") or []
        ]


def validation(cfg: Config, month: str) -> Validation:
    """The page of ``month``'s GX summary: Refused(404) when it is not there or not JSON, Refused(422) when it is not
    a validation summary (:func:`check_summary`), nested too deep for the JSON reader, or too large."""
    file = f"impressions_{month}.json"
    data = read_inside(validation_dir(cfg), file)  # no symlink, nothing outside validation/
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
    return Validation(month, check_summary(file, summary))


# ------------------------------------------------------------------------------------------------ arm champions
GATE_COLUMNS = (
    "Arm",
    "Challenger",
    "Verdict",
    "Decided by",
    "Offline test",
    "Offline diff (won/lost)",
    "Bound vs -margin",
    "z, p",
    "Off-policy estimator (rows)",
    "Off-policy diff [interval] vs -margin",
    "ESS",
    "Every estimator",
)
HISTORY_COLUMNS = ("seq", "at", "action", "actor", "from", "to", "reason", "verdict", "month")


@dataclasses.dataclass(frozen=True)
class Champions:
    """/abpo/champions: each arm's row of :func:`lookup_champions`, or, when the registry could not be read, why
    (``error``, its URI redacted; the page is then a 503)."""

    rows: list[dict]
    store: str  # the tracking URI, redacted
    error: str = ""
    title: str = "Arm champions"
    template: ClassVar[str] = "ui_champions.html.j2"
    history_shown: ClassVar[int] = HISTORY_SHOWN
    gate_columns: ClassVar[tuple[str, ...]] = GATE_COLUMNS
    history_columns: ClassVar[tuple[str, ...]] = HISTORY_COLUMNS

    @property
    def status(self) -> int:
        return 503 if self.error else 200

    @property
    def mlflow_ui(self) -> str:
        return mlflow_ui()

    @staticmethod
    def model_page(name: str, version: str | None = None) -> str:
        return model_page(name, version)

    @staticmethod
    def pin(row: dict) -> dict[str, str]:
        """The arm's pin tag (abpo.arms.promotion.PIN_TAG, "<version>|<actor>|<at>|<reason>") split into its fields."""
        version, actor, at, reason = (str(row["pinned"]).split("|", 3) + ["", "", "", ""])[:4]
        return {"version": version, "actor": actor, "at": at, "reason": reason}

    @property
    def gates(self) -> list[tuple[str, tuple[str, ...]]]:
        """(arm, cells) of each arm with a gated version: :func:`gate_cells`."""
        return [(r["arm"], gate_cells(r["gate"])) for r in self.rows if r.get("gate")]

    @property
    def history(self) -> list[tuple[str, tuple[str, ...]]]:
        """(arm, cells) of each promotion-history entry shown, arm by arm, newest first."""
        return [
            (r["arm"], tuple(str(e.get(c, "")) for c in HISTORY_COLUMNS))
            for r in self.rows
            for e in r.get("history") or []
        ]


def gate_cells(g: dict) -> tuple[str, ...]:
    """An arm's latest gate, both halves (offline and off-policy), as the cells after the arm in :data:`GATE_COLUMNS`: which
    evidence decided (``gate.decided_by``), the offline test (which one, its difference with won/lost users, its bound against -margin, statistic and p) and the
    off-policy estimator that decided (its interval against -margin, the rows it read, the ESS) with every
    estimator's numbers; "n/a" for a tag the gate did not write."""

    def t(k: str) -> str:
        return g.get(f"gate.{k}", "n/a")

    method = t("offline.method")
    # which evidence decided; a gate recorded before the tag: both halves when the off-policy one ran
    decided = g.get("gate.decided_by") or ("both" if "gate.ope.estimator" in g else "n/a")
    test = "Tango score" if method.startswith("Tango") else "Wald" if method != "n/a" else "n/a"
    return (
        f"v{g['version']} vs v{t('champion_version')}",
        t("verdict").upper(),
        decided,
        test,
        f"{t('offline.diff')} ({t('offline.wins')}/{t('offline.losses')})",
        (
            f"upper {t('offline.upper')} vs -{t('guardrail.margin')} (guardrail)"
            if decided == "off-policy"
            else f"{t('offline.lower')} vs -{t('offline.margin')}"
        ),
        f"{t('offline.statistic')}, {t('offline.p_value')}",
        f"{t('ope.estimator')} ({t('ope.rows')}, {t('ope.n')})" if "gate.ope.estimator" in g else "not run",
        f"{t('ope.diff')} [{t('ope.ci_low')}, {t('ope.ci_high')}] vs -{t('ope.margin')}",
        t("ope.challenger_ess"),
        t("ope.estimates"),
    )


def champions(cfg: Config, timeout: float) -> Champions:
    """The champions page: :func:`lookup_champions` on the config's tracking URI for every arm of the config, given
    ``timeout`` seconds (:func:`with_deadline`); a registry that does not answer in time, refuses, or has no store
    gives the page saying so (``error``), never an exception."""
    uri = cfg.paths.tracking_uri()
    try:
        rows = with_deadline(lambda: lookup_champions(uri, list(cfg.arms.names)), timeout)
    except RegistryUnreachable as e:
        return Champions([], redact(uri), str(e).replace(uri, redact(uri)))
    return Champions(rows, redact(uri))


def lookup_champions(tracking_uri: str, arms: list[str]) -> list[dict]:
    """Each arm's champion: {arm, model, version (None: no champion yet), months, approved ("<who> at <when>" when
    a human approved its promotion, arms.approval = required; else ""), pinned, history (:func:`promotion_record`),
    gate (:func:`latest_gate`)}. Raises RegistryUnreachable."""
    from abpo import registry

    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():  # MLflow would create (and migrate) an empty store: say there is none
            raise RegistryUnreachable(f"no MLflow store at {db} yet (nothing registered)")
        registry.ensure_store(tracking_uri)  # a store a task is creating now: wait for its schema, never migrate twice
    client = registry.reader_client(tracking_uri)
    rows: list[dict[str, Any]] = []
    for arm in arms:
        name = model_name(arm, namespace())
        try:
            v = client.get_model_version_by_alias(name, CHAMPION)
        except Exception as e:
            if not registry.is_mlflow_error(e):
                raise
            if not registry.is_not_found(e):
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
    from abpo import registry

    try:
        versions = client.search_model_versions(f"name = '{model}'")
    except Exception as e:
        if not registry.is_mlflow_error(e):
            raise
        if registry.is_not_found(e):
            return None
        raise RegistryUnreachable(f"{getattr(e, 'error_code', '')}: {str(e)[:300]}") from e
    gated = [v for v in versions if (v.tags or {}).get("gate.verdict")]
    if not gated:
        return None
    v = max(gated, key=lambda v: int(v.version))
    return {"version": str(v.version), **{k: str(x) for k, x in (v.tags or {}).items() if k.startswith("gate.")}}


def promotion_record(client, model: str, arm: str) -> tuple[str, list[dict]]:
    """The arm's pin ("" when none) and its latest :data:`HISTORY_SHOWN` promotion-history entries, newest first.
    Raises RegistryUnreachable."""
    from abpo import registry
    from abpo.arms import history
    from abpo.arms.promotion import PIN_TAG
    from abpo.paths import namespaced

    try:
        try:
            pin = (client.get_registered_model(model).tags or {}).get(PIN_TAG, "")
        except Exception as e:
            if not (registry.is_mlflow_error(e) and registry.is_not_found(e)):
                raise
            pin = ""
        entries = history.read(client, arm, namespaced(history.EXPERIMENT, namespace()))
    except Exception as e:
        if not registry.is_mlflow_error(e):
            raise
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
