"""A completed month's per-arm steps stand: each step's result is recorded when it finishes
(``<state>/cycle/<month>.<arm>.<step>.json``, beside the ingest's record and the report's completion marker), and a
month run again after its report marked it complete (``abpo arms month`` again, a cleared or re-triggered DAG run)
returns the recorded result instead of running the step: no update trained, no version registered, no gate run, no
promotion or refit, whatever the config now hashes to: a month is run once. Its serve and ingest stand the same way
(abpo.monthly.serve, abpo.monthly.ingest). An update that was skipped (NotEnoughFeedback) is skipped again with its
recorded reason.

A step of a month that is not complete (a failed month, a retried task) runs as before: its own task key finds its
completed MLflow run when it has one (abpo.monthly.common.completed_step). A month completed before these records
existed runs its steps likewise, and so does a step whose record names a registry version that no longer exists (a
store lost or replaced, ``--force``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.monthly.common import NotEnoughFeedback, StepResult, json_safe

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)

# the result class of each per-arm step ("module:class"), to read a record back
RESULTS = {
    "update": "abpo.monthly.update:UpdateResult",
    "register": "abpo.monthly.register:RegisterResult",
    "gate": "abpo.monthly.gate:GateResult",
    "promote": "abpo.monthly.promote:PromoteResult",
    "refit": "abpo.monthly.refit:RefitResult",
    "hold": "abpo.monthly.hold:HoldResult",
}


def record_path(cfg: Config, month: str, arm: str, step: str) -> Path:
    return cfg.paths.resolve("root") / "cycle" / f"{month}.{arm}.{step}.json"


def _result_class(step: str) -> type[StepResult]:
    import importlib

    module, _, name = RESULTS[step].partition(":")
    return getattr(importlib.import_module(module), name)


def _write(path: Path, facts: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(json_safe(facts)))
    tmp.replace(path)


def standing(cfg: Config, month: str, arm: str, step: str) -> dict[str, Any] | None:
    """The record of ``arm``'s ``step`` in ``month`` when the month completed (its report's marker) and the step
    recorded one; None otherwise (the step runs)."""
    from abpo.monthly.report import month_completed

    path = record_path(cfg, month, arm, step)
    if not (month_completed(cfg, month) and path.is_file()):
        return None
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # a damaged record: the step runs (its task key finds its completed run)
        log.warning(f"{step} {arm}: {path}: unreadable ({type(e).__name__}: {e}); the step runs")
        return None
    return kept if isinstance(kept, dict) and ("result" in kept or "skipped" in kept) else None


def _versions_missing(cfg: Config, arm: str, result: dict[str, Any]) -> list[str]:
    """The registry versions a recorded result names (its challenger or champion) that the arm's registered model no
    longer holds: a record of a registry since lost or replaced (``abpo arms month --force``) does not stand."""
    from abpo.arms import versions as arm_versions

    named = {str(result[k]) for k in ("version", "champion_version") if str(result.get(k) or "").isdigit()}
    return sorted((v for v in named if arm_versions.get_version(cfg, arm, v) is None), key=int)


def run_arm_step(step: str, cfg: Config, month: str, arm: str, call: Callable[[], StepResult]) -> StepResult:
    """``call()`` (the step ``step`` of ``arm`` in ``month``), recorded; or, when the month completed and the step
    recorded its result, that result (see the module docstring). A recorded promotion or refit comes back with
    ``moved`` false: the champion moved when the month ran, and its event was announced then."""
    if step not in RESULTS:
        raise ValueError(f"monthly step {step!r}: not a per-arm step; rule: one of {list(RESULTS)}")
    month = str(month)
    path = record_path(cfg, month, arm, step)
    kept = standing(cfg, month, arm, step)
    if kept is not None:
        if "skipped" in kept:
            log.info(
                f"{step} {arm}: month {month} completed before; its {step} was skipped ({path}): {kept['skipped']}"
            )
            raise NotEnoughFeedback(str(kept["skipped"]))
        result = dict(kept["result"])
        missing = _versions_missing(cfg, arm, result)
        if not missing:
            log.info(f"{step} {arm}: month {month} completed before; its {step} stands ({path}), nothing run")
            if "moved" in result:
                result["moved"] = False
            return _result_class(step).from_json(result)
        log.warning(
            f"{step} {arm}: month {month} completed before, but the version(s) its record names are not in the "
            f"registry ({', '.join(f'v{v}' for v in missing)}; {path}): the step runs"
        )
    try:
        out = call()
    except NotEnoughFeedback as e:
        _write(path, {"month": month, "arm": arm, "step": step, "skipped": str(e)})
        raise
    _write(path, {"month": month, "arm": arm, "step": step, "result": out.to_json()})
    return out
