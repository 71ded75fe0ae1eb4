"""Where each arm stands (``abpo arms status``): the versions its champion and challenger aliases name, with their
lineage tags, a champion that its promotion history names but the registry no longer holds, and what a promotion
left unfinished: a pending history entry and a held promotion lock (:func:`arm_unfinished`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from abpo import registry

if TYPE_CHECKING:
    from abpo.config import Config


@dataclasses.dataclass(frozen=True)
class AliasStatus:
    """One alias of one arm's registered model: ``info`` is the version it names (abpo.arms.versions.version_info),
    None when the alias names none; ``missing`` is why a champion alias naming none is a fault (ChampionMissing's
    message: the history names a champion that was deleted or unaliased outside abpo), "" otherwise."""

    model: str
    alias: str
    info: dict[str, Any] | None
    missing: str = ""


def arm_status(cfg: Config, arms: Sequence[str]) -> Iterator[AliasStatus]:
    """The champion and the challenger of each arm of ``arms``, in that order, one at a time (each is read from the
    registry when it is asked for)."""
    from abpo.arms import versions as arm_versions
    from abpo.arms.history import ChampionMissing, require_champion_or_none_recorded

    for arm in arms:
        for alias in (registry.CHAMPION, registry.CHALLENGER):
            mv = arm_versions.get_version(cfg, arm, alias)
            model = arm_versions.model_name(arm, cfg)
            if mv is not None:
                yield AliasStatus(model, alias, arm_versions.version_info(mv))
                continue
            missing = ""
            if alias == registry.CHAMPION:  # deleted outside abpo while its history names one: say so
                try:
                    require_champion_or_none_recorded(cfg, arm, model)
                except ChampionMissing as e:
                    missing = str(e)
            yield AliasStatus(model, alias, None, missing)


def arm_unfinished(cfg: Config, arm: str, *, now: float | None = None) -> list[str]:
    """What a promotion of ``arm`` left unfinished, one line each: every pending entry of its promotion history
    (abpo.arms.history.pending: written before a move, not finished after it) and its promotion lock when it is held
    (holder, since when, age). A mover killed right after the alias moved leaves both; the next promotion, rollback
    or month settles the entry, and takes the lock over (at once when its holder is gone from this host, else after
    the lease). [] when nothing is unfinished."""
    import time
    from datetime import datetime

    from abpo.arms import history
    from abpo.arms.promotion_lock import LOCK_TTL_S, lock_name

    out = [
        f"pending history entry #{e.seq}: {e.action} v{e.from_version or '-'} -> v{e.to_version} by {e.actor} at "
        f"{e.at}, not finished (its writer is moving the champion or died before finishing; the next promotion, "
        "rollback or month settles it)"
        for e in history.pending(cfg, arm)
    ]
    name = lock_name(cfg, arm)
    held = registry.lock_holder(cfg, name)
    if held is not None:
        age = ""
        if held["since"]:
            secs = (time.time() if now is None else now) - datetime.fromisoformat(held["since"]).timestamp()
            age = f", {max(secs, 0):.0f} s ago"
        out.append(
            f"promotion lock {name!r} held by {held['owner'] or 'an unknown owner'} since {held['since'] or '?'}"
            f"{age} (lease {held['lease'] or '0'}; a waiter takes it over once it is unchanged for {LOCK_TTL_S:g} s, "
            "at once when its holder is gone from this host)"
        )
    return out
