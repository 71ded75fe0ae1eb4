"""The replicated loop experiment's statistics (abpo.abtest.replicated) against a hand computation: two
replicates, two arms, a handful of users each, every intermediate written out below."""

from __future__ import annotations

import math

import pytest

from abpo.abtest import replicated as rp
from abpo.abtest.stats import UserMoments


def moments(users: list[tuple[int, int]]) -> UserMoments:
    """Per-user (clicks, impressions) -> the moments sql/report_user_moments.sql returns."""
    return UserMoments(
        users=len(users),
        sx=sum(x for x, _ in users),
        sy=sum(y for _, y in users),
        sxx=sum(x * x for x, _ in users),
        syy=sum(y * y for _, y in users),
        sxy=sum(x * y for x, y in users),
    )


# replicate 1: a = (1,4) (2,4) (0,4): R = 3/12 = 0.25, residuals X - R Y = 0, 1, -1, SS 2,
#                  V = SS / (n-1) / (n Ybar^2) = 2 / 2 / (3 * 16) = 1/48
#              b = (0,4) (1,4) (1,4) (0,4): R = 2/16 = 0.125, residuals -.5 .5 .5 -.5, SS 1, V = 1/3 / (4*16) = 1/192
#              Δ_1 = 0.125, v_1 = 1/48 + 1/192 = 5/192
# replicate 2: a = (2,4) (2,4): R = 0.5, V = 0;  b = (1,4) (0,4): R = 0.125, SS 0.5, V = 0.5 / 1 / (2*16) = 1/64
#              Δ_2 = 0.375, v_2 = 1/64 = 3/192
# Δ̄ = 0.25; s²_B = (0.125² + 0.125²) / 1 = 0.03125; v̄_W = (5/192 + 3/192) / 2 = 1/48 = 0.0208333
# SE² = max(0.03125, 1/48) / 2 = 0.015625: SE = 0.125 (basis between); z = 2; p = 2 Φ(-2) = 0.0455003
# 95% CI 0.25 ± 1.959964 * 0.125 = [0.0050045, 0.4949955]; MDE (1.959964 + 0.841621) * 0.125 = 0.3501982
# σ̂²_B = 0.03125 - 1/48 = 0.0104167
REP1 = {"2026-01": {"a": moments([(1, 4), (2, 4), (0, 4)]), "b": moments([(0, 4), (1, 4), (1, 4), (0, 4)])}}
REP2 = {"2026-01": {"a": moments([(2, 4), (2, 4)]), "b": moments([(1, 4), (0, 4)])}}


def test_two_replicates_match_the_hand_computation():
    t = rp.pair_difference([REP1, REP2], "2026-01", "a", "b")
    assert t.per_replicate == pytest.approx([0.125, 0.375])
    assert t.estimate == pytest.approx(0.25)
    assert t.between_var == pytest.approx(0.03125) and t.within_var == pytest.approx(1 / 48)
    assert t.basis == "between" and t.between_component == pytest.approx(0.03125 - 1 / 48)
    assert t.se == pytest.approx(0.125) and t.z == pytest.approx(2.0) and t.p == pytest.approx(0.0455003, abs=1e-7)
    assert (t.ci_low, t.ci_high) == pytest.approx((0.0050045, 0.4949955), abs=1e-7)
    assert t.mde == pytest.approx(0.3501982, abs=1e-7) and t.replicates == 2


def test_the_users_variance_is_the_floor_when_replicates_agree():
    """Two replicates with the same Δ: s²_B = 0 < v̄_W, so SE² = v̄_W / S, never 0."""
    t = rp.pair_difference([REP1, REP1], "2026-01", "a", "b")
    assert t.between_var == 0.0 and t.basis == "within" and t.between_component == 0.0
    assert t.se == pytest.approx(math.sqrt((5 / 192) / 2))
    one = rp.pair_difference([REP1], "2026-01", "a", "b")  # S = 1: the replicate's clustered test
    assert one.se == pytest.approx(math.sqrt(5 / 192)) and math.isnan(one.between_var) and one.basis == "within"


def test_an_arms_ctr_and_an_undefined_replicate():
    c = rp.arm_ctr([REP1, REP2], "2026-01", "a")  # R_s = 0.25, 0.5; s²_B = 0.03125; v̄_W = (1/48 + 0) / 2
    assert c.estimate == pytest.approx(0.375) and c.se == pytest.approx(math.sqrt(0.03125 / 2))
    lone = {"2026-01": {"a": moments([(1, 4)]), "b": REP2["2026-01"]["b"]}}  # one user: no clustered variance
    t = rp.pair_difference([REP1, lone], "2026-01", "a", "b")
    assert not t.defined and "replicate(s) [1] undefined" in t.note
    missing = rp.pair_difference([REP1, {"2026-01": {"a": REP2["2026-01"]["a"]}}], "2026-01", "a", "b")
    assert not missing.defined and math.isnan(missing.estimate)


def test_replicates_for_a_target_mde():
    # (1.959964 + 0.841621)^2 = 7.848879; 7.848879 * 0.03125 / 0.05^2 = 98.11 -> 99 replicates
    assert rp.replicates_for_mde(0.05, 0.03125) == 99
    assert rp.replicates_for_mde(1.0, 0.03125) == 1
    with pytest.raises(ValueError, match="rule: > 0"):
        rp.replicates_for_mde(0.0, 0.03125)


def test_pairs_the_report_and_its_rows():
    arms = ["abpo", "grpo", "ml_retrain", "holdback"]
    pairs = rp.arm_pairs(arms, holdback="holdback", candidate="abpo")
    assert pairs == [
        ("abpo", "holdback"),
        ("grpo", "holdback"),
        ("ml_retrain", "holdback"),
        ("abpo", "grpo"),
        ("abpo", "ml_retrain"),
        ("grpo", "ml_retrain"),
    ]
    rows = [
        {"period": p, "arm": arm, "users": m.users, "clicks": m.sx, "impressions": m.sy, "clicks_sq": m.sxx,
         "impressions_sq": m.syy, "clicks_x_impressions": m.sxy}
        for p, by_arm in REP1.items() for arm, m in by_arm.items()
    ]  # fmt: skip
    assert rp.moments_by_period(rows) == REP1
    reps = [{**r, rp.ALL: r["2026-01"]} for r in (REP1, REP2)]
    report = rp.analyse_replicates(reps, ["2026-01"], ["a", "b"], [("a", "b")])
    assert report.diffs[rp.ALL][("a", "b")].se == pytest.approx(0.125)
    assert report.p_holm["2026-01"][("a", "b")] == pytest.approx(0.0455003, abs=1e-7)  # one pair: unadjusted
    js = report.to_json()
    assert js["periods"]["all"]["diffs"][0]["estimate"] == pytest.approx(0.25) and js["replicates"] == 2
    md = rp.replicated_markdown(report, [("a", "b")])
    assert "| whole period | a − b | +25.00 [+0.50, +49.50] | 0.046 | 0.046 | 35.02 | 17.68 / 14.43 | between |" in md
