"""The A/B statistics of docs/ABPO_SPEC.md "Metrics / Online", one small function per test.

Everything here works on counts (impressions, clicks, users and per-user moments), never on raw
logs: the aggregation happens in DuckDB (sql/report_user_moments.sql, over the per-user-month aggregate
that ingest maintains), so the cost of a report follows the number of user-months, not of impressions.

Undefined results (a test with no data, or with a zero standard error) are NaN plus a ``note``
saying why; nothing raises on an edge case and nothing is silently replaced by a made-up number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scipy import stats as _st


def z_critical(confidence: float) -> float:
    """Two-sided critical value z_{1-alpha/2} for a confidence level 1-alpha (0.95 -> 1.959964)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(_st.norm.ppf(0.5 + confidence / 2.0))


def two_sided_p(z: float) -> float:
    """p = 2 * (1 - Phi(|z|)), computed as 2 * Phi(-|z|) (the survival function keeps precision for large |z|)."""
    if math.isnan(z):
        return math.nan
    return float(2.0 * _st.norm.sf(abs(z)))


def ctr(clicks: int, impressions: int) -> float:
    """CTR = clicks / impressions; NaN for zero impressions."""
    return clicks / impressions if impressions > 0 else math.nan


def wilson_interval(clicks: int, impressions: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of one proportion (Wilson 1927):
    (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n).
    Used for the per-arm CTR bands: unlike the Wald interval it does not collapse to a point at 0 clicks.

    The bounds are exact where the formula is: the lower bound is 0 at 0 clicks and the upper bound 1 at
    ``clicks == impressions`` (in floating point ``centre - half`` comes out near +5e-17 instead of 0, above the
    CTR itself, and the report's plot got a negative error bar), and lower <= CTR <= upper always."""
    if impressions <= 0:
        return (math.nan, math.nan)
    if not 0 <= clicks <= impressions:
        raise ValueError(f"wilson_interval: clicks {clicks} not in [0, impressions {impressions}]")
    z = z_critical(confidence)
    n = float(impressions)
    p = clicks / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if clicks == 0 else min(p, max(0.0, centre - half))
    high = 1.0 if clicks == impressions else max(p, min(1.0, centre + half))
    return (low, high)


@dataclass(frozen=True)
class DiffTest:
    """Result of comparing proportion a with proportion b (difference = a - b)."""

    ctr_a: float
    ctr_b: float
    diff: float  # ctr_a - ctr_b, as a fraction (x100 for percentage points)
    se: float  # standard error used in the z statistic
    z: float
    p: float
    ci_low: float  # confidence interval of diff, as a fraction
    ci_high: float
    note: str = ""
    mde: float = math.nan  # minimum detectable effect of this design at the report's power (as a fraction)

    @property
    def diff_pp(self) -> float:
        return 100.0 * self.diff

    @property
    def defined(self) -> bool:
        return not math.isnan(self.z)


def z_power(power: float) -> float:
    """z_{power}: the standard normal quantile at ``power`` (0.8 -> 0.8416)."""
    if not 0.0 < power < 1.0:
        raise ValueError(f"config report.power = {power!r}: expected a probability in (0, 1)")
    return float(_st.norm.ppf(power))


def minimum_detectable_effect(se: float, confidence: float = 0.95, power: float = 0.8) -> float:
    """The smallest true difference a two-sided z-test at level 1 - ``confidence`` detects with probability
    ``power``, for a design whose difference has standard error ``se`` under the null:

        MDE = (z_{1-alpha/2} + z_{power}) * SE

    (the normal approximation; the chance of rejecting on the wrong side is ignored). For two proportions with
    n_a, n_b impressions and pooled rate p: SE = sqrt(p (1 - p) (1/n_a + 1/n_b)); for the user-clustered test the
    delta-method SE. NaN when the SE is."""
    if math.isnan(se):
        return math.nan
    return (z_critical(confidence) + z_power(power)) * se


def two_proportion_ztest(
    clicks_a: int,
    impressions_a: int,
    clicks_b: int,
    impressions_b: int,
    confidence: float = 0.95,
    power: float = 0.8,
) -> DiffTest:
    """Two-sided two-proportion z-test with the pooled standard error (the textbook test; equal to
    statsmodels ``proportions_ztest([xa, xb], [na, nb])``):

        p_a = x_a / n_a,  p_b = x_b / n_b,  p_pool = (x_a + x_b) / (n_a + n_b)
        SE_pool = sqrt( p_pool (1 - p_pool) (1/n_a + 1/n_b) )
        z = (p_a - p_b) / SE_pool,  p = 2 (1 - Phi(|z|))

    The confidence interval of p_a - p_b is the Wald interval with the unpooled SE
    sqrt(p_a(1-p_a)/n_a + p_b(1-p_b)/n_b) (the pooled SE assumes H0, so it is only used for the test).
    ``mde``: :func:`minimum_detectable_effect` with the pooled SE, at ``power``.
    """
    for name, v in (
        ("clicks_a", clicks_a),
        ("impressions_a", impressions_a),
        ("clicks_b", clicks_b),
        ("impressions_b", impressions_b),
    ):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    if clicks_a > impressions_a or clicks_b > impressions_b:
        raise ValueError(f"clicks exceed impressions: {clicks_a}/{impressions_a} vs {clicks_b}/{impressions_b}")
    nan = math.nan
    if impressions_a == 0 or impressions_b == 0:
        which = (
            "both sides"
            if impressions_a == impressions_b == 0
            else ("first side" if impressions_a == 0 else "second side")
        )
        return DiffTest(
            ctr(clicks_a, impressions_a),
            ctr(clicks_b, impressions_b),
            nan,
            nan,
            nan,
            nan,
            nan,
            nan,
            note=f"no impressions on the {which}: test undefined",
        )
    pa, pb = clicks_a / impressions_a, clicks_b / impressions_b
    diff = pa - pb
    zc = z_critical(confidence)
    se_unpooled = math.sqrt(pa * (1 - pa) / impressions_a + pb * (1 - pb) / impressions_b)
    ci = (diff - zc * se_unpooled, diff + zc * se_unpooled)
    pool = (clicks_a + clicks_b) / (impressions_a + impressions_b)
    se = math.sqrt(pool * (1 - pool) * (1 / impressions_a + 1 / impressions_b))
    if se == 0.0:
        what = "no clicks" if pool == 0.0 else "every impression clicked"
        return DiffTest(
            pa, pb, diff, 0.0, nan, nan, ci[0], ci[1], note=f"{what} on both sides: pooled SE is 0, test undefined"
        )
    z = diff / se
    return DiffTest(
        pa, pb, diff, se, z, two_sided_p(z), ci[0], ci[1], mde=minimum_detectable_effect(se, confidence, power)
    )


@dataclass(frozen=True)
class UserMoments:
    """Per-user sums of one arm (and period), enough for the delta method without the raw rows.

    For users u = 1..n with X_u clicks and Y_u impressions:
    n = users, sx = sum X_u, sy = sum Y_u, sxx = sum X_u^2, syy = sum Y_u^2, sxy = sum X_u Y_u.
    """

    users: int
    sx: float
    sy: float
    sxx: float
    syy: float
    sxy: float

    @classmethod
    def from_row(cls, r) -> UserMoments:
        """One row of sql/report_user_moments.sql (users, clicks, impressions, clicks_sq, impressions_sq,
        clicks_x_impressions)."""
        return cls(
            users=int(r["users"]),
            sx=float(r["clicks"]),
            sy=float(r["impressions"]),
            sxx=float(r["clicks_sq"]),
            syy=float(r["impressions_sq"]),
            sxy=float(r["clicks_x_impressions"]),
        )


def delta_method_ctr_variance(m: UserMoments) -> float:
    """Variance of the ratio CTR R = sum X / sum Y when users (clusters) are the randomisation unit
    (delta method for a ratio of means; Deng, Knoblich, Lu 2018, "Applying the Delta Method in Metric
    Analytics", eq. for Var(X_bar / Y_bar)):

        Var(R) ~= ( s_X^2 - 2 R s_XY + R^2 s_Y^2 ) / ( n * Ybar^2 )

    with sample (co)variances over users. Because sum(X - R Y) = 0, the numerator equals
    sum_u (X_u - R Y_u)^2 / (n - 1) = (sxx - 2 R sxy + R^2 syy) / (n - 1), which uses the moments only.
    NaN when n < 2 or there are no impressions.
    """
    n = m.users
    if n < 2 or m.sy <= 0:
        return math.nan
    r = m.sx / m.sy
    resid_ss = m.sxx - 2.0 * r * m.sxy + r * r * m.syy
    resid_ss = max(resid_ss, 0.0)  # float cancellation can leave a tiny negative number
    ybar = m.sy / n
    return resid_ss / (n - 1) / (n * ybar * ybar)


def clustered_ztest(a: UserMoments, b: UserMoments, confidence: float = 0.95, power: float = 0.8) -> DiffTest:
    """User-clustered z-test of CTR_a - CTR_b: z = (R_a - R_b) / sqrt(Var(R_a) + Var(R_b)) with the
    delta-method variances above (unpooled; arms hold disjoint users). CI: diff +- z_{1-alpha/2} * SE; ``mde``:
    :func:`minimum_detectable_effect` with that SE."""
    nan = math.nan
    ra = a.sx / a.sy if a.sy > 0 else nan
    rb = b.sx / b.sy if b.sy > 0 else nan
    va, vb = delta_method_ctr_variance(a), delta_method_ctr_variance(b)
    if math.isnan(va) or math.isnan(vb):
        short = [name for name, m in (("first", a), ("second", b)) if m.users < 2 or m.sy <= 0]
        return DiffTest(
            ra,
            rb,
            ra - rb,
            nan,
            nan,
            nan,
            nan,
            nan,
            note=f"fewer than 2 users with impressions on the {' and '.join(short)} side: clustered test undefined",
        )
    diff = ra - rb
    se = math.sqrt(va + vb)
    zc = z_critical(confidence)
    if se == 0.0:
        return DiffTest(
            ra,
            rb,
            diff,
            0.0,
            nan,
            nan,
            diff,
            diff,
            note="every user has the same CTR on both sides: clustered SE is 0, test undefined",
        )
    z = diff / se
    return DiffTest(
        ra,
        rb,
        diff,
        se,
        z,
        two_sided_p(z),
        diff - zc * se,
        diff + zc * se,
        mde=minimum_detectable_effect(se, confidence, power),
    )


def holm_adjust(pvalues: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjustment: sort the m p-values ascending, p_(i) -> max_{j<=i} min(1, (m-j+1) p_(j)).
    NaN entries (undefined tests) are left NaN and do not count towards m."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    m = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda k: pvalues[k])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


@dataclass(frozen=True)
class SRMResult:
    """Pearson chi-square goodness of fit of observed users per arm against the configured shares."""

    arms: list[str]
    observed: list[int]
    expected: list[float]
    chi2: float
    dof: int
    p: float
    mismatch: bool
    note: str = ""
    excluded: list[str] = field(default_factory=list)
    too_few: bool = False  # an expected count below SRM_MIN_EXPECTED: a p above alpha says nothing


# Pearson's chi-square approximation needs about 5 expected observations per cell (Cochran's rule); below it a large
# p-value is no evidence that the split matches the shares (4 users across 4 arms "passed" the check).
SRM_MIN_EXPECTED = 5.0


def srm_test(observed: dict[str, int], shares: dict[str, float], alpha: float = 0.001) -> SRMResult:
    """Sample-ratio-mismatch check: chi^2 = sum_k (O_k - E_k)^2 / E_k with E_k = N * s_k / sum(s), over the
    arms present (shares renormalised to them), dof = K - 1, flagged when p < alpha.

    Arms without a configured share cannot be tested: they are listed in ``excluded`` and in the note.
    """
    excluded = sorted(a for a in observed if a not in shares)
    arms = sorted(a for a in observed if a in shares)
    obs = [int(observed[a]) for a in arms]
    notes = []
    if excluded:
        notes.append(f"no configured share for {', '.join(excluded)}: left out of the check")
    bad = [a for a in arms if shares[a] <= 0]
    if bad:
        notes.append(f"configured share <= 0 for {', '.join(bad)} but users observed")
    total = sum(obs)
    if len(arms) < 2 or total == 0 or bad:
        notes.append("fewer than two arms with users and a share: check undefined" if not bad else "check undefined")
        return SRMResult(
            arms,
            obs,
            [math.nan] * len(arms),
            math.nan,
            max(len(arms) - 1, 0),
            math.nan,
            False,
            note="; ".join(notes),
            excluded=excluded,
        )
    s = sum(shares[a] for a in arms)
    exp = [total * shares[a] / s for a in arms]
    chi2 = float(sum((o - e) ** 2 / e for o, e in zip(obs, exp)))
    dof = len(arms) - 1
    p = float(_st.chi2.sf(chi2, dof))
    small = [a for a, e in zip(arms, exp) if e < SRM_MIN_EXPECTED]
    if small:
        notes.append(
            f"{total:,} users: fewer than {SRM_MIN_EXPECTED:g} expected in {', '.join(small)}, too few users to "
            "check the split"
        )
    return SRMResult(
        arms, obs, exp, chi2, dof, p, p < alpha, note="; ".join(notes), excluded=excluded, too_few=bool(small)
    )


def format_p(p: float) -> str:
    """p to 3 decimals, `<0.001` below that, `n/a` when undefined."""
    if p is None or math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def format_z(z: float) -> str:
    """z to 2 decimals, `n/a` when undefined."""
    if z is None or math.isnan(z):
        return "n/a"
    return f"{z:.2f}"
