"""abpo.sim.headroom: expected simulated CTR of a policy, the oracle-greedy ceiling and the random floor (Eqs. H1-H3)
on a hand-computed case, and on a month's requests the click probabilities are the simulator's own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.sizes import SIXTY_USERS

# 2 requests x 3 candidates, click probabilities known
P = [np.array([0.1, 0.5, 0.2]), np.array([0.3, 0.0, 0.6])]


def test_the_three_ctrs_on_a_hand_computed_case():
    from abpo.sim.headroom import expected_ctr, oracle_greedy_ctr, random_floor_ctr

    # oracle: (0.5 + 0.6) / 2; floor: (0.8 / 3 + 0.9 / 3) / 2; a policy: (1 * 0.1 + (0.5 * 0.3 + 0.5 * 0.6)) / 2
    assert oracle_greedy_ctr(P) == pytest.approx(0.55)
    assert random_floor_ctr(P) == pytest.approx(1.7 / 6)
    assert expected_ctr(P, [np.array([1.0, 0, 0]), np.array([0.5, 0, 0.5])]) == pytest.approx(0.275)
    # the greedy policy is the oracle, the uniform one the floor
    assert expected_ctr(P, [np.eye(3)[1], np.eye(3)[2]]) == pytest.approx(0.55)
    assert expected_ctr(P, [np.full(3, 1 / 3)] * 2) == pytest.approx(1.7 / 6)


def test_bad_inputs_are_refused_naming_the_request():
    from abpo.sim.headroom import expected_ctr, oracle_greedy_ctr

    with pytest.raises(ValueError, match="one each"):
        expected_ctr(P, [np.full(3, 1 / 3)])
    with pytest.raises(ValueError, match="request 1: exposure .* summing to 1"):
        expected_ctr(P, [np.full(3, 1 / 3), np.array([0.5, 0.5, 0.5])])
    with pytest.raises(ValueError, match="request 0: exposure"):
        expected_ctr(P, [np.full(2, 0.5), np.full(3, 1 / 3)])
    with pytest.raises(ValueError, match="request 0: click probabilities"):
        oracle_greedy_ctr([np.array([1.5])])
    with pytest.raises(ValueError, match="no requests"):
        oracle_greedy_ctr([])


class FixedPolicy:
    """A policy that is a rule on the candidates: all mass on the candidate ``pick`` returns (or uniform)."""

    def __init__(self, name, pick=None):
        self.name, self.model_version, self.logging_policy, self.pick = name, "0", "fixed", pick

    def propensities(self, requests):
        out = []
        for u, h, c in requests:
            if self.pick is None:
                out.append(np.full(len(c), 1 / len(c)))
            else:
                out.append(np.eye(len(c))[self.pick(u, h, c)])
        return out


def test_a_months_click_probabilities_are_the_simulators(make_cfg, movielens):
    """On a month's requests, p_r(a) of every candidate is abpo.sim.simulator.click_probabilities' for that
    candidate exposed, the intercept is simulate_month's, and a uniform policy meets the floor, a policy that picks
    each request's true next item when it is a candidate at least click_next on those requests."""
    from abpo.data.splits import split_users
    from abpo.sim.headroom import ORACLE_GREEDY, RANDOM_FLOOR, candidate_click_probabilities, month_headroom
    from abpo.sim.simulator import click_probabilities, month_requests, simulate_month

    cfg = make_cfg(*SIXTY_USERS, "sim.requests_per_user=2", "report.arm_shares={uniform: 1.0}")
    splits, _ = split_users(movielens, cfg.data)
    reqs = month_requests(cfg, movielens, splits, "2026-02")
    probs, b0 = candidate_click_probabilities(cfg, movielens, reqs)
    flat, b0_ref = click_probabilities(
        cfg,
        movielens,
        [(r.user_id, r.history, r.candidates, a, r.next_item, r.soon) for r in reqs for a in r.candidates],
    )
    assert b0 == pytest.approx(b0_ref, abs=1e-8)
    np.testing.assert_allclose(np.concatenate(probs), flat, atol=1e-9)
    sim = simulate_month(
        cfg, "2026-02", {"uniform": FixedPolicy("uniform")}, dataset=movielens, splits=splits, write=False
    )
    assert b0 == pytest.approx(sim.calibration["intercept"], abs=1e-8)

    def next_or_first(u, h, c):
        r = by_key[(u, len(h))]
        return c.index(r.next_item) if r.next_item in c else 0

    by_key = {(r.user_id, len(r.history)): r for r in reqs}
    out = month_headroom(
        cfg,
        "2026-02",
        {"uniform": FixedPolicy("uniform"), "next": FixedPolicy("next", next_or_first)},
        dataset=movielens,
        splits=splits,
    )
    assert [r.policy for r in out.rows] == [ORACLE_GREEDY, "uniform", "next", RANDOM_FLOOR]
    assert out.requests == len(reqs) and out.intercept == pytest.approx(b0)
    assert out.row("uniform").ctr == pytest.approx(out.row(RANDOM_FLOOR).ctr)
    assert out.row("uniform").gap_closed == pytest.approx(0.0, abs=1e-9)
    assert out.row(ORACLE_GREEDY).gap_closed == 1.0
    floor, best = out.row(RANDOM_FLOOR).ctr, out.row(ORACLE_GREEDY).ctr
    assert floor < out.row("next").ctr <= best
    hits = [r for r in reqs if r.next_item in r.candidates]
    assert hits, "retrieval finds some true next items"
    expected_next = (
        sum(p[r.candidates.index(r.next_item)] for r, p in zip(reqs, probs, strict=True) if r in hits)
        + sum(p[0] for r, p in zip(reqs, probs, strict=True) if r not in hits)
    ) / len(reqs)
    assert out.row("next").ctr == pytest.approx(expected_next)
    assert all(p[r.candidates.index(r.next_item)] >= cfg.sim.click_next for r, p in zip(reqs, probs) if r in hits)
    assert math.isfinite(out.row("next").gap_closed)
