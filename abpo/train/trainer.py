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
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from abpo.algo.rewards import (
    anchor_reward,
    chosen_items,
    format_reward as format_reward_tensor,
    match_reward as match_reward_tensor,
    self_certainty,
    self_certainty_from_token_kl,
    token_kl_from_uniform,
    total_reward,
)
from abpo.algo.snips import effective_sample_size, snips_weight, stratified_self_normalise, weight_summary
from abpo.algo.surrogate import clipped_surrogate
from abpo.algo.variants import Variant, get_variant, rollout_advantages

TESTED_TRL = (">=1.16", "<1.17")
ALLOWED_LOSS_TYPES = frozenset({"grpo"})
RATIO_LEVELS = frozenset({"sequence", "geometric", "token"})
SC_POSITIONS = frozenset({"choice", "answer"})


# ----------------------------------------------------------------------------------------- reward functions
# TRL calls each with prompts, completions, completion_ids and every dataset column as keyword lists.


def _completion_texts(completions: Sequence[Any]) -> list[str]:
    """Conversational completions ([{"role": "assistant", "content": ...}]) or plain strings -> texts."""
    out = []
    for c in completions:
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list) and c and isinstance(c[-1], dict):
            out.append(str(c[-1].get("content") or ""))
        else:
            raise TypeError(f"abpo.train: unexpected completion type {type(c).__name__} from TRL")
    return out


def format_reward(prompts, completions, candidates, **kwargs) -> list[float]:
    """r_fmt per rollout (docs/ABPO_SPEC.md step 2) as a TRL reward function."""
    return format_reward_tensor(_completion_texts(completions), candidates).tolist()


def match_reward(prompts, completions, candidates, a_log, y, **kwargs) -> list[float]:
    """r_match per rollout (docs/ABPO_SPEC.md step 2: +1[a = a_log] if y = 1, -1[a = a_log] if y = 0) as a TRL
    reward function. Each row is one rollout, so a_log / y are broadcast per row ([N] with one column)."""
    chosen = chosen_items(_completion_texts(completions), candidates)  # [N], -1 for malformed
    logged = torch.tensor([int(a) for a in a_log], dtype=torch.int64)
    fb = torch.tensor([int(v) for v in y], dtype=torch.int64)
    return match_reward_tensor(chosen[:, None], logged, fb)[:, 0].tolist()


REWARD_FUNCS = [format_reward, match_reward]  # order = columns of rewards_per_func: 0 r_fmt, 1 r_match


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


# ------------------------------------------------------------------------------------------------ settings


@dataclass
class ABPOSettings:
    """The ABPO knobs the trainer needs on top of GRPOConfig (see abpo.train.config.UpdateConfig)."""

    variant: str = "abpo"
    delta: float = 1e-6
    eps_std: float = 1e-4
    lambda_sc: float = 0.1
    tau: float = 1.0  # policy.tau: the same temperature as the logging policy's e0
    w_max: float = 0.0  # optional cap on raw w (0 = none, the spec)
    scoring_batch_tokens: int = 16384  # policy.scoring_batch_tokens
    constrained_rollouts: bool = False  # policy.constrained_rollouts: rollouts only name candidates (Eq. q)
    ratio_level: str = "sequence"  # update.ratio_level: how s_i^j of step 5 is formed
    grpo_equal_samples: bool = False  # update.grpo_equal_samples: (B) samples G-1 rollouts like C-F
    prompt_style: str = "text"  # policy.prompt_style: item_tokens scores e_old on the item token (abpo.policy.scoring)
    self_certainty_positions: str = "choice"  # update.self_certainty_positions: the tokens r_sc averages over


def rollouts_per_example(variant: Variant | str, group_size: int, *, equal_samples: bool = False) -> int:
    """TRL num_generations: G - 1 sampled rollouts for anchored variants (the anchor a^1 = a^log is not sampled),
    G for vanilla GRPO (B), or G - 1 for B too when ``equal_samples`` (update.grpo_equal_samples: B and F then
    sample the same number of completions per logged example)."""
    v = get_variant(variant) if isinstance(variant, str) else variant
    k = group_size - 1 if (v.anchor or equal_samples) else group_size
    if k < 2:
        raise ValueError(
            f"update.group_size={group_size}: variant {v.letter} ({v.name}) would sample {k} rollout(s); "
            "rule: at least 2 rollouts per logged example (TRL needs num_generations >= 2)"
        )
    return k


# ------------------------------------------------------------------------------------------------- trainer


class ABPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages follow docs/ABPO_SPEC.md steps 2-4 for `settings.variant` (B-F).

    The dataset must hold the columns of `abpo.train.dataset.COLUMNS` plus `candidate_answers` (r(a) for each
    candidate, for e_old) and be read in order (`args.shuffle_dataset=False`: its row order is the stratified
    batch order). `reward_funcs` are fixed (`REWARD_FUNCS`).
    """

    _tag_names = ["trl", "grpo", "abpo"]

    def __init__(self, model, args: GRPOConfig, *, settings: ABPOSettings, train_dataset, processing_class,
                 item_popularity: dict[int, int] | None = None, **kwargs):
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
        missing = [c for c in ("candidates", "a_log", "y", "e0", "anchor_text", "request_id", "candidate_answers")
                   if c not in train_dataset.column_names]
        if missing:
            raise ValueError(f"ABPOTrainer: train_dataset lacks column(s) {missing}")
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

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        """super() (TRL's rollout generation), with two additions on the HF `generate` path:

        - constrained rollouts (policy.constrained_rollouts): a `CandidateConstraint` logits processor is passed to
          `generate`, so row r only continues a well-formed answer of its own candidate set (abpo.policy.constrained,
          Eq. q); the rows are the generation batch's dataset rows (`_abpo_gen_inputs`, set by
          `_generate_and_score_completions`), one candidate set per row, so per-example sets work in one batch;
        - self-certainty on the way, when the variant needs it: a forward hook on the LM head keeps KL(U || p_t) of
          every decoding step's next-token logits (the full-vocabulary pi_theta = pi_old distribution token t is
          drawn from), so r_sc of the rollouts costs no extra forward pass over prompt + completion. With vLLM (or
          continuous batching) the logits never reach this process: `_self_certainty` runs the forward instead."""
        self._abpo_rollout_sc = None
        hf_generate = not self.use_vllm and not getattr(self, "use_transformers_continuous_batching", False)
        record = self.variant.self_certainty and hf_generate
        constraint = self._rollout_constraint(len(prompt_ids)) if self.abpo.constrained_rollouts and hf_generate else None
        if constraint is not None and all(t is not None and t.single_choice for t in constraint.tries):
            # its logits cover the choice position only: r_sc over the whole answer is left to `_self_certainty`
            choice_only = self.abpo.self_certainty_positions == "choice"
            return self._single_choice_rollouts(prompt_ids, constraint.tries, record and choice_only)
        if not record and constraint is None:
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
        model = self._unwrapped()
        steps: list[torch.Tensor] = []

        def keep_token_kl(module, inputs, output):
            logits = output[0] if isinstance(output, tuple) else output
            steps.append(token_kl_from_uniform(logits[:, -1, :].detach()).cpu())  # [B]: KL(U || p_t), step t

        handle = model.get_output_embeddings().register_forward_hook(keep_token_kl) if record else None
        if constraint is not None:
            from transformers import LogitsProcessorList

            generate = model.generate  # TRL calls `unwrapped_model.generate(...)` on this same object

            def constrained_generate(*a, **kw):
                processors = LogitsProcessorList(kw.pop("logits_processor", None) or [])
                processors.append(constraint)
                return generate(*a, logits_processor=processors, **kw)

            model.generate = constrained_generate
        try:
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        finally:
            if handle is not None:
                handle.remove()
            if constraint is not None:
                del model.generate  # the class's generate again
        if record:
            lengths = [len(c) for c in completion_ids]
            if steps and all(s.shape == (len(prompt_ids),) for s in steps) and max(lengths, default=0) <= len(steps):
                kl = torch.stack(steps, dim=1)  # [B, S]: column t = the logits completion token t was sampled from
                mask = torch.zeros_like(kl, dtype=torch.long)  # r_sc over update.self_certainty_positions
                for r, (row, c) in enumerate(zip(self._abpo_gen_inputs or [], completion_ids)):
                    m = self._sc_mask(row, c)
                    mask[r, : len(m)] = torch.tensor(m, dtype=torch.long)
                if self._abpo_gen_inputs is not None and len(self._abpo_gen_inputs) == len(completion_ids):
                    self._abpo_rollout_sc = self_certainty_from_token_kl(kl, mask).tolist()
            # otherwise (an unexpected call pattern of generate): _abpo_advantages falls back to a forward pass
        return completion_ids, logprobs

    def _single_choice_rollouts(self, prompt_ids, tries, record: bool):
        """Constrained rollouts when every candidate set branches at its first token only (one token per item id):
        one forward over the prompts, the item token drawn from Eq. q at ``temperature``, then its forced tail
        (abpo.policy.constrained.sample_single_choice): the distribution HF ``generate`` with the candidate
        constraint samples from, without a decoding step per forced title token. Self-certainty (when the variant
        needs it) is KL(U || pi_theta(.|q)) at that one choice position, from the same logits."""
        from abpo.policy.constrained import sample_single_choice

        # greedy rollouts (GRPOConfig.generation_kwargs do_sample=False, as HF generate reads it): the argmax of
        # Eq. q, drawn from the one-hot limit of its softmax
        greedy = (self.args.generation_kwargs or {}).get("do_sample", True) is False
        completion_ids, logits = sample_single_choice(
            self._unwrapped(), prompt_ids, tries, 1e-6 if greedy else self.temperature,
            batch_tokens=self.abpo.scoring_batch_tokens,
        )
        if record:
            self._abpo_rollout_sc = token_kl_from_uniform(logits).tolist()
        return completion_ids, None

    # ------------------------------------------------------------------------------ constrained rollouts

    def _trie(self, row: dict):
        """The answer trie of one dataset row's candidate set (cached per logged example): the constraint of
        constrained rollouts, and where the answers branch (the choice positions of self-certainty)."""
        from abpo.policy.constrained import AnswerTrie

        key = str(row["request_id"])
        trie = self._trie_cache.get(key)
        if trie is None:
            if len(self._trie_cache) > 20_000:
                self._trie_cache.clear()
            answers = [self._answer_ids(a) for a in row["candidate_answers"]]
            longest = max(len(a) for a in answers) + 1  # + EOS
            if self.abpo.constrained_rollouts and longest > self.max_completion_length:
                raise ValueError(
                    f"logged example {key}: its longest candidate answer takes {longest} tokens with EOS, over "
                    f"update.max_completion_length={self.max_completion_length}; rule: with constrained rollouts every "
                    "candidate's answer must fit (a cut answer gets no format reward): raise the limit"
                )
            trie = AnswerTrie(answers, self.processing_class.eos_token_id)
            self._trie_cache[key] = trie
        return trie

    def _sc_mask(self, row: dict, completion: Sequence[int]) -> list[int]:
        """The tokens r_sc of docs/ABPO_SPEC.md step 2 averages over, per update.self_certainty_positions:
        ``choice`` (default): where the row's candidate answers branch (``AnswerTrie.choice_mask``: the item token of
        an item-token model, the id tokens of a text model); ``answer``: every token of the completion (choice
        token, title tokens, EOS), the paper's (1/T) sum over t = 1..T."""
        if self.abpo.self_certainty_positions == "answer":
            return [1] * len(completion)
        return self._trie(row).choice_mask(completion)

    def _rollout_constraint(self, n_rows: int):
        from abpo.policy.constrained import CandidateConstraint

        rows = self._abpo_gen_inputs
        if rows is None or len(rows) != n_rows:
            raise RuntimeError(
                f"ABPOTrainer: {n_rows} prompts to generate for but {0 if rows is None else len(rows)} dataset rows; "
                "the TRL internals changed (see tests/train/test_trl_contract.py)"
            )
        return CandidateConstraint([self._trie(r) for r in rows])

    def _constrained_logps(self, model, input_ids, attention_mask, completion_ids, allowed, *, share_prompts: bool = True):
        """log q_theta of every completion token under the candidate constraint (Eq. q of abpo.policy.constrained)
        and the constrained steps' entropies, ``[N, T]`` each: the decoder's hidden states, then only the
        branching positions projected on their allowed tokens' rows of the LM head.

        ``share_prompts``: each distinct prompt of the micro-batch runs through the decoder once (a logged example's
        G-1 rollouts share it), its key/value cache is gathered per rollout and the completions run on top of it;
        gradients flow through the shared prompt pass. The same positions, masks and weights as one forward per row
        (``share_prompts=False``, the reference it is tested against), at about 1/(G-1) of the prompt's cost."""
        from abpo.policy.constrained import constrained_token_logps

        unwrapped = self.accelerator.unwrap_model(model)
        if model is not unwrapped and torch.is_grad_enabled():
            # through the wrapper (DDP, DeepSpeed engine): its forward calls the module's, here this very
            # computation, so the wrapper sees the forward it reduces gradients for (DDP's prepare_for_backward,
            # ZeRO's hooks) exactly as for TRL's full-vocabulary log-probs
            def forward(*_a, **_k):
                return self._constrained_logps(
                    unwrapped, input_ids, attention_mask, completion_ids, allowed, share_prompts=share_prompts
                )

            unwrapped.forward = forward
            try:
                return model()
            finally:
                del unwrapped.forward  # the class's forward again
        base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
        decoder = base.get_decoder()
        t = completion_ids.size(1)
        p = input_ids.size(1) - t
        with self.accelerator.autocast():
            if not share_prompts:
                hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
                hidden = hidden[:, p - 1 : p + t - 1]
            else:
                prompts = torch.cat([input_ids[:, :p], attention_mask[:, :p]], dim=1)
                uniq, inverse = torch.unique(prompts, dim=0, return_inverse=True)
                out = decoder(input_ids=uniq[:, :p], attention_mask=uniq[:, p:], use_cache=True)
                cache = out.past_key_values
                cache.batch_select_indices(inverse)  # [U] prompt caches -> one per rollout (differentiable gather)
                last = out.last_hidden_state[inverse, -1:]  # predicts completion token 0
                rest = decoder(
                    input_ids=completion_ids[:, :-1], attention_mask=attention_mask[:, :-1], past_key_values=cache,
                    use_cache=True,
                ).last_hidden_state if t > 1 else last[:, :0]
                hidden = torch.cat([last, rest], dim=1)  # position t predicts completion token t
        return constrained_token_logps(
            hidden, base.get_output_embeddings(), completion_ids, allowed.to(hidden.device), self.temperature
        )

    def _constrained_ref_logps(self, output) -> torch.Tensor:
        """log q_ref of the rollouts (the optional KL term with constrained rollouts): TRL's ref log-probs are over the
        full vocabulary, so they are recomputed under the same constraint with the reference policy."""
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        args = (input_ids, attention_mask, output["completion_ids"], output["abpo_allowed"])
        with torch.no_grad():
            if self.ref_model is not None:
                return self._constrained_logps(self.ref_model, *args)[0]
            with self._unwrapped().disable_adapter():  # PEFT: the reference is the model without the adapter
                return self._constrained_logps(self.model, *args)[0]

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

            comps = [row[m.bool()].tolist() for row, m in zip(output["completion_ids"].cpu(), output["completion_mask"].cpu())]
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
        from abpo.algo.surrogate import sequence_log_ratio

        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        if self.abpo.constrained_rollouts:
            logps, entropies = self._constrained_logps(model, input_ids, attention_mask, completion_ids, inputs["abpo_allowed"])
        else:
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
            )
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        advantages = inputs["advantages"]
        ref = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        objective = clipped_surrogate(
            logps, old, advantages, mask, (self.epsilon_low, self.epsilon_high),
            ratio_level=self.abpo.ratio_level, logp_ref=ref, beta=self.beta,
        )
        mode = "train" if self.model.training else "eval"
        loss = -objective / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)

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
            if ref is not None:  # the KL term's value: mean over rollouts of kl_k3 (TRL's metric name)
                from abpo.algo.surrogate import kl_k3

                kl = kl_k3(logps.detach(), ref.detach(), mask)
                parts["kl"] = (kl.sum(), torch.tensor(float(kl.numel())))
            local = torch.stack([torch.stack([a.float().reshape(()), b.float().to(a.device).reshape(())])
                                 for a, b in parts.values()])  # [metrics, 2]
            total = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").cpu()
            for (name, _), (num, den) in zip(parts.items(), total.tolist(), strict=True):
                self._metrics[mode][name].append(num / den if name == "abpo/objective" else num / max(den, 1.0))
        return loss

    # ------------------------------------------------------------------------------ the ABPO terms

    def _title_tokens(self, answer: str) -> int:
        """Token count of the title inside a candidate answer ``<item_id>ID</item_id><item>TITLE</item>``."""
        n = self._title_len_cache.get(answer)
        if n is None:
            from abpo.policy.prompt import ITEM_CLOSE, ITEM_OPEN

            start = answer.find(ITEM_OPEN)
            end = answer.rfind(ITEM_CLOSE)
            title = answer[start + len(ITEM_OPEN) : end] if 0 <= start < end else answer
            n = len(self.processing_class(title, add_special_tokens=False)["input_ids"])
            if len(self._title_len_cache) < 200_000:
                self._title_len_cache[answer] = n
        return n

    def _diagnostics(self, groups, y, r_match, r_fmt, r_roll, r_sc, adv) -> dict[str, float]:
        """The per-step diagnostics of docs/diagnostics.md (abpo.algo.diagnostics), for every variant B-F, on the
        step's gathered groups (rows: the tuples of `_abpo_advantages`), without any extra forward or backward pass:

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
          no-response rollout of the update so far (the last step's value covers the whole update).
        A diagnostic that is undefined at a step (NaN) is left out of that step's metrics."""
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

        v, st = self.variant, self.abpo
        b, k = r_roll.shape
        out: dict[str, float] = {}
        e0 = torch.tensor([grp[0][2] for grp in groups], dtype=torch.float64)
        e_old = torch.tensor([grp[0][4] for grp in groups], dtype=torch.float64)
        ws = weight_summary(snips_weight(e_old, e0))
        out.update({f"abpo/w_{name}": ws[name] for name in ("p50", "p90", "p99", "max", "ess", "ess_share")})
        out["abpo/zero_spread_share"] = zero_spread_share(r_roll)

        adv_grpo = adv if not v.anchor else group_advantages(total_reward(r_match, r_fmt, None, y, 0.0), st.eps_std)
        chosen = torch.tensor([[r[6] for r in grp] for grp in groups], dtype=torch.int64)  # [B, K]
        g_var, g_grpo, push_var, push_grpo = [], [], [], []
        # the policy's candidate distribution is recorded once per request in the batch (its first row): a request
        # drawn twice into one generation batch (batch planning may repeat a row of the smaller stratum) has two
        # groups and one record, shared since they have the same prompt
        pi_of = {r[0]: r[7] for grp in groups for r in grp if r[7] is not None}
        for i, grp in enumerate(groups):
            if grp[0][0] not in pi_of:
                continue
            pi = torch.tensor(pi_of[grp[0][0]], dtype=torch.float64)
            g_var.append(logit_gradient(pi, chosen[i], adv[i]))
            g_grpo.append(logit_gradient(pi, chosen[i], adv_grpo[i]))
            push_var.append(log_odds_push(chosen[i], adv[i], grp[0][8]))
            push_grpo.append(log_odds_push(chosen[i], adv_grpo[i], grp[0][8]))
        out["abpo/gamma_ratio"] = gamma_ratio(push_var, push_grpo)
        out["abpo/grad_cosine_vs_grpo"] = gradient_cosine(g_var, g_grpo)

        if r_sc is not None:
            neg = y == 0
            if bool(neg.any()):
                out["abpo/r_sc_group_std"] = group_std_mean(r_sc[neg])
            trace = self._abpo_sc_trace
            for grp in groups if self.model.training else []:  # the update's rollouts only, not an evaluation's
                for r in grp:
                    if r[1] == 0 and r[6] >= 0:
                        trace["r_sc"].append(r[3])
                        trace["popularity"].append(r[9])
                        trace["title_len"].append(r[10])
            out["abpo/r_sc_corr_title_len"] = rank_correlation(trace["r_sc"], trace["title_len"])
            if self.item_popularity is not None:
                out["abpo/r_sc_corr_popularity"] = rank_correlation(trace["r_sc"], trace["popularity"])
        return {key: val for key, val in out.items() if math.isfinite(val)}

    def _answer_ids(self, text: str) -> list[int]:
        from abpo.policy.prompt import encode_answer

        ids = self._answer_ids_cache.get(text)
        if ids is None:
            ids = encode_answer(self.processing_class, text)
            if len(self._answer_ids_cache) < 200_000:
                self._answer_ids_cache[text] = ids
        return ids

    def _unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    @torch.no_grad()
    def _e_old(self, prompt_ids: list[int], answers: Sequence[str], candidates: Sequence[int], a_log: int) -> float:
        """e_old(a_log | q) of one logged example (see `_e_old_batch`)."""
        return self._e_old_batch([(prompt_ids, answers, candidates, a_log)])[0]

    @torch.no_grad()
    def _e_old_batch(self, items: Sequence[tuple[list[int], Sequence[str], Sequence[int], int]]) -> list[float]:
        """e_old(a_log | q) = softmax_C(s_old / tau)[a_log] (docs/ABPO_SPEC.md "Propensities", step 3) under the rollout
        policy pi_old for every (prompt ids, candidate answers, candidates, a_log), scored together by the policy
        helper's batched scorer (``score_prompt_ids``) over each example's whole candidate set, with the s_p e0 was
        logged with (ABPOSettings carries prompt_style and scoring_batch_tokens): the item token's log-prob, or the
        mean over each answer's (cached) token ids."""
        dists = self._e_old_dists([(p, ans, cands) for p, ans, cands, _ in items])
        return [float(e[list(cands).index(a_log)]) for e, (_, _, cands, a_log) in zip(dists, items, strict=True)]

    @torch.no_grad()
    def _e_old_dists(self, items: Sequence[tuple[list[int], Sequence[str], Sequence[int]]]) -> list[torch.Tensor]:
        """e_old(. | q) = softmax_C(s_old / tau) over each example's whole candidate set C (docs/ABPO_SPEC.md
        "Propensities"), [|C|] per (prompt ids, candidate answers, candidates), in the candidates' order: the SNIPS
        weight's numerator (step 3) and pi of the diagnostics' Eq. G (abpo.algo.diagnostics)."""
        from abpo.policy.scoring import candidate_propensities, score_prompt_ids, scores_on_choice

        if not items:
            return []
        answer_ids = None if scores_on_choice(self.abpo) else [[self._answer_ids(a) for a in ans] for _, ans, _ in items]
        scores = score_prompt_ids(
            self._unwrapped(), self.processing_class, [p for p, _, _ in items], [list(c) for _, _, c in items],
            answer_ids, self.abpo,
        )
        return [candidate_propensities(s, self.abpo.tau).detach().cpu() for s in scores]

    @torch.no_grad()
    def _self_certainty(self, pairs: list[tuple[list[int], list[int]]], rows: Sequence[dict] | None = None) -> list[float]:
        """r_sc = mean over the positions t of update.self_certainty_positions of KL(U || pi_theta(. | q, a_<t))
        (docs/ABPO_SPEC.md step 2) of each (prompt ids, completion ids) under the current policy, in chunks of the
        per-device batch.

        The spec averages over all T tokens of the completion (``answer``). By default (``choice``) only the tokens
        that carry a choice count (``AnswerTrie.choice_mask`` of the row's candidate set, ``rows[i]``; see
        `_sc_mask`): the tokens forced by the chosen item (for item-token models, everything after the item token;
        for text models, the title once the id is fixed) would measure how confidently the model copies a title,
        which says nothing about the choice. For an item-token model r_sc is then KL(U || pi_theta(.|q)) at the item
        token, the same for every rollout of a group. Without ``rows`` every token counts.
        Prompts are left-padded and completions right-padded, with position ids from the attention mask (padding
        changes no position)."""
        if not pairs:
            return []
        model = self._unwrapped()
        device = self.accelerator.device
        pad = self.processing_class.pad_token_id
        chunk = max(1, self.args.per_device_train_batch_size)
        out: list[float] = []
        was_training = model.training
        model.eval()
        try:
            for s in range(0, len(pairs), chunk):
                part = pairs[s : s + chunk]
                P = max(len(p) for p, _ in part)
                C = max(max(len(c) for _, c in part), 1)
                ids = torch.full((len(part), P + C), pad, dtype=torch.long)
                attn = torch.zeros((len(part), P + C), dtype=torch.long)
                cmask = torch.zeros((len(part), C), dtype=torch.long)
                for r, (p, c) in enumerate(part):
                    ids[r, P - len(p) : P] = torch.tensor(p)
                    attn[r, P - len(p) : P] = 1
                    if c:
                        ids[r, P : P + len(c)] = torch.tensor(c)
                        attn[r, P : P + len(c)] = 1
                        row = rows[s + r] if rows is not None else None
                        cm = self._sc_mask(row, c) if row is not None else [1] * len(c)
                        cmask[r, : len(c)] = torch.tensor(cm, dtype=torch.long)
                pos = (attn.cumsum(-1) - 1).clamp(min=0)
                with self.accelerator.autocast():
                    logits = model(
                        input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=pos.to(device),
                        logits_to_keep=C + 1, use_cache=False,
                    ).logits
                # logits[:, t] predicts completion token t (positions P-1 .. P+C-2)
                out += self_certainty(logits[:, :C].float(), cmask.to(device)).cpu().tolist()
        finally:
            model.train(was_training)
        return out

    def _abpo_advantages(self, inputs, output, rewards_per_func: torch.Tensor, k: int):
        """Advantages [N_local] of this process's rollouts for the variant, and the step's metrics."""
        v, st = self.variant, self.abpo
        n_local = len(inputs)
        prompt_ids = [row[m.bool()].tolist() for row, m in zip(output["prompt_ids"].cpu(), output["prompt_mask"].cpu())]
        comp_ids = [row[m.bool()].tolist() for row, m in zip(output["completion_ids"].cpu(), output["completion_mask"].cpu())]
        y_local = [int(x["y"]) for x in inputs]

        # Self-certainty of the rollouts of no-response rows (step 2); 0 elsewhere (never enters their reward).
        r_sc_local = [0.0] * n_local
        if v.self_certainty:
            rows = [i for i in range(n_local) if y_local[i] == 0]
            recorded = getattr(self, "_abpo_rollout_sc", None)  # from the generation logits (HF generate)
            if recorded is not None and len(recorded) == n_local:
                vals = [recorded[i] for i in rows]
            else:
                vals = self._self_certainty([(prompt_ids[i], comp_ids[i]) for i in rows], [inputs[i] for i in rows])
            for i, val in zip(rows, vals):
                r_sc_local[i] = val

        # Per logged example (once per process even when its rows repeat here): e_old and the anchor's r_sc.
        first_row: dict[str, int] = {}
        for i, x in enumerate(inputs):
            first_row.setdefault(str(x["request_id"]), i)
        # e_old(.|q) over C for every variant: the SNIPS weight of D and F, and the diagnostics of all (B included)
        todo = list(first_row.items())
        dists = self._e_old_dists([(prompt_ids[i], inputs[i]["candidate_answers"], inputs[i]["candidates"]) for _, i in todo])
        pi_ex = {rid: d for (rid, _), d in zip(todo, dists)}
        e_old_ex = {
            rid: float(d[list(inputs[i]["candidates"]).index(int(inputs[i]["a_log"]))])
            for (rid, i), d in zip(todo, dists)
        }
        sc_log_ex: dict[str, float] = {}
        if v.anchor and v.self_certainty:
            eos = self.processing_class.eos_token_id  # what SFT appends after an answer (abpo.policy.sft)
            todo = [(rid, i) for rid, i in first_row.items() if y_local[i] == 0]
            pairs = [(prompt_ids[i], self._answer_ids(inputs[i]["anchor_text"]) + [eos]) for _, i in todo]
            for (rid, _), val in zip(todo, self._self_certainty(pairs, [inputs[i] for _, i in todo])):
                sc_log_ex[rid] = val

        chosen_local = self._abpo_chosen_local
        if chosen_local is None or len(chosen_local) != n_local:
            raise RuntimeError(
                "ABPOTrainer: the rollouts' chosen candidates were not recorded by _calculate_rewards; the TRL internals "
                "changed (see tests/train/test_trl_contract.py)"
            )
        sc_item = [(math.nan, math.nan)] * n_local  # (popularity, title tokens) of the item a scored rollout chose
        if v.self_certainty:
            for i, x in enumerate(inputs):
                if y_local[i] == 0 and chosen_local[i] >= 0:
                    item = int(x["candidates"][chosen_local[i]])
                    pop = float(self.item_popularity.get(item, 0)) if self.item_popularity is not None else math.nan
                    sc_item[i] = (pop, float(self._title_tokens(x["candidate_answers"][chosen_local[i]])))
        local = [
            (
                str(x["request_id"]), y_local[i], float(x["e0"]), r_sc_local[i],
                e_old_ex.get(str(x["request_id"]), math.nan), sc_log_ex.get(str(x["request_id"]), 0.0),
                chosen_local[i],
                pi_ex[str(x["request_id"])].tolist() if first_row[str(x["request_id"])] == i else None,
                list(x["candidates"]).index(int(x["a_log"])), *sc_item[i],
            )
            for i, x in enumerate(inputs)
        ]
        rows = gather_object(local)  # every process's rows, in TRL's gather order (rewards_per_func's order)
        n = len(rows)
        if rewards_per_func.shape[0] != n or n % k:
            raise RuntimeError(
                f"ABPOTrainer: {rewards_per_func.shape[0]} gathered rewards for {n} gathered rows, group size {k}; "
                "the TRL internals changed (see tests/train/test_trl_contract.py)"
            )
        b = n // k
        groups = [rows[g * k : (g + 1) * k] for g in range(b)]
        for g, grp in enumerate(groups):
            if len({r[0] for r in grp}) != 1:
                raise RuntimeError(
                    f"ABPOTrainer: group {g} of the generation batch mixes logged examples {sorted({r[0] for r in grp})}; "
                    "rule: TRL's sampler keeps one example's num_generations rollouts together"
                )
        y = torch.tensor([grp[0][1] for grp in groups], dtype=torch.int64)  # [B]
        if self.model.training and not ((y == 1).any() and (y == 0).any()):
            raise RuntimeError(
                f"ABPOTrainer: the generation batch of optimizer step {self.state.global_step + 1} holds only y = "
                f"{int(y[0])} rows; rule: every SNIPS mini-batch holds both positive and no-response rows (docs/ABPO_SPEC.md "
                "step 3: w_hat is self-normalised inside B_1 and B_0). The batches of abpo.train.dataset are built "
                "so; a batch without one stratum means the dataset was not built by update_dataset_from_strata"
            )
        rpf = rewards_per_func.detach().float().cpu()
        r_fmt = rpf[:, 0].view(b, k)
        r_match = rpf[:, 1].view(b, k)
        lam = v.effective_lambda_sc(st.lambda_sc)
        r_sc = torch.tensor([r[3] for r in rows], dtype=torch.float32).view(b, k) if v.self_certainty else None
        r_roll = total_reward(r_match, r_fmt, r_sc, y, lam)  # [B, K] step 2

        metrics: dict[str, float] = {}
        r_log = w = None
        if v.anchor:
            sc_log = torch.tensor([grp[0][5] for grp in groups], dtype=torch.float32) if v.self_certainty else None
            r_log = anchor_reward(y, sc_log, lam)  # [B] step 2, last bullet
            metrics["abpo/reward/anchor_mean"] = r_log.mean().item()
        if v.anchor and v.snips:
            e0 = torch.tensor([grp[0][2] for grp in groups], dtype=torch.float64)
            e_old = torch.tensor([grp[0][4] for grp in groups], dtype=torch.float64)
            if torch.isnan(e_old).any():
                raise RuntimeError("ABPOTrainer: e_old missing for a logged example after the gather")
            w = snips_weight(e_old, e0)  # step 3: w = e_old / e0
            if st.w_max > 0:
                w = w.clamp(max=st.w_max)
            w_hat = stratified_self_normalise(w, y, st.delta)
            metrics.update({
                "abpo/snips/w_mean": w.mean().item(),
                "abpo/snips/w_max": w.max().item(),
                "abpo/snips/w_hat_max": w_hat.max().item(),
                "abpo/snips/ess": effective_sample_size(w).item(),
                "abpo/snips/ess_fraction": effective_sample_size(w).item() / b,
                "abpo/snips/e_old_mean": e_old.mean().item(),
                "abpo/snips/e0_mean": e0.mean().item(),
            })
            for stratum, name in ((1, "positive"), (0, "no_response")):
                if (y == stratum).any():
                    metrics[f"abpo/snips/ess_{name}"] = effective_sample_size(w[y == stratum]).item()
            w = w.float()
        adv = rollout_advantages(v, r_log, r_roll, y, w, delta=st.delta, eps_std=st.eps_std)  # [B, K] step 4

        # Metrics of docs/ABPO_SPEC.md / the issue: reward components, match rates per stratum, advantage stats.
        pos = (y == 1)[:, None].expand(b, k)
        neg = ~pos
        hit_pos = (r_match == 1.0) & pos
        hit_neg = (r_match == -1.0) & neg
        metrics.update({
            "abpo/rollouts/well_formed": (r_fmt == 1.0).float().mean().item(),
            "abpo/reward/total_mean": r_roll.mean().item(),
            "abpo/reward/format_mean": r_fmt.mean().item(),
            "abpo/reward/match_mean": r_match.mean().item(),
            "abpo/batch/positive_examples": float((y == 1).sum()),
            "abpo/batch/no_response_examples": float((y == 0).sum()),
            "abpo/advantages/mean": adv.mean().item(),
            "abpo/advantages/std": adv.std(unbiased=False).item(),
            "abpo/advantages/min": adv.min().item(),
            "abpo/advantages/max": adv.max().item(),
            "abpo/advantages/abs_mean": adv.abs().mean().item(),
        })
        if pos.any():
            metrics["abpo/match_rate/positive"] = (hit_pos.sum() / pos.sum()).item()
        if neg.any():
            metrics["abpo/match_rate/no_response"] = (hit_neg.sum() / neg.sum()).item()
        if r_sc is not None and neg.any():
            metrics["abpo/reward/self_certainty_mean"] = r_sc[neg].mean().item()
        metrics.update(self._diagnostics(groups, y, r_match, r_fmt, r_roll, r_sc, adv))

        flat = adv.reshape(-1)
        start = self.accelerator.process_index * n_local  # TRL's process slice
        return flat[start : start + n_local].clone(), metrics


# ------------------------------------------------------------------------------------------------ MLflow


class MLflowStepCallback(TrainerCallback):
    """Logs every numeric value of each `Trainer.log` call (TRL's metrics: rewards per function, KL, entropy,
    clip ratios, step_time; ABPO's: abpo/*) to the active MLflow run at the optimizer step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        import mlflow

        if mlflow.active_run() is None:
            return
        metrics = {
            k: float(v)
            for k, v in logs.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
        }
        if metrics:
            mlflow.log_metrics(metrics, step=int(state.global_step))


class StopAfterStepCallback(TrainerCallback):
    """Stops training after optimizer step `step` (after its checkpoint is written): simulates an interruption
    in the resume test and lets the benchmark time a fixed number of steps."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control
