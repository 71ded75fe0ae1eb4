"""MLflow as the single record of models: tracking set-up, runs, and the model registry.

The embedded default is a SQLite tracking store and a local artifact root under ``var/`` (see
``PathsConfig``); any other tracking URI (an MLflow server) works the same. A policy checkpoint (a
``save_pretrained`` directory) is logged as an MLflow pyfunc model whose loader is
:mod:`abpo.serving`, registered under :data:`MODEL_NAME`, and promoted by alias
(``challenger`` on registration, ``champion`` after the gate).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import abpo

MODEL_NAME = "abpo-recommender"
CHALLENGER = "challenger"
CHAMPION = "champion"
log = logging.getLogger(__name__)
_announced: set[str] = set()


def redact_uri(uri: str) -> str:
    """``uri`` with any password replaced by ``***`` (``http://user:secret@host`` -> ``http://user:***@host``)."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^/:@]*):[^/@]*@", r"\1:***@", uri)


def store_line(cfg) -> str:
    """Which MLflow store the config uses and where that came from, e.g. ``MLflow store sqlite:///x.db (from
    $MLFLOW_TRACKING_URI)``: what the commands print and the tasks log."""
    return f"MLflow store {redact_uri(cfg.paths.tracking_uri())} (from {cfg.paths.tracking_uri_source()})"


_initialised: set[str] = set()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def ensure_store(uri: str) -> None:
    """Create (or migrate) a SQLite tracking store's schema under an exclusive lock file beside it
    (``<db>.init.lock``), once per process and store. MLflow creates the schema on a store's first use and that
    migration is not safe against a second process migrating the same new file at the same moment: the loser
    fails on ``table _alembic_tmp_... already exists``, the half-done migration stays behind and the store never
    opens again (seen when an Airflow task and a reader of the store started together). Other stores: nothing to do
    (a server migrates its own)."""
    db = sqlite_path(uri)
    if db is None or uri in _initialised:
        return
    import fcntl

    from mlflow import MlflowClient

    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{db}.init.lock", "a")  # noqa: SIM115 - closed by the with below
    except OSError as e:
        raise RegistryUnavailable(
            f"{db}.init.lock: cannot create the MLflow store's init lock ({e.strerror or e}); rule: the directory of "
            f"the SQLite store ({db.parent}) must be writable (a read-only state cannot be used)") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            client.search_experiments(max_results=1)  # the tracking tables (the whole schema, at its head revision)
            client.search_registered_models(max_results=1)  # the registry's store over the same file
        except Exception as e:  # noqa: BLE001 - a store that cannot be opened (corrupt, unreadable) is reported by
            # the first real use, as RegistryUnavailable naming the store and the operation; not here, not twice
            log.debug(f"MLflow store {redact_uri(uri)} not initialised: {type(e).__name__}: {str(e)[:200]}")
            return
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _initialised.add(uri)


class StateMoved(ValueError):
    """The state's SQLite MLflow store names artifact locations under another state directory: the state was copied
    or restored elsewhere, and using it as it is would write into the old directory."""


def moved_from(cfg) -> str | None:
    """The state directory the config's SQLite MLflow store was made in, when that is not ``paths.root`` (a copied or
    restored state), else None. Read from the experiments abpo created (artifact location
    ``<root>/<paths.mlflow_artifacts>/<experiment>``, :func:`_ensure_experiment`); a store other than the state's
    own ``<root>/mlflow.db``, one that does not exist yet, or has no such experiment: None."""
    import sqlite3
    from urllib.parse import unquote, urlparse

    db = sqlite_path(cfg.paths.tracking_uri())
    art = Path(cfg.paths.mlflow_artifacts)
    root = cfg.paths.resolve("root")
    if (db is None or db != root / "mlflow.db" or not db.is_file() or art.is_absolute()
            or not isinstance(cfg.paths.location("mlflow_artifacts"), Path)):  # an object store is not under a state
        return None  # only the state's own store (paths.mlflow_tracking_uri unset): a shared store has other states'
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            rows = con.execute("SELECT name, artifact_location FROM experiments").fetchall()
    except sqlite3.Error:
        return None  # not a store (yet): MLflow reports it on first use
    for name, location in rows:
        if not location or not location.startswith("file://"):
            continue
        path = Path(unquote(urlparse(location).path))
        if path.name != name or not path.parent.as_posix().endswith("/" + art.as_posix()):
            continue
        old = Path(path.parent.as_posix()[: -len(art.as_posix()) - 1])
        if old != root and not (old.exists() and old.resolve() == root.resolve()):  # not another spelling of root
            return str(old)
    return None


_checked_moved: set[str] = set()


def configure(cfg) -> str:
    """Point MLflow at the config's tracking store (creating the local SQLite store and artifact root). The first time
    a process uses a store, one log line says which one and where it came from (:func:`store_line`).

    ``mlflow.set_tracking_uri`` also writes MLFLOW_TRACKING_URI (and set_registry_uri MLFLOW_REGISTRY_URI) into this
    process's environment; both are put back to what the user exported, so a subprocess started later (with another
    state directory, say) never mistakes this process's choice for the user's."""
    import mlflow

    uri = cfg.paths.tracking_uri()
    if uri.startswith("sqlite:///") and uri not in _checked_moved:  # once per process and store
        old = moved_from(cfg)
        if old is not None:
            raise StateMoved(f"{sqlite_path(uri)}: the MLflow store's artifact locations are under {old}, not under "
                             f"paths.root = {cfg.paths.resolve('root')}; rule: a moved state is relocated before use "
                             f"(`abpo state relocate --from {old}`, docs/operations.md \"Moving a state\"), else its "
                             "runs would write into the old directory")
        _checked_moved.add(uri)
    if uri.startswith("sqlite:///"):
        cfg.paths.resolve("root").mkdir(parents=True, exist_ok=True)
        artifacts = cfg.paths.location("mlflow_artifacts")
        if isinstance(artifacts, Path):
            artifacts.mkdir(parents=True, exist_ok=True)
        else:  # an object store (s3://bucket/prefix): MLflow writes through boto3 with the environment's credentials
            from abpo.data import storage

            storage.apply_connection()  # $ABPO_STORAGE_CONNECTION's credentials, when it names one
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    ensure_store(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    for var, user in (("MLFLOW_TRACKING_URI", abpo.USER_MLFLOW_TRACKING_URI),
                      ("MLFLOW_REGISTRY_URI", abpo.USER_MLFLOW_REGISTRY_URI)):
        if user:
            os.environ[var] = user
        else:
            os.environ.pop(var, None)
    if uri not in _announced:
        _announced.add(uri)
        log.info(store_line(cfg))
    return uri


def experiment_name(cfg, experiment: str) -> str:
    """The MLflow experiment of base name ``experiment`` (abpo-arms, update.mlflow_experiment, ...) in the config's
    environment: ``<paths.namespace>-<experiment>``, or ``experiment`` itself without a namespace."""
    from abpo.paths import namespaced

    return namespaced(experiment, cfg.paths.namespace)


def model_name(cfg) -> str:
    """The registered model of pi_init (:data:`MODEL_NAME`) in the config's environment (``paths.namespace``)."""
    from abpo.paths import namespaced

    return namespaced(MODEL_NAME, cfg.paths.namespace)


def _ensure_experiment(cfg, experiment: str) -> str:
    """The id of experiment ``experiment`` (a base name: namespaced here, :func:`experiment_name`), created with an
    artifact root under the state when the store is the default SQLite file."""
    import mlflow

    experiment = experiment_name(cfg, experiment)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is not None:
        return exp.experiment_id
    location = None
    if cfg.paths.tracking_uri().startswith("sqlite:///"):
        artifacts = cfg.paths.location("mlflow_artifacts")
        location = ((artifacts / experiment).as_uri() if isinstance(artifacts, Path)
                    else f"{artifacts.rstrip('/')}/{experiment}")
    return mlflow.create_experiment(experiment, artifact_location=location)


@contextlib.contextmanager
def start_run(
    cfg, experiment: str, run_name: str, tags: dict[str, Any] | None = None, nested: bool = False
) -> Iterator[Any]:
    """Open an MLflow run in ``experiment`` (created with a local artifact root if needed).

    Records the config's name and seed as tags so every run says how it was made.
    """
    import mlflow

    configure(cfg)
    exp_id = _ensure_experiment(cfg, experiment)
    all_tags = {"abpo.config": cfg.name, "abpo.seed": str(cfg.seed)}
    all_tags.update({k: str(v) for k, v in (tags or {}).items()})
    run_id = None
    try:
        with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=all_tags, nested=nested) as run:
            run_id = run.info.run_id
            yield run
    except Exception as e:
        if not store_locked(e):
            raise
        marked = _end_locked_run(run_id)
        first = next((line.strip() for line in str(e).splitlines() if "locked" in line), "database is locked")
        raise RegistryUnavailable(
            f"{redact_uri(cfg.paths.tracking_uri())}: the MLflow store is locked by another writer ({first[:200]}); "
            f"rule: one writer at a time, retry when it has finished; run {run_id or '(not started)'} "
            + ("marked FAILED" if marked else "could not be marked FAILED either: the task's next attempt marks it "
               "KILLED")) from e


def store_locked(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it wraps) is SQLite's "database is locked": another process holds the store's
    write lock longer than the busy timeout."""
    seen = set()
    while e is not None and id(e) not in seen:
        if "database is locked" in str(e):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _end_locked_run(run_id: str | None, attempts: int = 10, pause: float = 1.0) -> bool:
    """Mark ``run_id`` FAILED once the store's lock is free (``attempts`` tries, ``pause`` s apart), so a run that
    failed on a locked store is not left RUNNING; True when marked (MLflow's own end of the run, which failed on the
    same lock, has already taken it off its active-run stack)."""
    import time

    from mlflow import MlflowClient

    if run_id is None:
        return True
    for i in range(attempts):
        try:
            MlflowClient().set_terminated(run_id, status="FAILED")
            return True
        except Exception as e:  # noqa: BLE001 - still locked: wait; anything else: give up (the next attempt cleans up)
            if not store_locked(e) or i == attempts - 1:
                return False
            time.sleep(pause)
    return False


# ------------------------------------------------------------------------------------------- task attempts
# A pipeline task (an arm's update, refit, gate, bootstrap) runs inside an MLflow run tagged with a task key: what it
# does and on which inputs (arm, month, data hash, parent version, config hash). A retried or re-run task with the same
# key finds the run that completed it and reuses its result instead of training or registering again; attempts that
# never completed (a killed process leaves its run RUNNING) are marked KILLED. So a month re-run on the same data
# doubles nothing: one completed run per key, one registered version per completed run.
TASK_KEY_TAG = "abpo.task_key"
TASK_RESULT_ARTIFACT = "task_result.json"
TASK_DONE_TAG = "abpo.task_done"


def completed_task_run(cfg, experiment: str, key: str):
    """The run of ``experiment`` that completed task ``key`` (status FINISHED and its result recorded), or None.
    Every other run with that key (RUNNING after a killed attempt, FAILED, or FINISHED without a result) is marked
    KILLED, so it is never mistaken for a live or completed attempt. (Airflow runs one attempt of a task at a time.)"""
    from mlflow import MlflowClient

    configure(cfg)
    exp_id = _ensure_experiment(cfg, experiment)
    client = MlflowClient()
    runs = client.search_runs([exp_id], filter_string=f"tags.`{TASK_KEY_TAG}` = '{key}'",
                              order_by=["attributes.start_time DESC"])
    done = [r for r in runs if r.info.status == "FINISHED" and r.data.tags.get(TASK_DONE_TAG) == "true"]
    for r in runs:
        if r not in done[:1] and r.info.status != "KILLED":
            client.set_terminated(r.info.run_id, status="KILLED")
            client.set_tag(r.info.run_id, "abpo.superseded", "an attempt of this task that did not complete"
                           if not done else f"duplicate of completed run {done[0].info.run_id}")
    return done[0] if done else None


def task_result(run) -> dict:
    """The result a completed task recorded (:func:`record_task_result`)."""
    import mlflow

    return mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/{TASK_RESULT_ARTIFACT}")


def record_task_result(run_id: str, result: dict) -> None:
    """Record ``result`` (JSON-safe) in the task's run and mark the task completed: the last step of a task, after
    everything it registers exists."""
    from mlflow import MlflowClient

    client = MlflowClient()
    client.log_dict(run_id, result, TASK_RESULT_ARTIFACT)
    client.set_tag(run_id, TASK_DONE_TAG, "true")


# ------------------------------------------------------------------------------------------- self-contained models
# A registered model serves without this checkout: its pyfunc carries abpo's own package as code (``code_paths``:
# MLflow puts it first on sys.path when the model loads) and pins every package its loader imports, at the version
# that logged it; its signature declares the request columns, the response columns and the params (tau for the LLM
# policy, temperature for the rankers), so MLflow passes ``params`` through to ``predict`` (it drops params a model's
# signature does not declare).
LLM_SERVING_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub", "peft", "jinja2",
                        "numpy", "pandas", "mlflow")
RANKER_SERVING_PACKAGES = ("implicit", "scipy", "numpy", "pandas", "mlflow")


def pinned_requirements(packages) -> list[str]:
    """``name==version`` of each installed package (a local version label such as ``+cpu`` dropped: the index has
    no such file). A package that is not installed is an error naming it."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in packages:
        try:
            out.append(f"{name}=={version(name).split('+')[0]}")
        except PackageNotFoundError as e:
            raise RuntimeError(f"model requirements: package {name!r} is not installed; rule: a logged model pins "
                               "every package its loader imports, at the installed version") from e
    return out


@contextlib.contextmanager
def abpo_code() -> Iterator[list[str]]:
    """``code_paths`` for a pyfunc: a clean copy of the installed ``abpo`` package (no caches), removed after."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="abpo-code-") as tmp:
        dst = Path(tmp) / "abpo"
        shutil.copytree(Path(abpo.__file__).parent, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        yield [str(dst)]


def llm_signature(tau: float):
    """The LLM policy's request/response schema, with ``tau`` (the propensities' temperature) as a param."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec(Array("string"), "history_titles"), ColSpec(Array("long"), "candidate_ids"),
                       ColSpec(Array("string"), "candidate_titles"),
                       ColSpec(Array("long"), "history_item_ids", required=False)]),
        outputs=Schema([ColSpec(Array("long"), "ranked_item_ids"), ColSpec(Array("double"), "propensities")]),
        params=ParamSchema([ParamSpec("tau", "double", float(tau))]),
    )


