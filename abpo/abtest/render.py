"""Rendering a :class:`~abpo.abtest.analysis.Report`: the same tables as Markdown and as one
self-contained HTML page (CSS inline, the PNG embedded as base64, no external assets), the PNG of
CTR per arm over months with confidence bands, and a JSON file with the raw numbers."""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abpo.abtest import markdown, sim_ctr as sim_ctr_mod, stats
from abpo.abtest.analysis import ALL, Report
from abpo.abtest.sim_ctr import SimCtr

HTML_NAME, MD_NAME, PNG_NAME, JSON_NAME = "report.html", "report.md", "ctr_by_arm.png", "report.json"


TEXT_HEADERS = {
    "Month",
    "Arm",
    "Period",
    "Comparison",
    "Months",
    "Kind",
    "Users observed (expected)",
    "Verdict",
    "Note",
}


@dataclass(frozen=True)
class Table:
    key: str  # which explanation belongs to it
    title: str
    headers: list[str]
    rows: list[list[str]]

    @property
    def text_columns(self) -> list[bool]:
        """Which columns hold text (left-aligned in HTML) rather than numbers."""
        return [h in TEXT_HEADERS for h in self.headers]


@dataclass(frozen=True)
class ReportFiles:
    out_dir: Path
    html: Path
    markdown: Path
    png: Path
    json: Path
    sim_png: Path | None = None  # the simulator's climb chart (simulated months only: abpo.abtest.sim_ctr)


def _int(v: int | None) -> str:
    return "n/a" if v is None else f"{v:,}"


def _pct(v: float, digits: int = 3) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{100 * v:.{digits}f}%"


def _pp(v: float) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{100 * v:+.3f}"


def _ci_pp(lo: float, hi: float) -> str:
    return "n/a" if math.isnan(lo) or math.isnan(hi) else f"[{100 * lo:+.3f}, {100 * hi:+.3f}]"


