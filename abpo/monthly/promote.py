"""Step ``promote`` (Airflow task ``<arm>.promote``): the arm's champion moves to the gated challenger only when the
gate passed (under the arm's promotion lock, abpo.arms.promotion.promote, recorded in the promotion history with
actor ``gate`` and the gate's verdict); otherwise it stays where it was. Two more reasons it stays, each recorded in
the history as ``not-promoted`` with its message: the arm is pinned (`abpo arms pin`; the gate still ran and
reported), or the champion is no longer the one the month's update started from (a rollback, a promotion or a hand
move during the month: the challenger was gated against a champion that no longer serves)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from abpo.arms import promotion, promotion_lock, versions as arm_versions
from abpo.monthly.common import CHAMPION, StepResult
from abpo.monthly.gate import GateResult

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PromoteResult(StepResult):
    arm: str
    champion_version: str  # after the step
    promoted: bool
    previous_version: str = ""  # the champion the gate compared against (before the step)
    moved: bool = False  # the champion is another version than before: the DAG's champion Asset event fires
    reason: str = ""  # why it was not promoted though the gate passed (pinned, the champion moved), else ""


def promote(cfg: Config, arm: str, gate: GateResult, month: str = "") -> PromoteResult:
    """Move the arm's champion to the gated challenger when the gate passed; otherwise leave it where it was."""
    why = ""
    promoted = bool(gate.passed)
    already = False  # the promotion was done before: by a retried task (announced again: the first attempt may have
    # died before its event) or by a completed month run again (announced when it ran: no event now)
    if gate.passed:
        try:
            out = promotion.promote(
                cfg,
                arm,
                gate.version,
                expected_champion=gate.champion_version,
                reason=f"gate passed: {gate.reason}"[:4900],
                actor="gate",
                action="gate",
                verdict=f"pass: {gate.reason}"[:4900],
                month=month,
                respect_pin=True,
            )
            if out.get("promoted") == "false":
                promoted, why = False, out.get("reason", "pinned: not promoted")
            if out.get("already") == "true" and month:
                from abpo.monthly.report import month_completed

                already = month_completed(cfg, month)
        except promotion_lock.ChampionMoved as e:
            promoted, why = False, str(e)
        if promoted:
            log.info(f"promote {arm}: champion -> v{gate.version}")
        else:
            log.warning(f"promote {arm}: gate passed but v{gate.version} not promoted: {why}")
    else:
        log.info(f"promote {arm}: champion stays v{gate.champion_version} (v{gate.version} stays challenger)")
    now = str(arm_versions.get_version(cfg, arm, CHAMPION).version)
    return PromoteResult(
        arm=arm,
        champion_version=now,
        promoted=promoted,
        previous_version=str(gate.champion_version),
        moved=promoted and not already and now != str(gate.champion_version),
        reason=why,
    )
