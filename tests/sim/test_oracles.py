"""The ground truth's components (abpo.sim.oracles) on hand-built sequences: knn prefers what co-occurs with the
user's recent items, the sequential model the observed successor, and each is standardised per item over the
reference users."""

from __future__ import annotations

import numpy as np
import pytest

from tests.sim.hand_built_sequences import INDEX, ITEMS, SEQS


def test_knn_prefers_items_that_co_occur_with_the_recent_ones():
    from abpo.sim.oracles import KnnComponent

    knn = KnnComponent(window=1, recent=2).fit(SEQS, INDEX, reference=sorted(SEQS))
    z = knn.z(0, [1], [INDEX[2], INDEX[8], INDEX[9]])
    assert z[0] > 0 > z[1]  # 2 follows 1 three times; 8 never meets 1
    assert z[2] == 0.0  # nobody's state meets 9: sd 0 -> 1, mean 0
    # per item over users: a user whose recent items co-occur with 8 likes it more than one whose do not
    assert knn.z(0, [7], [INDEX[8]])[0] > knn.z(0, [1], [INDEX[8]])[0]
    # the raw score: log1p of the summed counts (items 1 and 3 both sit next to 2 once or more: 3 + 0)
    raw = knn.z(0, [1, 3], [INDEX[2]]) * knn.sd[INDEX[2]] + knn.mean[INDEX[2]]
    assert raw[0] == pytest.approx(np.log1p(3 + 0))  # 3 and 2 are two apart in user 3's sequence: window 1
    # only the last `recent` items count
    assert knn.z(0, [1, 4, 4], [INDEX[2]])[0] == knn.z(0, [4, 4], [INDEX[2]])[0]
    with pytest.raises(ValueError, match="sim.oracle_knn_window = 0"):
        KnnComponent(window=0, recent=2)


def test_the_sequential_model_prefers_the_observed_successor():
    from abpo.sim.oracles import SequentialComponent

    seq = SequentialComponent(order=1, smoothing=1.0).fit(SEQS, INDEX, reference=sorted(SEQS))
    counts = np.bincount([INDEX[i] for s in SEQS.values() for i in s], minlength=len(ITEMS))
    pop = (counts + 1) / (counts.sum() + len(ITEMS))
    # P_1(2 | 1) = (N[1, 2] + alpha pop(2)) / (N[1] + alpha): 1 -> 2 three times out of 3
    assert seq._probability([INDEX[1]], [INDEX[2]])[0] == pytest.approx((3 + pop[INDEX[2]]) / 4)
    assert seq._probability([INDEX[2]], [INDEX[1]])[0] == pytest.approx(pop[INDEX[1]] / 3)  # directed, not symmetric
    z = seq.z(0, [4, 3, 1], [INDEX[2], INDEX[5], INDEX[3]])
    assert z[0] > z[1] and z[0] > z[2] and z[0] > 0
    assert seq.z(0, [5, 1], [INDEX[2]])[0] > seq.z(0, [5, 3], [INDEX[2]])[0]  # per item: after 1, 2 is likelier
    # order 2: the item two back also predicts, with half the weight of the last one
    two = SequentialComponent(order=2, smoothing=1.0).fit(SEQS, INDEX, reference=sorted(SEQS))
    assert two.lam.tolist() == pytest.approx([2 / 3, 1 / 3])
    # h_{-1} = 3 (followed by 1 once, of once), h_{-2} = 4 (never two before anything: the prior alone)
    assert two._probability([INDEX[3], INDEX[4]], [INDEX[1]])[0] == pytest.approx(
        2 / 3 * (1 + pop[INDEX[1]]) / (1 + 1) + 1 / 3 * (0 + pop[INDEX[1]]) / (0 + 1)
    )
    assert np.isfinite(two.z(0, [], [INDEX[9]])).all()  # no history: popularity alone
    with pytest.raises(ValueError, match="sim.oracle_markov_smoothing = 0"):
        SequentialComponent(order=1, smoothing=0)


def test_each_component_is_standardised_per_item_over_the_users():
    from abpo.sim.oracles import AlsComponent, KnnComponent, SequentialComponent

    users = sorted(SEQS)
    states = [SEQS[u] for u in users]
    comps = [
        KnnComponent(window=2, recent=3).fit(SEQS, INDEX, users),
        SequentialComponent(order=2, smoothing=0.5).fit(SEQS, INDEX, users),
        AlsComponent.fit(SEQS, INDEX, factors=4, iterations=5, regularization=0.1, seed=0),
    ]
    for c in comps:
        z = c.z_block(users, states)
        assert z.shape == (len(users), len(ITEMS))
        varies = z.std(axis=0) > 1e-9
        assert varies.sum() >= 5, c.name
        assert np.allclose(z.mean(axis=0), 0.0, atol=1e-5), c.name
        assert np.allclose(z.std(axis=0)[varies], 1.0, atol=1e-4), c.name
        # the per-request path agrees with the block path
        assert np.allclose(c.z(users[2], states[2], [INDEX[i] for i in ITEMS]), z[2], atol=1e-5), c.name


