"""Step ``promote`` (Airflow task ``<arm>.promote``): the arm's champion moves to the gated challenger only when the
gate passed (under the arm's promotion lock, abpo.arms.versions.promote); otherwise it stays where it was."""

from __future__ import annotations

import dataclasses
import logging

from abpo.arms import versions as arm_versions
from abpo.monthly.common import CHAMPION, StepResult
from abpo.monthly.gate import GateResult

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PromoteResult(StepResult):
    arm: str
    champion_version: str  # after the step
    promoted: bool
    previous_version: str = ""  # the champion the gate compared against (before the step)
    moved: bool = False  # the champion is another version than before: the DAG's champion Asset event fires


def promote_arm(cfg, arm: str, gate: GateResult) -> PromoteResult:
    """Move the arm's champion to the gated challenger when the gate passed; otherwise leave it where it was."""
    if gate.passed:
        arm_versions.promote(cfg, arm, gate.version, expected_champion=gate.champion_version,
                             reason=f"gate passed: {gate.reason}"[:4900])
        log.info(f"promote {arm}: champion -> v{gate.version}")
    else:
        log.info(f"promote {arm}: champion stays v{gate.champion_version} (v{gate.version} stays challenger)")
    now = str(arm_versions.get_version(cfg, arm, CHAMPION).version)
    return PromoteResult(arm=arm, champion_version=now, promoted=bool(gate.passed),
                         previous_version=str(gate.champion_version), moved=now != str(gate.champion_version))
