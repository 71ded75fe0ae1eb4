"""Rollout generation of the trainer: constrained rollouts (policy.constrained_rollouts, abpo.policy.constrained,
Eq. q: the candidate constraint in `generate`, the single-choice fast path, the constrained log-probs of the loss)
and the rollouts' self-certainty recorded on the way. A mixin of `ABPOTrainer` (abpo.train.trainer), placed before
trl.GRPOTrainer in its bases: its ``super()`` calls reach TRL's methods."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from abpo.algo.rewards import self_certainty_from_token_kl, token_kl_from_uniform


class RolloutsMixin:
    """Generation and constrained rollouts of `ABPOTrainer` (see abpo.train.trainer for the attributes it reads)."""

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
        constrained = self.abpo.constrained_rollouts and hf_generate
        constraint = self._rollout_constraint(len(prompt_ids)) if constrained else None
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
            self._unwrapped(),
            prompt_ids,
            tries,
            1e-6 if greedy else self.temperature,
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

    def _constrained_logps(
        self, model, input_ids, attention_mask, completion_ids, allowed, *, share_prompts: bool = True
    ):
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
                rest = (
                    decoder(
                        input_ids=completion_ids[:, :-1],
                        attention_mask=attention_mask[:, :-1],
                        past_key_values=cache,
                        use_cache=True,
                    ).last_hidden_state
                    if t > 1
                    else last[:, :0]
                )
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
