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
``score_candidates_naive`` runs one full forward per candidate; both give the same s_p up to float error. The
token-level scorers (``score_token_ids``, ``score_token_ids_batch``, ``next_token_logits``) are
:mod:`abpo.policy.token_scoring`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from abpo.config.policy import TAU_MIN
from abpo.errors import UsageError
from abpo.policy.prompt import (
    FittedPrompt,
    check_item_tokens,
    encode_prompt,
    example_prompt,
    format_answer,
    prompt_style,
)
from abpo.policy.token_scoring import (
    PromptLogits,
    _answer_token_ids,
    _device,
    next_token_logits,
    score_token_ids,
    score_token_ids_batch,
)


def scores_on_choice(policy_cfg) -> bool:
    """True when s_p is the item token's log-prob (``policy.prompt_style=item_tokens``), False for the text mean."""
    return prompt_style(policy_cfg) == "item_tokens"


def score_choice_batch(
    model,
    prompt_ids: Sequence[Sequence[int]],
    choice_ids: Sequence[Sequence[int]],
    *,
    batch_tokens: int,
    logits: PromptLogits | None = None,
) -> list[torch.Tensor]:
    """Eq. s_p (item token) for several prompts: ``[M_i]`` = log p(choice_ids[i][m] | prompt i), the full-vocabulary
    log-softmax of the next-token logits after the prompt (``next_token_logits``), read at each candidate's item
    token. ``logits``: those prompts' next-token logits already computed under ``model`` (e.g. by the one-forward
    rollouts of the same generation batch), read instead of running the prompts again when they cover every prompt.
    Returns float32 on the CPU."""
    if len(prompt_ids) != len(choice_ids):
        raise ValueError(f"score_choice_batch: {len(prompt_ids)} prompts for {len(choice_ids)} candidate lists")
    if not prompt_ids:
        return []
    if logits is not None and logits.covers(prompt_ids):
        z = logits.logits[logits.rows(prompt_ids)]
    else:
        z = next_token_logits(model, prompt_ids, batch_tokens=batch_tokens)
    logp = torch.log_softmax(z, dim=-1)
    return [logp[i, torch.as_tensor(list(c), dtype=torch.long)].clone() for i, c in enumerate(choice_ids)]


def item_token_prompts(
    examples: Sequence[Any], titles: Mapping[int, str], tokenizer, policy_cfg
) -> tuple[list[FittedPrompt], list[list[int]]]:
    """(fitted prompt, prompt ids) of each example in the ``item_tokens`` style, each distinct prompt built and
    tokenized once: the prompt is a function of the history alone (of the history and the candidates when
    ``policy.item_prompt_candidates`` shows them), so a month's requests of one user share it (the
    demo's 7,320 rows of a month hold 1,220 prompts). The same FittedPrompt and ids as ``example_prompt`` and
    ``encode_prompt`` of every example, and the same refusals: an item outside the catalog (KeyError), an empty
    candidate set or one without item tokens (ValueError) raise for a request that shares its prompt too."""
    show = bool(getattr(policy_cfg, "item_prompt_candidates", True))
    built: dict[tuple, int] = {}
    distinct: list[FittedPrompt] = []
    which: list[int] = []
    for ex in examples:
        key = (tuple(ex.history), tuple(ex.candidates) if show else None)
        u = built.get(key)
        if u is None:
            u = built[key] = len(distinct)
            distinct.append(example_prompt(ex, titles, tokenizer, policy_cfg))
        else:  # example_prompt's checks of what is not in the key (its history was checked with the prompt)
            missing = [i for i in ex.candidates if i not in titles]
            if missing:
                raise KeyError(f"request {ex.request_id}: item ids {missing[:5]} not in the catalog")
            if not ex.candidates:
                raise ValueError("build_item_token_prompt: the candidate set is empty")
        which.append(u)
    ids: list[list[int]] = []
    for i in range(0, len(distinct), DISTINCT_PROMPTS_PER_CALL):  # = encode_prompt, batched
        ids += tokenizer([fp.text for fp in distinct[i : i + DISTINCT_PROMPTS_PER_CALL]], add_special_tokens=False)[
            "input_ids"
        ]
    return [distinct[u] for u in which], [ids[u] for u in which]


