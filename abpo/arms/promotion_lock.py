"""The promotion lock of an arm (a registered model per arm, see below) and the refusals a promotion raises: whoever
holds the lock may move the arm's champion (abpo.arms.promotion)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

from abpo import registry
from abpo.arms import names
from abpo.arms.versions import model_name

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger("abpo.arms.promotion")


class PromotionRace(RuntimeError):
    """The champion moved since the caller looked, or another promotion of the arm holds the lock: the promotion is
    refused, nothing changed."""


class ChampionMoved(PromotionRace):
    """The champion is no longer the one the month started from (a rollback, a promotion or a hand move since the
    update read it): the month's promotion is refused with a message, nothing changed (not retried: the month's
    challenger was gated against a champion that no longer serves)."""


class HoldbackNeverPromoted(PromotionRace):
    """A promotion of the holdback arm (abpo.arms.names.HOLDBACK): refused, its champion stays pi_init (a
    PromotionRace, so `abpo arms promote` reports it in one line like any refused promotion)."""


# The promotion lock. MLflow's registry has no compare-and-set: SetRegisteredModelAlias moves an alias
# unconditionally. What it does have is a unique registered-model name: CreateRegisteredModel fails with
# RESOURCE_ALREADY_EXISTS when the name exists (a primary key in the SQL store, SQLite or PostgreSQL, behind the REST
# server too). So the lock of arm A is the registered model "abpo-lock-<A>": whoever creates it holds it, and deletes it
# when done. Every process that moves a champion (the CLI, each Airflow worker, on any machine) talks to the same
# registry, so two workers cannot both hold it: a check-then-set done inside it (re-read the champion, compare with the
# expected one, move the alias) is atomic with respect to every other promotion.
# Takeover by a lease, never by comparing clocks: a waiter takes the lock over when it has seen the same lock (same
# owner tag, lease counter and the registry's creation timestamp of the lock, compared for equality only) unchanged
# for LOCK_TTL_S seconds of *its own* monotonic clock. A holder working longer bumps the lease (:func:`touch_lock`).
# So no holder's or waiter's wall clock matters (a slow one does not lose its lock, a fast crashed one does not block
# the arm), and a lock with no owner tag is taken over like any other stale one. LOCK_WAIT_S > LOCK_TTL_S: a waiter
# outlives a stale lock. A holder checks it still holds the lock right before it moves the alias.
# The lock's name carries the config's paths.namespace (abpo.arms.names.lock_name), like the arm's model.
LOCK_PREFIX = names.LOCK_PREFIX
LOCK_TTL_S = 10.0
LOCK_WAIT_S = 30.0
_held: dict[str, str] = {}  # lock name -> this process's token, while held


def _lock_name(cfg: Config, arm: str) -> str:
    """Arm ``arm``'s promotion lock in ``cfg``'s environment (an unknown arm: NotInRegistry, from model_name)."""
    return names.lock_name(model_name(arm, cfg) and arm, cfg.paths.namespace)


def _lease(held) -> tuple[str, str, str]:
    tags = held.tags or {}
    return tags.get("owner", ""), tags.get("lease", ""), str(getattr(held, "creation_timestamp", ""))


@contextlib.contextmanager
def promotion_lock(cfg: Config, arm: str, *, wait_s: float | None = None, ttl_s: float | None = None):
    """Hold arm ``arm``'s promotion lock (a registered model ``abpo-lock-<arm>`` in the registry, see above) for the
    block; raises PromotionRace when another holder keeps it longer than ``wait_s`` (this process's own holder
    included: not reentrant)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    ttl_s = LOCK_TTL_S if ttl_s is None else ttl_s
    name = _lock_name(cfg, arm)
    uri = registry.configure(cfg)
    client = MlflowClient()
    token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    deadline = time.monotonic() + wait_s
    delay = 0.05
    seen: tuple[str, str, str] | None = None
    seen_since = time.monotonic()
    held = None
    while True:
        try:
            client.create_registered_model(
                name,
                tags={"owner": token, "lease": "0"},
                description=f"promotion lock of arm {arm} (abpo.arms.versions)",
            )
            break
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_ALREADY_EXISTS":  # e.g. SQLite busy under contention
                if time.monotonic() > deadline:
                    raise registry.RegistryUnavailable(
                        f"MLflow registry {uri}: could not take the promotion lock {name!r} "
                        f"({getattr(e, 'error_code', '')}: {str(e)[:300]})"
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
        try:
            held = client.get_registered_model(name)
            lease = _lease(held)
            if lease != seen:  # a new holder, or the holder bumped its lease: it is alive
                seen, seen_since = lease, time.monotonic()
            elif time.monotonic() - seen_since > ttl_s:
                # unchanged for the TTL by this waiter's own clock: its holder died. Take it over (only if it is
                # still the same stale lock)
                if _lease(client.get_registered_model(name)) == seen:
                    client.delete_registered_model(name)
                seen = None
                continue
        except MlflowException:
            continue  # released in between: try again at once
        if time.monotonic() > deadline:
            raise PromotionRace(
                f"{model_name(arm, cfg)}: another promotion holds the lock {name!r} (owner "
                f"{(held.tags or {}).get('owner', '?')}) for more than {wait_s:g} s; nothing promoted "
                "(retry when it has finished)"
            )
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    _held[name] = token
    try:
        yield
    finally:
        if _held.get(name) == token:
            _held.pop(name, None)
        try:
            if client.get_registered_model(name).tags.get("owner") == token:
                client.delete_registered_model(name)
        except MlflowException:
            pass  # taken over after the TTL, or already gone


def touch_lock(cfg: Config, arm: str) -> None:
    """The holder says it is alive (bumps the lease counter, so waiters restart their TTL) and checks it still
    holds the lock; PromotionRace when it was taken over (then it must not move anything)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    name = _lock_name(cfg, arm)
    token = _held.get(name)
    registry.configure(cfg)
    client = MlflowClient()
    try:
        held = client.get_registered_model(name)
    except MlflowException:
        held = None
    tags = (held.tags or {}) if held is not None else {}
    if token is None or tags.get("owner") != token:
        raise PromotionRace(
            f"{model_name(arm, cfg)}: the promotion lock {name!r} is no longer this process's (taken over "
            "by another promotion after its TTL); nothing moved"
        )
    client.set_registered_model_tag(name, "lease", str(int(tags.get("lease", "0") or 0) + 1))
