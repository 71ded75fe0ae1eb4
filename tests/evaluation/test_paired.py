"""abpo.evaluation.paired: the gate's paired non-inferiority test on constructed per-user hits (wins, losses, ties
of 400 users), its p-value against the bound, and Eq. MDE against a simulation of the test itself."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abpo.evaluation.paired import mde, paired_noninferiority, per_user_values


def _hits(n: int, wins: int, losses: int, both: int = 0) -> tuple[list[int], list[int]]:
    """Per-user 0/1 hits of (challenger, champion) on n users: ``wins`` only the challenger hits, ``losses`` only
    the champion, ``both`` both, the rest neither."""
    rest = n - wins - losses - both
    return [1] * wins + [0] * losses + [1] * both + [0] * rest, [0] * wins + [1] * losses + [1] * both + [0] * rest


def test_a_challenger_losing_3_of_400_users_passes_at_margin_002():
    t = paired_noninferiority(*_hits(400, 0, 3, both=120), margin=0.02, alpha=0.025)
    assert t.passed and (t.wins, t.losses, t.ties, t.n) == (0, 3, 397, 400)
    assert t.diff == pytest.approx(-3 / 400)
    assert t.se == pytest.approx(math.sqrt(3 / 400 - (3 / 400) ** 2) / 20)  # from the discordant pairs
    assert t.lower == pytest.approx(t.diff - 1.959964 * t.se, abs=1e-6) and -0.02 < t.lower < t.diff
    assert t.p_value < 0.025 and t.challenger == pytest.approx(120 / 400) and t.champion == pytest.approx(123 / 400)


def test_a_challenger_losing_30_of_400_users_fails():
    t = paired_noninferiority(*_hits(400, 0, 30, both=100), margin=0.02)
    assert not t.passed and t.lower < -0.02 and t.p_value > 0.025 and t.losses == 30


def test_many_discordant_pairs_widen_the_bound():
    # the same net loss of 3 users, with 40 wins and 43 losses: the difference is as uncertain as the users disagree
    t = paired_noninferiority(*_hits(400, 40, 43), margin=0.02)
    assert t.diff == pytest.approx(-3 / 400) and not t.passed and t.lower < -0.02


def test_ties_pass_and_have_no_spread():
    t = paired_noninferiority(*_hits(400, 0, 0, both=130), margin=0.02)
    assert t.passed and t.diff == 0 and t.se == 0 and t.lower == 0 and t.p_value == 0 and t.mde == 0
    assert t.ties == 400
    # at margin 0 a tie is not "better than -0": the bound must exceed -margin strictly
    assert not paired_noninferiority(*_hits(400, 0, 0), margin=0.0).passed


def test_the_p_value_agrees_with_the_bound():
    for wins, losses in [(5, 9), (10, 22), (12, 15), (0, 8), (20, 10)]:
        t = paired_noninferiority(*_hits(400, wins, losses), margin=0.02, alpha=0.025)
        assert t.passed is (t.p_value < 0.025), (wins, losses, t)


def test_mde_matches_a_simulation_of_the_test():
    # users disagree with probability s; the true difference sits Eq. MDE above -margin: the test passes ~80%
    n, s, margin, alpha, power = 400, 0.2, 0.02, 0.025, 0.8
    delta = 0.0
    for _ in range(50):  # fixed point: delta = -margin + MDE(SE at delta)
        delta = -margin + mde(math.sqrt((s - delta * delta) / n), alpha, power)
    p10, p01 = (s + delta) / 2, (s - delta) / 2
    rng = np.random.default_rng(0)
    counts = rng.multinomial(n, [p10, p01, 1 - s], size=4000)
    tests = [
        paired_noninferiority(*_hits(n, int(w), int(lo)), margin=margin, alpha=alpha, power=power)
        for w, lo, _ in counts
    ]
    assert np.mean([t.passed for t in tests]) == pytest.approx(power, abs=0.03)
    assert np.mean([t.mde for t in tests]) == pytest.approx(delta + margin, rel=0.03)
    # and at the margin itself the test passes at most ~alpha of the time (its size)
    counts = rng.multinomial(n, [(s - margin) / 2, (s + margin) / 2, 1 - s], size=4000)
    size = np.mean([paired_noninferiority(*_hits(n, int(w), int(lo)), margin=margin).passed for w, lo, _ in counts])
    assert size == pytest.approx(alpha, abs=0.015)


def test_per_user_values_are_the_metrics_terms():
    ranks = [1, 5, 6, 3, 100]
    assert per_user_values(ranks, "HR@5").tolist() == [1, 1, 0, 1, 0]
    assert per_user_values(ranks, "NDCG@5").tolist() == pytest.approx([1, 1 / math.log2(6), 0, 0.5, 0])
    with pytest.raises(ValueError, match="rule: HR@K or NDCG@K"):
        per_user_values(ranks, "Diversity@5")
    with pytest.raises(ValueError, match="1-based"):
        per_user_values([0, 2], "HR@5")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"challenger": [1, 0], "champion": [1]}, "same users"),
        ({"challenger": [], "champion": []}, "at least one"),
        ({"challenger": [1, math.nan], "champion": [1, 0]}, "not finite"),
        ({"margin": math.inf}, "margin"),
        ({"alpha": 0.0}, "alpha"),
        ({"power": 1.0}, "power"),
    ],
)
def test_bad_inputs_name_the_rule(kw, match):
    args = {"challenger": [1, 0], "champion": [0, 1], "margin": 0.02} | kw
    with pytest.raises(ValueError, match=match):
        paired_noninferiority(args.pop("challenger"), args.pop("champion"), **args)
