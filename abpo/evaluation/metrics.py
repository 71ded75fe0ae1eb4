"""Offline metrics of docs/ABPO_SPEC.md "Metrics": HR@K, NDCG@K (K = 1, 5) and Diversity@K.

The evaluation task predicts one held-out item x_{T+N} among its candidates, so each user has exactly one
relevant item and its 1-based rank r (1 = ranked first):

    HR@K        = mean_u 1[r_u <= K]
    NDCG@K      = mean_u 1[r_u <= K] / log2(r_u + 1)        (ideal DCG = 1 with a single relevant item)
    Diversity@K = 100 * mean_u (1/K) sum_{x in top-K(u)} (-log p(x) - L_min) / (L_max - L_min)

with p(x) the item's popularity share in the training data and [L_min, L_max] the range of -log p over the
dataset's items (L_min at the most, L_max at the least popular item): 100 = long tail only, 0 = popular only.
Because the min-max normalisation is affine, the share's denominator cancels: the per-item score is
(log c_max - log c_x) / (log c_max - log c_min) with c the interaction counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal


def _check_k(k: int) -> None:
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"abpo.evaluation.metrics: k = {k!r}; rule: K is an integer >= 1")


def _check_ranks(ranks: Sequence[int]) -> None:
    if len(ranks) == 0:
        raise ValueError("abpo.evaluation.metrics: no ranks given; rule: at least one user")
    for u, r in enumerate(ranks):
        if isinstance(r, bool) or int(r) != r or r < 1:
            raise ValueError(f"abpo.evaluation.metrics: ranks[{u}] = {r!r}; rule: a 1-based integer rank >= 1")


def target_rank(scores: Sequence[float], target_index: int) -> int:
    """1-based rank of candidate `target_index` when candidates are sorted by score, highest first.
    Ties are broken against the target (rank = 1 + #candidates scoring >= the target, itself excluded), so
    a constant scorer cannot look good."""
    if not 0 <= target_index < len(scores):
        raise ValueError(
            f"abpo.evaluation.metrics.target_rank: target_index {target_index}; rule: 0 <= index < {len(scores)}"
        )
    s = scores[target_index]
    if s != s:  # NaN
        raise ValueError(f"abpo.evaluation.metrics.target_rank: scores[{target_index}] is NaN; rule: finite score")
    return 1 + sum(1 for i, x in enumerate(scores) if i != target_index and x >= s)


def hit_rate_at_k(ranks: Sequence[int], k: int) -> float:
    """HR@K = mean_u 1[r_u <= K] (docs/ABPO_SPEC.md Metrics). `ranks`: 1-based rank of each user's target."""
    _check_k(k)
    _check_ranks(ranks)
    return sum(1.0 for r in ranks if r <= k) / len(ranks)


def ndcg_at_k(ranks: Sequence[int], k: int) -> float:
    """NDCG@K = mean_u 1[r_u <= K] / log2(r_u + 1) (docs/ABPO_SPEC.md Metrics; one relevant item, so IDCG = 1)."""
    _check_k(k)
    _check_ranks(ranks)
    return sum(1.0 / math.log2(r + 1) for r in ranks if r <= k) / len(ranks)


def popularity_range(popularity: Mapping[int, float]) -> tuple[float, float]:
    """(c_min, c_max): the dataset's popularity range over items with a positive count (or share)."""
    positive = [float(c) for c in popularity.values() if c > 0]
    if not positive:
        raise ValueError("abpo.evaluation.metrics: popularity has no item with a count > 0; rule: non-empty")
    c_min, c_max = min(positive), max(positive)
    if c_min == c_max:
        raise ValueError(
            f"abpo.evaluation.metrics: every item has popularity {c_max}; rule: the popularity range must not be "
            "degenerate (min-max normalisation divides by log c_max - log c_min)"
        )
    return c_min, c_max


def item_novelty(
    item: int, popularity: Mapping[int, float], c_min: float, c_max: float, unseen: Literal["raise", "tail"] = "raise"
) -> float:
    """(-log p(x) - L_min) / (L_max - L_min) = (log c_max - log c_x) / (log c_max - log c_min), in [0, 1]."""
    c = popularity.get(item, 0)
    if c <= 0:
        if unseen == "tail":
            return 1.0  # an item never seen in training is treated as the least popular one
        raise ValueError(
            f"abpo.evaluation.metrics.diversity_at_k: item {item} has no popularity in the training data; rule: "
            "every recommended item needs a count > 0 (pass unseen='tail' to score such items as the long tail)"
        )
    return (math.log(c_max) - math.log(float(c))) / (math.log(c_max) - math.log(c_min))


def diversity_at_k(
    topk_items: list[list[int]],
    popularity: dict[int, int],
    k: int,
    *,
    unseen: Literal["raise", "tail"] = "raise",
) -> float:
    """Diversity@K (docs/ABPO_SPEC.md Metrics), in [0, 100]:
    100 * mean_u (1/K) sum_{x in top-K(u)} min-max-normalised -log p(x), with the dataset's popularity range.

    topk_items: each user's ranked recommendations (at least K; the first K are used);
    popularity: item -> interaction count in the training data (Dataset.popularity()), or shares.
    """
    _check_k(k)
    if not topk_items:
        raise ValueError("abpo.evaluation.metrics.diversity_at_k: no users given; rule: at least one user")
    if unseen not in ("raise", "tail"):
        raise ValueError(f"abpo.evaluation.metrics.diversity_at_k: unseen = {unseen!r}; rule: 'raise' or 'tail'")
    c_min, c_max = popularity_range(popularity)
    per_user = []
    for u, items in enumerate(topk_items):
        if len(items) < k:
            raise ValueError(
                f"abpo.evaluation.metrics.diversity_at_k: user {u} has {len(items)} recommendations; rule: >= K = {k}"
            )
        scores = [item_novelty(int(x), popularity, c_min, c_max, unseen) for x in items[:k]]
        per_user.append(sum(scores) / k)  # (1/K) sum_{x in top-K(u)}
    return 100.0 * sum(per_user) / len(per_user)  # x100, averaged over users
