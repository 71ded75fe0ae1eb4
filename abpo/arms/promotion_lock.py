"""The promotion lock of an arm (a registered model per arm, see below) and the refusals a promotion raises: whoever
holds the lock may move the arm's champion (abpo.arms.promotion)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from abpo import registry
from abpo.arms import names
from abpo.arms.versions import get_version, model_name

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


class MoveFenced(PromotionRace):
    """At the moment of the move, the promotion lock was no longer the mover's (taken over after its lease) or the
    champion no longer the one it checked under it: nothing moved (the mover's pending history entry is failed)."""


class HoldbackNeverPromoted(PromotionRace):
    """A promotion of the holdback arm (abpo.arms.names.HOLDBACK): refused, its champion stays pi_init (a
    PromotionRace, so `abpo arms promote` reports it in one line like any refused promotion)."""


# The promotion lock of arm A is a lock in the registry (abpo.registry.registry_lock: a registered model
# "abpo-lock-<A>" that whoever creates it holds, taken over by a lease after LOCK_TTL_S of a waiter's own clock): a
# check-then-set done inside it (re-read the champion, compare with the expected one, move the alias) is atomic with
# respect to every other promotion, on any machine. LOCK_WAIT_S > LOCK_TTL_S: a waiter outlives a stale lock. The
# move itself is fenced (:func:`fence`): at the call that moves the alias, the holder checks the lock is still its own
# (the token it wrote) and the champion still the one it checked, so a holder that stalled past its lease while
# another took the lock over moves nothing.
# The lease: a live holder must never lose the lock to a waiter, so the lease outlasts the longest stretch a loaded
# worker can go between two renewals. Between taking the lock and its fence a promotion makes about a dozen registry
# calls (each up to about 10 s against a slow tracking server, abpo.registry.store.HTTP_TIMEOUTS, or a wait on
# SQLite's write lock), on a worker that may be CPU-starved, swapping or in a long GC pause: 10 s was outlasted by a
# 13 s stop. 120 s is an order above that stretch; it costs only when a holder died on another machine (a holder
# gone from this host is taken over at once), and `abpo arms status` shows a held lock and its age meanwhile.
# The lock's name carries the config's paths.namespace (abpo.arms.names.lock_name), like the arm's model.
LOCK_PREFIX = names.LOCK_PREFIX
LOCK_TTL_S = 120.0
LOCK_WAIT_S = 180.0


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


def lock_name(cfg: Config, arm: str) -> str:
    """Arm ``arm``'s promotion lock (the registered model's name)."""
    return _lock_name(cfg, arm)


def fence(cfg: Config, arm: str, to_version: str, checked: str) -> Callable[[], None]:
    """The check made at the call that moves arm ``arm``'s champion to ``to_version`` (abpo.registry.set_alias's
    ``fence``): the lock is still this holder's (it renews the lease) and the champion is still ``checked``, the
    version read under the lock; MoveFenced naming the arm, the lock and what changed otherwise."""
    name, model = _lock_name(cfg, arm), model_name(arm, cfg)

    def champion_now() -> str:
        mv = get_version(cfg, arm, registry.CHAMPION)
        return str(mv.version) if mv is not None else ""

    def check() -> None:
        try:
            registry.touch_lock(cfg, name)
        except registry.LockLost as e:
            now = champion_now()
            moved = f"champion is v{now or 'none'}" + (
                "" if now == checked else f", not v{checked or 'none'} as checked"
            )
            raise MoveFenced(
                f"{model}: the promotion lock {name!r} is no longer this promotion's: taken over after its lease "
                f"(owner now {e.owner or 'none: released'}), {moved}; rule: only the lock's holder moves the "
                f"champion; v{to_version} not moved"
            ) from None
        now = champion_now()
        if now != checked:
            raise MoveFenced(
                f"{model}: champion is v{now or 'none'}, not v{checked or 'none'} as checked under the promotion lock "
                f"{name!r} (moved without the lock); rule: the champion moves only from the version checked; "
                f"v{to_version} not moved"
            )

    return check
