"""Every statistic of abpo.abtest.stats against an independent implementation (statsmodels, scipy, numpy)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats as sst
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint, proportions_ztest

from abpo.abtest import stats


def _random_cases(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        na, nb = rng.integers(1, 200_000, size=2)
        pa, pb = rng.uniform(0.0, 0.3, size=2)
        if rng.random() < 0.3:  # near-equal rates, so that many cases are not significant
            pb = pa
        xa, xb = rng.binomial(na, pa), rng.binomial(nb, pb)
        yield int(xa), int(na), int(xb), int(nb)


@pytest.mark.parametrize("case", list(_random_cases(300)))
def test_ztest_matches_statsmodels_pooled(case):
    xa, na, xb, nb = case
    t = stats.two_proportion_ztest(xa, na, xb, nb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        z_ref, p_ref = proportions_ztest([xa, xb], [na, nb])
    if math.isnan(z_ref):
        assert not t.defined
        return
    assert t.z == pytest.approx(z_ref, rel=1e-9, abs=1e-12)
    assert t.p == pytest.approx(p_ref, rel=1e-7, abs=1e-300)
    assert t.diff == pytest.approx(xa / na - xb / nb)
    assert t.diff_pp == pytest.approx(100 * (xa / na - xb / nb))


@pytest.mark.parametrize("case", list(_random_cases(50, seed=1)))
def test_difference_ci_matches_statsmodels_wald(case):
    xa, na, xb, nb = case
    t = stats.two_proportion_ztest(xa, na, xb, nb, confidence=0.95)
    lo, hi = confint_proportions_2indep(xa, na, xb, nb, method="wald", compare="diff", alpha=0.05)
    assert (t.ci_low, t.ci_high) == pytest.approx((lo, hi), rel=1e-9, abs=1e-12)


def test_ztest_textbook_value():
    # 200/1000 vs 150/1000: p_pool = 0.175, SE = sqrt(.175*.825*(2/1000)) = 0.016992, z = 0.05/SE = 2.94
    t = stats.two_proportion_ztest(200, 1000, 150, 1000)
    assert t.se == pytest.approx(math.sqrt(0.175 * 0.825 * 0.002))
    assert stats.format_z(t.z) == "2.94"
    assert t.p == pytest.approx(2 * sst.norm.sf(0.05 / math.sqrt(0.175 * 0.825 * 0.002)))
    assert stats.format_p(t.p) == "0.003"


def test_zero_clicks_both_sides_is_undefined_not_a_crash():
    t = stats.two_proportion_ztest(0, 1000, 0, 800)
    assert not t.defined and math.isnan(t.p)
    assert t.diff == 0.0 and "no clicks" in t.note
    assert stats.format_z(t.z) == "n/a" and stats.format_p(t.p) == "n/a"


def test_zero_clicks_one_side_is_a_valid_test():
    t = stats.two_proportion_ztest(0, 1000, 12, 1000)
    z_ref, p_ref = proportions_ztest([0, 12], [1000, 1000])
    assert t.z == pytest.approx(z_ref) and t.p == pytest.approx(p_ref)
    assert t.z < 0


def test_all_clicked_both_sides_is_undefined():
    t = stats.two_proportion_ztest(10, 10, 5, 5)
    assert not t.defined and "every impression clicked" in t.note


def test_zero_impressions_is_undefined_with_note():
    t = stats.two_proportion_ztest(0, 0, 3, 100)
    assert not t.defined and math.isnan(t.diff) and "no impressions on the first side" in t.note
    assert math.isnan(stats.ctr(0, 0))


def test_invalid_counts_raise():
    with pytest.raises(ValueError, match="clicks exceed impressions"):
        stats.two_proportion_ztest(11, 10, 1, 10)
    with pytest.raises(ValueError, match="must be >= 0"):
        stats.two_proportion_ztest(-1, 10, 1, 10)


@pytest.mark.parametrize(
    "p,shown",
    [(0.0, "<0.001"), (0.000999, "<0.001"), (0.001, "0.001"), (0.0494, "0.049"), (1.0, "1.000"), (math.nan, "n/a")],
)
def test_format_p(p, shown):
    assert stats.format_p(p) == shown


def test_format_z_two_decimals():
    assert stats.format_z(1.959963) == "1.96" and stats.format_z(-0.004) == "-0.00"


@pytest.mark.parametrize("x,n", [(0, 50), (3, 50), (50, 50), (123, 10_000)])
def test_wilson_matches_statsmodels(x, n):
    lo, hi = stats.wilson_interval(x, n, 0.95)
    ref = proportion_confint(x, n, alpha=0.05, method="wilson")
    assert (lo, hi) == pytest.approx(ref, abs=1e-12)
    assert hi > 0  # not collapsed at zero clicks


def test_z_critical():
    assert stats.z_critical(0.95) == pytest.approx(1.959963985)
    with pytest.raises(ValueError):
        stats.z_critical(1.0)


# ---- user-clustered (delta method) ----


def _users(rng, n_users, mean_imps, ctr_alpha, ctr_beta):
    """Per-user impressions Y_u >= 1 and clicks X_u ~ Bin(Y_u, q_u), q_u ~ Beta (heterogeneous users)."""
    y = rng.poisson(mean_imps - 1, size=n_users) + 1
    q = rng.beta(ctr_alpha, ctr_beta, size=n_users)
    x = rng.binomial(y, q)
    return x, y


def _moments(x, y) -> stats.UserMoments:
    x, y = np.asarray(x, float), np.asarray(y, float)
    return stats.UserMoments(len(x), x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())


def test_delta_method_equals_cluster_robust_ols():
    """Var(R) by the delta method = statsmodels' cluster-robust (CR0) variance of the mean click of the
    impression-level rows, times the n/(n-1) small-sample factor of the sample variance."""
    import statsmodels.api as sm

    rng = np.random.default_rng(3)
    x, y = _users(rng, 300, 8, 2.0, 20.0)
    user = np.repeat(np.arange(len(y)), y)
    clicks = np.concatenate([np.r_[np.ones(xi), np.zeros(yi - xi)] for xi, yi in zip(x, y)])
    fit = sm.OLS(clicks, np.ones((len(clicks), 1))).fit(
        cov_type="cluster", cov_kwds={"groups": user, "use_correction": False}
    )
    n = len(y)
    var = stats.delta_method_ctr_variance(_moments(x, y))
    assert fit.params[0] == pytest.approx(x.sum() / y.sum())
    assert var == pytest.approx(fit.bse[0] ** 2 * n / (n - 1), rel=1e-9)


def test_delta_method_with_one_impression_per_user_is_the_bernoulli_variance():
    x = np.array([1] * 30 + [0] * 70)
    m = _moments(x, np.ones(100))
    assert stats.delta_method_ctr_variance(m) == pytest.approx(np.var(x, ddof=1) / 100)


def test_delta_method_direct_formula():
    rng = np.random.default_rng(5)
    x, y = _users(rng, 500, 5, 1.0, 10.0)
    r = x.sum() / y.sum()
    n = len(x)
    direct = (np.var(x, ddof=1) - 2 * r * np.cov(x, y, ddof=1)[0, 1] + r * r * np.var(y, ddof=1)) / (n * y.mean() ** 2)
    assert stats.delta_method_ctr_variance(_moments(x, y)) == pytest.approx(direct, rel=1e-9)


def test_clustered_test_undefined_with_one_user():
    one = stats.UserMoments(1, 3, 10, 9, 100, 30)
    many = stats.UserMoments(10, 5, 50, 5, 250, 25)
    t = stats.clustered_ztest(one, many)
    assert not t.defined and "fewer than 2 users" in t.note and "first" in t.note


def test_clustered_test_keeps_nominal_size_where_impression_test_does_not():
    """A/A simulation with heterogeneous users (heavy clustering): the impression-level test rejects far
    more often than 5%, the user-clustered test stays close to 5%."""
    rng = np.random.default_rng(11)
    reps, rej_imp, rej_clu = 400, 0, 0
    for _ in range(reps):
        xa, ya = _users(rng, 150, 20, 0.5, 5.0)
        xb, yb = _users(rng, 150, 20, 0.5, 5.0)
        t = stats.two_proportion_ztest(int(xa.sum()), int(ya.sum()), int(xb.sum()), int(yb.sum()))
        c = stats.clustered_ztest(_moments(xa, ya), _moments(xb, yb))
        rej_imp += t.p < 0.05
        rej_clu += c.p < 0.05
    assert rej_imp / reps > 0.25
    assert 0.02 <= rej_clu / reps <= 0.09


def test_clustered_ci_contains_diff_and_is_symmetric():
    rng = np.random.default_rng(2)
    a, b = _moments(*_users(rng, 200, 6, 2, 30)), _moments(*_users(rng, 200, 6, 2, 20))
    c = stats.clustered_ztest(a, b, 0.9)
    assert c.ci_low < c.diff < c.ci_high
    assert c.diff - c.ci_low == pytest.approx(stats.z_critical(0.9) * c.se)


# ---- Holm ----


@pytest.mark.parametrize("seed", range(20))
def test_holm_matches_statsmodels(seed):
    rng = np.random.default_rng(seed)
    p = list(rng.uniform(0, 0.1, size=int(rng.integers(1, 6))) ** 2)
    ref = multipletests(p, method="holm")[1]
    assert stats.holm_adjust(p) == pytest.approx(list(ref))


def test_holm_skips_undefined_tests():
    adj = stats.holm_adjust([0.01, math.nan, 0.04])
    assert math.isnan(adj[1])
    assert adj[0] == pytest.approx(0.02) and adj[2] == pytest.approx(0.04)


# ---- sample-ratio mismatch ----


def test_srm_matches_scipy_chisquare_unequal_shares():
    shares = {"abpo": 0.5, "grpo": 0.2, "ml_retrain": 0.2, "popularity": 0.1}
    obs = {"abpo": 5100, "grpo": 1950, "ml_retrain": 2010, "popularity": 940}
    r = stats.srm_test(obs, shares)
    total = sum(obs.values())
    ref = sst.chisquare([obs[a] for a in r.arms], [total * shares[a] for a in r.arms])
    assert r.chi2 == pytest.approx(ref.statistic) and r.p == pytest.approx(ref.pvalue)
    assert r.dof == 3 and not r.mismatch


def test_srm_flags_an_equal_split_against_unequal_shares():
    r = stats.srm_test({"abpo": 5000, "grpo": 5000}, {"abpo": 0.7, "grpo": 0.3})
    assert r.mismatch and r.p < 0.001
    ok = stats.srm_test({"abpo": 7000, "grpo": 3000}, {"abpo": 0.7, "grpo": 0.3})
    assert not ok.mismatch and ok.chi2 == pytest.approx(0.0)


def test_srm_arm_without_share_is_excluded_and_said():
    r = stats.srm_test({"abpo": 100, "grpo": 100, "new_arm": 5}, {"abpo": 0.5, "grpo": 0.5})
    assert r.excluded == ["new_arm"] and "new_arm" in r.note and r.arms == ["abpo", "grpo"]


def test_srm_single_arm_is_undefined():
    r = stats.srm_test({"abpo": 100}, {"abpo": 0.5, "grpo": 0.5})
    assert math.isnan(r.p) and not r.mismatch and "undefined" in r.note


def test_mde_is_the_textbook_formula():
    """MDE = (z_{1-alpha/2} + z_power) x the pooled SE; statsmodels' power solver gives the same effect size."""
    from statsmodels.stats.power import NormalIndPower

    t = stats.two_proportion_ztest(500, 5000, 450, 4000, confidence=0.95, power=0.8)
    assert t.mde == pytest.approx((1.959964 + 0.841621) * t.se, rel=1e-6)
    # statsmodels solves for Cohen's effect size of a normal test with equal n: MDE / sqrt(p(1-p)) there
    u = stats.two_proportion_ztest(300, 3000, 290, 3000, confidence=0.9, power=0.9)
    p = 590 / 6000
    es = NormalIndPower().solve_power(nobs1=3000, ratio=1.0, alpha=0.1, power=0.9, alternative="two-sided")
    assert u.mde == pytest.approx(es * math.sqrt(p * (1 - p)), rel=2e-3)  # they also count the far tail
    assert math.isnan(stats.two_proportion_ztest(0, 0, 3, 10).mde)
    with pytest.raises(ValueError, match="report.power"):
        stats.minimum_detectable_effect(0.01, 0.95, 1.0)


