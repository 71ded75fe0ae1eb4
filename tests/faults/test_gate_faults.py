"""The off-policy gate fails closed (issue 18, item 5): on a non-finite estimate (a propensity of 5e-324 that passed
the contract gave a SNIPS of NaN with an interval of [0.0, 0.0], and the gate only checked ci_low >= -margin) and on
an effective sample size below arms.gate_min_ess. The estimates are the real abpo.evaluation.off_policy.compare_snips."""

from __future__ import annotations

import numpy as np

from abpo.config import load_config
from abpo.evaluation.off_policy import compare_snips
from abpo.monthly.gate_verdict import ope_verdict


def _ope(clicked, e0, e_challenger, e_champion) -> dict:
    c = compare_snips(
        clicked,
        np.asarray(e0, float),
        np.asarray(e_challenger, float),
        np.asarray(e_champion, float),
        n_boot=300,
        seed=0,
    )
    return {
        "n": c.n,
        "challenger_snips": c.challenger.snips,
        "champion_snips": c.champion.snips,
        "diff": c.diff,
        "ci_low": c.ci_low,
        "ci_high": c.ci_high,
        "confidence": c.confidence,
        "challenger_ess": c.challenger.ess,
        "champion_ess": c.champion.ess,
    }


def _log(seed: int, n: int = 400):
    """The tiny preset's config and a logged month of n rows: clicks at a 20% rate, e0 = 0.05 everywhere."""
    rng = np.random.default_rng(seed)
    return load_config("tiny"), (rng.random(n) < 0.2).astype(int), np.full(n, 0.05)


def test_a_nan_estimate_fails_closed():
    cfg, clicked, e0 = _log(0)
    n = len(e0)
    e0[3] = 5e-324  # what the contract let through before data.min_propensity
    ope = _ope(clicked, e0, np.full(n, 0.05), e0)
    assert np.isnan(ope["challenger_snips"]) and ope["ci_low"] >= -cfg.arms.gate_ope_margin  # the old check passed
    ok, why = ope_verdict(ope, cfg.arms.gate_ope_margin, cfg.arms.gate_min_ess)
    assert not ok and "off-policy estimate not finite (challenger_snips nan" in why and "fails closed" in why


def test_a_tiny_effective_sample_fails_closed_and_a_fair_one_passes():
    cfg, clicked, e0 = _log(1)
    n = len(e0)
    skewed = np.full(n, 1e-6)
    skewed[:3] = 0.9  # the challenger puts its weight on 3 logged rows: ESS about 3
    ok, why = ope_verdict(_ope(clicked, e0, skewed, e0), cfg.arms.gate_ope_margin, cfg.arms.gate_min_ess)
    assert not ok and "effective sample size" in why and "< arms.gate_min_ess 10" in why
    ok, why = ope_verdict(_ope(clicked, e0, e0, e0), cfg.arms.gate_ope_margin, cfg.arms.gate_min_ess)
    assert ok and "ESS 400" in why
