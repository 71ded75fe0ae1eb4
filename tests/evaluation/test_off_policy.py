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


# ---- the doubly robust family: DM, IPS, SNIPS, DR, SNDR, Switch-DR over the target's whole distribution ----


def _hand_rows():
    """3 rows of 2 candidates. w = [0.8/0.5, 0.5/0.25, 1/0.4] = [1.6, 2, 2.5]; q_i(pi) = [0.54, 0.3, 0.5];
    q_i = q(x_i, a_i) = [0.6, 0.4, 0.5]; y - q_i = [0.4, -0.4, -0.5]; w (y - q_i) = [0.64, -0.8, -1.25]."""
    y = [1, 0, 0]
    e0 = [0.5, 0.25, 0.4]
    a = np.array([0, 1, 0])
    pi = np.array([[0.8, 0.2], [0.5, 0.5], [1.0, 0.0]])
    q = np.array([[0.6, 0.3], [0.2, 0.4], [0.5, 0.1]])
    return y, e0, a, pi, q


def test_doubly_robust_family_hand_example():
    from abpo.evaluation.off_policy import ope_estimates

    y, e0, a, pi, q = _hand_rows()
    est = ope_estimates(y, e0, a, pi, q, n_boot=0, switch_lambda=2.0)
    assert est["dm"].value == pytest.approx(1.34 / 3)  # (0.54 + 0.3 + 0.5) / 3
    assert est["ips"].value == pytest.approx(1.6 / 3)  # w y = [1.6, 0, 0]
    assert est["snips"].value == pytest.approx(1.6 / 6.1)  # sum w = 6.1
    assert est["dr"].value == pytest.approx((1.34 - 1.41) / 3)  # sum w (y - q_i) = -1.41
    assert est["sndr"].value == pytest.approx(1.34 / 3 - 1.41 / 6.1)
    assert est["switch_dr"].value == pytest.approx((1.34 + 0.64 - 0.8) / 3)  # row 3 (w = 2.5 > 2) falls back to DM
    assert all(math.isnan(e.ci_low) and e.n == 3 and e.n_groups == 3 for e in est.values())


def test_ips_and_snips_agree_with_off_policy_ctr():
    from abpo.evaluation.off_policy import ope_estimates

    y, e0, a, pi, q = _hand_rows()
    est = ope_estimates(y, e0, a, pi, q, n_boot=0)
    old = off_policy_ctr(y, e0, pi[np.arange(3), a])
    assert est["ips"].value == pytest.approx(old.ips) and est["snips"].value == pytest.approx(old.snips)


def test_identities_of_the_doubly_robust_family():
    from abpo.evaluation.off_policy import ope_estimates

    y, e0, a, pi, q = _hand_rows()
    # q = 0: DR is IPS, SNDR is SNIPS, DM is 0
    zero = ope_estimates(y, e0, a, pi, np.zeros_like(q), n_boot=0)
    assert zero["dr"].value == pytest.approx(zero["ips"].value)
    assert zero["sndr"].value == pytest.approx(zero["snips"].value) and zero["dm"].value == 0
    # Switch-DR: lam = inf is DR, lam = 0 is DM (every w > 0)
    inf = ope_estimates(y, e0, a, pi, q, n_boot=0)
    assert inf["switch_dr"].value == pytest.approx(inf["dr"].value)
    lam0 = ope_estimates(y, e0, a, pi, q, n_boot=0, switch_lambda=0.0)
    assert lam0["switch_dr"].value == pytest.approx(lam0["dm"].value)
    # the target puts all its mass off the logged items: w = 0, DR is DM, the self-normalised ones are undefined
    off = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    est = ope_estimates(y, e0, a, off, q, n_boot=0)
    assert est["dr"].value == pytest.approx(est["dm"].value) == pytest.approx((0.3 + 0.2 + 0.1) / 3)
    assert est["ips"].value == 0 and math.isnan(est["snips"].value) and math.isnan(est["sndr"].value)
    # every w = 1 (the target is the logging policy on the logged items): SNIPS = IPS = the mean click and
    # SNDR = DR = DM + mean(y - q_i) (the self-normalisation divides by mean w = 1)
    e0_same = pi[np.arange(3), a]
    same = ope_estimates(y, e0_same, a, pi, q, n_boot=0)
    assert same["ips"].value == pytest.approx(1 / 3) and same["snips"].value == pytest.approx(1 / 3)
    assert same["dr"].value == pytest.approx(same["sndr"].value) == pytest.approx((1.34 + 0.4 - 0.4 - 0.5) / 3)


