"""docs/update-variants.md: the logged item's own terms (abpo.algo.anchor_terms), the SNIPS-weighted likelihood
(Eq. L1) and the shaped, clipped off-policy anchor term (Eqs. O1-O3), on small hand-computed cases."""

import math

import pytest
import torch

from abpo.algo.anchor_terms import (
    anchor_advantage,
    likelihood_coefficients,
    offpolicy_anchor_surrogate,
    shaping,
    weighted_log_likelihood,
)

W = torch.tensor([1.0, 3.0, 0.5, 1.5], dtype=torch.float64)  # raw SNIPS weights e_old / e0
Y = torch.tensor([1, 1, 0, 0])


def test_likelihood_coefficients_and_objective_by_hand():
    # B_1 = {0, 1}: mean w = 2, so w_hat = 0.5, 1.5; c_i = lambda y_i w_hat_i / B with B = 4
    c = likelihood_coefficients(W, Y, 0.0, 1.0)
    assert c.tolist() == pytest.approx([0.125, 0.375, 0.0, 0.0])
    assert likelihood_coefficients(W, Y, 0.0, 2.0).tolist() == pytest.approx([0.25, 0.75, 0.0, 0.0])
    assert likelihood_coefficients(W, Y, 0.0, 0.0).abs().sum() == 0
    logp = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    j = weighted_log_likelihood(logp, c)
    assert float(j.detach()) == pytest.approx(0.125 * -1 + 0.375 * -2)  # -0.875: no-responses carry no term
    (g,) = torch.autograd.grad(j, logp)
    assert g.tolist() == pytest.approx([0.125, 0.375, 0.0, 0.0])  # d J / d l_i = c_i
    with pytest.raises(ValueError, match="likelihood_weight"):
        likelihood_coefficients(W, Y, 0.0, -1.0)


def test_weighted_likelihood_gradient_is_the_ips_gradient_of_the_click_rate():
    """Eq. L1's claim, exactly: for a softmax policy pi over 5 candidates, logged by e0, with click probabilities p,
    the expectation over (a ~ e0, y ~ p(a)) of y w grad log pi(a), w = pi / e0 at theta_old, is grad sum_a pi(a) p(a)."""
    z = torch.tensor([0.3, -0.2, 1.0, 0.0, -1.0], dtype=torch.float64, requires_grad=True)
    e0 = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15], dtype=torch.float64)
    p = torch.tensor([0.05, 0.2, 0.1, 0.02, 0.4], dtype=torch.float64)
    logpi = torch.log_softmax(z, 0)
    w = (logpi.exp() / e0).detach()
    # the expectation written as the coefficients e0(a) p(a) w(a) of log pi(a) (every (a, y = 1) pair once)
    (g_ll,) = torch.autograd.grad(weighted_log_likelihood(logpi, e0 * p * w), z)
    (g_ctr,) = torch.autograd.grad((torch.softmax(z, 0) * p).sum(), z)
    assert torch.allclose(g_ll, g_ctr, atol=1e-12)


def test_anchor_advantage_anchored_and_plain_by_hand():
    r_log = torch.tensor([2.0, 0.0])
    r_roll = torch.tensor([[2.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # anchored, w_hat = 1: b = (2 + 4) / 4 = 1.5, sigma = sqrt(4 * 0.25 / 4) = 0.5 -> A = +1; b = 0.5 -> A = -1
    a = anchor_advantage(r_log, r_roll, torch.ones(2), 0.0)
    assert a.tolist() == pytest.approx([1.0, -1.0])
    # variant B (no anchor in the group): b = 4/3, sigma = sqrt(2/9) -> A = (2/3) / sqrt(2/9) = sqrt(2)
    a = anchor_advantage(r_log, r_roll, None, 0.0)
    assert a.tolist() == pytest.approx([math.sqrt(2), -math.sqrt(2)])
    # all rewards equal (eps_std = 0): sigma = 0 gives A = 0, not 0/0
    assert anchor_advantage(torch.tensor([1.0]), torch.ones(1, 3), torch.ones(1), 0.0).tolist() == [0.0]


def test_shaping_by_hand():
    assert shaping(torch.tensor([0.1, 0.3, 0.0]), 0.1).tolist() == pytest.approx([0.5, 0.75, 0.0])
    with pytest.raises(ValueError, match="offpolicy_gamma"):
        shaping(torch.tensor([1.0]), 0.0)


def test_offpolicy_anchor_term_value_and_gradient_at_pi_old():
    """At theta = theta_old (s = 1) J_off = sum_i c_i f(rho_i) and d J / d l_i = c_i gamma rho_i / (rho_i + gamma)^2."""
    gamma = 0.1
    e0 = torch.tensor([0.5, 0.1])
    pi = torch.tensor([0.05, 0.3])  # rho = 0.1 and 3
    logp = torch.log(pi).requires_grad_(True)
    coef = torch.tensor([2.0, -1.0])  # lambda nu A / B: a clicked anchor pushed up, a no-response one down
    j = offpolicy_anchor_surrogate(logp, logp.detach(), torch.log(e0), coef, 0.2, gamma)
    assert float(j.detach()) == pytest.approx(2.0 * 0.5 - 1.0 * 3 / 3.1, rel=1e-5)
    (g,) = torch.autograd.grad(j, logp)
    assert g.tolist() == pytest.approx([2.0 * 0.25, -1.0 * gamma * 3 / 3.1**2], rel=1e-5)
    # the push is largest near rho = gamma (0.25 per unit of c) and small where the policy already rates the item
    # far above its logger
    assert abs(g[0]) / 2.0 > abs(g[1]) / 1.0


def test_offpolicy_anchor_term_is_clipped_away_from_pi_old():
    """Past the clip range the term is flat in theta (no gradient) and equals its clipped value, as step 5's."""
    gamma, e0 = 0.1, torch.tensor([0.2, 0.2])
    old = torch.log(torch.tensor([0.1, 0.1]))
    new = (old + torch.log(torch.tensor([1.5, 0.5]))).requires_grad_(True)  # s = 1.5 and 0.5
    coef = torch.tensor([1.0, -1.0])
    j = offpolicy_anchor_surrogate(new, old, torch.log(e0), coef, 0.2, gamma)
    rho_old = 0.1 / 0.2
    f = lambda x: x / (x + gamma)  # noqa: E731
    # A > 0, s = 1.5: min(f(1.5 rho_old), f(1.2 rho_old)) = f(1.2 rho_old); A < 0, s = 0.5: -max(f(.5), f(.8)) rho_old
    assert float(j.detach()) == pytest.approx(f(1.2 * rho_old) - f(0.8 * rho_old), rel=1e-5)  # float32
    (g,) = torch.autograd.grad(j, new)
    assert g.abs().max() == 0
    with pytest.raises(ValueError, match="all \\[S\\]"):
        offpolicy_anchor_surrogate(new, old, torch.log(e0), torch.ones(3), 0.2, gamma)
