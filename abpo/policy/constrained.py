"""Candidate-constrained rollouts: sampling answers that always name one of the request's candidates.

A rollout of the update is an answer ``<item_id>ID</item_id><item>TITLE</item>`` + EOS. Sampled freely, a small
model names ids outside the candidate set C or garbles the title, and then no rollout ever earns a format or match
reward (no learning signal). With constrained rollouts (``policy.constrained_rollouts``), each decoding step may
only emit a token that continues one of the well-formed answers of C (a token trie of r(a) + EOS for every a in
C, ``AnswerTrie``): at the item-id position only ids of C are allowed, and once the id is chosen the rest of the
answer (``</item_id><item>TITLE</item>`` and EOS) is the only continuation. With the tiny tokenizer (one token per
item id) the only real choice is the id token; with a tokenizer that splits ids into several tokens, the trie
branches at each of them.

Which distribution the rollouts come from, and which log-probs the update uses
----------------------------------------------------------------------------------
Generation masks every token outside the trie's continuations before the temperature is applied, so rollout a is
drawn from the *constrained policy*

    q_theta(a | q) = prod_t softmax_{v in S_t}( z_t[v] / T )[a_t]                                     (Eq. q)

where z_t are pi_theta's logits at step t, S_t the allowed continuations of a_<t and T the rollout temperature.
Forced steps (|S_t| = 1) have probability 1; with one token per item id, q_theta(a|q) is exactly
softmax over the candidates' id-token logits: a categorical policy over C.

The update's log-probs, both the stored "old" ones and the recomputed ones inside the loss, are log q_theta
(``constrained_token_logps``), never the unconstrained log pi_theta of the same tokens. The ratio
s = q_theta / q_old is then the likelihood ratio of the policy that actually sampled the rollouts, and
A * grad log q_theta(a) with a ~ q_old is the ordinary (unbiased) score-function policy gradient of
E_{a ~ q_theta}[A], the objective of docs/ABPO_SPEC.md step 5 for that sampling policy. Using log pi_theta instead
would add sum_t A * grad log pi_theta(S_t | a_<t): a term that pushes probability onto (or off) whole allowed sets,
e.g. raises every title token of rewarded answers, which is not a gradient of the sampled objective.
Forced tokens have log q = 0 and no gradient. Self-certainty (r_sc) still uses pi_theta's full-vocabulary
next-token distribution, as docs/ABPO_SPEC.md defines it (KL of the uniform distribution over the vocabulary), but only
at the positions that carry a choice (``AnswerTrie.choice_mask``): a forced title token says how confidently the
model copies a title, not how sure it is of the item.

When only the first step branches (one token per item id: ``AnswerTrie.single_choice``), a rollout is one draw
from softmax_{a in C}(z[item_token(a)] / T) followed by its forced tokens, and ``sample_single_choice`` makes it
with one forward over each distinct prompt instead of one decoding step per answer token (the same distribution,
Eq. q). Under q_theta the forced tokens have probability 1: log q_theta(a | q) is the choice position's constrained
log-softmax alone, and the hidden states after it enter neither the log-prob nor its gradient, so the loss runs the
decoder only up to the last branching position (abpo.train.rollouts.constrained_logps).

Top-p / top-k / min-p would truncate the masked distribution and break (Eq. q); constrained rollouts require them
off (``check_sampling``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import LogitsProcessor

from abpo.policy.token_scoring import PromptLogits

PAD_ALLOWED = -1  # padding of the allowed-token tensor


class ConstrainedRolloutError(RuntimeError):
    """A constrained rollout left the answer trie (a token outside the allowed continuations was emitted)."""


class AnswerTrie:
    """Token trie of the well-formed answers of one candidate set: r(a) token ids + EOS for every a in C."""

    def __init__(self, answer_ids: Sequence[Sequence[int]], eos_token_id: int):
        if not answer_ids:
            raise ValueError("AnswerTrie: empty candidate set")
        self.root: dict[int, dict] = {}
        for m, ids in enumerate(answer_ids):
            if not ids:
                raise ValueError(f"AnswerTrie: answer {m} tokenizes to nothing")
            node = self.root
            for t in [*ids, int(eos_token_id)]:
                node = node.setdefault(int(t), {})

    def walk(self, tokens: Sequence[int]) -> dict[int, dict] | None:
        """The node reached after ``tokens`` (None when they leave the trie)."""
        node = self.root
        for t in tokens:
            nxt = node.get(int(t))
            if nxt is None:
                return None
            node = nxt
        return node

    @property
    def single_choice(self) -> bool:
        """True when only the first token branches: every answer is its first token + a forced chain (+ EOS)."""
        cached = getattr(self, "_single_choice", None)
        if cached is None:

            def chain(node: dict) -> bool:
                while node:
                    if len(node) != 1:
                        return False
                    node = next(iter(node.values()))
                return True

            cached = all(chain(child) for child in self.root.values())
            self._single_choice = cached
        return cached

    def forced_tail(self, first: int) -> list[int]:
        """The tokens forced after first token ``first`` (up to and including EOS) in a ``single_choice`` trie."""
        node = self.root.get(int(first))
        if node is None:
            raise ConstrainedRolloutError(f"token {first} is not a first answer token of this candidate set")
        out = []
        while node:
            if len(node) != 1:
                raise ConstrainedRolloutError("forced_tail: the answer branches after its first token")
            tok, node = next(iter(node.items()))
            out.append(int(tok))
        return out

    def choice_mask(self, completion: Sequence[int]) -> list[int]:
        """1 at the positions of ``completion`` that carry a choice, 0 at forced ones: position t is a choice when
        the answers of C branch there (more than one allowed continuation of completion[:t]); once the completion
        leaves the trie (a free, malformed answer) every later token is free text and counts as a choice. With one
        token per item id that is the item token alone."""
        out = []
        node: dict | None = self.root
        for tok in completion:
            if node is None:  # already left the trie: free text
                out.append(1)
                continue
            nxt = node.get(int(tok))
            out.append(1 if (len(node) != 1 or nxt is None) else 0)  # a branch, or a step off the trie
            node = nxt
        return out

    def allowed_per_position(self, completion: Sequence[int]) -> list[list[int]]:
        """S_t for every position t of ``completion``: the allowed tokens given completion[:t] (sorted).

        Raises ConstrainedRolloutError when completion[t] is not in S_t (it was not sampled under this trie)."""
        out = []
        node = self.root
        for t, tok in enumerate(completion):
            if not node:
                raise ConstrainedRolloutError(f"token {tok} at position {t} follows a finished answer (after EOS)")
            out.append(sorted(node))
            nxt = node.get(int(tok))
            if nxt is None:
                raise ConstrainedRolloutError(
                    f"token {tok} at position {t} is not an allowed continuation {out[-1][:8]}... of the answer trie"
                )
            node = nxt
        return out


class CandidateConstraint(LogitsProcessor):
    """HF ``generate`` logits processor: row r of the batch may only continue its own ``tries[r]``.

    The first call sees the (left-padded) prompts; the prompt length is taken from it, and every later call
    advances each row's trie node by the token generated since. Rows that finished their answer (after EOS) or
    whose trie is None are left unconstrained (``generate`` pads finished rows itself). Masking happens before
    temperature and the sampling warpers (HF applies custom processors first)."""

    def __init__(self, tries: Sequence[AnswerTrie | None]):
        self.tries = list(tries)
        self.nodes: list[dict | None] = [t.root if t is not None else None for t in self.tries]
        self.prompt_length: int | None = None
        self.generated = 0
        self._allowed_cache: dict[int, torch.Tensor] = {}

    def _allowed(self, node: dict) -> torch.Tensor:
        key = id(node)
        t = self._allowed_cache.get(key)
        if t is None:
            t = torch.tensor(sorted(node), dtype=torch.long)
            self._allowed_cache[key] = t
        return t

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # LogitsProcessor's
        if input_ids.shape[0] != len(self.tries):
            raise ValueError(f"CandidateConstraint: batch of {input_ids.shape[0]} rows for {len(self.tries)} tries")
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        new = input_ids.shape[1] - self.prompt_length
        if new > self.generated:
            toks = input_ids[:, self.prompt_length + self.generated : self.prompt_length + new].tolist()
            for r, row in enumerate(toks):
                node = self.nodes[r]
                for tok in row:
                    if node is None or not node:  # unconstrained row, or answer finished (padding follows)
                        break
                    nxt = node.get(int(tok))
                    if nxt is None:
                        raise ConstrainedRolloutError(
                            f"rollout row {r}: token {tok} is not an allowed continuation of its candidates' answers"
                        )
                    node = nxt
                self.nodes[r] = node
            self.generated = new
        rows, cols = [], []
        for r, node in enumerate(self.nodes):
            if node:  # non-empty: constrained step
                a = self._allowed(node)
                rows.append(torch.full_like(a, r))
                cols.append(a)
        if not rows:
            return scores
        rows_t, cols_t = torch.cat(rows).to(scores.device), torch.cat(cols).to(scores.device)
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep[rows_t, cols_t] = True
        constrained = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)
        constrained[rows_t] = True
        keep |= ~constrained[:, None]  # unconstrained rows keep everything
        return scores.masked_fill(~keep, float("-inf"))


@torch.no_grad()
def sample_single_choice(
    model,
    prompt_ids: Sequence[Sequence[int]],
    tries: Sequence[AnswerTrie],
    temperature: float,
    *,
    batch_tokens: int = 16384,
    generator: torch.Generator | None = None,
) -> tuple[list[list[int]], PromptLogits]:
    """Constrained rollouts for ``single_choice`` tries with one forward per distinct prompt: for each row r, its
    first answer token is drawn from softmax_{v in S_0}(z_r[v] / T) (Eq. q at the only branching step, S_0 = the
    first tokens of ``tries[r]``), then its forced tail (title markup and EOS) is appended. z are the prompts'
    next-token logits (``PromptLogits``: each distinct prompt once, groups of at most ``batch_tokens`` positions; TRL
    repeats a logged example's prompt for each of its rollouts), the draws one per row in the rows' order (the same
    draws as a forward per row). Returns the completions and the distinct prompts' full-vocabulary logits (float32:
    self-certainty, and e_old under the same policy)."""
    if not tries or len(tries) != len(prompt_ids):
        raise ValueError(f"sample_single_choice: {len(prompt_ids)} prompts for {len(tries)} tries")
    if not all(t.single_choice for t in tries):
        raise ValueError("sample_single_choice: a candidate set's answers branch after their first token")
    logits = PromptLogits.of(model, prompt_ids, batch_tokens=batch_tokens)
    z = logits.logits
    out = []
    for u, trie in zip(logits.rows(prompt_ids).tolist(), tries):
        allowed = torch.tensor(sorted(trie.root), dtype=torch.long)
        probs = torch.softmax(z[u, allowed] / temperature, dim=-1)
        first = int(allowed[torch.multinomial(probs, 1, generator=generator)])
        out.append([first, *trie.forced_tail(first)])
    return out, logits


def check_sampling(*, top_p: float, top_k: int | None, min_p: float | None) -> None:
    """Constrained rollouts sample from (Eq. q) exactly: no truncation of the masked distribution."""
    bad = []
    if top_p is not None and top_p < 1.0:
        bad.append(f"top_p={top_p}")
    if top_k:
        bad.append(f"top_k={top_k}")
    if min_p:
        bad.append(f"min_p={min_p}")
    if bad:
        raise ValueError(
            f"policy.constrained_rollouts: {', '.join(bad)}; rule: constrained rollouts sample from the full "
            "candidate-constrained softmax (their log-probs are computed from it), so top_p = 1 and no top_k/min_p"
        )


def allowed_tensor(tries: Sequence[AnswerTrie], completions: Sequence[Sequence[int]], length: int) -> torch.Tensor:
    """``[N, length, K]`` int64: S_t of every completion position (PAD_ALLOWED-padded to the largest |S_t|);
    positions past a completion's end hold only padding."""
    per_row = [tr.allowed_per_position(c) for tr, c in zip(tries, completions, strict=True)]
    k = max((len(s) for row in per_row for s in row), default=1)
    out = np.full((len(per_row), length, max(k, 1)), PAD_ALLOWED, dtype=np.int64)
    rows: list[int] = []  # one indexed write of every entry (a tensor per S_t was slow)
    cols: list[int] = []
    slots: list[int] = []
    values: list[int] = []
    for r, row in enumerate(per_row):
        for t, s in enumerate(row[:length]):
            rows += [r] * len(s)
            cols += [t] * len(s)
            slots += range(len(s))
            values += s
    out[rows, cols, slots] = values
    return torch.from_numpy(out)


