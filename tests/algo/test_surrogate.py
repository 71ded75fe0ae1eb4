"""Step 5 of docs/ABPO_SPEC.md: the clipped surrogate (maximised), its ratios, masking, gradients and KL term."""

import math

import pytest
import torch

from abpo.algo.surrogate import clipped_surrogate, kl_k3, sequence_log_ratio

NEG_INF = -float("inf")
# Two rollouts, T = 3; row 0 has 2 completion tokens (the third slot is padding holding garbage), row 1 has 3.
LOGP_OLD = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
LOGP_NEW = torch.tensor([[-0.9, -2.0, NEG_INF], [-0.6, -0.7, -0.6]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
ADV = torch.tensor([1.0, -2.0], dtype=torch.float64)
EPS = 0.2


def test_sequence_ratio_hand_example():
    # row 0: log s = (-0.9 + 1.0) + (-2.0 + 2.0) = 0.1      -> s = e^0.1 = 1.1051709, A = +1
    #        min(1.1051709 * 1, clip(1.1051709, 0.8, 1.2) * 1) = 1.1051709
    # row 1: log s = -0.1 - 0.2 - 0.1 = -0.4                -> s = e^-0.4 = 0.6703200, A = -2
    #        min(0.6703200 * -2, 0.8 * -2) = min(-1.3406401, -1.6) = -1.6   (pessimistic clipped bound)
    # objective = (1.1051709 - 1.6) / 2 = -0.2474145
    assert sequence_log_ratio(LOGP_NEW, LOGP_OLD, MASK, "sequence").tolist() == pytest.approx([0.1, -0.4])
    j = clipped_surrogate(LOGP_NEW, LOGP_OLD, ADV, MASK, EPS)
    assert j.item() == pytest.approx((math.exp(0.1) - 1.6) / 2, abs=1e-12)


def test_geometric_ratio_hand_example():
    # row 0: log s = 0.1 / 2 = 0.05 -> s = 1.0512711 (in the clip range) -> 1.0512711
    # row 1: log s = -0.4 / 3       -> s = 0.8751733 (in range)         -> -1.7503466
    # objective = (1.0512711 - 1.7503466) / 2 = -0.3495378
    j = clipped_surrogate(LOGP_NEW, LOGP_OLD, ADV, MASK, EPS, ratio_level="geometric")
    assert j.item() == pytest.approx((math.exp(0.05) - 2 * math.exp(-0.4 / 3)) / 2, abs=1e-12)


def test_token_ratio_hand_example():
    # row 0: s_t = [e^0.1, e^0] = [1.1051709, 1], A = 1 -> mean_t = (1.1051709 + 1) / 2 = 1.0525855
    # row 1: s_t = [e^-0.1, e^-0.2, e^-0.1] = [0.9048374, 0.8187308, 0.9048374] (all in range), A = -2
    #        -> mean_t = -2 (0.9048374 + 0.8187308 + 0.9048374) / 3 = -1.7522704
    # objective = (1.0525855 - 1.7522704) / 2 = -0.3498425
    row0 = (math.exp(0.1) + 1.0) / 2
    row1 = -2 * (2 * math.exp(-0.1) + math.exp(-0.2)) / 3
    j = clipped_surrogate(LOGP_NEW, LOGP_OLD, ADV, MASK, EPS, ratio_level="token")
    assert j.item() == pytest.approx((row0 + row1) / 2, abs=1e-12)


def test_asymmetric_epsilon():
    # (eps_low, eps_high) = (0.5, 0.2): row 1's s = 0.67 is now inside [0.5, 1.2] -> -1.3406401
    j = clipped_surrogate(LOGP_NEW, LOGP_OLD, ADV, MASK, (0.5, 0.2))
    assert j.item() == pytest.approx((math.exp(0.1) - 2 * math.exp(-0.4)) / 2, abs=1e-12)


def test_objective_is_mean_over_examples_of_mean_over_rollouts_and_shape_agnostic():
    g = torch.Generator().manual_seed(0)
    B, n_roll, T = 3, 4, 5
    new = -torch.rand(B, n_roll, T, generator=g, dtype=torch.float64)
    old = new + 0.1 * torch.randn(B, n_roll, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, n_roll, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, n_roll, T, generator=g) > 0.3).long()
    j = clipped_surrogate(new, old, adv, mask, EPS)
    # explicit: mean over i of (1/(G-1)) sum_j min(s A, clip(s) A)
    total = 0.0
    for i in range(B):
        inner = 0.0
        for k in range(n_roll):
            s = math.exp(float(((new[i, k] - old[i, k]) * mask[i, k]).sum()))
            a = float(adv[i, k])
            inner += min(s * a, min(max(s, 1 - EPS), 1 + EPS) * a)
        total += inner / n_roll
    assert j.item() == pytest.approx(total / B, abs=1e-12)
    flat = clipped_surrogate(new.view(-1, T), old.view(-1, T), adv.view(-1), mask.view(-1, T), EPS)
    assert flat.item() == pytest.approx(j.item(), abs=1e-14)


def test_on_policy_gradient_is_advantage_times_score():
    # pi_theta = pi_old (s = 1): d J / d logp_new[i, t] = A_i / N on every completion token ("sequence"),
    # A_i / (N T_i) for "token"; padding gets nothing; logp_old and the advantages get no gradient.
    base = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    for level, expected in (
        ("sequence", [[0.5, 0.5, 0.0], [-1.0, -1.0, -1.0]]),  # A / N = [1/2, -2/2]
        ("token", [[0.25, 0.25, 0.0], [-1 / 3, -1 / 3, -1 / 3]]),  # A / (N T_i) = [1/(2*2), -2/(2*3)]
        ("geometric", [[0.25, 0.25, 0.0], [-1 / 3, -1 / 3, -1 / 3]]),
    ):
        new = base.clone().requires_grad_()
        old = base.clone().requires_grad_()
        adv = ADV.clone().requires_grad_()
        clipped_surrogate(new, old, adv, MASK, EPS, ratio_level=level).backward()
        assert new.grad.tolist() == [pytest.approx(r) for r in expected], level
        assert old.grad is None and adv.grad is None


def test_clipped_region_has_no_gradient():
    # row 0: s = e^0.1 with A > 0 is inside the range -> gradient s A / N = 1.1051709 / 2 per token
    # row 1: s = e^-0.4 < 0.8 with A < 0 -> the clipped branch (constant) is the min -> zero gradient
    new = LOGP_NEW.clone()
    new[0, 2] = -1.0  # finite padding so the gradient can be inspected
    new.requires_grad_()
    clipped_surrogate(new, LOGP_OLD, ADV, MASK, EPS).backward()
    assert new.grad[0].tolist() == pytest.approx([math.exp(0.1) / 2, math.exp(0.1) / 2, 0.0])
    assert new.grad[1].abs().max().item() == 0.0
    # and an A > 0 completion with s > 1 + eps is clipped too
    up = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    clipped_surrogate(
        up, torch.tensor([[-0.5]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), EPS
    ).backward()
    assert up.grad.item() == 0.0


def test_kl_term_hand_example():
    # k3 = exp(ref - new) - (ref - new) - 1; new = -1.0, ref = -1.5 -> d = -0.5
    #    = 0.6065307 + 0.5 - 1 = 0.1065307
    new = torch.tensor([[-1.0, 7.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0]])
    k = kl_k3(new, ref, mask)
    assert k.item() == pytest.approx(math.exp(-0.5) - 0.5, abs=1e-12)
    # J = min(1 * A, ...) - beta * k3 with s = 1, A = 2, beta = 0.1: 2 - 0.01065307
    j = clipped_surrogate(new, new.clone(), torch.tensor([2.0], dtype=torch.float64), mask, EPS, logp_ref=ref, beta=0.1)
    assert j.item() == pytest.approx(2.0 - 0.1 * (math.exp(-0.5) - 0.5), abs=1e-12)
    assert kl_k3(new, new, mask).item() == 0.0  # KL of a policy from itself


def test_surrogate_errors():
    with pytest.raises(ValueError, match="needs logp_ref"):
        clipped_surrogate(LOGP_NEW, LOGP_OLD, ADV, MASK, EPS, beta=0.1)
    with pytest.raises(ValueError, match=r"advantages \(3,\); rule: one per completion"):
        clipped_surrogate(LOGP_NEW, LOGP_OLD, torch.zeros(3), MASK, EPS)
    with pytest.raises(ValueError, match="same shape"):
        clipped_surrogate(LOGP_NEW, LOGP_OLD[:, :2], ADV, MASK, EPS)
    with pytest.raises(ValueError, match="ratio_level"):
        clipped_surrogate(LOGP_NEW, LOGP_OLD, ADV, MASK, EPS, ratio_level="tokens")
