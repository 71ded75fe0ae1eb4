import pytest

from abpo.data.splits import (
    SKIP_NOT_SAMPLED,
    SKIP_TARGET_SEEN,
    SKIP_TOO_FEW_UNSEEN,
    SKIP_TOO_SHORT,
    split_users,
)


def test_split_follows_offline_construction(movielens, data_cfg):
    splits, report = split_users(movielens, data_cfg)
    assert report.users_total == 610 and report.users_kept == 610 and not report.skipped
    n = data_cfg.update_steps
    for s in splits:
        seq = movielens.sequences[s.user_id]
        assert s.sequence == seq
        assert len(s.update) == n  # x_{T+1..T+N-1}: N-1 = update_steps bandit positives
        assert s.target == seq[-1] and s.history == seq[: len(seq) - n - 1]
        assert len(s.history) >= data_cfg.min_history
    assert report.history_items + report.update_items + report.users_kept == 100_836


def test_skipped_users_are_counted_with_reason(data_cfg, make_dataset):
    data_cfg.min_history, data_cfg.update_steps = 3, 2
    data_cfg.train_candidates, data_cfg.eval_candidates = 5, 5
    seqs = {
        1: [1, 2, 3, 4, 5, 6],  # T=3: kept
        2: [1, 2, 3, 4, 5],  # T=2 < 3: too short
        3: [7, 8, 9, 10, 11, 7],  # target 7 seen before
        4: [1, 2, 3, 4, 5, 6, 8],  # kept, T=4
    }
    splits, report = split_users(make_dataset(seqs), data_cfg)
    assert [s.user_id for s in splits] == [1, 4]
    assert report.skipped == {SKIP_TOO_SHORT: 1, SKIP_TARGET_SEEN: 1}
    assert report.skipped_users == {SKIP_TARGET_SEEN: [3], SKIP_TOO_SHORT: [2]}
    assert report.as_dict()["users_skipped"] == 2 and "too_short=1" in str(report)
    assert splits[1].history == [1, 2, 3, 4] and splits[1].update == [5, 6] and splits[1].target == 8


def test_too_few_unseen_items_is_a_reported_skip(data_cfg, make_dataset):
    data_cfg.min_history, data_cfg.update_steps = 1, 1
    data_cfg.train_candidates, data_cfg.eval_candidates = 4, 4  # needs 3 never-seen items
    splits, report = split_users(make_dataset({1: [1, 2, 3], 2: [1, 2, 3, 4]}, n_items=6), data_cfg)
    assert [s.user_id for s in splits] == [1] and report.skipped == {SKIP_TOO_FEW_UNSEEN: 1}


def test_max_users_is_a_seeded_choice_and_reported(movielens, data_cfg):
    data_cfg.max_users = 50
    a, ra = split_users(movielens, data_cfg)
    b, _ = split_users(movielens, data_cfg)
    data_cfg.seed = 1
    c, _ = split_users(movielens, data_cfg)
    assert [s.user_id for s in a] == [s.user_id for s in b] != [s.user_id for s in c]
    assert len(a) == 50 and ra.skipped == {SKIP_NOT_SAMPLED: 560}


def test_bad_config_is_rejected(movielens, data_cfg):
    data_cfg.update_steps = 0
    with pytest.raises(ValueError, match="update_steps"):
        split_users(movielens, data_cfg)
