"""RankerArm(ranker): the non-LLM arms, ``popularity`` and ``ml_retrain`` (implicit's ALS, the experiment's
ML-retrain row, or SASRec-CE with ``arms.ml_retrain.kind: sasrec``), each a ranker of abpo.baselines configured by
its block in section ``arms`` (SASRec: section ``sasrec``).

Each month they are refitted (from scratch; SASRec-CE warm-started from the champion's weights, :meth:`fit_inputs`)
on everything the platform has seen up to the month (never the month itself): every user's interactions to date (the initial history x_{1:T} and the real interactions of the
simulated months before it) and every click logged by any arm before it (:meth:`RankerArm.refresh`). They expose by
sampling softmax(score / T) over the candidate set (popularity: score = log(1 + count), so exposure ~ count^(1/T)),
so their propensities are informative and exact. A fitted arm is saved as files (:meth:`RankerArm.save`: the
ranker's files and ``arm.json``) and registered in MLflow like the LLM checkpoints (abpo.arms.versions)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from abpo import registry
from abpo.arms.base import Arm
from abpo.arms.names import RANKER, entry
from abpo.baselines import RANKER_FILE, load_ranker, make_ranker, ranker_class, save_ranker, softmax_propensities
from abpo.config.arms import ML_RETRAIN_KINDS

if TYPE_CHECKING:
    from abpo.config import Config

ARM_FILE = "arm.json"
SASREC_SHAPE = ("max_length", "blocks", "heads", "hidden_size")  # a warm start keeps these (abpo.baselines.sasrec)
log = logging.getLogger(__name__)


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
    def ranker_name(cls, name: str, cfg: Config) -> str:
        """The ranker of abpo.baselines.RANKERS the arm refits: its entry's, or for an arm block with a ``kind``
        (``arms.ml_retrain.kind``: als | sasrec) the kind's."""
        kind = arm_settings(name, cfg).get("kind")
        return ML_RETRAIN_KINDS[kind] if kind else entry(name).refreshed_by

    @classmethod
    def make_ranker(cls, name: str, cfg: Config):
        """The arm's unfitted ranker: abpo.baselines.make_ranker with the arm block's parameters (SASRec-CE: config
        section ``sasrec``, its model settings)."""
        ranker = cls.ranker_name(name, cfg)
        if ranker == "sasrec":
            params = {k: v for k, v in dataclasses.asdict(cfg.sasrec).items() if k != "refit_epochs"}
        else:
            params = {k: v for k, v in arm_settings(name, cfg).items() if k not in ("temperature", "kind")}
        return make_ranker(ranker, seed=cfg.seed, **params)

    @classmethod
    def fit_inputs(cls, name: str, cfg: Config, month: str | None, dataset, splits) -> dict[str, Any]:
        """What a refit passes to :meth:`refresh` beside the sequences. SASRec-CE: ``init``, the champion's model
        when it is a SASRec of the same shape (warm start: ``sasrec.refit_epochs`` more epochs on the sequences
        to date), else ``validation``, the validation users' x_{1:T} -> x_{T+1..T+N-1} (pi_init's stage-1 pairs:
        the cold fit early-stops on them, at most ``sasrec.epochs``; in a month the warehouse may already hold
        those next items, so a cold fit there stops later than offline). Other rankers: nothing."""
        if cls.ranker_name(name, cfg) != "sasrec":
            return {}
        from abpo.arms import versions as arm_versions
        from abpo.data.splits import split_of_user

        if month is not None and arm_versions.get_version(cfg, name) is not None:
            previous = arm_versions.load_arm(cfg, name, dataset).ranker
            shape = {k: getattr(cfg.sasrec, k) for k in SASREC_SHAPE}
            if previous.name == "sasrec" and all(previous.params[k] == v for k, v in shape.items()):
                return {"init": previous, "epochs": cfg.sasrec.refit_epochs}
            log.info(f"refit {name}: the champion is not a SASRec of shape {shape}: a cold fit, no warm start")
        frac = cfg.experiment.validation_fraction
        val = {s.user_id: (s.history, s.update) for s in splits if split_of_user(s.user_id, frac) == "validation"}
        return {"validation": val}

    @classmethod
    def refresh(
        cls,
        name: str,
        cfg: Config,
        *,
        sequences: Mapping[int, Sequence[int]],
        item_ids: Sequence[int],
        **fit_inputs: Any,
    ) -> RankerArm:
        """The arm refitted on ``sequences`` (user -> interactions and clicks to date), with ``fit_inputs``
        (:meth:`fit_inputs`: SASRec's warm start or validation users); not yet registered."""
        ranker = cls.make_ranker(name, cfg)
        return cls(name, ranker.fit(sequences, item_ids, **fit_inputs), cls.temperature_of(name, cfg), "")

    def save(self, out_dir: str | Path) -> Path:
        out = save_ranker(self.ranker, out_dir)
        (out / ARM_FILE).write_text(json.dumps({"arm": self.name, "temperature": self.temperature}))
        return out

    @classmethod
    def load(
        cls, name: str, path: str | Path, cfg: Config | None = None, *, dataset=None, model_version: str = ""
    ) -> RankerArm:
        """The arm served from a version's files; abpo.registry.ModelFilesDamaged, one line naming the file, when one
        it needs is missing (:meth:`missing_files`) or its weights are not whole (SASRec's ``sasrec.pt``: the
        integrity check the LLM's safetensors get, abpo.registry.check_weights)."""
        missing = cls.missing_files(path)
        if missing:
            raise registry.ModelFilesDamaged(
                f"{path}: missing {', '.join(missing)}; rule: a ranker arm's version holds {ARM_FILE}, {RANKER_FILE} "
                "and its ranker's own files (what RankerArm.save wrote)"
            )
        registry.check_weights(path)
        temperature = json.loads((Path(path) / ARM_FILE).read_text())["temperature"]
        return cls(name, load_ranker(path), temperature, model_version)

    @classmethod
    def missing_files(cls, path: str | Path) -> list[str]:
        """arm.json, ranker.json and the files of the ranker ranker.json names (its class's ``FILES``: SASRec's
        ``sasrec.pt``, ALS's ``als.npz``), each followed by the ranker it belongs to."""
        d = Path(path)
        missing = [f for f in (ARM_FILE, RANKER_FILE) if not (d / f).is_file()]
        try:
            kind = json.loads((d / RANKER_FILE).read_text())["kind"]
            files = ranker_class(kind).FILES
        except (OSError, ValueError, KeyError, TypeError):
            return missing  # no ranker.json, or one naming no ranker: load_ranker says which
        return missing + [f"{f} (ranker {kind})" for f in files if not (d / f).is_file()]

    @classmethod
    def log_model(cls, cfg: Config, local_dir: str | Path) -> str:

        temperature = json.loads((Path(local_dir) / ARM_FILE).read_text())["temperature"]
        kind = json.loads((Path(local_dir) / RANKER_FILE).read_text())["kind"]
        return registry.log_pyfunc(
            local_dir,
            loader_module="abpo.arms.serving",
            signature=registry.ranker_signature(temperature),
            packages=(*registry.RANKER_SERVING_PACKAGES, *(("torch",) if kind == "sasrec" else ())),
        )
