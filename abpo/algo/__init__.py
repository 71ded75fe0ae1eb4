"""The equations of the ABPO update (docs/ABPO_SPEC.md "The update"), in pure torch, one function per equation.

    step 2  rewards.py     format_reward, match_reward, self_certainty, total_reward, anchor_reward
    step 3  snips.py       snips_weight, stratified_self_normalise
    step 4  advantages.py  anchored_baseline, anchored_spread, anchored_advantages, group_advantages (variant B)
    step 5  surrogate.py   clipped_surrogate (+ optional KL)
    (A)-(L) variants.py    VARIANTS, get_variant, rollout_advantages (G-L: docs/update-variants.md)
    G-L     stratum_weight.py  no_response_weight, stratum_weighted_advantages (Eqs. N1-N2)
            anchor_terms.py    likelihood_coefficients, weighted_log_likelihood (L1), offpolicy_anchor_surrogate (O1-O3)
    logging diagnostics.py logit_gradient, log_odds_push, gamma_ratio, gradient_cosine, zero_spread_share, ...

No TRL import here: abpo.train wires these into the trainer.
"""

from abpo.algo.advantages import anchored_advantages, anchored_baseline, anchored_spread, group_advantages
from abpo.algo.diagnostics import (
    gamma_ratio,
    gradient_cosine,
    group_std_mean,
    log_odds_push,
    logit_gradient,
    rank_correlation,
    zero_spread_share,
)
from abpo.algo.rewards import (
    NO_ITEM,
    anchor_reward,
    chosen_items,
    format_reward,
    match_reward,
    self_certainty,
    self_certainty_from_token_kl,
    token_kl_from_uniform,
    total_reward,
)
from abpo.algo.snips import (
    effective_sample_size,
    snips_weight,
    snips_weight_from_logprobs,
    stratified_self_normalise,
)
from abpo.algo.surrogate import clipped_surrogate, kl_k3, sequence_log_ratio
from abpo.algo.variants import VARIANTS, Variant, anchor_weights, get_variant, rollout_advantages

__all__ = [
    "NO_ITEM",
    "VARIANTS",
    "Variant",
    "anchor_reward",
    "anchor_weights",
    "anchored_advantages",
    "anchored_baseline",
    "anchored_spread",
    "chosen_items",
    "clipped_surrogate",
    "effective_sample_size",
    "format_reward",
    "gamma_ratio",
    "get_variant",
    "gradient_cosine",
    "group_advantages",
    "group_std_mean",
    "kl_k3",
    "log_odds_push",
    "logit_gradient",
    "match_reward",
    "rank_correlation",
    "rollout_advantages",
    "self_certainty",
    "self_certainty_from_token_kl",
    "sequence_log_ratio",
    "snips_weight",
    "snips_weight_from_logprobs",
    "stratified_self_normalise",
    "token_kl_from_uniform",
    "total_reward",
    "zero_spread_share",
]
