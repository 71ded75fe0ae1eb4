import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from abpo.data.candidates import (
    _candidate_sets,
    _Catalog,
    _UserNegatives,
    _weighted_first_distinct,
    assert_target_held_out,
    build_bandit_requests,
    build_eval_examples,
    build_sup_examples,
    training_popularity,
)
from abpo.data.splits import UserSplit, split_users

AMAZON = Path(os.environ.get("ABPO_AMAZON18_DIR", Path(__file__).resolve().parents[3] / "shared" / "data" / "amazon18"))


@pytest.fixture(scope="module")
def ml_sets(movielens):
    from abpo.config import load_config

    cfg = load_config("tiny").data
    splits, _ = split_users(movielens, cfg)
    return (
        cfg,
        splits,
        {
            "sup": build_sup_examples(splits, movielens, cfg),
            "bandit": build_bandit_requests(splits, movielens, cfg),
            "eval": build_eval_examples(splits, movielens, cfg),
        },
    )


def test_held_out_target_never_in_any_training_candidate_set(ml_sets):
    cfg, splits, sets = ml_sets
    target = {s.user_id: s.target for s in splits}
    for ex in sets["sup"] + sets["bandit"]:
        assert target[ex.user_id] not in ex.candidates
        assert target[ex.user_id] not in ex.history
    assert assert_target_held_out(splits, sets["sup"], sets["bandit"]) == len(sets["sup"]) + len(sets["bandit"])
    # the guard itself fails on a leak
    leaky = sets["bandit"][0]
    bad = type(leaky)(
        leaky.request_id, leaky.user_id, leaky.history, [*leaky.candidates, target[leaky.user_id]], leaky.positive
    )
    with pytest.raises(AssertionError, match=f"request {leaky.request_id}: held-out target"):
        assert_target_held_out(splits, [bad])


def test_training_candidates_are_positive_plus_unseen_distractors(ml_sets, movielens):
    cfg, splits, sets = ml_sets
    by_user = {s.user_id: set(s.sequence) for s in splits}
    catalog = set(movielens.item_ids().tolist())
    for ex in sets["sup"] + sets["bandit"]:
        c = ex.candidates
        assert len(c) == cfg.train_candidates == len(set(c)) and ex.positive in c
        distractors = set(c) - {ex.positive}
        assert not distractors & by_user[ex.user_id]  # never interacted with (whole sequence)
        assert distractors <= catalog


def test_sup_and_bandit_positions(ml_sets):
    cfg, splits, sets = ml_sets
    s = splits[0]
    sup = [e for e in sets["sup"] if e.user_id == s.user_id]
    T = len(s.history)
    # every pair (x_{1:t}, x_{t+1}) inside x_{1:T} (sup_examples_per_user = 0: all), chronological
    assert cfg.sup_examples_per_user == 0
    assert [len(e.history) for e in sup] == list(range(1, T))
    assert all(e.positive == s.history[len(e.history)] for e in sup)
    assert sup[-1].positive == s.history[-1]  # D_sup never reaches into the update range
    bandit = [e for e in sets["bandit"] if e.user_id == s.user_id]
    # t' in {T..T+N-2}: history x_{1:t'}, positive x_{t'+1}
    assert [len(e.history) for e in bandit] == list(range(T, T + cfg.update_steps))
    assert [e.positive for e in bandit] == s.update
    ids = [e.request_id for v in sets.values() for e in v]
    assert len(ids) == len(set(ids))  # request ids unique across all three sets


def test_sup_takes_the_latest_pairs_when_capped(movielens, data_cfg):
    data_cfg.sup_examples_per_user = 8
    splits, _ = split_users(movielens, data_cfg)
    s = max(splits, key=lambda s: len(s.history))
    sup = build_sup_examples([s], movielens, data_cfg)
    T = len(s.history)
    assert [len(e.history) for e in sup] == list(range(T - 8, T))
    assert [e.positive for e in sup] == s.history[T - 8 :]


