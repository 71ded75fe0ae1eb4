"""Step ``register`` (Airflow task ``<arm>.register``): the update as a new version of the arm's registered model,
alias challenger, with lineage tags (abpo.arms.versions); a retry of the same run reuses its version."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from abpo.arms import versions as arm_versions
from abpo.monthly.common import CHALLENGER, StepResult
from abpo.monthly.update import UpdateResult

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RegisterResult(StepResult):
    arm: str
    version: str  # the challenger
    parent_version: str


def register(cfg: Config, arm: str, updated: UpdateResult) -> RegisterResult:
    tags = arm_versions.lineage_tags(
        cfg,
        kind="llm",
        source="update",
        parent_version=updated.parent_version,
        months=updated.months,
        data_hash=updated.data_hash,
        variant=updated.variant,
        month=updated.month,
        rows=updated.rows,
        steps=updated.steps,
    )
    mv = arm_versions.register_version(cfg, arm, updated.model_uri, updated.run_id, tags, alias=CHALLENGER)
    log.info(
        f"register {arm}: {arm_versions.model_name(arm, cfg)} v{mv.version} (parent v{updated.parent_version}) "
        f"is challenger"
    )
    return RegisterResult(arm=arm, version=str(mv.version), parent_version=updated.parent_version)
