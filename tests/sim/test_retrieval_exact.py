"""The fast retrieval stage and oracle components (issue 60 point 3) give bit for bit what their first, plainer code
gave: kept here as the reference, run side by side on the bundled MovieLens with the same seeds. Candidates,
co-occurrence scores, the order of every draw and the generator's state after each request are identical, and so
are the knn and sequential components' scores and moments (np.array_equal, never allclose)."""

from __future__ import annotations

import numpy as np
import pytest

# ------------------------------------------------------------------ the reference: the code before issue 60 point 3


def ref_scores(retrieval, history) -> np.ndarray:
    recent = [retrieval.index[int(i)] for i in list(history)[-retrieval.recent :] if int(i) in retrieval.index]
    if not recent:
        return np.zeros(len(retrieval.index), dtype=np.float64)
    return np.asarray(retrieval.matrix[recent].sum(axis=0), dtype=np.float64).reshape(-1)


def ref_draw(rng, weights, allowed, k) -> np.ndarray:
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    ok = allowed & (weights > 0)
    n_ok = int(ok.sum())
    if n_ok == 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.full(len(weights), -np.inf)
    keys[ok] = np.log(weights[ok]) + rng.gumbel(size=n_ok)
    k = min(k, n_ok)
    top = np.argpartition(-keys, k - 1)[:k]
    return top[np.argsort(-keys[top], kind="stable")]


def ref_retrieve(history, *, retrieval, popularity, counts, rng, exclude=()) -> list[int]:
    ids = np.fromiter(retrieval.index, dtype=np.int64, count=len(retrieval.index))
    allowed = np.ones(len(ids), dtype=bool)
    seen = [retrieval.index[int(i)] for i in [*history, *exclude] if int(i) in retrieval.index]
    allowed[seen] = False
    m = sum(counts)
    if int(allowed.sum()) < m:
        raise ValueError("too few unseen items")
    n_r, n_p, _ = counts
    chosen: list[int] = []
    s = ref_scores(retrieval, history)
    s[~allowed] = 0.0
    if n_r:
        pos = np.flatnonzero(s > 0)
        if len(pos) > n_r:
            order = np.lexsort((rng.random(len(pos)), -s[pos]))
            pos = pos[order[:n_r]]
        chosen += pos.tolist()
        allowed[pos] = False
    want_p = n_r + n_p - len(chosen)
    if want_p:
        got = ref_draw(rng, popularity.astype(np.float64), allowed, want_p)
        chosen += got.tolist()
        allowed[got] = False
    rest = m - len(chosen)
    got = ref_draw(rng, np.ones(len(ids)), allowed, rest)
    chosen += got.tolist()
    out = ids[np.asarray(chosen, dtype=np.int64)]
    rng.shuffle(out)
    return [int(i) for i in out]


def ref_knn_z(knn, history, idx) -> np.ndarray:
    recent = knn._recent(history)
    if not recent:
        s = np.zeros(len(idx))
    else:
        s = np.log1p(np.asarray(knn.counts[recent][:, idx].sum(axis=0), dtype=np.float64).reshape(-1))
    return (s - knn.mean[idx]) / knn.sd[idx]


def ref_probability(seq, last, idx) -> np.ndarray:
    a = seq.smoothing
    p = np.zeros(len(seq.pop[idx]))
    for k, j in enumerate(last):
        if j is None:
            p += seq.lam[k] * seq.pop[idx]
            continue
        counts = seq.steps[k][j].toarray().reshape(-1)[idx]
        p += seq.lam[k] * (counts + a * seq.pop[idx]) / (seq.rowsum[k][j] + a)
    return p


# ------------------------------------------------------------------------------------------------------ inputs


