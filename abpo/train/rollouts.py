"""Step 1 of docs/ABPO_SPEC.md "The update", the rollouts, as the trainer adds to TRL's generation: constrained
rollouts (policy.constrained_rollouts, abpo.policy.constrained, Eq. q: the candidate constraint in `generate`, the
single-choice fast path, the constrained log-probs of the loss) and the rollouts' self-certainty (step 2's r_sc)
recorded on the way. Functions of what they are given: `ABPOTrainer` (abpo.train.trainer) calls them from its TRL
overrides and keeps what they return."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from abpo.algo.rewards import self_certainty_from_token_kl, token_kl_from_uniform
from abpo.policy.token_scoring import PromptLogits
from abpo.train.answers import AnswerTries


@dataclass
class Rollouts:
    """What one call of TRL's `_generate_single_turn` returns, r_sc when it was recorded on the way, and on the
    single-choice path the distinct prompts' next-token logits the rollouts were drawn from (pi_old's: e_old and the
    anchors' r_sc of the same generation batch read them instead of running the prompts again)."""

    completion_ids: Any  # list of token-id lists, one per prompt (TRL's first return value)
    logprobs: Any  # TRL's second return value (None on the single-choice path)
    self_certainty: list[float] | None = None  # r_sc of every rollout, from the generation logits; None: not recorded
    prompt_logits: PromptLogits | None = None  # the single-choice path's logits of each distinct prompt


