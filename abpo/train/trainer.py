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
  over the example's candidate set under the rollout policy pi_old (with one token per item id read from the
  next-token logits the rollouts were drawn from: each distinct prompt runs through the model once per generation
  batch), stratified self-normalisation over the generation batch (the SNIPS mini-batch), then
  `abpo.algo.variants.rollout_advantages`.
  Rewards are gathered over processes before any group statistic (a group's rows may span processes), then each
  process keeps its own slice, exactly as TRL slices its advantages.
- per-step diagnostics for every variant (`_diagnostics`, docs/diagnostics.md): the SNIPS weight summary, the
  zero-spread share, gamma and the gradient cosine against vanilla GRPO on the same rollouts, and the self-certainty
  spread and correlations; r_sc averages over `update.self_certainty_positions` (choice | answer).

Group layout: TRL's RepeatSampler puts each logged example's `num_generations` rollouts next to each other;
num_generations = G - 1 for anchored variants (the anchor is not sampled), G for vanilla GRPO (B).
The TRL internals relied on are pinned by tests/train/test_trl_contract.py (trl>=1.16,<1.17).

The trainer's collaborators, one idea per module, each a function or a small class of what it is given (the
trainer keeps the generation batch's state and passes it on; docs/update-walkthrough.md follows one step through
them): `abpo.train.records` (its settings and the gathered rollout records), `abpo.train.rewards` (the TRL reward
functions), `abpo.train.answers` (the candidate answers' token ids and tries), `abpo.train.rollouts` (step 1:
generation and constrained rollouts), `abpo.train.advantages` (steps 2-4: e_old, r_sc and the advantages),
`abpo.train.diagnostics` (the per-step diagnostics) and `abpo.train.callbacks` (MLflow logging, stop after a step).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from functools import partial
from typing import Any, cast

import torch
from accelerate.utils import gather_object
from trl import GRPOConfig, GRPOTrainer

from abpo.algo.rewards import chosen_items
from abpo.algo.surrogate import RatioLevel, clipped_surrogate, sequence_log_ratio
from abpo.algo.variants import Variant, get_variant
from abpo.config.update import LOSS_TYPES, RATIO_LEVELS
from abpo.policy.token_scoring import PromptLogits
from abpo.train.advantages import (
    AnchorCoefficients,
    LocalBatch,
    PolicyScorer,
    anchor_row_inputs,
    anchor_rows,
    batch_advantages,
    local_records,
)
from abpo.train.answers import AnswerTokens, AnswerTries
from abpo.train.records import ABPOSettings, CandidateSet, RolloutRecord, check_simulated_click_reward
from abpo.train.rewards import REWARD_FUNCS, _completion_texts
from abpo.train.rollouts import choice_entropies, constrained_logps, constrained_ref_logps, generate_rollouts

TESTED_TRL = (">=1.16", "<1.17")
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


def _greedy(args: GRPOConfig) -> bool:
    """Greedy rollouts: GRPOConfig.generation_kwargs do_sample=False (update.greedy_rollouts), as HF generate reads
    it."""
    kwargs = args.generation_kwargs
    return isinstance(kwargs, dict) and kwargs.get("do_sample", True) is False


# ------------------------------------------------------------------------------------------------- trainer


