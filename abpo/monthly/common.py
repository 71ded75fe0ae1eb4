"""What every monthly step shares: the typed result base (:class:`StepResult`, ``to_json``), the cached dataset and
splits, the task keys under which a completed step is found again on a retry, and the arms of a config."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from abpo import registry
from abpo.arms import versions as arm_versions
from abpo.arms.names import check_arm

if TYPE_CHECKING:
    from abpo.config import Config

CHAMPION, CHALLENGER = registry.CHAMPION, registry.CHALLENGER
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


def arms_of(cfg: Config) -> list[str]:
    return [check_arm(a) for a in cfg.arms.names]


@functools.lru_cache(maxsize=4)
def _data(data_key: str, cfg_json: str):  # data_key: the hash of cfg_json, the cache key
    from abpo.config.data import DataConfig
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    dcfg = DataConfig(**json.loads(cfg_json))
    ds = load_dataset(dcfg)
    splits, _ = split_users(ds, dcfg)
    return ds, splits


def dataset_and_splits(cfg: Config):
    """(dataset, user splits) of the config's data section, cached per process."""
    js = json.dumps(dataclasses.asdict(cfg.data), sort_keys=True)
    return _data(hashlib.sha256(js.encode()).hexdigest(), js)


def start_run(cfg: Config, run_name: str, tags: dict[str, Any]):
    return registry.start_run(cfg, arm_versions.EXPERIMENT, run_name, tags=tags)


def task_key(cfg: Config, *parts: Any) -> str:
    """What a task does and on which inputs, plus the config's hash (its paths canonical:
    abpo.arms.versions.config_hash): the key under which its completed MLflow run is found again when the task is
    retried or its month re-run (abpo.registry.completed_task_run). The inputs are the month's own (the champion the
    month started from, :func:`champion_at_month_start`; the rows; the config), never what the month itself changed."""
    return ":".join([*(str(p) for p in parts), arm_versions.config_hash(cfg)])


MONTH_START_TAG = "abpo.month_start."  # + YYYY-MM: a registered-model tag, the champion version the month started from


def record_month_start(cfg: Config, arm: str, month: str, version: str) -> str:
    """Record, once, that month ``month`` of ``arm`` started from champion ``version`` (the registered model's tag
    abpo.month_start.<month>, written by the month's bootstrap step); a month already recorded keeps its record (a
    rerun or cleared run of the month, after its own promotion moved the champion). Returns the recorded version."""
    name = arm_versions.model_name(arm, cfg)
    kept = (registry.model_tags(cfg, name) or {}).get(MONTH_START_TAG + str(month))
    if kept:
        return kept
    registry.set_model_tag(cfg, name, MONTH_START_TAG + str(month), str(version))
    return str(version)


def champion_at_month_start(cfg: Config, arm: str, month: str):
    """The arm's champion at the start of ``month`` (recorded by :func:`record_month_start`), read once: the version
    the month's update trains from and whose number is in its task key, so a rerun of a completed month finds its
    completed update again however its promotion moved the champion. None recorded (a step run outside a month's
    cycle): the current champion. NotInRegistry naming the model when the recorded version no longer exists."""
    name = arm_versions.model_name(arm, cfg)
    try:
        kept = (registry.model_tags(cfg, name) or {}).get(MONTH_START_TAG + str(month))
    except registry.RegistryUnavailable:
        kept = None
    if not kept:
        return arm_versions.get_version(cfg, arm, CHAMPION)
    mv = arm_versions.get_version(cfg, arm, kept)
    if mv is None:
        raise arm_versions.NotInRegistry(
            f"{name}: month {month} started from champion v{kept} (tag "
            f"{MONTH_START_TAG}{month}), which no longer exists; rule: a month's update "
            "starts from the champion of the month's start"
        )
    return mv


def reuse(cfg: Config, experiment: str, key: str) -> dict[str, Any] | None:
    """The recorded result of the completed run of task ``key``, or None (unfinished attempts marked KILLED)."""
    prev = registry.completed_task_run(cfg, experiment, key)
    if prev is None:
        return None
    log.info(f"  {key.rsplit(':', 1)[0]}: completed before in MLflow run {prev.info.run_id}; its result is reused")
    return registry.task_result(prev)


