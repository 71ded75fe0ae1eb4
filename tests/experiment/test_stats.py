"""abpo.experiment.stats: the cluster bootstrap, the MDE equation, the non-inferiority test and the paired
comparison, each against a hand computation or a simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from abpo.experiment.stats import (
    bootstrap_interval,
    bootstrap_non_inferiority,
    hits_and_gains,
    holm,
    minimum_detectable_effect,
    non_inferiority,
    paired_comparison,
    percentile_p_value,
    round_slopes,
    standard_error,
    trend_comparison,
    two_stage_bootstrap,
    two_stage_replicates,
    user_differences,
)


def _cell(row, seed, ranks):
    return {"row": row, "seed": seed, "ranks": list(ranks), "users": list(range(len(ranks)))}


def test_hits_and_gains_by_hand():
    h, g = hits_and_gains([1, 3, 5, 6])
    assert h.tolist() == [1, 1, 1, 0]
    assert g.tolist() == pytest.approx([1.0, 0.5, 1 / math.log2(6), 0.0])


def test_user_differences_average_over_seeds():
    a = np.array([[1, 0, 1], [1, 1, 0]])
    b = np.array([[0, 0, 1], [0, 1, 1]])
    assert user_differences(a, b).tolist() == [1.0, 0.0, -0.5]
    assert standard_error(np.array([1.0, 0.0, -0.5])) == pytest.approx(np.std([1, 0, -0.5], ddof=1) / np.sqrt(3))


def test_mde_is_the_normal_power_formula():
    se = 0.01
    assert minimum_detectable_effect(se) == pytest.approx((norm.ppf(0.975) + norm.ppf(0.8)) * se)
    assert minimum_detectable_effect(se) == pytest.approx(0.028016, abs=1e-5)
    with pytest.raises(ValueError, match="alpha"):
        minimum_detectable_effect(se, power=1.0)


def test_mde_detects_its_effect_with_the_stated_power_in_simulation():
    """Simulate paired per-user differences with the MDE as the true effect: a two-sided z-test at 5% rejects in
    about 80% of replications."""
    rng = np.random.default_rng(0)
    n, sd = 400, 0.3
    mde = minimum_detectable_effect(sd / np.sqrt(n))
    rejections = 0
    reps = 2000
    for _ in range(reps):
        d = rng.normal(mde, sd, size=n)
        rejections += abs(d.mean() / standard_error(d)) > norm.ppf(0.975)
    assert abs(rejections / reps - 0.8) < 0.04


def test_bootstrap_interval_is_seeded_and_covers_the_mean():
    rng = np.random.default_rng(1)
    d = rng.normal(0.02, 0.3, size=500)
    lo, hi = bootstrap_interval(d, samples=2000, seed=3)
    assert (lo, hi) == bootstrap_interval(d, samples=2000, seed=3)
    assert lo < d.mean() < hi
    se = standard_error(d)  # the percentile interval is close to mean ± 1.96 se for a mean of 500 draws
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert all(math.isnan(x) for x in bootstrap_interval(np.array([]), samples=10))


def test_non_inferiority_by_hand_and_its_edges():
    r = non_inferiority(-0.005, 0.004, 0.01)
    assert r["z"] == pytest.approx(1.25) and r["p"] == pytest.approx(1 - norm.cdf(1.25)) and not r["non_inferior"]
    assert non_inferiority(0.002, 0.004, 0.01)["non_inferior"]  # z = 3
    assert not non_inferiority(-0.02, 0.004, 0.01)["non_inferior"]
    assert non_inferiority(0.0, 0.0, 0.01)["non_inferior"] and not non_inferiority(-0.02, 0.0, 0.01)["non_inferior"]
    with pytest.raises(ValueError, match="noninferiority_margin"):
        non_inferiority(0.0, 0.01, 0.0)


def test_paired_comparison_fields_and_errors():
    a = [_cell("abpo", s, [1, 2, 9, 9, 3, 7]) for s in (0, 1)]
    b = [_cell("none", s, [9, 2, 9, 1, 3, 7]) for s in (0, 1)]
    t = paired_comparison(a, b, bootstrap_samples=500, margin=0.01)
    assert t["dHR@5"] == pytest.approx(0.0) and t["hr5_wins"] == 2 and t["hr5_losses"] == 2
    assert t["dNDCG@5"] == pytest.approx((1.0 - 1.0) / 6)
    assert t["mde_HR@5"] == pytest.approx(minimum_detectable_effect(t["se_HR@5"]))
    assert {"ni_margin", "ni_p", "non_inferior", "ci_low_NDCG@5", "ci_high_NDCG@5", "p_HR@5", "p_NDCG@5"} <= set(t)
    ha = np.array([hits_and_gains(c["ranks"])[0] for c in a])
    hb = np.array([hits_and_gains(c["ranks"])[0] for c in b])
    assert t["se_users_HR@5"] == pytest.approx(standard_error(user_differences(ha, hb)))
    assert t["se_HR@5"] == pytest.approx(two_stage_replicates(np.stack([ha - hb, ha - hb]), samples=500)[0].std(ddof=1))
    r = paired_comparison(a, b, bootstrap_samples=500, relative_margin=0.1)
    assert r["ni_rel_margin"] == pytest.approx(0.1 * hb.mean()) and "ni_p" not in r and "non_inferior_rel" in r
    assert paired_comparison(a, [], bootstrap_samples=10) == {}
    with pytest.raises(ValueError, match="same evaluation users"):
        paired_comparison([a[0], _cell("abpo", 1, [1, 2])], [b[0], _cell("none", 1, [3, 4])], bootstrap_samples=10)


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.03, 0.04 with m = 4: 0.04, 0.06, 0.06 (monotone), 0.06; NaN is outside the family
    assert holm([0.03, 0.01, float("nan"), 0.04, 0.02]) == pytest.approx(
        [0.06, 0.04, float("nan"), 0.06, 0.06], nan_ok=True
    )
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []
    assert holm([0.001]) == pytest.approx([0.001])


def test_two_stage_bootstrap_is_seeded_and_its_p_inverts_the_interval():
    rng = np.random.default_rng(2)
    d = 0.03 + rng.normal(0, 0.02, size=(5, 1)) + rng.normal(0, 0.3, size=(5, 200))
    t = two_stage_bootstrap(d, samples=1000, seed=4)
    assert t == two_stage_bootstrap(d, samples=1000, seed=4)
    assert t["diff"] == pytest.approx(d.mean()) and t["ci_low"] < t["diff"] < t["ci_high"]
    assert (t["p"] < 0.05) == (t["ci_low"] > 0 or t["ci_high"] < 0)
    rep = two_stage_replicates(d, samples=1000, seed=4)
    assert t["se"] == pytest.approx(rep.std(ddof=1))
    assert percentile_p_value(np.array([-1.0, 1.0, 2.0, 3.0])) == pytest.approx(0.5)  # 2 * min(1/4, 3/4)
    assert percentile_p_value(np.array([1.0, 2.0])) == 0.0
    # the stacked draws are the same draws: each slice equals its own run
    both = two_stage_replicates(np.stack([d, 2 * d]), samples=200, seed=1)
    assert both[1] == pytest.approx(2 * both[0]) and both[0] == pytest.approx(
        two_stage_replicates(d, samples=200, seed=1)
    )
    assert math.isnan(two_stage_bootstrap(np.zeros((0, 3)), samples=10)["p"])


def test_two_stage_interval_covers_with_seed_shifts_where_the_user_bootstrap_does_not():
    """Per-seed shifts (sd 0.05) on per-user noise (sd 0.4), 10 seeds x 60 users, true Δ = 0.02: the two-stage
    95% interval covers Δ in about 95% of replications (a little more: resampling users inside resampled seeds
    counts the user noise twice), the user-only cluster bootstrap, blind to the seed variance, in about 81%."""
    rng = np.random.default_rng(5)
    reps, true = 400, 0.02
    two, users = 0, 0
    for i in range(reps):
        d = true + rng.normal(0, 0.05, size=(10, 1)) + rng.normal(0, 0.4, size=(10, 60))
        t = two_stage_bootstrap(d, samples=400, seed=i)
        two += t["ci_low"] <= true <= t["ci_high"]
        lo, hi = bootstrap_interval(d.mean(axis=0), samples=400, seed=i)
        users += lo <= true <= hi
    assert 0.92 <= two / reps <= 0.995
    assert users / reps < 0.88


def test_bootstrap_non_inferiority_by_hand():
    rep = np.array([-0.03, -0.01, 0.0, 0.01] * 25)
    r = bootstrap_non_inferiority(rep, 0.02)  # P*(Δ* <= -0.02) = 1/4
    assert r["p"] == pytest.approx(0.25) and not r["non_inferior"]
    assert bootstrap_non_inferiority(rep, 0.05) == {"p": 0.0, "non_inferior": True}
    with pytest.raises(ValueError, match="margin"):
        bootstrap_non_inferiority(rep, 0.0)


def test_round_slopes_by_hand_and_the_trend_comparison():
    m = np.array([[[0.0, 1.0]], [[1.0, 1.0]], [[2.0, 1.0]]])  # 3 rounds, 1 seed, 2 users
    assert round_slopes(m).tolist() == [[1.0, 0.0]]
    with pytest.raises(ValueError, match="rounds >= 2"):
        round_slopes(m[:1])

    def cells(row, improve):  # rank 9 -> 1 for a growing share of users as rounds go on (improve) or flat
        return [
            {
                "row": row,
                "seed": s,
                "round": r,
                "users": list(range(40)),
                "ranks": [1 if (improve and u < 10 * r) or (not improve and u < 10) else 9 for u in range(40)],
            }
            for s in (0, 1, 2)
            for r in (1, 2, 3)
        ]

    t = trend_comparison(cells("abpo", True), cells("grpo", False), bootstrap_samples=300)
    assert t["trend_rounds"] == 3 and t["slope_HR@5"] == pytest.approx(0.25)  # 10 more hits of 40 users a round
    assert t["dslope_HR@5"] == pytest.approx(0.25) and t["dslope_p_HR@5"] < 0.05
    assert t["dslope_ci_low_HR@5"] <= 0.25 <= t["dslope_ci_high_HR@5"]
    flat = trend_comparison(cells("grpo", False), bootstrap_samples=100)
    assert flat["slope_HR@5"] == 0.0 and flat["slope_p_HR@5"] == 1.0 and "dslope_HR@5" not in flat
    assert trend_comparison([c for c in cells("abpo", True) if c["round"] == 1]) == {}
