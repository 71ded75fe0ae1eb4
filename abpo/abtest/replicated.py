"""The statistics of a replicated loop experiment (`abpo loop-experiment`, docs/report.md "The replicated loop
experiment"): S independent runs of the monthly loop (replicates: the same data, seed and pi_init, each with its
own traffic draws and its own random split of users into arms), compared arm against arm with a two-stage interval:
replicates first, users within a replicate second.

In replicate s = 1..S, an arm's CTR over a period is the ratio R_s = sum_u X_u / sum_u Y_u over its users (X_u
clicks, Y_u impressions of user u in the period), with the user-clustered delta-method variance
V_s = Var(R_s) of abpo.abtest.stats.delta_method_ctr_variance (Deng, Knoblich, Lu 2018). For a pair of arms (a, b):

    Δ_s  = R_{a,s} - R_{b,s}                         the replicate's difference (arms hold disjoint users)
    v_s  = V_{a,s} + V_{b,s}                         its within-replicate (between-users) variance

    Δ̄    = (1/S) sum_s Δ_s                           the estimate: replicates weigh the same (exchangeable by design)
    s²_B = sum_s (Δ_s - Δ̄)² / (S - 1)                between-replicate variance of Δ_s (S >= 2)
    v̄_W  = (1/S) sum_s v_s                           mean within-replicate variance
    SE²  = max(s²_B, v̄_W) / S                        (S = 1: SE² = v_1, the one replicate's clustered variance)

Why this variance (Eq. RV): Δ_s varies for two nested reasons, the replicate's own draws and update trajectory
(variance σ²_B) and the sampling of users and impressions inside it (variance v_s), so Var(Δ_s) = σ²_B + v_s and
Var(Δ̄) = Var(Δ_s) / S. s²_B estimates σ²_B + v̄_W without bias (the two-stage sampling result that the variance
of primary units' estimates carries every later stage's: Cochran 1977, Sampling Techniques, ch. 10, the
"ultimate cluster" estimator), but with S - 1 degrees of freedom; v̄_W estimates the users' part alone from
thousands of users. Taking the larger of the two is the method-of-moments estimate of the between-replicate
component truncated at 0, σ̂²_B = max(0, s²_B - v̄_W) (DerSimonian and Laird 1986, equal within variances), added
back to v̄_W: the interval is never narrower than the users' sampling alone allows, and widens when replicates
disagree more than their users explain. The interval and test are normal: Δ̄ ± z_{1-α/2} SE, z = Δ̄ / SE,
p = 2 Φ(-|z|), MDE = (z_{1-α/2} + z_{power}) SE (abpo.abtest.stats.minimum_detectable_effect). With few replicates
s²_B is itself uncertain; read an interval whose basis is "between" with S below 5 as approximate.

Replicates needed for a target MDE δ (the design, Eq. RS): S = ceil( (z_{1-α/2} + z_{power})² Var(Δ_s) / δ² ), with
Var(Δ_s) = max(s²_B, v̄_W) measured at a pilot S.

An arm or period that a replicate lacks (fewer than 2 users with impressions) makes that comparison undefined
(NaN, with a note naming the replicate); nothing is dropped silently. Pure functions of counts: no warehouse, no
files (abpo.experiment.loop_experiment reads the replicates' warehouses).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from abpo.abtest import stats

ALL = "all"  # the whole-period row of sql/report_user_moments.sql

# Per replicate: period ("YYYY-MM" or ALL) -> arm -> that arm's per-user moments in the period
ReplicateMoments = Mapping[str, Mapping[str, stats.UserMoments]]


@dataclass(frozen=True)
class TwoStage:
    """Replicated estimate of one quantity (an arm's CTR, or a pair's CTR difference), as fractions."""

    estimate: float  # Δ̄ (or the mean CTR)
    se: float
    z: float
    p: float
    ci_low: float
    ci_high: float
    mde: float
    replicates: int  # S
    between_var: float  # s²_B (NaN for S = 1)
    within_var: float  # v̄_W
    between_component: float  # σ̂²_B = max(0, s²_B - v̄_W) (NaN for S = 1)
    basis: str  # "between" (s²_B >= v̄_W), "within" (v̄_W larger, or S = 1) or "" (undefined)
    per_replicate: list[float] = field(default_factory=list)  # Δ_s (or R_s), replicate order
    note: str = ""

    @property
    def defined(self) -> bool:
        return not math.isnan(self.se)

    def to_json(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def _undefined(estimates: Sequence[float], note: str) -> TwoStage:
    nan = math.nan
    finite = [e for e in estimates if not math.isnan(e)]
    est = sum(finite) / len(finite) if finite and len(finite) == len(estimates) else nan
    return TwoStage(est, nan, nan, nan, nan, nan, nan, len(estimates), nan, nan, nan, "", list(estimates), note)


def two_stage(
    estimates: Sequence[float], variances: Sequence[float], confidence: float = 0.95, power: float = 0.8
) -> TwoStage:
    """Combine per-replicate ``estimates`` with their within-replicate ``variances`` (Eq. RV of the module
    docstring): Δ̄ = mean, SE² = max(s²_B, v̄_W) / S (S = 1: the one variance), normal interval, p and MDE."""
    if len(estimates) != len(variances):
        raise ValueError(f"two_stage: {len(estimates)} estimates but {len(variances)} variances; rule: one each")
    s = len(estimates)
    if s == 0:
        return _undefined([], "no replicate")
    bad = [i for i, (e, v) in enumerate(zip(estimates, variances)) if math.isnan(e) or math.isnan(v) or v < 0]
    if bad:
        return _undefined(estimates, f"replicate(s) {bad} undefined (fewer than 2 users with impressions)")
    mean = sum(estimates) / s
    within = sum(variances) / s
    if s >= 2:
        between = sum((e - mean) ** 2 for e in estimates) / (s - 1)
        var = max(between, within)
        basis = "between" if between >= within else "within"
        component = max(0.0, between - within)
    else:
        between = component = math.nan
        var, basis = within, "within"
    se = math.sqrt(var / s)
    if se == 0.0:
        return TwoStage(
            mean, 0.0, math.nan, math.nan, mean, mean, math.nan, s, between, within, component, basis,
            list(estimates), "standard error 0 (every user and replicate alike): test undefined",
        )  # fmt: skip
    zc = stats.z_critical(confidence)
    z = mean / se
    return TwoStage(
        mean,
        se,
        z,
        stats.two_sided_p(z),
        mean - zc * se,
        mean + zc * se,
        stats.minimum_detectable_effect(se, confidence, power),
        s,
        between,
        within,
        component,
        basis,
        list(estimates),
    )


def ratio_and_variance(m: stats.UserMoments | None) -> tuple[float, float]:
    """(R, Var(R)) of one arm in one replicate and period: R = sum X / sum Y, the delta-method variance over users;
    (NaN, NaN) when the arm has no impressions there."""
    if m is None or m.sy <= 0:
        return math.nan, math.nan
    return m.sx / m.sy, stats.delta_method_ctr_variance(m)


def arm_ctr(
    replicates: Sequence[ReplicateMoments], period: str, arm: str, confidence: float = 0.95, power: float = 0.8
) -> TwoStage:
    """An arm's CTR over ``period``, replicated (Eq. RV with R_s and V_s in place of Δ_s and v_s; z and p test
    CTR = 0 and mean nothing; the interval is the figure)."""
    pairs = [ratio_and_variance(r.get(period, {}).get(arm)) for r in replicates]
    return two_stage([e for e, _ in pairs], [v for _, v in pairs], confidence, power)


def pair_difference(
    replicates: Sequence[ReplicateMoments],
    period: str,
    a: str,
    b: str,
    confidence: float = 0.95,
    power: float = 0.8,
) -> TwoStage:
    """CTR_a - CTR_b over ``period``, replicated: Δ_s, v_s per replicate, combined by :func:`two_stage`."""
    est, var = [], []
    for r in replicates:
        ra, va = ratio_and_variance(r.get(period, {}).get(a))
        rb, vb = ratio_and_variance(r.get(period, {}).get(b))
        est.append(ra - rb)
        var.append(va + vb)
    return two_stage(est, var, confidence, power)


def replicates_for_mde(target: float, per_replicate_var: float, confidence: float = 0.95, power: float = 0.8) -> int:
    """Eq. RS: the replicates S that bring the MDE to ``target`` (a fraction) when one replicate's difference has
    variance ``per_replicate_var`` (max(s²_B, v̄_W) of a pilot)."""
    if not target > 0:
        raise ValueError(f"replicates_for_mde: target {target!r}; rule: > 0")
    if math.isnan(per_replicate_var):
        return 0
    k = stats.z_critical(confidence) + stats.z_power(power)
    return max(1, math.ceil(k * k * per_replicate_var / (target * target)))


def arm_pairs(arms: Sequence[str], holdback: str = "", candidate: str = "") -> list[tuple[str, str]]:
    """Every pair of ``arms`` once, as (a, b) for a - b: each other arm minus the holdback first (does updating
    help?), then the candidate minus each other arm, then the rest in the arms' order."""
    out: list[tuple[str, str]] = []
    others = [a for a in arms if a != holdback]
    if holdback in arms:
        out += [(a, holdback) for a in others]
    if candidate in others:
        out += [(candidate, a) for a in others if a != candidate]
    for i, a in enumerate(others):
        for b in others[i + 1 :]:
            if (a, b) not in out and (b, a) not in out:
                out.append((a, b))
    return out


