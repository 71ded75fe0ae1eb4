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
