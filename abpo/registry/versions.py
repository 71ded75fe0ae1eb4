"""Registered versions: registering a logged model, aliases, reading an alias (a registry that cannot answer is
never "no alias"), metrics and JSON kept with a version, and a version's files downloaded."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.registry.errors import RegistryUnavailable
from abpo.registry.store import CHALLENGER, MODEL_NAME, configure, experiment_name

if TYPE_CHECKING:
    from abpo.config import Config

# a logged model's URI (MLflow 3: log_model returns models:/<model id>, the id being m-<hex>)
LOGGED_MODEL_URI = re.compile(r"models:/(m-[0-9a-f]+)")


def logged_model_id(mv) -> str | None:
    """The MLflow 3 LoggedModel behind a registered version (``models:/m-...`` source), or None for an older one."""
    mid = getattr(mv, "model_id", None)
    if mid:
        return mid
    src = str(getattr(mv, "source", "") or "")
    return src.removeprefix("models:/") if src.startswith("models:/m-") else None


def log_model_metrics(
    mv,
    metrics: dict[str, float],
    *,
    run_id: str | None = None,
    dataset_name: str | None = None,
    dataset_digest: str | None = None,
) -> None:
    """Log ``metrics`` on the registered version's LoggedModel (MLflow 3: comparable in the UI's model pages) through
    ``run_id`` (default: the run that logged the version); ``dataset_name`` / ``dataset_digest`` say what they were
    measured on. Keys with '@' are written with '_at_' (MLflow's metric names allow no '@'); NaNs are left out."""
    import math

    from mlflow import MlflowClient

    client = MlflowClient()
    model_id = logged_model_id(mv)
    for k, v in metrics.items():
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            client.log_metric(
                run_id or mv.run_id,
                k.replace("@", "_at_"),
                float(v),
                model_id=model_id,
                dataset_name=dataset_name,
                dataset_digest=dataset_digest,
            )


def model_metrics(mv, *, dataset_name: str | None = None, dataset_digest: str | None = None) -> dict[str, float]:
    """The metrics logged on the version's LoggedModel (the latest value of each), only those measured on
    ``dataset_name`` / ``dataset_digest`` when given; '_at_' read back as '@'."""
    from mlflow import MlflowClient

    model_id = logged_model_id(mv)
    if not model_id:
        return {}
    found = [
        m
        for m in (MlflowClient().get_logged_model(model_id).metrics or [])
        if (dataset_name is None or m.dataset_name == dataset_name)
        and (dataset_digest is None or m.dataset_digest == dataset_digest)
    ]
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
        version = client.create_model_version(
            name, model_uri, run_id=client.get_logged_model(model_id).source_run_id, tags=str_tags, model_id=model_id
        )
    else:
        version = mlflow.register_model(model_uri, name, tags=str_tags)
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    return version


def set_alias(
    alias: str,
    version: int | str,
    name: str = MODEL_NAME,
    *,
    cfg: Config | None = None,
    fence: Callable[[], None] | None = None,
) -> None:
    """Move ``alias`` (e.g. ``champion``) to ``version``; with ``cfg``, on the config's store (:func:`configure`).
    ``fence``: called right before the move, at the last moment anything can be checked (the registry has no
    compare-and-set on aliases); it raises to stop the move (a promotion whose lock was taken over)."""
    from mlflow import MlflowClient

    if cfg is not None:
        configure(cfg)
    client = MlflowClient()
    if fence is not None:
        fence()
    client.set_registered_model_alias(name, alias, str(version))


def is_not_found(e: Exception) -> bool:
    """True when an MlflowException means "no such model / version / alias", as opposed to a registry that could
    not answer."""
    code = getattr(e, "error_code", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in str(e))


def get_version(alias: str, name: str = MODEL_NAME, *, cfg: Config | None = None):
    """The model version an alias points to, or None when the alias (or the model) does not exist. Raises
    RegistryUnavailable when the registry cannot answer, so a down server never reads as "no champion". With
    ``cfg``, on the config's store (:func:`configure`); without, on the store this process was configured for."""
    import mlflow

    uri = configure(cfg) if cfg is not None else mlflow.get_registry_uri()
    return _read_version(uri, name, alias, f"alias {alias!r}", by_alias=True)


def find_version(cfg: Config, name: str, ref: str | int):
    """Version ``ref`` (an alias such as ``champion``, or a version number) of registered model ``name`` on the
    config's store, or None when it (or the model) does not exist; RegistryUnavailable naming the store when the
    registry cannot answer."""
    uri = configure(cfg)
    return _read_version(uri, name, str(ref), repr(str(ref)), by_alias=not str(ref).isdigit())


def _read_version(uri: str, name: str, ref: str, what: str, *, by_alias: bool):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        if by_alias:
            return MlflowClient().get_model_version_by_alias(name, ref)
        return MlflowClient().get_model_version(name, ref)
    except MlflowException as e:
        if is_not_found(e):
            return None
        raise RegistryUnavailable(
            f"MLflow registry {uri}: could not read {what} of model {name!r} "
            f"({getattr(e, 'error_code', '')}: {str(e)[:300]})"
        ) from e
    except Exception as e:  # noqa: BLE001 - the store itself cannot be opened (a corrupt mlflow.db, a bad URI)
        raise RegistryUnavailable(
            f"MLflow registry {uri}: could not read {what} of model {name!r}: the store cannot be opened "
            f"({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})"
        ) from e


def model_version(cfg: Config, name: str, version: str | int):
    """Version ``version`` of registered model ``name`` (MLflow's exception when it does not exist: for a version
    the caller has just registered or read)."""
    from mlflow import MlflowClient

    configure(cfg)
    return MlflowClient().get_model_version(name, str(version))


def run_versions(cfg: Config, name: str, run_id: str) -> list:
    """The versions of registered model ``name`` registered from run ``run_id`` (MLflow's exception when the model
    does not exist yet)."""
    from mlflow import MlflowClient

    configure(cfg)
    return list(MlflowClient().search_model_versions(f"name='{name}' and run_id='{run_id}'"))


def tagged_versions(cfg: Config, name: str, tags: dict[str, str]) -> list:
    """The versions of registered model ``name`` whose tags include every item of ``tags``, newest first; none when
    the model does not exist. RegistryUnavailable naming the store when the registry cannot answer."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = configure(cfg)
    try:
        versions = list(MlflowClient().search_model_versions(f"name='{name}'"))
    except MlflowException as e:
        if is_not_found(e):
            return []
        raise RegistryUnavailable(
            f"MLflow registry {uri}: could not list the versions of model {name!r} "
            f"({getattr(e, 'error_code', '')}: {str(e)[:300]})"
        ) from e
    want = {k: str(v) for k, v in tags.items()}
    found = [mv for mv in versions if all((mv.tags or {}).get(k) == v for k, v in want.items())]
    return sorted(found, key=lambda mv: int(mv.version), reverse=True)


def set_version_tags(cfg: Config, name: str, version: str | int, tags: dict[str, Any]) -> None:
    """Set ``tags`` on version ``version`` of registered model ``name``."""
    from mlflow import MlflowClient

    configure(cfg)
    client = MlflowClient()
    for k, v in tags.items():
        client.set_model_version_tag(name, str(version), k, str(v))


def model_tags(cfg: Config, name: str) -> dict[str, str] | None:
    """The tags of registered model ``name`` (a pin, the champion each month started from), or None when the model
    does not exist. RegistryUnavailable naming the store when the registry answers with another error."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = configure(cfg)
    try:
        return dict(MlflowClient().get_registered_model(name).tags or {})
    except MlflowException as e:
        if is_not_found(e):
            return None
        raise RegistryUnavailable(
            f"MLflow registry {uri}: could not read model {name!r} ({getattr(e, 'error_code', '')}: {str(e)[:300]})"
        ) from e


def set_model_tag(cfg: Config, name: str, key: str, value: str) -> None:
    """Set tag ``key`` of registered model ``name`` to ``value``."""
    from mlflow import MlflowClient

    configure(cfg)
    MlflowClient().set_registered_model_tag(name, key, value)


def delete_model_tag(cfg: Config, name: str, key: str) -> None:
    """Remove tag ``key`` of registered model ``name``."""
    from mlflow import MlflowClient

    configure(cfg)
    MlflowClient().delete_registered_model_tag(name, key)


def orphaned_logged_models(cfg: Config, experiments: str | list[str], model_names: list[str]) -> list[dict[str, str]]:
    """The logged models of ``experiments`` (base names, namespaced here: abpo-arms, where bootstraps and refits log,
    and the updates' experiment, where an update logs its model before registering it) that no version of
    ``model_names`` uses and whose run is over (a killed or failed task logged the model, then never registered it):
    model id, name, run id, run status, creation time and artifact location, oldest first. A run still RUNNING is a
    live task's (or a killed one's not yet marked KILLED by its next attempt): not listed."""
    import mlflow
    from mlflow import MlflowClient

    configure(cfg)
    names = [experiments] if isinstance(experiments, str) else list(dict.fromkeys(experiments))
    found = [mlflow.get_experiment_by_name(experiment_name(cfg, e)) for e in names]
    ids = [exp.experiment_id for exp in found if exp is not None]
    if not ids:
        return []
    client = MlflowClient()
    used: set[str | None] = set()
    for name in model_names:
        try:
            versions = list(client.search_model_versions(f"name='{name}'"))
        except Exception:  # noqa: BLE001 - a model never registered has no versions
            versions = []
        used.update(logged_model_id(mv) for mv in versions)
    out = []
    for lm in client.search_logged_models(experiment_ids=ids):
        if lm.model_id in used:
            continue
        status = ""
        if lm.source_run_id:
            try:
                status = client.get_run(lm.source_run_id).info.status
            except Exception:  # noqa: BLE001 - its run deleted
                status = "DELETED"
        if status == "RUNNING":
            continue
        out.append(
            {
                "model_id": lm.model_id,
                "name": lm.name,
                "run_id": lm.source_run_id or "",
                "run_status": status,
                "created": str(lm.creation_timestamp),
                "artifacts": str(lm.artifact_location),
            }
        )
    return sorted(out, key=lambda d: d["created"])


def download_model_dir(cfg: Config, ref: str, dst: str | Path | None = None, name: str = MODEL_NAME) -> Path:
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
