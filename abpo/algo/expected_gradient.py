"""The expected policy gradient of variants (B)-(F) for a one-token, candidate-constrained policy (docs/regimes.md).

Setting (docs/regimes.md "The result"): the policy is pi = softmax(z) over the candidate set C (one token per answer,
so every completion is well formed, r_fmt = 1), the logged action a_log has p = pi(a_log), the n rollouts of a group
are drawn i.i.d. from pi, and a rollout's reward depends only on whether it matches a_log (step 2: y = 1 gives
2 / 1 for a match / other, y = 0 gives 0 / 1, plus lambda_sc * r_sc for y = 0 where r_sc is the same for every
completion of the group). With k ~ Bin(n, p) matches, the step-4 advantages take two values A_match(k), A_other(k)
(A_other(k) = A_match(k) shifted by the reward gap over sigma); the anchor (C-F) enters only through b and sigma,
it has no surrogate term (abpo.algo.surrogate). At pi_theta = pi_old the gradient of one group's surrogate
(1/n) sum_j A_j log pi(a_j) w.r.t. z has expectation (Eq. R1)

    E[grad_z] = (gamma / n) (e_{a_log} - pi),
    gamma     = E_k[ k A_match(k) - (n - k) A_other(k) p / (1 - p) ],   k ~ Bin(n, p)            (Eq. R2)

summed exactly over k = 0..n here (no sampling). The advantages are the project's own (abpo.algo.rewards for the
rewards, abpo.algo.advantages for A), so gamma is exactly what the trainer's advantages give in this setting.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from abpo.algo.advantages import anchored_advantages, group_advantages
from abpo.algo.rewards import anchor_reward, match_reward, total_reward
from abpo.algo.variants import Variant, get_variant


def _check(p: float, n: int, y: int) -> None:
    if not 0.0 < p < 1.0:
        raise ValueError(f"abpo.algo.expected_gradient: p = pi(a_log) = {p}; rule: 0 < p < 1")
    if n < 1:
        raise ValueError(f"abpo.algo.expected_gradient: n = {n} rollouts; rule: n >= 1")
    if y not in (0, 1):
        raise ValueError(f"abpo.algo.expected_gradient: y = {y}; rule: feedback y is 0 or 1")


def _group_rewards(n: int, y: int, r_sc: float, lambda_sc: float) -> Tensor:
    """Rewards [n+1, n] of the groups with k = 0..n matches (row k: k matches first, then n-k others), by step 2
    (abpo.algo.rewards.match_reward + total_reward, r_fmt = 1, r_sc the same for every completion)."""
    k = torch.arange(n + 1)[:, None]
    chosen = torch.where(torch.arange(n)[None, :] < k, 0, 1)  # a_log = item 0, "other" = item 1
    yy = torch.full((n + 1,), y, dtype=torch.int64)
    r_match = match_reward(chosen, torch.zeros(n + 1, dtype=torch.int64), yy)
    sc = torch.full((n + 1, n), float(r_sc))
    return total_reward(r_match, torch.ones_like(r_match), sc, yy, lambda_sc).double()


def match_advantages(
    variant: Variant | str,
    n: int,
    y: int,
    *,
    w_hat: float = 1.0,
    eps_std: float = 1e-4,
    lambda_sc: float = 0.1,
    r_sc: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """(A_match(k), A_other(k)) for k = 0..n, each [n+1] float64, of `variant` (B: group_advantages; C-F:
    anchored_advantages with the anchor reward anchor_reward(y) and weight w_hat (1 for C, E; the SNIPS w_hat for
    D, F)). lambda_sc applies to E and F only (Variant.effective_lambda_sc). Undefined entries (A_match(0),
    A_other(n)) are returned as 0; they are multiplied by 0 in Eq. R2."""
    v = get_variant(variant) if isinstance(variant, str) else variant
    if not v.update:
        raise ValueError(f"abpo.algo.expected_gradient: variant {v.letter} ({v.name}) performs no update")
    lam = v.effective_lambda_sc(lambda_sc)
    r = _group_rewards(n, y, r_sc, lam)
    if v.anchor:
        if not w_hat >= 0:
            raise ValueError(f"abpo.algo.expected_gradient: w_hat = {w_hat}; rule: >= 0")
        yy = torch.full((n + 1,), y, dtype=torch.int64)
        r_log = anchor_reward(yy, torch.full((n + 1,), float(r_sc)), lam).double()
        adv = anchored_advantages(r_log, r, torch.full((n + 1,), float(w_hat), dtype=torch.float64), eps_std)
    else:
        adv = group_advantages(r, eps_std)
    k = torch.arange(n + 1)
    a_match = torch.where(k > 0, adv[:, 0], torch.zeros_like(adv[:, 0]))  # column 0 is a match when k >= 1
    a_other = torch.where(k < n, adv[:, -1], torch.zeros_like(adv[:, -1]))  # last column is other when k < n
    return a_match, a_other


def gamma(
    variant: Variant | str,
    p: float,
    n: int,
    y: int,
    *,
    w_hat: float = 1.0,
    eps_std: float = 1e-4,
    lambda_sc: float = 0.1,
    r_sc: float = 0.0,
) -> float:
    """Eq. R2: gamma = sum_{k=0..n} Bin(k; n, p) [k A_match(k) - (n-k) A_other(k) p/(1-p)], exactly.
    The expected logit gradient of one group's surrogate is (gamma / n)(e_{a_log} - pi) (Eq. R1)."""
    _check(p, n, y)
    a_match, a_other = match_advantages(variant, n, y, w_hat=w_hat, eps_std=eps_std, lambda_sc=lambda_sc, r_sc=r_sc)
    total = 0.0
    for k in range(n + 1):
        pk = math.comb(n, k) * p**k * (1.0 - p) ** (n - k)  # Bin(k; n, p)
        total += pk * (k * float(a_match[k]) - (n - k) * float(a_other[k]) * p / (1.0 - p))
    return total


def gamma_grpo(p: float, n: int, y: int, *, eps_std: float = 1e-4) -> float:
    """Eq. R2 for (B), vanilla GRPO: A from the plain group mean/std of the n rollouts."""
    return gamma("grpo", p, n, y, eps_std=eps_std)


def gamma_anchored(
    p: float,
    n: int,
    y: int,
    *,
    w_hat: float = 1.0,
    eps_std: float = 1e-4,
    self_certainty: bool = False,
    lambda_sc: float = 0.1,
    r_sc: float = 0.0,
) -> float:
    """Eq. R2 for (C) (w_hat = 1), (D) (w_hat = the SNIPS weight), (E) and (F) (self_certainty=True, adding
    lambda_sc * r_sc to every y = 0 reward of the group, anchor included)."""
    name = (
        ("abpo" if w_hat != 1.0 else "anchor_sc") if self_certainty else ("anchor_snips" if w_hat != 1.0 else "anchor")
    )
    return gamma(name, p, n, y, w_hat=w_hat, eps_std=eps_std, lambda_sc=lambda_sc, r_sc=r_sc)


def expected_logit_gradient(
    variant: Variant | str,
    logits: Tensor,
    a_log: int,
    n: int,
    y: int,
    **kw,
) -> Tensor:
    """Eq. R1: E[grad_z of one group's surrogate] = (gamma / n)(e_{a_log} - pi), pi = softmax(logits) over C."""
    pi = torch.softmax(logits.detach().double(), dim=-1)
    e = torch.zeros_like(pi)
    e[a_log] = 1.0
    return gamma(variant, float(pi[a_log]), n, y, **kw) / n * (e - pi)
