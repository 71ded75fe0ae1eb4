"""abpo.experiment.stats: the cluster bootstrap, the MDE equation, the non-inferiority test and the paired
comparison, each against a hand computation or a simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from abpo.experiment.stats import (
    bootstrap_interval,
    hits_and_gains,
    minimum_detectable_effect,
    non_inferiority,
    paired_comparison,
    standard_error,
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
    assert {"ni_margin", "ni_p", "non_inferior", "ci_low_NDCG@5", "ci_high_NDCG@5"} <= set(t)
    assert paired_comparison(a, [], bootstrap_samples=10) == {}
    with pytest.raises(ValueError, match="same evaluation users"):
        paired_comparison([a[0], _cell("abpo", 1, [1, 2])], [b[0], _cell("none", 1, [3, 4])], bootstrap_samples=10)
