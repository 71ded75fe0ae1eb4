"""Candidate scores and propensities, docs/ABPO_SPEC.md "Propensities".

For a policy p, a prompt q (history + candidate set C) and a candidate a in C, s_p(a, q) is the log-likelihood of
the item's representation r(a), and e_p its softmax over C:

    (Eq. s_p, text)        s_p(a, q) = (1/L) * sum_{l=1..L} log p(t_l | q, t_<l)   r(a) = the answer text t_1..t_L
    (Eq. s_p, item token)  s_p(a, q) = log p(item_token(a) | q)                   r(a) = the item's one token
    (Eq. e_p)              e_p(a | q) = softmax_{a in C}( s_p(a, q) / tau )       candidate-level, never the catalog

Which one is used follows ``policy.prompt_style`` (``scores_on_choice``):

- ``text`` (the paper's gemma prompt, smollm2, gpu): the answer ``format_answer(a, title(a))`` tokenized on its
  own and appended to the prompt's tokens, length-normalised over all its tokens, as the spec defines s_p for a text
  model (its id digits and title together name the item).
- ``item_tokens`` (the tiny model: one vocabulary token per item): the answer's first token IS the item, and
  everything after it (``<item>TITLE</item>`` and EOS) is forced by the item and carries no choice. Averaging those
  ~15 forced title tokens into s_p would rank items by how easily their titles are copied (length normalisation
  even favours long ones). s_p is the log-probability of the item token, the model's own representation of the item
  (docs/ABPO_SPEC.md: "r(a) is that item token"), and e_p = softmax(s_p / tau) over C is then exactly the distribution
  constrained rollouts sample the item from at temperature tau (abpo.policy.constrained, Eq. q: the masked softmax
  over C's item tokens; the forced rest has probability 1). e0, e_old, serving and HR@K rank by that one
  distribution.

Both are candidate-level propensities as ABPO needs them: a score per candidate of the same request, normalised
over C only (the full-vocabulary log-normaliser of the item-token score is shared by all candidates and cancels in
the softmax over C), so e_old / e0 compares two policies' probabilities of the same logged item among the same C.

The logging policy samples a_log ~ Categorical(e0(.|q)) and stores e0(a_log|q) (``sample_logged_action``).

Shared-prefix scoring (``score_candidates``): the prompt is run once; its KV cache is copied and expanded over a
chunk of candidates, which are run as continuations of that shared prefix (right-padded, so padding never
influences a real token). Chunks hold at most ``batch_tokens`` cached+new token positions. The reference
``score_candidates_naive`` runs one full forward per candidate; both give the same s_p up to float error.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from abpo.policy.prompt import (
    FittedPrompt,
    check_item_tokens,
    encode_answer,
    encode_prompt,
    example_prompt,
    format_answer,
    prompt_style,
)


def scores_on_choice(policy_cfg) -> bool:
    """True when s_p is the item token's log-prob (``policy.prompt_style=item_tokens``), False for the text mean."""
    return prompt_style(policy_cfg) == "item_tokens"


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A custom 4-D attention mask as transformers adds it to the attention scores: 0 where ``allowed``, the
    dtype's most negative value elsewhere. (A boolean 4-D mask is only understood by the sdpa kernels: eager
    attention ADDS it to the scores, True = +1, and masks nothing.)"""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def _answer_token_ids(tokenizer, answers: Sequence[str]) -> list[list[int]]:
    ids = [encode_answer(tokenizer, a) for a in answers]
    empty = [i for i, x in enumerate(ids) if not x]
    if empty:
        raise ValueError(f"score_candidates: answers at positions {empty[:5]} tokenize to nothing")
    return ids


def _has_sliding_window(model) -> bool:
    cfg = getattr(model, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    types = getattr(cfg, "layer_types", None) or []
    return any("sliding" in str(t) for t in types) or bool(getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True))


@torch.no_grad()
def score_token_ids(
    model, prompt_ids: Sequence[int], answer_ids: Sequence[Sequence[int]], *, batch_tokens: int, method: str = "auto"
) -> torch.Tensor:
    """Eq. s_p on token ids: ``[M]`` mean log-prob of each ``answer_ids[m]`` continuing ``prompt_ids``.

    Shared prefix: one forward over the prompt gives its KV cache and log p(t_1 | q); the answers' remaining tokens
    are then scored as continuations of that cache, in chunks:

    - ``packed`` (default): one row holding several answers back to back, with a 4D attention mask (every answer
      token sees the whole prompt and the earlier tokens of its own answer only) and position ids restarting at
      the prompt length for each answer; the cache is cropped back to the prompt after each chunk (no copies).
      A chunk holds at most ``batch_tokens`` positions (prompt + packed answer tokens).
    - ``expand``: the cache copied and expanded over a chunk of right-padded answers (chunk size x (prompt +
      longest answer) <= ``batch_tokens``); used for models with sliding-window layers (a custom 4D mask would
      bypass their window).

    Returns float32 on the CPU.
    """
    if not prompt_ids:
        raise ValueError("score_token_ids: empty prompt")
    if method == "auto":
        method = "expand" if _has_sliding_window(model) else "packed"
    if method not in ("packed", "expand"):
        raise ValueError(f"score_token_ids: method {method!r} is not auto | packed | expand")
    device = _device(model)
    M = len(answer_ids)
    scores = torch.empty(M, dtype=torch.float32)
    if M == 0:
        return scores
    was_training = model.training
    model.eval()
    try:
        prefix = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        out = model(input_ids=prefix, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        first_logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # log p(t_1 | q)
        Lp = prefix.shape[1]
        if method == "packed":
            _score_packed(model, cache, first_logp, Lp, answer_ids, batch_tokens, scores, device)
        else:
            _score_expanded(model, cache, first_logp, Lp, answer_ids, batch_tokens, scores, device)
    finally:
        model.train(was_training)
    return scores


@torch.no_grad()
def score_token_ids_batch(
    model, prompt_ids: Sequence[Sequence[int]], answer_ids: Sequence[Sequence[Sequence[int]]], *, batch_tokens: int,
    pack_tokens: int = 512,
) -> list[torch.Tensor]:
    """Eq. s_p for several prompts at once: ``[M_i]`` mean log-prob of each ``answer_ids[i][m]`` continuing
    ``prompt_ids[i]``, equal to ``score_token_ids`` prompt by prompt (tested against the naive forward).

    Prompts run in groups of U (U x longest prompt <= ``batch_tokens``), left-padded with position ids from the
    attention mask; then, in rounds, each prompt of the group gets a row of its next answers packed back to back
    (at most ``pack_tokens`` tokens a row) under an additive 4-D mask (every answer token sees its own prompt and
    the earlier tokens of its own answer), run on the group's prompt cache, which is cropped back after each
    round. Only the answer positions go through the LM head. Models with sliding-window layers are scored prompt
    by prompt (``score_token_ids``)."""
    if len(prompt_ids) != len(answer_ids):
        raise ValueError(f"score_token_ids_batch: {len(prompt_ids)} prompts for {len(answer_ids)} answer lists")
    if _has_sliding_window(model) or not hasattr(model, "get_decoder"):
        return [score_token_ids(model, p, a, batch_tokens=batch_tokens) for p, a in zip(prompt_ids, answer_ids)]
    for i, (p, answers) in enumerate(zip(prompt_ids, answer_ids)):
        if not p:
            raise ValueError(f"score_token_ids_batch: prompt {i} is empty")
        if any(not a for a in answers):
            raise ValueError(f"score_token_ids_batch: prompt {i} has an answer that tokenizes to nothing")
    device, dtype = _device(model), _dtype(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    pad = 0
    out: list[torch.Tensor] = [torch.empty(len(a), dtype=torch.float32) for a in answer_ids]
    was_training = model.training
    model.eval()
    try:
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # similar lengths together
        start = 0
        while start < len(order):
            longest = len(prompt_ids[order[start]])
            stop = start
            while stop < len(order) and (stop == start or (stop - start + 1) * len(prompt_ids[order[stop]]) <= batch_tokens):
                longest = len(prompt_ids[order[stop]])
                stop += 1
            group = order[start:stop]
            start = stop
            _score_group(decoder, head, [prompt_ids[i] for i in group], [answer_ids[i] for i in group], longest,
                         pack_tokens, [out[i] for i in group], device, dtype, pad)
    finally:
        model.train(was_training)
    return out


@torch.no_grad()
def next_token_logits(model, prompt_ids: Sequence[Sequence[int]], *, batch_tokens: int) -> torch.Tensor:
    """``[N, V]`` float32 (CPU): each prompt's full-vocabulary next-token logits, i.e. at the position after its last
    token. One forward per group of prompts (similar lengths together, left-padded, position ids from the attention
    mask, group size x longest prompt <= ``batch_tokens``); only the last position goes through the LM head. What
    item-token scoring (``score_choice_batch``) and one-forward rollouts (``constrained.sample_single_choice``) read."""
    for i, p in enumerate(prompt_ids):
        if not p:
            raise ValueError(f"next_token_logits: prompt {i} is empty")
    device = _device(model)
    out: torch.Tensor | None = None
    was_training = model.training
    model.eval()
    try:
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        start = 0
        while start < len(order):
            stop = start + 1
            while stop < len(order) and (stop - start + 1) * len(prompt_ids[order[stop]]) <= batch_tokens:
                stop += 1
            group = order[start:stop]
            start = stop
            longest = max(len(prompt_ids[i]) for i in group)
            ids = torch.zeros((len(group), longest), dtype=torch.long)
            attn = torch.zeros((len(group), longest), dtype=torch.long)
            for r, i in enumerate(group):
                p = prompt_ids[i]
                ids[r, longest - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
                attn[r, longest - len(p) :] = 1
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            z = model(
                input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=pos.to(device),
                logits_to_keep=1, use_cache=False,
            ).logits[:, -1].float().cpu()
            if out is None:
                out = torch.empty((len(prompt_ids), z.shape[-1]), dtype=torch.float32)
            out[torch.tensor(group)] = z
    finally:
        model.train(was_training)
    return out if out is not None else torch.empty((0, 0), dtype=torch.float32)


def score_choice_batch(
    model, prompt_ids: Sequence[Sequence[int]], choice_ids: Sequence[Sequence[int]], *, batch_tokens: int
) -> list[torch.Tensor]:
    """Eq. s_p (item token) for several prompts: ``[M_i]`` = log p(choice_ids[i][m] | prompt i), the full-vocabulary
    log-softmax of the next-token logits after the prompt (``next_token_logits``), read at each candidate's item
    token. Returns float32 on the CPU."""
    if len(prompt_ids) != len(choice_ids):
        raise ValueError(f"score_choice_batch: {len(prompt_ids)} prompts for {len(choice_ids)} candidate lists")
    if not prompt_ids:
        return []
    logp = torch.log_softmax(next_token_logits(model, prompt_ids, batch_tokens=batch_tokens), dim=-1)
    return [logp[i, torch.as_tensor(list(c), dtype=torch.long)].clone() for i, c in enumerate(choice_ids)]


def score_prompt_ids(
    model, tokenizer, prompt_ids: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]],
    answer_ids: Sequence[Sequence[Sequence[int]]] | None, policy_cfg,
) -> list[torch.Tensor]:
    """Eq. s_p of every candidate of every (tokenized) prompt, as ``policy_cfg.prompt_style`` defines it: the item
    token's log-prob (``score_choice_batch``) or the answer's mean token log-prob (``score_token_ids_batch``).
    ``candidates[i]`` are prompt i's item ids and ``answer_ids[i]`` their answers r(a) as token ids (only read for
    text; None for item tokens). ``policy_cfg``: anything with ``prompt_style`` and ``scoring_batch_tokens`` (the
    policy config, or the trainer's ABPOSettings)."""
    if scores_on_choice(policy_cfg):
        return score_choice_batch(
            model, prompt_ids, [check_item_tokens(tokenizer, c) for c in candidates],
            batch_tokens=policy_cfg.scoring_batch_tokens,
        )
    if answer_ids is None:
        raise ValueError("score_prompt_ids: policy.prompt_style=text scores the answers: answer_ids is required")
    return score_token_ids_batch(model, prompt_ids, answer_ids, batch_tokens=policy_cfg.scoring_batch_tokens)


def _logsumexp_(x: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim, overwriting ``x`` (one exp pass in place: ~2x torch.logsumexp on the CPU)."""
    m = x.amax(dim=-1, keepdim=True)
    return x.sub_(m).exp_().sum(dim=-1).log_() + m[..., 0]


@torch.no_grad()
def _token_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, rows: int = 64) -> torch.Tensor:
    """log p(targets[n] | hidden[n]) = logit - logsumexp(logits) over the full vocabulary (the terms of Eq. s_p),
    float64, ``[N]``. The LM head runs ``rows`` positions at a time into one reused buffer, and each chunk's
    logsumexp follows while its logits are still in cache: with a 64-wide model the head is bound by writing the
    [N, vocab] logits to memory, and chunking halves its time on the CPU (same values)."""
    n = hidden.shape[0]
    out = torch.empty(n, dtype=torch.float64, device=hidden.device)
    plain = isinstance(head, torch.nn.Linear) and head.weight.dtype == torch.float32 and hidden.dtype == torch.float32
    buf = torch.empty((min(rows, n), head.out_features), dtype=torch.float32, device=hidden.device) if plain else None
    for s in range(0, n, rows):
        e = min(s + rows, n)
        if plain:
            logits = torch.mm(hidden[s:e], head.weight.t(), out=buf[: e - s])
            if head.bias is not None:
                logits.add_(head.bias)
        else:
            logits = head(hidden[s:e]).float()
        picked = logits.gather(-1, targets[s:e, None])[:, 0]
        out[s:e] = picked - _logsumexp_(logits)
    return out


def _score_group(decoder, head, prompts, answers, P, pack_tokens, outs, device, dtype, pad) -> None:
    """score_token_ids_batch for one group of prompts (see there)."""
    U = len(prompts)
    ids = torch.full((U, P), pad, dtype=torch.long)
    pmask = torch.zeros((U, P), dtype=torch.long)
    for u, p in enumerate(prompts):
        ids[u, P - len(p) :] = torch.tensor(list(p))
        pmask[u, P - len(p) :] = 1
    lens_p = pmask.sum(1)
    pos = (pmask.cumsum(1) - 1).clamp(min=0)
    res = decoder(input_ids=ids.to(device), attention_mask=pmask.to(device), position_ids=pos.to(device), use_cache=True)
    cache = res.past_key_values
    first = torch.log_softmax(head(res.last_hidden_state[:, -1]).float(), dim=-1).cpu()  # log p(t_1 | q_u)
    totals = [torch.tensor([float(first[u, a[0]]) for a in answers[u]], dtype=torch.float64) for u in range(U)]
    nxt = [0] * U  # next answer of each prompt to pack
    while any(nxt[u] < len(answers[u]) for u in range(U)):
        rows = []  # per prompt: (answer index, tokens fed, targets)
        for u in range(U):
            chunk, q = [], 0
            while nxt[u] < len(answers[u]):
                a = answers[u][nxt[u]]
                if chunk and q + len(a) - 1 > pack_tokens:
                    break
                chunk.append((nxt[u], a))
                q += len(a) - 1
                nxt[u] += 1
            rows.append(chunk)
        Q = max(1, max(sum(len(a) - 1 for _, a in chunk) for chunk in rows))
        feed = torch.full((U, Q), pad, dtype=torch.long)
        qpos = torch.zeros((U, Q), dtype=torch.long)
        owner = torch.full((U, Q), -1, dtype=torch.long)  # answer slot of each packed token, -1 = padding
        targets, where = [], []  # (u, column) of each real packed token and the token it must predict
        for u, chunk in enumerate(rows):
            c = 0
            for slot, (m, a) in enumerate(chunk):
                n = len(a) - 1
                if n:
                    feed[u, c : c + n] = torch.tensor(a[:-1])
                    qpos[u, c : c + n] = lens_p[u] + torch.arange(n)
                    owner[u, c : c + n] = slot
                    targets += a[1:]
                    where += [(u, c + k, m) for k in range(n)]
                c += n
        if not where:
            continue
        same = (owner[:, :, None] == owner[:, None, :]) & (owner[:, :, None] >= 0)
        causal = qpos[:, None, :] <= qpos[:, :, None]
        own = torch.eye(Q, dtype=torch.bool)[None].expand(U, Q, Q)  # padding rows see themselves (no empty row)
        allowed = torch.cat([pmask.bool()[:, None, :].expand(U, Q, P), (same & causal) | own], dim=2)[:, None]
        h = decoder(
            input_ids=feed.to(device), attention_mask=additive_mask(allowed.to(device), dtype),
            position_ids=qpos.to(device), past_key_values=cache, use_cache=True,
        ).last_hidden_state
        cache.crop(-Q)  # the cache is the prompts' again
        uu = torch.tensor([w[0] for w in where])
        cc = torch.tensor([w[1] for w in where])
        logp = _token_logprobs(head, h[uu.to(device), cc.to(device)], torch.tensor(targets, device=device)).cpu()
        for (u, _, m), v in zip(where, logp.tolist()):
            totals[u][m] += v
    for u in range(U):
        lens = torch.tensor([len(a) for a in answers[u]], dtype=torch.float64)
        outs[u].copy_((totals[u] / lens).float())  # (1/L) sum_l log p(t_l | q, t_<l)


def _score_packed(model, cache, first_logp, Lp, answer_ids, batch_tokens, scores, device) -> None:
    M = len(answer_ids)
    start = 0
    while start < M:
        # answers [start, stop): their tokens t_1..t_{L-1} are packed (t_L is predicted, never fed)
        stop, q = start, 0
        while stop < M and (stop == start or Lp + q + len(answer_ids[stop]) - 1 <= batch_tokens):
            q += len(answer_ids[stop]) - 1
            stop += 1
        chunk = [list(answer_ids[m]) for m in range(start, stop)]
        total = torch.tensor([first_logp[a[0]].item() for a in chunk], dtype=torch.float64)
        if q > 0:
            feed, targets, pos, owner = [], [], [], []
            for r, a in enumerate(chunk):
                feed += a[:-1]
                targets += a[1:]
                pos += range(Lp, Lp + len(a) - 1)
                owner += [r] * (len(a) - 1)
            owner_t = torch.tensor(owner, device=device)
            pos_t = torch.tensor(pos, device=device)
            # 4D mask [1, 1, q, Lp + q]: prompt visible to all; inside the pack, same answer and not in the future
            same = owner_t[:, None] == owner_t[None, :]
            causal = pos_t[None, :] <= pos_t[:, None]
            allowed = torch.cat([torch.ones(q, Lp, dtype=torch.bool, device=device), same & causal], dim=1)[None, None]
            mask = additive_mask(allowed, _dtype(model))
            logits = model(
                input_ids=torch.tensor([feed], device=device),
                attention_mask=mask,
                position_ids=pos_t[None, :],
                past_key_values=cache,
                use_cache=True,
            ).logits[0].float()
            cache.crop(-q)  # drop the pack's q keys/values: the cache is the prompt's again
            # log p(target) = logit(target) - logsumexp(logits): no [q, V] log-softmax tensor is written
            tgt = torch.tensor(targets, device=device)[:, None]
            logp = logits.gather(-1, tgt)[:, 0] - torch.logsumexp(logits, dim=-1)
            total += torch.zeros(len(chunk), dtype=torch.float64).index_add_(0, owner_t.cpu(), logp.double().cpu())
        lens = torch.tensor([len(a) for a in chunk], dtype=torch.float64)
        scores[start:stop] = (total / lens).float()  # (1/L) sum_l log p(t_l | q, t_<l)
        start = stop


def _score_expanded(model, cache, first_logp, Lp, answer_ids, batch_tokens, scores, device) -> None:
    M = len(answer_ids)
    # Long answers together: less padding per chunk. Scores go back to the caller's order.
    order = sorted(range(M), key=lambda m: -len(answer_ids[m]))
    start = 0
    while start < M:
        La = len(answer_ids[order[start]])
        B = max(1, min(M - start, batch_tokens // max(1, Lp + La)))
        idx = order[start : start + B]
        start += B
        toks = torch.full((B, La), 0, dtype=torch.long)
        lens = torch.tensor([len(answer_ids[m]) for m in idx])
        for r, m in enumerate(idx):
            toks[r, : lens[r]] = torch.tensor(answer_ids[m])
        toks = toks.to(device)
        total = first_logp[toks[:, 0]].clone()  # sum_l log p(t_l | q, t_<l), l = 1
        if La > 1:
            chunk_cache = copy.deepcopy(cache)
            chunk_cache.batch_repeat_interleave(B)
            logits = model(input_ids=toks[:, :-1], past_key_values=chunk_cache, use_cache=True).logits.float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, toks[:, 1:, None]).squeeze(-1)  # [B, La-1]
            mask = torch.arange(1, La, device=device)[None, :] < lens.to(device)[:, None]
            total = total + (logp * mask).sum(dim=1)
            del chunk_cache, logits, logp
        scores[torch.tensor(idx)] = (total / lens.to(device)).float().cpu()  # (1/L) sum_l ...


@torch.no_grad()
def score_candidates(
    model, tokenizer, prompt: str, answers: list[str], *, batch_tokens: int, method: str = "auto"
) -> torch.Tensor:
    """Eq. s_p: ``[M]`` length-normalised mean token log-prob of each answer text given the prompt, by shared-prefix
    scoring (``score_token_ids``). ``prompt`` is the chat-rendered prompt (``fit_prompt(...).text`` or
    ``render_chat``), ``answers[m]`` is r(a_m) (``format_answer``)."""
    return score_token_ids(
        model, encode_prompt(tokenizer, prompt), _answer_token_ids(tokenizer, answers), batch_tokens=batch_tokens,
        method=method,
    )


@torch.no_grad()
def score_candidates_naive(model, tokenizer, prompt: str, answers: list[str]) -> torch.Tensor:
    """Eq. s_p, the reference: one full forward of prompt + answer per candidate, no cache sharing."""
    device = _device(model)
    prompt_ids = encode_prompt(tokenizer, prompt)
    was_training = model.training
    model.eval()
    out = torch.empty(len(answers), dtype=torch.float32)
    try:
        for m, ids in enumerate(_answer_token_ids(tokenizer, answers)):
            x = torch.tensor([prompt_ids + ids], device=device)
            logits = model(input_ids=x).logits[0].float()
            Lp = len(prompt_ids)
            logp = torch.log_softmax(logits[Lp - 1 : -1], dim=-1)  # positions predicting the answer tokens
            out[m] = logp.gather(-1, torch.tensor(ids, device=device)[:, None]).mean().cpu()
    finally:
        model.train(was_training)
    return out


def candidate_propensities(scores: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. e_p: ``softmax(s_p(a,q) / tau)`` over the candidate set (last dimension)."""
    if not tau > 0:
        raise ValueError(f"policy.tau must be > 0, got {tau}")
    return torch.softmax(scores.double() / tau, dim=-1).to(scores.dtype if scores.is_floating_point() else torch.float32)


def sample_logged_action(propensities: torch.Tensor | np.ndarray, rng: np.random.Generator) -> tuple[int, float]:
    """a_log ~ Categorical(e0(.|q)): the sampled candidate index and its stored propensity e0(a_log|q)."""
    p = np.asarray(propensities, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(p >= 0) or not math.isclose(p.sum(), 1.0, abs_tol=1e-5):
        raise ValueError(f"sample_logged_action: not a distribution over candidates (sum={p.sum():.6f})")
    p = p / p.sum()
    j = int(rng.choice(p.size, p=p))
    return j, float(p[j])


def rank_of(scores: torch.Tensor, index: int) -> int:
    """1-based rank of candidate ``index`` when candidates are ordered by s (ties count against it)."""
    s = scores[index]
    return int((scores > s).sum().item() + (scores == s).sum().item())


def top_k(scores: torch.Tensor, candidates: Sequence[int], k: int) -> list[int]:
    """The ``k`` candidate ids with the highest s, best first (ties: earlier candidate first)."""
    order = sorted(range(len(candidates)), key=lambda m: (-float(scores[m]), m))
    return [candidates[m] for m in order[:k]]


# ---------------------------------------------------------------------------------------------- many prompts


@dataclass
class ScoredExample:
    """s_p for every candidate of one ``Example`` (aligned with ``example.candidates``)."""

    example: Any
    prompt: FittedPrompt
    scores: torch.Tensor

    def propensities(self, tau: float) -> torch.Tensor:
        return candidate_propensities(self.scores, tau)

    @property
    def positive_index(self) -> int:
        return list(self.example.candidates).index(self.example.positive)


def candidate_answers(candidates: Sequence[int], titles: Mapping[int, str]) -> list[str]:
    """r(a) for each candidate id."""
    return [format_answer(a, titles[a]) for a in candidates]


def score_examples(
    model, tokenizer, examples: Sequence[Any], titles: Mapping[int, str], policy_cfg, *, progress: bool | str = False,
    prompts_per_call: int = 64,
) -> list[ScoredExample]:
    """Eq. s_p for every candidate of every example (prompt fitted to ``policy.max_prompt_tokens``), scored with
    ``score_prompt_ids`` (the item token's log-prob or the answer mean, per ``policy.prompt_style``;
    ``policy.scoring_batch_tokens`` bounds a group of prompts). ``progress``: a tqdm description (or True) to show
    a bar."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(examples), desc=progress if isinstance(progress, str) else "scoring", unit="prompt")
    out = []
    try:
        for i in range(0, len(examples), prompts_per_call):
            part = examples[i : i + prompts_per_call]
            fitted = [example_prompt(ex, titles, tokenizer, policy_cfg) for ex in part]
            p_ids = tokenizer([fp.text for fp in fitted], add_special_tokens=False)["input_ids"]  # = encode_prompt
            cands = [list(ex.candidates) for ex in part]
            a_ids = None if scores_on_choice(policy_cfg) else [
                _answer_token_ids(tokenizer, candidate_answers(c, titles)) for c in cands]
            scores = score_prompt_ids(model, tokenizer, p_ids, cands, a_ids, policy_cfg)
            out += [ScoredExample(ex, fp, s) for ex, fp, s in zip(part, fitted, scores)]
            if bar is not None:
                bar.update(len(part))
    finally:
        if bar is not None:
            bar.close()
    return out


def propensity_of(
    model, tokenizer, prompts: Sequence[str], candidate_answer_lists: Sequence[Sequence[str]], chosen: Sequence[int],
    *, tau: float, batch_tokens: int,
) -> torch.Tensor:
    """e_p(a_i | q_i) for many prompts: ``[N]`` propensity of candidate index ``chosen[i]`` of prompt i (e.g. the
    trainer's e_old(a_log|q) for the SNIPS weight)."""
    vals = []
    for prompt, answers, j in zip(prompts, candidate_answer_lists, chosen, strict=True):
        s = score_candidates(model, tokenizer, prompt, list(answers), batch_tokens=batch_tokens)
        vals.append(candidate_propensities(s, tau)[j])
    return torch.stack(vals) if vals else torch.empty(0)


# ------------------------------------------------------------------------------------------------- generation


@torch.no_grad()
def generate_answers(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, batch_size: int = 8) -> list[str]:
    """Greedy answers (special tokens dropped) for rendered prompts; batched with left padding."""
    device = _device(model)
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            batch = [encode_prompt(tokenizer, p) for p in prompts[i : i + batch_size]]
            enc = tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(device)
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            out += tokenizer.batch_decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out
