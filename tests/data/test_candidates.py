import time
from collections import Counter

import numpy as np
import pytest

from abpo.data.candidates import (
    _sample_without_replacement,
    assert_target_held_out,
    build_bandit_requests,
    build_eval_examples,
    build_sup_examples,
    training_popularity,
)
from abpo.data.splits import split_users


@pytest.fixture(scope="module")
def ml_sets(movielens):
    from abpo.config import load_config

    cfg = load_config("tiny").data
    splits, _ = split_users(movielens, cfg)
    return cfg, splits, {
        "sup": build_sup_examples(splits, movielens, cfg),
        "bandit": build_bandit_requests(splits, movielens, cfg),
        "eval": build_eval_examples(splits, movielens, cfg),
    }


def test_held_out_target_never_in_any_training_candidate_set(ml_sets):
    cfg, splits, sets = ml_sets
    target = {s.user_id: s.target for s in splits}
    for ex in sets["sup"] + sets["bandit"]:
        assert target[ex.user_id] not in ex.candidates
        assert target[ex.user_id] not in ex.history
    assert assert_target_held_out(splits, sets["sup"], sets["bandit"]) == len(sets["sup"]) + len(sets["bandit"])
    # the guard itself fails on a leak
    leaky = sets["bandit"][0]
    bad = type(leaky)(leaky.request_id, leaky.user_id, leaky.history, [*leaky.candidates, target[leaky.user_id]],
                      leaky.positive)
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
    # latest sup_examples_per_user pairs (x_{1:t}, x_{t+1}) inside x_{1:T}, chronological
    assert [len(e.history) for e in sup] == list(range(T - cfg.sup_examples_per_user, T))
    assert all(e.positive == s.history[len(e.history)] for e in sup)
    assert sup[-1].positive == s.history[-1]  # D_sup never reaches into the update range
    bandit = [e for e in sets["bandit"] if e.user_id == s.user_id]
    # t' in {T..T+N-2}: history x_{1:t'}, positive x_{t'+1}
    assert [len(e.history) for e in bandit] == list(range(T, T + cfg.update_steps))
    assert [e.positive for e in bandit] == s.update
    ids = [e.request_id for v in sets.values() for e in v]
    assert len(ids) == len(set(ids))  # request ids unique across all three sets


def test_sup_takes_all_pairs_when_uncapped(movielens, data_cfg):
    data_cfg.sup_examples_per_user = 0
    splits, _ = split_users(movielens, data_cfg)
    s = min(splits, key=lambda s: len(s.history))
    sup = build_sup_examples([s], movielens, data_cfg)
    assert [len(e.history) for e in sup] == list(range(1, len(s.history)))


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
    # a user's examples do not depend on which other users are present
    sub = build_bandit_requests(splits[5:7], movielens, data_cfg)
    assert sub == [e for e in sets["bandit"] if e.user_id in {splits[5].user_id, splits[6].user_id}]
    data_cfg.seed = 1
    other = build_bandit_requests(splits, movielens, data_cfg)
    assert [e.candidates for e in other] != [e.candidates for e in sets["bandit"]]
    assert [e.positive for e in other] == [e.positive for e in sets["bandit"]]


def test_candidate_order_is_shuffled(ml_sets):
    _, _, sets = ml_sets
    where = Counter(e.candidates.index(e.positive) for e in sets["bandit"])
    assert len(where) > 10  # the positive is not always in the same slot


def test_sampler_is_uniform_and_distinct():
    rng = np.random.default_rng(0)
    counts = np.zeros(40)
    for _ in range(4000):
        d = _sample_without_replacement(rng, 40, 9)
        assert len(set(d.tolist())) == 9
        counts[d] += 1
    assert counts.min() > 0.85 * counts.mean() and counts.max() < 1.15 * counts.mean()
    assert len(_sample_without_replacement(rng, 10, 10)) == 10
    with pytest.raises(ValueError):
        _sample_without_replacement(rng, 3, 4)


def test_all_610_users_build_fast(movielens, data_cfg):
    start = time.perf_counter()
    splits, _ = split_users(movielens, data_cfg)
    n = sum(len(f(splits, movielens, data_cfg)) for f in (build_sup_examples, build_bandit_requests, build_eval_examples))
    assert n == 610 * (data_cfg.sup_examples_per_user + data_cfg.update_steps + 1)
    assert time.perf_counter() - start < 10  # ~1 s on one free core; generous for a shared CI box
