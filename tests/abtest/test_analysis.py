"""The report's analysis on counts tables: numbers, Holm families, trends, SRM and the edge cases."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from abpo.abtest import stats
from abpo.abtest.analysis import ALL, ReportInputError, analyse
from abpo.config.report import ReportConfig


def counts(rows, users=True):
    cols = ["month", "arm", "impressions", "clicks"] + (["users"] if users else [])
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})


FULL = [
    ("2026-02", "abpo", 20000, 1100, 2000),
    ("2026-02", "grpo", 20000, 1000, 2010),
    ("2026-02", "popularity", 20000, 800, 1990),
    ("2026-03", "abpo", 21000, 1250, 2050),
    ("2026-03", "grpo", 20500, 1010, 2000),
    ("2026-03", "popularity", 20800, 790, 2020),
    ("2026-04", "abpo", 22000, 1400, 2100),
    ("2026-04", "grpo", 21000, 1000, 2080),
    ("2026-04", "popularity", 21500, 850, 2110),
]
SHARES = {"abpo": 1 / 3, "grpo": 1 / 3, "popularity": 1 / 3}


def test_cells_totals_and_comparisons():
    r = analyse(counts(FULL), ReportConfig(arm_shares=SHARES))
    assert r.months == ["2026-02", "2026-03", "2026-04"]
    assert r.arms == ["abpo", "grpo", "popularity"]  # candidate first
    c = r.cell("2026-03", "grpo")
    assert (c.impressions, c.clicks, c.users) == (20500, 1010, 2000) and c.ctr == pytest.approx(1010 / 20500)
    tot = r.cell(ALL, "abpo")
    assert (tot.impressions, tot.clicks) == (63000, 3750)
    assert tot.users is None  # distinct users over months are unknown from monthly counts
    assert len(r.comparisons) == 4 * 2  # (3 months + whole period) x 2 other arms
    cmp = next(x for x in r.comparisons if x.period == "2026-04" and x.other == "popularity")
    ref = stats.two_proportion_ztest(1400, 22000, 850, 21500)
    assert cmp.test == ref and cmp.candidate == "abpo"
    agg = next(x for x in r.comparisons if x.period == ALL and x.other == "grpo")
    assert agg.test == stats.two_proportion_ztest(3750, 63000, 3010, 61500)


def test_holm_within_each_period():
    r = analyse(counts(FULL), ReportConfig(arm_shares=SHARES))
    for period in [*r.months, ALL]:
        fam = [c for c in r.comparisons if c.period == period]
        assert [c.p_holm for c in fam] == pytest.approx(stats.holm_adjust([c.test.p for c in fam]))
        assert all(c.p_holm >= c.test.p for c in fam)


def test_trends_later_minus_earlier_and_first_to_last():
    r = analyse(counts(FULL), ReportConfig(arm_shares=SHARES))
    abpo = [t for t in r.trends if t.arm == "abpo"]
    assert [(t.earlier, t.later, t.kind) for t in abpo] == [
        ("2026-02", "2026-03", "consecutive"),
        ("2026-03", "2026-04", "consecutive"),
        ("2026-02", "2026-04", "first-to-last"),
    ]
    assert abpo[2].test == stats.two_proportion_ztest(1400, 22000, 1100, 20000)
    assert abpo[2].test.diff > 0  # abpo improves: later minus earlier is positive
    assert len(r.trends) == 3 * 3


def test_srm_per_month_with_equal_shares_ok():
    r = analyse(counts(FULL), ReportConfig(arm_shares=SHARES))
    assert set(r.srm) == set(r.months) and not r.srm_flagged
    assert any("distinct users per arm unknown" in n for n in r.notes)


def test_unequal_shares_srm():
    rows = [
        ("2026-02", "abpo", 50000, 2500, 5000),
        ("2026-02", "grpo", 10000, 480, 1000),
        ("2026-02", "popularity", 40000, 1500, 4000),
    ]
    ok = analyse(counts(rows), ReportConfig(arm_shares={"abpo": 0.5, "grpo": 0.1, "popularity": 0.4}))
    assert not ok.srm_flagged and ok.srm["2026-02"].chi2 == pytest.approx(0.0)
    bad = analyse(counts(rows), ReportConfig(arm_shares={"abpo": 0.4, "grpo": 0.2, "popularity": 0.4}))
    assert bad.srm_flagged == ["2026-02", ALL]  # one month: the month's users are the period's users


def test_one_month_only():
    rows = [r for r in FULL if r[0] == "2026-03"]
    r = analyse(counts(rows), ReportConfig(arm_shares=SHARES))
    assert r.trends == [] and any("one month only" in n for n in r.notes)
    assert [c.period for c in r.comparisons] == ["2026-03", "2026-03", ALL, ALL]
    assert ALL in r.srm  # the single month's users are the whole period's


def test_arm_missing_in_a_month_is_reported_not_a_crash():
    rows = [r for r in FULL if not (r[0] == "2026-03" and r[1] == "grpo")]
    r = analyse(counts(rows), ReportConfig(arm_shares=SHARES))
    assert "2026-03: arm 'grpo' has no data" in r.notes
    assert "aggregate of 'grpo' covers 2026-02, 2026-04 only" in r.notes
    missing = next(c for c in r.comparisons if c.period == "2026-03" and c.other == "grpo")
    assert not missing.test.defined and "no data for 'grpo' in 2026-03" in missing.note
    assert math.isnan(missing.p_holm)
    other = next(c for c in r.comparisons if c.period == "2026-03" and c.other == "popularity")
    assert other.p_holm == pytest.approx(other.test.p)  # a family of one defined test
    tr = [t for t in r.trends if t.arm == "grpo"]
    assert [t.test.defined for t in tr] == [False, False, True]
    assert "no data for 'grpo' in 2026-03" in tr[0].note


def test_zero_clicks_arm_and_zero_impressions_row():
    rows = [("2026-02", "abpo", 1000, 0, 100), ("2026-02", "grpo", 1000, 0, 100), ("2026-02", "popularity", 0, 0, 0)]
    r = analyse(counts(rows), ReportConfig(arm_shares=SHARES))
    g = next(c for c in r.comparisons if c.period == "2026-02" and c.other == "grpo")
    assert not g.test.defined and "no clicks" in g.test.note
    p = next(c for c in r.comparisons if c.period == "2026-02" and c.other == "popularity")
    assert not p.test.defined and "no impressions" in p.test.note
    assert "2026-02: arm 'popularity' has zero impressions (CTR undefined)" in r.notes
    assert math.isnan(r.cell("2026-02", "popularity").ctr)


def test_candidate_missing_entirely():
    rows = [r for r in FULL if r[1] != "abpo"]
    r = analyse(counts(rows), ReportConfig(arm_shares=SHARES))
    assert r.comparisons == [] and any("candidate arm 'abpo' has no data" in n for n in r.notes)
    assert r.trends  # trends still computed for the arms present


def test_other_candidate_arm_from_config():
    r = analyse(counts(FULL), ReportConfig(candidate_arm="grpo", arm_shares=SHARES))
    assert r.arms[0] == "grpo" and {c.other for c in r.comparisons} == {"abpo", "popularity"}


def test_requested_month_without_data_and_rows_outside():
    r = analyse(counts(FULL), ReportConfig(arm_shares=SHARES), months=["2026-03", "2026-04", "2026-05"])
    assert "2026-05: no data for any arm" in r.notes
    assert any("3 row(s) outside the selected months ignored (2026-02)" in n for n in r.notes)
    assert not any(c.period == "2026-02" for c in r.cells)


def test_no_users_column():
    r = analyse(counts([row[:4] for row in FULL], users=False), ReportConfig(arm_shares=SHARES))
    assert r.srm == {} and any("no user counts" in n for n in r.notes)


@pytest.mark.parametrize(
    "rows,msg",
    [
        ([("2026-02", "abpo", 10, 11, 5)], "row 1: clicks=11 exceed impressions=10"),
        ([("2026-02", "abpo", 10, 1, 5), ("2026-02", "abpo", 10, 1, 5)], "row 2: duplicate month/arm 2026-02/abpo"),
        ([("2026-2", "abpo", 10, 1, 5)], "row 1: month '2026-2' is not YYYY-MM"),
        ([("2026-02", "abpo", -1, 0, 0)], "row 1: impressions=-1 is not a non-negative integer"),
        ([("2026-02", "abpo", 10, 1, 11)], "row 1: users=11 exceed impressions=10"),
    ],
)
def test_invalid_counts_name_the_row(rows, msg):
    with pytest.raises(ReportInputError, match=msg):
        analyse(counts(rows), ReportConfig())


@pytest.mark.parametrize(
    "cfg,msg",
    [
        (ReportConfig(confidence=95), "report.confidence = 95"),
        (ReportConfig(srm_alpha=0), "report.srm_alpha = 0"),
        (ReportConfig(arm_shares={"abpo": "half", "grpo": 0.5}), "report.arm_shares['abpo'] = 'half'"),
    ],
)
def test_invalid_config_names_the_key(cfg, msg):
    with pytest.raises(ReportInputError) as e:
        analyse(counts(FULL), cfg)
    assert msg in str(e.value)


def test_confidence_level_changes_every_interval():
    r90 = analyse(counts(FULL), ReportConfig(arm_shares=SHARES, confidence=0.90))
    r99 = analyse(counts(FULL), ReportConfig(arm_shares=SHARES, confidence=0.99))
    c90, c99 = r90.comparisons[0].test, r99.comparisons[0].test
    assert c90.p == c99.p and (c99.ci_high - c99.ci_low) > (c90.ci_high - c90.ci_low)
    assert (r99.cells[0].ci_high - r99.cells[0].ci_low) > (r90.cells[0].ci_high - r90.cells[0].ci_low)
