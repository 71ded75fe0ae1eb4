"""Every version an arm serves is a registered MLflow model version, one registered model per arm
(``abpo-arm-<arm>``), with aliases ``champion`` (what serves) and ``challenger`` (the last candidate).

Why one registered model per arm and not one model with an arm tag: an alias is unique within a registered model,
so four arms each with their own champion need four models; it also gives each arm its own version history in the
MLflow UI and lets a team set permissions per arm.

Lineage tags on every version: ``parent_version`` (the champion it was updated from; empty for a bootstrap),
``months`` (every month it has been trained on, parent's included), ``data_hash`` (sha256 of the rows it was
trained on), ``config`` (preset name) and ``config_hash``, ``seed``, ``code_version`` (abpo version and git commit),
``kind`` (llm | ranker), ``variant``, ``source`` (pi_init | update | refit)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import abpo
from abpo import registry
from abpo.arms import names
from abpo.paths import CHECKOUT

if TYPE_CHECKING:
    from collections.abc import Callable

    from abpo.config import Config

log = logging.getLogger(__name__)

PREFIX = names.MODEL_PREFIX
EXPERIMENT = "abpo-arms"


class NotInRegistry(LookupError):
    """An arm, a version or a champion the caller named does not exist (an unknown arm, a version never registered,
    no champion or no previous champion to roll back to); the message names it."""


def model_name(arm: str, cfg: Config | None = None) -> str:
    """The arm's registered model in ``cfg``'s environment (``paths.namespace``: abpo.arms.names.model_name); without
    ``cfg``, the base name (messages). NotInRegistry naming the known arms for an unknown one."""
    try:
        names.check_arm(arm)
    except ValueError as e:
        raise NotInRegistry(str(e)) from None
    return names.model_name(arm, cfg.paths.namespace if cfg is not None else "")


@functools.lru_cache(maxsize=1)
def code_version() -> str:

    sha = ""
    if CHECKOUT is not None:  # an installed wheel has no commit (and a venv inside some repository is not abpo's)
        try:
            sha = subprocess.run(
                ["git", "rev-parse", "--short=12", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            sha = ""
    return f"abpo {abpo.__version__}" + (f" git {sha}" if sha else "")


def _canonical_path(value: str) -> str:
    """A path setting as one spelling: an absolute path resolved (symlinks, '..', a trailing slash: Path.resolve()),
    a relative one normalised (so the defaults hash as they always did)."""
    p = Path(os.path.expanduser(str(value)))
    return str(p.resolve()) if p.is_absolute() else os.path.normpath(str(value))


ROOT_IN_HASH = "<paths.root>"  # what an absolute paths.root hashes as: where the state is, not what it is


def _relocatable_paths(cfg: Config, paths: dict[str, Any]) -> dict[str, Any]:
    """The section ``paths`` of ``cfg.to_dict()`` as it hashes: independent of where the state directory is, so a
    state copied elsewhere and relocated (`abpo state relocate`) finds its completed tasks under the same keys. An
    absolute ``root`` is :data:`ROOT_IN_HASH`; a path setting under the root is its path relative to it (so
    ``models=<root>/models`` and ``models=models`` are one setting), any other one canonical (:func:`_canonical_path`);
    a SQLite tracking URI of the state's own store is the default (empty) one, and another SQLite file under the root
    is named relative to it. A relative root (the default ``var``) and relative settings hash as they always did."""
    out = dict(paths)
    root_value = str(out.get("root") or "")
    root = Path(_canonical_path(root_value)) if root_value else None
    if root is not None and not root.is_absolute():
        root = cfg.paths.resolve("root").resolve()
    elif root_value:
        out["root"] = ROOT_IN_HASH

    def under_root(value: str) -> str:
        canon = _canonical_path(value)
        if root is not None and Path(canon).is_absolute() and Path(canon).is_relative_to(root):
            return os.path.normpath(str(Path(canon).relative_to(root)))
        return canon

    for k in ("landing", "warehouse", "models", "reports", "mlflow_artifacts"):
        if isinstance(out.get(k), str) and out[k] and not _is_uri(out[k]):
            out[k] = under_root(out[k])
    uri = out.get("mlflow_tracking_uri")
    db = registry.sqlite_path(uri) if isinstance(uri, str) and "?" not in uri else None
    if db is not None and db.is_absolute():
        rel = under_root(str(db))
        if rel == "mlflow.db":  # the state's own store, which an empty setting names too
            out["mlflow_tracking_uri"] = ""
        elif not Path(rel).is_absolute():
            out["mlflow_tracking_uri"] = f"sqlite:///{ROOT_IN_HASH}/{rel}"
    return out


def _is_uri(value: str) -> bool:
    """Whether a path setting is an object-store URI (s3://, gs://, ...): hashed as written."""
    from abpo.data.storage import is_uri

    return is_uri(value)


def config_hash(cfg: Config) -> str:
    """The config's hash (lineage tag ``config_hash`` and every task key, abpo.monthly.common.task_key), with its
    path settings canonical (ABPO_STATE=/x/k1/ and /x/k1 are one state, one hash) and independent of where the
    state directory is (:func:`_relocatable_paths`): a state copied to /y/k1 and relocated hashes as it did at /x/k1,
    so a retried or rerun task of its month finds the run that completed it instead of training again."""
    d = cfg.to_dict()
    if not d["paths"].get("namespace"):  # added later: at its default it leaves the hash of before
        d["paths"].pop("namespace", None)
    d["paths"] = _relocatable_paths(cfg, d["paths"])
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def table_hash(*tables) -> str:
    """sha256 of the training rows (their impression ids and clicks, order-independent)."""
    h = hashlib.sha256()
    for t in tables:
        rows = sorted(zip(t.column("impression_id").to_pylist(), t.column("clicked").to_pylist()))
        h.update(json.dumps(rows).encode())
    return h.hexdigest()[:16]


def lineage_tags(
    cfg: Config,
    *,
    kind: str,
    source: str,
    parent_version: str | None,
    months: list[str],
    data_hash: str,
    variant: str = "",
    **extra: Any,
) -> dict[str, str]:
    tags = {
        "kind": kind,
        "source": source,
        "parent_version": str(parent_version or ""),
        "months": ",".join(months),
        "data_hash": data_hash,
        "config": cfg.name,
        "config_hash": config_hash(cfg),
        "seed": str(cfg.seed),
        "code_version": code_version(),
        "variant": variant,
    }
    tags.update({k: str(v) for k, v in extra.items()})
    return tags


def get_version(cfg: Config, arm: str, ref: str = registry.CHAMPION):
    """The version ``ref`` (an alias or a number) of the arm's model, or None when it does not exist; raises
    abpo.registry.RegistryUnavailable when the registry cannot answer."""
    return registry.find_version(cfg, model_name(arm, cfg), ref)


def registered_versions(cfg: Config) -> dict[str, tuple[str, list[str]]]:
    """What the ingest checks a row's ``model_version`` against (rule unknown_model_version): for each arm abpo
    serves that the warehouse accepts (arms.names and data.known_arms), its registered model and that model's version
    numbers. An arm whose model has no version yet is left out (not checked), and so is every arm while the state's
    SQLite store does not exist yet (or is empty): no registry before the bootstrap, and the store is not created
    here. An arm of data.known_arms that abpo does not serve is never checked: an external logger's rows name versions
    of its own. RegistryUnavailable (abpo.registry) when the registry cannot answer."""
    db = registry.sqlite_path(cfg.paths.tracking_uri())
    if db is not None and (not db.is_file() or db.stat().st_size == 0):
        return {}
    out: dict[str, tuple[str, list[str]]] = {}
    for arm in cfg.arms.names:
        if arm not in names.ARMS or arm not in cfg.data.known_arms:
            continue
        name = model_name(arm, cfg)
        found = registry.tagged_versions(cfg, name, {})
        if found:
            out[arm] = (name, [str(mv.version) for mv in found])
    return out


def log_arm_model(cfg: Config, arm: str, local_dir: str | Path) -> str:
    """Log ``local_dir`` into the active MLflow run as the arm's model (its class's ``log_model``); returns the model
    URI to register."""
    return names.arm_class(arm).log_model(cfg, local_dir)


def orphaned_logged_models(cfg: Config) -> list[dict[str, str]]:
    """The arms' logged models, in abpo-arms and in the updates' experiment (``update.mlflow_experiment``), that no
    registered version uses and whose run is over (a killed or failed update logged the model, then never registered
    it): model id, name, run id, run status and artifact location, oldest first (abpo.registry.orphaned_logged_models). `abpo arms status` lists them; a run still RUNNING is a live task's
    (or a killed one's not yet marked KILLED by its next attempt) and is not listed."""
    experiments = [EXPERIMENT, cfg.update.mlflow_experiment]  # bootstraps and refits log here, updates there
    return registry.orphaned_logged_models(cfg, experiments, [model_name(arm, cfg) for arm in names.ARMS])


def register_version(cfg: Config, arm: str, model_uri: str, run_id: str, tags: dict[str, str], alias: str | None):
    """Register ``model_uri`` (logged by ``run_id``) as a version of the arm's model with ``tags``; a retry of the
    same run reuses the version that run already registered. Sets ``alias`` on it (challenger, or None: the champion
    moves only under the arm's promotion lock, abpo.arms.promotion.register_champion)."""
    if alias == registry.CHAMPION:
        raise ValueError(
            f"register_version({arm!r}, alias={alias!r}); rule: the champion moves only under the arm's promotion "
            "lock: abpo.arms.promotion.register_champion"
        )
    name = model_name(arm, cfg)
    try:
        existing = registry.run_versions(cfg, name, run_id)
    except Exception:  # noqa: BLE001 - a model that does not exist yet has no versions
        existing = []
    mv = existing[0] if existing else registry.register(model_uri, alias=None, tags=tags, name=name)
    if alias:
        registry.set_alias(alias, mv.version, name=name, cfg=cfg)
    return registry.model_version(cfg, name, mv.version)


def set_alias(
    cfg: Config, arm: str, alias: str, version: str | int, *, fence: Callable[[], None] | None = None
) -> None:
    """Move the arm's ``alias`` to ``version``; ``fence`` is called right before the move (abpo.registry.set_alias)."""
    registry.set_alias(alias, version, name=model_name(arm, cfg), cfg=cfg, fence=fence)


def set_tags(cfg: Config, arm: str, version: str | int, tags: dict[str, Any]) -> None:
    registry.set_version_tags(cfg, model_name(arm, cfg), version, tags)


def local_dir(cfg: Config, arm: str, version: str | int) -> Path:
    """The version's checkpoint (or ranker files) as a local directory: downloaded from the registry into
    ``<paths.models>/registry/<model>/v<version>``, with the size and sha256 of every file recorded in its
    ``.complete`` marker. Each use verifies the copy against them (and every weights file against its own header or
    directory, abpo.registry.weights_problem: ``*.safetensors``, SASRec's ``sasrec.pt``); a copy that fails (a
    truncated model.safetensors, a marker of an older abpo without checksums or without a file the arm loads) is
    logged and downloaded again. A download that lacks a file the arm loads (the arm class's ``missing_files``: it is
    never marked complete), that cannot be written (a full disk), or a fresh copy that still fails raises
    abpo.registry.ModelFilesDamaged naming the file."""
    import shutil

    dst = cfg.paths.resolve("models") / "registry" / model_name(arm, cfg) / f"v{version}"
    done = dst / ".complete"
    for attempt in (1, 2):
        if done.exists():
            why = _cache_problem(dst, done, arm)
            if why is None:
                return dst / json.loads(done.read_text())["path"]
            log.warning(
                "%s: the cached copy of %s v%s fails its check (%s); downloading it again",
                dst,
                model_name(arm, cfg),
                version,
                why,
            )
            if attempt == 2:
                raise registry.ModelFilesDamaged(
                    f"{dst}: the copy of {model_name(arm, cfg)} v{version} downloaded again still fails its check "
                    f"({why}); rule: a model is used only when its files match the registry's"
                )
        try:
            if dst.exists():
                shutil.rmtree(dst)
            dst.mkdir(parents=True)
            path = registry.download_model_dir(cfg, str(version), dst=dst, name=model_name(arm, cfg))
            missing = names.arm_class(arm).missing_files(path)
            if missing:  # the registry's own copy lacks them: downloading again cannot help
                raise registry.ModelFilesDamaged(
                    f"{path}: the registry's copy of {model_name(arm, cfg)} v{version} is missing "
                    f"{', '.join(missing)}; rule: a version is used only when every file its arm loads is there "
                    "(register it again from a whole directory); nothing was kept"
                )
            for f in registry.weights_files(dst):
                why = registry.weights_problem(f)
                if why is not None:
                    raise registry.ModelFilesDamaged(
                        f"{f}: {why} in the registry's copy of {model_name(arm, cfg)} v{version}; rule: model "
                        "weights are loaded only when whole (register it again from a whole directory); nothing was "
                        "kept"
                    )
            files = {
                str(f.relative_to(dst)): {"size": f.stat().st_size, "sha256": _sha256(f)}
                for f in sorted(dst.rglob("*"))
                if f.is_file() and f != done
            }
            tmp = dst / ".complete.tmp"
            tmp.write_text(json.dumps({"path": str(path.relative_to(dst)), "files": files}))
            os.replace(tmp, done)
        except Exception as e:
            shutil.rmtree(dst, ignore_errors=True)  # no half-written copy is left to be taken for a whole one
            os_error = registry.os_error_in(e)
            if os_error is None:
                raise
            raise registry.ModelFilesDamaged(
                f"{getattr(os_error, 'filename', None) or dst}: downloading {model_name(arm, cfg)} v{version} failed "
                f"({os_error.strerror or os_error}); rule: {cfg.paths.resolve('models')} must be writable with free "
                "space for the model's files; nothing was kept"
            ) from e
    raise AssertionError("unreachable")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _cache_problem(dst: Path, done: Path, arm: str) -> str | None:
    """Why the cached copy in ``dst`` cannot be used, or None: every file recorded in the ``.complete`` marker with
    its size and sha256, every file the arm loads there (its class's ``missing_files``: an older marker listed what
    the download held), and every weights file whole (``*.safetensors``, ``*.pt``: abpo.registry.weights_problem)."""
    try:
        marker = json.loads(done.read_text())
        files = marker["files"]
        marker["path"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{done}: no checksums recorded (an older or damaged marker)"
    for rel, want in files.items():
        f = dst / rel
        try:
            size = f.stat().st_size
        except OSError:
            return f"{f}: missing"
        if size != want["size"]:
            return f"{f}: {size} bytes, {want['size']} when downloaded"
        if _sha256(f) != want["sha256"]:
            return f"{f}: sha256 differs from the download's"
    missing = names.arm_class(arm).missing_files(dst / marker["path"])
    if missing:  # a marker of an older abpo, written for a download that lacked them
        return f"{dst / marker['path']}: missing {', '.join(missing)}"
    for f in registry.weights_files(dst):
        why = registry.weights_problem(f)
        if why is not None:
            return f"{f}: {why}"
    return None


def load_arm(cfg: Config, arm: str, dataset, ref: str = registry.CHAMPION):
    """The servable arm (abpo.arms.Arm) of the arm's version ``ref`` (default: its champion)."""
    mv = get_version(cfg, arm, ref)
    if mv is None:
        raise LookupError(
            f"MLflow model {model_name(arm, cfg)}: no version {ref!r}; bootstrap the arms first (`abpo arms bootstrap`)"
        )
    return names.arm_class(arm).load(
        arm, local_dir(cfg, arm, mv.version), cfg, dataset=dataset, model_version=str(mv.version)
    )


def version_info(mv) -> dict[str, Any]:
    return {"version": str(mv.version), **dict(mv.tags or {})}
