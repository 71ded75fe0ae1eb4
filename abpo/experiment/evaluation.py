"""The experiment's evaluation users (docs/ABPO_SPEC.md "Metrics"): the held-out targets of the users of
``experiment.eval_split``, and the metrics of any row's candidate scores on them (the same code for every row)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from abpo.data.candidates import build_eval_examples
from abpo.data.splits import split_of_user
from abpo.evaluation.metrics import diversity_at_k, hit_rate_at_k, ndcg_at_k, target_rank
from abpo.policy.sft import seeded_subsample

if TYPE_CHECKING:
    from abpo.config import Config

KS = (1, 5)


def eval_examples_for(cfg: Config, splits, ds) -> list:
    """The evaluation examples (target x_{T+N} + M_eval - 1 unseen negatives) of the users of
    ``experiment.eval_split``, at most ``experiment.max_eval_users`` of them (seeded by data.seed)."""

    e = cfg.experiment
    if e.eval_split not in ("test", "validation"):
        raise ValueError(f"experiment.eval_split={e.eval_split!r}; rule: test | validation")
    if not 0.0 < e.validation_fraction < 1.0:
        raise ValueError(f"experiment.validation_fraction={e.validation_fraction}; rule: in (0, 1)")
    chosen = [s for s in splits if split_of_user(s.user_id, e.validation_fraction) == e.eval_split]
    examples = build_eval_examples(chosen, ds, cfg.data)
    return seeded_subsample(examples, e.max_eval_users, cfg.data.seed)


def metrics_from_scores(examples: Sequence, scores: Sequence[Sequence[float]], popularity: Mapping[int, int]) -> dict:
    """HR@K, NDCG@K, Diversity@K (K = 1, 5) and the per-user ranks of the target from candidate scores (higher =
    better; ties count against the target). The same code for every row of the table."""

    ranks: list[int] = []
    tops: dict[int, list[list[int]]] = {k: [] for k in KS}  # K -> each request's top-K candidates
    for ex, row in zip(examples, scores, strict=True):
        s = np.asarray(row, dtype=np.float64)
        if s.shape != (len(ex.candidates),) or not np.all(np.isfinite(s)):
            raise ValueError(
                f"request {ex.request_id}: {s.shape} scores for {len(ex.candidates)} candidates (or not finite)"
            )
        ranks.append(target_rank(s.tolist(), list(ex.candidates).index(ex.positive)))
        order = sorted(range(len(s)), key=lambda m: (-s[m], m))
        for k in KS:
            tops[k].append([ex.candidates[m] for m in order[:k]])
    out: dict[str, Any] = {"ranks": ranks, "users": [int(ex.user_id) for ex in examples]}
    for k in KS:
        out[f"HR@{k}"] = hit_rate_at_k(ranks, k)
        out[f"NDCG@{k}"] = ndcg_at_k(ranks, k)
        out[f"Diversity@{k}"] = diversity_at_k(tops[k], dict(popularity), k, unseen="tail")
    return out
