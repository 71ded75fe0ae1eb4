"""abpo.algo.diagnostics on hand-computed cases: Eq. G against autograd, the push of Eq. P, gamma, the cosine, the
zero-spread share and the rank correlation."""

from __future__ import annotations

import math

import pytest
import torch

from abpo.algo.advantages import anchored_advantages, group_advantages
from abpo.algo.diagnostics import (
    gamma_ratio,
    gradient_cosine,
    group_std_mean,
    log_odds_push,
    logit_gradient,
    rank_correlation,
    zero_spread_share,
)


def test_logit_gradient_by_hand():
    pi = torch.tensor([0.5, 0.25, 0.25])
    chosen = torch.tensor([0, 0, 2, -1])  # the last row names no candidate: no term
    adv = torch.tensor([1.0, 0.5, -1.0, 7.0])
    g = logit_gradient(pi, chosen, adv)
    # c = (1.5, 0, -1), sum c = 0.5: g = c - 0.5 pi
    assert torch.allclose(g, torch.tensor([1.5 - 0.25, -0.125, -1.0 - 0.125], dtype=torch.float64))
    assert abs(float(g.sum())) < 1e-12  # a logit gradient of a softmax sums to 0
    w = torch.tensor([0.0, 1.0, 1.0, 1.0])  # a zero-weight row (as the anchor in step 5) adds nothing
    # c = (0.5, 0, -1), sum c = -0.5: g = c + 0.5 pi
    assert torch.allclose(logit_gradient(pi, chosen, adv, w), torch.tensor([0.75, 0.125, -0.875], dtype=torch.float64))


def test_logit_gradient_is_the_autograd_gradient_of_the_surrogate():
    torch.manual_seed(0)
    z = torch.randn(5, dtype=torch.float64, requires_grad=True)
    tau = 0.7
    chosen = torch.tensor([1, 3, 3, 0])
    adv = torch.tensor([0.3, -1.2, 0.4, 0.9], dtype=torch.float64)
    logp = torch.log_softmax(z / tau, dim=0)
    (grad,) = torch.autograd.grad((adv * logp[chosen]).sum(), z)  # d/dz sum_r A_r log pi(a_r), s = 1
    pi = torch.softmax(z / tau, dim=0).detach()
    assert torch.allclose(logit_gradient(pi, chosen, adv) / tau, grad)


def test_push_and_gamma_ratio_by_hand():
    chosen = torch.tensor([2, 0, 2])
    assert log_odds_push(chosen, torch.tensor([0.5, 9.0, 0.25]), 2) == 0.75
    assert log_odds_push(chosen, torch.tensor([0.5, 9.0, 0.25]), 1) == 0.0
    assert log_odds_push(chosen, torch.tensor([1.0, 1.0, 1.0]), 2, torch.tensor([2.0, 1.0, 0.0])) == 2.0
    # examples 0 and 2 have a B push; example 1 (B push 0) is left out of the mean
    assert gamma_ratio([2.0, 5.0, -1.0], [1.0, 0.0, 1.0]) == pytest.approx((2.0 - 1.0) / 2)
    assert math.isnan(gamma_ratio([1.0], [0.0]))
    with pytest.raises(ValueError, match="one of each per logged example"):
        gamma_ratio([1.0, 2.0], [1.0])


def test_anchor_changes_gamma_on_the_same_rollouts():
    """A clicked example whose 3 rollouts all chose a^log (index 0): GRPO's group has zero spread and pushes
    nothing (gamma undefined there); a no-response example where one of 3 rollouts chose a^log: the anchor (reward
    lambda*r_sc = 0 < the rollouts' mean) lowers the baseline."""
    r_roll = torch.tensor([[2.0, 2.0, 2.0], [0.0, 1.0, 1.0]])
    chosen = torch.tensor([[0, 0, 0], [0, 1, 2]])
    a_b = group_advantages(r_roll, 1e-4)
    a_c = anchored_advantages(torch.tensor([2.0, 0.0]), r_roll, torch.ones(2), 1e-4)
    push_b = [log_odds_push(chosen[i], a_b[i], 0) for i in range(2)]
    push_c = [log_odds_push(chosen[i], a_c[i], 0) for i in range(2)]
    assert push_b[0] == 0.0 and push_c[0] == 0.0  # all equal to the anchor too
    # B: mean 2/3, std sqrt(2/9 + 1e-4); C: mean 1/2, std sqrt(1/4 + 1e-4)
    exp_b, exp_c = -(2 / 3) / math.sqrt(2 / 9 + 1e-4), -0.5 / math.sqrt(0.25 + 1e-4)
    assert push_b[1] == pytest.approx(exp_b, rel=1e-5) and push_c[1] == pytest.approx(exp_c, rel=1e-5)
    assert gamma_ratio(push_c, push_b) == pytest.approx(exp_c / exp_b, rel=1e-5)


def test_gradient_cosine_by_hand():
    assert gradient_cosine(
        [torch.tensor([1.0, 0.0]), torch.tensor([1.0])], [torch.tensor([1.0, 1.0]), torch.tensor([0.0])]
    ) == (
        pytest.approx(0.5)  # (1, 0, 1) . (1, 1, 0) / (sqrt 2 sqrt 2)
    )
    assert gradient_cosine(torch.tensor([1.0, -1.0]), torch.tensor([-2.0, 2.0])) == pytest.approx(-1.0)
    assert math.isnan(gradient_cosine(torch.zeros(3), torch.ones(3)))
    with pytest.raises(ValueError, match="the same candidates"):
        gradient_cosine(torch.ones(2), torch.ones(3))


def test_zero_spread_and_group_std():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [2.0, 2.0, 2.0], [-1.0, 0.0, 1.0]])
    assert zero_spread_share(r) == 0.5
    assert group_std_mean(torch.tensor([[1.0, 1.0], [0.0, 2.0]])) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        zero_spread_share(torch.ones(3))


def test_rank_correlation_by_hand():
    assert rank_correlation([1, 2, 3, 4], [10, 100, 1000, 10000]) == pytest.approx(1.0)  # monotone, not linear
    assert rank_correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ties get their average rank: x ranks (1.5, 1.5, 3), y ranks (1, 2, 3): rho = 0.75 / sqrt(0.5 * 2) = 0.866..
    assert rank_correlation([5, 5, 7], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(rank_correlation([1.0], [2.0]))
    assert math.isnan(rank_correlation([1.0, 1.0], [2.0, 3.0]))
