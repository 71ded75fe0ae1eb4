"""RankerArm(ranker): the non-LLM arms, ``popularity`` and ``ml_retrain`` (implicit's ALS, the experiment's
ML-retrain row), each a ranker of abpo.baselines configured by its block in section ``arms``.

Each month they are refitted from scratch on everything the platform has seen up to the month (never the month
itself): every user's interactions to date (the initial history x_{1:T} and the real interactions of the
simulated months before it) and every click logged by any arm before it (:meth:`RankerArm.refresh`). They expose by
sampling softmax(score / T) over the candidate set (popularity: score = log(1 + count), so exposure ~ count^(1/T)),
so their propensities are informative and exact. A fitted arm is saved as files (:meth:`RankerArm.save`: the
ranker's files and ``arm.json``) and registered in MLflow like the LLM checkpoints (abpo.arms.versions)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from abpo import registry
from abpo.arms.base import Arm
from abpo.arms.names import RANKER, entry
from abpo.baselines import load_ranker, make_ranker, save_ranker, softmax_propensities

if TYPE_CHECKING:
    from abpo.config import Config

ARM_FILE = "arm.json"


def arm_settings(name: str, cfg: Config) -> dict[str, Any]:
    """The arm's config block (``arms.<name>``) as a dict: ``temperature`` and the ranker's parameters."""
    return dataclasses.asdict(getattr(cfg.arms, name))


class RankerArm(Arm):
    kind: ClassVar[str] = RANKER

    def __init__(self, name: str, ranker, temperature: float, model_version: str):
        self.name = name
        self.ranker = ranker
        self.temperature = float(temperature)
        self.model_version = str(model_version)
        self.logging_policy = f"softmax(score/T, T={self.temperature}) {ranker.name}"

    def propensities(self, requests: Sequence) -> list[np.ndarray]:
        return [softmax_propensities(s, self.temperature) for s in self.ranker.score(requests)]

    @classmethod
    def temperature_of(cls, name: str, cfg: Config) -> float:
        return float(arm_settings(name, cfg)["temperature"])

    @classmethod
    def make_ranker(cls, name: str, cfg: Config):
        """The arm's unfitted ranker: abpo.baselines.make_ranker with the arm block's parameters."""
        params = {k: v for k, v in arm_settings(name, cfg).items() if k != "temperature"}
        return make_ranker(entry(name).refreshed_by, seed=cfg.seed, **params)

    @classmethod
    def refresh(
        cls, name: str, cfg: Config, *, sequences: Mapping[int, Sequence[int]], item_ids: Sequence[int]
    ) -> RankerArm:
        """The arm refitted on ``sequences`` (user -> interactions and clicks to date); not yet registered."""
        return cls(name, cls.make_ranker(name, cfg).fit(sequences, item_ids), cls.temperature_of(name, cfg), "")

    def save(self, out_dir: str | Path) -> Path:
        out = save_ranker(self.ranker, out_dir)
        (out / ARM_FILE).write_text(json.dumps({"arm": self.name, "temperature": self.temperature}))
        return out

    @classmethod
    def load(
        cls, name: str, path: str | Path, cfg: Config | None = None, *, dataset=None, model_version: str = ""
    ) -> RankerArm:
        temperature = json.loads((Path(path) / ARM_FILE).read_text())["temperature"]
        return cls(name, load_ranker(path), temperature, model_version)

    @classmethod
    def log_model(cls, cfg: Config, local_dir: str | Path) -> str:

        temperature = json.loads((Path(local_dir) / ARM_FILE).read_text())["temperature"]
        return registry.log_pyfunc(
            local_dir,
            loader_module="abpo.arms.serving",
            signature=registry.ranker_signature(temperature),
            packages=registry.RANKER_SERVING_PACKAGES,
        )
