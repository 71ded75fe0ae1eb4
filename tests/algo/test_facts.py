"""Monte-Carlo and algebraic checks of the "Facts the tests pin" of docs/ABPO_SPEC.md (conditional on w):

    E[b] = alpha r_log + (1 - alpha) V,  alpha = w / (w + G - 1),  V = E_{a ~ pi_old}[r(a)]
    A_j^w = A_j^roll + alpha (mean rollout reward - r_log)          (before scaling by sigma)
    w = 1: the bias toward the rollout mean shrinks by (G-1)/G
    r_log > V (positive anchor) lowers, r_log < V (no-response anchor) raises the expected rollout advantages.

Every Monte-Carlo assertion also checks its own power: the estimate must be far (in standard errors) from
what a plausible bug would give (G in place of G-1, whole-batch SNIPS, no anchor), so the test can fail.
"""

import math

import pytest
import torch

from abpo.algo.advantages import anchored_advantages, anchored_baseline, anchored_spread, group_advantages
from abpo.algo.rewards import (
    NO_ITEM,
    anchor_reward,
    chosen_items,
    format_reward,
    match_reward,
    self_certainty,
    total_reward,
)
from abpo.algo.snips import snips_weight, stratified_self_normalise
from abpo.policy.prompt import format_answer

# A candidate set, the logged item and pi_old's distribution over outcomes (5 candidates + "malformed").
CANDS = [10, 11, 12, 13, 14]
A_LOG = 10
OUTCOMES = torch.tensor([10, 11, 12, 13, 14, NO_ITEM])
P_OLD = torch.tensor([0.35, 0.20, 0.15, 0.10, 0.10, 0.10], dtype=torch.float64)
P_MATCH, P_FMT = 0.35, 0.90  # P(a = a_log), P(well formed) under pi_old


