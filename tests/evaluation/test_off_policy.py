"""IPS / SNIPS estimates of a target policy's CTR from logged propensities."""

import math

import numpy as np
import pytest

from abpo.evaluation.off_policy import off_policy_ctr


def test_hand_example():
    # w = e_pi / e0 = [0.25/0.5, 0.5/0.25, 0.4/0.2, 0.5/0.5] = [0.5, 2, 2, 1];  w y = [0.5, 0, 2, 0]
    # IPS = 2.5 / 4 = 0.625;  SNIPS = 2.5 / 5.5 = 0.4545455;  ESS = 5.5^2 / (0.25 + 4 + 4 + 1) = 30.25/9.25
    # IPS se = std([0.5, 0, 2, 0], ddof=1) / 2 = sqrt(2.6875 / 3) / 2 = 0.4732424
    # SNIPS se = sqrt(0.25*(6/11)^2 + 4*(5/11)^2 + 4*(6/11)^2 + 1*(5/11)^2) / 5.5 = sqrt(2.2975207) / 5.5
    est = off_policy_ctr([1, 0, 1, 0], [0.5, 0.25, 0.2, 0.5], [0.25, 0.5, 0.4, 0.5])
    assert est.n == 4 and est.logged_ctr == 0.5 and est.max_weight == 2.0
    assert est.ips == pytest.approx(0.625)
    assert est.snips == pytest.approx(2.5 / 5.5)
    assert est.ess == pytest.approx(30.25 / 9.25)
    assert est.ips_se == pytest.approx(math.sqrt(2.6875 / 3) / 2)
    snips_var = 0.25 * (6 / 11) ** 2 + 4 * (5 / 11) ** 2 + 4 * (6 / 11) ** 2 + 1 * (5 / 11) ** 2
    assert est.snips_se == pytest.approx(math.sqrt(snips_var) / 5.5)


def test_target_equal_to_logging_policy_gives_the_logged_ctr():
    est = off_policy_ctr([1, 0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5])
    assert est.ips == est.snips == est.logged_ctr == pytest.approx(0.6)
    assert est.ess == pytest.approx(5.0)


def test_monte_carlo_recovers_the_target_policys_ctr():
    # context-free bandit over 5 items: logging e0, target e_pi, click probabilities ctr
    rng = np.random.default_rng(0)
    e0 = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    e_pi = np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    ctr = np.array([0.02, 0.05, 0.1, 0.2, 0.3])
    true_target = float(e_pi @ ctr)  # 0.001 + 0.005 + 0.015 + 0.06 + 0.12 = 0.201
    n = 200_000
    a = rng.choice(5, size=n, p=e0)
    y = (rng.random(n) < ctr[a]).astype(int)
    est = off_policy_ctr(y, e0[a], e_pi[a])
    assert abs(est.ips - true_target) < 4 * est.ips_se
    assert abs(est.snips - true_target) < 4 * est.snips_se
    # power: the naive logged CTR (0.061) is far from the target's 0.201
    assert abs(est.logged_ctr - true_target) > 20 * est.snips_se


def test_validation_names_the_row_and_rule():
    with pytest.raises(ValueError, match=r"logging_propensity\[1\] = 0.0; rule: 0 < p <= 1"):
        off_policy_ctr([1, 0], [0.5, 0.0], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"clicked\[0\] = 2.0; rule: clicked is 0 or 1"):
        off_policy_ctr([2, 0], [0.5, 0.5], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"target_propensity\[1\]"):
        off_policy_ctr([1, 0], [0.5, 0.5], [0.5, 1.5])
    with pytest.raises(ValueError, match="one of each per impression"):
        off_policy_ctr([1, 0], [0.5], [0.5, 0.5])
    with pytest.raises(ValueError, match="no impressions"):
        off_policy_ctr([], [], [])


def test_target_that_never_picks_a_logged_item():
    est = off_policy_ctr([1, 0], [0.5, 0.5], [0.0, 0.0])
    assert est.ips == 0.0 and math.isnan(est.snips) and est.ess == 0.0


def test_compare_snips_difference_and_bootstrap_interval():
    import numpy as np

    from abpo.evaluation.off_policy import compare_snips

    rng = np.random.default_rng(0)
    n = 2000
    e0 = np.full(n, 0.25)
    y = (rng.random(n) < 0.2).astype(int)
    same = compare_snips(y, e0, e0, e0, n_boot=300)
    assert same.diff == 0 and same.ci_low == 0 and same.ci_high == 0
    assert same.champion.snips == pytest.approx(y.mean())  # the logging policy's SNIPS is its observed CTR
    # a challenger twice as likely to expose the clicked items and half as likely the others
    better = compare_snips(y, e0, np.where(y == 1, 0.5, 0.125), e0, n_boot=300)
    assert better.diff > 0 and better.ci_low > 0 and better.ci_low < better.diff < better.ci_high
    assert better.challenger.snips == pytest.approx(2 * y.sum() / (2 * y.sum() + 0.5 * (n - y.sum())))
