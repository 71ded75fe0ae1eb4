"""The reward model q(x, a) ~ P(click | request x, item a) of the doubly robust off-policy estimators
(abpo.evaluation.off_policy: DM, DR, SNDR, Switch-DR), cross-fitted.

Model: an L2-penalised logistic regression on a few features of each (request, candidate) pair,

    q(x, a) = sigmoid(b + sum_f beta_f z_f(x, a)),   z_f = (phi_f - mean_f) / std_f  (the training rows' mean, std)

fitted by Newton's method on the penalised log-likelihood

    sum_i [ y_i log q_i + (1 - y_i) log(1 - q_i) ] - (l2 / 2) (|beta|^2 + 1e-4 b^2)

on the logged pairs (x_i, a_i, y_i) only: a click is observed for the logged item alone. It is numpy and a handful of
coefficients: it runs in milliseconds on a month's rows, needs no GPU and no package beyond the pins (scikit-learn is
not a dependency of abpo). The tiny penalty on the intercept keeps it finite on a fold without a click.

Features (:func:`reward_features`), each per (request, candidate):
    log1p(exposures)     how often the item was the logged item in these logs (its popularity under the logging
                         policies; no click enters it). Cross-fitted too (``candidate_ids``): a fold's rows read the
                         counts of the other folds' logged items, and a training row's count leaves its own out, so
                         no row's features depend on its own logged action (with a count over every row, an item
                         logged once is "exposed" exactly where it was logged: q then depends on a_i, and DR is
                         biased; a test with one-off items showed 4 SE)
    score_s(x, a)        for each policy s given (the challenger's and the champion's propensities, say): its
                         probability of the candidate
    rank_s(x, a)         the candidate's position under s, (r - 1) / (K - 1) in [0, 1] (0: its top candidate)
    log1p(|history|)     the user's history length
    log(K)               the candidate set's size

Cross-fitting (Chernozhukov et al. 2018; obp's RegressionModel.fit_predict with n_folds): the rows are split into
``n_folds`` folds (by ``groups``, a user's rows in one fold, when given), and every row's q over all its candidates
comes from the model fitted on the other folds, so no estimate scores a row with a model that saw its click.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_WHERE = "abpo.evaluation.reward_model"


@dataclass(frozen=True)
class LogisticModel:
    mean: np.ndarray  # (F,) the training features' means
    scale: np.ndarray  # (F,) their stds (1 where a feature is constant)
    coef: np.ndarray  # (F,) beta, on the standardised features
    intercept: float  # b
    iterations: int

    def predict(self, features: np.ndarray) -> np.ndarray:
        """q = sigmoid(b + z . beta) over the last axis of ``features`` (..., F)."""
        z = (np.asarray(features, dtype=np.float64) - self.mean) / self.scale
        return _sigmoid(z @ self.coef + self.intercept)


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * t))  # = 1 / (1 + exp(-t)), without overflow


def fit_logistic(
    features: np.ndarray, clicked: np.ndarray, *, l2: float = 1.0, max_iter: int = 100, tol: float = 1e-10
) -> LogisticModel:
    """The penalised logistic regression of the module docstring, by Newton's method (the penalised objective is
    strictly concave, so it converges; stops when the largest step is below ``tol``)."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(clicked, dtype=np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],) or x.shape[0] == 0:
        raise ValueError(f"{_WHERE}: features {x.shape}, clicks {y.shape}; rule: (rows, F) and (rows,), rows > 0")
    if not np.all(np.isfinite(x)):
        i, f = np.argwhere(~np.isfinite(x))[0]
        raise ValueError(f"{_WHERE}: feature [{i}, {f}] = {x[i, f]}; rule: finite")
    if l2 <= 0:
        raise ValueError(f"{_WHERE}: l2 {l2}; rule: > 0 (the intercept's and the coefficients' penalty)")
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    z = np.hstack([np.ones((x.shape[0], 1)), (x - mean) / scale])
    penalty = np.full(z.shape[1], l2)
    penalty[0] = 1e-4 * l2
    theta = np.zeros(z.shape[1])
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is reported)
        p = _sigmoid(z @ theta)
        grad = z.T @ (y - p) - penalty * theta
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        theta += step
        if np.max(np.abs(step)) < tol:
            break
    return LogisticModel(mean=mean, scale=scale, coef=theta[1:], intercept=float(theta[0]), iterations=it)


