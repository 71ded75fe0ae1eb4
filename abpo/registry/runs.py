"""A run's record: params, metrics, tags and artifacts logged into the active run (the one :func:`start_run` or
:func:`resume_run` opened), a run found again or ended by id, and the runs of an experiment carrying a tag.

Every MLflow call of abpo outside this package goes through a function of abpo.registry (an import-linter contract
in pyproject.toml forbids ``import mlflow`` elsewhere). The functions that take ``cfg`` point MLflow at its store
first (:func:`abpo.registry.configure`, once per process and store); the others act on a run this process already
opened or found, so on the store it was configured for."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.registry.store import configure, experiment_name, refused_write

if TYPE_CHECKING:
    from abpo.config import Config


# ------------------------------------------------------------------------------------------ the active run
def active_run_id() -> str | None:
    """The id of this process's active MLflow run (opened by :func:`abpo.registry.start_run` or
    :func:`resume_run`), or None when none is open."""
    import mlflow

    run = mlflow.active_run()
    return run.info.run_id if run is not None else None


def log_param(key: str, value: Any) -> None:
    """Log one param into the active run (MLflow refuses to change a logged param to another value)."""
    import mlflow

    mlflow.log_param(key, value)


def log_params(params: Mapping[str, Any]) -> None:
    """Log ``params`` into the active run."""
    import mlflow

    mlflow.log_params(dict(params))


def log_metric(key: str, value: float, step: int | None = None) -> None:
    """Log one metric into the active run, at ``step`` when given."""
    import mlflow

    mlflow.log_metric(key, value, step=step)


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log ``metrics`` into the active run, at ``step`` when given."""
    import mlflow

    mlflow.log_metrics(dict(metrics), step=step)


# MLflow's limit on the metrics of one log_batch call
LOG_BATCH_METRICS = 1000


def log_metric_steps(steps: Sequence[tuple[Mapping[str, float], int, int]]) -> None:
    """Log several steps' metrics into the active run at once: ``steps`` = (metrics, step, timestamp in ms) each,
    in as few store writes as MLflow's batch limit allows (:data:`LOG_BATCH_METRICS` metrics a call). Each value
    keeps its own step and the time it was taken, as a :func:`log_metrics` call per step would record it."""
    import mlflow
    from mlflow.entities import Metric

    run_id = active_run_id()
    if run_id is None:
        raise RuntimeError("log_metric_steps: no active MLflow run")
    rows = [Metric(k, float(v), int(ts), int(step)) for metrics, step, ts in steps for k, v in metrics.items()]
    client = mlflow.MlflowClient()
    for i in range(0, len(rows), LOG_BATCH_METRICS):
        client.log_batch(run_id, metrics=rows[i : i + LOG_BATCH_METRICS])


def set_tag(key: str, value: Any) -> None:
    """Set one tag on the active run."""
    import mlflow

    mlflow.set_tag(key, value)


def set_tags(tags: Mapping[str, Any]) -> None:
    """Set ``tags`` on the active run."""
    import mlflow

    mlflow.set_tags(dict(tags))


def log_artifact(path: str | Path, artifact_path: str | None = None) -> None:
    """Copy the file at ``path`` into the active run's artifacts (under ``artifact_path`` when given)."""
    import mlflow

    mlflow.log_artifact(str(path), artifact_path=artifact_path)


