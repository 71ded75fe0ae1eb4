"""Step 4 of docs/ABPO_SPEC.md: anchored baseline, spread and advantages (G-1 rollouts only), and variant (B)."""

import math

import pytest
import torch

from abpo.algo.advantages import anchored_advantages, anchored_baseline, anchored_spread, group_advantages

# Two logged examples, G = 4 (anchor + G-1 = 3 rollouts)
R_LOG = torch.tensor([2.0, 0.0], dtype=torch.float64)
R_ROLL = torch.tensor([[1.0, 0.0, 1.0], [0.5, 1.0, 1.5]], dtype=torch.float64)
W_HAT = torch.tensor([2.0, 0.5], dtype=torch.float64)
EPS = 0.04

# example 0: b = (2*2 + (1+0+1)) / (2 + 3) = 6/5 = 1.2
#   squares: 2*(2-1.2)^2 = 1.28; (1-1.2)^2 + (0-1.2)^2 + (1-1.2)^2 = 0.04 + 1.44 + 0.04 = 1.52
#   sigma = sqrt((1.28 + 1.52)/5 + 0.04) = sqrt(0.56 + 0.04) = sqrt(0.6)
# example 1: b = (0.5*0 + (0.5+1+1.5)) / (0.5 + 3) = 3/3.5 = 6/7
#   squares: 0.5*(0-6/7)^2 = 18/49; (1/2-6/7)^2 + (1-6/7)^2 + (3/2-6/7)^2 = 25/196 + 4/196 + 81/196 = 110/196
#   sigma = sqrt((18/49 + 110/196)/3.5 + 0.04) = sqrt((182/196)/3.5 + 0.04) = sqrt(13/49 + 0.04)
B_HAND = [1.2, 6 / 7]
SIGMA_HAND = [math.sqrt(0.6), math.sqrt(13 / 49 + 0.04)]


def test_anchored_baseline_hand_example():
    b = anchored_baseline(R_LOG, R_ROLL, W_HAT)
    assert b.tolist() == pytest.approx(B_HAND, abs=1e-12)
    # using G (= w + 4) instead of G-1 in the denominator would give 6/6 = 1.0 for example 0
    assert b[0].item() != pytest.approx(1.0)


def test_anchored_spread_hand_example():
    b = anchored_baseline(R_LOG, R_ROLL, W_HAT)
    sigma = anchored_spread(R_LOG, R_ROLL, W_HAT, b, EPS)
    assert sigma.tolist() == pytest.approx(SIGMA_HAND, abs=1e-12)


def test_anchored_advantages_hand_example_rollouts_only():
    a = anchored_advantages(R_LOG, R_ROLL, W_HAT, EPS)
    assert a.shape == (2, 3)  # G-1 columns: the anchor has no advantage
    # example 0: (r - 1.2)/sqrt(0.6) = [-0.2, -1.2, -0.2]/0.7745967 = [-0.2581989, -1.5491933, -0.2581989]
    assert a[0].tolist() == pytest.approx([-0.2 / math.sqrt(0.6), -1.2 / math.sqrt(0.6), -0.2 / math.sqrt(0.6)])
    expected1 = [(r - 6 / 7) / SIGMA_HAND[1] for r in (0.5, 1.0, 1.5)]
    assert a[1].tolist() == pytest.approx(expected1)


def test_advantages_carry_no_gradient():
    r_roll = R_ROLL.clone().requires_grad_()
    r_log = R_LOG.clone().requires_grad_()
    a = anchored_advantages(r_log, r_roll, W_HAT.clone().requires_grad_(), EPS)
    assert not a.requires_grad and a.grad_fn is None
    assert not group_advantages(r_roll, EPS).requires_grad


def test_group_advantages_hand_example_and_equivalence_to_zero_anchor_weight():
    r = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    # spec style: mean 2/3, population var ((1/3)^2 + (2/3)^2 + (1/3)^2)/3 = (6/9)/3 = 2/9, eps 0
    # A = [1/3, -2/3, 1/3] / sqrt(2/9) = [0.7071068, -1.4142136, 0.7071068]
    s = math.sqrt(2 / 9)
    assert group_advantages(r, 0.0)[0].tolist() == pytest.approx([1 / 3 / s, -2 / 3 / s, 1 / 3 / s])
    # TRL style: unbiased var (6/9)/2 = 1/3, A = [1/3, -2/3, 1/3] / (sqrt(1/3) + 1e-4)
    t = math.sqrt(1 / 3) + 1e-4
    assert group_advantages(r, 1e-4, style="trl")[0].tolist() == pytest.approx([1 / 3 / t, -2 / 3 / t, 1 / 3 / t])
    # (B) is the anchored formula with no anchor: w_hat = 0
    g = torch.Generator().manual_seed(0)
    rr = torch.randn(6, 5, generator=g, dtype=torch.float64)
    zero = torch.zeros(6, dtype=torch.float64)
    assert torch.allclose(
        group_advantages(rr, EPS), anchored_advantages(torch.randn(6, generator=g, dtype=torch.float64), rr, zero, EPS)
    )


def test_group_advantages_sum_to_zero_but_anchored_ones_do_not():
    # rollouts-only normalisation centres each group; the anchor shifts the centre (docs/ABPO_SPEC.md facts)
    assert group_advantages(R_ROLL, EPS).sum(dim=1).abs().max().item() < 1e-12
    assert anchored_advantages(R_LOG, R_ROLL, W_HAT, EPS).sum(dim=1).abs().min().item() > 0.1


def test_degenerate_groups_give_zero_advantages_not_nan():
    const = torch.full((2, 3), 1.0)
    assert anchored_advantages(torch.ones(2), const, torch.ones(2), 0.0).abs().max() == 0
    assert group_advantages(const, 0.0).abs().max() == 0
    assert group_advantages(const, 0.0, style="trl").abs().max() == 0
    # eps_std keeps sigma > 0: a group whose only spread is the anchor still gets finite advantages
    a = anchored_advantages(torch.tensor([2.0]), torch.zeros(1, 3), torch.tensor([1.0]), 1e-4)
    # b = 2/4 = 0.5; sigma = sqrt((1*1.5^2 + 3*0.5^2)/4 + 1e-4) = sqrt(0.75 + 1e-4); A = -0.5/sigma
    assert a[0].tolist() == pytest.approx([-0.5 / math.sqrt(0.7501)] * 3)


def test_shape_and_value_errors():
    with pytest.raises(ValueError, match=r"r_roll has shape \(2,\); rule: \[B, G-1\]"):
        anchored_baseline(R_LOG, R_LOG, W_HAT)
    with pytest.raises(ValueError, match=r"w_hat has shape \(3,\)"):
        anchored_baseline(R_LOG, R_ROLL, torch.ones(3))
    with pytest.raises(ValueError, match=r"w_hat\[1\] = -1"):
        anchored_advantages(R_LOG, R_ROLL, torch.tensor([1.0, -1.0]), EPS)
    with pytest.raises(ValueError, match="eps_std >= 0"):
        anchored_advantages(R_LOG, R_ROLL, W_HAT, -1.0)
    with pytest.raises(ValueError, match="style"):
        group_advantages(R_ROLL, EPS, style="other")
    with pytest.raises(ValueError, match="G-1 >= 2"):
        group_advantages(R_ROLL[:, :1], EPS, style="trl")
