"""Where each arm stands (``abpo arms status``): the versions its champion and challenger aliases name, with their
lineage tags, and a champion that its promotion history names but the registry no longer holds."""

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