def ranker_signature(temperature: float):
    """A ranker arm's request/response schema, with its exposure ``temperature`` as a param."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec(Array("long"), "history_item_ids"), ColSpec(Array("long"), "candidate_ids")]),
        outputs=Schema([ColSpec(Array("long"), "ranked_item_ids"), ColSpec(Array("double"), "propensities")]),
        params=ParamSchema([ParamSpec("temperature", "double", float(temperature))]),
    )


def log_pyfunc(local_dir: str | Path, *, loader_module: str, signature, packages, name: str = "model",
               model_config: dict | None = None) -> str:
    """Log ``local_dir`` as a self-contained pyfunc model (abpo's code, pinned ``packages``, ``signature``) into the
    active run; returns the model URI to register.

    A log that fails (a full disk while MLflow writes the model, locally or into the artifact store) leaves nothing
    half-written: the logged model it created is deleted with its partial artifacts (:func:`discard_logged_model`),
    and an OSError is raised again as ModelFilesDamaged, one line naming the store and the rule."""
    import mlflow

    before = _last_logged_model_id()
    try:
        with abpo_code() as code_paths:
            info = mlflow.pyfunc.log_model(name=name, loader_module=loader_module, data_path=str(local_dir),
                                           code_paths=code_paths, pip_requirements=pinned_requirements(packages),
                                           signature=signature, model_config=model_config)
    except Exception as e:
        created = _last_logged_model_id()
        kept = discard_logged_model(created) if created is not None and created != before else None
        os_error = os_error_in(e)
        if os_error is None:
            raise
        where = f" at {os_error.filename}" if getattr(os_error, "filename", None) else ""
        raise ModelFilesDamaged(
            f"MLflow store {redact_uri(mlflow.get_tracking_uri())}: logging the model in {local_dir} failed{where} "
            f"({os_error.strerror or os_error}); rule: the artifact store ({_artifact_root()}) and the temporary "
            f"directory ({tempfile.gettempdir()}) must be writable with free space for the model's files; "
            + (kept or "the partial logged model was deleted, nothing was kept")) from e
    return info.model_uri


def _artifact_root() -> str:
    """The artifact location of the active run's experiment (where its models are written), or '?'."""
    import mlflow

    try:
        run = mlflow.active_run()
        return redact_uri(mlflow.get_experiment(run.info.experiment_id).artifact_location) if run else "?"
    except Exception:  # noqa: BLE001 - only a message's detail
        return "?"


def _last_logged_model_id() -> str | None:
    """The id of the last model this process (context) logged (MLflow's ``last_logged_model``), or None."""
    import mlflow

    try:
        lm = mlflow.last_logged_model()
    except Exception:  # noqa: BLE001 - one logged into another store (a test's, an earlier state's): not ours
        return None
    return lm.model_id if lm is not None else None


def discard_logged_model(model_id: str) -> str | None:
    """Delete logged model ``model_id`` whose logging failed: its artifacts (a partial copy, through the store's own
    artifact repository, so an object store too; a local store's emptied ``models/<id>`` folder with them), then its
    record (MlflowClient.delete_logged_model: lifecycle DELETED, listed no more, `mlflow gc` removes the row).
    Returns None when both are gone, else one clause saying what was left."""
    from urllib.parse import unquote, urlparse

    from mlflow import MlflowClient
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    client = MlflowClient()
    location = "?"
    try:
        location = client.get_logged_model(model_id).artifact_location
        get_artifact_repository(location).delete_artifacts()
        if location.startswith("file:") or "://" not in location:
            folder = Path(unquote(urlparse(location).path) if location.startswith("file:") else location)
            for d in (folder, folder.parent):  # .../models/<id>/artifacts and .../models/<id>, when empty
                with contextlib.suppress(OSError):
                    d.rmdir()
        client.delete_logged_model(model_id)
    except Exception as e:  # noqa: BLE001 - the store itself failing too: say what is left, keep the first error
        log.warning("logged model %s (%s) could not be deleted after a failed log: %s", model_id, location, e)
        return (f"the partial logged model {model_id} ({location}) could not be deleted "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}): delete it by hand")
    return None