def test_eval_set_has_target_random_and_popular_unseen_negatives(ml_sets, movielens):
    cfg, splits, sets = ml_sets
    pop = training_popularity(splits, movielens)
    catalog = movielens.item_ids()
    median_pop = np.median([pop.get(int(i), 0) for i in catalog])
    hard_share = []
    for s, ex in zip(splits, sets["eval"]):
        assert ex.user_id == s.user_id and ex.positive == s.target and ex.history == s.sequence[:-1]
        assert len(ex.candidates) == cfg.eval_candidates == len(set(ex.candidates))
        assert s.target in ex.candidates
        negs = set(ex.candidates) - {s.target}
        assert not negs & set(s.sequence)
        hard_share.append(np.mean([pop.get(n, 0) > median_pop for n in negs]))
    # half the negatives are popularity-weighted: far more popular negatives than uniform would give
    assert np.mean(hard_share) > 0.6


def test_training_popularity_excludes_held_out_targets(ml_sets, movielens):
    _, splits, _ = ml_sets
    full, train = movielens.popularity(), training_popularity(splits, movielens)
    assert sum(full.values()) - sum(train.values()) == len(splits)
    t = splits[0].target
    assert train.get(t, 0) == full[t] - Counter(s.target for s in splits)[t]


def test_reproducible_from_the_seed_and_independent_of_other_users(movielens, data_cfg, ml_sets):
    _, splits, sets = ml_sets
    again = {
        "sup": build_sup_examples(splits, movielens, data_cfg),
        "bandit": build_bandit_requests(splits, movielens, data_cfg),
        "eval": build_eval_examples(splits, movielens, data_cfg),
    }
    assert again == sets
    # a user's examples depend only on the seed, their sequence and the popularity weights (fixed here)
    pop = training_popularity(splits, movielens)
    pair = {splits[5].user_id, splits[6].user_id}
    for name, build in (("sup", build_sup_examples), ("bandit", build_bandit_requests), ("eval", build_eval_examples)):
        sub = build(splits[5:7], movielens, data_cfg, popularity=pop)
        assert sub == [e for e in sets[name] if e.user_id in pair], name
    data_cfg.seed = 1
    other = build_bandit_requests(splits, movielens, data_cfg)
    assert [e.candidates for e in other] != [e.candidates for e in sets["bandit"]]
    assert [e.positive for e in other] == [e.positive for e in sets["bandit"]]


def test_candidate_order_is_shuffled(ml_sets):
    _, _, sets = ml_sets
    where = Counter(e.candidates.index(e.positive) for e in sets["bandit"])
    assert len(where) > 10  # the positive is not always in the same slot


def _negatives(unseen_weights: list[int]) -> tuple[_Catalog, _UserNegatives]:
    """A catalog 1..n+1 where the user saw item n+1 only; unseen item i+1 has popularity unseen_weights[i]."""

    class _DS:
        def item_ids(self):
            return np.arange(1, len(unseen_weights) + 2)

    cat = _Catalog(_DS())
    split = UserSplit(user_id=1, history=[], update=[], target=len(unseen_weights) + 1)
    return cat, _UserNegatives(cat, split, np.array([*unseen_weights, 0], dtype=np.int64))


@pytest.mark.parametrize("n_unseen", [40, 12])  # the uniform stream, and the small-catalog permutation
def test_uniform_distractors_are_uniform_and_distinct(n_unseen):
    cat, neg = _negatives([1] * n_unseen)
    rng = np.random.default_rng(0)
    counts = Counter()
    sets = _candidate_sets(rng, cat, neg, [n_unseen + 1] * 4000, 10, 0)
    for c in sets:
        assert len(set(c)) == 10 and n_unseen + 1 in c
        counts.update(c)
    del counts[n_unseen + 1]
    freq = np.array([counts[i] for i in range(1, n_unseen + 1)], dtype=float)
    assert freq.min() > 0.85 * freq.mean() and freq.max() < 1.15 * freq.mean()
    slots = Counter(c.index(n_unseen + 1) for c in sets)  # the positive lands in every slot alike
    assert len(slots) == 10 and min(slots.values()) > 0.7 * 400
    with pytest.raises(ValueError, match="cannot draw"):
        _candidate_sets(rng, cat, neg, [n_unseen + 1], n_unseen + 2, 0)