def log_step_metrics(run_id: str, steps: Sequence[Mapping[str, float]], batch: int = 1000) -> None:
    """Log a training history (one mapping of metric -> value per step, step 1 first) into run ``run_id``, ``batch``
    values per call (MLflow's limit per call): one call per step would take minutes for a table of 500-step
    updates. Names with '@' are written with '_at_' (MLflow allows no '@'); non-finite values are left out."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [
        Metric(k.replace("@", "_at_"), float(v), now, i)
        for i, h in enumerate(steps, 1)
        for k, v in h.items()
        if math.isfinite(v)
    ]
    client = MlflowClient()
    for i in range(0, len(metrics), batch):
        client.log_batch(run_id, metrics=metrics[i : i + batch])


# ------------------------------------------------------------------------------------------ runs by id
@contextlib.contextmanager
def resume_run(cfg: Config, run_id: str) -> Iterator[Any]:
    """Make run ``run_id`` (finished or not) the active run again for the block, e.g. to log the model an update
    trained into the update's own run; it ends FINISHED with the block (FAILED when the block raises). A task's run
    whose attempt (this process) was superseded while it ran is not reopened (TaskSuperseded,
    abpo.registry.tasks.require_current_attempt): another attempt owns the task now. A full disk or a damaged store
    is one line naming the file and the rule (abpo.registry.StoreFull, StoreDamaged), the run marked FAILED."""
    import mlflow

    from abpo.registry.tasks import require_current_attempt

    configure(cfg)
    require_current_attempt(run_id)
    try:
        with mlflow.start_run(run_id=run_id) as run:
            yield run
    except Exception as e:  # a full disk or a damaged store: one line naming the file, the run not left RUNNING
        refused = refused_write(e, run_id, cfg.paths.tracking_uri())
        if refused is None or refused is e:
            raise
        raise refused from e


def terminate_run(run_id: str, status: str, tags: Mapping[str, Any] | None = None) -> None:
    """End run ``run_id`` with ``status`` (FINISHED, FAILED, KILLED) after setting ``tags`` on it: through MLflow's
    active-run stack when it is this process's active run, else through the client (a run created with
    :func:`create_run`, or one its own context already ended)."""
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient()
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, str(v))
    active = mlflow.active_run()
    if active is not None and active.info.run_id == run_id:
        mlflow.end_run(status=status)
    else:
        client.set_terminated(run_id, status=status)


def create_run(
    cfg: Config, experiment_id: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, str]
) -> str:
    """Create a run in experiment ``experiment_id`` that is not made active (it stays RUNNING until
    :func:`terminate_run`), with ``tags`` and ``params`` logged in one call; returns its id."""
    from mlflow import MlflowClient
    from mlflow.entities import Param

    configure(cfg)
    client = MlflowClient()
    run = client.create_run(experiment_id, run_name=run_name, tags=dict(tags))
    client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()])
    return run.info.run_id


def get_run(run_id: str):
    """Run ``run_id`` (its info, params, tags and metrics) as MLflow stores it."""
    from mlflow import MlflowClient

    return MlflowClient().get_run(run_id)


def tracking_client(cfg: Config):
    """An MlflowClient on the config's store, for :func:`tagged_runs` and :func:`experiment_id` (a reader with its
    own tracking URI, the UI plugin's pages, uses :func:`reader_client` instead)."""
    from mlflow import MlflowClient

    configure(cfg)
    return MlflowClient()


def reader_client(uri: str):
    """An MlflowClient reading the store at ``uri`` (tracking and registry), without :func:`configure`: it neither
    points this process's MLflow at the store nor creates, checks or records anything in the state. For a reader
    with its own tracking URI, the UI plugin's pages (abpo.monthly.pages), which must not create a store by
    looking at it."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_id(client, name: str) -> str | None:
    """The id of experiment ``name`` (as named in the store, namespace included) read with ``client``, or None
    when it does not exist. Creates nothing."""
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else None


def tagged_runs(client, experiment_id: str, tag: str, value: str) -> list:
    """Every run (any status) of experiment ``experiment_id`` whose tag ``tag`` is ``value``, read with ``client``
    page by page."""
    out: list = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string=f"tags.`{tag}` = '{value}'", max_results=1000, page_token=token
        )
        out.extend(page)
        token = page.token
        if not token:
            return out


def latest_tagged_run_id(cfg: Config, experiment: str, tag: str, value: str) -> str | None:
    """The id of the latest-started run of experiment ``experiment`` (a base name, namespaced here) whose tag
    ``tag`` is ``value``, or None (no such run, or no such experiment: nothing is created)."""
    import mlflow

    configure(cfg)
    exp = mlflow.get_experiment_by_name(experiment_name(cfg, experiment))
    if exp is None:
        return None
    found = mlflow.search_runs(
        experiment_ids=[exp.experiment_id],
        filter_string=f"tags.`{tag}` = '{value}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return found[0].info.run_id if found else None


def download_artifacts(cfg: Config, artifact_uri: str, dst: str | Path) -> Path:
    """Download ``artifact_uri`` (``models:/...``, ``runs:/...``) from the config's store into ``dst``; returns the
    local path. MLflow's own exception when it cannot (no such model or version)."""
    import mlflow

    configure(cfg)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=str(dst)))


def is_mlflow_error(e: BaseException) -> bool:
    """Whether ``e`` is MLflow's own exception (MlflowException: the store or server answered with an error), as
    opposed to a store that could not be opened at all."""
    from mlflow.exceptions import MlflowException

    return isinstance(e, MlflowException)
