"""The non-LLM rankers (the experiment's rows and the production loop's ranker arms): one interface, ``Ranker``,
and one factory, :func:`make_ranker`.

    ranker.fit(sequences, item_ids)      sequences: user id -> chronological training item ids; item_ids: the catalog
    ranker.score(requests)               requests: (user id, history item ids oldest first, candidate item ids);
                                         returns one float array per request, one score per candidate, higher = better
    ranker.save(dir) / Ranker.load(dir)  plain files (:func:`save_ranker`, :func:`load_ranker`)

:data:`RANKERS` names them: ``popularity`` (abpo.baselines.popularity), ``ml_retrain`` (abpo.baselines.als:
implicit's ALS) and ``sasrec`` (abpo.baselines.sasrec: SASRec-CE, written in torch because RecTools and RecBole do
not install against the pins; the ML-retrain arm's model with ``arms.ml_retrain.kind: sasrec``). A new ranker is one
class here and one entry in RANKERS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

Request = tuple[int, Sequence[int], Sequence[int]]
RANKER_FILE = "ranker.json"

# ranker name -> "module:Class" (imported when used: implicit is only loaded for ALS)
RANKERS = {
    "popularity": "abpo.baselines.popularity:PopularityRanker",
    "ml_retrain": "abpo.baselines.als:ALSRanker",
    "sasrec": "abpo.baselines.sasrec:SASRecRanker",
}


class Ranker(Protocol):
    name: str

    def fit(self, sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int]) -> Ranker: ...

    def score(self, requests: Sequence[Request]) -> list[np.ndarray]: ...

    def save(self, out: Path) -> dict: ...


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


def ranker_class(name: str) -> type:
    import importlib

    if name not in RANKERS:
        raise ValueError(f"make_ranker: unknown ranker {name!r}; rule: {' | '.join(RANKERS)}")
    module, _, cls = RANKERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_ranker(name: str, *, seed: int = 0, ml_retrain_epochs: int = 0, **params: Any) -> Ranker:
    """The one ranker factory: an unfitted ranker by name with its ``params`` (popularity: ``window``; ml_retrain:
    ``iterations`` and the ALS settings) and ``seed`` when the ranker takes one. ``ml_retrain_epochs`` (an
    experiment's ``experiment.ml_retrain_epochs``, passed by the caller) sets the iterations of a ranker that has
    them when it is not 0 and ``params`` does not give them."""
    import inspect

    cls = ranker_class(name)
    accepted = inspect.signature(cls).parameters
    if "seed" in accepted:
        params.setdefault("seed", seed)
    if "iterations" in accepted and ml_retrain_epochs:
        params.setdefault("iterations", ml_retrain_epochs)
    return cls(**params)


def save_ranker(ranker: Ranker, out_dir: str | Path) -> Path:
    """Write a fitted ranker as plain files: ``ranker.json`` (its kind and what its class saves) and whatever else
    the class writes (ALS: ``als.npz``, implicit's own format)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if ranker.name not in RANKERS:
        raise ValueError(f"save_ranker: unknown ranker {ranker.name!r}")
    meta = {"kind": ranker.name, **ranker.save(out)}
    (out / RANKER_FILE).write_text(json.dumps(meta))
    return out


def load_ranker(path: str | Path) -> Ranker:
    """The ranker :func:`save_ranker` wrote into ``path``."""
    path = Path(path)
    f = path / RANKER_FILE
    if not f.exists():
        raise FileNotFoundError(f"{path}: no {RANKER_FILE}; not a directory written by save_ranker")
    meta = json.loads(f.read_text())
    if meta.get("kind") not in RANKERS:
        raise ValueError(f"{f}: field kind = {meta.get('kind')!r}; rule: {' | '.join(RANKERS)}")
    return ranker_class(meta["kind"]).load(path, meta)
