"""The off-policy half's cap on the share of the total SNIPS weight carried by the largest weights (issue 32, item
3): a few rows with impossible or tiny logged propensities decide a SNIPS estimate; the gate reports the share and
fails closed above arms.gate_max_top_weight_share. Numbers in, verdict out (abpo.monthly.gate_verdict.gate_verdict), the
weights built as abpo.monthly.gate.off_policy_gate builds them (challenger e / logged e0)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abpo.config import load_config
from abpo.evaluation.off_policy import top_weight_share
from abpo.monthly.gate import ope_estimates_on_rows, ope_numbers
from abpo.monthly.gate_verdict import gate_verdict


def _ope(y, e0, e_new, e_old, fraction, estimator="snips"):
    """The gate's own numbers (abpo.monthly.gate.ope_numbers) on these rows, all of the arm's own: each row's two
    candidates, the logged one (the challenger's e_new, the champion's e_old) and another."""
    n = len(y)
    e_new, e_old = np.asarray(e_new), np.asarray(e_old)
    est = ope_estimates_on_rows(
        candidates=[[2 * i, 2 * i + 1] for i in range(n)],
        logged_items=[2 * i for i in range(n)],
        history_lengths=[5] * n,
        clicked=y,
        e0=np.asarray(e0),
        challenger=[[a, 1 - a] for a in e_new],
        champion=[[b, 1 - b] for b in e_old],
        users=list(range(n)),
        own=np.ones(n, dtype=bool),
        n_boot=300,
        seed=0,
        top_fraction=fraction,
    )
    return ope_numbers(est, estimator)


def _log(n_honest=2536, n_crafted=20, seed=0):
    """An arm's month: honest rows (e0 ~ 1/20, challenger close to the logger, CTR ~0.07) and ``n_crafted`` clicked
    rows logged with propensity 1e-6 that the challenger gives 0.5 (the issue's attack as weights)."""
    rng = np.random.default_rng(seed)
    e0 = rng.uniform(0.03, 0.08, n_honest)
    e_new = e0 * rng.uniform(0.8, 1.25, n_honest)
    y = (rng.random(n_honest) < 0.072).astype(int)
    e0 = np.concatenate([e0, np.full(n_crafted, 1e-6)])
    e_new = np.concatenate([e_new, np.full(n_crafted, 0.5)])
    y = np.concatenate([y, np.ones(n_crafted, int)])
    return y, e0, e_new, e0.copy()


def _verdict(ope, max_top_share):
    ranks = [1] * 200 + [40] * 200
    return gate_verdict(
        metric="HR@5",
        challenger_ranks=ranks,
        champion_ranks=ranks,
        margin=0.02,
        challenger_version="3",
        champion_version="2",
        ope=ope,
        ope_margin=0.05,
        min_ess=10.0,
        month="2026-02",
        max_top_share=max_top_share,
    )


def test_the_default_cap_fails_the_crafted_weights_closed():
    cfg = load_config("tiny")
    cap, fraction = cfg.arms.gate_max_top_weight_share, cfg.arms.gate_top_weight_fraction
    assert (cap, fraction) == (0.5, 0.01)
    ope = _ope(*_log(), fraction)
    assert ope["challenger_estimate"] > 0.9 and ope["top_weight_rows"] == 26  # the crafted rows decide the estimate
    v = _verdict(ope, cap)
    assert not v.passed and not v.ope_passed and v.offline_passed
    assert "off-policy weights: the 26 largest of 2556 rows carry 100.0% of the challenger's total" in v.reason
    assert "> arms.gate_max_top_weight_share 0.5: fails closed" in v.reason
    honest = _ope(*_log(n_crafted=0), fraction)
    assert honest["challenger_top_weight_share"] < 0.05
    assert _verdict(honest, cap).ope_passed  # the same challenger on honest logs passes
    # the doubly robust estimators read the same weights: the cap fails DR closed too
    dr = _ope(*_log(), fraction, estimator="dr")
    assert dr["challenger_top_weight_share"] > 0.99 and not _verdict(dr, cap).ope_passed


def test_a_non_finite_share_fails_closed_and_1_disables():
    ope = _ope(*_log(), 0.01)
    v = _verdict(ope, 1.0)
    assert "gate_max_top_weight_share" not in v.reason  # 1 disables the cap
    # the weights' mean (2556 rows, 20 of them pi/e0 = 5e5) is far above its expectation 1: refused on that (issue 59)
    assert not v.ope_passed and "the challenger's mean weight pi/e0" in v.reason, v.reason
    before = {k: x for k, x in ope.items() if "mean_weight" not in k}  # a result recorded without the mean
    assert _verdict(before, 1.0).passed  # without either check the 20 rows pass the off-policy half (ESS ~20 > 10)
    nan = dict(_ope(*_log(n_crafted=0), 0.01), challenger_top_weight_share=math.nan)
    assert not _verdict(nan, 0.5).ope_passed


def test_top_weight_share_is_the_equation():
    share, k = top_weight_share([1.0, 2.0, 3.0, 4.0], 0.5)
    assert (share, k) == (pytest.approx(0.7), 2)
    assert top_weight_share([5.0] * 10, 0.01) == (pytest.approx(0.1), 1)  # at least one row
    assert math.isnan(top_weight_share([1.0, math.inf], 0.5)[0])
    with pytest.raises(ValueError, match=r"rule: in \(0, 1\]"):
        top_weight_share([1.0], 0.0)
