"""ABPOTrainer: trl.GRPOTrainer with the advantages of docs/ABPO_SPEC.md "The update", for every variant (B)-(F).

What TRL keeps doing (unchanged, by calling super()): the data loader and its group sampler, rollout generation
(HF `generate` on CPU, vLLM colocate on GPU), the reward functions' bookkeeping and logging, the per-token
log-probs (its fused LM head), PEFT/LoRA, DeepSpeed, gradient accumulation, checkpoints and resume.

What this subclass changes (no TRL code is copied):

- `_compute_loss`: replaced by step 5 exactly, `abpo.algo.surrogate.clipped_surrogate` with `update.ratio_level`
  (default: the spec's sequence ratio; only rollouts are rows, so the anchor never gets a surrogate term): each
  rollout weighs the same whatever its token count (TRL's grpo loss averages tokens per rollout, dapo/bnpo
  weigh by batch token counts; both are refused or replaced).
- constrained rollouts (`policy.constrained_rollouts`, abpo.policy.constrained): `generate` gets a per-row
  candidate-trie logits processor, and the loss uses the log-probs of that constrained policy (Eq. q there).

- `_calculate_rewards`: calls super() and keeps its output, the gathered per-function rewards [N_global, 2]
  (r_fmt, r_match of step 2, computed by the TRL reward functions `format_reward` / `match_reward` below from
  the dataset columns `candidates`, `a_log`, `y`).
- `_generate_and_score_completions`: calls super(), then replaces `output["advantages"]` with the variant's
  advantages: rollout rewards r = r_match + r_fmt (+ lambda_sc r_sc for y = 0, self-certainty from pi_theta's
  logits over each completion), the anchor's reward r_log (the same function on the logged item's well-formed
  text), the SNIPS weight w = e_old(a_log|q)/e0(a_log|q) with e_old recomputed here with the shared-prefix scorer
  over the example's candidate set under the rollout policy pi_old, stratified self-normalisation over the
  generation batch (the SNIPS mini-batch), then `abpo.algo.variants.rollout_advantages`.
  Rewards are gathered over processes before any group statistic (a group's rows may span processes), then each
  process keeps its own slice, exactly as TRL slices its advantages.
- per-step diagnostics for every variant (`_diagnostics`, docs/diagnostics.md): the SNIPS weight summary, the
  zero-spread share, gamma and the gradient cosine against vanilla GRPO on the same rollouts, and the self-certainty
  spread and correlations; r_sc averages over `update.self_certainty_positions` (choice | answer).

Group layout: TRL's RepeatSampler puts each logged example's `num_generations` rollouts next to each other;
num_generations = G - 1 for anchored variants (the anchor is not sampled), G for vanilla GRPO (B).
The TRL internals relied on are pinned by tests/train/test_trl_contract.py (trl>=1.16,<1.17).

The trainer's parts, one idea per module: `abpo.train.records` (its settings and the gathered rollout records),
`abpo.train.rewards` (the TRL reward functions), `abpo.train.rollouts` (generation and constrained rollouts, a
mixin), `abpo.train.advantages` (e_old, r_sc and the advantages, a mixin), `abpo.train.diagnostics` (the per-step
diagnostics) and `abpo.train.callbacks` (MLflow logging, stop after a step). Their public names stay importable
from here.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from abpo.algo.rewards import chosen_items
from abpo.algo.surrogate import clipped_surrogate, sequence_log_ratio
from abpo.algo.variants import get_variant
from abpo.train.advantages import AdvantagesMixin
from abpo.train.records import (
    ABPOSettings,
    check_simulated_click_reward,
)
from abpo.train.rewards import REWARD_FUNCS, _completion_texts
from abpo.train.rollouts import RolloutsMixin

TESTED_TRL = (">=1.16", "<1.17")
ALLOWED_LOSS_TYPES = frozenset({"grpo"})
RATIO_LEVELS = frozenset({"sequence", "geometric", "token"})
SC_POSITIONS = frozenset({"choice", "answer"})

# ------------------------------------------------------------------------------------------ TRL's fused head


@contextmanager
def _compact_fused_lm_head():
    """Within the block, TRL's fused LM head gathers the labelled (completion) positions before projecting them on
    every device, as it already does on CUDA/XPU (`compact = _use_triton(device)` in `add_fused_lm_head`). Only that
    decision changes: the kernel itself still picks its own (torch) implementation on the CPU."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original


