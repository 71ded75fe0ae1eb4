"""Eq. s_p on token ids: the shared-prefix scorers behind abpo.policy.scoring (docs/ABPO_SPEC.md "Propensities").

``score_token_ids`` scores one prompt's answers as continuations of the prompt's KV cache (packed with a 4-D mask,
or the cache expanded over right-padded answers for sliding-window models); ``score_token_ids_batch`` many prompts
at once; ``next_token_logits`` the logits after each prompt (the item-token score), and ``PromptLogits`` those of
each distinct prompt once (what one-forward rollouts and e_old share). The candidate-level API (score_candidates,
propensities) is :mod:`abpo.policy.scoring`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from abpo.policy.prompt import encode_answer


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
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    types = getattr(cfg, "layer_types", None) or []
    return any("sliding" in str(t) for t in types) or bool(
        getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True)
    )


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
    model,
    prompt_ids: Sequence[Sequence[int]],
    answer_ids: Sequence[Sequence[Sequence[int]]],
    *,
    batch_tokens: int,
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
            while stop < len(order) and (
                stop == start or (stop - start + 1) * len(prompt_ids[order[stop]]) <= batch_tokens
            ):
                longest = len(prompt_ids[order[stop]])
                stop += 1
            group = order[start:stop]
            start = stop
            _score_group(
                decoder,
                head,
                [prompt_ids[i] for i in group],
                [answer_ids[i] for i in group],
                longest,
                pack_tokens,
                [out[i] for i in group],
                device,
                dtype,
                pad,
            )
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
            z = (
                model(
                    input_ids=ids.to(device),
                    attention_mask=attn.to(device),
                    position_ids=pos.to(device),
                    logits_to_keep=1,
                    use_cache=False,
                )
                .logits[:, -1]
                .float()
                .cpu()
            )
            if out is None:
                out = torch.empty((len(prompt_ids), z.shape[-1]), dtype=torch.float32)
            out[torch.tensor(group)] = z
    finally:
        model.train(was_training)
    return out if out is not None else torch.empty((0, 0), dtype=torch.float32)


@dataclass(frozen=True)
class PromptLogits:
    """The full-vocabulary next-token logits of distinct prompts under one policy: ``logits[index[tuple(ids)]]`` is
    prompt ``ids``' row (``next_token_logits``, each distinct prompt run once). What the constrained single-choice
    rollouts sample from (Eq. q) and what e_old (Eq. s_p on the item token) and r_sc at the choice position read,
    while the policy is the one that produced them (pi_old, within one generation batch)."""

    index: dict[tuple[int, ...], int]
    logits: torch.Tensor  # [U, V] float32 on the CPU, one row per distinct prompt

    @classmethod
    def of(cls, model, prompt_ids: Sequence[Sequence[int]], *, batch_tokens: int) -> PromptLogits:
        """Each distinct prompt of ``prompt_ids`` through ``model`` once (in the order of first appearance)."""
        index: dict[tuple[int, ...], int] = {}
        for p in prompt_ids:
            index.setdefault(tuple(int(t) for t in p), len(index))
        return cls(index, next_token_logits(model, [list(k) for k in index], batch_tokens=batch_tokens))

    def covers(self, prompt_ids: Sequence[Sequence[int]]) -> bool:
        """True when every prompt of ``prompt_ids`` has its row here."""
        return all(tuple(int(t) for t in p) in self.index for p in prompt_ids)

    def rows(self, prompt_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[N]`` int64: the row of ``logits`` of each prompt (KeyError for a prompt not run here)."""
        return torch.tensor([self.index[tuple(int(t) for t in p)] for p in prompt_ids], dtype=torch.long)


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
        if buf is not None:  # plain
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
    res = decoder(
        input_ids=ids.to(device), attention_mask=pmask.to(device), position_ids=pos.to(device), use_cache=True
    )
    cache = res.past_key_values
    first = torch.log_softmax(head(res.last_hidden_state[:, -1]).float(), dim=-1).cpu()  # log p(t_1 | q_u)
    totals = [torch.tensor([float(first[u, a[0]]) for a in answers[u]], dtype=torch.float64) for u in range(U)]
    nxt = [0] * U  # next answer of each prompt to pack
    while any(nxt[u] < len(answers[u]) for u in range(U)):
        rows = []  # per prompt: (answer index, tokens fed, targets)
        for u in range(U):
            chunk: list[tuple[int, Sequence[int]]] = []  # (answer index, its tokens)
            q = 0
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
        targets: list[int] = []  # the token each real packed token must predict
        where: list[tuple[int, int, int]] = []  # its (u, column, answer index)
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
            input_ids=feed.to(device),
            attention_mask=additive_mask(allowed.to(device), dtype),
            position_ids=qpos.to(device),
            past_key_values=cache,
            use_cache=True,
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
            feed: list[int] = []
            targets: list[int] = []
            pos: list[int] = []
            owner: list[int] = []
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
            logits = (
                model(
                    input_ids=torch.tensor([feed], device=device),
                    attention_mask=mask,
                    position_ids=pos_t[None, :],
                    past_key_values=cache,
                    use_cache=True,
                )
                .logits[0]
                .float()
            )
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
