"""Prompts with candidate sets (docs/ABPO_SPEC.md "Offline construction").

Every prompt shows a history and a candidate set C that contains the positive:
- D_sup (build_sup_examples): from the initial history x_{1:T}, pairs (x_{1:t}, x_{t+1}) for
  t = 1..T-1 (the latest data.sup_examples_per_user of them; 0 = all), C = {x_{t+1}} + M-1 distractors.
- D_bandit requests (build_bandit_requests): t' in {T..T+N-2}, history x_{1:t'}, positive x_{t'+1},
  C_{t'} = {x_{t'+1}} + M-1 distractors.
  M = data.train_candidates.
- Evaluation (build_eval_examples): history x_{1:T+N-1}, positive x_{T+N}, C = target + M_eval-1 negatives.
  M_eval = data.eval_candidates.

Distractors and negatives (one sampler, ``_candidate_sets``, for all three) are catalog items the user never
interacted with in the whole sequence x_{1:T+N}, so the held-out target x_{T+N} is never drawn into a training
set. Of the n = M-1 of them, round(f * n) are popularity-based hard negatives, drawn without replacement with
probability proportional to training popularity (interaction counts without the held-out targets,
``training_popularity``), and the rest uniformly from the remaining unseen items. f is
data.eval_hard_negative_fraction for evaluation and data.train_hard_negative_fraction for D_sup and D_bandit, so
training can see the evaluation's candidate distribution: on the bundled data the positive is the most popular of
its 20 candidates in 45% of uniform D_sup sets (16% at f = 0.5), a cue the evaluation's hard negatives take away.
f = 0 gives the spec's uniform distractors.

Every draw comes from a generator seeded with (data.seed, stream, user_id), so a user's examples depend only on
the seed, that user's sequence and the popularity weights (pass ``popularity`` to fix them): the same seed gives
the same examples whatever other users are present, and the order of C is a seeded shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from abpo.data.splits import UserSplit

_STREAM_SUP, _STREAM_BANDIT, _STREAM_EVAL = 1, 2, 3


@dataclass(frozen=True)
class Example:
    request_id: str  # f"{user_id}:{t}", t = len(history): unique across D_sup, D_bandit and eval
    user_id: int
    history: list[int]  # x_{1:t}
    candidates: list[int]  # seeded shuffle; contains `positive`
    positive: int  # x_{t+1} (D_sup, D_bandit) or x_{T+N} (evaluation)


class _Catalog:
    """Catalog item ids as a sorted array, with per-user 'never interacted' index sets."""

    def __init__(self, dataset):
        self.ids = dataset.item_ids()
        self.n = len(self.ids)

    def index_of(self, items) -> np.ndarray:
        items = np.asarray(items, dtype=np.int64)
        idx = np.searchsorted(self.ids, items)
        bad = (idx >= self.n) | (self.ids[np.minimum(idx, self.n - 1)] != items)
        if bad.any():
            raise ValueError(f"item {int(items[bad][0])} is not in the catalog")
        return idx

    def unseen(self, split: UserSplit) -> np.ndarray:
        """Indices (into ids) of items the user never interacted with in x_{1:T+N}."""
        mask = np.ones(self.n, dtype=bool)
        mask[self.index_of(split.sequence)] = False
        return np.flatnonzero(mask)


def _rng(seed: int, stream: int, user_id: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), stream, int(user_id)])


def _weighted_first_distinct(rng: np.random.Generator, cum: np.ndarray, k: int, first: dict[int, None]) -> None:
    """Extend ``first`` (distinct indices in order of first appearance in a stream of draws with probability
    proportional to integer weights w, ``cum = cumsum(w)``) until it holds at least k: successive sampling without
    replacement, the distribution of Efraimidis-Spirakis / Gumbel top-k. The stream goes on while draws are cheap;
    if the items drawn already hold most of the mass, Gumbel top-k over the items not yet drawn finishes exactly.
    The caller ensures that at least k weights are positive."""
    size = 2 * (k - len(first)) + 8
    for _ in range(4):
        if len(first) >= k:
            return
        draws = np.searchsorted(cum, rng.integers(0, int(cum[-1]), size=size), side="right")
        first.update(dict.fromkeys(draws.tolist()))
        size *= 2
    if len(first) < k:
        w = np.diff(cum, prepend=0).astype(np.float64)
        w[list(first)] = 0.0
        pos = np.flatnonzero(w > 0)
        keys = np.log(rng.random(len(pos))) / w[pos]
        need = k - len(first)
        top = np.argpartition(-keys, need - 1)[:need]
        first.update(dict.fromkeys(pos[top[np.argsort(-keys[top])]].tolist()))


class _UserNegatives:
    """One user's unseen items (indices into the catalog) and the cumulative popularity weights over them."""

    def __init__(self, cat: _Catalog, split: UserSplit, weights: np.ndarray):
        self.unseen = cat.unseen(split)
        w = weights[self.unseen]
        self.cum = np.cumsum(w)
        self.n_weighted = int(np.count_nonzero(w))