# distinct prompts per next_token_logits call of score_choice_distinct: its [U, V] float32 logits stay under ~60 MB with
# the tiny model's 13.8k-token vocabulary (~200 MB with a 49k one)
DISTINCT_PROMPTS_PER_CALL = 1024


def score_choice_distinct(
    model,
    prompt_ids: Sequence[Sequence[int]],
    choice_ids: Sequence[Sequence[int]],
    *,
    batch_tokens: int,
    bar=None,
) -> list[torch.Tensor]:
    """Eq. s_p (item token) of every candidate of every prompt, as :func:`score_choice_batch`, with each distinct
    prompt run once: the next-token logits depend on the prompt alone, and a month's requests of one user share it
    when the prompt shows no candidates (``policy.item_prompt_candidates`` false: the demo's 12 requests per user,
    7,320 rows and 1,220 distinct prompts in 2026-04). Distinct prompts go through ``next_token_logits`` in
    calls of :data:`DISTINCT_PROMPTS_PER_CALL`, in the order they first appear; ``bar``: a tqdm bar advanced by the
    prompts each call scored. Returns float32 on the CPU, in the order of ``prompt_ids``. A prompt's forward then
    runs in a batch of another shape than when every request ran, which may move its scores in the last float32
    bits (the serve step's month-1 propensities of the demo: up to 4e-6 relative)."""
    if len(prompt_ids) != len(choice_ids):
        raise ValueError(f"score_choice_distinct: {len(prompt_ids)} prompts for {len(choice_ids)} candidate lists")
    index: dict[tuple[int, ...], int] = {}
    members: list[list[int]] = []
    for i, p in enumerate(prompt_ids):
        u = index.setdefault(tuple(int(t) for t in p), len(index))
        if u == len(members):
            members.append([])
        members[u].append(i)
    distinct = list(index)
    out: list[torch.Tensor | None] = [None] * len(prompt_ids)
    for start in range(0, len(distinct), DISTINCT_PROMPTS_PER_CALL):
        chunk = distinct[start : start + DISTINCT_PROMPTS_PER_CALL]
        logp = torch.log_softmax(next_token_logits(model, [list(k) for k in chunk], batch_tokens=batch_tokens), dim=-1)
        done = 0
        for r in range(len(chunk)):
            for i in members[start + r]:
                out[i] = logp[r, torch.as_tensor(list(choice_ids[i]), dtype=torch.long)].clone()
                done += 1
        if bar is not None:
            bar.update(done)
    return [t for t in out if t is not None]


def score_prompt_ids(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[int]],
    answer_ids: Sequence[Sequence[Sequence[int]]] | None,
    policy_cfg,
    *,
    logits: PromptLogits | None = None,
) -> list[torch.Tensor]:
    """Eq. s_p of every candidate of every (tokenized) prompt, as ``policy_cfg.prompt_style`` defines it: the item
    token's log-prob (``score_choice_batch``) or the answer's mean token log-prob (``score_token_ids_batch``).
    ``candidates[i]`` are prompt i's item ids and ``answer_ids[i]`` their answers r(a) as token ids (only read for
    text; None for item tokens). ``policy_cfg``: anything with ``prompt_style`` and ``scoring_batch_tokens`` (the
    policy config, or the trainer's ABPOSettings). ``logits``: the prompts' next-token logits under ``model``, if
    already computed (the item-token score reads them)."""
    if scores_on_choice(policy_cfg):
        return score_choice_batch(
            model,
            prompt_ids,
            [check_item_tokens(tokenizer, c) for c in candidates],
            batch_tokens=policy_cfg.scoring_batch_tokens,
            logits=logits,
        )
    if answer_ids is None:
        raise ValueError("score_prompt_ids: policy.prompt_style=text scores the answers: answer_ids is required")
    return score_token_ids_batch(model, prompt_ids, answer_ids, batch_tokens=policy_cfg.scoring_batch_tokens)


