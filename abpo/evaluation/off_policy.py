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

A click rate lies in [0, 1]. SNIPS does by construction (a weighted mean of 0/1 clicks); IPS, DR and Switch-DR do
not: they multiply by the weights' scale, so logged propensities far too small (e0 = 1e-9 everywhere gives w ~ 10^8)
put them at any value, and the gate refuses an estimate outside [0, 1] (abpo.monthly.gate_verdict).

When no row is clicked, every resample's estimate is 0 and the bootstrap interval is the point [0, 0]; what the rows
do say is a bound (:func:`zero_click_upper_bound`): with no click in n_eff effective rows, the policy's CTR is below

    ZERO_CLICK = 1 - alpha^(1 / n_eff)                the exact one-sided (1 - alpha) binomial (Clopper-Pearson)
                                                      upper bound for 0 successes in n_eff trials; about
                                                      -ln(alpha) / n_eff, the "rule of three" at alpha 0.05

The doubly robust family (:func:`ope_estimates`, :func:`compare_ope`) reads the target policy's whole distribution
pi(.|x_i) over each row's candidates and a reward model q(x, a) ~ E[y | x, a] (abpo.evaluation.reward_model,
cross-fitted: each row's q from a model that never saw that row). With w_i = pi(a_i|x_i) / e0(a_i|x_i),
q_i = q(x_i, a_i) and q_i(pi) = sum_a pi(a|x_i) q(x_i, a):

    DM        = (1/n) sum_i q_i(pi)                                      direct method (Dudik, Langford & Li 2011)
    IPS, SNIPS  as above                                                 (SNIPS: Swaminathan & Joachims 2015)
    DR        = (1/n) sum_i [ q_i(pi) + w_i (y_i - q_i) ]                Dudik, Langford & Li 2011
    SNDR      = (1/n) sum_i q_i(pi) + sum_i w_i (y_i - q_i) / sum_i w_i  Kallus & Uehara 2019; obp's
                                                                         SelfNormalizedDoublyRobust
    SWITCH_DR = (1/n) sum_i [ q_i(pi) + 1{w_i <= lam} w_i (y_i - q_i) ]  Wang, Agarwal & Dudik 2017; lam = inf is DR

DR is unbiased when either the propensities e0 or q are right; with q = 0 it is IPS, with w = 0 (the target puts no
mass on any logged item) it is DM. SNDR is DR with the correction term's weights normalised to mean 1, as SNIPS is
IPS's. The formulas are those of Open Bandit Pipeline (st-tech/zr-obp, obp/ope/estimators.py), written here rather
than imported because obp does not install against the project's pins: its releases 0.5.x pin exact versions
(0.5.7: Pillow==9.1.1 against the pinned pillow 13.0.0), so pip falls back to obp 0.4.1 of 2021, which pulls in
seaborn and does not import without it (checked 2026-11-27: ``pip install --dry-run -c constraints.txt obp``).

