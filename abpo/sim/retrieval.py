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
        self._fast: _Fitted | None = None  # what fit derives from index and matrix once (:meth:`_fitted`)

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
        fast = self._fitted()
        if not fast.exact_sums:
            return np.asarray(self.matrix[recent].sum(axis=0), dtype=np.float64).reshape(-1)
        # the recent rows' entries straight from the CSR arrays (a row twice when the item is twice among the
        # recent ones, as matrix[recent] has it), summed per column: integer counts whose every partial sum is
        # below 2^24 (_Fitted.exact_sums), so the float32 sum above and this float64 one are the same exact integer
        ptr, ind, val = fast.indptr, fast.indices, fast.data
        cols = np.concatenate([ind[ptr[r] : ptr[r + 1]] for r in recent])
        vals = np.concatenate([val[ptr[r] : ptr[r + 1]] for r in recent])
        return np.bincount(cols, weights=vals, minlength=len(fast.ids))

    def _fitted(self) -> _Fitted:
        """The arrays :func:`retrieve_candidates` and :meth:`scores` read on every request, derived once per fit
        (again if ``index``, ``matrix`` or ``recent`` was replaced since)."""
        fast = self._fast
        if fast is None or fast.index is not self.index or fast.matrix is not self.matrix or fast.recent != self.recent:
            fast = self._fast = _Fitted(self.index, self.matrix, self.recent)
        return fast


class _Fitted:
    """A fitted :class:`CooccurrenceRetrieval`'s per-request look-ups: the item ids in the fit's order, the same
    ids sorted (with their positions) to map a history to positions in one search, and the co-occurrence
    matrix's CSR arrays (float64 data) for :meth:`CooccurrenceRetrieval.scores`."""

    def __init__(self, index: dict[int, int], matrix, recent: int):
        self.index, self.matrix, self.recent = index, matrix, recent
        self.ids = np.fromiter(index, dtype=np.int64, count=len(index))
        self.order = np.argsort(self.ids, kind="stable")
        self.sorted_ids = self.ids[self.order]
        self.exact_sums = False
        if matrix is not None:
            from scipy.sparse import csr_matrix

            csr = matrix if isinstance(matrix, csr_matrix) else csr_matrix(matrix)
            self.indptr, self.indices = csr.indptr, csr.indices
            self.data = csr.data.astype(np.float64)
            # a score sums at most ``recent`` rows (a row twice when its item is): integer counts whose total stays
            # below 2^24 are summed exactly in float32 and in float64, in any order
            top = float(np.abs(self.data).max()) if len(self.data) else 0.0
            self.exact_sums = (
                len(index) == matrix.shape[1]
                and csr.has_canonical_format  # one entry per (row, column)
                and bool(np.all(self.data == np.round(self.data)))
                and recent * top < 2.0**24
            )

    def positions(self, items: Sequence[int]) -> np.ndarray:
        """The fit-order positions of those of ``items`` in the catalog (as ``index[int(i)]`` for each ``i`` in
        ``index``)."""
        q = np.asarray(items, dtype=np.int64).reshape(-1)
        if not len(q) or not len(self.ids):
            return np.zeros(0, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.sorted_ids, q), len(self.ids) - 1)
        return self.order[at[self.sorted_ids[at] == q]]


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
    where = np.flatnonzero(ok)
    n_ok = len(where)
    if n_ok == 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.log(weights[where]) + rng.gumbel(size=n_ok)
    k = min(k, n_ok)
    top = _top_descending(keys, k)
    if top is not None:
        return where[top]
    # tied keys: the choice as the full argpartition makes it
    full = np.full(len(weights), -np.inf)
    full[ok] = keys
    top = np.argpartition(-full, k - 1)[:k]
    return top[np.argsort(-full[top], kind="stable")]


def _top_descending(keys: np.ndarray, k: int, block: int = 512) -> np.ndarray | None:
    """The positions of the ``k`` largest ``keys``, largest first; None when two of the k + 1 largest are equal
    (then which of them comes first is the sort's choice, and :func:`_draw` makes it as it always did). Without
    ties the answer is unique. Only the keys at least the k-th largest of the first ``block`` are sorted: every
    one of the k largest is among them."""
    if 4 * block < len(keys) and k <= block:
        threshold = np.partition(keys[:block], block - k)[block - k]
        cand = np.flatnonzero(keys >= threshold)
    else:
        cand = np.arange(len(keys))
    order = np.argsort(-keys[cand], kind="stable")
    head = keys[cand[order[: k + 1]]]
    if np.any(head[1:] == head[:-1]):
        return None
    return cand[order[:k]]


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
    fast = retrieval._fitted()
    ids = fast.ids
    allowed = np.ones(len(ids), dtype=bool)
    allowed[fast.positions([*history, *exclude])] = False
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
            tie = rng.random(len(pos))
            score = s[pos]
            # only the items scoring at least the n_r-th best can be among the first n_r of the full
            # lexsort((tie, -score)); sorting them alone (in position order, lexsort being stable) orders them alike
            keep = np.flatnonzero(score >= np.partition(score, len(pos) - n_r)[len(pos) - n_r])
            order = keep[np.lexsort((tie[keep], -score[keep]))]
            pos = pos[order[:n_r]]
        chosen += pos.tolist()
        allowed[pos] = False
    want_p = n_r + n_p - len(chosen)
    if want_p:
        got = _draw(rng, np.asarray(popularity, dtype=np.float64), allowed, want_p)
        chosen += got.tolist()
        allowed[got] = False
    rest = m - len(chosen)
    got = _draw(rng, np.ones(len(ids)), allowed, rest)
    chosen += got.tolist()
    out = ids[np.asarray(chosen, dtype=np.int64)]
    rng.shuffle(out)
    return [int(i) for i in out]
