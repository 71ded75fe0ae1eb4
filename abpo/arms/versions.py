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

import contextlib
import functools
import hashlib
import json
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from abpo import registry
from abpo.arms import names

PREFIX = names.MODEL_PREFIX
EXPERIMENT = "abpo-arms"


class NotInRegistry(LookupError):
    """An arm, a version or a champion the caller named does not exist (an unknown arm, a version never registered,
    no champion or no previous champion to roll back to); the message names it."""


def model_name(arm: str, cfg=None) -> str:
    """The arm's registered model in ``cfg``'s environment (``paths.namespace``: abpo.arms.names.model_name); without
    ``cfg``, the base name (messages). NotInRegistry naming the known arms for an unknown one."""
    try:
        names.check_arm(arm)
    except ValueError as e:
        raise NotInRegistry(str(e)) from None
    return names.model_name(arm, cfg.paths.namespace if cfg is not None else "")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    import abpo
    from abpo.paths import CHECKOUT

    sha = ""
    if CHECKOUT is not None:  # an installed wheel has no commit (and a venv inside some repository is not abpo's)
        try:
            sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=CHECKOUT,
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            sha = ""
    return f"abpo {abpo.__version__}" + (f" git {sha}" if sha else "")


def config_hash(cfg) -> str:
    d = cfg.to_dict()
    if not d["paths"].get("namespace"):  # added later: at its default it leaves the hash of before
        d["paths"].pop("namespace", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def table_hash(*tables) -> str:
    """sha256 of the training rows (their impression ids and clicks, order-independent)."""
    h = hashlib.sha256()
    for t in tables:
        rows = sorted(zip(t.column("impression_id").to_pylist(), t.column("clicked").to_pylist()))
        h.update(json.dumps(rows).encode())
    return h.hexdigest()[:16]


def lineage_tags(cfg, *, kind: str, source: str, parent_version: str | None, months: list[str], data_hash: str,
                 variant: str = "", **extra: Any) -> dict[str, str]:
    tags = {"kind": kind, "source": source, "parent_version": str(parent_version or ""), "months": ",".join(months),
            "data_hash": data_hash, "config": cfg.name, "config_hash": config_hash(cfg), "seed": str(cfg.seed),
            "code_version": code_version(), "variant": variant}
    tags.update({k: str(v) for k, v in extra.items()})
    return tags


def get_version(cfg, arm: str, ref: str = registry.CHAMPION):
    """The version ``ref`` (an alias or a number) of the arm's model, or None when it does not exist; raises
    abpo.registry.RegistryUnavailable when the registry cannot answer."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    name = model_name(arm, cfg)
    uri = registry.configure(cfg)
    try:
        if str(ref).isdigit():
            return MlflowClient().get_model_version(name, str(ref))
        return MlflowClient().get_model_version_by_alias(name, ref)
    except MlflowException as e:
        if registry.is_not_found(e):
            return None
        raise registry.RegistryUnavailable(
            f"MLflow registry {uri}: could not read {ref!r} of model {name!r} "
            f"({getattr(e, 'error_code', '')}: {str(e)[:300]})") from e
    except Exception as e:  # noqa: BLE001 - the store itself cannot be opened (a corrupt mlflow.db, a bad URI)
        raise registry.RegistryUnavailable(
            f"MLflow registry {uri}: could not read {ref!r} of model {name!r}: the store cannot be opened "
            f"({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})") from e


def log_arm_model(cfg, arm: str, local_dir: str | Path) -> str:
    """Log ``local_dir`` into the active MLflow run as the arm's model (its class's ``log_model``); returns the model
    URI to register."""
    return names.arm_class(arm).log_model(cfg, local_dir)


def register_version(cfg, arm: str, model_uri: str, run_id: str, tags: dict[str, str], alias: str | None):
    """Register ``model_uri`` (logged by ``run_id``) as a version of the arm's model with ``tags``; a retry of the
    same run reuses the version that run already registered. Sets ``alias`` on it."""
    from mlflow import MlflowClient

    registry.configure(cfg)
    name = model_name(arm, cfg)
    client = MlflowClient()
    existing = []
    try:
        existing = client.search_model_versions(f"name='{name}' and run_id='{run_id}'")
    except Exception:  # noqa: BLE001 - a model that does not exist yet has no versions
        existing = []
    mv = existing[0] if existing else registry.register(model_uri, alias=None, tags=tags, name=name)
    if alias == registry.CHAMPION:  # the champion only moves under the arm's promotion lock
        with promotion_lock(cfg, arm):
            client.set_registered_model_alias(name, alias, str(mv.version))
    elif alias:
        client.set_registered_model_alias(name, alias, str(mv.version))
    return client.get_model_version(name, str(mv.version))


def set_alias(cfg, arm: str, alias: str, version: str | int) -> None:
    registry.configure(cfg)
    registry.set_alias(alias, version, name=model_name(arm, cfg))


def set_tags(cfg, arm: str, version: str | int, tags: dict[str, Any]) -> None:
    from mlflow import MlflowClient

    registry.configure(cfg)
    client = MlflowClient()
    for k, v in tags.items():
        client.set_model_version_tag(model_name(arm, cfg), str(version), k, str(v))


def local_dir(cfg, arm: str, version: str | int) -> Path:
    """The version's checkpoint (or ranker files) as a local directory: downloaded from the registry once into
    ``<paths.models>/registry/<model>/v<version>`` (versions are immutable, so the copy never goes stale)."""
    dst = cfg.paths.resolve("models") / "registry" / model_name(arm) / f"v{version}"
    done = dst / ".complete"
    if not done.exists():
        import shutil

        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        path = registry.download_model_dir(cfg, str(version), dst=dst, name=model_name(arm, cfg))
        done.write_text(str(path.relative_to(dst)))
    return dst / done.read_text()


def load_arm(cfg, arm: str, dataset, ref: str = registry.CHAMPION):
    """The servable arm (abpo.arms.Arm) of the arm's version ``ref`` (default: its champion)."""
    mv = get_version(cfg, arm, ref)
    if mv is None:
        raise LookupError(f"MLflow model {model_name(arm)}: no version {ref!r}; bootstrap the arms first "
                          "(`abpo arms bootstrap`)")
    return names.arm_class(arm).load(arm, local_dir(cfg, arm, mv.version), cfg, dataset=dataset,
                                     model_version=str(mv.version))


