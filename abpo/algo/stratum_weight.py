"""A per-stratum weight on the surrogate of docs/ABPO_SPEC.md step 5 (docs/update-variants.md "No-response weight"):
the no-response rows' terms weigh kappa, the clicked rows' 1.

    J_kappa(theta) = mean_i nu_{y_i} (1/(G-1)) sum_{j=2..G} min( s_i^j A_i^j, clip(s_i^j, 1-eps, 1+eps) A_i^j )
    nu_1 = 1,  nu_0 = kappa >= 0                                                                         (Eq. N1)

(nu_1 is update.click_weight, 1 but in the clicks-versus-no-responses diagnosis: nu_1 = 0 trains on the no-responses alone.)

Since min(s kA, clip(s) kA) = k min(s A, clip(s) A) for k >= 0, weighing a row's surrogate term by kappa is scaling
its advantages by kappa: A'_i^j = nu_{y_i} A_i^j (`stratum_weighted_advantages`), the advantages TRL's loss reads.

What kappa is (`no_response_weight`, config update.no_response_weight and update.no_response_weight_rule):

    rule "fixed":       kappa = scale                      (scale = 1 is the paper: no reweighting)
    rule "click_rate":  kappa = scale * c / (1 - c)                                                      (Eq. N2)

with c the click rate of the logged rows the update trains on. Eq. N2 is the ratio of the two magnitudes of a
baselined bandit policy gradient: with the reward y and the baseline b = c, a click's advantage is y - b = 1 - c and
a no-response's is -c, so |A(y=0)| / |A(y=1)| = c / (1 - c) (Williams 1992's REINFORCE with a constant baseline;
the expected-gradient result of docs/regimes.md shows every variant B-F weighs the two strata alike instead:
gamma(y = 0) = -gamma(y = 1)). At the loop's CTR of 5-9 % kappa is 0.05-0.10.

`no_response_abs_share` is the per-step diagnostic of which stratum moves the policy: the share of the summed |A| the no-response
rows carry.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from abpo.config.update import NO_RESPONSE_WEIGHT_RULES


def no_response_weight(rule: str, scale: float, click_rate: float | None = None) -> float:
    """kappa of Eq. N1: ``scale`` (rule "fixed") or ``scale * c / (1 - c)`` (rule "click_rate", Eq. N2, c =
    ``click_rate`` of the update's log). An error names the rule broken."""
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"abpo.algo.stratum_weight: update.no_response_weight = {scale}; rule: finite and >= 0")
    if rule == "fixed":
        return float(scale)
    if rule == "click_rate":
        if click_rate is None:
            raise ValueError(
                "abpo.algo.stratum_weight: update.no_response_weight_rule = click_rate but no click rate was given; "
                "rule: the update passes the click rate of the rows it trains on (abpo.train.update.run_update)"
            )
        c = float(click_rate)
        if not 0.0 < c < 1.0:
            raise ValueError(
                f"abpo.algo.stratum_weight: click rate c = {c}; rule: 0 < c < 1 (both strata in the update's log) "
                "for kappa = c / (1 - c)"
            )
        return float(scale) * c / (1.0 - c)
    raise ValueError(
        f"abpo.algo.stratum_weight: update.no_response_weight_rule = {rule!r}; rule: one of {NO_RESPONSE_WEIGHT_RULES}"
    )


def stratum_weighted_advantages(advantages: Tensor, y: Tensor, kappa: float, click_weight: float = 1.0) -> Tensor:
    """A'_i^j = nu_{y_i} A_i^j with nu_1 = ``click_weight`` (1, the paper, unless a diagnosis sets it), nu_0
    = kappa (Eq. N1): the advantages [B, K] of the no-response examples' rollouts scaled by kappa, the clicked ones'
    by nu_1. Returns a detached tensor; kappa = nu_1 = 1 returns the advantages themselves (bit-for-bit)."""
    if advantages.dim() != 2 or y.shape != (advantages.shape[0],):
        raise ValueError(
            f"abpo.algo.stratum_weight: advantages {tuple(advantages.shape)} and y {tuple(y.shape)}; rule: [B, K] "
            "and [B]"
        )
    for name, v in (("kappa", kappa), ("nu_1 (update.click_weight)", click_weight)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"abpo.algo.stratum_weight: {name} = {v}; rule: finite and >= 0")
    adv = advantages.detach()
    if kappa == 1.0 and click_weight == 1.0:
        return adv
    nu = torch.where(
        y == 0,
        torch.full_like(y, kappa, dtype=adv.dtype),
        torch.full_like(y, click_weight, dtype=adv.dtype),
    )
    return adv * nu[:, None]  # nu_{y_i} A_i^j


def no_response_abs_share(advantages: Tensor, y: Tensor) -> float:
    """sum_{i: y_i = 0} sum_j |A_i^j| / sum_i sum_j |A_i^j| over a batch's rollout advantages [B, K] (a per-step
    diagnostic): 1 when only no-response rows move the policy, 0 when only clicks do; NaN when every A is 0."""
    if advantages.dim() != 2 or y.shape != (advantages.shape[0],):
        raise ValueError(
            f"abpo.algo.stratum_weight.no_response_abs_share: advantages {tuple(advantages.shape)}, y "
            f"{tuple(y.shape)}; rule: [B, K] and [B]"
        )
    a = advantages.detach().abs().to(torch.float64)
    total = float(a.sum())
    if total == 0.0:
        return math.nan
    return float(a[y == 0].sum()) / total