def _successive_inclusion(w: list[float], k: int) -> np.ndarray:
    """Exact P(item i among k drawn one by one without replacement, each with probability w / remaining w)."""
    from itertools import permutations

    p = np.zeros(len(w))
    for seq in permutations([i for i in range(len(w)) if w[i] > 0], k):
        pr, left = 1.0, float(sum(w))
        for i in seq:
            pr *= w[i] / left
            left -= w[i]
        p[list(seq)] += pr
    return p


@pytest.mark.parametrize("w, k", [([0, 1, 2, 3, 4, 10], 2), ([1000, 1, 1, 1, 0], 3)])  # the 2nd ends in Gumbel top-k
def test_popularity_draws_are_successive_sampling(w, k):
    cum = np.cumsum(w)
    rng = np.random.default_rng(0)
    hits = np.zeros(len(w))
    n = 20000
    for _ in range(n):
        first: dict[int, None] = {}
        _weighted_first_distinct(rng, cum, k, first)
        got = list(first)[:k]
        assert len(set(got)) == k and all(w[i] > 0 for i in got)
        hits[got] += 1
    np.testing.assert_allclose(hits / n, _successive_inclusion(w, k), atol=0.015)


def test_hard_share_of_a_candidate_set():
    # 2 popular unseen items, 6 with a little popularity, 30 never interacted with; 9 negatives per set
    w = [50, 50] + [1] * 6
    cat, neg = _negatives(w + [0] * 30)
    n_unseen, pos = len(neg.unseen), len(neg.unseen) + 1
    rng = np.random.default_rng(0)
    for n_hard in (0, 3, 5, 9):
        sets = _candidate_sets(rng, cat, neg, [pos] * 4000, 10, n_hard)
        assert all(len(set(c)) == 10 and pos in c for c in sets)
        popular = np.mean([len({1, 2} & set(c)) for c in sets])
        weighted = np.mean([sum(1 <= i <= 8 for i in c) for c in sets])
        k = min(n_hard, 8)  # at most the items with popularity; the rest uniform over the unseen items left
        p_hard = _successive_inclusion(w, k) if k else np.zeros(8)
        share_rest = (9 - k) / (n_unseen - k)
        exp_popular = sum(p_hard[i] + (1 - p_hard[i]) * share_rest for i in (0, 1))
        exp_weighted = k + (8 - k) * share_rest
        assert abs(popular - exp_popular) < 0.04 and abs(weighted - exp_weighted) < 0.08, n_hard


def _popularity_world(make_dataset):
    """40 users who all rated items 1..10 (popular); user 100 rated items 50..60; catalog 1..200."""
    rng = np.random.default_rng(0)
    seqs = {u: rng.permutation(np.arange(1, 11)).tolist() for u in range(1, 41)}
    seqs[100] = list(range(50, 61))
    return make_dataset(seqs, n_items=200)


def test_training_hard_negatives_follow_popularity(make_dataset, data_cfg):
    ds = _popularity_world(make_dataset)
    data_cfg.min_history, data_cfg.update_steps, data_cfg.train_candidates, data_cfg.eval_candidates = 3, 4, 20, 20
    splits, _ = split_users(ds, data_cfg)
    mine = [s for s in splits if s.user_id == 100]
    share = {}
    for frac in (0.0, 0.5, 1.0):
        data_cfg.train_hard_negative_fraction = frac
        sets = build_sup_examples(mine, ds, data_cfg) + build_bandit_requests(mine, ds, data_cfg)
        assert assert_target_held_out(splits, sets) == len(sets)
        share[frac] = np.mean([np.mean([1 <= i <= 10 for i in e.candidates if i != e.positive]) for e in sets])
    # uniform: 10 popular of 189 unseen items; half / all of the 19 distractors drawn by popularity: 10 of them
    # (round(9.5) = 10 hard at 0.5) and at 1.0 every popular item, the rest uniform
    assert share[0.0] < 0.15
    assert share[0.5] > 10 / 19 - 0.01 and share[1.0] > 10 / 19 - 0.01 and share[0.5] > 4 * share[0.0]
    data_cfg.train_hard_negative_fraction = 1.5
    with pytest.raises(ValueError, match="train_hard_negative_fraction=1.5"):
        build_sup_examples(mine, ds, data_cfg)


