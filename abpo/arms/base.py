"""The arm interface: what serves each user group, refreshed every month.

An arm is a servable model version that gives, for a request (the user's history, a candidate set C), an exposure
distribution over C with every candidate's probability > 0 (:meth:`Arm.propensities`). :meth:`Arm.expose` samples
the exposed item from it and returns it with its exact propensity, the arm's ``logging_policy`` and the registered
``model_version``: the columns of an impression row (abpo.data.schemas).

Each arm class also knows its own model's life cycle, the parts the monthly steps (abpo.monthly) call without
asking which arm it is: :meth:`Arm.refresh` (what a month does to the model: an LLM update, a ranker refit),
:meth:`Arm.save` / :meth:`Arm.load` (its files; :meth:`Arm.missing_files`, those a version cannot be loaded without), :meth:`Arm.log_model` (into an MLflow run, to be registered) and
:meth:`Arm.temperature_of` (the exposure temperature its config gives)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

if TYPE_CHECKING:
    from abpo.config import Config

Request = tuple[int, Sequence[int], Sequence[int]]  # (user id, history oldest first, candidate ids)


@dataclass(frozen=True)
class Exposure:
    item_id: int
    propensity: float  # P(item_id | request) under the arm's exposure distribution, exact over C, > 0
    logging_policy: str
    model_version: str


class Servable(Protocol):
    """What :func:`expose` needs of an arm."""

    name: str
    model_version: str  # the registered version that serves (abpo.arms.versions)
    logging_policy: str  # how propensities are made, e.g. "softmax(tau=1.0)"

    def propensities(self, requests: Sequence[Request]) -> list[np.ndarray]: ...


class Arm(ABC):
    """One arm's servable version. Subclasses: :class:`abpo.arms.llm.LLMArm` (variant) and
    :class:`abpo.arms.rankers.RankerArm` (ranker); which arm name uses which class: abpo.arms.names."""

    kind: ClassVar[str]  # abpo.arms.names.LLM | RANKER: which monthly steps refresh it
    name: str
    model_version: str
    logging_policy: str
    temperature: float

    @abstractmethod
    def propensities(self, requests: Sequence[Request]) -> list[np.ndarray]:
        """One probability vector per request, aligned with its candidates, summing to 1, all > 0."""

    def expose(self, requests: Sequence[Request], uniforms: Sequence[float]) -> list[Exposure]:
        return expose(self, requests, uniforms)

    @classmethod
    @abstractmethod
    def temperature_of(cls, name: str, cfg: Config) -> float:
        """The exposure temperature of arm ``name`` under ``cfg``."""

    @classmethod
    @abstractmethod
    def refresh(cls, name: str, cfg: Config, **inputs: Any) -> Any:
        """What a month does to the arm's model, from the inputs the monthly step gathered."""

    @classmethod
    @abstractmethod
    def load(cls, name: str, path: str | Path, cfg: Config, *, dataset, model_version: str) -> Arm:
        """The arm served from the files in ``path`` (a registered version's local copy)."""

    @classmethod
    @abstractmethod
    def log_model(cls, cfg: Config, local_dir: str | Path) -> str:
        """Log ``local_dir`` into the active MLflow run as the arm's model; returns the model URI to register."""

    @classmethod
    @abstractmethod
    def missing_files(cls, path: str | Path) -> list[str]:
        """The files :meth:`load` needs that the version directory ``path`` lacks ([] when none): a downloaded
        version is complete only with every one of them (abpo.arms.versions.local_dir)."""


def sample_index(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from ``p`` with the uniform ``u`` in [0, 1): index j with P(j) = p[j]. Pre-drawn uniforms
    make a month's exposures independent of the order arms are served in."""
    c = np.cumsum(np.asarray(p, dtype=np.float64))
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(c) - 1))


def expose(arm: Servable, requests: Sequence[Request], uniforms: Sequence[float]) -> list[Exposure]:
    """Sample the exposed item of every request from ``arm``'s distribution (one pre-drawn uniform per request)."""
    if len(uniforms) != len(requests):
        raise ValueError(f"expose({arm.name}): {len(uniforms)} uniforms for {len(requests)} requests")
    out = []
    for (user, _, cands), p, u in zip(requests, arm.propensities(requests), uniforms, strict=True):
        if len(p) != len(cands) or not np.all(p > 0) or abs(float(np.sum(p)) - 1.0) > 1e-6:
            raise ValueError(
                f"arm {arm.name} (version {arm.model_version}), user {user}: exposure distribution "
                f"breaks the rule 'one probability > 0 per candidate, summing to 1'"
            )
        j = sample_index(p, u)
        out.append(Exposure(int(cands[j]), float(p[j]), arm.logging_policy, str(arm.model_version)))
    return out
