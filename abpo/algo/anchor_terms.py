"""Terms of the update objective in which the logged item a^log itself is a row (docs/update-variants.md). Step 5 of
docs/ABPO_SPEC.md gives the anchor no term: it acts only through the baseline b_i and spread sigma_i of step 4. The
two terms here give it one, each added to the step-5 objective J with its own weight (update.likelihood_weight,
update.offpolicy_weight; 0 = off, the paper). Notation: B logged examples i in the generation batch, y_i the
feedback, w_i = e_old(a_i^log | q_i) / e0(a_i^log | q_i) the raw SNIPS weight of step 3 and w_hat_i its stratified
self-normalisation, and

    l_theta(a | q) = sum_t log pi_theta(r(a)_t | q, r(a)_<t)

the log-probability of the item's answer tokens under the policy the rollouts are sampled from (the full vocabulary,
or the constrained q_theta of abpo.policy.constrained Eq. q: for an item-token model at temperature 1 and tau = 1,
exp(l_theta) is the candidate propensity e_theta(a | q) itself).

The likelihood term (Eq. L1): a SNIPS-weighted log-likelihood of the clicked logged items, the supervised anchor of
ReRe (arXiv 2510.12211, MiniOneRec's `add_gt`) and AdaGRPO (arXiv 2606.08480); with the step-5 term off
(update.surrogate_weight = 0) it is the weighted log-likelihood objective of Aouali & Sakhi (arXiv 2509.03456):

    J_LL(theta) = lambda_ll (1/B) sum_i y_i w_hat_i l_theta(a_i^log | q_i)                                 (Eq. L1)

At theta = theta_old its gradient is (lambda_ll / B) sum_i y_i w_hat_i grad log pi(a_i^log | q_i), with w_i =
pi_old / e0: the (self-normalised) inverse-propensity estimate of the gradient of the click rate,
grad E_{a ~ pi_theta}[y] = E_{a ~ e0}[(pi_theta(a) / e0(a)) y grad log pi_theta(a)], where only clicks carry a term.

The off-policy anchor term (Eqs. O1-O3): LUFFY's policy shaping (Yan et al., arXiv 2504.14945, "Learning to Reason
under Off-Policy Guidance") with the logged item as the off-policy trace. The anchor gets the advantage the
variant's step 4 gives a row with its reward (for B, whose group has no anchor: the plain group mean and spread of
the rollouts), an importance ratio against its real logger e0 (LUFFY knows no behaviour probabilities and sets the
denominator to 1; here e0 is logged), LUFFY's regularising shaping f, and a PPO clip of its move away from pi_old:

    A_i^log = (r_i^log - b_i) / sigma_i                                                                    (Eq. O1)
    rho_i(theta) = exp(l_theta(a_i^log | q_i)) / e0(a_i^log | q_i),   f(x) = x / (x + gamma)               (Eq. O2)
    J_off(theta) = lambda_off (1/B) sum_i nu_{y_i} min( f(rho_i) A_i^log, f(clip(s_i, 1-eps, 1+eps) rho_i^old) A_i^log )
                   with s_i = rho_i / rho_i^old = pi_theta(a_i^log) / pi_old(a_i^log)                       (Eq. O3)

nu_{y}: the no-response weight of abpo.algo.stratum_weight (Eq. N1), 1 for the paper. gamma = update.offpolicy_gamma
(LUFFY: 0.1). f is bounded in [0, 1), and d f(rho) / d log pi = gamma rho / (rho + gamma)^2 <= 1/4: the logged item's
push is largest where rho is near gamma (an item the policy now rates far below its logger) and vanishes for items
it already rates far above, LUFFY's "emphasise low-probability actions".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from abpo.algo.advantages import anchored_baseline, anchored_spread
from abpo.algo.snips import stratified_self_normalise


def _check_batch(name: str, t: Tensor, n: int, where: str) -> None:
    if t.shape != (n,):
        raise ValueError(f"abpo.algo.anchor_terms.{where}: {name} has shape {tuple(t.shape)}; rule: ({n},)")


def likelihood_coefficients(w: Tensor, y: Tensor, delta: float, weight: float) -> Tensor:
    """c_i = lambda_ll y_i w_hat_i / B of Eq. L1 ([B], detached): the coefficient of l_theta(a_i^log | q_i) in J_LL.

    w: [B] raw SNIPS weights e_old/e0 (capped by update.w_max if the trainer caps them); y: [B]; delta: step 3's
    delta; weight: lambda_ll. w_hat is self-normalised within the clicked stratum B_1 (step 3), so the c_i of one
    batch sum to about lambda_ll |B_1| / B."""
    b = y.shape[0]
    _check_batch("w", w, b, "likelihood_coefficients")
    if not (math.isfinite(weight) and weight >= 0):
        raise ValueError(f"abpo.algo.anchor_terms: update.likelihood_weight = {weight}; rule: finite and >= 0")
    w_hat = stratified_self_normalise(w.detach().to(torch.float64), y, delta)  # step 3
    return (weight * (y == 1).to(torch.float64) * w_hat / b).to(torch.float32)  # lambda y_i w_hat_i / B


def weighted_log_likelihood(seq_logp: Tensor, coef: Tensor) -> Tensor:
    """J_LL = sum_i c_i l_theta(a_i^log | q_i) of Eq. L1 (a scalar to maximise) from the anchors' sequence
    log-probs [S] (with gradient) and their coefficients [S] (`likelihood_coefficients`, constant)."""
    if seq_logp.shape != coef.shape or seq_logp.dim() != 1:
        raise ValueError(
            f"abpo.algo.anchor_terms.weighted_log_likelihood: seq_logp {tuple(seq_logp.shape)}, coef "
            f"{tuple(coef.shape)}; rule: both [S]"
        )
    return (coef.detach().to(seq_logp.dtype) * seq_logp).sum()


def anchor_advantage(r_log: Tensor, r_roll: Tensor, w_hat: Tensor | None, eps_std: float) -> Tensor:
    """A_i^log = (r_i^log - b_i) / sigma_i of Eq. O1, [B], detached: b_i and sigma_i of step 4 with the anchor weight
    w_hat (C-F: 1 or SNIPS), or with ``w_hat=None`` (variant B) the plain mean and population spread of the rollouts
    (`group_advantages` style "spec": sigma = sqrt(var + eps_std)). 0 where sigma = 0."""
    r_log, r_roll = r_log.detach(), r_roll.detach()
    w = torch.zeros_like(r_log) if w_hat is None else w_hat.detach().to(r_log.dtype)
    b = anchored_baseline(r_log, r_roll, w)  # w = 0: the rollouts' plain mean
    sigma = anchored_spread(r_log, r_roll, w, b, eps_std)
    return torch.where(sigma > 0, (r_log - b) / sigma, torch.zeros_like(r_log))


def shaping(x: Tensor, gamma: float) -> Tensor:
    """f(x) = x / (x + gamma) of Eq. O2 (LUFFY's policy shaping, arXiv 2504.14945)."""
    if not (math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"abpo.algo.anchor_terms: update.offpolicy_gamma = {gamma}; rule: finite and > 0")
    return x / (x + gamma)


def offpolicy_anchor_surrogate(
    seq_logp_new: Tensor,
    seq_logp_old: Tensor,
    log_e0: Tensor,
    coef: Tensor,
    epsilon: float | tuple[float, float],
    gamma: float,
) -> Tensor:
    """J_off of Eq. O3 (a scalar to maximise) with the per-anchor coefficients c_i = lambda_off nu_{y_i} A_i^log / B
    (constant): since min(f A, f' A) = A min(f, f') for A >= 0 and A max(f, f') for A < 0,
    J_off = sum_i c_i (min(f(rho_i), f(clip(s_i) rho_i^old)) if c_i >= 0 else max(...)).

    seq_logp_new: [S] l_theta(a^log | q) with gradient; seq_logp_old: [S] l under pi_old (constant); log_e0: [S]
    log e0(a^log | q); coef: [S]; epsilon: the clip range (or (eps_low, eps_high)); gamma: f's gamma.
    rho = exp(l_theta - log e0), s = exp(l_theta - l_old)."""
    n = seq_logp_new.shape
    if seq_logp_new.dim() != 1 or seq_logp_old.shape != n or log_e0.shape != n or coef.shape != n:
        raise ValueError(
            "abpo.algo.anchor_terms.offpolicy_anchor_surrogate: seq_logp_new, seq_logp_old, log_e0 and coef have "
            f"shapes {tuple(n)}, {tuple(seq_logp_old.shape)}, {tuple(log_e0.shape)}, {tuple(coef.shape)}; rule: all [S]"
        )
    eps_low, eps_high = (epsilon, epsilon) if isinstance(epsilon, (int, float)) else epsilon
    c = coef.detach().to(seq_logp_new.dtype)
    old = seq_logp_old.detach().to(seq_logp_new.dtype)
    le0 = log_e0.detach().to(seq_logp_new.dtype)
    rho = torch.exp(seq_logp_new - le0)  # pi_theta(a^log) / e0(a^log)
    s = torch.exp(seq_logp_new - old)  # pi_theta / pi_old
    rho_clipped = torch.clamp(s, 1.0 - eps_low, 1.0 + eps_high) * torch.exp(old - le0)  # clip(s) rho_old
    # min(f A, f_clip A): the smaller f where A >= 0, the larger where A < 0
    f, f_clip = shaping(rho, gamma), shaping(rho_clipped, gamma)
    term = torch.where(c >= 0, torch.minimum(f, f_clip), torch.maximum(f, f_clip))
    return (c * term).sum()
