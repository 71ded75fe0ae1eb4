"""The retrieval stage in front of the arms (``sim.candidates = retrieval``, the default): what a production
recommender's candidate generator hands its ranker. Nothing forces the user's true next item in: it is among the
candidates only when the retrieval model or a draw finds it.

A request's M = ``sim.candidate_count`` candidates are all distinct, none already in the user's history and never
the user's held-out evaluation target x_{T+N} (which keeps the gate's offline evaluation held out):

    retrieval   round(M * sim.retrieval_fraction) items with the highest item-to-item co-occurrence score with the
                user's last ``sim.retrieval_recent`` items (:class:`CooccurrenceRetrieval`, fitted on the
                interactions to date: the platform's own data, never the future);
    popular     round(M * sim.popular_fraction) draws without replacement, weighted by popularity to date;
    uniform     the rest, uniform draws from the catalog.

A share that runs dry (a user whose recent items co-occur with few others) is filled by the next kind. The set is
shuffled, so its order tells an arm nothing. Draws use the request's own seeded generator, so a month's candidates
are the same on every run.

The offline construction (``sim.candidates = offline``: x_{t+1} plus M - 1 seeded never-seen distractors,
abpo.data.candidates) stays available for comparison with the offline table; it puts the true next item in every
set, which makes a ranker that prefers popular items look like an oracle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


class CooccurrenceRetrieval:
    """Item-to-item co-occurrence: two items co-occur when one user consumed them at most ``window`` positions
    apart. score(a | history) = sum over the last ``recent`` history items h of count(h, a) (a dense item x item
    count matrix would not scale; it is kept sparse)."""

    def __init__(self, *, window: int, recent: int):
        if window < 1 or recent < 1:
            raise ValueError(f"config sim.retrieval_window = {window}, sim.retrieval_recent = {recent}: rule: >= 1")
        self.window = window
        self.recent = recent
        self.index: dict[int, int] = {}
        self.matrix = None

    def fit(self, sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int]) -> CooccurrenceRetrieval:
        from scipy.sparse import csr_matrix

        self.index = {int(i): j for j, i in enumerate(item_ids)}
        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        for seq in sequences.values():
            idx = np.array([self.index[int(i)] for i in seq if int(i) in self.index], dtype=np.int64)
            for d in range(1, self.window + 1):
                if len(idx) > d:
                    rows += [idx[:-d], idx[d:]]
                    cols += [idx[d:], idx[:-d]]
        n = len(self.index)
        r = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        c = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
        self.matrix = csr_matrix((np.ones(len(r), dtype=np.float32), (r, c)), shape=(n, n))
        self.matrix.sum_duplicates()
        return self

    def scores(self, history: Sequence[int]) -> np.ndarray:
        """Co-occurrence score of every catalog item (in the fit's item order) with the history's recent items."""
        if self.matrix is None:
            raise RuntimeError("CooccurrenceRetrieval.scores: fit first")
        recent = [self.index[int(i)] for i in list(history)[-self.recent :] if int(i) in self.index]
        if not recent:
            return np.zeros(len(self.index), dtype=np.float64)
        return np.asarray(self.matrix[recent].sum(axis=0), dtype=np.float64).reshape(-1)


def mix_counts(m: int, retrieval_fraction: float, popular_fraction: float) -> tuple[int, int, int]:
    """(retrieval, popular, uniform) counts of an M-candidate set."""
    if m < 2:
        raise ValueError(f"config sim.candidate_count = {m}: rule: >= 2 (an exposure needs a choice)")
    if retrieval_fraction < 0 or popular_fraction < 0 or retrieval_fraction + popular_fraction > 1 + 1e-9:
        raise ValueError(
            f"config sim.retrieval_fraction = {retrieval_fraction}, sim.popular_fraction = "
            f"{popular_fraction}: rule: each >= 0, their sum <= 1 (the rest is uniform)"
        )
    n_r = int(round(m * retrieval_fraction))
    n_p = min(int(round(m * popular_fraction)), m - n_r)
    return n_r, n_p, m - n_r - n_p


def _draw(rng: np.random.Generator, weights: np.ndarray, allowed: np.ndarray, k: int) -> np.ndarray:
    """``k`` distinct indices without replacement, P proportional to ``weights`` among ``allowed`` (Gumbel top-k:
    exact sequential weighted sampling without replacement)."""
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


def retrieve_candidates(
    history: Sequence[int],
    *,
    retrieval: CooccurrenceRetrieval,
    popularity: np.ndarray,
    counts: tuple[int, int, int],
    rng: np.random.Generator,
    exclude: Sequence[int] = (),
) -> list[int]:
    """One request's candidate set (the module docstring): item ids, shuffled. ``popularity``: interactions to
    date per item, in ``retrieval``'s item order; ``exclude``: items never offered besides the history (the
    simulator passes the user's held-out evaluation target, so no update can train on it)."""
    ids = np.fromiter(retrieval.index, dtype=np.int64, count=len(retrieval.index))
    allowed = np.ones(len(ids), dtype=bool)
    seen = [retrieval.index[int(i)] for i in [*history, *exclude] if int(i) in retrieval.index]
    allowed[seen] = False
    m = sum(counts)
    if int(allowed.sum()) < m:
        raise ValueError(
            f"retrieval: a history of {len(history)} items leaves {int(allowed.sum())} unseen catalog "
            f"items; rule: at least sim.candidate_count = {m}"
        )
    n_r, n_p, _ = counts
    chosen: list[int] = []
    s = retrieval.scores(history)
    s[~allowed] = 0.0
    if n_r:
        pos = np.flatnonzero(s > 0)
        if len(pos) > n_r:
            # the top n_r by score; ties broken by a seeded key, not by item id
            order = np.lexsort((rng.random(len(pos)), -s[pos]))
            pos = pos[order[:n_r]]
        chosen += pos.tolist()
        allowed[pos] = False
    want_p = n_r + n_p - len(chosen)
    if want_p:
        got = _draw(rng, popularity.astype(np.float64), allowed, want_p)
        chosen += got.tolist()
        allowed[got] = False
    rest = m - len(chosen)
    got = _draw(rng, np.ones(len(ids)), allowed, rest)
    chosen += got.tolist()
    out = ids[np.asarray(chosen, dtype=np.int64)]
    rng.shuffle(out)
    return [int(i) for i in out]
