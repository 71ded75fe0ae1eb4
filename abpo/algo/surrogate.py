"""Step 5 of the ABPO update (docs/ABPO_SPEC.md "The update"): the clipped surrogate objective (maximised).

    J(theta) = mean_i (1/(G-1)) sum_{j=2..G} min( s_i^j A_i^j, clip(s_i^j, 1-eps, 1+eps) A_i^j )  [- beta KL]
    s_i^j    = pi_theta(a_i^j | q_i) / pi_old(a_i^j | q_i)

Only the G-1 rollouts have terms; the anchor a_i^1 = a_i^log has none. With every group holding G-1
rollouts, "mean over i of (1/(G-1)) sum over j" is the plain mean over all B*(G-1) completions, so the
inputs may be shaped [B, G-1, T] or flattened to [B*(G-1), T].

How the sequence ratio s is formed from token log-probs (`ratio_level`):
  "sequence"  (default, the spec's literal ratio) log s = sum_t m_t (log pi_theta(a_t|.) - log pi_old(a_t|.)),
              the ratio of the whole completion's probabilities (product over its tokens).
  "geometric" log s = (1/T) sum_t m_t (...): the length-normalised (geometric-mean) ratio, as in GSPO and
              TRL's importance_sampling_level="sequence"; better behaved when pi_theta drifts from pi_old.
  "token"     one ratio per token, s_t = pi_theta(a_t|.)/pi_old(a_t|.); the per-token clipped terms are
              averaged over the completion's tokens: TRL GRPOTrainer's loss_type="grpo" with
              importance_sampling_level="token" (its loss is minus this objective).
When pi_theta = pi_old (one gradient step per batch of rollouts) all three give s = 1 and the gradient of
"sequence" is A * grad log pi(a|q) (a sum over tokens) while "token"/"geometric" give A times the mean over tokens.

Optional KL regulariser (docs/ABPO_SPEC.md: "A KL regulariser is optional"): J -= beta * mean over completions of
(1/T) sum_t k3_t with the k3 estimator k3_t = exp(ref_t - new_t) - (ref_t - new_t) - 1 >= 0 of
KL(pi_theta || pi_ref), as in GRPO (DeepSeekMath) and TRL.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from abpo.config.update import RATIO_LEVELS

RatioLevel = Literal["sequence", "geometric", "token"]  # the type of RATIO_LEVELS' values (a test keeps them equal)


def _check(logp_new: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor) -> None:
    if logp_new.dim() < 2 or logp_old.shape != logp_new.shape or mask.shape != logp_new.shape:
        raise ValueError(
            f"abpo.algo.surrogate: logp_new {tuple(logp_new.shape)}, logp_old {tuple(logp_old.shape)}, "
            f"mask {tuple(mask.shape)}; rule: all three [..., T] with the same shape"
        )
    if advantages.shape != logp_new.shape[:-1]:
        raise ValueError(
            f"abpo.algo.surrogate: advantages {tuple(advantages.shape)}; rule: one per completion, "
            f"shape {tuple(logp_new.shape[:-1])}"
        )


def _masked_mean(x: Tensor, m: Tensor) -> Tensor:
    """(1/T) sum_t m_t x_t over the last dim, T = sum_t m_t (0 for a completion with no tokens)."""
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def sequence_log_ratio(logp_new: Tensor, logp_old: Tensor, mask: Tensor, ratio_level: RatioLevel) -> Tensor:
    """log s per completion [...] for ratio_level "sequence" (sum over tokens) or "geometric" (mean over tokens)."""
    m = mask.to(logp_new.dtype)
    diff = torch.where(m > 0, logp_new - logp_old, torch.zeros_like(logp_new))  # padded positions may hold -inf
    if ratio_level == "sequence":
        return diff.sum(-1)  # log pi_theta(a|q) - log pi_old(a|q)
    if ratio_level == "geometric":
        return _masked_mean(diff, m)  # (1/T) sum_t (log pi_theta - log pi_old)
    raise ValueError(f"abpo.algo.surrogate: ratio_level = {ratio_level!r}; rule: 'sequence' or 'geometric'")


def kl_k3(logp_new: Tensor, logp_ref: Tensor, mask: Tensor) -> Tensor:
    """(1/T) sum_t [exp(ref_t - new_t) - (ref_t - new_t) - 1] per completion [...]: the k3 estimate of
    KL(pi_theta || pi_ref) on the sampled tokens (the optional KL regulariser of docs/ABPO_SPEC.md step 5)."""
    m = mask.to(logp_new.dtype)
    d = torch.where(m > 0, logp_ref - logp_new, torch.zeros_like(logp_new))  # ref_t - new_t
    return _masked_mean(torch.exp(d) - d - 1.0, m)


def _clipped_term(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """min(s A, clip(s, 1-eps, 1+eps) A) (docs/ABPO_SPEC.md step 5)."""
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)


def clipped_surrogate(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    epsilon: float | tuple[float, float],
    *,
    ratio_level: RatioLevel = "sequence",
    logp_ref: Tensor | None = None,
    beta: float = 0.0,
) -> Tensor:
    """The objective of docs/ABPO_SPEC.md step 5 (to maximise; the loss is its negative). Returns a scalar.

    logp_new: [..., T] log pi_theta of each completion token (with gradient); logp_old: [..., T] log pi_old
    (treated as constant); advantages: [...] A_i^j of the rollouts (constant); mask: [..., T] 1 on completion
    tokens; epsilon: the clip range, or (eps_low, eps_high). See the module docstring for `ratio_level`.
    logp_ref / beta: the optional KL regulariser; beta > 0 requires logp_ref.
    """
    _check(logp_new, logp_old, advantages, mask)
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(
            f"abpo.algo.surrogate.clipped_surrogate: ratio_level = {ratio_level!r}; rule: one of {RATIO_LEVELS}"
        )
    eps_low, eps_high = (epsilon, epsilon) if isinstance(epsilon, (int, float)) else epsilon
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"abpo.algo.surrogate.clipped_surrogate: epsilon = {epsilon}; rule: >= 0")
    logp_old = logp_old.detach()
    adv = advantages.detach().to(logp_new.dtype)
    m = mask.to(logp_new.dtype)
    if ratio_level == "token":
        diff = torch.where(m > 0, logp_new - logp_old, torch.zeros_like(logp_new))
        ratio = torch.exp(diff)  # s_t = pi_theta(a_t|.) / pi_old(a_t|.)
        per_completion = _masked_mean(_clipped_term(ratio, adv[..., None], eps_low, eps_high), m)
    else:
        ratio = torch.exp(sequence_log_ratio(logp_new, logp_old, m, ratio_level))  # s_i^j
        per_completion = _clipped_term(ratio, adv, eps_low, eps_high)  # min(s A, clip(s) A)
    if beta != 0.0:
        if logp_ref is None:
            raise ValueError("abpo.algo.surrogate.clipped_surrogate: beta != 0 needs logp_ref (the reference policy)")
        if logp_ref.shape != logp_new.shape:
            raise ValueError(
                f"abpo.algo.surrogate.clipped_surrogate: logp_ref {tuple(logp_ref.shape)}; "
                f"rule: shape {tuple(logp_new.shape)}"
            )
        per_completion = per_completion - beta * kl_k3(logp_new, logp_ref.detach(), m)  # - beta KL
    return per_completion.mean()  # mean over i of (1/(G-1)) sum_j