def generate_rollouts(
    trl_generate: Callable[[], tuple[Any, Any]],
    model: Any,
    prompt_ids: list[list[int]],
    rows: list[dict] | None,
    tries: AnswerTries,
    *,
    record_sc: bool,
    constrained: bool,
    temperature: float,
    greedy: bool,
    batch_tokens: int,
) -> Rollouts:
    """Step 1: TRL's rollout generation (``trl_generate``, on the HF `generate` path of the unwrapped ``model``), with
    two additions:

    - ``constrained`` (policy.constrained_rollouts): a `CandidateConstraint` logits processor is passed to
      `generate`, so row r only continues a well-formed answer of its own candidate set (abpo.policy.constrained,
      Eq. q); ``rows`` are the generation batch's dataset rows, one candidate set per row, so per-example sets work
      in one batch; when every set branches at its first token only, :func:`single_choice_rollouts` samples instead;
    - ``record_sc`` (the variant needs r_sc): a forward hook on the LM head keeps KL(U || p_t) of every decoding
      step's next-token logits (the full-vocabulary pi_theta = pi_old distribution token t is drawn from), so r_sc
      of the rollouts (step 2) costs no extra forward pass over prompt + completion. An unexpected call pattern of
      generate records nothing (the advantages then run the forward instead)."""
    constraint = rollout_constraint(rows, len(prompt_ids), tries) if constrained else None
    if constraint is not None and all(t is not None and t.single_choice for t in constraint.tries):
        # its logits cover the choice position only: r_sc over the whole answer is left to the forward pass
        choice_only = tries.sc_positions == "choice"
        return single_choice_rollouts(
            model, prompt_ids, constraint.tries, record_sc and choice_only, temperature, greedy, batch_tokens
        )
    if not record_sc and constraint is None:
        return Rollouts(*trl_generate())
    steps: list[torch.Tensor] = []

    def keep_token_kl(module, inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        steps.append(token_kl_from_uniform(logits[:, -1, :].detach()).cpu())  # [B]: KL(U || p_t), step t

    handle = model.get_output_embeddings().register_forward_hook(keep_token_kl) if record_sc else None
    if constraint is not None:
        from transformers import LogitsProcessorList

        generate = model.generate  # TRL calls `unwrapped_model.generate(...)` on this same object

        def constrained_generate(*a, **kw):
            processors = LogitsProcessorList(kw.pop("logits_processor", None) or [])
            processors.append(constraint)
            return generate(*a, logits_processor=processors, **kw)

        model.generate = constrained_generate
    try:
        completion_ids, logprobs = trl_generate()
    finally:
        if handle is not None:
            handle.remove()
        if constraint is not None:
            del model.generate  # the class's generate again
    sc = recorded_self_certainty(steps, completion_ids, rows, tries, len(prompt_ids)) if record_sc else None
    return Rollouts(completion_ids, logprobs, sc)


def recorded_self_certainty(
    steps: list[torch.Tensor], completion_ids, rows: list[dict] | None, tries: AnswerTries, n_prompts: int
) -> list[float] | None:
    """r_sc (step 2) of every rollout from the KL(U || p_t) kept at each decoding step, over the positions of
    update.self_certainty_positions; None when the steps do not line up with the completions (an unexpected call
    pattern of generate) or the rows are unknown."""
    lengths = [len(c) for c in completion_ids]
    if not (steps and all(s.shape == (n_prompts,) for s in steps) and max(lengths, default=0) <= len(steps)):
        return None
    kl = torch.stack(steps, dim=1)  # [B, S]: column t = the logits completion token t was sampled from
    mask = torch.zeros_like(kl, dtype=torch.long)  # r_sc over update.self_certainty_positions
    for r, (row, c) in enumerate(zip(rows or [], completion_ids)):
        m = tries.sc_mask(row, c)
        mask[r, : len(m)] = torch.tensor(m, dtype=torch.long)
    if rows is None or len(rows) != len(completion_ids):
        return None
    return self_certainty_from_token_kl(kl, mask).tolist()


def single_choice_rollouts(
    model, prompt_ids, tries, record_sc: bool, temperature: float, greedy: bool, batch_tokens: int
) -> Rollouts:
    """Constrained rollouts when every candidate set branches at its first token only (one token per item id):
    one forward over each distinct prompt (TRL repeats a logged example's prompt for each of its rollouts), each
    rollout's item token drawn from Eq. q at ``temperature``, then its forced tail
    (abpo.policy.constrained.sample_single_choice): the distribution HF ``generate`` with the candidate
    constraint samples from, without a decoding step per forced title token. Self-certainty (``record_sc``) is
    KL(U || pi_theta(.|q)) at that one choice position, from the same logits, which the rollouts also hand on
    (``Rollouts.prompt_logits``). ``greedy`` rollouts (GRPOConfig.generation_kwargs do_sample=False, as HF generate
    reads it) take the argmax of Eq. q, drawn from the one-hot limit of its softmax."""
    from abpo.policy.constrained import sample_single_choice

    completion_ids, logits = sample_single_choice(
        model, prompt_ids, tries, 1e-6 if greedy else temperature, batch_tokens=batch_tokens
    )
    sc = token_kl_from_uniform(logits.logits)[logits.rows(prompt_ids)].tolist() if record_sc else None
    return Rollouts(completion_ids, None, sc, logits)


def rollout_constraint(rows: list[dict] | None, n_rows: int, tries: AnswerTries):
    """The candidate constraint of the generation batch's ``rows`` (one answer trie each, Eq. q)."""
    from abpo.policy.constrained import CandidateConstraint

    if rows is None or len(rows) != n_rows:
        raise RuntimeError(
            f"ABPOTrainer: {n_rows} prompts to generate for but {0 if rows is None else len(rows)} dataset rows; "
            "the TRL internals changed (see tests/train/test_trl_contract.py)"
        )
    return CandidateConstraint([tries.trie(r) for r in rows])


def constrained_logps(
    accelerator,
    model,
    input_ids,
    attention_mask,
    completion_ids,
    allowed,
    temperature: float,
    *,
    share_prompts: bool = True,
    trim_forced: bool = True,
):
    """log q_theta of every completion token under the candidate constraint (Eq. q of abpo.policy.constrained)
    and the constrained steps' entropies, ``[N, T]`` each: the decoder's hidden states, then only the
    branching positions projected on their allowed tokens' rows of the LM head.

    ``share_prompts``: each distinct prompt of the micro-batch runs through the decoder once (a logged example's
    G-1 rollouts share it), its key/value cache is gathered per rollout and the completions run on top of it;
    gradients flow through the shared prompt pass. The same positions, masks and weights as one forward per row
    (``share_prompts=False``, the reference it is tested against), at about 1/(G-1) of the prompt's cost.

    ``trim_forced``: the decoder runs only up to the last position where some row's answers branch
    (:func:`positions_read`). A forced step (|S_t| = 1) has log q = 0 and entropy 0 whatever its hidden state, and
    a causal decoder's earlier hidden states do not depend on later tokens, so the values and gradients are those of
    the whole completion (``trim_forced=False``, the reference): with one token per item id the loss runs the
    distinct prompts alone, the choice being predicted by the prompt's last position."""
    from abpo.policy.constrained import constrained_token_logps

    unwrapped = accelerator.unwrap_model(model)
    if model is not unwrapped and torch.is_grad_enabled():
        # through the wrapper (DDP, DeepSpeed engine): its forward calls the module's, here this very
        # computation, so the wrapper sees the forward it reduces gradients for (DDP's prepare_for_backward,
        # ZeRO's hooks) exactly as for TRL's full-vocabulary log-probs
        def forward(*_a, **_k):
            return constrained_logps(
                accelerator,
                unwrapped,
                input_ids,
                attention_mask,
                completion_ids,
                allowed,
                temperature,
                share_prompts=share_prompts,
                trim_forced=trim_forced,
            )

        unwrapped.forward = forward
        try:
            return model()
        finally:
            del unwrapped.forward  # the class's forward again
    base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
    t = completion_ids.size(1)
    read = positions_read(allowed) if trim_forced else t
    keep = input_ids.size(1) - t + read
    completion_ids, allowed = completion_ids[:, :read], allowed[:, :read]
    with accelerator.autocast():
        hidden = _completion_hidden_states(
            base.get_decoder(), input_ids[:, :keep], attention_mask[:, :keep], completion_ids, share_prompts
        )
    logps, entropy = constrained_token_logps(
        hidden, base.get_output_embeddings(), completion_ids, allowed.to(hidden.device), temperature
    )
    if read < t:  # the forced positions after the last branch: log q = 0, entropy 0 (Eq. q)
        logps, entropy = (torch.nn.functional.pad(x, (0, t - read)) for x in (logps, entropy))
    return logps, entropy


def positions_read(allowed: torch.Tensor) -> int:
    """How many leading completion positions the constrained log-probs read: up to and including the last position
    where some row has more than one allowed token (|S_t| > 1, Eq. q), at least 1. ``allowed``: ``[N, T, K]`` from
    abpo.policy.constrained.allowed_tensor."""
    from abpo.policy.constrained import PAD_ALLOWED

    branching = ((allowed != PAD_ALLOWED).sum(-1) > 1).any(0).nonzero()
    return int(branching.max()) + 1 if branching.numel() else min(1, allowed.size(1))


def choice_entropies(logits: PromptLogits, prompt_ids, allowed: torch.Tensor, temperature: float):
    """``[N]``: the entropy of each rollout's constrained step distributions summed over its completion (Eq. q; what
    ``constrained_token_logps`` gives per position), read from the next-token logits its prompt's single-choice
    rollouts were drawn from, under the same policy: -sum_{v in S_0} q(v) log q(v), q = softmax_{S_0}(z / T). None
    unless only the first completion position branches (``positions_read``) and ``logits`` hold every prompt."""
    from abpo.policy.constrained import PAD_ALLOWED

    if positions_read(allowed) != 1 or not logits.covers(prompt_ids):
        return None
    first = allowed[:, 0].cpu()  # S_0 of every rollout [N, K]
    valid = first != PAD_ALLOWED
    z = logits.logits[logits.rows(prompt_ids)].gather(1, first.clamp(min=0))
    z = (z.float() / temperature).masked_fill(~valid, float("-inf"))
    logq = torch.log_softmax(z, dim=-1)
    entropy = -(logq.exp() * logq.masked_fill(~valid, 0.0)).sum(-1)
    return torch.where(valid.sum(-1) > 1, entropy, torch.zeros_like(entropy))  # a forced step: 0


def _completion_hidden_states(decoder, input_ids, attention_mask, completion_ids, share_prompts: bool):
    """The decoder's last hidden states that predict each completion token, ``[N, T, H]`` (position t predicts
    completion token t), one forward per row or over each distinct prompt once (``share_prompts``)."""
    t = completion_ids.size(1)
    p = input_ids.size(1) - t
    if not share_prompts:
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return hidden[:, p - 1 : p + t - 1]
    prompts = torch.cat([input_ids[:, :p], attention_mask[:, :p]], dim=1)
    uniq, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    out = decoder(input_ids=uniq[:, :p], attention_mask=uniq[:, p:], use_cache=t > 1)
    last = out.last_hidden_state[inverse, -1:]  # predicts completion token 0
    if t == 1:  # only the choice after the prompt is read (constrained_logps' trim_forced): no cache to gather
        return last
    cache = out.past_key_values
    cache.batch_select_indices(inverse)  # [U] prompt caches -> one per rollout (differentiable gather)
    rest = decoder(
        input_ids=completion_ids[:, :-1],
        attention_mask=attention_mask[:, :-1],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    return torch.cat([last, rest], dim=1)  # position t predicts completion token t


def constrained_ref_logps(accelerator, output, ref_model, model, temperature: float) -> torch.Tensor:
    """log q_ref of the rollouts (the optional KL term with constrained rollouts): TRL's ref log-probs are over the
    full vocabulary, so they are recomputed under the same constraint with the reference policy (``ref_model``, or
    PEFT's ``model`` without its adapter when None)."""
    input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    args = (input_ids, attention_mask, output["completion_ids"], output["abpo_allowed"], temperature)
    with torch.no_grad():
        if ref_model is not None:
            return constrained_logps(accelerator, ref_model, *args)[0]
        with accelerator.unwrap_model(model).disable_adapter():  # PEFT: the reference is the model without the adapter
            return constrained_logps(accelerator, model, *args)[0]