def test_mde_gives_its_power_in_simulation():
    """Binomial arms that differ by exactly the MDE are detected in about 80% of 4,000 simulated experiments
    (tolerance 3 standard errors of a proportion: 0.019)."""
    rng = np.random.default_rng(11)
    n, p = 4000, 0.12
    mde = stats.minimum_detectable_effect(math.sqrt(p * (1 - p) * 2 / n), 0.95, 0.8)
    xa = rng.binomial(n, p + mde / 2, size=4000)
    xb = rng.binomial(n, p - mde / 2, size=4000)
    rejected = np.mean([stats.two_proportion_ztest(int(a), n, int(b), n).p < 0.05 for a, b in zip(xa, xb)])
    assert abs(rejected - 0.8) < 3 * math.sqrt(0.8 * 0.2 / 4000), rejected


def test_clustered_mde_gives_its_power_in_simulation():
    """The user-clustered MDE (delta-method SE) holds its power when users differ in CTR and in how many requests
    they make: arms 0.8 x MDE and exactly MDE apart, 1,500 simulated experiments each."""
    rng = np.random.default_rng(5)
    users, base = 400, 0.15

    def arm(ctr_shift):
        y = rng.integers(1, 15, size=users)
        rate = np.clip(rng.beta(2, 2 / base - 2, size=users) + ctr_shift, 0, 1)  # heterogeneous users, mean base
        return _moments(rng.binomial(y, rate), y)

    mde = np.mean([stats.clustered_ztest(arm(0.0), arm(0.0)).mde for _ in range(300)])
    for shift, want in ((mde, 0.8), (0.8 * mde, None)):
        rej = np.mean([stats.clustered_ztest(arm(shift / 2), arm(-shift / 2)).p < 0.05 for _ in range(1500)])
        if want is not None:
            assert abs(rej - want) < 3 * math.sqrt(0.16 / 1500) + 0.01, (shift, rej)
        else:
            assert rej < 0.8 - 0.05  # a smaller effect is detected less often