def _candidate_sets(
    rng: np.random.Generator, cat: _Catalog, neg: _UserNegatives, positives: list[int], m: int, n_hard: int
) -> list[list[int]]:
    """One candidate set per positive, all of one user: C = {positive} + m-1 distinct unseen negatives, of which
    min(n_hard, unseen items with popularity) are drawn by popularity (successive sampling without replacement,
    probability proportional to weight) and the rest uniformly from the unseen items not picked yet; each C in a
    seeded shuffle. With n_hard = 0 every negative is uniform (the spec's distractors). The user's sets are drawn
    in a few batched calls on its generator (so which sets a seed gives depends on how many are asked for); every
    step is exact sampling (a stream of draws that skips the items already picked), so the distribution does not."""
    n_neg, n_unseen, n_sets = m - 1, len(neg.unseen), len(positives)
    if n_neg > n_unseen:
        raise ValueError(f"cannot draw {n_neg} distinct negatives from {n_unseen} unseen items")
    if not n_sets:
        return []
    k_hard = min(n_hard, neg.n_weighted)  # the rest is filled uniformly
    rows: list[list[int]] = []
    if k_hard:
        draws = rng.integers(0, int(neg.cum[-1]), size=(n_sets, 2 * k_hard + 8))
        for r in np.searchsorted(neg.cum, draws, side="right").tolist():
            first = dict.fromkeys(r)  # distinct draws in order of first appearance (k is small: plain Python)
            if len(first) < k_hard:
                _weighted_first_distinct(rng, neg.cum, k_hard, first)
            rows.append(list(first)[:k_hard])
    else:
        rows = [[] for _ in range(n_sets)]
    if k_hard < n_neg:
        if 4 * n_neg <= n_unseen:  # uniform stream, skipping items already picked
            width = n_neg + (n_neg * n_neg) // n_unseen + 8
            for row, stream in zip(rows, rng.integers(0, n_unseen, size=(n_sets, width)).tolist()):
                taken = set(row)
                for x in stream:
                    if x not in taken:
                        taken.add(x)
                        row.append(x)
                        if len(row) == n_neg:
                            break
                while len(row) < n_neg:  # rare: the stream repeated itself too often
                    x = int(rng.integers(0, n_unseen))
                    if x not in taken:
                        taken.add(x)
                        row.append(x)
        else:  # few unseen items: permute the ones not picked yet
            for row in rows:
                free = np.ones(n_unseen, dtype=bool)
                free[row] = False
                rest = np.flatnonzero(free)
                row.extend(rest[rng.choice(len(rest), n_neg - len(row), replace=False)].tolist())
    cands = np.empty((n_sets, m), dtype=np.int64)
    cands[:, :n_neg] = cat.ids[neg.unseen[np.asarray(rows, dtype=np.int64).reshape(n_sets, n_neg)]]
    cands[:, n_neg] = positives
    return rng.permuted(cands, axis=1).tolist()


def _popularity_weights(cat: _Catalog, splits: list[UserSplit], dataset, popularity) -> np.ndarray:
    """Per catalog index: training popularity (``popularity`` if given, else ``training_popularity``)."""
    pop = training_popularity(splits, dataset) if popularity is None else popularity
    weights = np.zeros(cat.n, dtype=np.int64)
    if pop:
        weights[cat.index_of(list(pop))] = list(pop.values())
    return weights


def _n_hard(frac: float, m: int, key: str) -> int:
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"data.{key}={frac}: expected a share in [0, 1]")
    return int(round(frac * (m - 1)))


def _check_m(m: int, key: str) -> None:
    if m < 2:
        raise ValueError(f"data.{key}={m}: a candidate set needs the positive and at least one distractor")


