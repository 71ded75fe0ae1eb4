"""The MLflow pyfunc loader of a registered ranker-arm version (``popularity``, ``ml_retrain``):
``mlflow.pyfunc.load_model("models:/abpo-arm-popularity@champion")`` gives the arm's exposure distribution.

Input rows: ``history_item_ids`` (list of int, oldest first) and ``candidate_ids`` (list of int). Output rows:
``ranked_item_ids`` (best first) and ``propensities`` (softmax(score / T) in the order of ``candidate_ids``). Param
``temperature`` (default: the arm's) sets T for the request (abpo.registry.ranker_signature declares it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from abpo.arms.rankers import ARM_FILE, RankerArm
from abpo.baselines import softmax_propensities


class RankerModel:
    def __init__(self, path: str | Path):

        meta = json.loads((Path(path) / ARM_FILE).read_text())
        self.arm = RankerArm.load(meta["arm"], path)
        self.ranker, self.temperature = self.arm.ranker, self.arm.temperature

    def predict(self, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:

        temperature = float((params or {}).get("temperature", self.temperature))
        reqs = [
            (0, [int(i) for i in r.history_item_ids], [int(c) for c in r.candidate_ids])
            for r in model_input.itertuples(index=False)
        ]
        scores = self.ranker.score(reqs)
        ranked = [[int(c) for _, c in sorted(zip(-s, r[2]), key=lambda x: x[0])] for s, r in zip(scores, reqs)]
        props = [softmax_propensities(s, temperature).tolist() for s in scores]
        return pd.DataFrame({"ranked_item_ids": ranked, "propensities": props})


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> RankerModel:
    return RankerModel(data_path)