@dataclass
class ReplicatedReport:
    """Every figure of the replicated report: per period (each month, then ALL), each arm's CTR and each pair's
    difference, with Holm-adjusted p-values across the pairs of each period."""

    months: list[str]
    arms: list[str]
    pairs: list[tuple[str, str]]
    replicates: int
    confidence: float
    power: float
    ctr: dict[str, dict[str, TwoStage]]  # period -> arm -> CTR
    diffs: dict[str, dict[tuple[str, str], TwoStage]]  # period -> (a, b) -> CTR_a - CTR_b
    p_holm: dict[str, dict[tuple[str, str], float]]

    def to_json(self) -> dict[str, Any]:
        def nan_none(v: float) -> float | None:
            return None if math.isnan(v) else v

        return {
            "months": self.months,
            "arms": self.arms,
            "replicates": self.replicates,
            "confidence": self.confidence,
            "power": self.power,
            "periods": {
                period: {
                    "ctr": {arm: t.to_json() for arm, t in self.ctr[period].items()},
                    "diffs": [
                        {"a": a, "b": b, **t.to_json(), "p_holm": nan_none(self.p_holm[period][(a, b)])}
                        for (a, b), t in self.diffs[period].items()
                    ],
                }
                for period in [*self.months, ALL]
            },
        }


