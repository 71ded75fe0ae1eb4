"""The gate's decision (step ``gate``, abpo.monthly.gate): :func:`gate_verdict`, a pure function of the offline
paired non-inferiority test's numbers and the off-policy comparison's (docs/gate.md); abpo.monthly.gate computes the
numbers and applies it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from abpo.evaluation.paired import TANGO, paired_noninferiority, per_user_values


@dataclasses.dataclass(frozen=True)
class GateVerdict:
    """What :func:`gate_verdict` decided: both halves and the reason printed, logged and tagged."""

    passed: bool
    offline_passed: bool
    ope_passed: bool  # True when the off-policy half did not run
    reason: str
    offline: dict[str, Any] = dataclasses.field(default_factory=dict)  # PairedTest's numbers ({} when not finite)


ESTIMATOR_NAMES = {
    "snips": "SNIPS (the arm's own rows)",
    "dm": "DM",
    "ips": "IPS",
    "snips_all": "SNIPS",
    "dr": "DR",
    "sndr": "SNDR",
    "switch_dr": "Switch-DR",
}


def ope_verdict(ope: dict[str, Any], margin: float, min_ess: float, max_top_share: float = 1.0) -> tuple[bool, str]:
    """The off-policy check of the gate, failing closed: a non-finite estimate (a NaN estimate, interval or effective
    sample size: e.g. a logged propensity so small that its weight overflowed) or an effective sample size below
    ``min_ess`` fails, whatever the interval says; otherwise the deciding estimator's interval's lower bound must be
    >= -``margin``. ``ope``: abpo.monthly.gate.ope_numbers (``estimator`` names the one that decides; a result
    recorded before issue 42 has SNIPS's ``challenger_snips`` / ``champion_snips`` instead)."""
    name = ope.get("estimator", "snips")
    label = ESTIMATOR_NAMES.get(name, name)
    new_key, old_key = (
        ("challenger_estimate", "champion_estimate")
        if "challenger_estimate" in ope
        else ("challenger_snips", "champion_snips")
    )
    keys = (new_key, old_key, "diff", "ci_low", "ci_high", "challenger_ess")
    bad = [k for k in keys if not isinstance(ope.get(k), (int, float)) or not math.isfinite(float(ope[k]))]
    if bad:
        return False, (
            f"off-policy estimate not finite ({', '.join(f'{k} {ope.get(k)}' for k in bad)}) on "
            f"{ope.get('n')} rows: fails closed"
        )
    rows = "every arm's rows" if ope.get("rows") == "all" else "rows"
    top = ope.get("challenger_top_weight_share")
    if top is not None and not (isinstance(top, (int, float)) and float(top) <= max_top_share):
        return False, (
            f"off-policy weights: the {ope.get('top_weight_rows')} largest of {ope.get('n')} rows carry "
            f"{float(top):.1%} of the challenger's total weight > arms.gate_max_top_weight_share "
            f"{max_top_share:g}: fails closed ({label} diff {ope['diff']:+.4f})"
        )
    if ope["challenger_ess"] < min_ess:
        return False, (
            f"off-policy effective sample size {ope['challenger_ess']:.1f} of {ope.get('n')} rows < "
            f"arms.gate_min_ess {min_ess:g}: fails closed ({label} diff {ope['diff']:+.4f})"
        )
    ok = bool(ope["ci_low"] >= -margin)
    return ok, (
        f"off-policy {label} CTR challenger {ope[new_key]:.4f} vs champion {ope[old_key]:.4f} on {ope['n']} "
        f"{rows}: diff {ope['diff']:+.4f}, {ope['confidence']:.0%} CI [{ope['ci_low']:+.4f}, {ope['ci_high']:+.4f}] "
        f"{'>=' if ok else '<'} -margin {margin} (ESS {ope['challenger_ess']:.0f})"
    )


def offline_verdict(
    *,
    metric: str,
    challenger_ranks: Sequence[int],
    champion_ranks: Sequence[int],
    margin: float,
    alpha: float,
    power: float,
    challenger_version: str,
    champion_version: str,
) -> tuple[bool, str, dict[str, Any]]:
    """The offline check of the gate: the paired non-inferiority test (abpo.evaluation.paired) of ``metric``'s
    per-user values, from both versions' target ranks on the same users in the same order; (passed, reason, the
    test's numbers). A non-finite margin fails closed; a metric without per-user values (not HR@K or NDCG@K) or
    rank lists of different users is a ValueError naming the rule."""

    if len(challenger_ranks) != len(champion_ranks):
        raise ValueError(
            f"gate: {len(challenger_ranks)} challenger and {len(champion_ranks)} champion per-user ranks; "
            "rule: both versions scored on the same gate users"
        )
    if not math.isfinite(float(margin)):
        return False, f"offline {metric}: arms.gate_margin {margin} not finite: fails closed", {}
    try:
        new, old = per_user_values(challenger_ranks, metric), per_user_values(champion_ranks, metric)
    except ValueError as e:
        raise ValueError(f"gate: arms.gate_metric {metric!r}: {e}") from e
    try:
        t = paired_noninferiority(new, old, margin=margin, alpha=alpha, power=power)
    except ValueError as e:
        raise ValueError(f"gate (arms.gate_alpha {alpha!r}, arms.gate_power {power!r}): {e}") from e
    reason = (
        f"offline {metric} challenger v{challenger_version} {t.challenger:.4f} vs champion v{champion_version} "
        f"{t.champion:.4f} on {t.n} users (paired: {t.wins} won, {t.losses} lost, {t.ties} tied): diff "
        f"{t.diff:+.4f}, one-sided {1 - t.alpha:.1%} lower bound {t.lower:+.4f} "
        f"{'>' if t.passed else '<='} -margin {-t.margin:+.4f} ({'Tango score' if t.method == TANGO else 'Wald'} "
        f"z {t.statistic:.3f}, p {t.p_value:.3g} for diff <= -margin; MDE {t.mde:.4f} at {t.power:.0%} power)"
    )
    return t.passed, reason, dataclasses.asdict(t)


def gate_verdict(
    *,
    metric: str,
    challenger_ranks: Sequence[int],
    champion_ranks: Sequence[int],
    margin: float,
    challenger_version: str,
    champion_version: str,
    alpha: float = 0.025,
    power: float = 0.8,
    ope: dict[str, Any] | None = None,
    ope_margin: float = 0.0,
    min_ess: float = 0.0,
    month: str | None = None,
    max_top_share: float = 1.0,
) -> GateVerdict:
    """The gate's decision, a pure function of the numbers (no registry, no MLflow). Offline:
    :func:`offline_verdict` on both versions' per-user target ranks (the same users, the same order) at ``margin``,
    ``alpha`` (``power`` only sizes the reported MDE). Off-policy (when ``ope`` is given): :func:`ope_verdict` with
    ``ope_margin``, ``min_ess`` and ``max_top_share``. Both must pass."""
    offline_ok, why, numbers = offline_verdict(
        metric=metric,
        challenger_ranks=challenger_ranks,
        champion_ranks=champion_ranks,
        margin=margin,
        alpha=alpha,
        power=power,
        challenger_version=challenger_version,
        champion_version=champion_version,
    )
    reasons = [why]
    ope_ok = True
    if ope is not None:
        ope_ok, why = ope_verdict(ope, ope_margin, min_ess, max_top_share)
        reasons.append(f"{why} ({month})" if month else why)
    return GateVerdict(offline_ok and ope_ok, offline_ok, ope_ok, "; ".join(reasons), numbers)
