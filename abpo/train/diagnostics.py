"""The trainer's per-step diagnostics of docs/diagnostics.md (the formulas are abpo.algo.diagnostics), computed from
a generation batch's gathered rollout records (abpo.train.records.RolloutRecord) without any extra forward or
backward pass."""

from __future__ import annotations

import math

import torch

from abpo.algo.advantages import group_advantages
from abpo.algo.diagnostics import (
    gamma_ratio,
    gradient_cosine,
    group_std_mean,
    log_odds_push,
    logit_gradient,
    rank_correlation,
    zero_spread_share,
)
from abpo.algo.rewards import total_reward
from abpo.algo.snips import snips_weight, weight_summary
from abpo.algo.variants import Variant
from abpo.train.records import ABPOSettings, RolloutRecord


def step_diagnostics(
    variant: Variant,
    settings: ABPOSettings,
    groups: list[list[RolloutRecord]],
    y: torch.Tensor,
    r_match: torch.Tensor,
    r_fmt: torch.Tensor,
    r_roll: torch.Tensor,
    r_sc: torch.Tensor | None,
    adv: torch.Tensor,
    *,
    sc_trace: dict[str, list[float]],
    training: bool,
    with_popularity: bool,
) -> dict[str, float]:
    """The per-step diagnostics of docs/diagnostics.md (abpo.algo.diagnostics), for every variant B-F, on the
    step's gathered groups (the records of `ABPOTrainer._abpo_advantages`, one list per logged example):

    - ``abpo/w_*``: `weight_summary` of the raw SNIPS weights w = e_old(a_log|q)/e0(a_log|q) of the logged
      examples (uncapped by update.w_max; logged for B, C and E too, which ignore them);
    - ``abpo/zero_spread_share``: share of groups whose sampled rollouts' step-2 rewards all equal;
    - ``abpo/gamma_ratio``, ``abpo/grad_cosine_vs_grpo``: Eq. G / Eq. P of abpo.algo.diagnostics with pi =
      e_old(.|q) over C, under this variant's advantages and under vanilla GRPO's (B's group advantages of B's
      rewards, r_match + r_fmt, on the same rollouts). For item-token prompts pi is the choice-position
      distribution restricted to C (exact for one-token constrained answers with temperature = tau); for text
      prompts (multi-token answers) it is the candidate-level softmax of the sequence scores, i.e. the
      gradient is taken at the choice level, not per token. The anchor has no surrogate term (step 5), so only
      rollouts are rows of Eq. G;
    - ``abpo/r_sc_group_std`` (variants with self-certainty): mean over no-response groups of the within-group
      std of the rollouts' r_sc; ``abpo/r_sc_corr_popularity`` / ``abpo/r_sc_corr_title_len``: Spearman rho of
      r_sc with the chosen item's training interaction count / title token count over every scored
      no-response rollout of the update so far (``sc_trace``, extended here with this step's rollouts when
      ``training``: an evaluation's rollouts are not the update's). ``with_popularity``: the item popularities are known
      (else abpo/r_sc_corr_popularity is not logged).
    A diagnostic that is undefined at a step (NaN) is left out of that step's metrics."""
    v, st = variant, settings
    b, k = r_roll.shape
    out: dict[str, float] = {}
    e0 = torch.tensor([grp[0].e0 for grp in groups], dtype=torch.float64)
    e_old = torch.tensor([grp[0].e_old for grp in groups], dtype=torch.float64)
    ws = weight_summary(snips_weight(e_old, e0))
    out.update({f"abpo/w_{name}": ws[name] for name in ("p50", "p90", "p99", "max", "ess", "ess_share")})
    out["abpo/zero_spread_share"] = zero_spread_share(r_roll)

    adv_grpo = adv if not v.anchor else group_advantages(total_reward(r_match, r_fmt, None, y, 0.0), st.eps_std)
    chosen = torch.tensor([[r.chosen for r in grp] for grp in groups], dtype=torch.int64)  # [B, K]
    g_var, g_grpo, push_var, push_grpo = [], [], [], []
    # the policy's candidate distribution is recorded once per request in the batch (its first row): a request
    # drawn twice into one generation batch (batch planning may repeat a row of the smaller stratum) has two
    # groups and one record, shared since they have the same prompt
    pi_of = {r.request_id: r.pi for grp in groups for r in grp if r.pi is not None}
    for i, grp in enumerate(groups):
        if grp[0].request_id not in pi_of:
            continue
        pi = torch.tensor(pi_of[grp[0].request_id], dtype=torch.float64)
        g_var.append(logit_gradient(pi, chosen[i], adv[i]))
        g_grpo.append(logit_gradient(pi, chosen[i], adv_grpo[i]))
        push_var.append(log_odds_push(chosen[i], adv[i], grp[0].a_log_index))
        push_grpo.append(log_odds_push(chosen[i], adv_grpo[i], grp[0].a_log_index))
    out["abpo/gamma_ratio"] = gamma_ratio(push_var, push_grpo)
    out["abpo/grad_cosine_vs_grpo"] = gradient_cosine(g_var, g_grpo)

    if r_sc is not None:
        neg = y == 0
        if bool(neg.any()):
            out["abpo/r_sc_group_std"] = group_std_mean(r_sc[neg])
        trace = sc_trace
        for grp in groups if training else []:  # the update's rollouts only, not an evaluation's
            for r in grp:
                if r.y == 0 and r.chosen >= 0:
                    trace["r_sc"].append(r.r_sc)
                    trace["popularity"].append(r.popularity)
                    trace["title_len"].append(r.title_tokens)
        out["abpo/r_sc_corr_title_len"] = rank_correlation(trace["r_sc"], trace["title_len"])
        if with_popularity:
            out["abpo/r_sc_corr_popularity"] = rank_correlation(trace["r_sc"], trace["popularity"])
    return {key: val for key, val in out.items() if math.isfinite(val)}
