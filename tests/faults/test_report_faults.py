"""`abpo report --csv`: a zero-click or all-click arm, an oversized count (issue 18, items 1 and 6)."""

from __future__ import annotations

import json
import math

import pytest

from abpo.abtest.stats import wilson_interval


def test_zero_click_and_all_click_arms_write_the_report(abpo, state, tmp_path):
    csv = tmp_path / "counts.csv"
    csv.write_text(
        "month,arm,impressions,clicks\n2026-01,abpo,1000,0\n2026-01,grpo,1000,1000\n"
        "2026-01,ml_retrain,1000,40\n2026-02,abpo,1000,0\n2026-02,grpo,1000,1000\n2026-02,ml_retrain,900,30\n"
    )
    rc, out, err = abpo("report", "--csv", str(csv), "--out", str(tmp_path / "rep"))
    assert rc == 0, err
    for f in ("report.html", "report.md", "ctr_by_arm.png", "report.json"):
        assert (tmp_path / "rep" / f).is_file()
    cells = {(c["period"], c["arm"]): c for c in json.loads((tmp_path / "rep" / "report.json").read_text())["cells"]}
    assert cells[("2026-01", "abpo")]["ci_low"] == 0.0
    assert cells[("2026-01", "grpo")]["ci_high"] == 1.0


@pytest.mark.parametrize("n", [1, 2, 7, 20, 1000, 20_000, 10**9])
def test_wilson_interval_exact_at_zero_and_n(n):
    assert wilson_interval(0, n)[0] == 0.0
    assert wilson_interval(n, n)[1] == 1.0
    for c in sorted({0, 1, n // 2, n - 1, n}):
        lo, hi = wilson_interval(c, n)
        assert 0.0 <= lo <= c / n <= hi <= 1.0 and not math.isnan(lo)


def test_every_small_sample_has_bounds_around_the_ctr():
    # the issue measured 4,013 sample sizes up to 20,000 whose 0-click lower bound came out above 0
    bad = [n for n in range(1, 20_001) if wilson_interval(0, n)[0] > 0.0 or wilson_interval(n, n)[1] < 1.0]
    assert bad == []


def test_a_23_digit_count_is_a_message_not_a_traceback(abpo, state, tmp_path):
    csv = tmp_path / "counts.csv"
    csv.write_text("month,arm,impressions,clicks\n2026-01,abpo,12345678901234567890123,5\n")
    rc, out, err = abpo("report", "--csv", str(csv), "--out", str(tmp_path / "rep"))
    assert rc == 2
    assert "line 2: impressions 12345678901234567890123 is too large" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("month", ["٢٠٢٦-٠١", "2026-13", "2026-1"])
def test_a_csv_month_must_be_strict(abpo, state, tmp_path, month):
    csv = tmp_path / "counts.csv"
    csv.write_text('month,arm,impressions,clicks\n"' + month + '",abpo,10,1\n', encoding="utf-8")
    rc, out, err = abpo("report", "--csv", str(csv), "--out", str(tmp_path / "rep"))
    assert rc == 2 and "is not YYYY-MM" in err, err