def _mde(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{100 * v:.3f}"


def _ci_pct(lo: float, hi: float) -> str:
    return "n/a" if math.isnan(lo) or math.isnan(hi) else f"[{100 * lo:.3f}%, {100 * hi:.3f}%]"


def _period(p: str) -> str:
    return "whole period" if p == ALL else p


NOT_TESTED = "not tested"  # in the test columns of a comparison an integrity check withheld


def _tested(withheld: str, text: str) -> str:
    return NOT_TESTED if withheld else text


def tables(report: Report) -> list[Table]:
    """The report's tables as formatted strings (shared by the Markdown and HTML renderings)."""
    out = [ctr_table(report), aggregate_table(report), comparison_table(report)]
    if report.holdback:
        out.append(holdback_table(report))
    out.append(trend_table(report))
    out.append(srm_table(report))
    return out


def ctr_table(report: Report) -> Table:
    """ "Impressions, clicks and CTR per arm and month", with each cell's confidence interval."""
    cl = f"{round(100 * report.confidence)}%"
    return Table(
        "ctr",
        "Impressions, clicks and CTR per arm and month",
        ["Month", "Arm", "Impressions", "Clicks", "Users", "CTR", f"{cl} CI"],
        [
            [
                c.period,
                c.arm,
                _int(c.impressions),
                _int(c.clicks),
                _int(c.users),
                _pct(c.ctr),
                _ci_pct(c.ci_low, c.ci_high),
            ]
            for c in report.cells
        ],
    )


def aggregate_table(report: Report) -> Table:
    """ "Whole-period aggregate": each arm's totals over all the report's months."""
    cl = f"{round(100 * report.confidence)}%"
    return Table(
        "aggregate",
        f"Whole-period aggregate ({report.months[0]} to {report.months[-1]})",
        ["Arm", "Impressions", "Clicks", "Users", "CTR", f"{cl} CI"],
        [
            [c.arm, _int(c.impressions), _int(c.clicks), _int(c.users), _pct(c.ctr), _ci_pct(c.ci_low, c.ci_high)]
            for c in report.totals
        ],
    )


def comparison_table(report: Report) -> Table:
    """ "Candidate arm vs each other arm": z-test, MDE and Holm-adjusted p per period, plus the clustered
    (per-user) columns when the report has per-user data."""
    cl, pw = f"{round(100 * report.confidence)}%", f"{round(100 * report.power)}%"
    rows = []
    for c in report.comparisons:
        t, k, w = c.test, c.clustered, c.withheld
        rows.append(
            [
                _period(c.period),
                f"{c.candidate} − {c.other}",
                _pct(t.ctr_a),
                _pct(t.ctr_b),
                _pp(t.diff),
                _tested(w, _ci_pp(t.ci_low, t.ci_high)),
                _tested(w, _mde(t.mde)),
                _tested(w, stats.format_z(t.z)),
                _tested(w, stats.format_p(t.p)),
                _tested(w, stats.format_p(c.p_holm)),
                _tested(w, stats.format_z(k.z) if k else "n/a"),
                _tested(w, stats.format_p(k.p) if k else "n/a"),
                _tested(w, stats.format_p(c.clustered_p_holm)),
                _tested(w, _ci_pp(k.ci_low, k.ci_high) if k else "n/a"),
                _tested(w, _mde(k.mde) if k else "n/a"),
                "; ".join(x for x in (f"{NOT_TESTED}: {w}" if w else "", c.note, k.note if k else "") if x),
            ]
        )
    headers = [
        "Period",
        "Comparison",
        f"CTR {report.candidate}",
        "CTR other",
        "Δ (pp)",
        f"{cl} CI (pp)",
        f"MDE at {pw} power (pp)",
        "z",
        "p",
        "p (Holm)",
        "clustered z",
        "clustered p",
        "clustered p (Holm)",
        f"clustered {cl} CI (pp)",
        f"clustered MDE at {pw} power (pp)",
        "Note",
    ]
    if not any(c.clustered for c in report.comparisons):  # no per-user data: leave the clustered columns out
        keep = [i for i, h in enumerate(headers) if not h.startswith("clustered")]
        headers, rows = [headers[i] for i in keep], [[r[i] for i in keep] for r in rows]
    return Table("ztest", f"Candidate arm ({report.candidate}) vs each other arm", headers, rows)


def trend_table(report: Report) -> Table:
    """ "Month-to-month trend of every arm (later − earlier)": z-test and MDE per arm and pair of months."""
    cl, pw = f"{round(100 * report.confidence)}%", f"{round(100 * report.power)}%"
    return Table(
        "trend",
        "Month-to-month trend of every arm (later − earlier)",
        [
            "Arm",
            "Months",
            "Kind",
            "CTR earlier",
            "CTR later",
            "Δ (pp)",
            f"{cl} CI (pp)",
            f"MDE at {pw} power (pp)",
            "z",
            "p",
            "Note",
        ],
        [
            [
                t.arm,
                f"{t.earlier} → {t.later}",
                t.kind,
                _pct(t.test.ctr_b),
                _pct(t.test.ctr_a),
                _pp(t.test.diff),
                _tested(t.withheld, _ci_pp(t.test.ci_low, t.test.ci_high)),
                _tested(t.withheld, _mde(t.test.mde)),
                _tested(t.withheld, stats.format_z(t.test.z)),
                _tested(t.withheld, stats.format_p(t.test.p)),
                "; ".join(x for x in (f"{NOT_TESTED}: {t.withheld}" if t.withheld else "", t.note) if x),
            ]
            for t in report.trends
        ],
    )


def srm_table(report: Report) -> Table:
    """ "Sample-ratio mismatch": users per arm against the configured shares, per period, with the chi-squared test."""
    srm_rows = []
    for period, r in report.srm.items():
        obs = ", ".join(
            f"{a} {o:,} (exp. {e:,.0f})" if not math.isnan(e) else f"{a} {o:,}"
            for a, o, e in zip(r.arms, r.observed, r.expected)
        )
        verdict = "n/a" if math.isnan(r.p) else ("MISMATCH" if r.mismatch else "too few users" if r.too_few else "ok")
        srm_rows.append(
            [
                _period(period),
                obs,
                "n/a" if math.isnan(r.chi2) else f"{r.chi2:.2f}",
                str(r.dof),
                stats.format_p(r.p),
                verdict,
                r.note,
            ]
        )
    return Table(
        "srm",
        "Sample-ratio mismatch (users per arm vs configured shares)",
        ["Period", "Users observed (expected)", "χ²", "dof", "p", "Verdict", "Note"],
        srm_rows,
    )


def holdback_table(report: Report) -> Table:
    """ "Updating vs not updating (holdback)": each updated arm minus the holdback per period, z-test and MDE."""
    cl, pw = f"{round(100 * report.confidence)}%", f"{round(100 * report.power)}%"
    clustered = any(c.clustered for c in report.holdback)
    headers = [
        "Period",
        "Comparison",
        "CTR updated",
        f"CTR {report.holdback_arm}",
        "Δ (pp)",
        f"{cl} CI (pp)",
        f"MDE at {pw} power (pp)",
        "z",
        "p",
        "p (Holm)",
    ]
    if clustered:
        headers += ["clustered z", "clustered p", f"clustered MDE at {pw} power (pp)"]
    rows = []
    for c in report.holdback:
        t, k, w = c.test, c.clustered, c.withheld
        row = [
            _period(c.period),
            f"{c.candidate} − {c.other}",
            _pct(t.ctr_a),
            _pct(t.ctr_b),
            _pp(t.diff),
            _tested(w, _ci_pp(t.ci_low, t.ci_high)),
            _tested(w, _mde(t.mde)),
            _tested(w, stats.format_z(t.z)),
            _tested(w, stats.format_p(t.p)),
            _tested(w, stats.format_p(c.p_holm)),
        ]
        if clustered:
            row += [
                _tested(w, stats.format_z(k.z) if k else "n/a"),
                _tested(w, stats.format_p(k.p) if k else "n/a"),
                _tested(w, _mde(k.mde) if k else "n/a"),
            ]
        notes = (f"{NOT_TESTED}: {w}" if w else "", c.note, k.note if k else "")
        rows.append([*row, "; ".join(x for x in notes if x)])
    return Table("holdback", "Updating vs not updating (holdback)", [*headers, "Note"], rows)


def srm_verdict(report: Report) -> str:
    if not report.srm:
        return "Sample-ratio check not possible: no user counts."
    flagged = report.srm_flagged
    if flagged:
        return (
            f"SAMPLE-RATIO MISMATCH in {', '.join(_period(p) for p in flagged)} (p < {report.srm_alpha}): "
            "user assignment or logging is off; do not trust the comparisons until it is explained."
        )
    few = [p for p, r in report.srm.items() if not math.isnan(r.p) and r.too_few]
    tested = [p for p, r in report.srm.items() if not math.isnan(r.p) and not r.too_few]
    if few:  # a chi-square on a handful of users passes whatever the split: no claim that it matches
        users = ", ".join(f"{sum(report.srm[p].observed):,} in {_period(p)}" for p in few)
        also = f"; no mismatch in {', '.join(_period(p) for p in tested)}" if tested else ""
        return (
            f"Sample-ratio check inconclusive: too few users ({users}; the chi-square test needs "
            f"{stats.SRM_MIN_EXPECTED:g} expected per arm) to say the split matches the configured shares{also}."
        )
    if not tested:
        return "Sample-ratio check undefined (see the notes of the table)."
    return (
        f"No sample-ratio mismatch (p ≥ {report.srm_alpha} in {', '.join(_period(p) for p in tested)}): "
        "users per arm match the configured shares."
    )


def _p_is(name: str, p: float) -> str:
    f = stats.format_p(p)
    return f"{name} < 0.001" if f.startswith("<") else f"{name} = {f}"


def headline(report: Report) -> list[str]:
    """One line per whole-period comparison (a comparison an integrity check withheld says why), then one per
    integrity flag: the figures a reader looks for first, and whether to trust them."""
    lines = []
    for c in report.comparisons:
        if c.period != ALL:
            continue
        t = c.test
        if c.withheld:  # one line that says the difference is not a finding, and why
            lines.append(f"{c.candidate} vs {c.other}: {_pp(t.diff)} pp, {NOT_TESTED}: {c.withheld}")
            continue
        if not t.defined:
            lines.append(f"{c.candidate} vs {c.other}: {c.note or 'undefined'}")
            continue
        s = (
            f"{c.candidate} vs {c.other}: {_pp(t.diff)} pp (CI {_ci_pp(t.ci_low, t.ci_high)}), z = {stats.format_z(t.z)}, "
            f"{_p_is('p', t.p)}, {_p_is('Holm p', c.p_holm)}, MDE {_mde(t.mde)} pp"
        )
        if c.clustered is not None and c.clustered.defined:
            s += f"; user-clustered {_p_is('p', c.clustered.p)}, MDE {_mde(c.clustered.mde)} pp"
        lines.append(s)
    return lines + report.flags


def plot_png(report: Report) -> bytes:
    """PNG of CTR (%) per arm over the months, with the Wilson confidence band of each point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    months = report.months
    x = list(range(len(months)))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    n = max(len(report.arms), 1)
    for k, arm in enumerate(report.arms):
        y, lo, hi = [], [], []
        for m in months:
            c = report.cell(m, arm)
            y.append(100 * c.ctr if c else math.nan)
            lo.append(100 * c.ci_low if c else math.nan)
            hi.append(100 * c.ci_high if c else math.nan)
        # a small horizontal offset keeps overlapping error bars apart
        xs = [xi + (k - (n - 1) / 2) * 0.03 for xi in x]
        line = ax.plot(xs, y, marker="o", label=arm, linewidth=2.5 if arm == report.candidate else 1.5)[0]
        # an error bar is a length: never negative (matplotlib refuses one), whatever rounding did to a bound
        err = [
            [max(0.0, yi - li) if not math.isnan(yi) else 0 for yi, li in zip(y, lo)],
            [max(0.0, hi_ - yi) if not math.isnan(yi) else 0 for yi, hi_ in zip(y, hi)],
        ]
        ax.errorbar(xs, y, yerr=err, fmt="none", ecolor=line.get_color(), capsize=3, alpha=0.8)
        if len(months) > 1:
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xticks(x, months)
    ax.set_xlim(-0.5, len(months) - 0.5)
    ax.set_ylabel("CTR (%)")
    ax.set_title(f"CTR per arm and month ({round(100 * report.confidence)}% Wilson intervals)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def environment():
    """The report's Jinja environment (the templates in abpo/abtest/templates/, HTML autoescaped); the UI plugin's
    pages (abpo.monthly.pages) render with it too."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("abpo.abtest", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _sim_context(sim: SimCtr | None) -> dict[str, Any]:
    """The simulator's expected-CTR section (abpo.abtest.sim_ctr), or None: no simulated month, no section."""
    if sim is None:
        return {"sim": None}
    table = Table("sim_ctr", sim_ctr_mod.TITLE, sim_ctr_mod.HEADERS, sim_ctr_mod.table_rows(sim))
    text = [h in sim_ctr_mod.TEXT_HEADERS for h in table.headers]
    return {"sim": {"table": table, "text": text, "explain": sim_ctr_mod.explanation(sim), "notes": sim.notes}}


def _context(report: Report, generated: str, sim: SimCtr | None = None) -> dict[str, Any]:
    return {
        **_sim_context(sim),
        "r": report,
        "tables": tables(report),
        "explain": report.explanations(),
        "srm_verdict": srm_verdict(report),
        "srm_flagged": bool(report.srm_flagged),
        "headline": headline(report),
        "generated": generated,
        "period": f"{report.months[0]} to {report.months[-1]}" if len(report.months) > 1 else report.months[0],
    }


def render_markdown(
    report: Report, png_name: str = PNG_NAME, generated: str | None = None, sim: SimCtr | None = None
) -> str:
    ctx = _context(report, generated or _now(), sim)
    ctx["png_name"], ctx["sim_png_name"] = png_name, sim_ctr_mod.PNG_NAME
    # every value escaped for Markdown, as render_html's are for HTML (abpo.abtest.markdown)
    return markdown.environment().get_template("report.md.j2").render(**ctx)


def render_html(
    report: Report, png: bytes, generated: str | None = None, sim: SimCtr | None = None, sim_png: bytes = b""
) -> str:
    ctx = _context(report, generated or _now(), sim)
    ctx["png_b64"] = base64.b64encode(png).decode("ascii")
    ctx["sim_png_b64"] = base64.b64encode(sim_png).decode("ascii")
    return environment().get_template("report.html.j2").render(**ctx)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _jsonable(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        d = {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, stats.DiffTest):
            d["diff_pp"] = _jsonable(v.diff_pp)
        return d
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def to_json(report: Report) -> str:
    """Every number of the report (NaN -> null), for machines."""
    return json.dumps(_jsonable(report), indent=2, ensure_ascii=False)


def write_report(report: Report, out_dir: str | Path, sim: SimCtr | None = None) -> ReportFiles:
    """Write report.html (self-contained), report.md, ctr_by_arm.png and report.json into ``out_dir``, atomically;
    with ``sim`` (simulated months: abpo.abtest.sim_ctr.load_sim_ctr) also the simulator's section, its chart
    expected_ctr.png and its figures expected_ctr.json (without, those two are removed from ``out_dir``).

    Every file is rendered in memory and written into a temporary directory on the same filesystem, then moved
    into place by rename, so a reader (the Airflow plugin, a browser) never sees a half-written report:

    - a new ``out_dir`` appears with its four files at once: the temporary directory is created beside it and
      renamed to it;
    - an existing ``out_dir`` keeps its identity: the temporary directory is created inside it and each file is
      moved over the old one with ``os.replace`` (report.html last). Each file is then always whole, the directory
      never disappears (unlike rename old away / rename new in, which leaves a moment with no report), and whatever
      else the directory holds is kept (``abpo report --out`` may name any directory).

    A failure before the move (rendering, a full disk) raises with the previous report as it was and no temporary
    file left behind."""
    out = Path(out_dir)
    png = plot_png(report)
    sim_png = sim_ctr_mod.plot_png(sim) if sim is not None else b""
    generated = _now()
    contents = {  # report.html last: the plugin lists the directories that hold one
        PNG_NAME: png,
        MD_NAME: render_markdown(report, PNG_NAME, generated, sim).encode("utf-8"),
        JSON_NAME: to_json(report).encode("utf-8"),
        HTML_NAME: render_html(report, png, generated, sim, sim_png).encode("utf-8"),
    }
    if sim is not None:
        contents = {
            sim_ctr_mod.PNG_NAME: sim_png,
            sim_ctr_mod.JSON_NAME: json.dumps(sim.to_json(), indent=1, sort_keys=True).encode("utf-8"),
            **contents,
        }
    _write_atomically(out.absolute(), contents)
    if sim is None:  # a report without simulated months keeps no chart of an earlier one
        for name in (sim_ctr_mod.PNG_NAME, sim_ctr_mod.JSON_NAME):
            (out / name).unlink(missing_ok=True)
    return ReportFiles(
        out,
        out / HTML_NAME,
        out / MD_NAME,
        out / PNG_NAME,
        out / JSON_NAME,
        out / sim_ctr_mod.PNG_NAME if sim is not None else None,
    )


def _write_atomically(out: Path, contents: dict[str, bytes]) -> None:
    """Files ``contents`` (name -> bytes) in directory ``out``, each appearing whole (see :func:`write_report`)."""
    import os
    import shutil
    import uuid

    exists = out.is_dir()
    if not exists:
        out.parent.mkdir(parents=True, exist_ok=True)
    # a plain mkdir (not tempfile.mkdtemp, which makes it 0700): the report directory gets the umask's permissions
    tmp = (out if exists else out.parent) / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        for name, data in contents.items():
            (tmp / name).write_bytes(data)
        if not exists:
            try:
                os.rename(tmp, out)
                return
            except OSError:
                if not out.is_dir():  # not a concurrent writer that created it first
                    raise
        for name in contents:
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
