"""Logging models: a checkpoint or a ranker's files as a self-contained MLflow pyfunc, and the data it trained on.

A registered model serves without this checkout: its pyfunc carries abpo's own package as code (``code_paths``:
MLflow puts it first on sys.path when the model loads) and pins every package its loader imports, at the version
that logged it; its signature declares the request columns, the response columns and the params (tau for the LLM
policy, temperature for the rankers), so MLflow passes ``params`` through to ``predict`` (it drops params a model's
signature does not declare)."""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import abpo
from abpo.registry.errors import ModelFilesDamaged
from abpo.registry.store import redact_uri

log = logging.getLogger("abpo.registry")

LLM_SERVING_PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "peft",
    "jinja2",
    "numpy",
    "pandas",
    "mlflow",
)
RANKER_SERVING_PACKAGES = ("implicit", "scipy", "numpy", "pandas", "mlflow")


# MLflow's hints that say nothing about abpo's models, silenced where abpo logs one (they printed in every demo task
# that logs a model or its data): an input example (abpo gives the signature; an example would run
# the model at log time), integer columns that cannot hold a missing value (the log contract refuses nulls), a local
# dataset source that two of MLflow's own source classes claim
MLFLOW_HINTS = (
    r"(\x1b\[[0-9;]*m)?An input example was not provided",
    r"Hint: Inferred schema contains integer column",
    r"The specified dataset source can be interpreted in multiple ways",
)


@contextlib.contextmanager
def without_mlflow_hints() -> Iterator[None]:
    """The block with :data:`MLFLOW_HINTS` not shown (every other warning is)."""
    with warnings.catch_warnings():
        for message in MLFLOW_HINTS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        yield


SLIM_DISTRIBUTIONS = {"mlflow": "mlflow-skinny"}  # a distribution -> the smaller one that provides the same module


def pinned_requirements(packages) -> list[str]:
    """``name==version`` of each installed package (a local version label such as ``+cpu`` dropped: the index has
    no such file). A package that is not installed is an error naming it."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in packages:
        try:
            out.append(f"{name}=={version(name).split('+')[0]}")
        except PackageNotFoundError as e:
            # the module `mlflow` ships in both distributions: where only mlflow-skinny is installed (a worker
            # without the server and UI: scripts/gpu-check.sh's GPU machine), it is what the loader imports
            alt = SLIM_DISTRIBUTIONS.get(name)
            with contextlib.suppress(PackageNotFoundError):
                if alt is not None:
                    out.append(f"{alt}=={version(alt).split('+')[0]}")
                    continue
            raise RuntimeError(
                f"model requirements: package {name!r} is not installed; rule: a logged model pins "
                "every package its loader imports, at the installed version"
            ) from e
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
        inputs=Schema(
            [
                ColSpec(Array("string"), "history_titles"),
                ColSpec(Array("long"), "candidate_ids"),
                ColSpec(Array("string"), "candidate_titles"),
                ColSpec(Array("long"), "history_item_ids", required=False),
            ]
        ),
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


def log_pyfunc(
    local_dir: str | Path,
    *,
    loader_module: str,
    signature,
    packages,
    name: str = "model",
    model_config: dict | None = None,
) -> str:
    """Log ``local_dir`` as a self-contained pyfunc model (abpo's code, pinned ``packages``, ``signature``) into the
    active run; returns the model URI to register.

    A log that fails (a full disk while MLflow writes the model, locally or into the artifact store) leaves nothing
    half-written: the logged model it created is deleted with its partial artifacts (:func:`discard_logged_model`),
    and an OSError is raised again as ModelFilesDamaged, one line naming the store and the rule."""
    import mlflow

    before = _last_logged_model_id()
    try:
        with abpo_code() as code_paths, without_mlflow_hints():
            info = mlflow.pyfunc.log_model(
                name=name,
                loader_module=loader_module,
                data_path=str(local_dir),
                code_paths=code_paths,
                pip_requirements=pinned_requirements(packages),
                signature=signature,
                model_config=model_config,
            )
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
            + (kept or "the partial logged model was deleted, nothing was kept")
        ) from e
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
        return (
            f"the partial logged model {model_id} ({location}) could not be deleted "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}): delete it by hand"
        )
    return None


def os_error_in(e: BaseException) -> OSError | None:
    """The OSError (a full disk, an unwritable directory) in ``e``'s chain of causes, if any; also one that MLflow
    folded into its own exception's message (``[Errno 28] No space left on device: 'path'``, or ``'src' -> 'dst'``
    for a copy, whose failed write is the destination's: MLflow's download collects per-file failures that way)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError) and cur.errno is not None:
            return cur
        m = re.search(r"\[Errno (\d+)\] ([^:\n\]'\"]+)(?:: '([^'\n]*)'(?: -> '([^'\n]*)')?)?", str(cur))
        if m is not None:
            return OSError(int(m.group(1)), m.group(2).strip(), m.group(4) or m.group(3) or None)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
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
    return log_pyfunc(
        local_dir,
        loader_module="abpo.serving",
        signature=llm_signature(tau),
        packages=LLM_SERVING_PACKAGES,
        name=name,
        model_config=dataclasses.asdict(policy_cfg) if policy_cfg is not None else None,
    )


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

    with without_mlflow_hints():
        ds = mlflow.data.from_pandas(df, source=str(source), name=name, digest=digest)
        mlflow.log_input(ds, context="training", tags=tags)