@pytest.fixture(scope="module")
def requests(movielens):
    """(history, exclude, seed) of 360 requests: 120 users of the bundled MovieLens at three cut points each
    (a short, a middle and a long history), plus histories with a repeated and an unknown item."""
    rng = np.random.default_rng(60)
    users = sorted(movielens.sequences)
    out = []
    for u in rng.choice(users, size=120, replace=False).tolist():
        seq = movielens.sequences[u]
        for t in (3, len(seq) // 2, len(seq) - 1):
            out.append((seq[:t], (seq[-1],), [3, 60, int(u), t]))
    seq = movielens.sequences[users[0]]
    out.append(([*seq[:8], seq[3], seq[3], 10**9], (), [3, 60, 0]))
    out.append(([10**9], (), [3, 60, 1]))
    return out


@pytest.fixture(scope="module")
def retrieval(movielens):
    from abpo.sim.retrieval import CooccurrenceRetrieval

    items = movielens.item_ids().tolist()
    r = CooccurrenceRetrieval(window=3, recent=10).fit(movielens.sequences, items)
    popularity = np.zeros(len(items))
    for seq in movielens.sequences.values():
        for it in seq:
            popularity[r.index[int(it)]] += 1
    return r, popularity


# ------------------------------------------------------------------------------------------------------- tests


def test_scores_are_the_scipy_sums(retrieval, requests):
    r, _ = retrieval
    assert r._fitted().exact_sums  # the fast path is the one compared
    for history, _, _ in requests:
        assert np.array_equal(r.scores(history), ref_scores(r, history))


@pytest.mark.parametrize("counts", [(10, 6, 4), (0, 0, 20), (20, 0, 0), (2, 2, 4), (0, 12, 8)])
def test_candidates_and_the_generator_state_are_the_reference_ones(retrieval, requests, counts):
    from abpo.sim.retrieval import retrieve_candidates

    r, popularity = retrieval
    for history, exclude, seed in requests[:: 3 if counts != (10, 6, 4) else 1]:
        new, old = np.random.default_rng(seed), np.random.default_rng(seed)
        got = retrieve_candidates(history, retrieval=r, popularity=popularity, counts=counts, rng=new, exclude=exclude)
        want = ref_retrieve(history, retrieval=r, popularity=popularity, counts=counts, rng=old, exclude=exclude)
        assert got == want
        assert new.bit_generator.state == old.bit_generator.state  # the same draws consumed


@pytest.mark.parametrize("n", [7, 300, 2049, 9742, 30000])
def test_draws_match_the_full_argpartition(n):
    """_draw against the reference on random weights (zeros, ties in the weights, infinite weights whose keys tie
    and take the fallback), random allowed sets and k up to the whole allowed set."""
    from abpo.sim.retrieval import _draw

    for seed in range(40):
        g = np.random.default_rng([n, seed])
        weights = np.floor(g.pareto(1.0, size=n) * 3)  # many zeros and many equal weights, a heavy tail
        if seed % 5 == 0:
            weights[g.choice(n, size=min(n, 3), replace=False)] = np.inf
        allowed = g.random(n) < g.uniform(0.05, 1.0)
        for k in (1, 4, 20, n):
            new, old = np.random.default_rng([seed, k]), np.random.default_rng([seed, k])
            assert np.array_equal(_draw(new, weights, allowed, k), ref_draw(old, weights, allowed, k))
            assert new.bit_generator.state == old.bit_generator.state


def test_the_simulator_month_is_the_reference_one(make_cfg, movielens, monkeypatch):
    """A month's requests built by the simulator with the fast retrieval stage and with the reference one."""
    import abpo.sim.retrieval as retrieval_module
    from abpo.data.splits import split_users
    from abpo.sim.simulator import month_requests
    from tests.sizes import SIXTY_USERS

    cfg = make_cfg(*SIXTY_USERS, "sim.requests_per_user=4")
    splits, _ = split_users(movielens, cfg.data)
    new = month_requests(cfg, movielens, splits, "2026-02")
    monkeypatch.setattr(retrieval_module, "retrieve_candidates", ref_retrieve)
    assert new == month_requests(cfg, movielens, splits, "2026-02")


@pytest.fixture(scope="module")
def components(movielens):
    from abpo.sim.oracles import KnnComponent, SequentialComponent

    index = {int(i): j for j, i in enumerate(movielens.item_ids().tolist())}
    reference = sorted(movielens.sequences)[::6]
    knn = KnnComponent(window=3, recent=10).fit(movielens.sequences, index, reference)
    seq = SequentialComponent(order=3, smoothing=1.0).fit(movielens.sequences, index, reference)
    return knn, seq, reference


def test_knn_scores_are_the_scipy_sums(components, requests, movielens):
    knn, _, _ = components
    g = np.random.default_rng(7)
    n = len(knn.item_index)
    for history, _, _ in requests:
        for idx in (g.choice(n, size=20, replace=False).tolist(), [5, 5, 0, n - 1]):
            assert np.array_equal(knn.z(0, history, idx), ref_knn_z(knn, history, idx))


def test_sequential_scores_and_moments_are_the_reference_ones(components, requests, movielens):
    from abpo.sim.oracles import _moments

    _, seq, reference = components
    g = np.random.default_rng(8)
    n = len(seq.item_index)
    for history, _, _ in requests:
        last = seq._last(history)
        idx = g.choice(n, size=20, replace=False).tolist()
        assert np.array_equal(seq._probability(last, idx), ref_probability(seq, last, idx))
        assert np.array_equal(seq._probability(last, slice(None)), ref_probability(seq, last, slice(None)))
    # the standardisation over the reference users, which fit took with the fast rows
    blocks = (
        np.log(np.stack([ref_probability(seq, seq._last(movielens.sequences[u]), slice(None)) for u in part]))
        for part in (reference[i : i + 256] for i in range(0, len(reference), 256))
    )
    mean, sd = _moments(blocks, n)
    assert np.array_equal(seq.mean, mean) and np.array_equal(seq.sd, sd)
