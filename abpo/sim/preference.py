"""The simulated users' ground truth: a mixture of preference models fitted on every interaction of the dataset,
future windows and held-out targets included, that no arm can read (only abpo.sim imports this module and
abpo.sim.oracles: import-linter contracts in pyproject.toml, and tests, check it). docs/simulator.md explains it.

Components (abpo.sim.oracles): ``knn`` (item-to-item co-occurrence with the user's recent items), ``sequential`` (a
smoothed mixture-transition-distribution Markov model of the next item given the user's last items) and ``als``
(implicit ALS factors), each standardised per item over the users into z_c(u, h, a) (h: the user's history at the
request; the whole sequence when none is given). The oracle ``sim.oracle`` is ``mixture`` (the default) or one
component alone; the mixture is

    m(u, h, a) = sum_c w_c z_c(u, h, a) / sum_c w_c                          (w_c: ``sim.oracle_weights``)
    z(u, h, a) = (m(u, h, a) - mean_u' m(u', h_u', a)) / sd_u' m(u', h_u', a)

re-standardised over the reference users (abpo.sim.oracles) so that its z has the spread of one component's: how
much more u likes a than users do on average, personal relevance (an item's popularity alone does not raise it; a
user-centred score would, and a popularity ranker would look like an oracle, which the offline evaluation with
popularity-sampled hard negatives says it is not). No arm owns it: the ML-retrain arm is ALS on the interactions to
date, the LLM arms a policy on the history, the popularity arm counts; the simulated CTR of one arm family is not
the oracle's own family's score. The preference click probability is

    p_pref(u, a) = sigmoid(b0 + slope * z(u, h, a))                      (``sim.preference_slope``)

where the intercept b0 is calibrated (:func:`calibrate_intercept`) so that an arm exposing a uniformly random
candidate of the month's requests has click-through rate ``sim.base_ctr`` (before the next-item boosts of
abpo.sim.clicks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from abpo.config.sim import ORACLE_COMPONENTS, ORACLES


def oracle_weights(sim_cfg) -> dict[str, float]:
    """The normalised component weights of ``sim.oracle`` (one component: weight 1; mixture: sim.oracle_weights
    over their sum). Errors name the key and the rule: a known oracle, known components, weights finite and
    >= 0, a positive sum."""
    oracle = sim_cfg.oracle
    if oracle not in ORACLES:
        raise ValueError(f"config sim.oracle = {oracle!r}: rule: one of {list(ORACLES)}")
    if oracle != "mixture":
        return {oracle: 1.0}
    weights = sim_cfg.oracle_weights
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(
            f"config sim.oracle_weights = {weights!r}: rule: a mapping component -> weight, components "
            f"among {list(ORACLE_COMPONENTS)}"
        )
    for k, w in weights.items():
        if k not in ORACLE_COMPONENTS:
            raise ValueError(
                f"config sim.oracle_weights.{k}: unknown oracle component {k!r}; rule: one of {list(ORACLE_COMPONENTS)}"
            )
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"config sim.oracle_weights.{k} = {w!r}: rule: a finite number >= 0")
    total = float(sum(weights.values()))
    if not total > 0:
        raise ValueError(f"config sim.oracle_weights = {dict(weights)}: rule: the weights sum to > 0")
    return {k: float(w) / total for k, w in weights.items() if w > 0}


@dataclass
class PreferenceOracle:
    """Standardised preference scores z(u, h, a) of the module docstring, for every user the models were fitted
    on. ``components``: name -> fitted abpo.sim.oracles component; ``weights``: name -> normalised weight."""

    components: dict[str, object]
    weights: dict[str, float]
    states: dict[int, list[int]]  # user -> the whole sequence: the state when no history is given
    mean: np.ndarray | None = None  # per item: mean of the mixture m over the reference users (None: one component)
    sd: np.ndarray | None = None
    item_index: dict[int, int] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        components: Mapping[str, object],
        weights: Mapping[str, float],
        sequences: Mapping[int, Sequence[int]],
        item_ids: Sequence[int],
        reference: Sequence[int],
    ) -> PreferenceOracle:
        """The oracle of fitted ``components`` mixed with ``weights`` (normalised, > 0), the mixture's moments over
        the ``reference`` users' whole sequences."""
        comps = {k: components[k] for k in weights}
        oracle = cls(
            comps,
            dict(weights),
            {int(u): list(s) for u, s in sequences.items()},
            item_index={int(i): j for j, i in enumerate(item_ids)},
        )
        if len(comps) > 1:
            n = len(oracle.item_index)
            total, squares = np.zeros(n), np.zeros(n)
            ref = [int(u) for u in reference]
            for start in range(0, len(ref), 256):
                users = ref[start : start + 256]
                hist = [oracle.states[u] for u in users]
                m = sum(w * comps[k].z_block(users, hist) for k, w in weights.items())
                total += m.sum(axis=0)
                squares += np.square(m).sum(axis=0)
            mean = total / max(len(ref), 1)
            sd = np.sqrt(np.maximum(squares / max(len(ref), 1) - np.square(mean), 0.0))
            sd[~(sd > 1e-9)] = 1.0
            oracle.mean, oracle.sd = mean, sd
        return oracle

    def z(self, user: int, items: Sequence[int], history: Sequence[int] | None = None) -> np.ndarray:
        """z(user, h, a) for each a in ``items``, h = ``history`` (the request's x_{1:t}; None: the user's whole
        sequence). A KeyError names an unknown user or item."""
        if int(user) not in self.states:
            raise KeyError(f"PreferenceOracle: user {user} was not in the data it was fitted on")
        try:
            idx = [self.item_index[int(a)] for a in items]
        except KeyError as e:
            raise KeyError(f"PreferenceOracle: item {e.args[0]} is not in the catalog") from None
        h = self.states[int(user)] if history is None else history
        m = sum(w * self.components[k].z(user, h, idx) for k, w in self.weights.items())
        if self.mean is None:
            return np.asarray(m, dtype=np.float64)
        return (m - self.mean[idx]) / self.sd[idx]


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