def version_info(mv) -> dict[str, Any]:
    return {"version": str(mv.version), **dict(mv.tags or {})}


class PromotionRace(RuntimeError):
    """The champion moved since the caller looked, or another promotion of the arm holds the lock: the promotion is
    refused, nothing changed."""


class HoldbackNeverPromoted(PromotionRace):
    """A promotion of the holdback arm (abpo.arms.names.HOLDBACK): refused, its champion stays pi_init (a
    PromotionRace, so `abpo arms promote` reports it in one line like any refused promotion)."""


# The promotion lock. MLflow's registry has no compare-and-set: SetRegisteredModelAlias moves an alias
# unconditionally. What it does have is a unique registered-model name: CreateRegisteredModel fails with
# RESOURCE_ALREADY_EXISTS when the name exists (a primary key in the SQL store, SQLite or PostgreSQL, behind the REST
# server too). So the lock of arm A is the registered model "abpo-lock-<A>": whoever creates it holds it, and deletes it
# when done. Every process that moves a champion (the CLI, each Airflow worker, on any machine) talks to the same
# registry, so two workers cannot both hold it: a check-then-set done inside it (re-read the champion, compare with the
# expected one, move the alias) is atomic with respect to every other promotion. A lock older than LOCK_TTL_S (its
# holder crashed: a promotion holds it for well under a second) is taken over.
LOCK_PREFIX = names.LOCK_PREFIX
LOCK_TTL_S = 120.0
LOCK_WAIT_S = 30.0


