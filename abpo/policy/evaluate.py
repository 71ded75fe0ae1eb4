"""Offline evaluation of a policy on held-out targets (docs/ABPO_SPEC.md "Metrics"): candidates ranked by s_p
(HR@K, NDCG@K, Diversity@K) and, optionally, greedy generation parsed strictly (HR@1-by-generation and the
share of malformed answers). The random baseline of HR@K is K/M."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from abpo.evaluation.metrics import diversity_at_k, hit_rate_at_k, ndcg_at_k, target_rank
from abpo.policy.prompt import example_prompt, parse_answer
from abpo.policy.scoring import generate_answers, score_examples, top_k


class NonFiniteScores(ValueError):
    """A policy scored a candidate NaN or infinite (NaN weights, an overflow): no rank or metric of it means
    anything; the message names the request and how many scores."""


def check_finite_scores(scored: Sequence[Any]) -> None:
    """NonFiniteScores naming the first request whose candidate scores s_p (Eq. s_p) are not all finite, and how
    many requests are like it; nothing when every score is finite."""
    import torch

    bad = [s for s in scored if not bool(torch.isfinite(torch.as_tensor(s.scores)).all())]
    if bad:
        s = bad[0]
        n = int((~torch.isfinite(torch.as_tensor(s.scores))).sum())
        raise NonFiniteScores(
            f"request {s.example.request_id}: {n} of {len(s.scores)} candidate scores not finite "
            f"({len(bad)} of {len(scored)} requests like it); rule: finite scores"
        )


@dataclass
class EvalResult:
    n_users: int
    n_candidates: int  # M (the largest when sets differ)
    metrics: dict[str, float] = field(default_factory=dict)  # HR@K, NDCG@K, Diversity@K, random_HR@K, gen_*
    ranks: list[int] = field(default_factory=list)
    malformed: dict[str, int] = field(default_factory=dict)  # reason -> count (generation only)

    def hits(self, k: int) -> int:
        """Users whose target is in the top k."""
        return sum(1 for r in self.ranks if r <= k)

    def p_value(self, k: int) -> float:
        """One-sided exact binomial test of HR@k > K/M (H0: the ranking is random, each user a hit with
        probability K/M)."""
        from scipy.stats import binomtest

        p0 = min(1.0, self.metrics[f"random_HR@{k}"])
        return float(binomtest(self.hits(k), len(self.ranks), p0, alternative="greater").pvalue)

    def lines(self) -> list[str]:
        out = [f"users: {self.n_users}, candidates per user: {self.n_candidates}"]
        for k in sorted({int(key.split("@")[1]) for key in self.metrics if key.startswith("HR@")}):
            out.append(
                f"HR@{k} = {self.metrics[f'HR@{k}']:.4f} (random K/M = {self.metrics[f'random_HR@{k}']:.4f}; "
                f"{self.hits(k)}/{len(self.ranks)} hits, one-sided binomial p = {self.p_value(k):.2g}), "
                f"NDCG@{k} = {self.metrics[f'NDCG@{k}']:.4f}"
                + (
                    f", Diversity@{k} = {self.metrics[f'Diversity@{k}']:.2f}"
                    if f"Diversity@{k}" in self.metrics
                    else ""
                )
            )
        if "gen_HR@1" in self.metrics:
            out.append(
                f"generation: HR@1 = {self.metrics['gen_HR@1']:.4f}, well-formed = {self.metrics['gen_well_formed']:.4f}"
                + (f", malformed reasons {dict(self.malformed)}" if self.malformed else "")
            )
        return out


def evaluate_policy(
    model,
    tokenizer,
    examples: Sequence[Any],
    titles: Mapping[int, str],
    policy_cfg,
    *,
    ks: Sequence[int] = (1, 5),
    popularity: Mapping[int, int] | None = None,
    generation: bool = False,
    progress: bool | str = "evaluate",
) -> EvalResult:
    """Rank every example's candidates by s_p (Eq. s_p) and score the held-out ``positive``; with ``generation``
    also generate greedily (``policy.max_answer_tokens``) and parse (HR@1-by-generation)."""
    if not examples:
        raise ValueError("evaluate_policy: no evaluation examples")
    scored = score_examples(model, tokenizer, examples, titles, policy_cfg, progress=progress)
    check_finite_scores(scored)  # a NaN score has no rank (NonFiniteScores, a ValueError naming the request)
    ranks = [target_rank(s.scores.tolist(), s.positive_index) for s in scored]
    m = max(len(e.candidates) for e in examples)
    res = EvalResult(n_users=len(examples), n_candidates=m, ranks=ranks)
    for k in ks:
        res.metrics[f"HR@{k}"] = hit_rate_at_k(ranks, k)
        res.metrics[f"NDCG@{k}"] = ndcg_at_k(ranks, k)
        res.metrics[f"random_HR@{k}"] = sum(min(k, len(e.candidates)) / len(e.candidates) for e in examples) / len(
            examples
        )
        if popularity:
            tops = [top_k(s.scores, s.example.candidates, k) for s in scored]
            res.metrics[f"Diversity@{k}"] = diversity_at_k(tops, dict(popularity), k, unseen="tail")
    if generation:
        prompts = [example_prompt(e, titles, tokenizer, policy_cfg).text for e in examples]
        answers = generate_answers(
            model,
            tokenizer,
            prompts,
            max_new_tokens=policy_cfg.max_answer_tokens,
            batch_size=policy_cfg.generation_batch_size,
        )
        reasons: Counter[str] = Counter()
        hits = ok = 0
        for e, a in zip(examples, answers, strict=True):
            p = parse_answer(a, {c: titles[c] for c in e.candidates})
            if p.reason is None:  # well formed
                ok += 1
                hits += int(p.item_id == e.positive)
            else:
                reasons[p.reason.split(":")[0]] += 1
        res.metrics["gen_HR@1"] = hits / len(examples)
        res.metrics["gen_well_formed"] = ok / len(examples)
        res.malformed = dict(reasons)
    return res