def os_error_in(e: BaseException) -> OSError | None:
    """The OSError (a full disk, an unwritable directory) in ``e``'s chain of causes, if any; also one that MLflow
    folded into its own exception's message (``[Errno 28] No space left on device: 'path'``)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno is not None:
            return e
        m = re.search(r"\[Errno (\d+)\] ([^:\n\]'\"]+)(?:: '([^'\n]*)')?", str(e))
        if m is not None:
            return OSError(int(m.group(1)), m.group(2).strip(), m.group(3) or None)
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def log_model_dir(local_dir: str | Path, name: str = "model", policy_cfg=None) -> str:
    """Log a ``save_pretrained`` directory (model + tokenizer, or a LoRA adapter) as an MLflow pyfunc
    model served by :mod:`abpo.serving`; returns the model URI to register. ``policy_cfg`` (the `policy`
    section it was trained with: prompt budget, tau) is stored as the model's ``model_config`` so serving
    builds the same prompts and propensities; its tau is the signature's default."""
    import dataclasses

    local_dir = Path(local_dir)
    if not (local_dir / "config.json").exists() and not (local_dir / "adapter_config.json").exists():
        raise FileNotFoundError(f"{local_dir}: not a save_pretrained directory (no config.json / adapter_config.json)")
    tau = float(getattr(policy_cfg, "tau", 1.0)) if policy_cfg is not None else 1.0
    return log_pyfunc(local_dir, loader_module="abpo.serving", signature=llm_signature(tau),
                      packages=LLM_SERVING_PACKAGES, name=name,
                      model_config=dataclasses.asdict(policy_cfg) if policy_cfg is not None else None)


