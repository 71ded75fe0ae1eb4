"""Step 3 of the ABPO update (docs/ABPO_SPEC.md "The update"): the SNIPS weight of the anchor.

    w_i     = e_old(a_i^log | q_i) / e0(a_i^log | q_i)           (stop-gradient; both over the same C_i)
    w_hat_i = w_i / (mean_{k in B_{y_i}} w_k + delta)            (self-normalised inside B_1 and B_0 separately)

e_p(a|q) = softmax_{a in C}(s_p(a,q) / tau) is the candidate-level propensity (docs/ABPO_SPEC.md "Propensities");
e0 comes from the log, e_old is recomputed each step under the rollout policy pi_old.
"""

from __future__ import annotations

import torch
from torch import Tensor


def snips_weight(e_old_log: Tensor, e0_log: Tensor) -> Tensor:
    """w_i = e_old(a_i^log | q_i) / e0(a_i^log | q_i) (docs/ABPO_SPEC.md step 3), returned detached (stop-gradient).

    Both arguments are probabilities of the logged item a^log ("_log" = of the logged item), [B].
    """
    if e_old_log.shape != e0_log.shape or e0_log.dim() != 1:
        raise ValueError(
            f"abpo.algo.snips.snips_weight: e_old_log {tuple(e_old_log.shape)} vs e0_log {tuple(e0_log.shape)}; "
            "rule: one propensity of each kind per logged example, shape [B]"
        )
    e0 = e0_log.detach()
    e_old = e_old_log.detach()
    bad = ~((e0 > 0) & (e0 <= 1))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"abpo.algo.snips.snips_weight: e0_log[{i}] = {e0[i].item()}; rule: 0 < e0 <= 1")
    bad = ~((e_old >= 0) & (e_old <= 1))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"abpo.algo.snips.snips_weight: e_old_log[{i}] = {e_old[i].item()}; rule: 0 <= e_old <= 1")
    return e_old / e0  # w_i = e_old(a^log|q) / e0(a^log|q), no gradient


def snips_weight_from_logprobs(log_e_old_log: Tensor, log_e0_log: Tensor) -> Tensor:
    """w_i = exp(log e_old(a^log|q) - log e0(a^log|q)) (docs/ABPO_SPEC.md step 3), the same weight from
    log-propensities (e.g. a log_softmax over C), detached. Stable when both propensities are tiny."""
    if log_e_old_log.shape != log_e0_log.shape or log_e0_log.dim() != 1:
        raise ValueError(
            f"abpo.algo.snips.snips_weight_from_logprobs: shapes {tuple(log_e_old_log.shape)} vs "
            f"{tuple(log_e0_log.shape)}; rule: shape [B] each"
        )
    bad = ~(log_e0_log.detach() <= 0) | ~(log_e_old_log.detach() <= 0)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"abpo.algo.snips.snips_weight_from_logprobs: row {i} has a log-propensity > 0 or NaN; rule: log e <= 0"
        )
    return torch.exp(log_e_old_log.detach() - log_e0_log.detach())  # w_i = e_old / e0


def stratified_self_normalise(w: Tensor, y: Tensor, delta: float) -> Tensor:
    """w_hat_i = w_i / (mean_{k in B_{y_i}} w_k + delta) (docs/ABPO_SPEC.md step 3), detached.

    B_1 = {k : y_k = 1} (positive responses), B_0 = {k : y_k = 0} (no response): each stratum is
    normalised by its own mean, never by the whole batch's. A stratum absent from the batch simply has no
    members (the trainer's stratified batches hold both). When a group's rows span processes, gather w and
    y over the whole mini-batch first.
    """
    if w.dim() != 1 or y.shape != w.shape:
        raise ValueError(
            f"abpo.algo.snips.stratified_self_normalise: w {tuple(w.shape)} and y {tuple(y.shape)}; rule: both [B]"
        )
    bad = ~((y == 0) | (y == 1))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"abpo.algo.snips.stratified_self_normalise: y[{i}] = {y[i].item()}; rule: y is 0 or 1")
    bad = ~(w.detach() >= 0) | ~torch.isfinite(w.detach())
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"abpo.algo.snips.stratified_self_normalise: w[{i}] = {w[i].item()}; rule: weights are finite and >= 0"
        )
    if delta < 0:
        raise ValueError(f"abpo.algo.snips.stratified_self_normalise: delta = {delta}; rule: delta >= 0")
    w = w.detach()
    w_hat = torch.empty_like(w)
    for stratum in (0, 1):
        in_b = y == stratum  # k in B_y
        if bool(in_b.any()):
            w_hat[in_b] = w[in_b] / (w[in_b].mean() + delta)  # w_i / (mean_{k in B_y} w_k + delta)
    return w_hat


def effective_sample_size(w: Tensor) -> Tensor:
    """Kish effective sample size (sum_i w_i)^2 / sum_i w_i^2 of importance weights (a logging statistic:
    equals B for equal weights, 1 when one weight dominates). Returns a scalar tensor."""
    w = w.detach().to(torch.float64)
    denom = (w * w).sum()
    return torch.where(denom > 0, w.sum() ** 2 / denom.clamp(min=torch.finfo(torch.float64).tiny), denom)


WEIGHT_QUANTILES = (0.5, 0.9, 0.99)


def weight_summary(w: Tensor) -> dict[str, float]:
    """How heavy-tailed the SNIPS weights w_i = e_old/e0 of one update (or one step) are, for logging: the
    quantiles p50, p90 and p99 (WEIGHT_QUANTILES), the max, the Kish ESS (effective_sample_size) and the ESS as a
    share of the rows (``ess_share``: 1 for equal weights, ~1/B when one weight dominates), and ``rows``.

    The one summary both the experiment's per-step diagnostics and the monthly update's log line use, so a weight
    distribution reads the same everywhere. Empty input gives NaNs and rows 0.
    """
    w = w.detach().to(torch.float64).flatten()
    n = int(w.numel())
    if n == 0:
        return {
            "p50": float("nan"),
            "p90": float("nan"),
            "p99": float("nan"),
            "max": float("nan"),
            "ess": float("nan"),
            "ess_share": float("nan"),
            "rows": 0,
        }
    q = torch.quantile(w, torch.tensor(WEIGHT_QUANTILES, dtype=torch.float64))
    ess = float(effective_sample_size(w))
    return {
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "max": float(w.max()),
        "ess": ess,
        "ess_share": ess / n,
        "rows": n,
    }
