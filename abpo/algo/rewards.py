"""Step 2 of the ABPO update (docs/ABPO_SPEC.md "The update"): the rewards of one completion.

    r_fmt   = 1[output matches <item_id>ID</item_id><item>TITLE</item>]          (format reward)
    y = 1:  r_match = +1[a^j = a^log]                r = r_match + r_fmt         (click)
    y = 0:  r_match = -1[a^j = a^log]                r = r_match + r_fmt + lambda_sc * r_sc   (no response)
    r_sc    = (1/T) sum_t KL(U || pi_theta(. | q, a_<t)),  KL(U||p) = -log V - mean_v log p_v  (self-certainty)

The anchor's reward r^log is the same function applied to the logged item's well-formed text
(see `anchor_reward`). Rewards are constants for the policy-gradient step: the advantage functions
in `abpo.algo.advantages` detach them, and the trainer should compute `self_certainty` under
`torch.no_grad()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from abpo.policy.prompt import parse_answer

NO_ITEM = -1
"""The `chosen` id of a malformed completion: item ids are non-negative, so it never equals a_log."""

# A parser: (completion text, candidate ids or id -> title) -> object with .item_id and .well_formed.
# The default is the serving parser abpo.policy.prompt.parse_answer (strict `<item_id>ID</item_id><item>TITLE</item>`,
# whitespace only around it, ID in the candidate set; with an id -> title mapping the title must match too), so
# the format reward and the deployed output parser can never disagree.
Parser = Callable[[str, Any], Any]
CandidateIds = Sequence[int] | Mapping[int, str]


def _parse_all(completions: Sequence[str], candidate_ids: Sequence[CandidateIds], parse: Parser | None) -> list[Any]:
    if len(completions) != len(candidate_ids):
        raise ValueError(
            f"abpo.algo.rewards: got {len(completions)} completions but {len(candidate_ids)} candidate sets; "
            "rule: one candidate set per completion"
        )
    parse = parse_answer if parse is None else parse
    return [parse(text, cands) for text, cands in zip(completions, candidate_ids)]


def format_reward(
    completions: Sequence[str],
    candidate_ids: Sequence[CandidateIds],
    parse: Parser | None = None,
) -> Tensor:
    """r_fmt in {0, 1} per completion (docs/ABPO_SPEC.md step 2, format reward): 1 iff the completion is exactly
    `<item_id>ID</item_id><item>TITLE</item>` with ID in its candidate set. Returns float32 [N].

    candidate_ids[n]: the ids of completion n's candidate set C, or a mapping id -> title (then the title must
    match the catalog's as well). `parse` (default abpo.policy.prompt.parse_answer) decides well-formedness.
    An ID outside C is malformed: it is not a valid bandit action (a^log is always in C).
    """
    parsed = _parse_all(completions, candidate_ids, parse)
    return torch.tensor([1.0 if p.well_formed else 0.0 for p in parsed], dtype=torch.float32)


def chosen_items(
    completions: Sequence[str],
    candidate_ids: Sequence[CandidateIds],
    parse: Parser | None = None,
) -> Tensor:
    """a^j per completion as an int64 tensor [N]; NO_ITEM (-1) for a malformed completion, so that
    malformed outputs never match the logged item (input of `match_reward`)."""
    parsed = _parse_all(completions, candidate_ids, parse)
    ids = [int(p.item_id) if p.well_formed and p.item_id is not None else NO_ITEM for p in parsed]
    return torch.tensor(ids, dtype=torch.int64)


def _per_row(x: Tensor, like: Tensor, name: str) -> Tensor:
    """Broadcast a per-example tensor [B] against [B] or [B, K] (K completions of each example)."""
    if x.dim() != 1 or x.shape[0] != like.shape[0]:
        raise ValueError(
            f"abpo.algo.rewards: {name} has shape {tuple(x.shape)}; "
            f"rule: one value per example, shape ({like.shape[0]},)"
        )
    return x.view(-1, *([1] * (like.dim() - 1)))


def _check_feedback(y: Tensor) -> None:
    bad = ~((y == 0) | (y == 1))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"abpo.algo.rewards: y[{i}] = {y[i].item()}; rule: feedback y is 0 or 1")


def match_reward(chosen: Tensor, logged: Tensor, y: Tensor) -> Tensor:
    """r_match (docs/ABPO_SPEC.md step 2): y = 1 -> +1[a^j = a^log]; y = 0 -> -1[a^j = a^log].

    chosen: int [B] or [B, K] (NO_ITEM = -1 for malformed completions, which never match);
    logged: int [B] (a^log, a valid item id >= 0); y: [B] in {0, 1}. Returns float32 shaped like `chosen`.
    """
    if bool((logged < 0).any()):
        i = int((logged < 0).nonzero()[0, 0])
        raise ValueError(f"abpo.algo.rewards: logged[{i}] = {logged[i].item()}; rule: a logged item id is >= 0")
    _check_feedback(y)
    a_log = _per_row(logged, chosen, "logged")
    sign = 2.0 * _per_row(y, chosen, "y").to(torch.float32) - 1.0  # y=1 -> +1, y=0 -> -1
    hit = (chosen == a_log) & (chosen >= 0)  # 1[a^j = a^log]; malformed (-1) never matches
    return sign * hit.to(torch.float32)  # r_match = +-1[a^j = a^log]


def token_kl_from_uniform(logits: Tensor) -> Tensor:
    """KL(U || p_t) per token from logits [..., V] (docs/ABPO_SPEC.md step 2, self-certainty integrand).

    KL(U||p) = sum_v (1/V) log((1/V) / p_v) = -log V - mean_v log p_v, and with log p_v = z_v - logsumexp(z):
    KL(U||p) = logsumexp_v(z) - mean_v(z) - log V. This form never materialises log_softmax (memory: one
    [..., V] read) and is stable for large logits. Computed in float32 at least.
    """
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    vocab = z.shape[-1]
    return torch.logsumexp(z, dim=-1) - z.mean(dim=-1) - math.log(vocab)  # -log V - mean_v log p_v


def self_certainty(logits: Tensor, mask: Tensor) -> Tensor:
    """r_sc = (1/T) sum_t KL(U || pi_theta(. | q, a_<t)) (docs/ABPO_SPEC.md step 2, self-certainty).

    logits: [B, T, V], the policy's next-token logits at the completion's positions (logits[:, t] predicts
    completion token t); mask: [B, T], 1 for the tokens averaged over, 0 elsewhere. T in the equation is the
    mask's row sum. A row with nothing to average gets 0. Returns [B] (>= 0; larger = more certain).

    The spec averages over every completion token. The trainer passes 1 only at the tokens that carry a choice
    (``abpo.policy.constrained.AnswerTrie.choice_mask``: where the candidates' answers branch, e.g. the item token
    of an item-token model): tokens forced by the chosen item (its title) measure how confidently a title is
    copied, not how certain the policy is of its choice.
    """
    if logits.dim() != 3 or mask.shape != logits.shape[:2]:
        raise ValueError(
            f"abpo.algo.rewards.self_certainty: logits {tuple(logits.shape)} and mask {tuple(mask.shape)}; "
            "rule: logits [B, T, V] and mask [B, T]"
        )
    return self_certainty_from_token_kl(token_kl_from_uniform(logits), mask)  # KL(U || p_t): [B, T]


def self_certainty_from_token_kl(kl: Tensor, mask: Tensor) -> Tensor:
    """r_sc = (1/T) sum_t KL(U || p_t) (docs/ABPO_SPEC.md step 2) from the per-token KL(U || p_t) [B, T] (e.g. collected
    one decoding step at a time by `token_kl_from_uniform` while the rollouts are generated) and the completion mask
    [B, T]. A row with no completion tokens gets 0. Returns [B]."""
    if kl.dim() != 2 or mask.shape != kl.shape:
        raise ValueError(
            f"abpo.algo.rewards.self_certainty_from_token_kl: kl {tuple(kl.shape)} and mask {tuple(mask.shape)}; "
            "rule: both [B, T]"
        )
    m = mask.to(kl.dtype)
    kl = torch.where(m > 0, kl, torch.zeros_like(kl))  # padded positions may hold anything, even inf
    return (kl * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # (1/T) sum_t KL(U || p_t)


def total_reward(
    r_match: Tensor,
    r_fmt: Tensor,
    r_sc: Tensor | None,
    y: Tensor,
    lambda_sc: float,
) -> Tensor:
    """r (docs/ABPO_SPEC.md step 2): y = 1 -> r_match + r_fmt; y = 0 -> r_match + r_fmt + lambda_sc * r_sc.

    r_match, r_fmt (and r_sc): [B] or [B, K]; y: [B]. r_sc = None means no self-certainty term
    (variants without it), the same as lambda_sc = 0.
    """
    if r_match.shape != r_fmt.shape:
        raise ValueError(
            f"abpo.algo.rewards.total_reward: r_match {tuple(r_match.shape)} vs r_fmt {tuple(r_fmt.shape)}; "
            "rule: one reward of each kind per completion"
        )
    _check_feedback(y)
    r = r_match + r_fmt  # r_match + r_fmt
    if r_sc is None or lambda_sc == 0.0:
        return r
    if r_sc.shape != r.shape:
        raise ValueError(
            f"abpo.algo.rewards.total_reward: r_sc {tuple(r_sc.shape)} vs r_match {tuple(r.shape)}; "
            "rule: one self-certainty per completion"
        )
    no_response = (_per_row(y, r, "y") == 0).to(r.dtype)  # 1[y = 0]
    return r + no_response * lambda_sc * r_sc  # + lambda_sc * r_sc for y = 0 only


def anchor_reward(y: Tensor, r_sc_log: Tensor | None, lambda_sc: float) -> Tensor:
    """r^log (docs/ABPO_SPEC.md step 2, last bullet): the reward of the logged item's well-formed text,
    i.e. r_fmt = 1 and a^1 = a^log so r_match = +1 (y=1) or -1 (y=0):
    y = 1 -> 1 + 1 = 2; y = 0 -> -1 + 1 + lambda_sc * r_sc(a^log) = lambda_sc * r_sc(a^log). Returns [B].
    """
    _check_feedback(y)
    logged = torch.zeros(y.shape[0], dtype=torch.int64, device=y.device)
    r_match = match_reward(logged, logged, y)  # a^1 = a^log: always a match
    r_fmt = torch.ones_like(r_match)  # the logged item's text is well formed by construction
    return total_reward(r_match, r_fmt, r_sc_log, y, lambda_sc)


def simulated_click_reward(chosen_index: Tensor, click_probs: Tensor) -> Tensor:
    """The simulator as reward model (the online upper bound: a diagnostic, never an arm's update):

        r_sim(a^j) = P(click | a^j exposed)  for a well-formed rollout naming candidate a^j,   0 for a malformed one

    replacing r_match of step 2 (r = r_sim + r_fmt). chosen_index: int [B, K], the index into the example's
    candidates of the item each rollout named (-1: malformed); click_probs: [B, M], the simulator's click
    probability of every candidate of the example (abpo.sim.headroom.candidate_click_probabilities). Returns
    float32 [B, K]."""
    if chosen_index.dim() != 2 or click_probs.dim() != 2 or chosen_index.shape[0] != click_probs.shape[0]:
        raise ValueError(
            f"abpo.algo.rewards.simulated_click_reward: chosen_index {tuple(chosen_index.shape)} and click_probs "
            f"{tuple(click_probs.shape)}; rule: [B, K] and [B, M] with the same B"
        )
    if bool(((click_probs < 0) | (click_probs > 1)).any()):
        i = int(((click_probs < 0) | (click_probs > 1)).nonzero()[0, 0])
        raise ValueError(f"abpo.algo.rewards.simulated_click_reward: example {i}: a click probability outside [0, 1]")
    if bool((chosen_index >= click_probs.shape[1]).any()):
        raise ValueError(
            f"abpo.algo.rewards.simulated_click_reward: a chosen index >= {click_probs.shape[1]} candidates; rule: "
            "an index into the example's candidates or -1"
        )
    ok = chosen_index >= 0
    picked = torch.gather(click_probs.float(), 1, chosen_index.clamp(min=0))
    return torch.where(ok, picked, torch.zeros_like(picked))