@torch.no_grad()
def score_candidates(
    model, tokenizer, prompt: str, answers: list[str], *, batch_tokens: int, method: str = "auto"
) -> torch.Tensor:
    """Eq. s_p: ``[M]`` length-normalised mean token log-prob of each answer text given the prompt, by shared-prefix
    scoring (``score_token_ids``). ``prompt`` is the chat-rendered prompt (``fit_prompt(...).text`` or
    ``render_chat``), ``answers[m]`` is r(a_m) (``format_answer``)."""
    return score_token_ids(
        model,
        encode_prompt(tokenizer, prompt),
        _answer_token_ids(tokenizer, answers),
        batch_tokens=batch_tokens,
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
    """Eq. e_p: ``softmax(s_p(a,q) / tau)`` over the candidate set (last dimension). ``tau`` below
    abpo.config.policy.TAU_MIN (a serving request's ``tau`` param included) is refused: there ``s / tau`` overflows
    and the softmax is NaN."""
    if not tau >= TAU_MIN:  # NaN included
        raise UsageError(
            f"policy.tau {tau!r}: rule: >= {TAU_MIN:g} (below it scores / tau overflow float64 and softmax gives NaN)"
        )
    return torch.softmax(scores.double() / tau, dim=-1).to(
        scores.dtype if scores.is_floating_point() else torch.float32
    )


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
    model,
    tokenizer,
    examples: Sequence[Any],
    titles: Mapping[int, str],
    policy_cfg,
    *,
    progress: bool | str = False,
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
        if scores_on_choice(policy_cfg):  # the item token's log-prob: each distinct prompt once
            fitted, p_ids = item_token_prompts(examples, titles, tokenizer, policy_cfg)
            token_of: dict[int, int] = {}  # item -> its item token (check_item_tokens once per item)
            for ex in examples:
                new = [int(a) for a in ex.candidates if int(a) not in token_of]
                if new:
                    token_of.update(zip(new, check_item_tokens(tokenizer, new), strict=True))
            choice = [[token_of[int(a)] for a in ex.candidates] for ex in examples]
            scores = score_choice_distinct(model, p_ids, choice, batch_tokens=policy_cfg.scoring_batch_tokens, bar=bar)
            return [ScoredExample(ex, fp, s) for ex, fp, s in zip(examples, fitted, scores, strict=True)]
        for i in range(0, len(examples), prompts_per_call):
            part = examples[i : i + prompts_per_call]
            fitted = [example_prompt(ex, titles, tokenizer, policy_cfg) for ex in part]
            p_ids = tokenizer([fp.text for fp in fitted], add_special_tokens=False)["input_ids"]  # = encode_prompt
            cands = [list(ex.candidates) for ex in part]
            a_ids = (
                None
                if scores_on_choice(policy_cfg)
                else [_answer_token_ids(tokenizer, candidate_answers(c, titles)) for c in cands]
            )
            scores = score_prompt_ids(model, tokenizer, p_ids, cands, a_ids, policy_cfg)
            out += [ScoredExample(ex, fp, s) for ex, fp, s in zip(part, fitted, scores)]
            if bar is not None:
                bar.update(len(part))
    finally:
        if bar is not None:
            bar.close()
    return out


def propensity_of(
    model,
    tokenizer,
    prompts: Sequence[str],
    candidate_answer_lists: Sequence[Sequence[str]],
    chosen: Sequence[int],
    *,
    tau: float,
    batch_tokens: int,
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
def generate_answers(
    model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, batch_size: int = 8
) -> list[str]:
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
