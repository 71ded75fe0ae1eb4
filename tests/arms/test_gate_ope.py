"""The gate's off-policy half over every arm's month logs (issue 42 point 2): abpo.monthly.gate.ope_estimates_on_rows
computes every estimator on one simulated month of rows (SNIPS on the arm's own rows exactly as the gate computed it
before, the doubly robust family on every arm's, cross-fitted and bootstrapped over users), ope_numbers hands the
chosen one to the verdict with every estimate beside it, and arms.gate_ope_estimator takes each of its choices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abpo.config import load_config
from abpo.config.arms import GATE_OPE_ESTIMATORS
from abpo.evaluation.off_policy import compare_snips
from abpo.monthly.gate import ope_estimates_on_rows, ope_metrics, ope_numbers
from abpo.monthly.gate_verdict import gate_verdict, ope_verdict


def _softmax(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _month(n_users=120, per_user=10, k=8, seed=0, gain=0.6):
    """A month of logs of three arms (the gated arm's champion and two others), a user's rows all from one arm; the
    challenger tilts the champion towards the true click probabilities. Returns the rows and the true CTRs."""
    rng = np.random.default_rng(seed)
    n = n_users * per_user
    users = np.repeat(np.arange(n_users), per_user)
    p = rng.uniform(0.02, 0.3, (n, k))  # true click probabilities of every candidate
    base = np.log(p) + rng.normal(0, 1.0, (n, k))
    champ = _softmax(base)
    new = _softmax(base + gain * np.log(p))
    other = _softmax(rng.normal(0, 1.0, (n, k)))
    arm_of_user = rng.choice(3, n_users, p=[0.4, 0.4, 0.2])
    arm = arm_of_user[users]
    e = np.where((arm == 0)[:, None], champ, np.where((arm == 1)[:, None], other, np.full((n, k), 1.0 / k)))
    logged = np.array([rng.choice(k, p=row) for row in e])
    rows = np.arange(n)
    cands = [list(range(100 * i, 100 * i + k)) for i in rows]
    return {
        "candidates": cands,
        "logged_items": [c[j] for c, j in zip(cands, logged, strict=True)],
        "history_lengths": rng.integers(1, 50, n).tolist(),
        "clicked": (rng.random(n) < p[rows, logged]).astype(int),
        "e0": e[rows, logged],
        "challenger": list(new),
        "champion": list(champ),
        "users": users.tolist(),
        "own": arm == 0,
    }, ((new * p).sum(1).mean(), (champ * p).sum(1).mean())


def test_every_estimator_is_recorded_and_snips_is_the_old_path():
    rows, (ctr_new, ctr_old) = _month()
    est = ope_estimates_on_rows(**rows, champion_logged_own=True, n_boot=400, seed=0)
    assert set(est) == set(GATE_OPE_ESTIMATORS)
    own = rows["own"]
    # the snips choice is compare_snips on the arm's own rows, the champion's weight 1 there: as before issue 42
    idx = [c.index(a) for c, a in zip(rows["candidates"], rows["logged_items"], strict=True)]
    e_new = np.array([p[i] for p, i in zip(rows["challenger"], idx, strict=True)])
    old = compare_snips(rows["clicked"][own], rows["e0"][own], e_new[own], rows["e0"][own], n_boot=400, seed=0)
    s = est["snips"]
    assert s["rows"] == "own" and s["n"] == int(own.sum())
    assert (s["diff"], s["ci_low"], s["ci_high"]) == (old.diff, old.ci_low, old.ci_high)
    assert s["challenger_ess"] == pytest.approx(old.challenger.ess)
    truth = ctr_new - ctr_old
    for name in ("ips", "snips_all", "dr", "sndr", "switch_dr"):
        e = est[name]
        assert e["rows"] == "all" and e["n"] == len(rows["clicked"]) and e["ci_low"] < e["diff"] < e["ci_high"]
        assert abs(e["diff"] - truth) < 4 * e["boot_se"], (name, e["diff"], truth, e["boot_se"])
    # every arm's rows carry more information than the arm's own: DR's interval is narrower than own-rows SNIPS'
    assert est["dr"]["ci_high"] - est["dr"]["ci_low"] < s["ci_high"] - s["ci_low"]


@pytest.mark.parametrize("estimator", GATE_OPE_ESTIMATORS)
def test_the_chosen_estimator_decides_and_every_one_is_kept(estimator):
    rows, _ = _month(seed=1)
    est = ope_estimates_on_rows(**rows, n_boot=200, seed=1)
    ope = ope_numbers(est, estimator)
    assert ope["estimator"] == estimator and ope["estimates"] is est
    assert (ope["diff"], ope["ci_low"], ope["ci_high"]) == tuple(
        est[estimator][k] for k in ("diff", "ci_low", "ci_high")
    )
    ok, why = ope_verdict(ope, margin=0.05, min_ess=10.0)
    assert ok is (ope["ci_low"] >= -0.05)
    label = {"snips": "SNIPS (the arm's own rows)", "snips_all": "SNIPS", "switch_dr": "Switch-DR"}.get(
        estimator, estimator.upper()
    )
    assert why.startswith(f"off-policy {label} CTR challenger")
    assert ("every arm's rows" in why) is (estimator != "snips")
    metrics = ope_metrics(ope)
    assert metrics["ope.diff"] == ope["diff"] and metrics[f"ope.{estimator}.ci_low"] == ope["ci_low"]
    assert {f"ope.{e}.diff" for e in GATE_OPE_ESTIMATORS} <= set(metrics)


def test_the_verdict_reads_the_decider_not_snips():
    # a DR interval below -margin fails the gate even where the arm's own SNIPS would pass it
    rows, _ = _month(seed=2)
    est = ope_estimates_on_rows(**rows, n_boot=200, seed=2)
    est["dr"] = dict(est["dr"], diff=-0.2, ci_low=-0.3, ci_high=-0.1)
    est["snips"] = dict(est["snips"], diff=0.0, ci_low=-0.01, ci_high=0.01)
    ranks = [1] * 200 + [40] * 200
    common = dict(
        metric="HR@5",
        challenger_ranks=ranks,
        champion_ranks=ranks,
        margin=0.02,
        challenger_version="3",
        champion_version="2",
        ope_margin=0.05,
        min_ess=10.0,
    )
    assert not gate_verdict(**common, ope=ope_numbers(est, "dr")).passed
    assert gate_verdict(**common, ope=ope_numbers(est, "snips")).passed


def test_one_user_has_no_cross_fit_and_fails_closed():
    rows, _ = _month(n_users=1, per_user=30, seed=3)
    rows["own"] = np.ones(30, dtype=bool)
    est = ope_estimates_on_rows(**rows, n_boot=100, seed=3)
    assert math.isnan(est["dr"]["diff"]) and math.isfinite(est["snips"]["diff"])
    ok, why = ope_verdict(ope_numbers(est, "dr"), 0.05, 1.0)
    assert not ok and "not finite" in why and "fails closed" in why


def test_snips_needs_rows_of_the_arm():
    """An arm that served nothing (issue 59): SNIPS on its own rows is recorded as not computed, and as the decider it
    fails closed in one line (before, ope_numbers raised and the gate's traceback wedged the month)."""
    rows, _ = _month(seed=4)
    rows["own"] = np.zeros(len(rows["clicked"]), dtype=bool)
    est = ope_estimates_on_rows(**rows, n_boot=100, seed=4)
    assert est["snips"]["n"] == 0 and math.isnan(est["snips"]["diff"]) and math.isfinite(est["dr"]["diff"])
    ok, why = ope_verdict(ope_numbers(est, "snips"), 0.05, 10.0)
    assert not ok and "no logged rows of the arm's own" in why and "fails closed" in why
    with pytest.raises(ValueError, match="arms.gate_ope_estimator 'bogus' has no estimate"):
        ope_numbers(est, "bogus")


def test_the_config_key_takes_each_choice_and_refuses_others():
    from abpo.config.errors import ConfigError

    assert load_config("tiny").arms.gate_ope_estimator == "sndr"  # benchmarks/ope_coverage.py's choice
    for choice in GATE_OPE_ESTIMATORS:
        assert load_config("tiny", [f"arms.gate_ope_estimator={choice}"]).arms.gate_ope_estimator == choice
    with pytest.raises(ConfigError, match="arms.gate_ope_estimator 'bogus': rule: one of snips, dm, ips"):
        load_config("tiny", ["arms.gate_ope_estimator=bogus"])


def test_the_result_travels_as_json_without_nan():
    """The gate's result is the task's XCom, JSON that refuses NaN: an estimator that could not run (one user: no
    cross-fit) and compare_snips' interval without an SE of its own are None there, decided on before."""
    import json

    from abpo.monthly.gate import finite_or_none

    rows, _ = _month(n_users=1, per_user=30, seed=5)
    rows["own"] = np.ones(30, dtype=bool)
    ope = ope_numbers(ope_estimates_on_rows(**rows, n_boot=100, seed=5), "dr")
    with pytest.raises(ValueError):
        json.dumps(ope, allow_nan=False)
    safe = finite_or_none(ope)
    json.dumps(safe, allow_nan=False)
    assert safe["diff"] is None and safe["estimates"]["snips"]["boot_se"] is None
    assert safe["estimates"]["snips"]["diff"] == ope["estimates"]["snips"]["diff"]
