"""The off-policy half's refusals (issue 59, points 2 and 8), on hand-built months through the gate's own numbers
(abpo.monthly.gate.ope_estimates_on_rows -> ope_numbers -> abpo.monthly.gate_verdict.ope_verdict):

- an estimate outside [0, 1] is refused (every logged propensity 1e-9: IPS 10^7, DR -10^5, diff 0 between two
  identical versions, which the interval alone passed), and so are weights whose mean pi/e0 is far above 1, its
  expectation with the loggers' propensities (that month under SNDR, SNIPS or Switch-DR, which the range passed);
- an effective sample size too small to say anything, of either version, is refused whatever arms.gate_min_ess says
  (below MIN_ESS_FLOOR = 2, one row carries more than half the weight);
- a month of all no-responses gives a degenerate interval: the verdict says so and decides on the zero-click bound of
  the champion's CTR (exact binomial, on its effective sample) instead of [0, 0];
- a month where every row is clicked: the self-normalised estimators (and the reward model, q -> 1) are blind to a
  challenger that moves its mass off every logged item; the verdict says so and IPS, which sees it, must pass too;
- an arm with no logged rows of its own: SNIPS on its own rows is recorded as not computed (n 0), the estimators on
  every arm's rows decide, and the ``snips`` choice fails closed in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abpo.evaluation.off_policy import zero_click_upper_bound
from abpo.monthly.gate import ope_estimates_on_rows, ope_numbers
from abpo.monthly.gate_verdict import MIN_ESS_FLOOR, ope_notes, ope_verdict, range_slack


def _softmax(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _month(n_users=60, per_user=8, k=6, seed=0, clicked=None, e0=None, own=None):
    """A month of rows of two logging arms (a user's rows from one), the challenger = the champion = the logger of the
    arm's own rows; ``clicked`` / ``e0`` replace the drawn clicks / logged propensities (a constant)."""
    rng = np.random.default_rng(seed)
    n = n_users * per_user
    users = np.repeat(np.arange(n_users), per_user)
    champ = _softmax(rng.normal(0, 1.0, (n, k)))
    other = _softmax(rng.normal(0, 1.0, (n, k)))
    mine = (rng.random(n_users) < 0.5)[users] if own is None else np.full(n, own)
    logger = np.where(mine[:, None], champ, other)
    logged = np.array([rng.choice(k, p=row) for row in logger])
    rows = np.arange(n)
    cands = [list(range(100 * i, 100 * i + k)) for i in rows]
    y = (rng.random(n) < 0.2).astype(int) if clicked is None else np.full(n, clicked)
    return {
        "candidates": cands,
        "logged_items": [c[j] for c, j in zip(cands, logged, strict=True)],
        "history_lengths": rng.integers(1, 30, n).tolist(),
        "clicked": y,
        "e0": logger[rows, logged] if e0 is None else np.full(n, e0),
        "challenger": list(champ),
        "champion": list(champ),
        "users": users.tolist(),
        "own": mine,
    }, logged


def _numbers(rows, estimator="sndr", **kw):
    return ope_numbers(ope_estimates_on_rows(**rows, n_boot=200, seed=0, **kw), estimator)


def test_estimates_outside_0_1_are_refused():
    """Every logged propensity 1e-9 (ingest's contract accepts it): two identical versions, diff 0 in an interval
    [0, 0] that the margin passed; IPS is a CTR of 10^7 and more, DR one of -10^5. Refused, naming the estimate and
    the rule (a result recorded without the weights' mean, before issue 59's review, meets this case alone)."""
    rows, _ = _month(e0=1e-9)
    ope = _numbers(rows, "dr")
    assert abs(ope["challenger_estimate"]) > 1e3 and ope["ci_low"] >= -0.05  # what passed before
    assert ope["estimates"]["ips"]["challenger"] > 1e6
    old = {k: v for k, v in ope.items() if "mean_weight" not in k}
    ok, why = ope_verdict(old, 0.05, 10.0)
    assert not ok, why
    assert "outside [0, 1]" in why and "fails closed" in why and "challenger" in why
    assert "rule: a click rate lies in [0, 1]" in why
    assert "estimate outside [0, 1]: refused" in ope_notes(old)


def test_logged_propensities_too_small_are_refused_whatever_estimator_decides():
    """The same month under every estimator, the default SNDR included: a self-normalised estimate stays in [0, 1]
    (the weights' scale cancels) and Switch-DR drops every correction (all weights above its lambda), so the range
    alone passed them (issue 59's review); the weights' mean pi/e0, 1 in expectation with the loggers' propensities,
    is ~10^8: refused, naming the version, the mean and the rule, and the report's note says so."""
    rows, _ = _month(e0=1e-9)
    for name in ("sndr", "snips_all", "switch_dr", "dr", "ips", "snips"):
        ope = _numbers(rows, name)
        ok, why = ope_verdict(ope, 0.05, 10.0)
        assert not ok, (name, why)
        assert "mean weight pi/e0" in why and "rule: mean weight <= 1 + 4 standard errors or <= 2" in why, (name, why)
        assert ope["challenger_mean_weight"] > 1e6, name
        assert any("logged propensities too small" in n for n in ope_notes(ope)), name
    # the same month with its real propensities: the means are 1 within their noise, and every estimator passes
    honest, _ = _month()
    for name in ("sndr", "snips_all", "switch_dr", "dr", "ips", "snips"):
        ope = _numbers(honest, name)
        assert abs(ope["challenger_mean_weight"] - 1) <= 4 * ope["challenger_mean_weight_se"] + 1e-9, name
        ok, why = ope_verdict(ope, 0.05, 10.0)
        assert ok and "mean weight" not in why, (name, why)
        assert not any("too small" in n for n in ope_notes(ope)), name


def test_a_challenger_whose_mass_sits_where_the_logs_have_no_support_is_refused():
    """The loggers put e0 ~ 5e-5 on one candidate of every row and the challenger puts 0.99 there; no row logged it.
    The reward model extrapolates its CTR to that item, so DR, SNDR, DM and Switch-DR passed it with a narrow
    interval (only IPS failed). Its mean weight pi/e0 on the logged rows is about 0.01 against an expectation of 1:
    refused under every estimator, naming the version, the mean and the rule, and the report's note says so."""
    rng = np.random.default_rng(11)
    n_users, per_user, k = 60, 8, 6
    n = n_users * per_user
    users = np.repeat(np.arange(n_users), per_user)
    logger = _softmax(rng.normal(0, 1.0, (n, k)))
    logger[:, 0] = 5e-5  # the candidate the logs (almost) never show
    logger /= logger.sum(axis=1, keepdims=True)
    logged = np.array([1 + rng.choice(k - 1, p=row[1:] / row[1:].sum()) for row in logger])
    challenger = np.full((n, k), 0.01 / (k - 1))
    challenger[:, 0] = 0.99
    cands = [list(range(100 * i, 100 * i + k)) for i in range(n)]
    rows = {
        "candidates": cands,
        "logged_items": [c[j] for c, j in zip(cands, logged, strict=True)],
        "history_lengths": rng.integers(1, 30, n).tolist(),
        "clicked": (rng.random(n) < 0.2).astype(int),
        "e0": logger[np.arange(n), logged],
        "challenger": list(challenger),
        "champion": list(logger),
        "users": users.tolist(),
        "own": np.ones(n, dtype=bool),
    }
    for name in ("sndr", "dr", "dm", "switch_dr", "snips_all", "ips"):
        ope = _numbers(rows, name)
        assert ope["challenger_mean_weight"] < 0.05, (name, ope["challenger_mean_weight"])
        ok, why = ope_verdict(ope, 0.05, 0.0)
        assert not ok, (name, why)
        assert "the challenger's mean weight pi/e0" in why and "no support" in why, (name, why)
        assert "rule: mean weight >= 1 - 4 standard errors or >= 0.5: fails closed" in why, (name, why)
        assert any("no support" in note for note in ope_notes(ope)), name
    # what passed before this check: the interval alone, under the default SNDR
    sndr = _numbers(rows, "sndr")
    assert sndr["ci_low"] > -0.05, sndr["ci_low"]


def test_the_mean_weight_bound_is_four_standard_errors_from_one_and_at_least_a_factor_two():
    """Case 3's bound for either version: above both 1 + 4 SE and 2, or below both 1 - 4 SE and 1/2, fails naming
    that version; just inside either passes."""
    rows, _ = _month(seed=3)
    ope = _numbers(rows, "sndr")
    for who in ("challenger", "champion"):
        key, se_key = f"{who}_mean_weight", f"{who}_mean_weight_se"
        for se, value, ok_expected in (
            (0.5, 1 + 3.9 * 0.5, True),  # under 1 + 4 SE (3.0), over the factor 2
            (0.5, 1 + 4.1 * 0.5, False),
            (0.01, 1.99, True),  # over 1 + 4 SE (1.04), under the factor 2
            (0.01, 2.01, False),
            (0.01, 0.2, False),  # under 1 - 4 SE (0.96) and under 1/2: no support
            (0.01, 0.51, True),  # under 1 - 4 SE, over 1/2
            (0.2, 0.3, True),  # under 1/2, over 1 - 4 SE (0.2)
            (0.1, 0.3, False),
        ):
            ok, why = ope_verdict({**ope, key: value, se_key: se}, 0.05, 10.0)
            assert ok is ok_expected, (who, se, value, why)
            assert (f"the {who}'s mean weight" in why) is (not ok_expected), why


def test_the_range_holds_to_half_a_click_of_the_rows():
    """An unbiased estimator near a bound leaves it by rounding (DR 1 + 8e-7 on a month where every row is clicked):
    within half a click of the n rows, 1/(2n), it is in range; beyond, refused, on either side and either version."""
    rows, _ = _month(seed=7)
    ope = _numbers(rows, "dr")
    n = ope["n"]
    assert range_slack(n) == 0.5 / n
    for key in ("challenger_estimate", "champion_estimate"):
        for value, ok_expected in ((1 + 0.4 / n, True), (1 + 0.6 / n, False), (-0.4 / n, True), (-0.6 / n, False)):
            ok, why = ope_verdict({**ope, key: value}, 0.05, 10.0)
            assert ("outside [0, 1]" not in why) is ok_expected, (key, value, why)
            assert ok is ok_expected, (key, value, why)


def test_an_effective_sample_too_small_is_refused_for_either_version_whatever_the_config():
    rows, logged = _month(seed=1)
    n = len(rows["clicked"])
    # the champion puts its mass on the logged item of 1 row and nearly none elsewhere: its ESS is about 1
    k = len(rows["candidates"][0])
    champ = []
    for i, j in enumerate(logged):
        p = np.full(k, 1.0 / k)
        if i == 0:
            p = np.full(k, 1e-9)
            p[j] = 1 - (k - 1) * 1e-9
        else:
            p[j] = 1e-9
            p[[m for m in range(k) if m != j]] = (1 - 1e-9) / (k - 1)
        champ.append(p)
    # row 0 logged at propensity 1/200: its weight ~200 keeps the champion's mean weight (~0.4, standard error as
    # large) inside case 3's bounds, so it is the effective sample that refuses, not missing support
    e0 = np.array(rows["e0"], dtype=float)
    e0[0] = 1 / 200
    rows = {**rows, "e0": e0}
    ope = _numbers({**rows, "champion": champ}, "sndr")
    assert ope["champion_ess"] < MIN_ESS_FLOOR <= ope["challenger_ess"]
    for min_ess in (10.0, 0.0):  # arms.gate_min_ess=0 (tests/sizes.py's GATE_PASSES) does not let it through
        ok, why = ope_verdict(ope, 0.05, min_ess)
        assert not ok and "champion's effective sample size" in why and "fails closed" in why, why
    ok, why = ope_verdict(ope, 0.05, 0.0)
    assert f"floor {MIN_ESS_FLOOR:g}" in why and "more than half" in why
    # the challenger's, as before, at the configured threshold
    ope = _numbers({**rows, "challenger": champ, "champion": rows["challenger"]}, "sndr")
    ok, why = ope_verdict(ope, 0.05, 0.0)
    assert not ok and "challenger's effective sample size" in why, why
    # n rows, each carrying the same weight: ESS n, passes
    ok, why = ope_verdict(_numbers(rows, "sndr"), 0.05, 10.0)
    assert ok and f"on {n} every arm's rows" in why, why


def test_all_no_responses_say_the_interval_is_degenerate_and_decide_on_the_zero_click_bound():
    rows, _ = _month(clicked=0, seed=2)
    for name in ("sndr", "snips", "ips"):
        ope = _numbers(rows, name)
        assert ope["clicks"] == 0 and ope["ci_low"] == pytest.approx(0, abs=1e-3)
        ok, why = ope_verdict(ope, 0.05, 10.0)
        bound = zero_click_upper_bound(ope["champion_ess"], 0.95)
        assert "every one of the" in why and "no-response" in why and "degenerate" in why, why
        assert f"{-bound:+.4f}" in why
        assert ok is (bound <= 0.05), (name, why)
        assert any("no-response" in s for s in ope_notes(ope))
    # few effective rows: the zero-click bound is wide and the gate says it cannot tell
    small, _ = _month(n_users=6, per_user=4, clicked=0, seed=3)
    ope = _numbers(small, "snips_all")
    ok, why = ope_verdict(ope, 0.05, 0.0)
    assert zero_click_upper_bound(ope["champion_ess"], 0.95) > 0.05
    assert not ok and "no-response" in why and "< -margin" in why, why


def test_zero_click_bound_is_the_exact_binomial_one():
    # no success in n trials: (1 - p)^n = alpha at the upper bound; about 3.69 / n at alpha 0.025 (rule of three)
    for n in (10.0, 100.0, 2500.0):
        p = zero_click_upper_bound(n, 0.95)
        assert (1 - p) ** n == pytest.approx(0.025)
        assert p == pytest.approx(-math.log(0.025) / n, rel=0.2)
    assert zero_click_upper_bound(0.0, 0.95) == 1.0


def test_all_clicked_the_self_normalised_estimators_are_blind_and_ips_decides_too():
    """Every row clicked; the challenger moves its mass off every logged item (1e-6 left on it). SNIPS, on the arm's
    own rows or on every arm's, reads 1 for both versions: diff 0 in [0, 0], which the margin passed. IPS = the mean
    weight, ~1e-5 for the challenger: it sees it. The verdict says so and fails on IPS. The reward model's estimators
    see it here only through the challenger's own scores among its features (a reward model on fewer features reads
    q ~ 1 everywhere): the note is on their verdict too. An honest challenger passes, with the note."""
    rows, logged = _month(clicked=1, seed=4)
    k = len(rows["candidates"][0])
    moved = []
    for j in logged:
        p = np.full(k, (1 - 1e-6) / (k - 1))
        p[j] = 1e-6
        moved.append(p)
    bad = {**rows, "challenger": moved}
    for name in ("snips", "snips_all", "sndr", "dr"):
        ope = _numbers(bad, name)
        if name.startswith("snips"):
            assert ope["diff"] == 0 and ope["ci_low"] == 0, (name, ope["ci_low"])  # blind: what passed before
        ok, why = ope_verdict(ope, 0.05, 0.0)
        assert not ok, (name, why)
        # its mean weight (~1e-5) is far below 1: refused as mass where the logs have no support
        assert "no support" in why, why
        assert any("only IPS" in s for s in ope_notes(ope)) and any("no support" in s for s in ope_notes(ope))
    # 30 % of the mass on each logged item moved off it: the mean weight (~0.65) is inside case 3's bounds, the
    # self-normalised estimators still read diff 0, and IPS (~0.65 against 1) refuses it
    champ = np.array(rows["champion"])
    part = []
    for i, j in enumerate(logged):
        p = champ[i].copy()
        p[j] *= 0.7
        p[[m for m in range(k) if m != j]] *= (1 - p[j]) / (1 - champ[i][j])
        part.append(p)
    bad = {**rows, "challenger": part}
    for name in ("snips", "snips_all", "sndr", "dr"):
        ope = _numbers(bad, name)
        assert 0.55 < ope["challenger_mean_weight"] < 0.8, ope["challenger_mean_weight"]
        if name.startswith("snips"):
            assert ope["diff"] == 0 and ope["ci_low"] == 0, (name, ope["ci_low"])
        ok, why = ope_verdict(ope, 0.05, 0.0)
        assert not ok, (name, why)
        assert "every one of the" in why and "is clicked" in why and "only IPS" in why, why
        assert "IPS diff" in why and "< -margin" in why, why
        assert any("only IPS" in s for s in ope_notes(ope))
    ok, why = ope_verdict(_numbers(rows, "sndr"), 0.05, 0.0)
    assert ok and "is clicked" in why and "only IPS" in why, why


def test_an_arm_without_rows_of_its_own_is_gated_on_every_arms_rows():
    rows, _ = _month(own=False, seed=5)
    est = ope_estimates_on_rows(**rows, n_boot=200, seed=0)
    assert est["snips"]["n"] == 0 and est["snips"]["rows"] == "own" and math.isnan(est["snips"]["diff"])
    assert all(est[e]["n"] == len(rows["clicked"]) for e in ("dm", "ips", "snips_all", "dr", "sndr", "switch_dr"))
    ope = ope_numbers(est, "sndr")
    assert ope["own_rows"] == 0
    ok, why = ope_verdict(ope, 0.05, 10.0)
    assert ok and "none of them the arm's own" in why, why
    ok, why = ope_verdict(ope_numbers(est, "snips"), 0.05, 10.0)
    assert not ok and "\n" not in why, why
    assert "no logged rows of the arm's own among the month's" in why and "fails closed" in why, why
    assert "rule: arms.gate_ope_estimator snips reads the arm's own rows" in why


def test_a_month_without_any_row_fails_closed():
    rows, _ = _month(seed=6)
    empty = {k: v[:0] for k, v in rows.items()}
    est = ope_estimates_on_rows(**empty, n_boot=50, seed=0)
    for name in ("snips", "sndr"):
        ok, why = ope_verdict(ope_numbers(est, name), 0.05, 10.0)
        assert not ok and "no logged rows" in why and "fails closed" in why, why
