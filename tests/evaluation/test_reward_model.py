"""The cross-fitted logistic reward model of the doubly robust off-policy estimators."""

import numpy as np
import pytest

from abpo.evaluation.reward_model import (
    assign_folds,
    cross_fitted_rewards,
    fit_logistic,
    reward_features,
)


def test_fit_logistic_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40_000, 2)) * [1.0, 3.0] + [0.0, 5.0]
    logit = -1.0 + 0.8 * x[:, 0] - 0.3 * (x[:, 1] - 5.0)
    y = (rng.random(40_000) < 1 / (1 + np.exp(-logit))).astype(float)
    m = fit_logistic(x, y, l2=1e-3)
    # on the standardised scale the slopes are 0.8 * 1 and -0.3 * 3; back on the raw scale 0.8 and -0.3
    raw = m.coef / m.scale
    assert raw == pytest.approx([0.8, -0.3], abs=0.04)
    assert m.predict(np.array([[0.0, 5.0]]))[0] == pytest.approx(1 / (1 + np.e), abs=0.01)
    assert m.iterations < 20


def test_fit_logistic_stays_finite_without_a_click():
    m = fit_logistic(np.array([[0.0], [1.0], [2.0]]), np.zeros(3))
    q = m.predict(np.array([[1.0]]))
    assert np.isfinite(m.intercept) and 0 <= q[0] < 0.01


def test_fit_logistic_validation():
    with pytest.raises(ValueError, match=r"feature \[1, 0\] = nan; rule: finite"):
        fit_logistic(np.array([[0.0], [np.nan]]), np.zeros(2))
    with pytest.raises(ValueError, match="l2 0; rule: > 0"):
        fit_logistic(np.zeros((2, 1)), np.zeros(2), l2=0)


def test_reward_features_hand_example():
    feats, mask, idx = reward_features(
        candidates=[[10, 11, 12], [11, 13]],
        logged_items=[11, 11],
        history_lengths=[3, 0],
        scores=[[[0.2, 0.5, 0.3], [0.9, 0.1]]],
    )
    assert idx.tolist() == [1, 0] and mask.tolist() == [[True, True, True], [True, True, False]]
    assert feats.shape == (2, 3, 5)
    assert feats[0, :, 0] == pytest.approx(np.log1p([0, 2, 0]))  # item 11 logged twice
    assert feats[0, :, 1] == pytest.approx(np.log1p([3, 3, 3])) and feats[1, :2, 1] == pytest.approx([0, 0])
    assert feats[0, :, 2] == pytest.approx(np.log([3, 3, 3])) and feats[1, :2, 2] == pytest.approx(np.log([2, 2]))
    assert feats[0, :, 3].tolist() == [0.2, 0.5, 0.3] and feats[0, :, 4].tolist() == [1.0, 0.0, 0.5]
    assert feats[1, :2, 4].tolist() == [0.0, 1.0] and not feats[1, 2].any()  # padding stays 0
    with pytest.raises(ValueError, match="row 1: logged item 99 not among its 2 candidates"):
        reward_features([[10, 11], [11, 13]], [10, 99], [1, 1])
    with pytest.raises(ValueError, match=r"row 0: scores\[0\] has 1 values; rule: 2"):
        reward_features([[10, 11]], [10], [1], scores=[[[1.0]]])


def test_assign_folds_balanced_seeded_and_by_group():
    f = assign_folds(103, 5, seed=1)
    assert sorted(np.bincount(f).tolist()) == [20, 20, 21, 21, 21]
    assert (f == assign_folds(103, 5, seed=1)).all() and not (f == assign_folds(103, 5, seed=2)).all()
    groups = np.repeat(np.arange(30), 4)
    g = assign_folds(120, 3, groups=groups, seed=0)
    assert all(len(set(g[groups == u])) == 1 for u in range(30))  # a user's rows share a fold
    assert np.bincount(g).tolist() == [40, 40, 40]
    with pytest.raises(ValueError, match="2 rows or groups for 3 folds"):
        assign_folds(2, 3)


def test_cross_fitting_never_scores_a_row_with_its_own_click():
    rng = np.random.default_rng(0)
    n, k = 300, 4
    feats = rng.normal(size=(n, k, 2))
    mask = np.ones((n, k), dtype=bool)
    mask[::7, 3] = False  # some rows have 3 candidates
    a = rng.integers(0, 3, size=n)
    y = (rng.random(n) < 0.3).astype(int)
    fit = cross_fitted_rewards(feats, mask, a, y, n_folds=5, seed=0)
    assert fit.q_hat.shape == (n, k) and (fit.q_hat[~mask] == 0).all() and (fit.q_hat[mask] > 0).all()
    flipped = y.copy()
    flipped[0] = 1 - flipped[0]
    again = cross_fitted_rewards(feats, mask, a, flipped, n_folds=5, seed=0)
    own = fit.fold == fit.fold[0]
    assert (again.q_hat[own] == fit.q_hat[own]).all()  # row 0's fold: its model never saw row 0
    assert not np.allclose(again.q_hat[~own], fit.q_hat[~own])  # the other folds' models did
    with pytest.raises(ValueError, match="row 7: logged_index 3 is padding"):
        cross_fitted_rewards(feats, mask, np.where(np.arange(n) == 7, 3, a), y)