def completed_step(cfg: Config, *parts: Any, experiment: str = "", result: type[R] | None = None) -> tuple[str, Any]:
    """The idempotent-step check, done before a step does any work: the step's task key (:func:`task_key` of
    ``parts``) and the result recorded by its completed run in ``experiment`` (default abpo-arms), typed as
    ``result`` when given (``result.from_json``), else the recorded dict; None when it never completed. Used by
    bootstrap, update, refit and gate: a retried task or a rerun month finds its completed run instead of redoing it."""
    key = task_key(cfg, *parts)
    done = reuse(cfg, experiment or arm_versions.EXPERIMENT, key)
    if done is not None and result is not None:
        return key, result.from_json(done)
    return key, done


# ------------------------------------------------------------------------------------------------ failures
# Retry or fail now: what a failed step's exception means for the orchestrator (dags/abpo_monthly.py's tasks turn
# "fail" into AirflowFailException through abpo.monthly.airflow_tasks.fail_fast, so Airflow does not retry it).
# Classes are named by their import path, so this table imports nothing (torch-heavy modules included) and a test
# checks that every name resolves. The exception's MRO is walked in order and the first class named here decides: a
# subclass listed as transient (IngestStepFailed) wins over its refused base (IngestError). Anything not named is
# retried, as Airflow would: an unknown error may be transient.
TRANSIENT = (  # retrying can help: someone else holds a lock, a service did not answer, the disk filled up
    "abpo.warehouse.WarehouseBusy",  # another process holds the DuckDB file's write lock
    "abpo.warehouse.IngestStepFailed",  # a step of the ingest failed (disk full, database invalidated)
    "abpo.registry.RegistryUnavailable",  # the MLflow registry did not answer
    "abpo.data.storage.StorageUnavailable",  # the object store did not answer (an endpoint down, a timeout)
    "abpo.arms.promotion_lock.PromotionRace",  # another promotion holds the arm's lock, or the champion just moved
    "abpo.registry.TaskAttemptLive",  # another attempt of the task still runs: a retry after it ended reuses its run
    "abpo.registry.TaskSuperseded",  # this attempt was superseded: a retry reuses the attempt that completed the task
    "builtins.TimeoutError",
    "builtins.ConnectionError",
)
REFUSED = (  # the same inputs fail the same way: a retry only delays the failure (and blocks the next run)
    "abpo.registry.StoreDamaged",  # the SQLite MLflow store is damaged (before RegistryUnavailable, its base)
    "abpo.registry.StoreFull",  # the disk under the MLflow store or its artifacts is full
    "abpo.monthly.serve.NothingLanded",  # nothing landed for the month (and simulate is off)
    "abpo.warehouse.IngestError",  # the landing data cannot be ingested, or its audit refused it (IngestRefused)
    "abpo.warehouse.WarehouseUnreadable",  # the warehouse file is not a database / a setting DuckDB refuses
    "abpo.monthly.report.PreviousMonthIncomplete",  # a refused month: the one before it never finished
    "abpo.errors.ExpectedError",  # any error a user causes or meets (bad input, a step to run first), not transient
    "abpo.monthly.series.SeriesChanged",  # a setting that changes the data split of a series already in the warehouse
    "abpo.monthly.hold.HoldbackMoved",  # the holdback's champion is no longer pi_init: a human must put it back
    "abpo.arms.promotion_lock.HoldbackNeverPromoted",  # the holdback is never promoted (before PromotionRace, its base)
    "abpo.train.runs.UpdateInputMissing",  # pi_init / the bandit log do not exist: a command must make them first
    "abpo.arms.versions.NotInRegistry",  # a version or champion the step needs is not registered
    "abpo.monthly.gate_users.GateUsersMissing",  # the gate's evaluation users are missing
    "abpo.config.errors.ConfigError",  # a bad config or override (a ValueError, below, too)
    "builtins.ValueError",  # bad input: a config that breaks the series, a month, a schema, a data format
    "builtins.LookupError",  # a key / user / item that is not there
    "builtins.TypeError",
)