def build_sup_examples(
    splits: list[UserSplit], dataset, data_cfg, popularity: dict[int, int] | None = None
) -> list[Example]:
    """D_sup from the initial histories x_{1:T}: (x_{1:t}, x_{t+1}) for the latest
    data.sup_examples_per_user values of t in 1..T-1 (0 = all), chronological within a user; C has
    round(train_hard_negative_fraction * (M-1)) popularity-weighted distractors (``popularity``, default
    ``training_popularity(splits, dataset)``)."""
    m = data_cfg.train_candidates
    _check_m(m, "train_candidates")
    n_hard = _n_hard(data_cfg.train_hard_negative_fraction, m, "train_hard_negative_fraction")
    cat = _Catalog(dataset)
    weights = _popularity_weights(cat, splits, dataset, popularity) if n_hard else np.zeros(cat.n, dtype=np.int64)
    cap = data_cfg.sup_examples_per_user
    out = []
    for s in splits:
        rng = _rng(data_cfg.seed, _STREAM_SUP, s.user_id)
        t_max = len(s.history) - 1
        ts = range(max(1, t_max - cap + 1) if cap else 1, t_max + 1)
        positives = [s.history[t] for t in ts]
        sets = _candidate_sets(rng, cat, _UserNegatives(cat, s, weights), positives, m, n_hard)
        out += [Example(f"{s.user_id}:{t}", s.user_id, s.history[:t], c, p) for t, c, p in zip(ts, sets, positives)]
    return out


def build_bandit_requests(
    splits: list[UserSplit], dataset, data_cfg, popularity: dict[int, int] | None = None
) -> list[Example]:
    """D_bandit requests: t' in {T..T+N-2}, history x_{1:t'}, positive x_{t'+1}, C_{t'} of size M with
    round(train_hard_negative_fraction * (M-1)) popularity-weighted distractors (as ``build_sup_examples``)."""
    m = data_cfg.train_candidates
    _check_m(m, "train_candidates")
    n_hard = _n_hard(data_cfg.train_hard_negative_fraction, m, "train_hard_negative_fraction")
    cat = _Catalog(dataset)
    weights = _popularity_weights(cat, splits, dataset, popularity) if n_hard else np.zeros(cat.n, dtype=np.int64)
    out = []
    for s in splits:
        rng = _rng(data_cfg.seed, _STREAM_BANDIT, s.user_id)
        seq = s.sequence
        ts = range(len(s.history), len(s.history) + len(s.update))  # t' = T..T+N-2
        positives = [seq[t] for t in ts]  # x_{t'+1} (0-based index t')
        sets = _candidate_sets(rng, cat, _UserNegatives(cat, s, weights), positives, m, n_hard)
        out += [Example(f"{s.user_id}:{t}", s.user_id, seq[:t], c, p) for t, c, p in zip(ts, sets, positives)]
    return out


def training_popularity(splits: list[UserSplit], dataset) -> dict[int, int]:
    """Interaction counts per item without the held-out targets x_{T+N} (the 'training data' the
    evaluation's hard negatives and Diversity@K use)."""
    pop = dataset.popularity()
    for s in splits:
        pop[s.target] -= 1
        if pop[s.target] == 0:
            del pop[s.target]
    return pop


def build_eval_examples(
    splits: list[UserSplit], dataset, data_cfg, popularity: dict[int, int] | None = None
) -> list[Example]:
    """Evaluation: history x_{1:T+N-1}, positive x_{T+N}, target + (M_eval-1) unseen negatives of which
    round(eval_hard_negative_fraction * (M_eval-1)) are popularity-weighted hard negatives (``popularity``,
    default ``training_popularity(splits, dataset)``)."""
    m = data_cfg.eval_candidates
    _check_m(m, "eval_candidates")
    n_hard = _n_hard(data_cfg.eval_hard_negative_fraction, m, "eval_hard_negative_fraction")
    cat = _Catalog(dataset)
    weights = _popularity_weights(cat, splits, dataset, popularity)
    out = []
    for s in splits:
        rng = _rng(data_cfg.seed, _STREAM_EVAL, s.user_id)
        seq = s.sequence
        t = len(seq) - 1
        (cands,) = _candidate_sets(rng, cat, _UserNegatives(cat, s, weights), [s.target], m, n_hard)
        out.append(Example(f"{s.user_id}:{t}", s.user_id, seq[:t], cands, s.target))
    return out


def assert_target_held_out(splits: list[UserSplit], *training_sets: list[Example]) -> int:
    """Raise if any user's held-out target x_{T+N} appears in one of that user's training candidate
    sets or histories; return the number of training examples checked."""
    target = {s.user_id: s.target for s in splits}
    n = 0
    for examples in training_sets:
        for ex in examples:
            n += 1
            tgt = target.get(ex.user_id)
            if tgt is not None and (tgt in ex.candidates or tgt in ex.history or ex.positive == tgt):
                raise AssertionError(f"request {ex.request_id}: held-out target {tgt} leaked into a training prompt")
    return n
