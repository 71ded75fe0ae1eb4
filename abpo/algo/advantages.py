"""Step 4 of the ABPO update (docs/ABPO_SPEC.md "The update"): anchored baseline, spread and advantages.

For logged example i with anchor reward r_i^log, SNIPS weight w_hat_i and G-1 rollout rewards r_i^2..r_i^G:

    b_i     = (w_hat_i r_i^log + sum_{j=2..G} r_i^j) / (w_hat_i + G - 1)
    sigma_i = sqrt( (w_hat_i (r_i^log - b_i)^2 + sum_j (r_i^j - b_i)^2) / (w_hat_i + G - 1) + eps_std )
    A_i^j   = (r_i^j - b_i) / sigma_i,   j = 2..G only (the anchor gets no advantage and no surrogate term)

Shapes: r_log [B], r_roll [B, G-1] (column j-2 is rollout j), w_hat [B]. G-1 is r_roll.shape[1].
Variant (B), vanilla GRPO, is `group_advantages`: the same with no anchor (w_hat = 0).
Advantages are constants for the policy gradient: the advantage functions return detached tensors.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor


def _check(r_log: Tensor, r_roll: Tensor, w_hat: Tensor) -> None:
    if r_roll.dim() != 2 or r_roll.shape[1] < 1:
        raise ValueError(
            f"abpo.algo.advantages: r_roll has shape {tuple(r_roll.shape)}; rule: [B, G-1] with G-1 >= 1 rollouts"
        )
    batch = r_roll.shape[0]
    for name, t in (("r_log", r_log), ("w_hat", w_hat)):
        if t.shape != (batch,):
            raise ValueError(
                f"abpo.algo.advantages: {name} has shape {tuple(t.shape)}; rule: one value per example, ({batch},)"
            )
    bad = ~(w_hat.detach() >= 0) | ~torch.isfinite(w_hat.detach())
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"abpo.algo.advantages: w_hat[{i}] = {w_hat[i].item()}; rule: finite and >= 0")


def anchored_baseline(r_log: Tensor, r_roll: Tensor, w_hat: Tensor) -> Tensor:
    """b_i = (w_hat_i r_i^log + sum_{j=2..G} r_i^j) / (w_hat_i + G - 1) (docs/ABPO_SPEC.md step 4). Returns [B]."""
    _check(r_log, r_roll, w_hat)
    n_roll = r_roll.shape[1]  # G - 1
    return (w_hat * r_log + r_roll.sum(dim=1)) / (w_hat + n_roll)  # weighted mean of anchor and rollouts


def anchored_spread(r_log: Tensor, r_roll: Tensor, w_hat: Tensor, baseline: Tensor, eps_std: float) -> Tensor:
    """sigma_i = sqrt((w_hat_i (r_i^log - b_i)^2 + sum_j (r_i^j - b_i)^2) / (w_hat_i + G - 1) + eps_std)
    (docs/ABPO_SPEC.md step 4): the weighted standard deviation of the group around b_i. Returns [B]."""
    _check(r_log, r_roll, w_hat)
    if baseline.shape != r_log.shape:
        raise ValueError(
            f"abpo.algo.advantages.anchored_spread: baseline {tuple(baseline.shape)}; rule: shape {tuple(r_log.shape)}"
        )
    if eps_std < 0:
        raise ValueError(f"abpo.algo.advantages.anchored_spread: eps_std = {eps_std}; rule: eps_std >= 0")
    n_roll = r_roll.shape[1]  # G - 1
    sq_anchor = w_hat * (r_log - baseline) ** 2  # w_hat_i (r_i^log - b_i)^2
    sq_roll = ((r_roll - baseline[:, None]) ** 2).sum(dim=1)  # sum_j (r_i^j - b_i)^2
    return torch.sqrt((sq_anchor + sq_roll) / (w_hat + n_roll) + eps_std)


def anchored_advantages(r_log: Tensor, r_roll: Tensor, w_hat: Tensor, eps_std: float) -> Tensor:
    """A_i^j = (r_i^j - b_i) / sigma_i for the G-1 rollouts j = 2..G only (docs/ABPO_SPEC.md step 4).

    Returns [B, G-1], detached (advantages carry no gradient). The anchor (j = 1) has no column here.
    """
    r_log, r_roll, w_hat = r_log.detach(), r_roll.detach(), w_hat.detach()
    b = anchored_baseline(r_log, r_roll, w_hat)  # b_i
    sigma = anchored_spread(r_log, r_roll, w_hat, b, eps_std)[:, None]  # sigma_i
    # sigma_i = 0 only when eps_std = 0 and every reward of the group equals b_i: then A_i^j = 0, not 0/0
    return torch.where(sigma > 0, (r_roll - b[:, None]) / sigma, torch.zeros_like(r_roll))  # A_i^j, j = 2..G


def group_advantages(
    r_roll: Tensor,
    eps_std: float,
    *,
    style: Literal["spec", "trl"] = "spec",
) -> Tensor:
    """Vanilla GRPO advantages (docs/ABPO_SPEC.md variant (B)): plain group mean/std over the G-1 rollouts, no anchor.

    style="spec": A_i^j = (r_i^j - mean_j r_i^j) / sqrt(mean_j (r_i^j - mean)^2 + eps_std), i.e. exactly
        `anchored_advantages` with w_hat = 0, so (B) and (C)-(F) differ only by the anchor.
    style="trl": A_i^j = (r_i^j - mean) / (std_unbiased + eps_std), TRL GRPOTrainer's scale_rewards="group"
        formula (Bessel-corrected std, epsilon outside the root; TRL's epsilon is 1e-4). Needs G-1 >= 2.
    Returns [B, G-1], detached.
    """
    r_roll = r_roll.detach()
    if r_roll.dim() != 2 or r_roll.shape[1] < 1:
        raise ValueError(
            f"abpo.algo.advantages.group_advantages: r_roll has shape {tuple(r_roll.shape)}; rule: [B, G-1], G-1 >= 1"
        )
    if eps_std < 0:
        raise ValueError(f"abpo.algo.advantages.group_advantages: eps_std = {eps_std}; rule: eps_std >= 0")
    mean = r_roll.mean(dim=1, keepdim=True)  # plain group mean over the rollouts
    if style == "spec":
        sigma = torch.sqrt(((r_roll - mean) ** 2).mean(dim=1, keepdim=True) + eps_std)  # population std
        return torch.where(sigma > 0, (r_roll - mean) / sigma, torch.zeros_like(r_roll))
    if style == "trl":
        if r_roll.shape[1] < 2:
            raise ValueError(
                "abpo.algo.advantages.group_advantages: style='trl' needs G-1 >= 2 rollouts (unbiased std)"
            )
        scale = r_roll.std(dim=1, keepdim=True, unbiased=True) + eps_std  # Bessel-corrected, as trl's nanstd
        return torch.where(scale > 0, (r_roll - mean) / scale, torch.zeros_like(r_roll))
    raise ValueError(f"abpo.algo.advantages.group_advantages: style = {style!r}; rule: 'spec' or 'trl'")
