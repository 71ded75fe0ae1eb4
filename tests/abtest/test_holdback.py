"""The report's "Updating vs not updating (holdback)" table (issue 30): each updated arm minus the holdback, per
month and over the whole period, by the two-proportion z-test with the MDE at the report's power beside it, Holm
across the updated arms of a period; in report.md, report.html and report.json; absent without holdback data."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest

from abpo.abtest import stats
from abpo.abtest.analysis import ALL, analyse
from abpo.abtest.render import write_report
from abpo.config.report import ReportConfig

MONTHS = ["2026-01", "2026-02", "2026-03"]
SHARES = {"abpo": 0.3, "grpo": 0.3, "holdback": 0.2, "ml_retrain": 0.1, "popularity": 0.1}


def counts(arms=tuple(SHARES), seed: int = 1) -> pa.Table:
    """abpo improving month over month, grpo a little, the holdback flat at pi_init's CTR."""
    rng = np.random.default_rng(seed)
    base = {"abpo": 0.06, "grpo": 0.055, "holdback": 0.05, "ml_retrain": 0.045, "popularity": 0.04}
    rows = {"month": [], "arm": [], "impressions": [], "clicks": [], "users": []}
    for i, m in enumerate(MONTHS):
        for a in arms:
            n = int(40_000 * SHARES[a])
            p = base[a] + {"abpo": 0.004, "grpo": 0.001}.get(a, 0.0) * i
            rows["month"].append(m)
            rows["arm"].append(a)
            rows["impressions"].append(n)
            rows["clicks"].append(int(rng.binomial(n, p)))
            rows["users"].append(n // 8)
    return pa.table(rows)


def test_each_updated_arm_minus_the_holdback_per_month_and_overall_with_its_mde():
    t = counts()
    r = analyse(t, ReportConfig(arm_shares=SHARES))
    assert r.holdback_arm == "holdback"
    assert [(c.period, c.candidate, c.other) for c in r.holdback] == [
        (p, a, "holdback") for p in [*MONTHS, ALL] for a in ("abpo", "grpo")
    ]
    rows = {(x["month"], x["arm"]): x for x in t.to_pylist()}
    for c in r.holdback:
        if c.period == ALL:
            a = [sum(rows[(m, c.candidate)][k] for m in MONTHS) for k in ("clicks", "impressions")]
            b = [sum(rows[(m, "holdback")][k] for m in MONTHS) for k in ("clicks", "impressions")]
        else:
            a = [rows[(c.period, c.candidate)][k] for k in ("clicks", "impressions")]
            b = [rows[(c.period, "holdback")][k] for k in ("clicks", "impressions")]
        want = stats.two_proportion_ztest(*a, *b, 0.95, 0.8)
        assert c.test.diff == pytest.approx(want.diff) and c.test.p == pytest.approx(want.p)
        assert c.test.mde == pytest.approx(stats.minimum_detectable_effect(want.se, 0.95, 0.8))
        assert 0 < c.test.mde < 0.05 and math.isfinite(c.test.z)
    for period in [*MONTHS, ALL]:  # Holm across the two updated arms of the period
        ps = [c.test.p for c in r.holdback if c.period == period]
        assert [c.p_holm for c in r.holdback if c.period == period] == pytest.approx(stats.holm_adjust(ps))
    overall = {c.candidate: c for c in r.holdback if c.period == ALL}
    assert overall["abpo"].test.diff > 0.01 and overall["abpo"].test.p < 0.001  # abpo beats not updating


def test_the_table_is_rendered_in_markdown_html_and_json(tmp_path):
    r = analyse(counts(), ReportConfig(arm_shares=SHARES))
    files = write_report(r, tmp_path)
    md, html = files.markdown.read_text(), files.html.read_text()
    assert "## Updating vs not updating (holdback)" in md and "Updating vs not updating (holdback)" in html
    assert r.explanations()["holdback"].split(";")[0] in md
    section = md.split("## Updating vs not updating (holdback)")[1].split("\n## ")[0]
    lines = [x for x in section.splitlines() if x.startswith("| ") and "− holdback" in x]
    assert len(lines) == 8 and any(x.startswith("| whole period | abpo − holdback | ") for x in lines)
    header = next(x for x in section.splitlines() if x.startswith("| Period | Comparison | CTR updated | CTR holdback"))
    assert "MDE at 80% power (pp)" in header
    data = json.loads(files.json.read_text())
    assert data["holdback_arm"] == "holdback" and len(data["holdback"]) == 8
    assert data["holdback"][-1]["period"] == ALL and data["holdback"][-1]["test"]["mde"] == pytest.approx(
        r.holdback[-1].test.mde
    )


def test_no_holdback_data_no_table_and_a_note_when_it_was_configured(tmp_path):
    four = ("abpo", "grpo", "ml_retrain", "popularity")
    r = analyse(counts(four), ReportConfig(arm_shares={a: 0.25 for a in four}))
    assert r.holdback == [] and r.holdback_arm == "" and "holdback" not in r.explanations()
    assert "Updating vs not updating" not in write_report(r, tmp_path / "a").markdown.read_text()
    r = analyse(counts(four), ReportConfig(arm_shares=SHARES))
    assert any("holdback arm 'holdback' is in report.arm_shares but has no data" in n for n in r.notes)
    r = analyse(counts(("holdback", "popularity")), ReportConfig(arm_shares=SHARES, candidate_arm="popularity"))
    assert r.holdback == [] and any("none of report.updated_arms ['abpo', 'grpo'] does" in n for n in r.notes)
