"""Prompts with candidate sets (ABPO_SPEC.md "Offline construction of bandit logs").

Every prompt shows a history and a candidate set C that contains the positive:
- D_sup (build_sup_examples): from the initial history x_{1:T}, pairs (x_{1:t}, x_{t+1}) for
  t = 1..T-1 (latest data.sup_examples_per_user of them), C = {x_{t+1}} + M-1 distractors.
- D_bandit requests (build_bandit_requests): t' in {T..T+N-2}, history x_{1:t'}, positive x_{t'+1},
  C_{t'} = {x_{t'+1}} + M-1 distractors.
  Training distractors are drawn uniformly without replacement from the catalog items the user never
  interacted with (in the whole sequence x_{1:T+N}), so x_{T+N} is excluded by construction.
  M = data.train_candidates.
- Evaluation (build_eval_examples): history x_{1:T+N-1}, positive x_{T+N}, C = target + negatives
  the user never interacted with: round(data.eval_hard_negative_fraction * (M_eval - 1)) popularity-
  based hard negatives (drawn without replacement with probability proportional to training
  popularity, i.e. interaction counts without the held-out targets) and the rest uniform.
  M_eval = data.eval_candidates.

Every draw comes from a generator seeded with (data.seed, stream, user_id), so a user's examples
depend only on the seed and that user's sequence: the same seed gives the same examples whatever
other users are present, and the order of C is a seeded shuffle.
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


def _sample_without_replacement(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """k distinct indices uniform in [0, n): the first k distinct values of a stream of uniform draws
    (sequential sampling without replacement, exact), O(k log k) instead of permuting all n."""
    if k > n:
        raise ValueError(f"cannot draw {k} distinct items from {n}")
    if 4 * k <= n:
        draws = rng.integers(0, n, size=k + (k * k) // n + 8)
        _, first = np.unique(draws, return_index=True)
        if len(first) >= k:
            first.sort()
            return draws[first[:k]]
    return rng.choice(n, size=k, replace=False)


def _with_distractors(
    rng: np.random.Generator, cat: _Catalog, unseen: np.ndarray, positive: int, m: int
) -> list[int]:
    """C = {positive} + (m-1) uniform draws without replacement from ``unseen``, shuffled."""
    picks = unseen[_sample_without_replacement(rng, len(unseen), m - 1)]
    cands = np.append(cat.ids[picks], positive)
    rng.shuffle(cands)
    return cands.tolist()


def _check_m(m: int, key: str) -> None:
    if m < 2:
        raise ValueError(f"data.{key}={m}: a candidate set needs the positive and at least one distractor")


def build_sup_examples(splits: list[UserSplit], dataset, data_cfg) -> list[Example]:
    """D_sup from the initial histories x_{1:T}: (x_{1:t}, x_{t+1}) for the latest
    data.sup_examples_per_user values of t in 1..T-1 (0 = all), chronological within a user."""
    m = data_cfg.train_candidates
    _check_m(m, "train_candidates")
    cat = _Catalog(dataset)
    cap = data_cfg.sup_examples_per_user
    out = []
    for s in splits:
        rng = _rng(data_cfg.seed, _STREAM_SUP, s.user_id)
        unseen = cat.unseen(s)
        t_max = len(s.history) - 1
        t_min = max(1, t_max - cap + 1) if cap else 1
        for t in range(t_min, t_max + 1):
            pos = s.history[t]
            out.append(
                Example(f"{s.user_id}:{t}", s.user_id, s.history[:t], _with_distractors(rng, cat, unseen, pos, m), pos)
            )
    return out


def build_bandit_requests(splits: list[UserSplit], dataset, data_cfg) -> list[Example]:
    """D_bandit requests: t' in {T..T+N-2}, history x_{1:t'}, positive x_{t'+1}, C_{t'} of size M."""
    m = data_cfg.train_candidates
    _check_m(m, "train_candidates")
    cat = _Catalog(dataset)
    out = []
    for s in splits:
        rng = _rng(data_cfg.seed, _STREAM_BANDIT, s.user_id)
        unseen = cat.unseen(s)
        seq = s.sequence
        T = len(s.history)
        for t in range(T, T + len(s.update)):  # t' = T..T+N-2
            pos = seq[t]  # x_{t'+1} (0-based index t')
            out.append(Example(f"{s.user_id}:{t}", s.user_id, seq[:t], _with_distractors(rng, cat, unseen, pos, m), pos))
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


def build_eval_examples(splits: list[UserSplit], dataset, data_cfg) -> list[Example]:
    """Evaluation: history x_{1:T+N-1}, positive x_{T+N}, target + (M_eval-1) unseen negatives of which
    round(eval_hard_negative_fraction * (M_eval-1)) are popularity-weighted hard negatives."""
    m = data_cfg.eval_candidates
    _check_m(m, "eval_candidates")
    frac = data_cfg.eval_hard_negative_fraction
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"data.eval_hard_negative_fraction={frac}: expected a share in [0, 1]")
    cat = _Catalog(dataset)
    pop = training_popularity(splits, dataset)
    weights = np.zeros(cat.n)
    if pop:
        weights[cat.index_of(list(pop))] = list(pop.values())
    n_neg = m - 1
    n_hard_cfg = int(round(frac * n_neg))
    out = []
    for s in splits:
        rng = _rng(data_cfg.seed, _STREAM_EVAL, s.user_id)
        unseen = cat.unseen(s)
        w = weights[unseen]
        n_hard = min(n_hard_cfg, int((w > 0).sum()))  # the rest is filled uniformly
        # weighted sampling without replacement (Efraimidis-Spirakis / Gumbel top-k): largest log(u)/w
        keys = np.full(len(unseen), -np.inf)
        pos_w = w > 0
        keys[pos_w] = np.log(rng.random(int(pos_w.sum()))) / w[pos_w]
        hard = np.argpartition(-keys, n_hard - 1)[:n_hard] if n_hard else np.array([], dtype=np.int64)
        rest_mask = np.ones(len(unseen), dtype=bool)
        rest_mask[hard] = False
        rest = np.flatnonzero(rest_mask)
        uniform = rest[_sample_without_replacement(rng, len(rest), n_neg - n_hard)]
        negs = cat.ids[unseen[np.concatenate([hard, uniform]).astype(np.int64)]]
        cands = np.append(negs, s.target)
        rng.shuffle(cands)
        seq = s.sequence
        t = len(seq) - 1
        out.append(Example(f"{s.user_id}:{t}", s.user_id, seq[:t], cands.tolist(), s.target))
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
