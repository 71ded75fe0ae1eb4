"""A paired non-inferiority test of a per-user metric (the monthly gate's offline half, docs/gate.md).

Two versions scored on the same n users give per-user values a_u (challenger) and b_u (champion): for HR@K the hit
1[r_u <= K] (0/1), for NDCG@K 1[r_u <= K] / log2(r_u + 1) (abpo.evaluation.metrics). The paired differences
d_u = a_u - b_u carry the comparison; with 0/1 hits a user differs only when exactly one version hits (a discordant
pair: a *win* when only the challenger hits, a *loss* when only the champion does), so with W wins and L losses

    diff  = mean_u d_u = (W - L) / n
    SE    = sqrt((mean_u d_u^2 - diff^2) / n)  = sqrt((W + L) / n - diff^2) / sqrt(n)   for 0/1 hits

(the sample variance of d with denominator n). Non-inferiority at absolute margin m, one-sided at level alpha:

    H0: delta <= -m  against  H1: delta > -m            (delta = the users' expected d)

**0/1 values (HR@K): Tango's score test** (Tango 1998, "Equivalence test and confidence interval for the difference
in proportions for the paired-sample design", Statistics in Medicine 17:891-908: its score statistic, the restricted
MLE of q21 and the interval by inverting it; the non-inferiority form of Liu, Hsueh, Hsieh & Chen 2002). In Tango's 2x2 table b = W (only the challenger hits), c = L; at delta_0 = -m

    Z(delta_0) = (b - c - n delta_0) / sqrt(n (2 q21 + delta_0 (1 - delta_0)))                     (Tango's Z)
    q21        = (sqrt(B^2 - 4 A C) - B) / (2 A),  A = 2n,  B = -b - c + (2n - b + c) delta_0,
                 C = -c delta_0 (1 - delta_0)                                                        (restricted MLE)

q21 is the maximum likelihood estimate of P(loss) under the constraint delta = delta_0, so the variance is the one
the null implies, not the observed one: with few discordant users the Wald SE collapses towards 0 (all ties give
SE 0) while Tango's stays at least sqrt(m (1 - m) / n). p = 1 - Phi(Z(-m)); pass iff p < alpha. The one-sided
(1 - alpha) lower confidence bound is the score interval's (Tango's interval): the delta_0 at which Z(delta_0) =
z_{1-alpha} (Z decreases in delta_0; found by bisection), so pass iff lower > -m, as with the Wald test. Its size
at the margin is checked by simulation (:func:`simulated_size`, tests/evaluation/test_paired.py, docs/gate.md):
at most 0.026 at nominal 0.025 from 0 to 100 expected discordant users, where the Wald test's reached 0.61.

**Other values (NDCG@K): the Wald test** (normal approximation of diff; anti-conservative with few users who differ):

    lower = diff - z_{1-alpha} * SE,   p = 1 - Phi((diff + m) / SE)   (pass iff lower > -m, iff p < alpha)

With SE = 0 (every d_u equal) the bound is diff itself and p is 0 or 1.

Both report Eq. MDE = (z_{1-alpha} + z_{power}) * SE, the distance above -m of a true difference the test passes
with probability ``power`` (by the Wald SE; it sizes the reading, never the decision)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

WALD = "paired Wald (normal approximation), SE from the paired differences"
TANGO = "Tango score test (1998) for paired proportions, variance at the margin"
METHOD = WALD  # kept for readers of old results; a test's own ``method`` says which it ran


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
    method: str = WALD
    statistic: float = math.nan  # Tango's Z(-margin) (0/1 values), or the Wald z (diff + margin) / SE


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


def tango_z(wins, losses, n: int, delta0: float) -> np.ndarray:
    """Tango's score statistic Z(delta_0) of the module docstring for H0: delta = ``delta0`` (challenger minus
    champion), vectorised over arrays of ``wins`` (Tango's b) and ``losses`` (c) among ``n`` users; ``delta0`` in
    (-1, 1). Where the restricted variance is 0 (every user ties and delta0 = 0), Z is 0 for a zero numerator and
    +-inf otherwise."""
    b = np.asarray(wins, dtype=np.float64)
    c = np.asarray(losses, dtype=np.float64)
    d0 = float(delta0)
    a_ = 2.0 * n
    b_ = -b - c + (2.0 * n - b + c) * d0
    c_ = -c * d0 * (1.0 - d0)
    q21 = (np.sqrt(np.maximum(b_ * b_ - 4.0 * a_ * c_, 0.0)) - b_) / (2.0 * a_)
    var = np.maximum(n * (2.0 * q21 + d0 * (1.0 - d0)), 0.0)
    num = b - c - n * d0
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(var > 0, num / np.sqrt(var), np.sign(num) * np.inf)
    return np.where((var <= 0) & (num == 0), 0.0, z)


def tango_p_value(wins, losses, n: int, margin: float) -> np.ndarray:
    """The one-sided p-value of H0: delta <= -``margin`` by Tango's score test, 1 - Phi(Z(-margin)), vectorised over
    ``wins`` and ``losses``. A margin >= 1 leaves only "every user a loss" in H0 (p 1 there, else 0); a margin <= -1
    demands more than every user won (p 1)."""
    b = np.asarray(wins, dtype=np.float64)
    c = np.asarray(losses, dtype=np.float64)
    if margin >= 1.0:
        return np.where(c >= n, 1.0, 0.0) + 0.0 * b
    if margin <= -1.0:
        return np.ones(np.broadcast(b, c).shape)
    z = tango_z(b, c, n, -margin)
    return 0.5 * _erfc(z / math.sqrt(2.0))


def _erfc(x: np.ndarray) -> np.ndarray:
    from scipy.special import erfc

    return erfc(x)


def tango_lower_bound(wins: int, losses: int, n: int, alpha: float, *, tol: float = 1e-10) -> float:
    """The one-sided (1 - ``alpha``) lower confidence bound of delta by inverting Tango's score test: the delta_0
    in [-1, diff] at which Z(delta_0) = z_{1-alpha} (bisection; Z decreases in delta_0), -1 when even delta_0 -> -1
    is not rejected."""
    z_crit = NormalDist().inv_cdf(1.0 - alpha)
    hi = (wins - losses) / n  # Z(diff) = 0 < z_crit
    lo = -1.0 + 1e-12
    if float(tango_z(wins, losses, n, lo)) <= z_crit:
        return -1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if float(tango_z(wins, losses, n, mid)) > z_crit:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def simulated_size(
    n: int, discordance: float, margin: float, alpha: float = 0.025, *, reps: int = 200_000, seed: int = 0
) -> tuple[float, float]:
    """(Tango's, Wald's) size at the margin by simulation: ``reps`` draws of n users whose hits differ with
    probability ``discordance`` (psi), wins and losses at P(win) = (psi - m) / 2 and P(loss) = (psi + m) / 2, so the
    true difference is exactly -m (the boundary of H0; psi >= m); the share of draws each test passes. The expected
    number of discordant users is n psi."""
    if not margin <= discordance <= 1.0:
        raise ValueError(f"simulated_size: discordance {discordance}; rule: margin {margin} <= discordance <= 1")
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, [(discordance - margin) / 2, (discordance + margin) / 2, 1 - discordance], size=reps)
    wins, losses = counts[:, 0], counts[:, 1]
    tango = tango_p_value(wins, losses, n, margin) < alpha
    diff = (wins - losses) / n
    se = np.sqrt(np.maximum((wins + losses) / n - diff * diff, 0.0) / n)
    wald = diff - NormalDist().inv_cdf(1.0 - alpha) * se > -margin
    return float(tango.mean()), float(wald.mean())


def paired_noninferiority(
    challenger: Sequence[float] | np.ndarray,
    champion: Sequence[float] | np.ndarray,
    *,
    margin: float,
    alpha: float = 0.025,
    power: float = 0.8,
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
    wins, losses = int(np.sum(d > 0)), int(np.sum(d < 0))
    binary = bool(np.all((a == 0) | (a == 1)) and np.all((b == 0) | (b == 1)))
    if binary:  # Tango's score test (module docstring)
        p = float(tango_p_value(wins, losses, n, margin))
        stat = float(tango_z(wins, losses, n, -margin)) if -1.0 < margin < 1.0 else math.nan
        lower = tango_lower_bound(wins, losses, n, alpha)
        passed = p < alpha
        method = TANGO
    elif se > 0:  # Wald
        lower = diff - z.inv_cdf(1.0 - alpha) * se
        stat = (diff + margin) / se
        p = 1.0 - z.cdf(stat)
        passed, method = lower > -margin, WALD
    else:
        lower, p = diff, (0.0 if diff > -margin else 1.0)
        stat = math.copysign(math.inf, diff + margin) if diff + margin != 0 else 0.0
        passed, method = lower > -margin, WALD
    return PairedTest(
        n=n,
        challenger=float(a.mean()),
        champion=float(b.mean()),
        diff=diff,
        se=se,
        lower=float(lower),
        margin=margin,
        alpha=alpha,
        p_value=float(p),
        power=power,
        mde=mde(se, alpha, power),
        wins=wins,
        losses=losses,
        ties=int(np.sum(d == 0)),
        passed=bool(passed),
        method=method,
        statistic=float(stat),
    )
