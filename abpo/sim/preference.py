"""The simulated users' ground truth: a preference model fitted on every interaction of the dataset, future
windows and held-out targets included, that no arm can read (only abpo.sim imports this module: an import-linter
contract in pyproject.toml, and tests, check it).

Model: implicit-feedback matrix factorisation (implicit's ``AlternatingLeastSquares``) on the users' whole
sequences. For user u and item a, ``s(u, a)`` is the dot product of their factors and

    z(u, a) = (s(u, a) - mean_u' s(u', a)) / sd_u' s(u', a)          (standardised over the users, per item)

how much more u likes a than users do on average: personal relevance. An item's popularity alone does not raise
it (a user-centred score would: popular items have large factors, so every user's top scores are the same hits,
and a popularity ranker would look like an oracle, which the offline evaluation with popularity-sampled hard
negatives says it is not). The preference click probability is

    p_pref(u, a) = sigmoid(b0 + slope * z(u, a))                     (``sim.preference_slope``)

where the intercept b0 is calibrated (:func:`calibrate_intercept`) so that an arm exposing a uniformly random
candidate of the month's requests has click-through rate ``sim.base_ctr`` (before the next-item boosts of
abpo.sim.clicks). The oracle is a different fit (``sim.oracle_*``: its own factors, regularisation, seed, and all
the data) from the ML-retrain arm's ALS (data to date only): the same family, which is the README's first caveat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class PreferenceOracle:
    """Standardised preference scores z(u, a) of the module docstring, for every user the model was fitted on."""

    user_index: dict[int, int]
    item_index: dict[int, int]
    user_factors: np.ndarray  # (users, factors) float32
    item_factors: np.ndarray  # (items, factors) float32
    mean: np.ndarray  # per item: mean of s(., a) over the users
    sd: np.ndarray  # per item: standard deviation of s(., a) over the users (> 0)

    @classmethod
    def fit(cls, sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int], *, factors: int,
            iterations: int, regularization: float, seed: int) -> PreferenceOracle:
        """ALS on ``sequences`` (user -> every item the user interacted with, in any order; repeats count)."""
        from implicit.cpu.als import AlternatingLeastSquares
        from scipy.sparse import csr_matrix
        from threadpoolctl import threadpool_limits

        item_index = {int(i): j for j, i in enumerate(item_ids)}
        users = sorted(int(u) for u in sequences)
        rows, cols = [], []
        for r, u in enumerate(users):
            for i in sequences[u]:
                j = item_index.get(int(i))
                if j is None:
                    raise ValueError(f"PreferenceOracle.fit: user {u}: item id {i} is not in the catalog")
                rows.append(r)
                cols.append(j)
        matrix = csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(len(users), len(item_index)))
        matrix.sum_duplicates()
        with threadpool_limits(1):  # one BLAS thread: the same factors on every run of a machine
            model = AlternatingLeastSquares(factors=factors, regularization=regularization, iterations=iterations,
                                            num_threads=1, random_state=int(seed), calculate_training_loss=False)
            model.fit(matrix, show_progress=False)
        uf = np.asarray(model.user_factors, dtype=np.float32)
        itf = np.asarray(model.item_factors, dtype=np.float32)
        u64, i64 = uf.astype(np.float64), itf.astype(np.float64)
        # over users: mean_u s(u, a) = V_a . mean(U); var_u s(u, a) = V_a' Cov(U) V_a (population moments)
        mean = i64 @ u64.mean(axis=0)
        cov = np.cov(u64, rowvar=False, bias=True).reshape(u64.shape[1], u64.shape[1])
        sd = np.sqrt(np.maximum(np.einsum("if,fg,ig->i", i64, cov, i64), 0.0))
        sd[~(sd > 1e-12)] = 1.0
        return cls({u: r for r, u in enumerate(users)}, item_index, uf, itf, mean, sd)

    def z(self, user: int, items: Sequence[int]) -> np.ndarray:
        """z(user, a) for each a in ``items`` (a KeyError names an unknown user or item)."""
        r = self.user_index.get(int(user))
        if r is None:
            raise KeyError(f"PreferenceOracle: user {user} was not in the data it was fitted on")
        try:
            idx = [self.item_index[int(a)] for a in items]
        except KeyError as e:
            raise KeyError(f"PreferenceOracle: item {e.args[0]} is not in the catalog") from None
        s = self.item_factors[idx].astype(np.float64) @ self.user_factors[r].astype(np.float64)
        return (s - self.mean[idx]) / self.sd[idx]


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def preference_probability(z: np.ndarray | float, intercept: float, slope: float) -> np.ndarray:
    """p_pref = sigmoid(b0 + slope * z) of the module docstring."""
    return sigmoid(intercept + slope * np.asarray(z, dtype=np.float64))


def calibrate_intercept(z: np.ndarray, slope: float, target: float) -> float:
    """The intercept b0 with mean(sigmoid(b0 + slope * z)) = ``target`` over the given z-scores (the month's
    candidates: what a uniformly random exposure would meet). The mean is increasing in b0, so bisection finds it
    to 1e-10. A target of 0 gives -inf: no preference click at all (only the boosts click)."""
    z = np.asarray(z, dtype=np.float64).reshape(-1)
    if z.size == 0:
        raise ValueError("calibrate_intercept: no candidate z-scores to calibrate on")
    if not 0.0 <= target < 1.0:
        raise ValueError(f"config sim.base_ctr = {target}: rule: in [0, 1)")
    if target == 0.0:
        return -math.inf
    lo, hi = -60.0, 60.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if float(preference_probability(z, mid, slope).mean()) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return 0.5 * (lo + hi)