Intervals (:func:`ope_estimates`, :func:`compare_ope`): percentile bootstrap over rows, or over clusters of rows
(``groups``: a user's rows stay together), every estimator recomputed on each resample, its normalisers included;
q is held fixed across resamples (it is refitted per fold, not per resample), so the interval leaves out the reward
model's own variance.
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


def _as_array(x: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"abpo.evaluation.off_policy: {name} has shape {a.shape}; rule: one value per impression")
    return a


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def off_policy_ctr(
    clicked: Sequence[int] | np.ndarray,
    logging_propensity: Sequence[float] | np.ndarray,
    target_propensity: Sequence[float] | np.ndarray,
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
    # challenger IPS - champion IPS on the same rows and resamples: IPS is not self-normalised, so it sees what SNIPS
    # cannot when every row is clicked (a challenger that moves its mass off the logged items)
    ips_diff: float = math.nan
    ips_ci_low: float = math.nan
    ips_ci_high: float = math.nan


def _snips(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """SNIPS over the last axis (rows of resampled weights): sum w y / sum w (NaN where sum w = 0)."""
    s = w.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s > 0, (w * y).sum(axis=-1) / s, np.nan)


def compare_snips(
    clicked: Sequence[int] | np.ndarray,
    logging_propensity: Sequence[float] | np.ndarray,
    challenger_propensity: Sequence[float] | np.ndarray,
    champion_propensity: Sequence[float] | np.ndarray,
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
    d_ips = ((w_ch - w_cp) * y)[idx].mean(axis=-1)  # IPS_challenger - IPS_champion on each resample
    lo, hi = _quantiles(d, confidence)
    ips_lo, ips_hi = _quantiles(d_ips, confidence)
    return SnipsComparison(
        n=int(y.shape[0]),
        challenger=ch,
        champion=cp,
        diff=ch.snips - cp.snips,
        ci_low=lo,
        ci_high=hi,
        confidence=confidence,
        n_boot=n_boot,
        ips_diff=ch.ips - cp.ips,
        ips_ci_low=ips_lo,
        ips_ci_high=ips_hi,
    )


def _quantiles(d: np.ndarray, confidence: float) -> tuple[float, float]:
    """The percentile interval of the finite resampled values ``d`` (NaN, NaN when none is finite)."""
    d = d[np.isfinite(d)]
    alpha = (1.0 - confidence) / 2
    return (float(np.quantile(d, alpha)), float(np.quantile(d, 1 - alpha))) if d.size else (math.nan, math.nan)


def zero_click_upper_bound(ess: float, confidence: float) -> float:
    """Eq. ZERO_CLICK of the module docstring: the one-sided upper bound of a CTR on rows with no click, at the level
    of a two-sided ``confidence`` interval's bound (alpha = (1 - confidence) / 2, as the gate's intervals), from
    ``ess`` effective rows (Kish's, of the policy's weights). 1 when no row carries weight (ess <= 0)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"zero_click_upper_bound: confidence {confidence}; rule: in (0, 1)")
    if not ess > 0:
        return 1.0
    alpha = (1.0 - confidence) / 2
    return float(-math.expm1(math.log(alpha) / ess))  # 1 - alpha^(1/ess)


def top_weight_share(weights: Sequence[float] | np.ndarray, fraction: float) -> tuple[float, int]:
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


# ---- The doubly robust family (module docstring): the target's whole distribution over the candidates ----

ESTIMATORS = ("dm", "ips", "snips", "dr", "sndr", "switch_dr")


@dataclass(frozen=True)
class OPEstimate:
    """One estimator's value of a target policy's CTR and its percentile bootstrap interval (NaN when n_boot = 0)."""

    estimator: str  # one of ESTIMATORS
    value: float
    ci_low: float
    ci_high: float
    boot_se: float  # the std of the bootstrap replicates
    confidence: float
    n_boot: int
    n: int  # rows
    n_groups: int  # resampled units (rows, or the clusters of ``groups``)


@dataclass(frozen=True)
class OPEComparison:
    """challenger - champion under one estimator, both on the same rows and the same resamples."""

    estimator: str
    challenger: OPEstimate
    champion: OPEstimate
    diff: float
    ci_low: float
    ci_high: float
    boot_se: float
    confidence: float
    n_boot: int


def pad_rows(rows: Sequence[Sequence[float]], fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Ragged per-row vectors (one value per candidate; candidate sets differ in size) as an (n, K_max) array padded
    with ``fill``, and the (n, K_max) mask of the real entries."""
    n = len(rows)
    k = max((len(r) for r in rows), default=0)
    out = np.full((n, k), fill, dtype=np.float64)
    mask = np.zeros((n, k), dtype=bool)
    for i, r in enumerate(rows):
        out[i, : len(r)] = np.asarray(r, dtype=np.float64)
        mask[i, : len(r)] = True
    return out, mask


def _check_rows(
    clicked: Sequence[int],
    logging_propensity: Sequence[float],
    logged_index: Sequence[int] | np.ndarray,
    targets: dict[str, np.ndarray],
    q_hat: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    where = "abpo.evaluation.off_policy"
    y = _as_array(clicked, "clicked")
    e0 = _as_array(logging_propensity, "logging_propensity")
    a = np.asarray(logged_index)
    n = y.shape[0]
    if n == 0:
        raise ValueError(f"{where}: no rows; rule: at least one logged row")
    if e0.shape != (n,) or a.shape != (n,):
        raise ValueError(
            f"{where}: {n} clicks, {e0.shape} logging propensities, {a.shape} logged indices; rule: one of each per row"
        )
    bad = ~((y == 0) | (y == 1))
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"{where}: clicked[{i}] = {y[i]}; rule: clicked is 0 or 1")
    bad = ~((e0 > 0) & (e0 <= 1))
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"{where}: logging_propensity[{i}] = {e0[i]}; rule: 0 < p <= 1")
    q = np.asarray(q_hat, dtype=np.float64)
    if q.ndim != 2 or q.shape[0] != n:
        raise ValueError(f"{where}: q_hat has shape {q.shape}; rule: (rows {n}, candidates)")
    k = q.shape[1]
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{where}: logged_index has dtype {a.dtype}; rule: integer positions in the candidate set")
    bad = (a < 0) | (a >= k)
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"{where}: logged_index[{i}] = {a[i]}; rule: 0 <= index < {k} candidates")
    bad_q = ~(np.isfinite(q) & (q >= 0) & (q <= 1))
    if bad_q.any():
        i, j = np.argwhere(bad_q)[0]
        raise ValueError(f"{where}: q_hat[{i}, {j}] = {q[i, j]}; rule: a click probability in [0, 1]")
    for name, pi in targets.items():
        if pi.shape != q.shape:
            raise ValueError(
                f"{where}: {name} has shape {pi.shape}, q_hat {q.shape}; rule: the same (rows, candidates)"
            )
        bad_p = ~(np.isfinite(pi) & (pi >= 0) & (pi <= 1))
        if bad_p.any():
            i, j = np.argwhere(bad_p)[0]
            raise ValueError(f"{where}: {name}[{i}, {j}] = {pi[i, j]}; rule: 0 <= p <= 1")
        total = pi.sum(axis=1)
        bad = np.abs(total - 1.0) > 1e-6
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(f"{where}: {name}[{i}] sums to {total[i]:.8f}; rule: a distribution over the candidates")
    return y, e0, a


# The per-row terms every estimator is a ratio of sums of (so a resample is a reweighting of group sums):
# 1, q_i(pi), w_i y_i, w_i, w_i (y_i - q_i), 1{w_i <= lam} w_i (y_i - q_i)
_N, _QPI, _WY, _W, _WR, _SWR = range(6)


def _row_terms(
    y: np.ndarray, e0: np.ndarray, a: np.ndarray, pi: np.ndarray, q: np.ndarray, switch_lambda: float
) -> np.ndarray:
    rows = np.arange(y.shape[0])
    w = pi[rows, a] / e0  # w_i = pi(a_i|x_i) / e0(a_i|x_i)
    resid = y - q[rows, a]  # y_i - q(x_i, a_i)
    return np.stack(
        [
            np.ones_like(y),
            (pi * q).sum(axis=1),  # q_i(pi) = sum_a pi(a|x_i) q(x_i, a)
            w * y,
            w,
            w * resid,
            np.where(w <= switch_lambda, w * resid, 0.0),
        ],
        axis=-1,
    )


def _estimators_from_sums(t: np.ndarray) -> dict[str, np.ndarray]:
    """Every estimator of the module docstring from the sums (over the rows, or a resample) of the row terms."""
    n, w = t[..., _N], t[..., _W]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "dm": t[..., _QPI] / n,  # (1/n) sum q_i(pi)
            "ips": t[..., _WY] / n,  # (1/n) sum w_i y_i
            "snips": np.where(w > 0, t[..., _WY] / w, np.nan),  # sum w_i y_i / sum w_i
            "dr": (t[..., _QPI] + t[..., _WR]) / n,  # (1/n) sum [q_i(pi) + w_i (y_i - q_i)]
            "sndr": t[..., _QPI] / n + np.where(w > 0, t[..., _WR] / w, np.nan),  # DM + sum w r / sum w
            "switch_dr": (t[..., _QPI] + t[..., _SWR]) / n,  # (1/n) sum [q_i(pi) + 1{w_i <= lam} w_i r_i]
        }


