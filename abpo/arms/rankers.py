"""The two non-LLM arms: ``popularity`` and ``ml_retrain`` (implicit's ALS, the experiment's ML-retrain row).

Each month they are refitted from scratch on everything the platform has seen up to the month (never the month
itself): every user's interactions to date (the initial history x_{1:T} and the real interactions of the
simulated months before it) and every click logged by any arm before it. They expose by sampling
softmax(score / T) over the candidate set (popularity: score = log(1 + count), so exposure ~ count^(1/T)), so
their propensities are informative and exact. A fitted ranker is saved as files (:func:`save_ranker`) and
registered in MLflow like the LLM checkpoints (abpo.arms.registry)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from abpo.baselines import softmax_propensities

RANKER_FILE = "ranker.json"


class RankerArm:
    def __init__(self, name: str, ranker, temperature: float, model_version: str):
        self.name = name
        self.ranker = ranker
        self.temperature = float(temperature)
        self.model_version = str(model_version)
        self.logging_policy = f"softmax(score/T, T={self.temperature}) {ranker.name}"

    def propensities(self, requests: Sequence) -> list[np.ndarray]:
        return [softmax_propensities(s, self.temperature) for s in self.ranker.score(requests)]


def make_arm_ranker(name: str, cfg):
    """The arm's unfitted ranker, configured from ``cfg.arms``."""
    if name == "popularity":
        from abpo.baselines.popularity import PopularityRanker

        return PopularityRanker(window=cfg.arms.popularity_window)
    if name == "ml_retrain":
        from abpo.baselines.als import ALSRanker

        return ALSRanker(iterations=cfg.arms.ml_retrain_iterations, seed=cfg.seed)
    raise ValueError(f"make_arm_ranker: {name!r} is not a ranker arm; rule: popularity | ml_retrain")


def temperature_of(name: str, cfg) -> float:
    return cfg.arms.popularity_temperature if name == "popularity" else cfg.arms.ml_retrain_temperature


def save_ranker(ranker, out_dir: str | Path) -> Path:
    """Write a fitted ranker as plain files: ``ranker.json`` (kind and parameters; popularity counts) and, for ALS,
    ``als.npz`` (implicit's own format) with the item order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict = {"kind": ranker.name}
    if ranker.name == "popularity":
        meta.update(window=ranker.window, counts={str(k): int(v) for k, v in sorted(ranker.counts.items())})
    elif ranker.name == "ml_retrain":
        if ranker.model is None:
            raise ValueError(f"save_ranker({out}): the ALS ranker is not fitted")
        ranker.model.save(str(out / "als.npz"))
        meta.update(params=ranker.params, seed=ranker.seed,
                    item_ids=[i for i, _ in sorted(ranker.index.items(), key=lambda kv: kv[1])])
    else:
        raise ValueError(f"save_ranker: unknown ranker {ranker.name!r}")
    (out / RANKER_FILE).write_text(json.dumps(meta))
    return out


def load_ranker(path: str | Path):
    """The ranker :func:`save_ranker` wrote into ``path``."""
    from collections import Counter

    path = Path(path)
    f = path / RANKER_FILE
    if not f.exists():
        raise FileNotFoundError(f"{path}: no {RANKER_FILE}; not a directory written by save_ranker")
    meta = json.loads(f.read_text())
    if meta.get("kind") == "popularity":
        from abpo.baselines.popularity import PopularityRanker

        r = PopularityRanker(window=int(meta["window"]))
        r.counts = Counter({int(k): int(v) for k, v in meta["counts"].items()})
        return r
    if meta.get("kind") == "ml_retrain":
        from implicit.cpu.als import AlternatingLeastSquares

        from abpo.baselines.als import ALSRanker

        r = ALSRanker(**meta["params"], seed=int(meta["seed"]))
        r.model = AlternatingLeastSquares.load(str(path / "als.npz"))
        r.index = {int(i): j for j, i in enumerate(meta["item_ids"])}
        return r
    raise ValueError(f"{f}: field kind = {meta.get('kind')!r}; rule: popularity | ml_retrain")


def fit_ranker(name: str, cfg, sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int]):
    return make_arm_ranker(name, cfg).fit(sequences, item_ids)
