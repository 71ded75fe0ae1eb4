"""What every monthly step shares: the typed result base (:class:`StepResult`, ``to_json``), the cached dataset and
splits, the task keys under which a completed step is found again on a retry, and the arms of a config."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, TypeVar

from abpo import registry as core_registry
from abpo.arms import versions as arm_versions
from abpo.arms.names import check_arm

CHAMPION, CHALLENGER = core_registry.CHAMPION, core_registry.CHALLENGER
log = logging.getLogger(__name__)
R = TypeVar("R", bound="StepResult")


class NotEnoughFeedback(RuntimeError):
    """An LLM arm's month has too few logged rows of a stratum to update from: the arm keeps its champion this
    month (the orchestrator records the update as skipped, not failed)."""


def json_safe(d: Any) -> Any:
    if dataclasses.is_dataclass(d) and not isinstance(d, type):
        return json_safe(dataclasses.asdict(d))
    if isinstance(d, dict):
        return {str(k): json_safe(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [json_safe(v) for v in d]
    if isinstance(d, Path):
        return str(d)
    return d


@dataclasses.dataclass
class StepResult:
    """A step's typed result. ``to_json()`` is what an Airflow task returns (XCom) and what MLflow records as the
    task's result; ``from_json`` reads either back."""

    def to_json(self) -> dict[str, Any]:
        return json_safe(self)

    @classmethod
    def from_json(cls: type[R], d: dict[str, Any]) -> R:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def arms_of(cfg) -> list[str]:
    return [check_arm(a) for a in cfg.arms.names]


@functools.lru_cache(maxsize=4)
def _data(data_key: str, cfg_json: str):  # data_key: the hash of cfg_json, the cache key
    from abpo.data.config import DataConfig
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    dcfg = DataConfig(**json.loads(cfg_json))
    ds = load_dataset(dcfg)
    splits, _ = split_users(ds, dcfg)
    return ds, splits


def dataset_and_splits(cfg):
    """(dataset, user splits) of the config's data section, cached per process."""
    js = json.dumps(dataclasses.asdict(cfg.data), sort_keys=True)
    return _data(hashlib.sha256(js.encode()).hexdigest(), js)


def start_run(cfg, run_name: str, tags: dict[str, Any]):
    return core_registry.start_run(cfg, arm_versions.EXPERIMENT, run_name, tags=tags)


def task_key(cfg, *parts: Any) -> str:
    """What a task does and on which inputs, plus the config's hash: the key under which its completed MLflow run
    is found again when the task is retried or its month re-run (abpo.registry.completed_task_run)."""
    return ":".join([*(str(p) for p in parts), arm_versions.config_hash(cfg)])


def reuse(cfg, experiment: str, key: str) -> dict[str, Any] | None:
    """The recorded result of the completed run of task ``key``, or None (unfinished attempts marked KILLED)."""
    prev = core_registry.completed_task_run(cfg, experiment, key)
    if prev is None:
        return None
    log.info(f"  {key.rsplit(':', 1)[0]}: completed before in MLflow run {prev.info.run_id}; its result is reused")
    return core_registry.task_result(prev)