def test_sndr_is_invariant_to_scaling_the_weights():
    # SNDR's correction term is sum w r / sum w: scaling every e0 by c (w by 1/c) leaves it unchanged; DR's moves
    from abpo.evaluation.off_policy import ope_estimates

    y, e0, a, pi, q = _hand_rows()
    base = ope_estimates(y, e0, a, pi, q, n_boot=0)
    half = ope_estimates(y, np.asarray(e0) * 0.4, a, pi, q, n_boot=0)
    assert half["sndr"].value == pytest.approx(base["sndr"].value)
    assert half["snips"].value == pytest.approx(base["snips"].value)
    assert half["dr"].value != pytest.approx(base["dr"].value)


def test_bootstrap_intervals_are_seeded_and_cluster_on_groups():
    from abpo.evaluation.off_policy import ope_estimates

    rng = np.random.default_rng(1)
    n, k = 600, 4
    pi = rng.dirichlet(np.ones(k), size=n)
    a = rng.integers(0, k, size=n)
    e0 = np.full(n, 1 / k)
    q = rng.uniform(0.05, 0.3, size=(n, k))
    y = (rng.random(n) < q[np.arange(n), a]).astype(int)
    one = ope_estimates(y, e0, a, pi, q, n_boot=400, seed=3)
    assert one == ope_estimates(y, e0, a, pi, q, n_boot=400, seed=3)
    assert one["dr"] == ope_estimates(y, e0, a, pi, q, n_boot=400, seed=3, groups=np.arange(n))["dr"]
    for e in one.values():
        assert e.ci_low < e.value < e.ci_high and e.boot_se > 0 and e.n_boot == 400
    # DM's interval is the narrowest (q is fixed), IPS's among the widest
    width = {name: e.ci_high - e.ci_low for name, e in one.items()}
    assert width["dm"] < width["dr"] < width["ips"]
    # rows in clusters of 3 (a user's rows): 200 units resampled; the interval is of the same order
    grouped = ope_estimates(y, e0, a, pi, q, n_boot=400, seed=3, groups=np.arange(n) // 3)
    assert grouped["dr"].n_groups == 200 and grouped["dr"].value == pytest.approx(one["dr"].value)
    assert 0.5 < (grouped["dr"].ci_high - grouped["dr"].ci_low) / width["dr"] < 2


def test_compare_ope_is_a_paired_difference():
    from abpo.evaluation.off_policy import compare_ope, ope_estimates

    rng = np.random.default_rng(2)
    n, k = 500, 3
    pi_new = rng.dirichlet(np.ones(k), size=n)
    pi_old = rng.dirichlet(np.ones(k), size=n)
    a = rng.integers(0, k, size=n)
    e0 = np.full(n, 1 / k)
    q = rng.uniform(0.05, 0.3, size=(n, k))
    y = (rng.random(n) < q[np.arange(n), a]).astype(int)
    cmp = compare_ope(y, e0, a, pi_new, pi_old, q, n_boot=300, seed=0)
    new = ope_estimates(y, e0, a, pi_new, q, n_boot=300, seed=0)
    for name, c in cmp.items():
        assert c.diff == pytest.approx(c.challenger.value - c.champion.value)
        assert c.challenger.value == pytest.approx(new[name].value)
        assert c.challenger.ci_low == pytest.approx(new[name].ci_low)  # the same resamples
        assert c.ci_low <= c.diff <= c.ci_high
    itself = compare_ope(y, e0, a, pi_old, pi_old, q, n_boot=100)
    for c in itself.values():  # zero up to the floating-point order of the resamples' sums
        assert c.diff == 0 and abs(c.ci_low) < 1e-12 and abs(c.ci_high) < 1e-12


def test_doubly_robust_family_validation_names_the_row_and_rule():
    from abpo.evaluation.off_policy import ope_estimates

    y, e0, a, pi, q = _hand_rows()
    with pytest.raises(ValueError, match=r"target\[1\] sums to 0.90000000; rule: a distribution"):
        ope_estimates(y, e0, a, np.array([[0.8, 0.2], [0.5, 0.4], [1.0, 0.0]]), q, n_boot=0)
    with pytest.raises(ValueError, match=r"logged_index\[2\] = 2; rule: 0 <= index < 2 candidates"):
        ope_estimates(y, e0, np.array([0, 1, 2]), pi, q, n_boot=0)
    with pytest.raises(ValueError, match=r"q_hat\[0, 1\] = 1.5; rule: a click probability"):
        ope_estimates(y, e0, a, pi, np.array([[0.6, 1.5], [0.2, 0.4], [0.5, 0.1]]), n_boot=0)
    with pytest.raises(ValueError, match=r"clicked\[0\] = 2.0"):
        ope_estimates([2, 0, 0], e0, a, pi, q, n_boot=0)
    with pytest.raises(ValueError, match=r"estimators \['switch'\]"):
        ope_estimates(y, e0, a, pi, q, estimators=["switch"])


def test_pad_rows():
    from abpo.evaluation.off_policy import pad_rows

    padded, mask = pad_rows([[0.5, 0.5], [1.0], [0.2, 0.3, 0.5]])
    assert padded.tolist() == [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]
    assert mask.sum(axis=1).tolist() == [2, 1, 3]


def _environment(seed: int = 0):
    """A finite synthetic environment: 40 requests of 5 candidates out of 30 items; true CTR
    p(x, a) = sigmoid(-1.8 + theta_a + 0.6 u_x); the logging policy softmax(0.5 theta + fixed noise), the target
    softmax(2 theta) (greedier for appealing items). The true value of the target is exact: mean_x sum_a pi p."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(0, 0.8, size=30)
    u = rng.normal(0, 1, size=40)
    cands = np.stack([rng.choice(30, size=5, replace=False) for _ in range(40)])
    p = 1 / (1 + np.exp(-(-1.8 + theta[cands] + 0.6 * u[:, None])))

    def softmax(t):
        e = np.exp(t - t.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    e0 = softmax(0.5 * theta[cands] + rng.normal(0, 0.5, size=cands.shape))
    pi = softmax(2.0 * theta[cands])
    return theta, u, cands, p, e0, pi, float((pi * p).sum(axis=1).mean())


def test_every_estimator_is_unbiased_on_simulated_logs_and_dr_survives_a_wrong_reward_model():
    """200 logs of 400 rows from the environment: with a well-specified cross-fitted q every estimator's mean is
    within 4 standard errors of the true value; with a q that ignores the item (misspecified), DM is far off while
    IPS, SNIPS, DR and SNDR still hold (double robustness: the propensities are right)."""
    from abpo.evaluation.off_policy import ope_estimates
    from abpo.evaluation.reward_model import cross_fitted_rewards

    theta, u, cands, p, e0, pi, truth = _environment()
    assert truth - float((e0 * p).sum(axis=1).mean()) > 0.05  # power: the logged CTR (0.196) is far from 0.255
    rng = np.random.default_rng(7)
    n, reps = 400, 200
    right, wrong = [], []
    for r in range(reps):
        x = rng.integers(0, 40, size=n)
        cum = e0[x].cumsum(axis=1)
        a = np.minimum((rng.random(n)[:, None] > cum).sum(axis=1), 4)
        y = (rng.random(n) < p[x, a]).astype(int)
        mask = np.ones((n, 5), dtype=bool)
        good = np.stack([theta[cands[x]], np.broadcast_to(u[x][:, None], (n, 5))], axis=-1)
        bad = np.broadcast_to(u[x][:, None, None], (n, 5, 1))
        for feats, out in ((good, right), (bad, wrong)):
            q = cross_fitted_rewards(feats, mask, a, y, n_folds=5, seed=r, l2=1e-3).q_hat
            est = ope_estimates(y, e0[x, a], a, pi[x], q, n_boot=0, switch_lambda=5.0)
            out.append([est[k].value for k in ("dm", "ips", "snips", "dr", "sndr", "switch_dr")])
    right_a, wrong_a = np.array(right), np.array(wrong)
    for name, col_r, col_w in zip(("dm", "ips", "snips", "dr", "sndr", "switch_dr"), right_a.T, wrong_a.T, strict=True):
        se = col_r.std(ddof=1) / math.sqrt(reps)
        assert abs(col_r.mean() - truth) < 4 * se, (name, col_r.mean(), truth, se)
        if name in ("ips", "snips", "dr", "sndr"):
            se_w = col_w.std(ddof=1) / math.sqrt(reps)
            assert abs(col_w.mean() - truth) < 4 * se_w, (name, "wrong q", col_w.mean(), truth, se_w)
    dm_wrong = wrong_a[:, 0]
    assert abs(dm_wrong.mean() - truth) > 10 * dm_wrong.std(ddof=1) / math.sqrt(reps)  # DM has no such protection
    # the doubly robust estimate with the right q is less variable than IPS
    assert right_a[:, 3].std() < right_a[:, 1].std()


def test_compare_ope_on_logs_finds_a_better_challenger_with_ragged_candidate_sets():
    """One log of 3000 rows from the environment, 1 in 5 rows with its last candidate dropped (ragged sets), the
    users' rows clustered; the challenger is the environment's target (greedier for appealing items), the champion
    the logging policy. The true difference is known exactly; each estimator's 95 % interval holds it here, and the
    doubly robust ones exclude 0."""
    from abpo.evaluation.off_policy import compare_ope_on_logs

    theta, u, cands, p, e0, pi, truth = _environment()
    rng = np.random.default_rng(11)
    n = 3000
    x = rng.integers(0, 40, size=n)
    short = rng.random(n) < 0.2
    cand_rows, e0_rows, pi_rows, items, y = [], [], [], [], []
    for i in range(n):
        k = 4 if short[i] else 5
        e, t = e0[x[i], :k] / e0[x[i], :k].sum(), pi[x[i], :k] / pi[x[i], :k].sum()
        a = rng.choice(k, p=e)
        cand_rows.append(cands[x[i], :k].tolist())
        e0_rows.append(e)
        pi_rows.append(t)
        items.append(int(cands[x[i], a]))
        y.append(int(rng.random() < p[x[i], a]))
    # the truth under the same mix of full and shortened sets
    true_diff = 0.0
    for k, share in ((5, 0.8), (4, 0.2)):
        e = e0[:, :k] / e0[:, :k].sum(axis=1, keepdims=True)
        t = pi[:, :k] / pi[:, :k].sum(axis=1, keepdims=True)
        true_diff += share * float(((t - e) * p[:, :k]).sum(axis=1).mean())
    logged_e0 = [float(e0_rows[i][cand_rows[i].index(items[i])]) for i in range(n)]
    cmp = compare_ope_on_logs(
        cand_rows,
        items,
        history_lengths=(u[x] * 3 + 10).round().clip(0).astype(int).tolist(),
        clicked=y,
        logging_propensity=logged_e0,
        challenger=pi_rows,
        champion=e0_rows,
        groups=x // 2,  # 20 "users" of two request types each
        n_boot=500,
        seed=0,
    )
    assert true_diff > 0.04
    for name in ("ips", "snips", "dr", "sndr"):
        c = cmp[name]
        assert c.ci_low < true_diff < c.ci_high, (name, c.ci_low, true_diff, c.ci_high)
        assert c.challenger.n_groups == 20 and c.challenger.n == n
    assert cmp["dr"].ci_low > 0 and cmp["sndr"].ci_low > 0
    assert cmp["snips"].champion.value == pytest.approx(np.mean(y))  # the logging policy's weights are all 1