def logged_model_id(mv) -> str | None:
    """The MLflow 3 LoggedModel behind a registered version (``models:/m-...`` source), or None for an older one."""
    mid = getattr(mv, "model_id", None)
    if mid:
        return mid
    src = str(getattr(mv, "source", "") or "")
    return src.removeprefix("models:/") if src.startswith("models:/m-") else None


def log_model_metrics(mv, metrics: dict[str, float], *, run_id: str | None = None, dataset_name: str | None = None,
                      dataset_digest: str | None = None) -> None:
    """Log ``metrics`` on the registered version's LoggedModel (MLflow 3: comparable in the UI's model pages) through
    ``run_id`` (default: the run that logged the version); ``dataset_name`` / ``dataset_digest`` say what they were
    measured on. Keys with '@' are written with '_at_' (MLflow's metric names allow no '@'); NaNs are left out."""
    import math

    from mlflow import MlflowClient

    client = MlflowClient()
    model_id = logged_model_id(mv)
    for k, v in metrics.items():
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            client.log_metric(run_id or mv.run_id, k.replace("@", "_at_"), float(v), model_id=model_id,
                              dataset_name=dataset_name, dataset_digest=dataset_digest)


def model_metrics(mv, *, dataset_name: str | None = None, dataset_digest: str | None = None) -> dict[str, float]:
    """The metrics logged on the version's LoggedModel (the latest value of each), only those measured on
    ``dataset_name`` / ``dataset_digest`` when given; '_at_' read back as '@'."""
    from mlflow import MlflowClient

    model_id = logged_model_id(mv)
    if not model_id:
        return {}
    found = [m for m in (MlflowClient().get_logged_model(model_id).metrics or [])
             if (dataset_name is None or m.dataset_name == dataset_name)
             and (dataset_digest is None or m.dataset_digest == dataset_digest)]
    return {m.key.replace("_at_", "@"): float(m.value) for m in sorted(found, key=lambda m: (m.timestamp, m.step))}


