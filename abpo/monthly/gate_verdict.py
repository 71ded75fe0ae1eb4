"""The gate's decision (step ``gate``, abpo.monthly.gate): :func:`gate_verdict`, a pure function of the offline
paired non-inferiority test's numbers and the off-policy comparison's (docs/gate.md); abpo.monthly.gate computes the
numbers and applies it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from abpo.evaluation.off_policy import zero_click_upper_bound
from abpo.evaluation.paired import TANGO, paired_noninferiority, per_user_values, tango_lower_bound


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


# The effective sample size below which the off-policy half refuses an estimate whatever arms.gate_min_ess says (it may
# be set to 0, as tests/sizes.py's GATE_PASSES does). Kish's ESS = (sum w)^2 / sum w^2 >= sum w / max w, so an ESS below
# 2 means the heaviest row carries more than half of the total weight: the estimate is one impression's click with the
# rest of the month as a minority, and a bootstrap interval is the gap between resamples with and without that row.
# ESS 0 (no logged row carries weight) is below it too: the estimate is then the reward model's alone.
MIN_ESS_FLOOR = 2.0


def range_slack(n: Any) -> float:
    """How far outside [0, 1] a CTR estimate on ``n`` rows may lie and still be read as in range: half a click of the
    month, 1 / (2 n). A click rate over n rows moves in steps of 1/n, so a smaller excursion is the month's rounding
    (DR reads 1 + 8e-7 on a month where every row is clicked: the reward model's q = 1 - 1e-9 times weights whose mean
    is above 1), not an estimate that left the range (IPS 10^7 with every logged propensity 1e-9)."""
    return 0.5 / n if isinstance(n, int) and n > 0 else 0.0


def _num(ope: dict[str, Any], key: str) -> float:
    v = ope.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def ope_notes(ope: dict[str, Any] | None) -> list[str]:
    """Short notes on the off-policy half's numbers that its verdict states in full (:func:`ope_verdict`) and the
    report's gate section shows beside the interval: the arm served none of the rows, every row a no-response (the
    interval degenerate), every row clicked (only IPS sees mass moved off the logged items), an estimate outside
    [0, 1], a mean weight far above 1 (logged propensities too small) or far below (no support). [] for a result
    recorded without ``clicks``."""
    if not ope:
        return []
    notes = []
    n, clicks = ope.get("n"), ope.get("clicks")
    if ope.get("own_rows") == 0:
        notes.append("the arm served none of the month's rows")
    if isinstance(n, int) and n > 0 and clicks == 0:
        notes.append("every row a no-response: the interval is degenerate; decided on the zero-click bound")
    elif isinstance(n, int) and n > 0 and clicks == n:
        notes.append(
            "every row clicked: self-normalised estimators are blind to mass moved off the logged items; only IPS "
            "sees it"
        )
    values = [_num(ope, k) for k in ("challenger_estimate", "champion_estimate")]
    slack = range_slack(n)
    if clicks != 0 and any(math.isfinite(v) and not -slack <= v <= 1.0 + slack for v in values):
        notes.append("estimate outside [0, 1]: refused")
    breach = _mean_weight_breach(ope)
    if breach and breach[0] == "above":
        notes.append("mean weight pi/e0 far above 1 (logged propensities too small): refused")
    elif breach:
        notes.append("mean weight pi/e0 far below 1 (mass where the logs have no support): refused")
    return notes


def _no_rows(ope: dict[str, Any], label: str) -> str:
    """Decision case 1 of :func:`ope_verdict`: the deciding estimator read no row."""
    if ope.get("rows") == "own":
        total = ope.get("estimates", {}).get("sndr", {}).get("n", "?")
        return (
            f"off-policy {label}: no logged rows of the arm's own among the month's {total} rows (it served "
            "nothing; its challenger trained on the other arms' rows): no estimate; rule: "
            "arms.gate_ope_estimator snips reads the arm's own rows (dm, ips, snips_all, dr, sndr, switch_dr read "
            "every arm's): fails closed"
        )
    return f"off-policy {label}: no logged rows in the month: no estimate: fails closed"


def _too_few_effective_rows(ope: dict[str, Any], label: str, min_ess: float) -> str | None:
    """Decision case 4 of :func:`ope_verdict`: the reason when either version's ESS is below ``min_ess`` or
    MIN_ESS_FLOOR, else None (a result without a version's ESS is not checked on it)."""
    need = max(float(min_ess), MIN_ESS_FLOOR)
    for who in ("challenger", "champion"):
        ess = _num(ope, f"{who}_ess")
        if f"{who}_ess" not in ope or ess >= need:
            continue
        rule = (
            f"arms.gate_min_ess {min_ess:g}"
            if min_ess >= MIN_ESS_FLOOR
            else f"the gate's floor {MIN_ESS_FLOOR:g} (below it the heaviest row carries more than half of the "
            f"weight; arms.gate_min_ess is {min_ess:g})"
        )
        return (
            f"off-policy {who}'s effective sample size {ess:.1f} of {ope.get('n')} rows < {rule}: fails closed "
            f"({label} diff {ope['diff']:+.4f})"
        )
    return None


# How far a version's mean weight pi/e0 may lie above 1 (its expectation when e0 are the loggers' propensities) before
# the verdict says the logged propensities are too small (case 3 of ope_verdict): MEAN_WEIGHT_Z standard errors (a
# one-sided 4-sigma excursion of an honest month is a 3e-5 event) and at least MEAN_WEIGHT_FACTOR times 1, so that
# propensities that are approximations (rounded, or a synthetic month's drawn ones: abpo.data.synthetic's Beta(2, 8)
# against a uniform exposure, E[w] 1.125) are not read as broken; every logged propensity 1e-9 gives ~10^8.
# Below, by the same rule mirrored (under 1 - MEAN_WEIGHT_Z standard errors and under 1 / MEAN_WEIGHT_FACTOR): a
# version whose mass sits where the loggers put almost none has a sample mean far below 1, because the rows that
# would carry its large weights were (almost) never logged. Its estimate is then the reward model's extrapolation to
# items the logs never showed (DR, SNDR, DM and Switch-DR passed such a challenger at +0.84 with an interval 0.002
# wide), so the half fails closed: the logs do not support it.
MEAN_WEIGHT_Z = 4.0
MEAN_WEIGHT_FACTOR = 2.0


def _mean_weight_breach(ope: dict[str, Any]) -> tuple[str, str, float, float, float] | None:
    """(side, version, mean, standard error, bound) of the first version whose mean weight pi/e0 on the rows read is
    above both MEAN_WEIGHT_FACTOR and 1 + MEAN_WEIGHT_Z standard errors (side ``above``), or below both
    1 / MEAN_WEIGHT_FACTOR and 1 - MEAN_WEIGHT_Z standard errors (``below``), else None (a result recorded without
    the mean, by an older gate, is not checked)."""
    for who in ("challenger", "champion"):
        mean, se = _num(ope, f"{who}_mean_weight"), _num(ope, f"{who}_mean_weight_se")
        if not math.isfinite(mean):
            continue
        spread = MEAN_WEIGHT_Z * (se if math.isfinite(se) else 0.0)
        low, high = min(1.0 - spread, 1.0 / MEAN_WEIGHT_FACTOR), max(1.0 + spread, MEAN_WEIGHT_FACTOR)
        if mean < low:
            return "below", who, mean, se, low
        if mean > high:
            return "above", who, mean, se, high
    return None


def _weights_off_their_mean(ope: dict[str, Any]) -> str | None:
    """Decision case 3 of :func:`ope_verdict`: the reason when either version's mean weight on the rows read is off
    its expectation 1 (:func:`_mean_weight_breach`), else None."""
    breach = _mean_weight_breach(ope)
    if breach is None:
        return None
    side, who, mean, se, bound = breach
    head = f"off-policy weights: the {who}'s mean weight pi/e0 on the {ope.get('n')} rows read is {mean:.4g} "
    if side == "below":
        return (
            head + f"(standard error {se:.3g}) < {bound:.4g}: with the loggers' propensities as e0 its expectation is "
            "1, so most of its mass sits where the logs have (almost) no support and every estimate there is the "
            "reward model's extrapolation to items the logs never showed; rule: mean weight >= 1 - "
            f"{MEAN_WEIGHT_Z:g} standard errors or >= {1.0 / MEAN_WEIGHT_FACTOR:g}: fails closed"
        )
    return (
        head + f"(standard error {se:.3g}) > {bound:.4g}: with the loggers' propensities as e0 its expectation is 1, "
        "so the logged propensities are smaller than the loggers' and every estimate scaled by the weights is off "
        "(a self-normalised one hides the factor); rule: mean weight <= 1 + "
        f"{MEAN_WEIGHT_Z:g} standard errors or <= {MEAN_WEIGHT_FACTOR:g}: fails closed"
    )


def _zero_click_verdict(ope: dict[str, Any], label: str, interval: str, margin: float) -> tuple[bool, str]:
    """Decision case 5 of :func:`ope_verdict`: no row clicked; the difference is at least minus the champion's
    zero-click bound (abpo.evaluation.off_policy.zero_click_upper_bound on its ESS), the challenger's CTR being >= 0."""
    ess = _num(ope, "champion_ess")
    bound = zero_click_upper_bound(ess, float(ope["confidence"]))
    ok = bool(-bound >= -margin)
    return ok, (
        f"off-policy {label}: every one of the {ope['n']} rows it read is a no-response: every estimate is about 0 "
        f"and the {interval} is degenerate (no click to resample); with no click in the champion's {ess:.0f} "
        f"effective rows its CTR is below {bound:.4f} (exact binomial, one-sided "
        f"{(1 + float(ope['confidence'])) / 2:.1%}), so the difference is at least {-bound:+.4f} "
        f"{'>=' if ok else '<'} -margin {margin}"
    )


def ope_verdict(ope: dict[str, Any], margin: float, min_ess: float, max_top_share: float = 1.0) -> tuple[bool, str]:
    """The off-policy check of the gate, failing closed, in this order (docs/gate.md "Decision"):

    1. no row to read (the arm served nothing and the decider is ``snips``, its own rows; or no row at all) fails;
    2. a non-finite estimate, interval or effective sample size fails (e.g. a logged propensity so small that its
       weight overflowed);
    3. the challenger's top weights carrying more than ``max_top_share`` of its total weight fail, and so does
       either version's mean weight pi/e0 above 1 by more than MEAN_WEIGHT_Z standard errors and above
       MEAN_WEIGHT_FACTOR (its expectation is 1
       when e0 are the loggers' propensities: logged propensities too small, which a self-normalised estimator
       hides; every logged propensity 1e-9 passed SNDR), or below 1 by as much and below 1 / MEAN_WEIGHT_FACTOR
       (mass where the logs have no support, which the reward model extrapolates to);
    4. either version's effective sample size below ``min_ess``, or below MIN_ESS_FLOOR whatever ``min_ess`` is,
       fails (a difference is as uncertain as its less certain side);
    5. every row a no-response: every estimate is 0 and its interval the point [0, 0], which says nothing; the half
       passes when the zero-click bound of the champion's CTR (abpo.evaluation.off_policy.zero_click_upper_bound on
       its ESS, at the interval's one-sided level) is at most ``margin``: the challenger's CTR cannot be below 0;
    6. an estimate of a CTR outside [0, 1] (by more than :func:`range_slack`, half a click of the rows) fails: IPS,
       DR and Switch-DR scale with the weights;
    7. the deciding estimator's interval's lower bound must be >= -``margin``; when every row is clicked, IPS's too
       (self-normalised estimators read 1 for any version with mass on a logged item, and the reward model has only
       clicks to learn from: neither sees a challenger that moves its mass off the logged items; IPS, the mean
       weight, does), and the verdict says so.

    ``ope``: abpo.monthly.gate.ope_numbers (``estimator`` names the one that decides; a result recorded by the
    first gate has SNIPS's ``challenger_snips`` / ``champion_snips`` instead, one by a later gate no ``clicks``)."""
    name = ope.get("estimator", "snips")
    label = ESTIMATOR_NAMES.get(name, name)
    new_key, old_key = (
        ("challenger_estimate", "champion_estimate")
        if "challenger_estimate" in ope
        else ("challenger_snips", "champion_snips")
    )
    n, clicks, own_rows = ope.get("n"), ope.get("clicks"), ope.get("own_rows")
    if n == 0:
        return False, _no_rows(ope, label)
    keys = (new_key, old_key, "diff", "ci_low", "ci_high", "challenger_ess")
    bad = [k for k in keys if not isinstance(ope.get(k), (int, float)) or not math.isfinite(float(ope[k]))]
    if bad:
        return False, (
            f"off-policy estimate not finite ({', '.join(f'{k} {ope.get(k)}' for k in bad)}) on "
            f"{ope.get('n')} rows: fails closed"
        )
    rows = "every arm's rows" if ope.get("rows") == "all" else "rows"
    if ope.get("rows") == "all" and own_rows == 0:
        rows = "every arm's rows, none of them the arm's own"
    if ope.get("row_set") == "heldout":  # arms.gate_ope_rows: rows no update trained on
        rows += " of the held-out users"
    top = ope.get("challenger_top_weight_share")
    if top is not None and not (isinstance(top, (int, float)) and float(top) <= max_top_share):
        return False, (
            f"off-policy weights: the {ope.get('top_weight_rows')} largest of {ope.get('n')} rows carry "
            f"{float(top):.1%} of the challenger's total weight > arms.gate_max_top_weight_share "
            f"{max_top_share:g}: fails closed ({label} diff {ope['diff']:+.4f})"
        )
    too_heavy = _weights_off_their_mean(ope)
    if too_heavy:
        return False, too_heavy
    too_few = _too_few_effective_rows(ope, label, min_ess)
    if too_few:
        return False, too_few
    interval = f"{ope['confidence']:.0%} CI [{ope['ci_low']:+.4f}, {ope['ci_high']:+.4f}]"
    if clicks == 0:
        return _zero_click_verdict(ope, label, interval, margin)
    slack = range_slack(n)
    out_of_range = [
        f"{who} {float(ope[k]):.6g}"
        for who, k in (("challenger", new_key), ("champion", old_key))
        if not -slack <= ope[k] <= 1 + slack
    ]
    all_clicked = clicks is not None and clicks == n
    clicked_note = (
        f"; every one of the {n} rows is clicked: a self-normalised estimator reads 1 for any version with mass on a "
        "logged item and the reward model has only clicks to learn from, so only IPS sees a challenger that moves its "
        "mass off the logged items"
        if all_clicked
        else ""
    )
    if out_of_range:
        return False, (
            f"off-policy {label} CTR estimate outside [0, 1] ({', '.join(out_of_range)}) on {n} {rows}: not a click "
            f"rate; {label} scales with the weights pi/e0 (the challenger's largest "
            f"{_num(ope, 'challenger_max_weight'):.3g}), which logged propensities far too small make far too large; "
            f"rule: a click rate lies in [0, 1] (to half a click of the month's rows, {slack:.2g}): fails closed"
            f"{clicked_note}"
        )
    ok = bool(ope["ci_low"] >= -margin)
    reason = (
        f"off-policy {label} CTR challenger {ope[new_key]:.4f} vs champion {ope[old_key]:.4f} on {ope['n']} "
        f"{rows}: diff {ope['diff']:+.4f}, {interval} "
        f"{'>=' if ok else '<'} -margin {margin} (ESS {ope['challenger_ess']:.0f})"
    )
    if all_clicked and name != "ips":
        ips = ope.get("ips") or {}
        lo, hi, d = _num(ips, "ci_low"), _num(ips, "ci_high"), _num(ips, "diff")
        ips_ok = math.isfinite(lo) and lo >= -margin
        reason += (
            f"{clicked_note}: IPS diff {d:+.4f}, {ope['confidence']:.0%} CI [{lo:+.4f}, {hi:+.4f}] "
            f"{'>=' if ips_ok else '<'} -margin {margin}{'' if ips_ok else ': fails'}"
        )
        ok = ok and ips_ok
    elif all_clicked:
        reason += clicked_note
    return ok, reason


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


def guardrail_verdict(
    numbers: dict[str, Any], *, metric: str, margin: float, challenger_version: str, champion_version: str
) -> tuple[bool, str, dict[str, Any]]:
    """The offline guardrail of ``arms.gate_primary = ope`` (docs/gate.md "Decision"), read from
    :func:`offline_verdict`'s ``numbers`` at ``margin``: it refuses a challenger only on evidence of a collapse, when
    the one-sided (1 - alpha) **upper** bound of ``metric``'s per-user difference challenger - champion is below
    -``margin`` (Tango's score bound for HR@K, with the wins and losses swapped; Wald for NDCG@K). A challenger whose
    true difference is at least -margin passes with probability at least 1 - alpha on any number of users, so an
    equal challenger passes at least 97.5% of the time at the default level, and the guardrail never decides a tie.
    (passed, reason, ``numbers`` with ``upper``, the bound it reads.)"""
    if not numbers:
        return False, f"offline guardrail {metric}: arms.gate_guardrail_margin {margin} not finite: fails closed", {}
    n, wins, losses = int(numbers["n"]), int(numbers["wins"]), int(numbers["losses"])
    if numbers["method"] == TANGO:
        upper = -tango_lower_bound(losses, wins, n, float(numbers["alpha"]))
    else:
        from statistics import NormalDist

        upper = float(numbers["diff"]) + NormalDist().inv_cdf(1.0 - float(numbers["alpha"])) * float(numbers["se"])
    ok = bool(upper >= -margin)
    numbers = {**numbers, "upper": upper, "passed": ok}
    reason = (
        f"offline guardrail {metric} challenger v{challenger_version} {numbers['challenger']:.4f} vs champion "
        f"v{champion_version} {numbers['champion']:.4f} on {n} users (paired: {wins} won, {losses} lost, "
        f"{numbers['ties']} tied): diff {numbers['diff']:+.4f}, one-sided {1 - numbers['alpha']:.1%} upper bound "
        f"{upper:+.4f} {'>=' if ok else '<'} -margin {-margin:+.4f}" + ("" if ok else ": a collapse")
    )
    return ok, reason, numbers


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
    primary: str = "offline",
    guardrail_margin: float | None = None,
) -> GateVerdict:
    """The gate's decision, a pure function of the numbers (no registry, no MLflow); ``primary`` (config
    ``arms.gate_primary``) says which evidence decides (docs/gate.md "Decision"):

    - ``ope``: the off-policy half, :func:`ope_verdict` on ``ope`` (the paired estimate of challenger - champion CTR
      on rows no update trained on) with ``ope_margin``, ``min_ess`` and ``max_top_share``, decides; the offline half
      is a guardrail against collapse: :func:`guardrail_verdict` at ``guardrail_margin`` (it refuses only on
      evidence that the challenger is worse by more than the margin). Both must pass. Without off-policy numbers (no month's logs read) the
      offline test at ``margin`` decides, and the reason says so.
    - ``offline``: :func:`offline_verdict` on both versions' per-user target ranks (the same users, the same order)
      at ``margin``, ``alpha`` (``power`` only sizes the reported MDE), and :func:`ope_verdict` when ``ope`` is
      given. Both must pass (the gate before the off-policy decision)."""
    if primary not in ("ope", "offline"):
        raise ValueError(f"gate: arms.gate_primary {primary!r}; rule: one of ['ope', 'offline']")
    guardrail = primary == "ope" and ope is not None
    if guardrail and (guardrail_margin is None or not guardrail_margin > 0):
        raise ValueError(
            f"gate: arms.gate_guardrail_margin {guardrail_margin!r}; rule: a positive margin (the offline guardrail "
            "of arms.gate_primary = ope)"
        )
    at = float(guardrail_margin or 0.0) if guardrail else margin
    offline_ok, why, numbers = offline_verdict(
        metric=metric,
        challenger_ranks=challenger_ranks,
        champion_ranks=champion_ranks,
        margin=at,
        alpha=alpha,
        power=power,
        challenger_version=challenger_version,
        champion_version=champion_version,
    )
    if guardrail:
        offline_ok, why, numbers = guardrail_verdict(
            numbers,
            metric=metric,
            margin=at,
            challenger_version=challenger_version,
            champion_version=champion_version,
        )
    if primary == "offline":
        reasons = [why]
        ope_ok = True
        if ope is not None:
            ope_ok, why = ope_verdict(ope, ope_margin, min_ess, max_top_share)
            reasons.append(f"{why} ({month})" if month else why)
        return GateVerdict(offline_ok and ope_ok, offline_ok, ope_ok, "; ".join(reasons), numbers)
    if ope is None:
        return GateVerdict(
            offline_ok,
            offline_ok,
            True,
            f"decided by the offline half (no month's logs read, so no off-policy estimate): {why}",
            numbers,
        )
    ope_ok, ope_why = ope_verdict(ope, ope_margin, min_ess, max_top_share)
    ope_why = f"{ope_why} ({month})" if month else ope_why
    guard = f"guardrail {'passed' if offline_ok else 'failed'}: {why}"
    return GateVerdict(
        ope_ok and offline_ok, offline_ok, ope_ok, f"decided by the off-policy half: {ope_why}; {guard}", numbers
    )
