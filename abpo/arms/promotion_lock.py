"""The promotion lock of an arm (a registered model per arm, see below) and the refusals a promotion raises: whoever
holds the lock may move the arm's champion (abpo.arms.promotion)."""

from __future__ import annotations

import contextlib
import logging
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


# The promotion lock of arm A is a lock in the registry (abpo.registry.registry_lock: a registered model
# "abpo-lock-<A>" that whoever creates it holds, taken over by a lease after LOCK_TTL_S of a waiter's own clock): a
# check-then-set done inside it (re-read the champion, compare with the expected one, move the alias) is atomic with
# respect to every other promotion, on any machine. LOCK_WAIT_S > LOCK_TTL_S: a waiter outlives a stale lock. A
# holder checks it still holds the lock right before it moves the alias (:func:`touch_lock`).
# The lock's name carries the config's paths.namespace (abpo.arms.names.lock_name), like the arm's model.
LOCK_PREFIX = names.LOCK_PREFIX
LOCK_TTL_S = 10.0
LOCK_WAIT_S = 30.0


def _lock_name(cfg: Config, arm: str) -> str:
    """Arm ``arm``'s promotion lock in ``cfg``'s environment (an unknown arm: NotInRegistry, from model_name)."""
    return names.lock_name(model_name(arm, cfg) and arm, cfg.paths.namespace)


@contextlib.contextmanager
def promotion_lock(cfg: Config, arm: str, *, wait_s: float | None = None, ttl_s: float | None = None):
    """Hold arm ``arm``'s promotion lock (a registered model ``abpo-lock-<arm>`` in the registry, see above) for the
    block; raises PromotionRace when another holder keeps it longer than ``wait_s`` (this process's own holder
    included: not reentrant)."""
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    ttl_s = LOCK_TTL_S if ttl_s is None else ttl_s
    name = _lock_name(cfg, arm)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(
                registry.registry_lock(
                    cfg,
                    name,
                    wait_s=wait_s,
                    ttl_s=ttl_s,
                    description=f"promotion lock of arm {arm} (abpo.arms.versions)",
                    what="promotion lock",
                )
            )
        except registry.LockHeld as e:
            raise PromotionRace(
                f"{model_name(arm, cfg)}: another promotion holds the lock {name!r} (owner {e.owner}) for more "
                f"than {wait_s:g} s; nothing promoted (retry when it has finished)"
            ) from None
        yield


def touch_lock(cfg: Config, arm: str) -> None:
    """The holder says it is alive (bumps the lease counter, so waiters restart their TTL) and checks it still
    holds the lock; PromotionRace when it was taken over (then it must not move anything)."""
    name = _lock_name(cfg, arm)
    try:
        registry.touch_lock(cfg, name)
    except registry.LockLost:
        raise PromotionRace(
            f"{model_name(arm, cfg)}: the promotion lock {name!r} is no longer this process's (taken over "
            "by another promotion after its TTL); nothing moved"
        ) from None
