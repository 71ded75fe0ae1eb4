"""The ground truth's mixture (abpo.sim.preference): weights validated with the key named, the mixture
re-standardised per item over the users, a pure oracle equal to its component, and z's state."""

from __future__ import annotations

import numpy as np
import pytest

from tests.sim.hand_built_sequences import INDEX, ITEMS, SEQS


def _components():
    from abpo.sim.oracles import AlsComponent, KnnComponent, SequentialComponent

    users = sorted(SEQS)
    return {
        "knn": KnnComponent(window=2, recent=3).fit(SEQS, INDEX, users),
        "sequential": SequentialComponent(order=2, smoothing=1.0).fit(SEQS, INDEX, users),
        "als": AlsComponent.fit(SEQS, INDEX, factors=4, iterations=5, regularization=0.1, seed=0),
    }


def test_oracle_weights_are_validated_with_the_key_named():
    from abpo.config.sim import SimConfig
    from abpo.sim.preference import oracle_weights

    # the default truth (issue 46): knn and sequential; als, the ML-retrain arm's family, weighs 0 and is not fitted
    assert oracle_weights(SimConfig()) == pytest.approx({"knn": 1 / 2, "sequential": 1 / 2})
    assert oracle_weights(SimConfig(oracle="replay")) == {"replay": 1.0}
    assert oracle_weights(SimConfig(oracle="sequential")) == {"sequential": 1.0}
    assert oracle_weights(SimConfig(oracle="mixture", oracle_weights={"knn": 3, "als": 1, "sequential": 0})) == {
        "knn": 0.75,
        "als": 0.25,
    }
    with pytest.raises(ValueError, match=r"sim.oracle_weights.popularity: unknown oracle component 'popularity'"):
        oracle_weights(SimConfig(oracle="mixture", oracle_weights={"knn": 1.0, "popularity": 1.0}))
    with pytest.raises(ValueError, match=r"sim.oracle_weights.als = -0.5: rule: a finite number >= 0"):
        oracle_weights(SimConfig(oracle="mixture", oracle_weights={"knn": 1.0, "als": -0.5}))
    with pytest.raises(ValueError, match=r"sim.oracle_weights.als = nan"):
        oracle_weights(SimConfig(oracle="mixture", oracle_weights={"als": float("nan")}))
    with pytest.raises(ValueError, match=r"rule: the weights sum to > 0"):
        oracle_weights(SimConfig(oracle="mixture", oracle_weights={"knn": 0.0, "als": 0}))
    with pytest.raises(ValueError, match=r"config sim.oracle = 'ranker': rule: one of \['mixture', 'knn'"):
        oracle_weights(SimConfig(oracle="ranker"))


def test_the_mixture_is_the_restandardised_weighted_sum_and_a_pure_oracle_its_component():
    from abpo.sim.preference import PreferenceOracle

    comps = _components()
    users = sorted(SEQS)
    weights = {"knn": 0.5, "sequential": 0.25, "als": 0.25}
    mix = PreferenceOracle.build(comps, weights, SEQS, ITEMS, users)
    z = np.stack([mix.z(u, ITEMS) for u in users])  # no history: the user's whole sequence
    varies = z.std(axis=0) > 1e-9
    assert varies.sum() >= 5 and np.allclose(z.mean(axis=0), 0, atol=1e-9)
    assert np.allclose(z.std(axis=0)[varies], 1, atol=1e-9)
    idx = [INDEX[i] for i in ITEMS]
    h = [4, 3, 1]
    m = sum(w * comps[k].z(1, h, idx) for k, w in weights.items())
    assert np.allclose(mix.z(1, ITEMS, history=h) * mix.sd + mix.mean, m)
    assert not np.allclose(m, mix.z(1, ITEMS, history=h))  # re-standardised, not the raw sum
    for name in ("knn", "sequential", "als"):
        pure = PreferenceOracle.build(comps, {name: 1.0}, SEQS, ITEMS, users)
        assert np.array_equal(pure.z(3, ITEMS, history=h), comps[name].z(3, h, idx))
    # the state: a history changes knn and sequential, not als; none given means the whole sequence
    knn = PreferenceOracle.build(comps, {"knn": 1.0}, SEQS, ITEMS, users)
    assert np.array_equal(knn.z(3, ITEMS), knn.z(3, ITEMS, history=SEQS[3]))
    assert not np.array_equal(knn.z(3, ITEMS), knn.z(3, ITEMS, history=[7]))
    als = PreferenceOracle.build(comps, {"als": 1.0}, SEQS, ITEMS, users)
    assert np.array_equal(als.z(3, ITEMS), als.z(3, ITEMS, history=[7]))
    with pytest.raises(KeyError, match="user 99 was not in the data"):
        mix.z(99, ITEMS)
    with pytest.raises(KeyError, match="item 42 is not in the catalog"):
        mix.z(1, [1, 42])
