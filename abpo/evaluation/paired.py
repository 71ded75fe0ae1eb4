"""A paired non-inferiority test of a per-user metric (the monthly gate's offline half, docs/gate.md).

Two versions scored on the same n users give per-user values a_u (challenger) and b_u (champion): for HR@K the hit
1[r_u <= K] (0/1), for NDCG@K 1[r_u <= K] / log2(r_u + 1) (abpo.evaluation.metrics). The paired differences
d_u = a_u - b_u carry the comparison; with 0/1 hits a user differs only when exactly one version hits (a discordant
pair: a *win* when only the challenger hits, a *loss* when only the champion does), so with W wins and L losses

    diff  = mean_u d_u = (W - L) / n
    SE    = sqrt((mean_u d_u^2 - diff^2) / n)  = sqrt((W + L) / n - diff^2) / sqrt(n)   for 0/1 hits

(the sample variance of d with denominator n). Non-inferiority at absolute margin m, one-sided at level alpha, by
the normal approximation of diff (a Wald test; it is anti-conservative when the discordant pairs are few, e.g. under
about 10, as with two nearly identical versions):

    H0: delta <= -m  against  H1: delta > -m            (delta = the users' expected d)
    lower = diff - z_{1-alpha} * SE                      (the one-sided (1 - alpha) lower confidence bound)
    pass  iff lower > -m,   p = 1 - Phi((diff + m) / SE)   (pass iff p < alpha)
    MDE   = (z_{1-alpha} + z_{power}) * SE                (Eq. MDE: the distance above -m of a true difference the
                                                           test passes with probability ``power``)

With SE = 0 (every d_u equal) the bound is diff itself and p is 0 or 1."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

METHOD = "paired Wald (normal approximation), SE from the paired differences"


@dataclasses.dataclass(frozen=True)
class PairedTest:
    """:func:`paired_noninferiority`'s numbers (JSON-safe through ``dataclasses.asdict``)."""

    n: int  # users
    challenger: float  # mean a_u
    champion: float  # mean b_u
    diff: float  # mean d_u
    se: float
    lower: float  # one-sided (1 - alpha) lower confidence bound of delta
    margin: float
    alpha: float
    p_value: float  # of H0: delta <= -margin
    power: float
    mde: float  # Eq. MDE
    wins: int  # users with d_u > 0 (only the challenger hits, for 0/1 hits)
    losses: int  # d_u < 0
    ties: int  # d_u = 0
    passed: bool
    method: str = METHOD


def _check(name: str, value: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < float(value) < high:
        raise ValueError(f"abpo.evaluation.paired: {name} = {value!r}; rule: a number in ({low:g}, {high:g})")
    return float(value)


def mde(se: float, alpha: float = 0.025, power: float = 0.8) -> float:
    """Eq. MDE: (z_{1-alpha} + z_{power}) * SE, the minimum detectable difference of a one-sided test at level
    ``alpha`` with probability ``power``."""
    alpha, power = _check("alpha", alpha, 0.0, 0.5), _check("power", power, 0.0, 1.0)
    z = NormalDist().inv_cdf
    return (z(1.0 - alpha) + z(power)) * float(se)


def per_user_values(ranks: Sequence[int], metric: str) -> np.ndarray:
    """Each user's contribution to ``metric`` (its mean over users is the metric, abpo.evaluation.metrics):
    HR@K -> 1[r <= K], NDCG@K -> 1[r <= K] / log2(r + 1). ``ranks``: 1-based target ranks. Other metrics (the
    Diversity@K of a ranking's items, generation metrics) are a ValueError naming the rule."""
    name, _, k = metric.partition("@")
    if name not in ("HR", "NDCG") or not k.isdigit() or int(k) < 1:
        raise ValueError(
            f"abpo.evaluation.paired: metric {metric!r} has no per-user value from a target's rank; "
            "rule: HR@K or NDCG@K with an integer K >= 1"
        )
    r = np.asarray(ranks, dtype=np.float64)
    if r.ndim != 1 or r.size == 0 or not np.all(np.isfinite(r)) or np.any(r < 1) or np.any(r != np.round(r)):
        raise ValueError(
            f"abpo.evaluation.paired: ranks {list(ranks)[:5]}...; rule: a non-empty list of 1-based integer ranks"
        )
    hit = r <= int(k)
    return hit.astype(np.float64) if name == "HR" else np.where(hit, 1.0 / np.log2(r + 1.0), 0.0)


def paired_noninferiority(
    challenger: Sequence[float], champion: Sequence[float], *, margin: float, alpha: float = 0.025, power: float = 0.8
) -> PairedTest:
    """The paired non-inferiority test of the module docstring on per-user values of the same users in the same
    order (``challenger[u]`` and ``champion[u]`` of user u): pass iff the one-sided (1 - alpha) lower bound of
    mean(challenger - champion) is > -``margin``; with the p-value of H0 delta <= -margin and Eq. MDE at ``power``."""
    a, b = np.asarray(challenger, dtype=np.float64), np.asarray(champion, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(
            f"abpo.evaluation.paired: {a.size} challenger and {b.size} champion values; rule: one "
            "value of each per user, the same users in the same order, at least one"
        )
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("abpo.evaluation.paired: a per-user value is not finite; rule: finite values")
    margin = float(margin)
    if not math.isfinite(margin):
        raise ValueError(f"abpo.evaluation.paired: margin = {margin!r}; rule: a finite number")
    alpha, power = _check("alpha", alpha, 0.0, 0.5), _check("power", power, 0.0, 1.0)
    d = a - b
    n = int(d.size)
    diff = float(d.mean())
    se = math.sqrt(max(float(np.mean(d * d)) - diff * diff, 0.0) / n)
    z = NormalDist()
    if se > 0:
        lower = diff - z.inv_cdf(1.0 - alpha) * se
        p = 1.0 - z.cdf((diff + margin) / se)
    else:
        lower, p = diff, (0.0 if diff > -margin else 1.0)
    return PairedTest(
        n=n,
        challenger=float(a.mean()),
        champion=float(b.mean()),
        diff=diff,
        se=se,
        lower=lower,
        margin=margin,
        alpha=alpha,
        p_value=float(p),
        power=power,
        mde=mde(se, alpha, power),
        wins=int(np.sum(d > 0)),
        losses=int(np.sum(d < 0)),
        ties=int(np.sum(d == 0)),
        passed=bool(lower > -margin),
    )
