"""A lock held in the registry itself, for a check-then-set that must be atomic across every process (the CLI, each
Airflow worker, on any machine) talking to the same store: abpo.arms.promotion_lock holds one per arm.

MLflow's registry has no compare-and-set: SetRegisteredModelAlias moves an alias unconditionally. What it does have
is a unique registered-model name: CreateRegisteredModel fails with RESOURCE_ALREADY_EXISTS when the name exists (a
primary key in the SQL store, SQLite or PostgreSQL, behind the REST server too). So a lock is a registered model:
whoever creates it holds it, and deletes it when done.

Takeover by a lease, never by comparing clocks: a waiter takes the lock over when it has seen the same lock (same
owner tag, lease counter and the registry's creation timestamp of the lock, compared for equality only) unchanged
for ``ttl_s`` seconds of *its own* monotonic clock. A holder working longer bumps the lease (:func:`touch_lock`).
So no holder's or waiter's wall clock matters (a slow one does not lose its lock, a fast crashed one does not block
the lock), and a lock with no owner tag is taken over like any other stale one. A lock whose owner is a process of
this host that no longer exists is taken over at once: its holder is gone, no lease to wait out. A waiter should wait
longer than the TTL, so that it outlives a stale lock; a holder checks it still holds the lock right before it acts
(:func:`touch_lock`, or a ``fence`` at the very call that acts: :func:`abpo.registry.set_alias`)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from abpo.registry.errors import RegistryUnavailable
from abpo.registry.store import configure

if TYPE_CHECKING:
    from abpo.config import Config

# (lock name, thread) -> the token its holder wrote, while held: a fence compares the lock's owner with the token of
# the thread that took it, never with another thread's (a thread that takes the same lock over in this process)
_held: dict[tuple[str, int], str] = {}


class LockHeld(RuntimeError):
    """Another holder kept the lock longer than the caller would wait; ``owner`` is its owner tag ('?' unknown)."""

    def __init__(self, name: str, owner: str, wait_s: float) -> None:
        super().__init__(f"lock {name!r} held by {owner} for more than {wait_s:g} s")
        self.name, self.owner, self.wait_s = name, owner, wait_s


class LockLost(RuntimeError):
    """The lock is no longer this process's (taken over by another holder after its TTL, or never taken); ``owner``
    is its owner now ("" when no one holds it)."""

    def __init__(self, name: str, owner: str = "") -> None:
        super().__init__(f"lock {name!r} is not this holder's (owner now: {owner or 'none'})")
        self.name, self.owner = name, owner


def _lease(held) -> tuple[str, str, str]:
    tags = held.tags or {}
    return tags.get("owner", ""), tags.get("lease", ""), str(getattr(held, "creation_timestamp", ""))


def _holder_gone(owner: str) -> bool:
    """Whether owner tag ``owner`` (``host:pid:token``) names a process of this host that no longer exists (never
    this process: its own lock is held by a live thread)."""
    host, _, rest = owner.partition(":")
    pid, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's process of that id, or not a pid at all
        return False
    return False


@contextlib.contextmanager
def registry_lock(
    cfg: Config, name: str, *, wait_s: float, ttl_s: float, description: str = "", what: str = "lock"
) -> Iterator[None]:
    """Hold the lock ``name`` (a registered model of that name on the config's store) for the block. LockHeld when
    another holder keeps it longer than ``wait_s`` (this process's own holder included: not reentrant);
    RegistryUnavailable naming the store (and ``what`` the lock is) when the registry keeps failing for
    ``wait_s``."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = configure(cfg)
    client = MlflowClient()
    token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    deadline = time.monotonic() + wait_s
    delay = 0.05
    seen: tuple[str, str, str] | None = None
    seen_since = time.monotonic()
    held = None
    while True:
        try:
            client.create_registered_model(name, tags={"owner": token, "lease": "0"}, description=description)
            break
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_ALREADY_EXISTS":  # e.g. SQLite busy under contention
                if time.monotonic() > deadline:
                    raise RegistryUnavailable(
                        f"MLflow registry {uri}: could not take the {what} {name!r} "
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
            if _holder_gone(lease[0]) or time.monotonic() - seen_since > ttl_s:
                # unchanged for the TTL by this waiter's own clock: its holder died. Take it over (only if it is
                # still the same stale lock)
                if _lease(client.get_registered_model(name)) == seen:
                    client.delete_registered_model(name)
                seen = None
                continue
        except MlflowException:
            continue  # released in between: try again at once
        if time.monotonic() > deadline:
            raise LockHeld(name, (held.tags or {}).get("owner", "?"), wait_s)
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    mine = (name, threading.get_ident())
    _held[mine] = token
    try:
        yield
    finally:
        if _held.get(mine) == token:
            _held.pop(mine, None)
        try:
            if client.get_registered_model(name).tags.get("owner") == token:
                client.delete_registered_model(name)
        except MlflowException:
            pass  # taken over after the TTL, or already gone


def touch_lock(cfg: Config, name: str) -> None:
    """The holder says it is alive (bumps the lease counter, so waiters restart their TTL) and checks it still
    holds lock ``name``; LockLost when it does not (then it must not act)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    token = _held.get((name, threading.get_ident()))
    configure(cfg)
    client = MlflowClient()
    try:
        held = client.get_registered_model(name)
    except MlflowException:
        held = None
    tags = (held.tags or {}) if held is not None else {}
    if token is None or tags.get("owner") != token:
        raise LockLost(name, tags.get("owner", ""))
    client.set_registered_model_tag(name, "lease", str(int(tags.get("lease", "0") or 0) + 1))


def lock_holder(cfg: Config, name: str) -> dict[str, str] | None:
    """Who holds lock ``name`` now: {owner, lease, since} (``since``: the registry's creation time of the lock, ISO
    UTC), or None when no one does. For a status line, not for deciding a takeover (that goes by the lease)."""
    from datetime import UTC, datetime

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    configure(cfg)
    try:
        held = MlflowClient().get_registered_model(name)
    except MlflowException as e:
        if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise RegistryUnavailable(f"lock {name!r}: could not be read ({str(e)[:300]})") from e
    tags = held.tags or {}
    ms = getattr(held, "creation_timestamp", None)
    since = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds") if ms else ""
    return {"owner": tags.get("owner", ""), "lease": tags.get("lease", ""), "since": since}
