"""The non-LLM rankers the experiment compares against (and the future popularity / ML-retrain arms): one
interface, ``Ranker``.

    ranker.fit(sequences, item_ids)      sequences: user id -> chronological training item ids; item_ids: the catalog
    ranker.score(requests)               requests: (user id, history item ids oldest first, candidate item ids);
                                         returns one float array per request, one score per candidate, higher = better

``make_ranker(name, cfg, seed)`` builds one by name: ``popularity`` (abpo.baselines.popularity) or ``ml_retrain``
(abpo.baselines.als: implicit's ALS; why not a sequential model: see that module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

Request = tuple[int, Sequence[int], Sequence[int]]


class Ranker(Protocol):
    name: str

    def fit(self, sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int]) -> Ranker: ...

    def score(self, requests: Sequence[Request]) -> list[np.ndarray]: ...


def softmax_propensities(scores: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(score / T) over a candidate set: the exposure distribution of a ranker used as a logging policy
    (every candidate gets probability > 0)."""
    if not temperature > 0:
        raise ValueError(f"softmax_propensities: temperature {temperature}; rule: > 0")
    z = np.asarray(scores, dtype=np.float64) / temperature
    if z.ndim != 1 or z.size == 0 or not np.all(np.isfinite(z)):
        raise ValueError("softmax_propensities: scores must be a non-empty finite vector")
    z = z - z.max()
    p = np.exp(z)
    return p / p.sum()


def make_ranker(name: str, cfg, *, seed: int) -> Ranker:
    """A ranker by its experiment-row name, configured from ``cfg.experiment``."""
    if name == "popularity":
        from abpo.baselines.popularity import PopularityRanker

        return PopularityRanker()
    if name == "ml_retrain":
        from abpo.baselines.als import ALSRanker

        epochs = cfg.experiment.ml_retrain_epochs or ALSRanker.DEFAULT_ITERATIONS
        return ALSRanker(iterations=epochs, seed=seed)
    raise ValueError(f"make_ranker: unknown ranker {name!r}; rule: popularity | ml_retrain")
