"""The components of the simulated users' ground truth (abpo.sim.preference mixes them; docs/simulator.md). Each is
fitted on every interaction of the dataset, future windows and held-out targets included, and only abpo.sim
imports this module (an import-linter contract in pyproject.toml, and a test, check it).

A component scores item a for user u in a state h (the user's history at a request; the user's whole sequence when
no request is given) with a raw score s(u, h, a):

    als         s = U_u . V_a                implicit ALS factors fitted on every interaction (the family of the
                                             ML-retrain arm, which fits it on the interactions to date)
    knn         s = log(1 + sum_{j in last R items of h} C_W[j, a])
                                             item-kNN: C_W[j, a] counts the users' consumptions of j and a at most
                                             W positions apart (symmetric), counted on every interaction
    sequential  s = log sum_{k=1..K} lambda_k P_k(a | h_{-k}),   lambda_k = 2^{1-k} / sum_k' 2^{1-k'}
                P_k(a | j) = (N_k[j, a] + alpha * pop(a)) / (N_k[j] + alpha)
                                             a mixture transition distribution (Raftery 1985): a K-th order Markov
                                             model approximated by a weighted sum of k-step transitions,
                                             N_k[j, a] = how often a came exactly k positions after j, N_k[j] its row
                                             sum, pop(a) the item's share of every interaction (add-one smoothed;
                                             add-alpha smoothing of each row towards it)

and each is standardised per item over the users,

    z(u, h, a) = (s(u, h, a) - mean_u' s(u', h_u', a)) / sd_u' s(u', h_u', a)

the moments taken over every user's whole sequence as its state (for als exactly over all users, as the state does
not enter; for knn and sequential over the reference users: every user, or a seeded sample of
``sim.oracle_reference_users`` of them on a large dataset). So popularity alone raises no z: only how much more
u likes a than users do. Nothing here is an arm's model as is: knn and sequential are count models no arm serves,
and als is a different fit (its own factors, seed and all the data) from the ML-retrain arm's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _moments(raw_rows, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-item population mean and sd of the dense (users, items) blocks yielded by ``raw_rows`` (sd 0 -> 1)."""
    total = np.zeros(n_items)
    squares = np.zeros(n_items)
    n = 0
    for block in raw_rows:
        total += block.sum(axis=0)
        squares += np.square(block).sum(axis=0)
        n += block.shape[0]
    mean = total / max(n, 1)
    sd = np.sqrt(np.maximum(squares / max(n, 1) - np.square(mean), 0.0))
    sd[~(sd > 1e-9)] = 1.0
    return mean, sd


class AlsComponent:
    """``als`` of the module docstring: the state does not enter, and the moments over all users are exact:
    mean_u s(u, a) = V_a . mean(U), var_u s(u, a) = V_a' Cov(U) V_a (population moments)."""

    name = "als"

    def __init__(self, user_index: dict[int, int], user_factors: np.ndarray, item_factors: np.ndarray):
        self.user_index = user_index
        self.user_factors = user_factors
        self.item_factors = item_factors
        u64, i64 = user_factors.astype(np.float64), item_factors.astype(np.float64)
        self.mean = i64 @ u64.mean(axis=0)
        cov = np.cov(u64, rowvar=False, bias=True).reshape(u64.shape[1], u64.shape[1])
        sd = np.sqrt(np.maximum(np.einsum("if,fg,ig->i", i64, cov, i64), 0.0))
        sd[~(sd > 1e-12)] = 1.0
        self.sd = sd

    @classmethod
    def fit(
        cls,
        sequences: Mapping[int, Sequence[int]],
        item_index: Mapping[int, int],
        *,
        factors: int,
        iterations: int,
        regularization: float,
        seed: int,
    ) -> AlsComponent:
        """ALS on ``sequences`` (user -> every item the user interacted with, in any order; repeats count)."""
        from implicit.cpu.als import AlternatingLeastSquares
        from scipy.sparse import csr_matrix
        from threadpoolctl import threadpool_limits

        users = sorted(int(u) for u in sequences)
        rows, cols = [], []
        for r, u in enumerate(users):
            for i in sequences[u]:
                j = item_index.get(int(i))
                if j is None:
                    raise ValueError(f"PreferenceOracle.fit: user {u}: item id {i} is not in the catalog")
                rows.append(r)
                cols.append(j)
        matrix = csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(len(users), len(item_index)))
        matrix.sum_duplicates()
        with threadpool_limits(1):  # one BLAS thread: the same factors on every run of a machine
            model = AlternatingLeastSquares(
                factors=factors,
                regularization=regularization,
                iterations=iterations,
                num_threads=1,
                random_state=int(seed),
                calculate_training_loss=False,
            )
            model.fit(matrix, show_progress=False)
        return cls(
            {u: r for r, u in enumerate(users)},
            np.asarray(model.user_factors, dtype=np.float32),
            np.asarray(model.item_factors, dtype=np.float32),
        )

    def z_block(self, users: Sequence[int], histories: Sequence[Sequence[int]]) -> np.ndarray:
        rows = [self.user_index[int(u)] for u in users]
        s = self.user_factors[rows].astype(np.float64) @ self.item_factors.astype(np.float64).T
        return (s - self.mean) / self.sd

    def z(self, user: int, history: Sequence[int], idx: Sequence[int]) -> np.ndarray:
        s = self.item_factors[idx].astype(np.float64) @ self.user_factors[self.user_index[int(user)]].astype(np.float64)
        return (s - self.mean[idx]) / self.sd[idx]


