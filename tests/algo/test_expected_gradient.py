"""abpo.algo.expected_gradient: Eq. R1/R2 (docs/regimes.md) against a Monte-Carlo of the project's own rewards,
SNIPS weights, advantages and surrogate on a 6-candidate softmax, and against a hand case."""

from __future__ import annotations

import math

import pytest
import torch

from abpo.algo import (
    anchor_reward,
    clipped_surrogate,
    get_variant,
    match_reward,
    rollout_advantages,
    stratified_self_normalise,
    token_kl_from_uniform,
    total_reward,
)
from abpo.algo.expected_gradient import expected_logit_gradient, gamma, gamma_anchored, gamma_grpo

C, A_LOG, N_ROLL, GROUPS = 6, 2, 7, 20000
EPS_STD, DELTA, LAMBDA_SC = 1e-4, 1e-6, 0.1


def _logits(p: float) -> torch.Tensor:
    """Logits over C = 6 candidates with pi(a_log) = p and an uneven rest."""
    rest = torch.tensor([0.3, -0.4, 0.9, 0.0, -1.1], dtype=torch.float64).softmax(0) * (1 - p)
    pi = torch.cat([rest[:A_LOG], torch.tensor([p], dtype=torch.float64), rest[A_LOG:]])
    return pi.log()


def _mc_groups(variant: str, z: torch.Tensor, y: int, seed: int):
    """Per-group logit gradients [GROUPS, C] of the surrogate, from sampled rollouts, the project's rewards and
    advantages, and the anchor weights w_hat [GROUPS] they used."""
    gen = torch.Generator().manual_seed(seed)
    pi = z.softmax(0)
    a = torch.multinomial(pi.float().expand(GROUPS, C), N_ROLL, replacement=True, generator=gen)  # [M, n]
    logged = torch.full((GROUPS,), A_LOG, dtype=torch.int64)
    yy = torch.full((GROUPS,), y, dtype=torch.int64)
    r_sc = token_kl_from_uniform(z.float()).expand(GROUPS)  # one-token answer: the same r_sc for every completion
    v = get_variant(variant)
    lam = v.effective_lambda_sc(LAMBDA_SC)
    r_roll = total_reward(
        match_reward(a, logged, yy), torch.ones(GROUPS, N_ROLL), r_sc[:, None].expand(GROUPS, N_ROLL), yy, lam
    )
    r_log = anchor_reward(yy, r_sc, lam)
    w = torch.tensor([0.5, 2.0], dtype=torch.float32).repeat(GROUPS // 2)  # raw SNIPS weights e_old / e0 in [0.5, 2]
    adv = rollout_advantages(v, r_log, r_roll, yy, w, delta=DELTA, eps_std=EPS_STD)
    w_hat = stratified_self_normalise(w, yy, DELTA) if v.snips else torch.ones(GROUPS)
    zb = z.detach().repeat(GROUPS, 1).requires_grad_(True)
    logp = torch.log_softmax(zb, dim=1).gather(1, a)[..., None]  # [M, n, T = 1]
    obj = clipped_surrogate(logp, logp.detach(), adv.double(), torch.ones_like(logp), 0.2)
    (grad,) = torch.autograd.grad(obj, zb)
    return grad * GROUPS, w_hat  # the surrogate averages over groups: times M gives each group's own gradient


@pytest.mark.parametrize("variant", ["grpo", "anchor", "anchor_snips", "anchor_sc", "abpo"])
@pytest.mark.parametrize("y", [1, 0])
@pytest.mark.parametrize("p", [0.22, 0.53])
def test_monte_carlo_gradient_matches_eq_r1(variant, y, p):
    z = _logits(p)
    grads, w_hat = _mc_groups(variant, z, y, seed=1000 * y + int(100 * p) + 7 * len(variant))
    pi = z.softmax(0)
    u = -pi.clone()
    u[A_LOG] += 1.0  # e_{a_log} - pi
    n = N_ROLL
    r_sc = float(token_kl_from_uniform(z.float()))
    gam = {
        float(wh): gamma(variant, p, n, y, w_hat=float(wh), eps_std=EPS_STD, lambda_sc=LAMBDA_SC, r_sc=r_sc)
        for wh in w_hat.unique()
    }
    expected = torch.tensor([gam[float(wh)] for wh in w_hat], dtype=torch.float64) / n  # per group: gamma_i / n
    mean_grad = grads.mean(0)
    cos = float(mean_grad @ u / (mean_grad.norm() * u.norm()))
    assert cos * math.copysign(1.0, expected.mean().item()) > 0.99  # (a) parallel to e_{a_log} - pi
    s = grads @ u / (u @ u)  # each group's coefficient along e_{a_log} - pi
    se = float(s.std() / math.sqrt(GROUPS))
    assert abs(float(s.mean() - expected.mean())) < 4 * se, (float(s.mean()), float(expected.mean()), se)  # (b)
    # the exact expectation of Eq. R1 as a vector, for the average w_hat's groups
    assert torch.allclose(
        expected_logit_gradient(variant, z, A_LOG, n, y, w_hat=float(w_hat[0]), eps_std=EPS_STD, r_sc=r_sc),
        expected[0] * u,
    )


def test_gamma_by_hand_for_two_rollouts():
    """B, n = 2, y = 1, eps_std = 0: only k = 1 has nonzero advantages, A_match = +1, A_other = -1, so
    gamma = 2p(1-p) [1 + p/(1-p)] = 2p."""
    for p in (0.1, 0.3, 0.7):
        assert gamma_grpo(p, 2, 1, eps_std=0.0) == pytest.approx(2 * p)
        assert gamma_grpo(p, 2, 0, eps_std=0.0) == pytest.approx(-2 * p)


def test_self_certainty_is_removed_by_group_normalisation_for_one_token_answers():
    for p in (0.22, 0.53):
        for y in (0, 1):
            assert gamma_anchored(p, 7, y, self_certainty=True, r_sc=1.7) == pytest.approx(gamma_anchored(p, 7, y))
            assert gamma("abpo", p, 7, y, w_hat=1.8, r_sc=2.0) == pytest.approx(
                gamma("anchor_snips", p, 7, y, w_hat=1.8)
            )


def test_gamma_rejects_bad_inputs():
    with pytest.raises(ValueError, match="0 < p < 1"):
        gamma_grpo(1.0, 7, 1)
    with pytest.raises(ValueError, match="performs no update"):
        gamma("none", 0.3, 7, 1)
    with pytest.raises(ValueError, match="y is 0 or 1"):
        gamma("grpo", 0.3, 7, 2)
