"""Step ``report`` (Airflow task ``report``): the A/B report over every warehouse month up to m, all arms, with the
sample-ratio check; it marks the month complete. A month whose predecessor was ingested but never completed refuses
to start (:func:`require_previous_month`, run by the bootstrap step)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from abpo.monthly.common import StepResult, json_safe
from abpo.months import Month

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ReportResult(StepResult):
    months: list[str]
    html: str
    markdown: str
    png: str


class PreviousMonthIncomplete(RuntimeError):
    """Month m-1 was started (ingested) but its cycle never finished: month m must not run on top of it."""


def _done_marker(cfg, month: str) -> Path:
    return cfg.paths.resolve("root") / "cycle" / f"{month}.json"


def mark_month_complete(cfg, month: str, facts: dict[str, Any]) -> Path:
    """Record that ``month``'s cycle finished (written by the report step, the last one)."""
    path = _done_marker(cfg, month)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(json_safe(facts)))
    tmp.replace(path)
    return path


def require_previous_month(cfg, month: str) -> None:
    """Refuse to start ``month`` when an earlier month was ingested but its cycle did not finish (a failed or
    interrupted run): its arms may be half-updated, so the next month would serve and train on top of that.
    Rerun the failed month first (reruns are idempotent on the data side)."""
    from abpo.warehouse import open_warehouse

    if not cfg.paths.resolve("warehouse").exists():
        return
    with open_warehouse(cfg, read_only=True) as wh:
        earlier = [m for m in wh.months() if m < month]
    unfinished = [m for m in earlier if not _done_marker(cfg, m).exists()]
    if unfinished:
        raise PreviousMonthIncomplete(
            f"month {month}: earlier month(s) {unfinished} were ingested but their cycle never finished (no "
            f"{_done_marker(cfg, unfinished[-1])}); rerun abpo_monthly for {unfinished[-1]} first")


def report_to_date(cfg, month: Month) -> ReportResult:
    """The A/B report over every warehouse month up to ``month``, every arm (sample-ratio check on the configured
    shares)."""
    from abpo.abtest.report import report_from_warehouse
    from abpo.warehouse import open_warehouse

    with open_warehouse(cfg, read_only=True) as wh:
        months = [m for m in wh.months() if m <= month]
    report, files = report_from_warehouse(cfg, months)
    log.info(f"report {months[0]}..{months[-1]}: {files.html}")
    out = ReportResult(months=months, html=str(files.html), markdown=str(files.markdown), png=str(files.png))
    mark_month_complete(cfg, month, out.to_json())
    return out
