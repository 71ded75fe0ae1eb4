"""Step ``promote`` (Airflow task ``<arm>.promote``): the arm's champion moves to the gated challenger only when the
gate passed (under the arm's promotion lock, abpo.arms.promotion.promote, recorded in the promotion history with
actor ``gate`` and the gate's verdict); otherwise it stays where it was. Two more reasons it stays, each recorded in
the history as ``not-promoted`` with its message: the arm is pinned (`abpo arms pin`; the gate still ran and
reported), or the champion is no longer the one the month's update started from (a rollback, a promotion or a hand
move during the month: the challenger was gated against a champion that no longer serves).

With ``arms.approval: required`` (docs/gate.md "Approval") a challenger that passed the gate also needs a human's
Approve at the DAG's approval task ``<arm>.approve`` (abpo.monthly.approval): approved, the promotion is recorded
with the approver as its actor (and the version's tags ``approved_by`` / ``approved_at``); rejected, not answered
within ``arms.approval_timeout``, or not asked at all (``abpo arms month`` and a DAG parsed without the approval
task have no one to ask), the champion stays and the history records a ``not-promoted`` entry saying which."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from abpo.arms import promotion, promotion_lock, versions as arm_versions
from abpo.monthly import approval as approvals
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
    reason: str = ""  # why it was not promoted though the gate passed (pinned, the champion moved, rejected), else ""
    approval: dict[str, str] | None = None  # arms.approval = required: the approval task's answer (Approval.to_json())


def approval_refusal(cfg: Config, approval: approvals.Approval | None) -> str:
    """Why a challenger that passed the gate may not be promoted for want of a human's approval ("" when it may):
    arms.approval = required and no Approve was given (rejected, timed out, or no approval task asked)."""
    if cfg.arms.approval != "required" or (approval is not None and approval.decision == approvals.APPROVED):
        return ""
    if approval is None or approval.decision in (approvals.NOT_ASKED, approvals.NOT_REQUIRED):
        return (
            "arms.approval = required and no approval task asked (the month ran outside the abpo_monthly DAG, or "
            "the DAG was parsed with arms.approval = none): not promoted; promote it by hand with `abpo arms promote`"
        )
    return f"{approval.sentence()}: not promoted"


def promote(
    cfg: Config, arm: str, gate: GateResult, month: str = "", approval: dict[str, str] | None = None
) -> PromoteResult:
    """Move the arm's champion to the gated challenger when the gate passed (and, with arms.approval = required,
    ``approval``, the DAG's approval task's answer, says Approve); otherwise leave it where it was."""
    why = ""
    asked = approvals.Approval.from_json(approval) if approval else None
    promoted = bool(gate.passed)
    already = False  # the promotion was done before: by a retried task (announced again: the first attempt may have
    # died before its event) or by a completed month run again (announced when it ran: no event now)
    refusal = approval_refusal(cfg, asked) if gate.passed else ""
    if refusal:
        promoted, why = False, refusal
        promotion.refuse(
            cfg,
            arm,
            gate.version,
            actor=(asked.by if asked is not None and asked.by else "abpo"),
            reason=f"v{gate.version} {refusal}",
            verdict=f"pass: {gate.reason}"[:4900],
            month=month,
        )
        log.warning(f"promote {arm}: gate passed but v{gate.version} not promoted: {why}")
    elif gate.passed:
        approver = asked if asked is not None and asked.decision == approvals.APPROVED else None
        try:
            out = promotion.promote(
                cfg,
                arm,
                gate.version,
                expected_champion=gate.champion_version,
                reason=((f"{approver.sentence()}; " if approver else "") + f"gate passed: {gate.reason}")[:4900],
                actor=approver.by if approver else "gate",
                action="gate",
                verdict=f"pass: {gate.reason}"[:4900],
                month=month,
                respect_pin=True,
                tags={"approved_by": approver.by, "approved_at": approver.at} if approver else None,
            )
            if out.get("promoted") == "false":
                promoted, why = False, out.get("reason", "pinned: not promoted")
            if out.get("already") == "true" and month:
                from abpo.monthly.report import month_completed

                already = month_completed(cfg, month)
        except promotion_lock.ChampionMoved as e:
            promoted, why = False, str(e)
        if promoted:
            by = f" ({approver.sentence()})" if approver else ""
            log.info(f"promote {arm}: champion -> v{gate.version}{by}")
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
        approval=asked.to_json() if asked is not None else None,
    )
