"""The non-LLM rankers (abpo.baselines): interface, determinism, errors, propensities, and a real check on the
bundled MovieLens that both beat random ranking."""

from __future__ import annotations

import numpy as np
import pytest

from abpo.baselines import make_ranker, softmax_propensities
from abpo.baselines.als import ALSRanker
from abpo.baselines.popularity import PopularityRanker

SEQS = {1: [1, 2, 3, 4], 2: [2, 3, 5], 3: [1, 2, 6, 2], 4: [7, 8, 2]}
ITEMS = list(range(1, 11))


def test_popularity_counts_by_hand_and_window():
    p = PopularityRanker().fit(SEQS, ITEMS)
    s = p.score([(9, [1], [2, 1, 10])])[0]
    assert s.tolist() == pytest.approx([np.log(6), np.log(3), 0.0])  # item 2 x5, item 1 x2, item 10 never
    w = PopularityRanker(window=1).fit(SEQS, ITEMS)  # last item of each user: 4, 5, 2, 2
    assert w.score([(9, [], [2, 4, 1])])[0].tolist() == pytest.approx([np.log(3), np.log(2), 0.0])
    with pytest.raises(ValueError, match="window"):
        PopularityRanker(window=-1)


def test_als_is_deterministic_and_scores_from_the_request_history():
    a = ALSRanker(factors=8, iterations=5, seed=3).fit(SEQS, ITEMS)
    b = ALSRanker(factors=8, iterations=5, seed=3).fit(SEQS, ITEMS)
    req = [(1, [1, 2], [3, 6, 9]), (99, [7], [8, 3, 1])]  # user 99 unknown at fit: the history is the user
    sa, sb = a.score(req), b.score(req)
    assert all(np.array_equal(x, y) for x, y in zip(sa, sb))
    assert [x.shape for x in sa] == [(3,), (3,)] and all(np.isfinite(x).all() for x in sa)
    assert not np.array_equal(a.score([(1, [7, 8], [3, 6, 9])])[0], sa[0])  # another history, other scores
    with pytest.raises(ValueError, match="not in the catalog"):
        a.score([(1, [1], [3, 42])])
    with pytest.raises(ValueError, match="not in the catalog"):
        ALSRanker().fit({1: [1, 42]}, ITEMS)
    with pytest.raises(RuntimeError, match="fit first"):
        ALSRanker().score(req)


def test_softmax_propensities_are_a_distribution_over_candidates():
    p = softmax_propensities(np.array([0.0, np.log(3.0), -50.0]), 1.0)
    assert p.sum() == pytest.approx(1.0) and (p > 0).all() and p[1] == pytest.approx(3 * p[0])
    assert softmax_propensities(np.array([1.0, 2.0]), 100.0)[0] == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match="temperature"):
        softmax_propensities(np.array([1.0]), 0.0)


def test_make_ranker_by_row_name():
    from abpo.config import load_config

    cfg = load_config("tiny", ["experiment.ml_retrain_epochs=3"])
    assert make_ranker("popularity", seed=0).name == "popularity"
    r = make_ranker("ml_retrain", seed=1, ml_retrain_epochs=cfg.experiment.ml_retrain_epochs)
    assert r.name == "ml_retrain" and r.params["iterations"] == 3 and r.seed == 1
    with pytest.raises(ValueError, match="unknown ranker"):
        make_ranker("bert4rec", seed=0)


@pytest.mark.slow
def test_both_beat_random_on_movielens(movielens):
    """Last item of every user's sequence among 99 random unseen items: HR@5 far above random 5/100."""
    from scipy.stats import binomtest

    seqs = {u: s[:-1] for u, s in movielens.sequences.items()}
    ids = movielens.item_ids()
    rng = np.random.default_rng(0)
    reqs = []
    for u, s in movielens.sequences.items():
        seen = set(s)
        negs = [int(i) for i in rng.choice(ids, 400, replace=False) if i not in seen][:99]
        reqs.append((u, s[:-1], [s[-1], *negs]))
    for ranker in (PopularityRanker(), ALSRanker(seed=0)):
        scores = ranker.fit(seqs, ids.tolist()).score(reqs)
        hits = sum(int((x > x[0]).sum() + (x == x[0]).sum() <= 5) for x in scores)  # ties count against
        assert hits / len(reqs) > 0.2, ranker.name
        assert binomtest(hits, len(reqs), 0.05, alternative="greater").pvalue < 1e-10