def test_reference_users_are_all_or_a_seeded_sample():
    from abpo.sim.oracles import reference_users

    assert reference_users([3, 1, 2], 0, 0) == [1, 2, 3] == reference_users([3, 1, 2], 5, 0)
    got = reference_users(range(100), 10, 7)
    assert len(got) == 10 == len(set(got)) and got == reference_users(range(100), 10, 7)
    assert got != reference_users(range(100), 10, 8)


def test_replay_lifts_only_the_users_real_next_items_with_a_decay():
    from abpo.sim.oracles import ReplayComponent
    from abpo.sim.preference import PreferenceOracle

    seqs = {1: [1, 2, 5, 6, 2, 7, 3], 2: [4, 3]}
    replay = ReplayComponent(horizon=3, decay=0.5, strength=4.0).fit(seqs, INDEX)
    idx = [INDEX[i] for i in ITEMS]
    z = dict(zip(ITEMS, replay.z(1, [1, 2], idx), strict=True))
    # after x_1..x_2 the future is 5, 6, 2 (d = 1, 2, 3): strength * decay^(d - 1); the rest 0
    assert z == {1: 0.0, 2: 1.0, 3: 0.0, 4: 0.0, 5: 4.0, 6: 2.0, 7: 0.0, 8: 0.0, 9: 0.0}
    # the nearest occurrence counts, and the held-out target (the sequence's last item, 3) never lifts
    z4 = dict(zip(ITEMS, replay.z(1, [1, 2, 5, 6], idx), strict=True))
    assert z4[2] == 4.0 and z4[7] == 2.0 and z4[3] == 0.0
    assert not replay.z(1, [1, 2, 5, 6, 2, 7], idx).any()  # only the target is left: nothing lifts
    assert not replay.z(2, [4, 3], idx).any()  # the whole sequence as the state: no future
    # the request's history must be the user's real prefix
    with pytest.raises(ValueError, match="user 1: the request's history .* is not a prefix"):
        replay.z(1, [1, 9], idx)
    with pytest.raises(ValueError, match="sim.replay_decay = 0"):
        ReplayComponent(horizon=3, decay=0, strength=1.0)
    # as an oracle: its z as is (nothing standardised), whatever other users did
    oracle = PreferenceOracle.build({"replay": replay}, {"replay": 1.0}, seqs, ITEMS, sorted(seqs))
    assert np.array_equal(oracle.z(1, ITEMS, history=[1, 2]), replay.z(1, [1, 2], idx))
    other = ReplayComponent(horizon=3, decay=0.5, strength=4.0).fit({**seqs, 2: [5, 6, 5, 6]}, INDEX)
    assert np.array_equal(other.z(1, [1, 2], idx), replay.z(1, [1, 2], idx))


def test_replay_discounts_a_popular_future_item_by_its_popularity_alone():
    """sim.replay_popularity_exponent gamma: a future item's lift times min(1, (n_med / n_a)^gamma), n_a the item's
    interactions in the data, n_med their median over the items that have any (popularity-stratified, Steck 2011)."""
    from abpo.sim.oracles import ReplayComponent

    # interactions: 1 x1, 2 x4, 3 x2, 4 x1, 5 x1, 6 x1, 7 x1 -> median over the 7 seen items: 1
    seqs = {1: [1, 2, 5, 6, 2, 7, 3], 2: [4, 2, 2, 3]}
    idx = [INDEX[i] for i in ITEMS]
    plain = ReplayComponent(horizon=3, decay=0.5, strength=4.0).fit(seqs, INDEX)
    half = ReplayComponent(horizon=3, decay=0.5, strength=4.0, popularity_exponent=0.5).fit(seqs, INDEX)
    one = ReplayComponent(horizon=3, decay=0.5, strength=4.0, popularity_exponent=1.0).fit(seqs, INDEX)
    z0, zh, z1 = (dict(zip(ITEMS, c.z(1, [1, 2], idx), strict=True)) for c in (plain, half, one))
    assert z0[5] == zh[5] == z1[5] == 4.0 and z0[6] == z1[6] == 2.0  # items at the median keep their lift
    assert z0[2] == 1.0 and zh[2] == pytest.approx(1.0 * (1 / 4) ** 0.5) and z1[2] == pytest.approx(0.25)
    assert all(v == 0.0 for k, v in z1.items() if k not in (5, 6, 2))  # the rest keeps the base rate
    # never above the undiscounted lift (the cap), and an item nobody consumed is never lifted at all
    assert all(zh[k] <= z0[k] for k in ITEMS)
    with pytest.raises(ValueError, match="sim.replay_popularity_exponent = -1"):
        ReplayComponent(horizon=3, decay=0.5, strength=1.0, popularity_exponent=-1)


def test_replay_is_an_oracle_of_its_own_never_a_mixture_component():
    from types import SimpleNamespace

    from abpo.config.sim import ORACLES
    from abpo.sim.preference import oracle_weights

    assert "replay" in ORACLES
    assert oracle_weights(SimpleNamespace(oracle="replay", oracle_weights={})) == {"replay": 1.0}
    with pytest.raises(ValueError, match="sim.oracle_weights.replay: unknown oracle component"):
        oracle_weights(SimpleNamespace(oracle="mixture", oracle_weights={"knn": 1.0, "replay": 1.0}))
