"""Step ``report`` (Airflow task ``report``): the A/B report over every warehouse month up to m, all arms, with the
sample-ratio check; it marks the month complete. A month whose predecessor was ingested but never completed refuses
to start (:func:`require_previous_month`, run by the bootstrap step)."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo.errors import ExpectedError
from abpo.monthly.common import StepResult, json_safe
from abpo.months import MONTH_PATTERN, Month, MonthError

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ReportResult(StepResult):
    months: list[str]
    html: str
    markdown: str
    png: str


class PreviousMonthIncomplete(ExpectedError, RuntimeError):
    """Month m-1 was started (ingested) but its cycle never finished: month m must not run on top of it."""


def _done_marker(cfg: Config, month: str) -> Path:
    return cfg.paths.resolve("root") / "cycle" / f"{month}.json"


def mark_month_complete(cfg: Config, month: str, facts: dict[str, Any]) -> Path:
    """Record that ``month``'s cycle finished (written by the report step, the last one)."""
    path = _done_marker(cfg, month)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(json_safe(facts)))
    tmp.replace(path)
    return path


def require_previous_month(cfg: Config, month: str) -> None:
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
            f"{_done_marker(cfg, unfinished[-1])}); rerun abpo_monthly for {unfinished[-1]} first"
        )


def completed_months(cfg: Config) -> list[str]:
    """The months whose cycle finished (the report step's markers cycle/<YYYY-MM>.json under paths.root), oldest
    first."""

    d = cfg.paths.resolve("root") / "cycle"
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json") if re.fullmatch(MONTH_PATTERN, p.stem))


def month_completed(cfg: Config, month: str) -> bool:
    return _done_marker(cfg, str(month)).exists()


class MonthOutOfOrder(MonthError):
    """A month older than the last completed month, neither completed nor ingested before: ingesting (or running)
    it now would leave an unfinished month behind the completed ones, which blocks every later month."""


def require_month_order(cfg: Config, month: str, *, force: bool = False) -> None:
    """Refuse month ``month`` when it is older than the last completed month and neither completed itself nor
    already in the warehouse (a rerun of a completed month, or of a backfill ingested with the rule forced, goes
    on): MonthOutOfOrder naming the month, the last completed one and the rule. ``force``: nothing is checked."""
    from abpo.warehouse import open_warehouse

    month = str(Month(month))
    done = completed_months(cfg)
    if force or not done or month >= done[-1] or month_completed(cfg, month):
        return
    if cfg.paths.resolve("warehouse").exists():
        with open_warehouse(cfg, read_only=True) as wh:
            if month in wh.months():
                return
    raise MonthOutOfOrder(
        f"month {month}: older than the last completed month {done[-1]} ({_done_marker(cfg, done[-1])}) and never "
        f"ingested; rule: months run in order (months_in_order): an earlier month ingested now stays unfinished "
        f"behind the completed ones and blocks the next month. To backfill it on purpose: abpo ingest --month {month} "
        "--force-month-order, then run its cycle"
    )


def report(cfg: Config, month: Month) -> ReportResult:
    """The A/B report over every warehouse month up to ``month``, every arm (sample-ratio check on the configured
    shares), with the months' gates (abpo.monthly.gate_report)."""
    from abpo.abtest.report import report_from_warehouse
    from abpo.warehouse import open_warehouse

    with open_warehouse(cfg, read_only=True) as wh:
        months = [m for m in wh.months() if m <= month]
    report, files = report_from_warehouse(cfg, months)
    from abpo.monthly.gate_report import add_gate_section

    add_gate_section(cfg, months, files.markdown, files.html)  # each gate's halves and what decided (docs/gate.md)
    from abpo.monthly.promotion_report import add_promotion_section

    add_promotion_section(cfg, months, files.markdown, files.html)  # what promote did after each passed gate, and who
    log.info(f"report {months[0]}..{months[-1]}: {files.html}")
    out = ReportResult(months=months, html=str(files.html), markdown=str(files.markdown), png=str(files.png))
    mark_month_complete(cfg, month, out.to_json())
    return out
