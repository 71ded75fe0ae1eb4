"""The variants (A)-(F) of docs/ABPO_SPEC.md "Variants", as a table of switches, and how each one turns the
rewards of a batch into rollout advantages.

    letter  name          anchor  snips  self_certainty  update
    (A)     none          -       -      -               no     no update (the deployed pi_init stays)
    (B)     grpo          -       -      -               yes    vanilla GRPO: plain group mean/std over rollouts
    (C)     anchor        yes     -      -               yes    + anchoring only (w = 1)
    (D)     anchor_snips  yes     yes    -               yes    + anchoring + SNIPS
    (E)     anchor_sc     yes     -      yes             yes    + anchoring + self-certainty
    (F)     abpo          yes     yes    yes             yes    ABPO

Every updating variant uses the same match reward (+1 / -1 for matching a positive / no-response exposure)
and format reward; self-certainty adds lambda_sc * r_sc for no-response rows only. (B) is the GRPO-update
arm of the A/B test.

Beside A-F (the paper's; docs/update-variants.md has each equation and its source), variants that are one of B, D or F
plus settings of section update they fix (``Variant.presets``, applied by abpo.train.grpo_args.variant_update_config):

    (G)     grpo_cr         B + no-response rows' surrogate weighted kappa = c / (1 - c)   (abpo.algo.stratum_weight)
    (H)     abpo_cr         F + the same no-response weight
    (I)     abpo_ll         F + SNIPS-weighted log-likelihood of the clicked logged items   (abpo.algo.anchor_terms L1)
    (J)     wll             that likelihood alone, the step-5 term off (anchor and SNIPS flags: rollouts carry only
                            the diagnostics)
    (K)     abpo_offpolicy  F + the anchor's own shaped, clipped importance-weighted term (anchor_terms O1-O3)
    (L)     grpo_ll         B + the likelihood term

The KL term to the update's starting policy (update.beta) is not a variant: any updating variant adds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from abpo.algo.advantages import anchored_advantages, group_advantages
from abpo.algo.snips import stratified_self_normalise


@dataclass(frozen=True)
class Variant:
    anchor: bool  # the logged item is the anchor a^1 of every group (step 4 baseline/spread)
    snips: bool  # the anchor's weight is the stratified SNIPS w_hat (step 3); otherwise w = 1
    self_certainty: bool  # y = 0 rewards add lambda_sc * r_sc (step 2)
    update: bool  # False: no update at all (variant A)
    letter: str  # "A".."F" as in docs/ABPO_SPEC.md
    name: str  # what `abpo update --variant`, an arm's registry entry and an experiment row name it
    description: str
    # section update's settings this variant fixes, (key, value) pairs (docs/update-variants.md); () for A-F
    presets: tuple[tuple[str, Any], ...] = ()

    def effective_lambda_sc(self, lambda_sc: float) -> float:
        """lambda_sc of step 2 for this variant: the configured value with self-certainty, else 0."""
        return lambda_sc if self.self_certainty else 0.0


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(False, False, False, False, "A", "none", "no update"),
        Variant(False, False, False, True, "B", "grpo", "vanilla GRPO: no anchor, plain group mean/std"),
        Variant(True, False, False, True, "C", "anchor", "anchoring only (w = 1)"),
        Variant(True, True, False, True, "D", "anchor_snips", "anchoring + SNIPS"),
        Variant(True, False, True, True, "E", "anchor_sc", "anchoring + self-certainty"),
        Variant(True, True, True, True, "F", "abpo", "ABPO: anchoring + SNIPS + self-certainty"),
        Variant(
            False,
            False,
            False,
            True,
            "G",
            "grpo_cr",
            "vanilla GRPO, no-response rows weighted c/(1-c)",
            (("no_response_weight_rule", "click_rate"),),
        ),
        Variant(
            True,
            True,
            True,
            True,
            "H",
            "abpo_cr",
            "ABPO, no-response rows weighted c/(1-c)",
            (("no_response_weight_rule", "click_rate"),),
        ),
        Variant(
            True,
            True,
            True,
            True,
            "I",
            "abpo_ll",
            "ABPO + SNIPS-weighted likelihood of clicked logged items",
            (("likelihood_weight", 1.0),),
        ),
        Variant(
            True,
            True,
            False,
            True,
            "J",
            "wll",
            "SNIPS-weighted likelihood of clicked logged items only (no GRPO term)",
            (("surrogate_weight", 0.0), ("likelihood_weight", 1.0)),
        ),
        Variant(
            True,
            True,
            True,
            True,
            "K",
            "abpo_offpolicy",
            "ABPO + the anchor's own shaped importance-weighted term (LUFFY)",
            (("offpolicy_weight", 1.0),),
        ),
        Variant(
            False,
            False,
            False,
            True,
            "L",
            "grpo_ll",
            "vanilla GRPO + SNIPS-weighted likelihood of clicked logged items",
            (("likelihood_weight", 1.0),),
        ),
    )
}


def get_variant(key: str) -> Variant:
    """A variant by config name ("abpo") or letter ("F"), case-insensitive."""
    k = key.strip()
    for v in VARIANTS.values():
        if k.lower() == v.name or k.upper() == v.letter:
            return v
    options = ", ".join(f"{v.letter}={v.name}" for v in VARIANTS.values())
    raise ValueError(f"abpo.algo.variants: unknown variant {key!r}; rule: one of {options}")


def anchor_weights(variant: Variant, w: Tensor | None, y: Tensor, delta: float) -> Tensor:
    """The anchor weight w_hat entering step 4 for this variant: stratified SNIPS (D, F, step 3) or 1 (C, E)."""
    if not variant.anchor:
        raise ValueError(f"abpo.algo.variants: variant {variant.letter} ({variant.name}) has no anchor")
    if not variant.snips:
        return torch.ones(y.shape[0], dtype=torch.float32, device=y.device)  # w = 1
    if w is None:
        raise ValueError(f"abpo.algo.variants: variant {variant.letter} ({variant.name}) needs the SNIPS weights w")
    return stratified_self_normalise(w, y, delta)  # w_hat = w / (mean_{B_y} w + delta)


def rollout_advantages(
    variant: Variant,
    r_log: Tensor | None,
    r_roll: Tensor,
    y: Tensor,
    w: Tensor | None,
    *,
    delta: float,
    eps_std: float,
) -> Tensor:
    """Advantages [B, G-1] of the rollouts under `variant` (step 4, or plain GRPO for B). Detached.

    r_log: [B] anchor rewards (ignored by B); r_roll: [B, G-1]; y: [B]; w: [B] raw SNIPS weights
    (`snips_weight`, needed by D and F).
    """
    if not variant.update:
        raise ValueError(f"abpo.algo.variants: variant {variant.letter} ({variant.name}) performs no update")
    if not variant.anchor:
        return group_advantages(r_roll, eps_std)  # (B): plain group mean/std, no anchor
    if r_log is None:
        raise ValueError(f"abpo.algo.variants: variant {variant.letter} ({variant.name}) needs the anchor rewards")
    w_hat = anchor_weights(variant, w, y, delta).to(r_roll.dtype)
    return anchored_advantages(r_log, r_roll, w_hat, eps_std)  # (C)-(F): anchored