@contextlib.contextmanager
def promotion_lock(cfg, arm: str, *, wait_s: float | None = None, ttl_s: float | None = None):
    """Hold arm ``arm``'s promotion lock (a registered model ``abpo-lock-<arm>`` in the registry, see above) for the
    block; raises PromotionRace when another holder keeps it longer than ``wait_s``."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    ttl_s = LOCK_TTL_S if ttl_s is None else ttl_s
    name = names.lock_name(model_name(arm) and arm, cfg.paths.namespace)  # an unknown arm: NotInRegistry
    uri = registry.configure(cfg)
    client = MlflowClient()
    token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            client.create_registered_model(name, tags={"owner": token, "acquired_at": f"{time.time():.3f}"},
                                           description=f"promotion lock of arm {arm} (abpo.arms.versions)")
            break
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_ALREADY_EXISTS":  # e.g. SQLite busy under contention
                if time.monotonic() > deadline:
                    raise registry.RegistryUnavailable(
                        f"MLflow registry {uri}: could not take the promotion lock {name!r} "
                        f"({getattr(e, 'error_code', '')}: {str(e)[:300]})") from e
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
        try:
            held = client.get_registered_model(name)
            since = float((held.tags or {}).get("acquired_at", "0") or 0)
            if time.time() - since > ttl_s and (held.tags or {}).get("owner"):
                # a crashed holder: take the lock over (only if it is still the same stale holder)
                if client.get_registered_model(name).tags.get("owner") == held.tags.get("owner"):
                    client.delete_registered_model(name)
                continue
        except MlflowException:
            continue  # released in between: try again at once
        if time.monotonic() > deadline:
            raise PromotionRace(f"{model_name(arm)}: another promotion holds the lock {name!r} (owner "
                                f"{(held.tags or {}).get('owner', '?')}) for more than {wait_s:g} s; nothing promoted "
                                "(retry when it has finished)")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    try:
        yield
    finally:
        try:
            if client.get_registered_model(name).tags.get("owner") == token:
                client.delete_registered_model(name)
        except MlflowException:
            pass  # taken over after the TTL, or already gone


def promote(cfg, arm: str, version: str | int, *, expected_champion: str | int | None = None,
            reason: str = "") -> dict[str, str]:
    """Move the arm's ``champion`` alias to ``version`` and record where it came from on the version
    (``promoted_from``, ``promoted_at``, ``promoted_reason``), which is what :func:`rollback` follows. With
    ``expected_champion`` the promotion is refused (PromotionRace) when the champion is not that version.

    Atomic: the champion is re-read, compared and moved inside the arm's :func:`promotion_lock`, so of several
    concurrent promotions expecting the same champion exactly one moves it and the others are refused. A holdback
    arm (abpo.arms.names.HOLDBACK) is never promoted: its champion stays pi_init (HoldbackNeverPromoted)."""
    if names.entry(arm).kind == names.HOLDBACK:
        raise HoldbackNeverPromoted(f"{model_name(arm)}: arm {arm} is a holdback; rule: its champion stays "
                                    f"pi_init, never promoted (version {version} refused)")
    if get_version(cfg, arm, str(version)) is None:
        raise NotInRegistry(f"{model_name(arm)}: no version {version}; nothing promoted")
    with promotion_lock(cfg, arm):
        return _promote_locked(cfg, arm, version, expected_champion=expected_champion, reason=reason)


def _promote_locked(cfg, arm: str, version: str | int, *, expected_champion: str | int | None,
                    reason: str) -> dict[str, str]:
    from datetime import UTC, datetime

    current = get_version(cfg, arm, registry.CHAMPION)
    cur = str(current.version) if current is not None else ""
    if cur == str(version) and (expected_champion is None or (current.tags or {}).get("promoted_from") == str(
            expected_champion)):  # already done (a retried promote task): nothing to move
        return {"arm": arm, "champion": cur, "previous": str(expected_champion or cur)}
    if expected_champion is not None and cur != str(expected_champion):
        raise PromotionRace(f"{model_name(arm)}: champion is v{cur or 'none'}, not the expected v{expected_champion}; "
                            "nothing promoted (look again and retry)")
    if cur == str(version):
        return {"arm": arm, "champion": cur, "previous": cur}
    set_tags(cfg, arm, version, {"promoted_from": cur, "promoted_at": datetime.now(UTC).isoformat(timespec="seconds"),
                                 "promoted_reason": reason or "promote"})
    set_alias(cfg, arm, registry.CHAMPION, version)
    now = get_version(cfg, arm, registry.CHAMPION)
    if now is None or str(now.version) != str(version):  # only a writer outside the lock can cause this
        raise PromotionRace(f"{model_name(arm)}: champion is v{now.version if now else 'none'} right after moving it "
                            f"to v{version}: something moved it without the promotion lock")
    return {"arm": arm, "champion": str(version), "previous": cur}


def rollback(cfg, arm: str, *, reason: str = "") -> dict[str, str]:
    """Put the arm's previous champion back (the ``promoted_from`` of the current one), recorded as tags
    ``rolled_back_at`` / ``rolled_back_to`` on the version that was champion."""
    from datetime import UTC, datetime

    with promotion_lock(cfg, arm):
        return _rollback_locked(cfg, arm, reason=reason, now=datetime.now(UTC))


def _rollback_locked(cfg, arm: str, *, reason: str, now) -> dict[str, str]:
    current = get_version(cfg, arm, registry.CHAMPION)
    if current is None:
        raise NotInRegistry(f"{model_name(arm)}: no champion to roll back")
    previous = (current.tags or {}).get("promoted_from", "")
    if not previous:
        raise NotInRegistry(f"{model_name(arm)}: champion v{current.version} has no previous champion (tag "
                            "promoted_from is empty): nothing to roll back to")
    set_tags(cfg, arm, current.version, {"rolled_back_at": now.isoformat(timespec="seconds"),
                                         "rolled_back_to": previous, "rolled_back_reason": reason or "rollback"})
    set_alias(cfg, arm, registry.CHAMPION, previous)
    return {"arm": arm, "champion": previous, "previous": str(current.version)}