def _group_sums(terms: np.ndarray, groups: Sequence[int] | None) -> np.ndarray:
    if groups is None:
        return terms
    g = np.asarray(groups)
    if g.shape != (terms.shape[0],):
        raise ValueError(f"abpo.evaluation.off_policy: groups has shape {g.shape}; rule: one group id per row")
    _, inv = np.unique(g, return_inverse=True)
    sums = np.zeros((int(inv.max()) + 1, terms.shape[1]), dtype=np.float64)
    np.add.at(sums, inv, terms)
    return sums


def _bootstrap_sums(sums: np.ndarray, n_boot: int, seed: int, max_cells: int = 4_000_000) -> np.ndarray:
    """(n_boot, terms): the term sums of n_boot resamples of the groups with replacement (multinomial counts, drawn
    in chunks of at most ``max_cells`` counts)."""
    g = sums.shape[0]
    rng = np.random.default_rng(seed)
    chunk = max(1, max_cells // g)
    out = [np.empty((0, sums.shape[1]))]  # n_boot = 0: no resample, every interval NaN
    for start in range(0, n_boot, chunk):
        counts = rng.multinomial(g, np.full(g, 1.0 / g), size=min(chunk, n_boot - start))
        out.append(counts @ sums)
    return np.concatenate(out, axis=0)


def _percentile(d: np.ndarray, confidence: float) -> tuple[float, float, float]:
    d = d[np.isfinite(d)]
    if d.size == 0:
        return math.nan, math.nan, math.nan
    alpha = (1.0 - confidence) / 2
    se = float(d.std(ddof=1)) if d.size > 1 else math.nan
    return float(np.quantile(d, alpha)), float(np.quantile(d, 1 - alpha)), se


def _check_request(estimators: Sequence[str], n_boot: int, confidence: float, switch_lambda: float) -> None:
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise ValueError(f"abpo.evaluation.off_policy: estimators {unknown}; rule: among {list(ESTIMATORS)}")
    if n_boot < 0:
        raise ValueError(f"abpo.evaluation.off_policy: n_boot {n_boot}; rule: >= 0 (0: no interval)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"abpo.evaluation.off_policy: confidence {confidence}; rule: in (0, 1)")
    if not switch_lambda >= 0:
        raise ValueError(f"abpo.evaluation.off_policy: switch_lambda {switch_lambda}; rule: >= 0 (inf: DR)")


def ope_estimates(
    clicked: Sequence[int],
    logging_propensity: Sequence[float],
    logged_index: Sequence[int] | np.ndarray,
    target: np.ndarray,
    q_hat: np.ndarray,
    *,
    estimators: Sequence[str] = ESTIMATORS,
    groups: Sequence[int] | None = None,
    switch_lambda: float = math.inf,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, OPEstimate]:
    """DM, IPS, SNIPS, DR, SNDR and Switch-DR (module docstring) of the target policy's CTR on logged rows, each
    with a percentile bootstrap interval over rows (or over ``groups``' clusters).

    Row i: ``clicked`` y_i, the logged item's position ``logged_index`` a_i in its candidate set and its
    ``logging_propensity`` e0(a_i|x_i); ``target`` (n, K) pi(.|x_i) over the candidates (zero-padded,
    :func:`pad_rows`), each row summing to 1; ``q_hat`` (n, K) the reward model's click probabilities
    (abpo.evaluation.reward_model.cross_fitted_rewards)."""
    _check_request(estimators, n_boot, confidence, switch_lambda)
    pi = np.asarray(target, dtype=np.float64)
    y, e0, a = _check_rows(clicked, logging_propensity, logged_index, {"target": pi}, q_hat)
    sums = _group_sums(_row_terms(y, e0, a, pi, np.asarray(q_hat, dtype=np.float64), switch_lambda), groups)
    point = _estimators_from_sums(sums.sum(axis=0))
    boot = _estimators_from_sums(_bootstrap_sums(sums, n_boot, seed))
    out = {}
    for name in estimators:
        lo, hi, se = _percentile(boot[name], confidence)
        out[name] = OPEstimate(name, float(point[name]), lo, hi, se, confidence, n_boot, int(y.shape[0]), sums.shape[0])
    return out


def compare_ope(
    clicked: Sequence[int],
    logging_propensity: Sequence[float],
    logged_index: Sequence[int] | np.ndarray,
    challenger: np.ndarray,
    champion: np.ndarray,
    q_hat: np.ndarray,
    *,
    estimators: Sequence[str] = ESTIMATORS,
    groups: Sequence[int] | None = None,
    switch_lambda: float = math.inf,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, OPEComparison]:
    """challenger - champion under each estimator of :func:`ope_estimates` on the same rows, one reward model, and
    one set of resamples (a paired bootstrap: each resample's difference is of two estimates on the same rows)."""
    _check_request(estimators, n_boot, confidence, switch_lambda)
    pi_new = np.asarray(challenger, dtype=np.float64)
    pi_old = np.asarray(champion, dtype=np.float64)
    y, e0, a = _check_rows(clicked, logging_propensity, logged_index, {"challenger": pi_new, "champion": pi_old}, q_hat)
    q = np.asarray(q_hat, dtype=np.float64)
    terms = np.concatenate(
        [_row_terms(y, e0, a, pi_new, q, switch_lambda), _row_terms(y, e0, a, pi_old, q, switch_lambda)], axis=1
    )
    sums = _group_sums(terms, groups)
    m = terms.shape[1] // 2
    total = sums.sum(axis=0)
    new, old = _estimators_from_sums(total[:m]), _estimators_from_sums(total[m:])
    b = _bootstrap_sums(sums, n_boot, seed)
    b_new, b_old = _estimators_from_sums(b[:, :m]), _estimators_from_sums(b[:, m:])
    n, n_groups = int(y.shape[0]), sums.shape[0]
    out = {}
    for name in estimators:
        ch_lo, ch_hi, ch_se = _percentile(b_new[name], confidence)
        cp_lo, cp_hi, cp_se = _percentile(b_old[name], confidence)
        d_lo, d_hi, d_se = _percentile(b_new[name] - b_old[name], confidence)
        out[name] = OPEComparison(
            estimator=name,
            challenger=OPEstimate(name, float(new[name]), ch_lo, ch_hi, ch_se, confidence, n_boot, n, n_groups),
            champion=OPEstimate(name, float(old[name]), cp_lo, cp_hi, cp_se, confidence, n_boot, n, n_groups),
            diff=float(new[name] - old[name]),
            ci_low=d_lo,
            ci_high=d_hi,
            boot_se=d_se,
            confidence=confidence,
            n_boot=n_boot,
        )
    return out


def compare_ope_on_logs(
    candidates: Sequence[Sequence[int]],
    logged_items: Sequence[int],
    history_lengths: Sequence[int],
    clicked: Sequence[int],
    logging_propensity: Sequence[float],
    challenger: Sequence[Sequence[float]],
    champion: Sequence[Sequence[float]],
    *,
    groups: Sequence[int] | None = None,
    n_folds: int = 5,
    l2: float = 1.0,
    estimators: Sequence[str] = ESTIMATORS,
    switch_lambda: float = math.inf,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, OPEComparison]:
    """:func:`compare_ope` on logged rows as the warehouse keeps them: each row's candidate item ids, the logged
    item, the user's history length, the click and the logged propensity e0, and the challenger's and the champion's
    probability vectors aligned with the candidates (an arm's ``propensities``). The reward model is
    abpo.evaluation.reward_model's logistic regression on reward_features (with both policies' scores), cross-fitted
    over ``n_folds`` folds of the rows or of ``groups`` (user ids: a user's rows in one fold and one bootstrap
    cluster)."""
    from abpo.evaluation.reward_model import cross_fitted_rewards, reward_features

    feats, mask, logged_index = reward_features(
        candidates, logged_items, history_lengths, scores=[challenger, champion]
    )
    ids = pad_rows(candidates, fill=-1)[0].astype(np.int64)
    q = cross_fitted_rewards(
        feats, mask, logged_index, clicked, n_folds=n_folds, groups=groups, seed=seed, l2=l2, candidate_ids=ids
    )
    return compare_ope(
        clicked,
        logging_propensity,
        logged_index,
        pad_rows(challenger)[0],
        pad_rows(champion)[0],
        q.q_hat,
        estimators=estimators,
        groups=groups,
        switch_lambda=switch_lambda,
        n_boot=n_boot,
        confidence=confidence,
        seed=seed,
    )