def test_training_popularity_never_draws_the_target_and_skips_held_out_counts(make_dataset, data_cfg):
    # item 70 is only ever a held-out target (of users 1..40): no training popularity, never a hard negative
    rng = np.random.default_rng(1)
    seqs = {u: [*rng.permutation(np.arange(1, 11)).tolist(), 70] for u in range(1, 41)}
    seqs[100] = [*range(50, 60), 61]
    ds = make_dataset(seqs, n_items=80)
    data_cfg.min_history, data_cfg.update_steps, data_cfg.train_candidates, data_cfg.eval_candidates = 3, 4, 20, 20
    data_cfg.train_hard_negative_fraction = 1.0
    splits, _ = split_users(ds, data_cfg)
    pop = training_popularity(splits, ds)
    assert 70 not in pop and ds.popularity()[70] == 40
    sets = build_sup_examples(splits, ds, data_cfg) + build_bandit_requests(splits, ds, data_cfg)
    assert assert_target_held_out(splits, sets) == len(sets)
    assert sets == build_sup_examples(splits, ds, data_cfg, popularity=pop) + build_bandit_requests(
        splits, ds, data_cfg, popularity=pop
    )
    # user 100's hard negatives: items 1..10 (the only ones with training popularity it has not seen), every one
    # of them in every set; the rest uniform over items it never saw (70 included: it is not user 100's target)
    for e in (e for e in sets if e.user_id == 100):
        assert set(range(1, 11)) <= set(e.candidates) and 61 not in e.candidates
    sup = build_sup_examples(splits, ds, data_cfg)
    data_cfg.seed = 5  # the uniform rest of each set follows the seed
    other = build_sup_examples(splits, ds, data_cfg)
    assert [e.positive for e in other] == [e.positive for e in sup]
    assert [e.candidates for e in other] != [e.candidates for e in sup]


def test_all_610_users_build_every_example(movielens, data_cfg):
    splits, _ = split_users(movielens, data_cfg)
    n = sum(
        len(f(splits, movielens, data_cfg)) for f in (build_sup_examples, build_bandit_requests, build_eval_examples)
    )
    assert n == sum(len(s.history) - 1 + data_cfg.update_steps + 1 for s in splits)  # every D_sup pair


@pytest.mark.skipif(not (AMAZON / "index").is_dir(), reason=f"{AMAZON} absent (not vendored)")
@pytest.mark.parametrize("domain", ["Office_Products", "Industrial_and_Scientific"])
def test_amazon18_domains_build_every_set(domain, data_cfg):
    from abpo.data.loaders import load_dataset

    data_cfg.format, data_cfg.dataset_dir, data_cfg.amazon_domain = "amazon18", str(AMAZON), domain
    data_cfg.min_history, data_cfg.update_steps = 3, 2
    ds = load_dataset(data_cfg)
    splits, report = split_users(ds, data_cfg)
    assert len(splits) > 1500 and report.users_total == len(ds.sequences)
    sup, bandit = build_sup_examples(splits, ds, data_cfg), build_bandit_requests(splits, ds, data_cfg)
    ev = build_eval_examples(splits, ds, data_cfg)
    assert len(sup) == sum(len(s.history) - 1 for s in splits) and len(bandit) == 2 * len(splits) == 2 * len(ev)
    assert assert_target_held_out(splits, sup, bandit) == len(sup) + len(bandit)
    for e in sup + bandit + ev:
        assert e.positive in e.candidates and len(set(e.candidates)) == len(e.candidates)
    pop = training_popularity(splits, ds)
    median = np.median([pop.get(int(i), 0) for i in ds.item_ids()])

    def share(sets):
        return np.mean([pop.get(i, 0) > median for e in sets for i in e.candidates if i != e.positive])

    data_cfg.train_hard_negative_fraction = 0.0
    assert share(sup) > share(build_sup_examples(splits, ds, data_cfg)) + 0.1  # hard negatives: more popular items