def _class_path(c: type) -> str:
    return f"{c.__module__}.{c.__qualname__}"


def retry_or_fail(exc: BaseException) -> str:
    """``"fail"`` when a failed step's exception is a refusal (bad input, nothing landed, a refused month, a config
    that breaks the series: :data:`REFUSED`) that a retry cannot fix, ``"retry"`` when it is transient
    (:data:`TRANSIENT`) or unknown. An exception raised while handling another (``raise X from e``) that is itself
    unknown is judged by its cause. A full disk or a damaged MLflow store anywhere in its chain (abpo.registry.
    store_failure: SQLite's words under MLflow's and SQLAlchemy's) is ``"fail"``: the same write fails again."""
    if registry.store_failure(exc) is not None:  # a full disk or a damaged store, however MLflow wrapped it
        return "fail"
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        for c in type(cur).__mro__:
            name = _class_path(c)
            if name in TRANSIENT:
                return "retry"
            if name in REFUSED:
                return "fail"
        cur = cur.__cause__
    return "retry"


# ------------------------------------------------------------------------------------------------ landing
def landing_status(cfg: Config, month: str, marker: str = "") -> tuple[bool, str]:
    """Whether month ``month``'s landing partition (landing/impressions/month=YYYY-MM/) is there and complete, and a
    sentence saying what was found. Complete: it holds files (a name starting with '.' or '_' is a marker, not a
    file) and, when ``marker`` is given (e.g. ``_SUCCESS``, what Spark and most ingestion jobs write last), that
    marker too; an object-store partition always needs the marker the ingest requires ($ABPO_LANDING_MARKER, default
    _SUCCESS: an upload is not atomic). Cheap: lists the directory, reads no Parquet (the ingest checks the files)."""
    from abpo.data import storage
    from abpo.data.schemas import month_dir, month_uri

    landing = cfg.paths.location("landing")
    if storage.is_uri(landing):  # an object store: list the partition's objects (a missing bucket or denied access
        d = month_uri(str(landing), str(month))  # raises StorageError, one line)
        # complete means what the ingest reads: an object store's partition only once its marker is there
        # ($ABPO_LANDING_MARKER), so a scheduled run during an upload skips the month instead of failing it
        marker = marker or storage.landing_marker()
        listed = storage.listdir(d)
        if listed is None:
            return False, f"{d}: no landing partition yet"
        names = [storage.basename(u) for u in listed]
        files = [n for n in names if not n.startswith((".", "_"))]
        if not files:
            return False, f"{d}: the landing partition holds no files yet"
        if marker and marker not in names:
            return False, f"{d}: {len(files)} object(s), but no {marker} marker yet (the ingestion has not finished)"
        return True, f"{d}: {len(files)} object(s)" + (f" and the {marker} marker" if marker else "")
    local = month_dir(landing, str(month))
    if not local.is_dir():
        return False, f"{local}: no landing partition yet"
    paths = [p for p in local.iterdir() if not p.name.startswith((".", "_"))]
    if not paths:
        return False, f"{local}: the landing partition holds no files yet"
    if marker and not (local / marker).exists():
        return False, f"{local}: {len(paths)} file(s), but no {marker} marker yet (the ingestion has not finished)"
    return True, f"{local}: {len(paths)} file(s)" + (f" and the {marker} marker" if marker else "")


# ------------------------------------------------------------------------------------------------ failure hook
def resolve_hook(spec: str):
    """The callable named by ``spec``, ``package.module:attribute`` (ABPO_ON_FAILURE); ValueError naming the spec
    and the rule when it is malformed or does not resolve to a callable."""
    import importlib

    module, sep, attr = spec.partition(":")
    if not sep or not module.strip() or not attr.strip():
        raise ValueError(
            f"ABPO_ON_FAILURE={spec!r}: rule: package.module:attribute (a callable or an Airflow notifier instance)"
        )
    try:
        target: Any = importlib.import_module(module.strip())
        for part in attr.strip().split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"ABPO_ON_FAILURE={spec!r}: cannot be imported ({e})") from e
    if not callable(target):
        raise ValueError(f"ABPO_ON_FAILURE={spec!r}: {type(target).__name__} is not callable")
    return target
