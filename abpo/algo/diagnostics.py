"""Per-step diagnostics of the ABPO update (docs/diagnostics.md): where a variant's gradient differs from vanilla
GRPO's on the same rollouts, how many groups carry no signal, and rank correlations of the self-certainty reward.

The gradient model (Eq. G). At one optimizer step per generation batch the sequence ratio of step 5 is s = 1 in
value, so the surrogate's gradient is the advantage-weighted score, sum_j A_j grad log pi(a_j | q). For a one-token
constrained answer the choice is drawn from pi(.|q) = softmax_{a in C}(z_a / tau) over the candidate set C (z: the
choice-position logits restricted to C), and d log pi(a)/dz = (e_a - pi) / tau, so for one logged example

    g = sum_r omega_r A_r (e_{a_r} - pi)                      (Eq. G; the common factor 1/tau is dropped)

over the group's rows r with a term in the surrogate (omega_r: the row's weight, 1 for every rollout). Step 5 gives
the anchor no surrogate term (docs/ABPO_SPEC.md step 1), so its row has omega = 0: the anchor acts on g only through
b_i and sigma_i inside the rollouts' A_r. A row whose answer names no candidate (malformed) has no e_a and no term.

Grouping the rows by candidate, g = sum_a c_a (e_a - pi) with c_a = sum_{r: a_r = a} omega_r A_r (Eq. P): c_a is
the *push* on candidate a's log-odds (unique up to adding a multiple of pi to c, which the grouping fixes).

No TRL import here: abpo.train.trainer feeds these from the rollouts and the e_old propensities it already has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def _check_rows(chosen: Tensor, advantages: Tensor, weights: Tensor | None, n_cand: int, where: str) -> Tensor:
    if chosen.dim() != 1 or advantages.shape != chosen.shape:
        raise ValueError(
            f"abpo.algo.diagnostics.{where}: chosen {tuple(chosen.shape)} and advantages {tuple(advantages.shape)}; "
            "rule: one candidate index and one advantage per row, shape [R]"
        )
    if weights is not None and weights.shape != chosen.shape:
        raise ValueError(
            f"abpo.algo.diagnostics.{where}: weights {tuple(weights.shape)}; rule: one weight per row, shape [R]"
        )
    bad = (chosen >= n_cand) | (chosen < -1)
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"abpo.algo.diagnostics.{where}: chosen[{r}] = {int(chosen[r])}; rule: an index into the {n_cand} "
            "candidates, or -1 for a row that names no candidate"
        )
    w = torch.ones_like(advantages, dtype=torch.float64) if weights is None else weights.detach().to(torch.float64)
    return w * advantages.detach().to(torch.float64) * (chosen >= 0).to(torch.float64)  # omega_r A_r, 0 if no a_r


def logit_gradient(pi: Tensor, chosen: Tensor, advantages: Tensor, weights: Tensor | None = None) -> Tensor:
    """g = sum_r omega_r A_r (e_{a_r} - pi) (Eq. G of this module): the surrogate's gradient w.r.t. the choice
    logits restricted to the candidates of one logged example (times tau).

    pi: [C] the policy's distribution over the candidates (e_old(.|q)); chosen: int [R], row r's candidate index
    (-1: names none, no term); advantages: [R]; weights: [R] omega_r (None = 1 for every row). Returns float64 [C].
    """
    if pi.dim() != 1 or pi.numel() == 0:
        raise ValueError(f"abpo.algo.diagnostics.logit_gradient: pi {tuple(pi.shape)}; rule: shape [C], C >= 1")
    coef = _check_rows(chosen, advantages, weights, pi.numel(), "logit_gradient")  # omega_r A_r
    pi = pi.detach().to(torch.float64)
    c = torch.zeros_like(pi).index_add_(0, chosen.clamp(min=0), coef)  # c_a = sum_{r: a_r = a} omega_r A_r (Eq. P)
    return c - coef.sum() * pi  # sum_r omega_r A_r (e_{a_r} - pi)


def log_odds_push(chosen: Tensor, advantages: Tensor, target: int, weights: Tensor | None = None) -> float:
    """c_target = sum_{r: a_r = target} omega_r A_r (Eq. P of this module): the coefficient of (e_target - pi) in
    the gradient g of Eq. G, i.e. how hard the step pushes candidate ``target``'s log-odds (> 0 up, < 0 down)."""
    coef = _check_rows(chosen, advantages, weights, 2**62, "log_odds_push")  # any index >= -1
    return float(coef[chosen == int(target)].sum())


