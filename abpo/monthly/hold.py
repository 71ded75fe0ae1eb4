"""Step ``hold`` (Airflow task ``<arm>.hold``, one per holdback arm): the holdback's month does nothing to its model,
and says so. Its champion must still be the version bootstrap registered from pi_init (lineage tag ``source =
pi_init``, no parent): never updated, never promoted (abpo.arms.promotion.promote refuses it). The step checks that
and returns the reason it did nothing, so the DAG's grid and ``abpo arms month`` record why the arm did not train."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from abpo.arms import history, versions as arm_versions
from abpo.arms.names import HOLDBACK, HOLDBACK_ARMS, entry
from abpo.errors import ExpectedError
from abpo.monthly.common import CHAMPION, StepResult
from abpo.months import Month

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


class HoldbackMoved(ExpectedError, RuntimeError):
    """The holdback's champion is not the pi_init version bootstrap registered: the control is gone."""


@dataclasses.dataclass
class HoldResult(StepResult):
    arm: str
    month: str
    champion_version: str  # the same every month
    reason: str  # why nothing was trained


def hold(cfg: Config, arm: str, month: Month) -> HoldResult:
    """The step for one holdback arm (see the module docstring)."""
    if entry(arm).kind != HOLDBACK:
        raise ValueError(f"hold: {arm!r} is a {entry(arm).kind} arm; rule: one of {list(HOLDBACK_ARMS)}")
    champ = arm_versions.get_version(cfg, arm, CHAMPION)
    if champ is None:
        raise LookupError(f"{arm_versions.model_name(arm, cfg)}: no champion; bootstrap the arms first")
    tags = champ.tags or {}
    if tags.get("source") != "pi_init" or tags.get("parent_version"):
        raise HoldbackMoved(
            f"{arm_versions.model_name(arm, cfg)} v{champ.version}: champion with source={tags.get('source')!r}, "
            f"parent_version={tags.get('parent_version')!r}; rule: a holdback's champion stays the pi_init version "
            "bootstrap registered (never updated, never promoted); restore it before the month runs"
        )
    # the version bootstrap registered, per the promotion history: another pi_init version swapped in (by hand in
    # MLflow) has the same tags but is not the control the months so far were served by

    first = next((e for e in history.entries(cfg, arm) if e.action in ("bootstrap", "baseline")), None)
    if first is not None and first.to_version != str(champ.version):
        raise HoldbackMoved(
            f"{arm_versions.model_name(arm, cfg)} v{champ.version}: champion is not v{first.to_version}, the version "
            f"its promotion history started with ({first.action} at {first.at}); rule: a holdback's champion stays "
            "the pi_init version bootstrap registered (another pi_init version is another control); restore it "
            f"(`abpo arms rollback --arm {arm}`) before the month runs"
        )
    reason = (
        f"holdback: not updated in {Month(month)}; champion stays pi_init "
        f"({arm_versions.model_name(arm, cfg)} v{champ.version}, {tags.get('pi_init_version', 'pi_init')})"
    )
    log.info(reason)
    return HoldResult(arm=arm, month=str(month), champion_version=str(champ.version), reason=reason)