class KnnComponent:
    """``knn`` of the module docstring: item-to-item co-occurrence within ``window`` positions, on every
    interaction; a state's score sums the co-occurrence counts of its last ``recent`` items (log1p)."""

    name = "knn"

    def __init__(self, *, window: int, recent: int):
        if window < 1 or recent < 1:
            raise ValueError(f"config sim.oracle_knn_window = {window}, sim.oracle_knn_recent = {recent}: rule: >= 1")
        self.window = window
        self.recent = recent
        self.item_index: dict[int, int] = {}
        self.counts = None
        self._exact_sums: tuple[Any, bool] | None = None  # (counts, whether :meth:`_sums` may read them directly)
        self.mean = self.sd = np.zeros(0)

    def fit(
        self, sequences: Mapping[int, Sequence[int]], item_index: Mapping[int, int], reference: Sequence[int]
    ) -> KnnComponent:
        from scipy.sparse import csr_matrix

        self.item_index = dict(item_index)
        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        for seq in sequences.values():
            idx = np.array([self.item_index[int(i)] for i in seq if int(i) in self.item_index], dtype=np.int64)
            for d in range(1, self.window + 1):
                if len(idx) > d:
                    rows += [idx[:-d], idx[d:]]
                    cols += [idx[d:], idx[:-d]]
        n = len(self.item_index)
        r = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        c = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
        self.counts = csr_matrix((np.ones(len(r), dtype=np.float64), (r, c)), shape=(n, n))
        self.counts.sum_duplicates()
        self.mean = np.zeros(n)
        self.sd = np.ones(n)
        self.mean, self.sd = _moments(self._raw_blocks([sequences[u] for u in reference]), n)
        return self

    def _recent(self, history: Sequence[int]) -> list[int]:
        return [self.item_index[int(i)] for i in list(history)[-self.recent :] if int(i) in self.item_index]

    def _raw_blocks(self, histories: Sequence[Sequence[int]], chunk: int = 256):
        from scipy.sparse import csr_matrix

        for start in range(0, len(histories), chunk):
            part = histories[start : start + chunk]
            rows, cols = [], []
            for r, h in enumerate(part):
                for j in self._recent(h):
                    rows.append(r)
                    cols.append(j)
            ind = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(part), len(self.item_index)))
            yield np.log1p((ind @ self.counts).toarray())

    def z_block(self, users: Sequence[int], histories: Sequence[Sequence[int]]) -> np.ndarray:
        return (np.concatenate(list(self._raw_blocks(histories))) - self.mean) / self.sd

    def z(self, user: int, history: Sequence[int], idx: Sequence[int]) -> np.ndarray:
        recent = self._recent(history)
        if not recent:
            s = np.zeros(len(idx))
        else:
            s = np.log1p(self._sums(recent, idx))
        return (s - self.mean[idx]) / self.sd[idx]

    def _sums(self, recent: list[int], idx: Sequence[int]) -> np.ndarray:
        """sum_{j in recent} C_W[j, a] for a in ``idx``: counts[recent][:, idx].sum(axis=0), read from the CSR
        arrays (a row twice when j is twice among the recent items, as counts[recent] has it). The counts are
        integers, their sums exact in float64 in any order, so the scipy sum and this one are the same numbers (the
        scipy sum stays where they are not: counts built otherwise)."""
        counts: Any = self.counts
        cached = getattr(self, "_exact_sums", None)
        if cached is None or cached[0] is not counts:
            data = counts.data
            exact = (
                counts.format == "csr"
                and counts.dtype == np.float64
                and bool(np.all(data == np.round(data)))
                and self.recent * float(np.abs(data).sum()) < 2.0**53
            )
            self._exact_sums = cached = (counts, exact)
        if not cached[1]:
            return np.asarray(counts[recent][:, idx].sum(axis=0), dtype=np.float64).reshape(-1)
        ptr, ind, val = counts.indptr, counts.indices, counts.data
        cols = np.concatenate([ind[ptr[r] : ptr[r + 1]] for r in recent])
        vals = np.concatenate([val[ptr[r] : ptr[r + 1]] for r in recent])
        return np.bincount(cols, weights=vals, minlength=counts.shape[1])[idx]