def constrained_token_logps(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    completion_ids: torch.Tensor,
    allowed: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log q_theta(a_t | q, a_<t) of (Eq. q) for every completion token, and the entropy of the constrained
    step distribution, both ``[N, T]``.

    hidden: ``[N, T, H]`` the decoder's final hidden states at the positions that predict completion tokens 0..T-1;
    allowed: ``[N, T, K]`` from ``allowed_tensor``. Only branching positions (|S_t| > 1) are projected, and only
    on the rows of the LM head for S_t; forced positions get log q = 0 and entropy 0 (exactly, no gradient)."""
    n, t = completion_ids.shape
    logps = hidden.new_zeros((n, t))
    entropy = hidden.new_zeros((n, t))
    sizes = (allowed != PAD_ALLOWED).sum(-1)  # |S_t|
    branch = sizes > 1
    if not branch.any():
        return logps, entropy
    rows, cols = branch.nonzero(as_tuple=True)
    ids = allowed[rows, cols]  # [B, K]
    valid = ids != PAD_ALLOWED
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"constrained_token_logps: lm_head.weight is a {type(weight).__name__}, not a tensor")
    w = weight[ids.clamp(min=0)]  # [B, K, H]
    z = torch.einsum("bh,bkh->bk", hidden[rows, cols], w)
    if bias is not None:
        z = z + bias[ids.clamp(min=0)]
    z = (z.float() / temperature).masked_fill(~valid, float("-inf"))
    logq = torch.log_softmax(z, dim=-1)  # softmax over S_t only
    chosen = completion_ids[rows, cols]
    hit = ids == chosen[:, None]
    if not bool(hit.any(-1).all()):
        raise ConstrainedRolloutError("constrained_token_logps: a completion token is not in its allowed set")
    picked = logq.masked_fill(~hit, 0.0).sum(-1)
    p = logq.exp()
    ent = -(p * logq.masked_fill(~valid, 0.0)).sum(-1)
    logps = logps.index_put((rows, cols), picked.to(logps.dtype))
    entropy = entropy.index_put((rows, cols), ent.detach().to(entropy.dtype))
    return logps, entropy