def _pad_right(t: torch.Tensor, length: int, value: int) -> torch.Tensor:
    """[N, T] -> [N, length] padded on the right with ``value``."""
    if t.size(1) == length:
        return t
    return torch.nn.functional.pad(t, (0, length - t.size(1)), value=value)


def _pad_allowed(parts: list[torch.Tensor], length: int, value: int) -> torch.Tensor:
    """The allowed-token tensors [N_p, T_p, K_p] of the rollouts and the anchors stacked as [sum N_p, length, max K]."""
    k = max(p.size(2) for p in parts)
    return torch.cat(
        [torch.nn.functional.pad(p, (0, k - p.size(2), 0, length - p.size(1)), value=value) for p in parts]
    )


# ------------------------------------------------------------------------------------------------- trainer


class ABPOTrainer(RolloutsMixin, AdvantagesMixin, GRPOTrainer):
    """GRPOTrainer whose advantages follow docs/ABPO_SPEC.md steps 2-4 for `settings.variant` (B-F).

    The dataset must hold the columns of `abpo.train.dataset.COLUMNS` plus `candidate_answers` (r(a) for each
    candidate, for e_old) and be read in order (`args.shuffle_dataset=False`: its row order is the stratified
    batch order). `reward_funcs` are fixed (`REWARD_FUNCS`).
    """

    _tag_names = ["trl", "grpo", "abpo"]

    def __init__(
        self,
        model,
        args: GRPOConfig,
        *,
        settings: ABPOSettings,
        train_dataset,
        processing_class,
        item_popularity: dict[int, int] | None = None,
        **kwargs,
    ):
        """``item_popularity``: item id -> interaction count in the training data (``Dataset.popularity()``), for the
        diagnostic ``abpo/r_sc_corr_popularity`` only (None: that correlation is not logged)."""
        self.abpo = settings
        self.item_popularity = dict(item_popularity) if item_popularity is not None else None
        self.variant = get_variant(settings.variant)
        if not self.variant.update:
            raise ValueError(
                f"variant {settings.variant}: variant A performs no update; nothing to train "
                "(run_update returns pi_init unchanged for it)"
            )
        if args.shuffle_dataset:
            raise ValueError(
                "ABPOTrainer: GRPOConfig.shuffle_dataset must be False: the dataset's row order is the stratified "
                "batch order (both feedback types in every SNIPS mini-batch); shuffling happens when it is built"
            )
        if args.num_iterations != 1:
            raise ValueError("ABPOTrainer: num_iterations must be 1 (pi_old is the policy of the previous step)")
        if args.steps_per_generation != args.gradient_accumulation_steps:
            raise ValueError(
                f"ABPOTrainer: steps_per_generation={args.steps_per_generation} != gradient_accumulation_steps="
                f"{args.gradient_accumulation_steps}; rule: one generation batch is one optimizer step, the SNIPS "
                "mini-batch of step 3 (its w_hat are normalised over exactly the rows of one step)"
            )
        if args.loss_type not in ALLOWED_LOSS_TYPES:
            raise ValueError(
                f"ABPOTrainer: loss_type={args.loss_type!r}; rule: one of {sorted(ALLOWED_LOSS_TYPES)}. ABPO's loss "
                "is the mean over rollouts of step 5 (computed here by abpo.algo.surrogate); TRL's dapo/bnpo/"
                "dr_grpo/cispo weight completions by batch token counts, which breaks the (1/(G-1)) mean"
            )
        if settings.ratio_level not in RATIO_LEVELS:
            raise ValueError(
                f"ABPOTrainer: update.ratio_level={settings.ratio_level!r}; rule: one of {sorted(RATIO_LEVELS)}"
            )
        if settings.self_certainty_positions not in SC_POSITIONS:
            raise ValueError(
                f"ABPOTrainer: update.self_certainty_positions={settings.self_certainty_positions!r}; rule: one of "
                f"{sorted(SC_POSITIONS)}"
            )
        if settings.constrained_rollouts:
            from abpo.policy.constrained import check_sampling

            if args.use_vllm:
                raise ValueError(
                    "policy.constrained_rollouts with update.use_vllm: rule: constrained rollouts run through HF "
                    "generate (the vLLM path samples freely, as the paper does); turn one of them off"
                )
            check_sampling(top_p=args.top_p, top_k=args.top_k, min_p=args.min_p)
        if settings.surrogate_weight == 0 and not settings.anchor_terms:
            raise ValueError(
                "ABPOTrainer: update.surrogate_weight=0 with update.likelihood_weight=0 and update.offpolicy_weight=0; "
                "rule: at least one term of the objective is on (docs/update-variants.md)"
            )
        missing = [
            c
            for c in ("candidates", "a_log", "y", "e0", "anchor_text", "request_id", "candidate_answers")
            if c not in train_dataset.column_names
        ]
        if missing:
            raise ValueError(f"ABPOTrainer: train_dataset lacks column(s) {missing}")
        check_simulated_click_reward(settings, train_dataset.column_names)
        super().__init__(
            model=model,
            reward_funcs=list(REWARD_FUNCS),
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        self._abpo_rewards_per_func: torch.Tensor | None = None
        self._abpo_rollout_sc: list[float] | None = None  # r_sc of this generation batch's rollouts, if recorded
        self._answer_ids_cache: dict[str, list[int]] = {}
        self._abpo_gen_inputs: list[dict] | None = None  # the rows being generated for (constrained rollouts)
        self._trie_cache: dict[str, Any] = {}
        self._abpo_chosen_local: list[int] | None = None  # candidate index of each local rollout's answer (-1: none)
        # the logged items' own terms of the generation batch (c_ll, c_off, log e0 per gathered row), when on
        self._abpo_anchor_coefs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._title_len_cache: dict[str, int] = {}
        # (r_sc, popularity, title tokens) of every scored no-response rollout of the update so far, for the
        # correlations abpo/r_sc_corr_popularity and abpo/r_sc_corr_title_len (reset by a resume: a new trainer)
        self._abpo_sc_trace: dict[str, list[float]] = {"r_sc": [], "popularity": [], "title_len": []}

    # ------------------------------------------------------------------------------ wrapped TRL methods

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """super(), with TRL's fused LM head scoring only the completion positions on every device.

        TRL's fused head (trl.trainer.utils.add_fused_lm_head) projects only the positions with a label (the
        completion tokens) on CUDA/XPU, but on other devices it projects EVERY position, prompt included, through the
        LM head, forward and backward, to keep tile shapes static for compilers (Neuron). On the CPU that is pure
        waste: with ~530 prompt tokens and ~20 completion tokens per row, ~95% of the head's work (the largest cost
        of a CPU update step) is thrown away. The result is identical either way (masked positions are zero); see
        tests/train/test_trl_contract.py for the pinned line."""
        with _compact_fused_lm_head():
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._abpo_rewards_per_func = rewards_per_func  # gathered over processes: [N_global, len(REWARD_FUNCS)]
        # a^j of this process's rollouts as an index into each row's candidates (-1: malformed), parsed as the
        # reward functions parse them (the diagnostics' Eq. G needs which candidate every rollout chose)
        cands = [list(x["candidates"]) for x in inputs]
        ids = chosen_items(_completion_texts(completions), cands).tolist()
        self._abpo_chosen_local = [c.index(a) if a in c else -1 for a, c in zip(ids, cands)]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._abpo_rewards_per_func = None
        self._abpo_chosen_local = None
        self._abpo_rollout_sc = None
        self._abpo_gen_inputs = list(inputs)
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._abpo_gen_inputs = None
        if self.abpo.constrained_rollouts:
            from abpo.policy.constrained import allowed_tensor

            comps = [
                row[m.bool()].tolist()
                for row, m in zip(output["completion_ids"].cpu(), output["completion_mask"].cpu())
            ]
            # S_t of every completion position: the loss's log q_theta (Eq. q) travels with the rows through TRL's
            # shuffle and split of the generation batch
            output["abpo_allowed"] = allowed_tensor(
                [self._trie(x) for x in inputs], comps, output["completion_ids"].size(1)
            ).to(output["completion_ids"].device)
            if "old_per_token_logps" in output:
                raise RuntimeError(
                    "ABPOTrainer: TRL computed full-vocabulary old log-probs (misaligned steps or vLLM importance "
                    "sampling), which constrained rollouts cannot use"
                )
            if output.get("ref_per_token_logps") is not None:
                output["ref_per_token_logps"] = self._constrained_ref_logps(output)
        if self._abpo_rewards_per_func is None:
            raise RuntimeError(
                "ABPOTrainer: GRPOTrainer._generate_and_score_completions no longer calls _calculate_rewards; "
                "the TRL internals changed (see tests/train/test_trl_contract.py)"
            )
        t0 = time.perf_counter()
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        advantages, metrics = self._abpo_advantages(inputs, output, self._abpo_rewards_per_func, num_generations)
        if advantages.shape != output["advantages"].shape:
            raise RuntimeError(
                f"ABPOTrainer: advantages {tuple(advantages.shape)} vs TRL's {tuple(output['advantages'].shape)}; "
                "the TRL internals changed (see tests/train/test_trl_contract.py)"
            )
        output["advantages"] = advantages.to(output["advantages"].device, output["advantages"].dtype)
        if self.abpo.anchor_terms:
            self._attach_anchor_rows(inputs, output)  # Eqs. L1 / O3 of docs/update-variants.md
        metrics["abpo/advantage_time_s"] = time.perf_counter() - t0
        for k, v in metrics.items():
            self._metrics[mode][k].append(float(v))
        return output

    def _compute_loss(self, model, inputs):
        """Minus the objective of docs/ABPO_SPEC.md step 5 for this micro-batch, scaled for gradient accumulation:

            J = mean over rollouts of min(s A, clip(s, 1-eps_low, 1+eps_high) A)  [- beta KL]

        computed by `abpo.algo.surrogate.clipped_surrogate` with `update.ratio_level` (sequence: s = pi_theta(a|q) /
        pi_old(a|q), the spec's ratio). Every rollout weighs the same (1/(B(G-1)) over the generation batch: equal
        micro-batches, each a mean, divided by the accumulation steps), whatever its token count. The token
        log-probs are TRL's full-vocabulary ones, or those of the constrained policy q_theta with constrained
        rollouts (Eq. q of abpo.policy.constrained: the distribution the rollouts were sampled from). old = the
        detached current log-probs (one optimizer step per generation batch: s = 1 in value, its gradient is
        A grad log pi) unless TRL stored others."""

        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        anchors = self._anchor_rows(inputs) if self.abpo.anchor_terms else None
        if anchors is not None:
            # the logged items' answers ride in the same forward as the rollouts (one pass: a process group's
            # wrapper sees one forward per backward), right-padded to a common completion length
            sel, a_ids, a_mask, a_allowed = anchors
            n, t = completion_ids.shape
            length = max(t, a_ids.size(1))
            pad = self._pad_token_id()
            comp_all = torch.cat([_pad_right(completion_ids, length, pad), _pad_right(a_ids, length, pad)])
            cmask_all = torch.cat([_pad_right(completion_mask, length, 0), _pad_right(a_mask, length, 0)])
            input_ids = torch.cat([torch.cat([prompt_ids, prompt_ids[sel]]), comp_all], dim=1)
            attention_mask = torch.cat([torch.cat([prompt_mask, prompt_mask[sel]]), cmask_all], dim=1)
            if self.abpo.constrained_rollouts:
                from abpo.policy.constrained import PAD_ALLOWED

                allowed = _pad_allowed([inputs["abpo_allowed"], a_allowed], length, PAD_ALLOWED)
                logps_all, ent_all = self._constrained_logps(model, input_ids, attention_mask, comp_all, allowed)
            else:
                logps_all, ent_all, _ = self._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, length, compute_entropy=True
                )
            logps, entropies = logps_all[:n, :t], ent_all[:n, :t]
            a_m = a_mask.to(logps_all.dtype)
            anchor_logp = (torch.where(a_m > 0, logps_all[n:, : a_ids.size(1)], 0.0) * a_m).sum(-1)  # l_theta
        else:
            input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
            attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
            if self.abpo.constrained_rollouts:
                logps, entropies = self._constrained_logps(
                    model, input_ids, attention_mask, completion_ids, inputs["abpo_allowed"]
                )
            else:
                logps, entropies, _ = self._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
                )
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        advantages = inputs["advantages"]
        ref = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        objective = clipped_surrogate(
            logps,
            old,
            advantages,
            mask,
            (self.epsilon_low, self.epsilon_high),
            ratio_level=self.abpo.ratio_level,
            logp_ref=ref,
            beta=self.beta,
        )
        mode = "train" if self.model.training else "eval"
        if self.abpo.surrogate_weight != 1.0:
            objective = self.abpo.surrogate_weight * objective  # update.surrogate_weight (0: the GRPO term off)
        loss = -objective / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)
        extra: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if anchors is not None:
            from abpo.algo.anchor_terms import offpolicy_anchor_surrogate, weighted_log_likelihood

            sel = anchors[0]
            ll_c, off_c = inputs["abpo_anchor_ll_coef"][sel], inputs["abpo_anchor_off_coef"][sel]
            # the coefficients are normalised over the whole generation batch (1/B), so the micro-batches' terms
            # add up to J_LL and J_off; a process group averages gradients, hence x processes
            j_anchor = weighted_log_likelihood(anchor_logp, ll_c) + offpolicy_anchor_surrogate(
                anchor_logp,
                anchor_logp.detach(),  # pi_old = the policy of this step (one optimizer step per generation batch)
                inputs["abpo_anchor_log_e0"][sel],
                off_c,
                (self.epsilon_low, self.epsilon_high),
                self.abpo.offpolicy_gamma,
            )
            loss = loss - j_anchor * self.accelerator.num_processes
            with torch.no_grad():
                k = torch.tensor(float(sel.numel()))
                extra["abpo/anchor/logp_mean"] = (anchor_logp.detach().sum(), k)  # mean l_theta(a^log | q)
                rho = torch.exp(anchor_logp.detach() - inputs["abpo_anchor_log_e0"][sel].to(anchor_logp.dtype))
                extra["abpo/anchor/rho_mean"] = (rho.sum(), k)  # mean pi_theta(a^log) / e0(a^log)

        with torch.no_grad():  # metrics: TRL's names where they mean the same
            m = mask.to(logps.dtype)
            if self.abpo.ratio_level == "token":
                ratio, adv, w = torch.exp((logps - old) * m), advantages[:, None].expand_as(logps), m
            else:
                ratio, adv = torch.exp(sequence_log_ratio(logps, old, m, self.abpo.ratio_level)), advantages
                w = torch.ones_like(ratio)
            clipped = ((ratio < 1 - self.epsilon_low) & (adv < 0)) | ((ratio > 1 + self.epsilon_high) & (adv > 0))
            # reduced over the processes before they are logged (sums and counts, so a multi-process step logs the
            # values one process would log for the whole batch): [numerator, denominator] per metric
            parts = {
                "clip_ratio/region_mean": ((clipped.float() * w).sum(), w.sum()),
                "entropy": ((entropies * m).sum(), m.sum()),
                "abpo/objective": (objective.detach() * len(advantages), torch.tensor(float(len(advantages)))),
            }
            parts.update(extra)
            if ref is not None:  # the KL term's value: mean over rollouts of kl_k3 (TRL's metric name)
                from abpo.algo.surrogate import kl_k3

                kl = kl_k3(logps.detach(), ref.detach(), mask)
                parts["kl"] = (kl.sum(), torch.tensor(float(kl.numel())))
            local = torch.stack(
                [torch.stack([a.float().reshape(()), b.float().to(a.device).reshape(())]) for a, b in parts.values()]
            )  # [metrics, 2]
            total = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").cpu()
            for (name, _), (num, den) in zip(parts.items(), total.tolist(), strict=True):
                self._metrics[mode][name].append(num / den if name == "abpo/objective" else num / max(den, 1.0))
        return loss