class SequentialComponent:
    """``sequential`` of the module docstring: the mixture transition distribution of order ``order`` with
    add-``smoothing`` towards popularity, the k-step transition counts taken on every interaction."""

    name = "sequential"

    def __init__(self, *, order: int, smoothing: float):
        if order < 1 or not smoothing > 0:
            raise ValueError(
                f"config sim.oracle_markov_order = {order}, sim.oracle_markov_smoothing = {smoothing}: "
                "rule: order >= 1, smoothing > 0"
            )
        self.order = order
        self.smoothing = float(smoothing)
        lam = 0.5 ** np.arange(order)
        self.lam = lam / lam.sum()
        self.item_index: dict[int, int] = {}
        self.steps: list = []  # k-1 -> N_k (items, items) csr
        self.rowsum: list[np.ndarray] = []
        self.pop = np.zeros(0)
        self.mean = self.sd = np.zeros(0)

    def fit(
        self, sequences: Mapping[int, Sequence[int]], item_index: Mapping[int, int], reference: Sequence[int]
    ) -> SequentialComponent:
        from scipy.sparse import csr_matrix

        self.item_index = dict(item_index)
        n = len(self.item_index)
        seqs = [
            np.array([self.item_index[int(i)] for i in s if int(i) in self.item_index], dtype=np.int64)
            for s in sequences.values()
        ]
        pop = np.bincount(np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64), minlength=n).astype(float)
        self.pop = (pop + 1.0) / (pop.sum() + n)  # Laplace: an item nobody consumed keeps a share > 0
        self.steps, self.rowsum = [], []
        for k in range(1, self.order + 1):
            r = [s[:-k] for s in seqs if len(s) > k]
            c = [s[k:] for s in seqs if len(s) > k]
            r = np.concatenate(r) if r else np.zeros(0, dtype=np.int64)
            c = np.concatenate(c) if c else np.zeros(0, dtype=np.int64)
            m = csr_matrix((np.ones(len(r)), (r, c)), shape=(n, n))
            m.sum_duplicates()
            self.steps.append(m)
            self.rowsum.append(np.asarray(m.sum(axis=1), dtype=np.float64).reshape(-1))
        self.mean = np.zeros(n)
        self.sd = np.ones(n)
        self.mean, self.sd = _moments(self._raw_blocks([sequences[u] for u in reference]), n)
        return self

    def _last(self, history: Sequence[int]) -> list[int | None]:
        """h_{-1}, ..., h_{-K}: the item k positions back (None where the history is shorter or off-catalog)."""
        h = list(history)
        return [self.item_index.get(int(h[-k])) if len(h) >= k else None for k in range(1, self.order + 1)]

    def _probability(self, last: list[int | None], idx) -> np.ndarray:
        """sum_k lambda_k P_k(a | h_{-k}) for the items ``idx`` (a slice or list); an absent h_{-k} gives pop(a)."""
        a = self.smoothing
        p = np.zeros(len(self.pop[idx]))
        for k, j in enumerate(last):
            if j is None:
                p += self.lam[k] * self.pop[idx]
                continue
            counts = self._row(k, j)[idx]
            p += self.lam[k] * (counts + a * self.pop[idx]) / (self.rowsum[k][j] + a)
        return p

    def _row(self, k: int, j: int) -> np.ndarray:
        """N_{k+1}[j, :] dense: steps[k][j].toarray() read from the CSR arrays (bincount adds a duplicate entry
        where toarray would, in the same order, from the same 0.0)."""
        m = self.steps[k]
        if m.format != "csr" or m.dtype != np.float64:
            return m[j].toarray().reshape(-1)
        lo, hi = m.indptr[j], m.indptr[j + 1]
        return np.bincount(m.indices[lo:hi], weights=m.data[lo:hi], minlength=m.shape[1])

    def _raw_blocks(self, histories: Sequence[Sequence[int]], chunk: int = 256):
        for start in range(0, len(histories), chunk):
            part = histories[start : start + chunk]
            yield np.log(np.stack([self._probability(self._last(h), slice(None)) for h in part]))

    def z_block(self, users: Sequence[int], histories: Sequence[Sequence[int]]) -> np.ndarray:
        return (np.concatenate(list(self._raw_blocks(histories))) - self.mean) / self.sd

    def z(self, user: int, history: Sequence[int], idx: Sequence[int]) -> np.ndarray:
        return (np.log(self._probability(self._last(history), list(idx))) - self.mean[idx]) / self.sd[idx]