def analyse_replicates(
    replicates: Sequence[ReplicateMoments],
    months: Sequence[str],
    arms: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    confidence: float = 0.95,
    power: float = 0.8,
) -> ReplicatedReport:
    """The replicated report's numbers (module docstring) for every month of ``months`` and the whole period."""
    ctr: dict[str, dict[str, TwoStage]] = {}
    diffs: dict[str, dict[tuple[str, str], TwoStage]] = {}
    holm: dict[str, dict[tuple[str, str], float]] = {}
    for period in [*months, ALL]:
        ctr[period] = {arm: arm_ctr(replicates, period, arm, confidence, power) for arm in arms}
        diffs[period] = {(a, b): pair_difference(replicates, period, a, b, confidence, power) for a, b in pairs}
        adjusted = stats.holm_adjust([t.p for t in diffs[period].values()])
        holm[period] = dict(zip(diffs[period], adjusted))
    return ReplicatedReport(list(months), list(arms), list(pairs), len(replicates), confidence, power, ctr, diffs, holm)


def moments_by_period(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, stats.UserMoments]]:
    """sql/report_user_moments.sql's rows (period, arm, users, clicks, impressions, clicks_sq, impressions_sq,
    clicks_x_impressions) -> period -> arm -> UserMoments."""
    out: dict[str, dict[str, stats.UserMoments]] = {}
    for r in rows:
        out.setdefault(str(r["period"]), {})[str(r["arm"])] = stats.UserMoments.from_row(r)
    return out


