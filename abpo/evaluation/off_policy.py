"""Off-policy estimate of a target policy's CTR from logged bandit feedback (the evaluation gate's
off-policy check, ARCHITECTURE.md "evaluate").

Each logged impression i has the exposed item a_i, its click y_i in {0, 1}, the logging propensity
e0(a_i | q_i) and the target policy's propensity e_pi(a_i | q_i) of the same item over the same candidate
set (docs/ABPO_SPEC.md "Propensities"). With w_i = e_pi(a_i|q_i) / e0(a_i|q_i):

    IPS   = (1/n) sum_i w_i y_i                       unbiased when e0 > 0 wherever e_pi > 0
    SNIPS = sum_i w_i y_i / sum_i w_i                 self-normalised: biased O(1/n), much lower variance
    ESS   = (sum_i w_i)^2 / sum_i w_i^2               Kish effective sample size of the weights
    TOP_k = sum_{i <= k} w_(i) / sum_i w_i            share of the weight carried by the k largest weights
                                                      (w_(1) >= w_(2) >= ...), k = max(1, ceil(f * n))

Standard errors: IPS, the sample std of w_i y_i over sqrt(n); SNIPS, the delta method
sqrt(sum_i w_i^2 (y_i - SNIPS)^2) / sum_i w_i.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OffPolicyEstimate:
    n: int  # logged impressions used
    logged_ctr: float  # mean_i y_i, the logging policy's observed CTR
    ips: float
    ips_se: float
    snips: float
    snips_se: float
    ess: float
    max_weight: float


def _as_array(x: Sequence[float], name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"abpo.evaluation.off_policy: {name} has shape {a.shape}; rule: one value per impression")
    return a


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def off_policy_ctr(
    clicked: Sequence[int],
    logging_propensity: Sequence[float],
    target_propensity: Sequence[float],
) -> OffPolicyEstimate:
    """IPS and SNIPS estimates of the target policy's CTR (module docstring), with standard errors and ESS."""
    y = _as_array(clicked, "clicked")
    e0 = _as_array(logging_propensity, "logging_propensity")
    e_pi = _as_array(target_propensity, "target_propensity")
    n = y.shape[0]
    if n == 0:
        raise ValueError("abpo.evaluation.off_policy: no impressions; rule: at least one logged impression")
    if e0.shape[0] != n or e_pi.shape[0] != n:
        raise ValueError(
            f"abpo.evaluation.off_policy: {n} clicks, {e0.shape[0]} logging and {e_pi.shape[0]} target propensities; "
            "rule: one of each per impression"
        )
    bad = ~((y == 0) | (y == 1))
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"abpo.evaluation.off_policy: clicked[{i}] = {y[i]}; rule: clicked is 0 or 1")
    bad = ~((e0 > 0) & (e0 <= 1))
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"abpo.evaluation.off_policy: logging_propensity[{i}] = {e0[i]}; rule: 0 < p <= 1")
    bad = ~((e_pi >= 0) & (e_pi <= 1))
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"abpo.evaluation.off_policy: target_propensity[{i}] = {e_pi[i]}; rule: 0 <= p <= 1")

    w = e_pi / e0  # w_i = e_pi(a_i|q_i) / e0(a_i|q_i)
    wy = w * y
    ips = float(wy.mean())  # (1/n) sum_i w_i y_i
    ips_se = float(wy.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    w_sum = float(w.sum())
    if w_sum > 0:
        snips = float(wy.sum() / w_sum)  # sum_i w_i y_i / sum_i w_i
        snips_se = float(math.sqrt(float((w**2 * (y - snips) ** 2).sum())) / w_sum)  # delta method
        ess = w_sum**2 / float((w**2).sum())  # (sum w)^2 / sum w^2
    else:  # the target policy never picks any logged item: SNIPS is undefined
        snips, snips_se, ess = float("nan"), float("nan"), 0.0
    return OffPolicyEstimate(
        n=n,
        logged_ctr=float(y.mean()),
        ips=ips,
        ips_se=ips_se,
        snips=snips,
        snips_se=snips_se,
        ess=ess,
        max_weight=float(w.max()),
    )


@dataclass(frozen=True)
class SnipsComparison:
    """SNIPS CTR of a challenger and of a champion on the same logged impressions, and their difference with a
    percentile bootstrap interval (impressions resampled with replacement, both estimates on each resample)."""

    n: int
    challenger: OffPolicyEstimate
    champion: OffPolicyEstimate
    diff: float  # challenger SNIPS - champion SNIPS
    ci_low: float
    ci_high: float
    confidence: float
    n_boot: int


def _snips(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """SNIPS over the last axis (rows of resampled weights): sum w y / sum w (NaN where sum w = 0)."""
    s = w.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s > 0, (w * y).sum(axis=-1) / s, np.nan)


def compare_snips(
    clicked: Sequence[int],
    logging_propensity: Sequence[float],
    challenger_propensity: Sequence[float],
    champion_propensity: Sequence[float],
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> SnipsComparison:
    """The gate's off-policy check: SNIPS of the challenger and of the champion (module docstring) on the same
    impressions and a bootstrap interval of challenger - champion."""
    ch = off_policy_ctr(clicked, logging_propensity, challenger_propensity)
    cp = off_policy_ctr(clicked, logging_propensity, champion_propensity)
    y = _as_array(clicked, "clicked")
    e0 = _as_array(logging_propensity, "logging_propensity")
    w_ch = _as_array(challenger_propensity, "challenger_propensity") / e0
    w_cp = _as_array(champion_propensity, "champion_propensity") / e0
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, y.shape[0], size=(n_boot, y.shape[0]))
    d = _snips(y[idx], w_ch[idx]) - _snips(y[idx], w_cp[idx])
    d = d[np.isfinite(d)]
    alpha = (1.0 - confidence) / 2
    lo, hi = (float(np.quantile(d, alpha)), float(np.quantile(d, 1 - alpha))) if d.size else (math.nan, math.nan)
    return SnipsComparison(
        n=int(y.shape[0]),
        challenger=ch,
        champion=cp,
        diff=ch.snips - cp.snips,
        ci_low=lo,
        ci_high=hi,
        confidence=confidence,
        n_boot=n_boot,
    )


def top_weight_share(weights: Sequence[float], fraction: float) -> tuple[float, int]:
    """Eq. TOP_k of the module docstring: (the share of sum_i w_i carried by the k = max(1, ceil(fraction * n))
    largest weights, k). A handful of rows with impossible or tiny logged propensities carry almost all the weight
    of a SNIPS estimate; the gate caps this share (arms.gate_max_top_weight_share). NaN when the weights are not
    finite or sum to 0 (the gate fails closed on it)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"top_weight_share: fraction {fraction}; rule: in (0, 1]")
    w = _as_array(weights, "weights")
    if w.size == 0:
        raise ValueError("top_weight_share: no weights; rule: at least one logged impression")
    k = max(1, math.ceil(fraction * w.size))
    total = float(w.sum())
    if not math.isfinite(total) or total <= 0 or not np.all(np.isfinite(w)):
        return math.nan, k
    top = float(np.partition(w, w.size - k)[w.size - k :].sum())
    return top / total, k