def log_version_dict(mv, d: dict, artifact_file: str) -> None:
    """Keep ``d`` (JSON-safe) as artifact ``artifact_file`` of the run that logged the registered version ``mv``
    (read back by :func:`version_dict`)."""
    from mlflow import MlflowClient

    MlflowClient().log_dict(mv.run_id, d, artifact_file)


def version_dict(mv, artifact_file: str) -> dict | None:
    """The JSON artifact ``artifact_file`` of the run that logged the registered version ``mv``
    (:func:`log_version_dict`), or None when that run has no such artifact."""
    import posixpath

    import mlflow
    from mlflow import MlflowClient

    folder = posixpath.dirname(artifact_file) or None
    if artifact_file not in {a.path for a in MlflowClient().list_artifacts(mv.run_id, folder)}:
        return None
    return mlflow.artifacts.load_dict(f"runs:/{mv.run_id}/{artifact_file}")


TRAINING_COLUMNS = ("month", "impression_id", "user_id", "item_id", "arm", "model_version", "propensity", "clicked")


def log_training_months(rows, *, name_prefix: str, source: str | Path) -> list[tuple[str, str]]:
    """Log the logged rows an update trained on (an Arrow table with a ``month`` column) into the active run as one
    MLflow dataset input per month (context ``training``): name ``<name_prefix>-<month>``, digest the sha256 of that
    month's (impression_id, clicked) pairs, source the warehouse, schema and row count from the rows' scalar columns.
    Returns [(name, digest)]."""
    import hashlib
    import json

    import pyarrow.compute as pc

    out = []
    for month in sorted(set(rows.column("month").to_pylist())):
        part = rows.filter(pc.equal(rows.column("month"), month))
        pairs = sorted(zip(part.column("impression_id").to_pylist(), part.column("clicked").to_pylist()))
        digest = hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]
        df = part.select([c for c in TRAINING_COLUMNS if c in part.column_names]).to_pandas()
        name = f"{name_prefix}-{month}"
        log_dataset_input(df, name=name, digest=digest, source=source, tags={"month": str(month)})
        out.append((name, digest))
    return out