def gamma_ratio(push_variant: Sequence[float] | Tensor, push_grpo: Sequence[float] | Tensor) -> float:
    """gamma = mean over the logged examples i with c_i^B != 0 of c_i^V / c_i^B, where c_i^V and c_i^B are the
    pushes (Eq. P) on the logged item a_i^log's log-odds under the variant V and under vanilla GRPO (variant B's
    group advantages) on the SAME rollouts. gamma = 1: V moves a^log as GRPO does; gamma > 1: more strongly in the
    same direction; 0 < gamma < 1: less; gamma < 0: the opposite way. NaN when no example has c^B != 0 (no rollout
    of the step chose a^log, or B's advantages were all 0)."""
    v = torch.as_tensor(push_variant, dtype=torch.float64).flatten()
    b = torch.as_tensor(push_grpo, dtype=torch.float64).flatten()
    if v.shape != b.shape:
        raise ValueError(
            f"abpo.algo.diagnostics.gamma_ratio: {v.numel()} variant pushes vs {b.numel()} GRPO pushes; rule: one "
            "of each per logged example"
        )
    keep = b != 0
    if not bool(keep.any()):
        return math.nan
    return float((v[keep] / b[keep]).mean())


def gradient_cosine(g_variant: Sequence[Tensor] | Tensor, g_grpo: Sequence[Tensor] | Tensor) -> float:
    """cos(g^V, g^B) = <g^V, g^B> / (|g^V| |g^B|) of the step's gradients (Eq. G) under the variant and under
    vanilla GRPO on the same rollouts, each flattened over the logged examples (a list of [C_i] tensors, one per
    example, or one tensor). 1: the same direction; 0: orthogonal; -1: opposite. NaN when either is 0."""

    def flat(g):
        if isinstance(g, Tensor):
            return g.detach().to(torch.float64).flatten()
        return (
            torch.cat([t.detach().to(torch.float64).flatten() for t in g])
            if len(g)
            else torch.zeros(0, dtype=torch.float64)
        )

    a, b = flat(g_variant), flat(g_grpo)
    if a.shape != b.shape:
        raise ValueError(
            f"abpo.algo.diagnostics.gradient_cosine: gradients of {a.numel()} and {b.numel()} entries; rule: the "
            "same candidates in both"
        )
    na, nb = a.norm(), b.norm()
    if float(na) == 0.0 or float(nb) == 0.0:
        return math.nan
    return float(a @ b / (na * nb))


def zero_spread_share(rewards: Tensor, atol: float = 0.0) -> float:
    """Share of the groups (rows of ``rewards`` [B, K], one group's rewards per row) whose rewards all equal:
    max - min <= atol. Vanilla GRPO's advantages are 0 in such a group (no gradient from it)."""
    if rewards.dim() != 2 or rewards.shape[0] == 0:
        raise ValueError(
            f"abpo.algo.diagnostics.zero_spread_share: rewards {tuple(rewards.shape)}; rule: [B, K] with B >= 1"
        )
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values
    return float((spread <= atol).to(torch.float64).mean())


def group_std_mean(values: Tensor) -> float:
    """mean over groups of the within-group population standard deviation of ``values`` [B, K] (one group per
    row): 0 when every group's values are constant."""
    if values.dim() != 2 or values.shape[0] == 0:
        raise ValueError(f"abpo.algo.diagnostics.group_std_mean: values {tuple(values.shape)}; rule: [B, K], B >= 1")
    return float(values.to(torch.float64).std(dim=1, unbiased=False).mean())


def _ranks(x: Tensor) -> Tensor:
    """Ranks 1..n with ties given their average rank."""
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(1, x.numel() + 1, dtype=x.dtype)
    uniq, inverse = torch.unique(x, return_inverse=True)
    sums = torch.zeros(uniq.numel(), dtype=x.dtype).index_add_(0, inverse, ranks)
    counts = torch.zeros(uniq.numel(), dtype=x.dtype).index_add_(0, inverse, torch.ones_like(x))
    return (sums / counts)[inverse]


def rank_correlation(x: Sequence[float] | Tensor, y: Sequence[float] | Tensor) -> float:
    """Spearman's rho: the Pearson correlation of the (tie-averaged) ranks of x and y. Rank-based, so a heavy-tailed
    x such as item popularity counts needs no transform. NaN with fewer than 2 pairs or a constant x or y."""
    a = torch.as_tensor(x, dtype=torch.float64).flatten()
    b = torch.as_tensor(y, dtype=torch.float64).flatten()
    if a.shape != b.shape:
        raise ValueError(f"abpo.algo.diagnostics.rank_correlation: {a.numel()} vs {b.numel()} values; rule: pairs")
    if a.numel() < 2:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = ra.norm() * rb.norm()
    return math.nan if float(den) == 0.0 else float(ra @ rb / den)