def reward_features(
    candidates: Sequence[Sequence[int]],
    logged_items: Sequence[int],
    history_lengths: Sequence[int],
    scores: Sequence[Sequence[Sequence[float]]] = (),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features (n, K_max, F), mask (n, K_max) of the real candidates, logged_index (n,)): the features of the
    module docstring for every candidate of every row. ``scores``: per policy, one probability vector per row
    aligned with its candidates (an arm's ``propensities``)."""
    n = len(candidates)
    if len(logged_items) != n or len(history_lengths) != n:
        raise ValueError(
            f"{_WHERE}: {n} candidate sets, {len(logged_items)} logged items, {len(history_lengths)} history lengths; "
            "rule: one of each per row"
        )
    k_max = max((len(c) for c in candidates), default=0)
    exposures: dict[int, int] = {}
    for a in logged_items:
        exposures[a] = exposures.get(a, 0) + 1
    n_feat = 3 + 2 * len(scores)
    feats = np.zeros((n, k_max, n_feat), dtype=np.float64)
    mask = np.zeros((n, k_max), dtype=bool)
    logged_index = np.zeros(n, dtype=np.int64)
    for s, per_row in enumerate(scores):
        if len(per_row) != n:
            raise ValueError(f"{_WHERE}: scores[{s}] has {len(per_row)} rows; rule: {n}, one per row")
    for i, (cands, a, h) in enumerate(zip(candidates, logged_items, history_lengths, strict=True)):
        cands = list(cands)
        k = len(cands)
        if a not in cands:
            raise ValueError(f"{_WHERE}: row {i}: logged item {a} not among its {k} candidates; rule: a_i in the set")
        logged_index[i] = cands.index(a)
        mask[i, :k] = True
        feats[i, :k, 0] = np.log1p([exposures.get(c, 0) for c in cands])
        feats[i, :k, 1] = np.log1p(h)
        feats[i, :k, 2] = np.log(k)
        for s, per_row in enumerate(scores):
            p = np.asarray(per_row[i], dtype=np.float64)
            if p.shape != (k,):
                raise ValueError(
                    f"{_WHERE}: row {i}: scores[{s}] has {p.shape[0]} values; rule: {k}, one per candidate"
                )
            rank = np.empty(k)
            rank[np.argsort(-p, kind="stable")] = np.arange(k)
            feats[i, :k, 3 + 2 * s] = p
            feats[i, :k, 4 + 2 * s] = rank / max(k - 1, 1)
    return feats, mask, logged_index


@dataclass(frozen=True)
class CrossFitted:
    q_hat: np.ndarray  # (n, K_max): each row's click probability of each candidate (0 on padding)
    fold: np.ndarray  # (n,): the fold each row belongs to (its q is from the model fitted on the others)
    models: list[LogisticModel]  # one per fold, fitted without that fold


def assign_folds(n: int, n_folds: int, *, groups: Sequence[int] | None = None, seed: int = 0) -> np.ndarray:
    """(n,) fold ids in [0, n_folds): a seeded random split of the rows, or of ``groups`` (a group's rows share a
    fold), as even as the counts allow."""
    if n_folds < 2:
        raise ValueError(f"{_WHERE}: n_folds {n_folds}; rule: >= 2 (cross-fitting needs another fold to fit on)")
    rng = np.random.default_rng(seed)
    if groups is None:
        inv = np.arange(n)
    else:
        g = np.asarray(groups)
        if g.shape != (n,):
            raise ValueError(f"{_WHERE}: groups has shape {g.shape}; rule: one group id per row ({n})")
        _, inv = np.unique(g, return_inverse=True)
    n_units = int(inv.max()) + 1 if n else 0
    if n_units < n_folds:
        raise ValueError(f"{_WHERE}: {n_units} rows or groups for {n_folds} folds; rule: at least one per fold")
    unit_fold = np.empty(n_units, dtype=np.int64)
    unit_fold[rng.permutation(n_units)] = np.arange(n_units) % n_folds
    return unit_fold[inv]


def cross_fitted_rewards(
    features: np.ndarray,
    mask: np.ndarray,
    logged_index: Sequence[int] | np.ndarray,
    clicked: Sequence[int],
    *,
    n_folds: int = 5,
    groups: Sequence[int] | None = None,
    seed: int = 0,
    l2: float = 1.0,
    candidate_ids: np.ndarray | None = None,
) -> CrossFitted:
    """Each row's q(x_i, a) over its candidates from the logistic model (:func:`fit_logistic`) fitted on the logged
    pairs (x_j, a_j, y_j) of the other folds (module docstring). ``candidate_ids`` (n, K) the candidates' item ids
    (padding any value): feature 0 (log1p(exposures)) is then recounted per fold, on the other folds' logged items
    only (a training row's own exposure left out), as the module docstring says."""
    x = np.asarray(features, dtype=np.float64)
    m = np.asarray(mask, dtype=bool)
    a = np.asarray(logged_index)
    y = np.asarray(clicked, dtype=np.float64)
    n = y.shape[0]
    if x.ndim != 3 or x.shape[:2] != m.shape or m.shape[0] != n or a.shape != (n,):
        raise ValueError(
            f"{_WHERE}: features {x.shape}, mask {m.shape}, logged_index {a.shape}, clicks {y.shape}; "
            "rule: (n, K, F), (n, K), (n,), (n,)"
        )
    rows = np.arange(n)
    if not m[rows, a].all():
        i = int(np.flatnonzero(~m[rows, a])[0])
        raise ValueError(f"{_WHERE}: row {i}: logged_index {a[i]} is padding; rule: a real candidate")
    fold = assign_folds(n, n_folds, groups=groups, seed=seed)
    q = np.zeros(m.shape, dtype=np.float64)
    models = []
    ids = None if candidate_ids is None else np.asarray(candidate_ids)
    if ids is not None and ids.shape != m.shape:
        raise ValueError(f"{_WHERE}: candidate_ids {ids.shape}; rule: (n, K) = {m.shape}, one id per candidate")
    for k in range(n_folds):
        train = fold != k
        test = ~train
        xk = x
        if ids is not None:  # exposures counted on the training folds' logged items alone
            logged_ids = ids[rows, a]
            uniq, counts = np.unique(logged_ids[train], return_counts=True)
            pos = np.clip(np.searchsorted(uniq, ids), 0, max(uniq.size - 1, 0))
            count = np.where((uniq.size > 0) & (uniq[pos] == ids), counts[pos] if uniq.size else 0, 0)
            own = np.zeros(m.shape, dtype=np.int64)
            own[rows[train], a[train]] = 1  # a training row's own exposure, left out of its count
            xk = x.copy()
            xk[..., 0] = np.log1p(np.maximum(count - own, 0))
        model = fit_logistic(xk[rows, a][train], y[train], l2=l2)
        models.append(model)
        q[test] = np.where(m[test], model.predict(xk[test]), 0.0)
    return CrossFitted(q_hat=q, fold=fold, models=models)
