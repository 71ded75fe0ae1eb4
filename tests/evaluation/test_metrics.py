"""docs/ABPO_SPEC.md "Metrics": HR@K, NDCG@K and Diversity@K against hand-computed values."""

import math

import pytest

from abpo.evaluation.metrics import diversity_at_k, hit_rate_at_k, ndcg_at_k, target_rank

RANKS = [1, 3, 6, 2]  # 1-based rank of each user's held-out item


def test_hit_rate_hand_example():
    # K=1: only rank 1 -> 1/4;  K=5: ranks 1, 3, 2 -> 3/4
    assert hit_rate_at_k(RANKS, 1) == 0.25
    assert hit_rate_at_k(RANKS, 5) == 0.75
    assert hit_rate_at_k(RANKS, 6) == 1.0  # rank 6 counts at K = 6 (<=, not <)


def test_ndcg_hand_example():
    # K=5: (1/log2(2) + 1/log2(4) + 0 + 1/log2(3)) / 4 = (1 + 0.5 + 0.6309298) / 4 = 0.5327324
    assert ndcg_at_k(RANKS, 5) == pytest.approx((1 + 0.5 + 1 / math.log2(3)) / 4)
    assert ndcg_at_k(RANKS, 5) == pytest.approx(0.5327324, abs=1e-7)
    # K=1: NDCG@1 = HR@1 (only rank 1 scores, with gain 1)
    assert ndcg_at_k(RANKS, 1) == hit_rate_at_k(RANKS, 1) == 0.25


@pytest.mark.parametrize("bad", [[0], [1.5], [-2], []])
def test_rank_validation(bad):
    with pytest.raises(ValueError, match="rank|at least one user"):
        hit_rate_at_k(bad, 5)


def test_k_validation():
    with pytest.raises(ValueError, match="K is an integer >= 1"):
        ndcg_at_k(RANKS, 0)


def test_target_rank_breaks_ties_against_the_target():
    assert target_rank([0.1, 0.9, 0.5], 1) == 1
    assert target_rank([0.1, 0.9, 0.5], 0) == 3
    assert target_rank([0.5, 0.5, 0.5], 1) == 3  # a constant scorer ranks the target last
    with pytest.raises(ValueError, match="index"):
        target_rank([0.1], 1)


# Popularity (training interaction counts): range c_min = 1, c_max = 1000 (over the whole dataset, item 5 included)
POP = {1: 100, 2: 10, 3: 1, 4: 1000, 5: 50}
# novelty(x) = (log 1000 - log c_x) / (log 1000 - log 1):
#   item 4: 0;  item 1: (3 - 2)/3 = 1/3;  item 2: (3 - 1)/3 = 2/3;  item 3: 1;  item 5: (3 - log10 50)/3


def test_diversity_hand_example():
    # user A top-2 [4, 3]: (0 + 1)/2 = 1/2;  user B top-2 [1, 4]: (1/3 + 0)/2 = 1/6
    # Diversity@2 = 100 * (1/2 + 1/6) / 2 = 100/3 = 33.333...
    assert diversity_at_k([[4, 3], [1, 4]], POP, 2) == pytest.approx(100 / 3)
    # only the first K items count: the extra items (2, 3) are ignored at K = 1 -> 100 * (0 + 1/3)/2 = 16.67
    assert diversity_at_k([[4, 2, 3], [1, 3]], POP, 1) == pytest.approx(100 / 6)
    # long tail only -> 100, most popular only -> 0
    assert diversity_at_k([[3]], POP, 1) == pytest.approx(100.0)
    assert diversity_at_k([[4]], POP, 1) == pytest.approx(0.0)


def test_diversity_uses_the_dataset_range_not_the_recommended_items_range_and_ignores_the_scale():
    # user [5, 2] (counts 50 and 10) with the dataset's range 1..1000:
    #   ((3 - log10 50)/3 + (3 - 1)/3) / 2 = (0.4336766 + 0.6666667) / 2 = 0.5501717 -> 55.02
    # normalising over the recommended items' own range (10..50) would give (0 + 1)/2 -> 50 instead
    expected = 100 * ((3 - math.log10(50)) / 3 + 2 / 3) / 2
    assert expected == pytest.approx(55.01717, abs=1e-4)
    assert diversity_at_k([[5, 2]], POP, 2) == pytest.approx(expected)
    # p as shares instead of counts gives the same value (the min-max normalisation removes the denominator)
    total = sum(POP.values())
    shares = {i: c / total for i, c in POP.items()}
    assert diversity_at_k([[5, 2]], shares, 2) == pytest.approx(expected)


def test_diversity_errors_and_unseen_items():
    with pytest.raises(ValueError, match="item 9 has no popularity"):
        diversity_at_k([[4, 9]], POP, 2)
    assert diversity_at_k([[4, 9]], POP, 2, unseen="tail") == pytest.approx(50.0)  # (0 + 1)/2
    with pytest.raises(ValueError, match="user 1 has 1 recommendations"):
        diversity_at_k([[4, 3], [1]], POP, 2)
    with pytest.raises(ValueError, match="degenerate"):
        diversity_at_k([[1]], {1: 5, 2: 5}, 1)
    with pytest.raises(ValueError, match="no users"):
        diversity_at_k([], POP, 1)