def check_trainer_settings(variant: Variant, settings: ABPOSettings, args: GRPOConfig, columns: list[str]) -> None:
    """ValueError naming the setting and its rule when ``args`` / ``settings`` / the dataset's ``columns`` cannot
    train ``variant`` as the spec says (one generation batch = one optimizer step = one SNIPS mini-batch, the
    dataset read in its stratified order, step 5's loss, the known ratio levels and r_sc positions, constrained
    rollouts through HF generate, at least one term of the objective)."""
    if not variant.update:
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
    if args.loss_type not in LOSS_TYPES:
        raise ValueError(
            f"ABPOTrainer: loss_type={args.loss_type!r}; rule: one of {sorted(LOSS_TYPES)}. ABPO's loss "
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
    missing = [c for c in TRAINER_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"ABPOTrainer: train_dataset lacks column(s) {missing}")
    check_simulated_click_reward(settings, columns)


TRAINER_COLUMNS = ("candidates", "a_log", "y", "e0", "anchor_text", "request_id", "candidate_answers")


class ABPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages follow docs/ABPO_SPEC.md steps 2-4 for `settings.variant` (B-F).

    The dataset must hold the columns of `abpo.train.dataset.COLUMNS` plus `candidate_answers` (r(a) for each
    candidate, for e_old) and be read in order (`args.shuffle_dataset=False`: its row order is the stratified
    batch order). `reward_funcs` are fixed (`REWARD_FUNCS`).

    Its collaborators: ``answers`` and ``tries`` (abpo.train.answers), ``scorer`` (e_old and r_sc under the current
    policy, abpo.train.advantages.PolicyScorer). The state of the generation batch in flight lives in the
    ``_abpo_*`` attributes below: each is set by one TRL override and read by the next, in TRL's order
    (`_generate_and_score_completions` -> `_generate_single_turn` -> `_calculate_rewards` -> the advantages).
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
        check_trainer_settings(self.variant, settings, args, list(train_dataset.column_names))
        self.ratio_level = cast(RatioLevel, settings.ratio_level)  # one of RATIO_LEVELS (checked above)
        reward_funcs: list[Any] = list(REWARD_FUNCS)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        tokenizer: Any = self.processing_class  # a tokenizer (TRL's type also admits processors)
        self.answers = AnswerTokens(tokenizer)
        self.tries = AnswerTries(
            self.answers,
            eos_token_id=tokenizer.eos_token_id,
            constrained=settings.constrained_rollouts,
            max_completion_length=cast(int, self.max_completion_length),
            sc_positions=settings.self_certainty_positions,
        )
        self.scorer = PolicyScorer(
            self._unwrapped,
            settings,
            tokenizer,
            self.accelerator,
            self.answers,
            self.tries,
            batch_size=args.per_device_train_batch_size,
        )
        # the generation batch in flight (reset by `_generate_and_score_completions`)
        self._abpo_gen_inputs: list[dict] | None = None  # its dataset rows (constrained rollouts, r_sc positions)
        self._abpo_rollout_sc: list[float] | None = None  # r_sc of its rollouts, if recorded during generation
        # the next-token logits of its distinct prompts under pi_old, from the single-choice rollouts (e_old and the
        # anchors' r_sc read them: no optimizer step between the rollouts and the advantages)
        self._abpo_prompt_logits: PromptLogits | None = None
        self._abpo_rewards_per_func: torch.Tensor | None = None  # gathered [N_global, len(REWARD_FUNCS)]
        self._abpo_chosen_local: list[int] | None = None  # candidate index of each local rollout's answer (-1: none)
        self._abpo_anchor_coefs: AnchorCoefficients | None = None  # the logged items' own terms, when on
        # (r_sc, popularity, title tokens) of every scored no-response rollout of the update so far, for the
        # correlations abpo/r_sc_corr_popularity and abpo/r_sc_corr_title_len (reset by a resume: a new trainer)
        self._abpo_sc_trace: dict[str, list[float]] = {"r_sc": [], "popularity": [], "title_len": []}

    def _unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    def _mode(self) -> str:
        return "train" if self.model is not None and self.model.training else "eval"

    # ------------------------------------------------------------------------------ the collaborators, by name

    def _e_old(self, prompt_ids: list[int], answers, candidates, a_log: int) -> float:
        """e_old(a_log | q) of one logged example (abpo.train.advantages.PolicyScorer.e_old)."""
        return self.scorer.e_old([(CandidateSet(prompt_ids, answers, candidates), a_log)])[0]

    def _self_certainty(self, pairs: list[tuple[list[int], list[int]]], rows=None) -> list[float]:
        """r_sc of each (prompt ids, completion ids) (abpo.train.advantages.PolicyScorer.self_certainty)."""
        return self.scorer.self_certainty(pairs, rows)

    def _constrained_logps(
        self, model, input_ids, attention_mask, completion_ids, allowed, *, share_prompts=True, trim_forced=True
    ):
        """log q_theta and entropies under the candidate constraint (abpo.train.rollouts.constrained_logps)."""
        return constrained_logps(
            self.accelerator,
            model,
            input_ids,
            attention_mask,
            completion_ids,
            allowed,
            self.temperature,
            share_prompts=share_prompts,
            trim_forced=trim_forced,
        )

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

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        """Step 1, the rollouts: super() (TRL's generation), constrained to each row's candidates with
        policy.constrained_rollouts, and r_sc recorded from the generation logits when the variant needs it, both
        on the HF `generate` path (abpo.train.rollouts.generate_rollouts). With vLLM (or continuous batching) the
        logits never reach this process: the advantages run the forward for r_sc instead."""
        self._abpo_rollout_sc = None
        self._abpo_prompt_logits = None
        hf_generate = not self.use_vllm and not getattr(self, "use_transformers_continuous_batching", False)
        record = self.variant.self_certainty and hf_generate
        constrained = self.abpo.constrained_rollouts and hf_generate
        if not record and not constrained:
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
        rollouts = generate_rollouts(
            partial(super()._generate_single_turn, prompt_ids, *args, **kwargs),
            self._unwrapped(),
            prompt_ids,
            self._abpo_gen_inputs,
            self.tries,
            record_sc=record,
            constrained=constrained,
            temperature=self.temperature,
            greedy=_greedy(cast(GRPOConfig, self.args)),
            batch_tokens=self.abpo.scoring_batch_tokens,
        )
        self._abpo_rollout_sc = rollouts.self_certainty
        self._abpo_prompt_logits = rollouts.prompt_logits
        return rollouts.completion_ids, rollouts.logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """Step 2's r_fmt and r_match: super() (TRL's reward functions, gathered over processes: [N_global, 2]),
        kept, and the candidate each local rollout named (the diagnostics' Eq. G needs which one it chose)."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._abpo_rewards_per_func = rewards_per_func
        # a^j of this process's rollouts as an index into each row's candidates (-1: malformed), parsed as the
        # reward functions parse them
        cands = [list(x["candidates"]) for x in inputs]
        ids = chosen_items(_completion_texts(completions), cands).tolist()
        self._abpo_chosen_local = [c.index(a) if a in c else -1 for a, c in zip(ids, cands)]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        """super() (steps 1-2 through the overrides above), then the variant's advantages (steps 2-4) in place of
        TRL's, and the anchor terms' inputs on the rows when on."""
        self._abpo_rewards_per_func = None
        self._abpo_chosen_local = None
        self._abpo_rollout_sc = None
        self._abpo_prompt_logits = None
        self._abpo_gen_inputs = list(inputs)
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._abpo_gen_inputs = None
        if self.abpo.constrained_rollouts:
            self._attach_allowed_tokens(inputs, output)
        if self._abpo_rewards_per_func is None:
            raise RuntimeError(
                "ABPOTrainer: GRPOTrainer._generate_and_score_completions no longer calls _calculate_rewards; "
                "the TRL internals changed (see tests/train/test_trl_contract.py)"
            )
        t0 = time.perf_counter()
        mode = self._mode()
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        try:
            advantages, metrics = self._abpo_advantages(inputs, output, self._abpo_rewards_per_func, num_generations)
        finally:
            self._abpo_prompt_logits = None  # pi_old's: the loss's optimizer step makes them stale
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

    def _attach_allowed_tokens(self, inputs, output) -> None:
        """S_t of every completion position (constrained rollouts): the loss's log q_theta (Eq. q) travels with the
        rows through TRL's shuffle and split of the generation batch; the KL term's reference log-probs are
        recomputed under the same constraint."""
        from abpo.policy.constrained import allowed_tensor

        comps = [
            row[m.bool()].tolist() for row, m in zip(output["completion_ids"].cpu(), output["completion_mask"].cpu())
        ]
        allowed = allowed_tensor([self.tries.trie(x) for x in inputs], comps, output["completion_ids"].size(1))
        output["abpo_allowed"] = allowed.to(output["completion_ids"].device)
        if self.abpo.surrogate_weight == 0 and self._abpo_prompt_logits is not None:
            # the rollouts weigh 0 in the loss: their entropy (a loss metric) from the logits they were drawn from
            prompts = [r[m.bool()].tolist() for r, m in zip(output["prompt_ids"].cpu(), output["prompt_mask"].cpu())]
            entropy = choice_entropies(self._abpo_prompt_logits, prompts, allowed, self.temperature)
            if entropy is not None:
                output["abpo_rollout_entropy"] = entropy.to(output["completion_ids"].device)
        if "old_per_token_logps" in output:
            raise RuntimeError(
                "ABPOTrainer: TRL computed full-vocabulary old log-probs (misaligned steps or vLLM importance "
                "sampling), which constrained rollouts cannot use"
            )
        if output.get("ref_per_token_logps") is not None:
            output["ref_per_token_logps"] = constrained_ref_logps(
                self.accelerator, output, self.ref_model, self.model, self.temperature
            )

    def _abpo_advantages(self, inputs, output, rewards_per_func: torch.Tensor, k: int):
        """Advantages [N_local] of this process's rollouts for the variant, and the step's metrics: this process's
        records (abpo.train.advantages.local_records), gathered over processes, steps 2-4 over the whole generation
        batch (batch_advantages), then this process's slice, exactly as TRL slices its advantages."""
        local = local_records(
            LocalBatch.of(inputs, output),
            self.variant,
            self.abpo,
            self.scorer,
            chosen=self._abpo_chosen_local,
            recorded_sc=self._abpo_rollout_sc,
            item_popularity=self.item_popularity,
            prompt_logits=self._abpo_prompt_logits,
        )
        records: list[RolloutRecord] = gather_object(local)  # every process's, in TRL's gather order
        result = batch_advantages(
            self.variant,
            self.abpo,
            records,
            rewards_per_func,
            k,
            training=self._mode() == "train",
            global_step=self.state.global_step,
            sc_trace=self._abpo_sc_trace,
            with_popularity=self.item_popularity is not None,
        )
        self._abpo_anchor_coefs = result.anchor_coefs
        flat = result.advantages.reshape(-1)
        start = self.accelerator.process_index * len(inputs)  # TRL's process slice
        return flat[start : start + len(inputs)].clone(), result.metrics

    def _attach_anchor_rows(self, inputs, output) -> None:
        """The anchor terms' inputs on this process's rows of ``output`` (abpo.train.advantages.anchor_row_inputs)."""
        if self._abpo_anchor_coefs is None:
            raise RuntimeError("ABPOTrainer: the anchor terms' coefficients of this generation batch are missing")
        dev = output["completion_ids"].device
        rows = anchor_row_inputs(
            inputs,
            self._abpo_anchor_coefs,
            self.accelerator.process_index,
            self.answers,
            self.scorer.tokenizer,
            self.tries if self.abpo.constrained_rollouts else None,
        )
        output.update({key: value.to(dev) for key, value in rows.items()})

    # ------------------------------------------------------------------------------ step 5: the loss

    def _compute_loss(self, model, inputs):
        """Minus the objective of docs/ABPO_SPEC.md step 5 for this micro-batch, scaled for gradient accumulation:

            J = mean over rollouts of min(s A, clip(s, 1-eps_low, 1+eps_high) A)  [- beta KL]

        computed by `abpo.algo.surrogate.clipped_surrogate` with `update.ratio_level` (sequence: s = pi_theta(a|q) /
        pi_old(a|q), the spec's ratio). Every rollout weighs the same (1/(B(G-1)) over the generation batch: equal
        micro-batches, each a mean, divided by the accumulation steps), whatever its token count. The token
        log-probs are TRL's full-vocabulary ones, or those of the constrained policy q_theta with constrained
        rollouts (Eq. q of abpo.policy.constrained: the distribution the rollouts were sampled from). old = the
        detached current log-probs (one optimizer step per generation batch: s = 1 in value, its gradient is
        A grad log pi) unless TRL stored others. With the logged items' own terms on, minus J_LL + J_off too."""
        mask = inputs["completion_mask"]
        mask = mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]
        anchors = anchor_rows(inputs, self.abpo.constrained_rollouts) if self.abpo.anchor_terms else None
        rollouts_weigh_0 = self.abpo.surrogate_weight == 0 and self.beta == 0.0  # (the KL metric reads them)
        if rollouts_weigh_0 and anchors is not None and "abpo_rollout_entropy" in inputs:
            logps, entropies, anchor_logp = self._anchor_logps_only(model, inputs, anchors)
        else:
            logps, entropies, anchor_logp = self._token_logps(model, inputs, anchors)
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
            ratio_level=self.ratio_level,
            logp_ref=ref,
            beta=self.beta,
        )
        mode = self._mode()
        if self.abpo.surrogate_weight != 1.0:
            objective = self.abpo.surrogate_weight * objective  # update.surrogate_weight (0: the GRPO term off)
        loss = -objective / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)
        extra: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if anchors is not None and anchor_logp is not None:
            loss = loss - self._anchor_objective(inputs, anchors[0], anchor_logp, extra)
        self._log_loss_metrics(mode, logps, old, advantages, mask, entropies, objective, ref, extra)
        return loss

    def _token_logps(self, model, inputs, anchors):
        """(log-probs, entropies) [N, T] of the micro-batch's rollouts, and l_theta(a^log | q) of the anchor rows
        (None without ``anchors``): the logged items' answers ride in the same forward as the rollouts (one pass: a
        process group's wrapper sees one forward per backward), right-padded to a common completion length."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        allowed = inputs["abpo_allowed"] if self.abpo.constrained_rollouts else None
        if anchors is None:
            input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
            attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
            return (*self._completion_logps(model, input_ids, attention_mask, completion_ids, allowed), None)
        sel, a_ids, a_mask, a_allowed = anchors
        n, t = completion_ids.shape
        length = max(t, a_ids.size(1))
        pad = int(self.scorer.tokenizer.pad_token_id)
        comp_all = torch.cat([_pad_right(completion_ids, length, pad), _pad_right(a_ids, length, pad)])
        cmask_all = torch.cat([_pad_right(completion_mask, length, 0), _pad_right(a_mask, length, 0)])
        input_ids = torch.cat([torch.cat([prompt_ids, prompt_ids[sel]]), comp_all], dim=1)
        attention_mask = torch.cat([torch.cat([prompt_mask, prompt_mask[sel]]), cmask_all], dim=1)
        if allowed is not None:
            from abpo.policy.constrained import PAD_ALLOWED

            allowed = _pad_allowed([allowed, a_allowed], length, PAD_ALLOWED)
        logps_all, ent_all = self._completion_logps(model, input_ids, attention_mask, comp_all, allowed)
        a_m = a_mask.to(logps_all.dtype)
        anchor_logp = (torch.where(a_m > 0, logps_all[n:, : a_ids.size(1)], 0.0) * a_m).sum(-1)  # l_theta
        return logps_all[:n, :t], ent_all[:n, :t], anchor_logp

    def _anchor_logps_only(self, model, inputs, anchors):
        """:meth:`_token_logps` when the rollouts weigh 0 in the loss (update.surrogate_weight = 0, variant wll, and
        no KL term, whose logged value reads their log-probs) and their entropy came with the generation (``abpo_rollout_entropy``: single-choice rollouts, the constrained
        choice's entropy under this same pi_old): only the anchor rows run through the model, so the decoder sees
        the prompts with a likelihood or off-policy term alone. The rollouts get log-probs 0 (a ratio of 1, as
        old = the detached current log-probs gives: nothing clipped) and their entropy at the choice position; the
        loss, its gradients and its metrics are those of :meth:`_token_logps` (tests/train/test_update_variants.py)."""
        sel, a_ids, a_mask, a_allowed = anchors
        input_ids = torch.cat([inputs["prompt_ids"][sel], a_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"][sel], a_mask], dim=1)
        a_logps, _ = self._completion_logps(model, input_ids, attention_mask, a_ids, a_allowed)
        a_m = a_mask.to(a_logps.dtype)
        anchor_logp = (torch.where(a_m > 0, a_logps, 0.0) * a_m).sum(-1)  # l_theta(a^log | q)
        logps = torch.zeros(inputs["completion_ids"].shape, dtype=a_logps.dtype, device=a_logps.device)
        entropies = logps.clone()
        entropies[:, 0] = inputs["abpo_rollout_entropy"].to(entropies.dtype)  # forced positions: 0 (Eq. q)
        return logps, entropies, anchor_logp

    def _completion_logps(self, model, input_ids, attention_mask, completion_ids, allowed):
        """(log-probs, entropies) of the completion tokens: of the constrained policy q_theta when ``allowed`` is
        given (Eq. q), else TRL's full-vocabulary ones."""
        if allowed is not None:
            return self._constrained_logps(model, input_ids, attention_mask, completion_ids, allowed)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        return logps, entropies

    def _anchor_objective(self, inputs, sel, anchor_logp, extra: dict) -> torch.Tensor:
        """J_LL + J_off of the micro-batch's anchor rows ``sel`` (Eqs. L1, O3 of docs/update-variants.md), times the
        processes (the coefficients are normalised over the whole generation batch, 1/B, so the micro-batches' terms
        add up to J_LL and J_off; a process group averages gradients); their metrics' sums go to ``extra``."""
        from abpo.algo.anchor_terms import offpolicy_anchor_surrogate, weighted_log_likelihood

        ll_c, off_c = inputs["abpo_anchor_ll_coef"][sel], inputs["abpo_anchor_off_coef"][sel]
        j_anchor = weighted_log_likelihood(anchor_logp, ll_c) + offpolicy_anchor_surrogate(
            anchor_logp,
            anchor_logp.detach(),  # pi_old = the policy of this step (one optimizer step per generation batch)
            inputs["abpo_anchor_log_e0"][sel],
            off_c,
            (self.epsilon_low, self.epsilon_high),
            self.abpo.offpolicy_gamma,
        )
        with torch.no_grad():
            k = torch.tensor(float(sel.numel()))
            extra["abpo/anchor/logp_mean"] = (anchor_logp.detach().sum(), k)  # mean l_theta(a^log | q)
            rho = torch.exp(anchor_logp.detach() - inputs["abpo_anchor_log_e0"][sel].to(anchor_logp.dtype))
            extra["abpo/anchor/rho_mean"] = (rho.sum(), k)  # mean pi_theta(a^log) / e0(a^log)
        return j_anchor * self.accelerator.num_processes

    @torch.no_grad()
    def _log_loss_metrics(self, mode, logps, old, advantages, mask, entropies, objective, ref, extra) -> None:
        """The loss's metrics (TRL's names where they mean the same), reduced over the processes before they are
        logged (sums and counts, so a multi-process step logs the values one process would log for the whole
        batch): the clipped share, the entropy, the objective, the anchors' ``extra`` and the KL term's value."""
        m = mask.to(logps.dtype)
        if self.ratio_level == "token":
            ratio, adv, w = torch.exp((logps - old) * m), advantages[:, None].expand_as(logps), m
        else:
            ratio, adv = torch.exp(sequence_log_ratio(logps, old, m, self.ratio_level)), advantages
            w = torch.ones_like(ratio)
        clipped = ((ratio < 1 - self.epsilon_low) & (adv < 0)) | ((ratio > 1 + self.epsilon_high) & (adv > 0))
        parts = {  # [numerator, denominator] per metric
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