def sample_outcomes(n_groups: int, n_roll: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.multinomial(P_OLD, n_groups * n_roll, replacement=True, generator=g)
    return OUTCOMES[idx].view(n_groups, n_roll)


def click_rewards(chosen: torch.Tensor) -> torch.Tensor:
    """y = 1 rollout rewards r = 1[a = a_log] + r_fmt, through the library's match_reward."""
    n = chosen.shape[0]
    r_match = match_reward(chosen, torch.full((n,), A_LOG), torch.ones(n, dtype=torch.int64))
    return (r_match + (chosen != NO_ITEM).float()).double()


V_CLICK = P_MATCH * 1 + P_FMT * 1  # V = E[1[a = a_log] + r_fmt] = 0.35 + 0.90 = 1.25
R_LOG_CLICK = 2.0  # the anchor of a click: r_match = 1, r_fmt = 1


def mean_and_se(x: torch.Tensor) -> tuple[float, float]:
    return x.mean().item(), x.std().item() / math.sqrt(x.numel())


@pytest.mark.parametrize("w,G", [(2.5, 4), (0.3, 4), (1.0, 8), (4.0, 2)])
def test_expected_baseline_is_alpha_mix_of_anchor_and_V(w, G):
    n = 100_000
    r_roll = click_rewards(sample_outcomes(n, G - 1, seed=G * 100 + int(w * 10)))
    r_log = torch.full((n,), R_LOG_CLICK, dtype=torch.float64)
    b = anchored_baseline(r_log, r_roll, torch.full((n,), w, dtype=torch.float64))
    mc, se = mean_and_se(b)
    alpha = w / (w + G - 1)  # alpha = w/(w+G-1)
    expected = alpha * R_LOG_CLICK + (1 - alpha) * V_CLICK  # E[b] = alpha r_log + (1-alpha) V
    assert abs(mc - expected) < 4 * se
    # power: with G in place of G-1, alpha' = w/(w+G) and E[b] moves by (alpha - alpha') (r_log - V)
    alpha_wrong = w / (w + G)
    wrong = alpha_wrong * R_LOG_CLICK + (1 - alpha_wrong) * V_CLICK
    assert abs(mc - wrong) > 10 * se


def test_advantage_shift_identity_before_scaling():
    # exact algebra: r_j - b = (r_j - rbar) + alpha (rbar - r_log), alpha = w/(w+G-1), for any rewards and w
    g = torch.Generator().manual_seed(7)
    B, n_roll = 64, 5  # G = 6
    r_log = torch.randn(B, generator=g, dtype=torch.float64) * 2
    r_roll = torch.randn(B, n_roll, generator=g, dtype=torch.float64)
    w = torch.rand(B, generator=g, dtype=torch.float64) * 3
    alpha = (w / (w + n_roll))[:, None]
    rbar = r_roll.mean(dim=1, keepdim=True)
    a_roll = r_roll - rbar  # A_j^roll (unscaled, rollouts-only baseline)
    shifted = a_roll + alpha * (rbar - r_log[:, None])  # A_j^roll + alpha (rbar - r_log)
    b = anchored_baseline(r_log, r_roll, w)
    assert torch.allclose(r_roll - b[:, None], shifted, atol=1e-12)  # A_j^w before scaling
    sigma = anchored_spread(r_log, r_roll, w, b, 1e-3)
    assert torch.allclose(anchored_advantages(r_log, r_roll, w, 1e-3), shifted / sigma[:, None], atol=1e-12)
    # power: the G-instead-of-G-1 alpha would not satisfy the identity
    alpha_wrong = (w / (w + n_roll + 1))[:, None]
    assert not torch.allclose(r_roll - b[:, None], a_roll + alpha_wrong * (rbar - r_log[:, None]), atol=1e-3)


def test_expected_advantage_shift_is_alpha_times_V_minus_r_log():
    # taking expectations of the identity: E[r_j - b] = alpha (V - r_log)
    n, G, w = 100_000, 4, 1.7
    r_roll = click_rewards(sample_outcomes(n, G - 1, seed=11))
    r_log = torch.full((n,), R_LOG_CLICK, dtype=torch.float64)
    b = anchored_baseline(r_log, r_roll, torch.full((n,), w, dtype=torch.float64))
    mc, se = mean_and_se((r_roll - b[:, None]).mean(dim=1))
    alpha = w / (w + G - 1)
    assert abs(mc - alpha * (V_CLICK - R_LOG_CLICK)) < 4 * se
    assert abs(mc - 0.0) > 10 * se  # the rollouts-only baseline (no anchor) would give 0


@pytest.mark.parametrize("G", [2, 4, 8])
def test_unit_weight_shrinks_the_bias_toward_the_rollout_mean_by_G_minus_1_over_G(G):
    # w = 1: alpha = 1/G, so E[b] = r_log/G + (G-1)/G V: the baseline's pull from r_log toward the rollout
    # mean V is (G-1)/G of the rollouts-only baseline's (which sits at V): (E[b] - r_log)/(V - r_log) = (G-1)/G
    n = 60_000
    r_roll = click_rewards(sample_outcomes(n, G - 1, seed=G))
    r_log = torch.full((n,), R_LOG_CLICK, dtype=torch.float64)
    b = anchored_baseline(r_log, r_roll, torch.ones(n, dtype=torch.float64))
    mc, se = mean_and_se(b)
    ratio, ratio_se = (mc - R_LOG_CLICK) / (V_CLICK - R_LOG_CLICK), se / abs(V_CLICK - R_LOG_CLICK)
    assert abs(ratio - (G - 1) / G) < 4 * ratio_se
    assert abs(ratio - G / (G + 1)) > 8 * ratio_se  # power: w + G in the denominator would give G/(G+1)
    # the rollouts-only baseline (plain GRPO) has no shrinkage: its mean is V itself
    rbar_mc, rbar_se = mean_and_se(r_roll.mean(dim=1))
    assert abs(rbar_mc - V_CLICK) < 4 * rbar_se


def _no_response_batch(n: int, G: int, lambda_sc: float, seed: int):
    """No-response (y = 0) groups built end to end from completion text: the rollouts rarely hit a_log (which
    costs -1) and pay the format reward, so V > r_log = lambda_sc r_sc(a_log)."""
    chosen = sample_outcomes(n, G - 1, seed=seed)
    texts = [
        format_answer(int(a), f"Movie {int(a)}") if a != NO_ITEM else "Movie 12, I think"
        for a in chosen.flatten().tolist()
    ]
    cands = [CANDS] * len(texts)
    a = chosen_items(texts, cands).view(n, G - 1)
    assert torch.equal(a, chosen)
    r_fmt = format_reward(texts, cands).view(n, G - 1)
    y = torch.zeros(n, dtype=torch.int64)
    r_match = match_reward(a, torch.full((n,), A_LOG), y)
    g = torch.Generator().manual_seed(seed + 1)
    logits = torch.randn(n * G, 4, 16, generator=g) * 2  # the anchor's + each rollout's next-token logits
    r_sc = self_certainty(logits, torch.ones(n * G, 4)).view(n, G).double()
    r_roll = total_reward(r_match.double(), r_fmt.double(), r_sc[:, 1:], y, lambda_sc)
    r_log = anchor_reward(y, r_sc[:, 0], lambda_sc)
    return r_log.double(), r_roll


def test_positive_anchor_lowers_and_no_response_anchor_raises_expected_rollout_advantages():
    n, G, lambda_sc, delta, eps_std = 4_000, 4, 0.1, 1e-6, 1e-4
    # click groups: r_log = 2 > V = 1.25
    r_roll_1 = click_rewards(sample_outcomes(n, G - 1, seed=21))
    r_log_1 = anchor_reward(torch.ones(n, dtype=torch.int64), None, lambda_sc).double()
    # no-response groups: r_log = lambda r_sc(a_log) < V = -0.35 + 0.9 + lambda E[r_sc]
    r_log_0, r_roll_0 = _no_response_batch(n, G, lambda_sc, seed=22)
    assert r_log_0.mean() < r_roll_0.mean() and R_LOG_CLICK > r_roll_1.mean()
    # one stratified batch with random propensities -> w_hat (ABPO variant F)
    g = torch.Generator().manual_seed(23)
    e0 = torch.rand(2 * n, generator=g, dtype=torch.float64) * 0.5 + 0.05
    e_old = torch.rand(2 * n, generator=g, dtype=torch.float64) * 0.5 + 0.05
    y = torch.cat([torch.ones(n), torch.zeros(n)]).long()
    w_hat = stratified_self_normalise(snips_weight(e_old, e0), y, delta)
    adv = anchored_advantages(torch.cat([r_log_1, r_log_0]), torch.cat([r_roll_1, r_roll_0]), w_hat, eps_std)
    m1, se1 = mean_and_se(adv[:n].mean(dim=1))
    m0, se0 = mean_and_se(adv[n:].mean(dim=1))
    assert m1 < -10 * se1  # positive anchor: lowered
    assert m0 > 10 * se0  # no-response anchor: raised
    # power: without the anchor (vanilla GRPO) every group's advantages average to exactly 0
    plain = group_advantages(torch.cat([r_roll_1, r_roll_0]), eps_std)
    assert plain.mean(dim=1).abs().max().item() < 1e-9