class ReplayComponent:
    """``replay``: the users' real future items and nothing else (the simplest truth no model owns). For a
    request at t (history h = x_{1:t}, the user's real prefix),

        z(u, h, a) = strength * decay^(d - 1)   if a = x_{t+d}, 1 <= d <= horizon, and x_{t+d} is not the held-out
                                                target (the sequence's last item; the smallest such d)
                   = 0                          otherwise

    so P_pref = sigmoid(b0 + slope * z) gives the rest a small base rate (sigmoid(b0), calibrated like every
    oracle's) and a future item a lift that decays with its distance. Nothing is fitted: no model family, and no
    standardisation (a future item is ``strength`` standard deviations of a model oracle above the rest). Without
    a history (the user's whole sequence as the state) there is no future: z = 0.

    With ``popularity_exponent`` gamma > 0 (``sim.replay_popularity_exponent``) a future item's lift is discounted
    by its popularity, as popularity-stratified recall weighs a hit (Steck, "Item popularity and recommendation
    accuracy", RecSys 2011):

        z(u, h, a) = strength * decay^(d - 1) * min(1, (n_med / n_a)^gamma)

    n_a the item's interactions in the whole dataset, n_med their median over the items that have any: consuming an
    item everyone consumes says less about u's taste than consuming a niche one. The discount depends on the item
    alone, never on an arm's scores, so an arm gains from it only by exposing the user's real future items."""

    name = "replay"

    def __init__(self, *, horizon: int, decay: float, strength: float, popularity_exponent: float = 0.0):
        if horizon < 1 or not 0 < decay <= 1 or not strength >= 0 or not popularity_exponent >= 0:
            raise ValueError(
                f"config sim.replay_horizon = {horizon}, sim.replay_decay = {decay}, sim.replay_strength = "
                f"{strength}, sim.replay_popularity_exponent = {popularity_exponent}: rule: horizon >= 1, "
                "0 < decay <= 1, strength >= 0, popularity_exponent >= 0"
            )
        self.horizon = int(horizon)
        self.decay = float(decay)
        self.strength = float(strength)
        self.popularity_exponent = float(popularity_exponent)
        self.item_index: dict[int, int] = {}
        self.sequences: dict[int, list[int]] = {}
        self.discount: np.ndarray = np.ones(0)  # per item index: min(1, (n_med / n_a)^gamma)

    def fit(self, sequences: Mapping[int, Sequence[int]], item_index: Mapping[int, int]) -> ReplayComponent:
        self.item_index = dict(item_index)
        self.sequences = {int(u): [int(i) for i in s] for u, s in sequences.items()}
        self.discount = np.ones(len(self.item_index))
        if self.popularity_exponent == 0:  # no discount: the interactions need not be counted
            return self
        counts = np.zeros(len(self.item_index))
        for seq in self.sequences.values():
            for item in seq:
                j = self.item_index.get(item)
                if j is not None:
                    counts[j] += 1
        seen = counts > 0
        if seen.any():
            median = float(np.median(counts[seen]))
            self.discount[seen] = np.minimum(1.0, (median / counts[seen]) ** self.popularity_exponent)
        return self

    def _future(self, user: int, history: Sequence[int]) -> dict[int, float]:
        """Item index -> z for the user's future items after ``history`` (the nearest occurrence of each)."""
        seq = self.sequences[int(user)]
        t = len(history)
        if t > len(seq) or (t and int(history[-1]) != seq[t - 1]):
            raise ValueError(
                f"replay oracle: user {user}: the request's history (length {t}, last item "
                f"{int(history[-1]) if t else None}) is not a prefix of the user's real sequence; rule: a request "
                "carries x_1..x_t"
            )
        out: dict[int, float] = {}
        for d, item in enumerate(seq[t : min(t + self.horizon, len(seq) - 1)], start=1):
            j = self.item_index.get(item)
            if j is not None and j not in out:
                out[j] = self.strength * self.decay ** (d - 1) * float(self.discount[j])
        return out

    def z_block(self, users: Sequence[int], histories: Sequence[Sequence[int]]) -> np.ndarray:
        out = np.zeros((len(users), len(self.item_index)))
        for r, (u, h) in enumerate(zip(users, histories, strict=True)):
            for j, v in self._future(u, h).items():
                out[r, j] = v
        return out

    def z(self, user: int, history: Sequence[int], idx: Sequence[int]) -> np.ndarray:
        future = self._future(user, history)
        return np.array([future.get(int(j), 0.0) for j in idx], dtype=np.float64)


def reference_users(users: Sequence[int], cap: int, seed: int) -> list[int]:
    """The users the knn, sequential and mixture moments are taken over: all of them, or a seeded sample of
    ``cap`` (``sim.oracle_reference_users``; 0: all)."""
    users = sorted(int(u) for u in users)
    if cap <= 0 or len(users) <= cap:
        return users
    rng = np.random.default_rng([int(seed), 30])
    return sorted(rng.choice(users, size=cap, replace=False).tolist())