# ---------------------------------------------------------------------------------------------------- markdown


def _pp(x: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:+.{digits}f}"


def _interval(t: TwoStage) -> str:
    if not t.defined:
        return f"{_pp(t.estimate)} (n/a: {t.note})" if t.note else "n/a"
    return f"{_pp(t.estimate)} [{_pp(t.ci_low)}, {_pp(t.ci_high)}]"


def _sd_pp(var: float) -> str:
    return "n/a" if math.isnan(var) else f"{100 * math.sqrt(var):.2f}"


def diff_table(report: ReplicatedReport, pairs: Sequence[tuple[str, str]], periods: Sequence[str]) -> list[str]:
    """Markdown rows: one per (period, pair): Δ̄ [CI] pp, p, Holm p, MDE pp, SD of Δ_s (between) and the users'
    SD (within) per replicate in pp, the basis of the SE."""
    lines = [
        "| Period | Pair | Δ (pp) [95% CI] | p | Holm p | MDE (pp) | SD between / within (pp) | SE from |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for period in periods:
        for a, b in pairs:
            t = report.diffs[period][(a, b)]
            label = "whole period" if period == ALL else period
            lines.append(
                f"| {label} | {a} − {b} | {_interval(t)} | {stats.format_p(t.p)} | "
                f"{stats.format_p(report.p_holm[period][(a, b)])} | {'n/a' if math.isnan(t.mde) else f'{100 * t.mde:.2f}'}"
                f" | {_sd_pp(t.between_var)} / {_sd_pp(t.within_var)} | {t.basis or 'n/a'} |"
            )
    return lines


def ctr_table(report: ReplicatedReport) -> list[str]:
    periods = [*report.months, ALL]
    head = ["Arm", *("whole period" if p == ALL else p for p in periods)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in report.arms:
        cells = []
        for p in periods:
            t = report.ctr[p][arm]
            cells.append(
                "n/a" if not t.defined else f"{100 * t.estimate:.3f}% [{100 * t.ci_low:.3f}, {100 * t.ci_high:.3f}]"
            )
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def replicated_markdown(report: ReplicatedReport, headline: Sequence[tuple[str, str]], title: str = "") -> str:
    """The report's markdown: the headline pairs per month and over the whole period, every pair over the whole
    period, each arm's CTR, and how the interval is computed."""
    s = report.replicates
    out = [
        f"# {title or 'Replicated loop experiment'}",
        "",
        f"{s} replicate(s) of the monthly loop, months {report.months[0]}..{report.months[-1]}; arms "
        f"{', '.join(report.arms)}. Differences in percentage points, {report.confidence:.0%} two-stage intervals "
        f"(replicates, then users within a replicate), MDE at {report.power:.0%} power.",
        "",
        "## Headline comparisons",
        "",
        *diff_table(report, headline, [ALL, *report.months]),
        "",
        "## Every pair, whole period",
        "",
        *diff_table(report, report.pairs, [ALL]),
        "",
        "## CTR per arm (mean over replicates, 95% interval)",
        "",
        *ctr_table(report),
        "",
        "## How to read it",
        "",
        "Each replicate s gives Δ_s = CTR_a − CTR_b over its own users and v_s, the user-clustered (delta-method) "
        "variance of Δ_s. Δ = mean of Δ_s; SE² = max(s²_B, v̄_W) / S with s²_B the variance of Δ_s across "
        "replicates and v̄_W the mean of v_s (abpo.abtest.replicated, Eq. RV). 'SD between / within' are "
        "sqrt(s²_B) and sqrt(v̄_W): one replicate's spread, and the part of it the users' sampling explains; "
        "'SE from' says which one the SE used. The MDE shrinks as 1/sqrt(S). Holm p adjusts across the pairs of "
        "the same period. Undefined figures show n/a with the reason.",
        "",
    ]
    notes = sorted({t.note for p in report.diffs.values() for t in p.values() if t.note})
    if notes:
        out += ["## Notes", "", *(f"- {n}" for n in notes), ""]
    return "\n".join(out)