def log_dataset_input(df, *, name: str, digest: str, source: str | Path, tags: dict[str, str] | None = None) -> None:
    """Log ``df`` (pandas) into the active run as the training dataset ``name`` with ``digest`` (MLflow
    ``log_input``, context ``training``; MLflow keeps its schema and row count, not the rows)."""
    import mlflow

    ds = mlflow.data.from_pandas(df, source=str(source), name=name, digest=digest)
    mlflow.log_input(ds, context="training", tags=tags)


def register(
    model_uri: str, alias: str | None = CHALLENGER, tags: dict[str, Any] | None = None, name: str = MODEL_NAME
):
    """Register ``model_uri`` as a new version of ``name``; set ``alias`` on it and lineage ``tags``.

    A logged model's URI (``models:/m-<id>``, what abpo's log_model calls return) is registered through the client
    API, as ``mlflow.register_model`` does it for such a URI (the source is the URI, the version linked to the logged
    model) but without its two progress lines ("Registered model ... already exists. Creating a new version ...",
    "Created version ..."): MLflow prints those on stderr, which an Airflow task logs at ERROR level
    (docs/operations.md "Logs"); the callers log the registration themselves. Any other URI goes through
    ``mlflow.register_model``, which resolves it."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    str_tags = {k: str(v) for k, v in (tags or {}).items()}
    logged = LOGGED_MODEL_URI.fullmatch(model_uri)
    if logged:
        try:
            client.create_registered_model(name)
        except MlflowException as e:
            if e.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
                raise
        model_id = logged.group(1)
        version = client.create_model_version(name, model_uri, run_id=client.get_logged_model(model_id).source_run_id,
                                              tags=str_tags, model_id=model_id)
    else:
        version = mlflow.register_model(model_uri, name, tags=str_tags)
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    return version


# a logged model's URI (MLflow 3: log_model returns models:/<model id>, the id being m-<hex>)
LOGGED_MODEL_URI = re.compile(r"models:/(m-[0-9a-f]+)")


def set_alias(alias: str, version: int | str, name: str = MODEL_NAME) -> None:
    """Move ``alias`` (e.g. ``champion``) to ``version``."""
    from mlflow import MlflowClient

    MlflowClient().set_registered_model_alias(name, alias, str(version))


class RegistryUnavailable(RuntimeError):
    """The MLflow registry could not answer (server down, network, database error): never read as "no alias"."""


class ModelFilesDamaged(RuntimeError):
    """A model directory's weights are not whole (a truncated or corrupt ``*.safetensors``, a file that does not
    match the checksum recorded when it was downloaded), or it could not be written (a full disk): the message names
    the file and the rule. An expected error (`abpo` prints one line)."""


def safetensors_problem(path: str | Path) -> str | None:
    """Why the file at ``path`` is not a whole safetensors file, or None when it is. The format: an 8-byte little-endian
    header length N, N bytes of JSON naming each tensor's ``data_offsets`` [begin, end) in the data that follows; a
    whole file is exactly 8 + N + the largest end long (a truncated copy is shorter, an appended one longer)."""
    import json
    import struct

    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, shorter than the 8-byte header length"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"header of {n} bytes but the file holds {size} bytes"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"unreadable header ({type(e).__name__}: {str(e)[:120]})"
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and "data_offsets" in v]
    want = 8 + n + max(ends, default=0)
    if size != want:
        return f"{size} bytes where its header needs {want} (truncated or damaged)"
    return None


def check_weights(directory: str | Path) -> None:
    """ModelFilesDamaged naming the first ``*.safetensors`` under ``directory`` that is not whole
    (:func:`safetensors_problem`)."""
    for f in sorted(Path(directory).rglob("*.safetensors")):
        why = safetensors_problem(f)
        if why is not None:
            raise ModelFilesDamaged(f"{f}: not a whole safetensors file ({why}); rule: model weights are loaded only "
                                    "when whole")


def is_not_found(e: Exception) -> bool:
    """True when an MlflowException means "no such model / version / alias", as opposed to a registry that could
    not answer."""
    code = getattr(e, "error_code", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in str(e))


def get_version(alias: str, name: str = MODEL_NAME):
    """The model version an alias points to, or None when the alias (or the model) does not exist. Raises
    RegistryUnavailable when the registry cannot answer, so a down server never reads as "no champion"."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return MlflowClient().get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if is_not_found(e):
            return None
        raise RegistryUnavailable(
            f"MLflow registry {mlflow.get_registry_uri()}: could not read alias {alias!r} of model {name!r} "
            f"({getattr(e, 'error_code', '')}: {str(e)[:300]})") from e
    except Exception as e:  # noqa: BLE001 - the store itself cannot be opened (a corrupt mlflow.db, a bad URI)
        raise RegistryUnavailable(
            f"MLflow registry {mlflow.get_registry_uri()}: could not read alias {alias!r} of model {name!r}: the store "
            f"cannot be opened ({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})") from e


def download_model_dir(cfg, ref: str, dst: str | Path | None = None, name: str = MODEL_NAME) -> Path:
    """Local path of the checkpoint directory of a registered version: ``ref`` is an alias
    (``champion``) or a version number. Returns the ``save_pretrained`` directory inside the pyfunc model."""
    import mlflow

    configure(cfg)
    uri = f"models:/{name}/{ref}" if str(ref).isdigit() else f"models:/{name}@{ref}"
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst) if dst else None))
    data = local / "data"
    candidates = [p for p in data.iterdir()] if data.is_dir() else []
    for p in candidates:
        if any((p / f).exists() for f in ("config.json", "adapter_config.json", "ranker.json")):
            return p
    raise FileNotFoundError(f"{uri}: downloaded to {local} but no save_pretrained directory under data/")
