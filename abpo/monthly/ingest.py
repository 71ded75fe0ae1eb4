"""Step ``ingest`` (Airflow task ``ingest``): write, audit, publish the month's landing files
(abpo.warehouse.Warehouse.ingest_month): contract violations quarantined, the replace guard and the Great
Expectations suite run on the staged rows, and only then the month's partition is replaced. A failed audit raises
IngestRefused and leaves the partition as it was. Then the month's landed interactions (what users consumed, when
serving or the simulator landed them) replace the month's partition of ``interactions``."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from abpo.monthly.common import StepResult
from abpo.monthly.report import month_completed, require_month_order
from abpo.months import Month

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class IngestResult(StepResult):
    rows_in: int
    rows_clean: int
    quarantined: dict[str, int]
    validation: str | None  # the GX summary file
    warehouse: str
    interactions: int | None = None  # rows of the month's landed interactions ingested (None: none landed)


def _record(cfg: Config, month: str) -> Path:
    return cfg.paths.resolve("root") / "cycle" / f"{month}.ingest.json"


def ingest(cfg: Config, month: Month, *, force: bool = False, out_of_order: bool = False) -> IngestResult:
    """The step. A month older than the last completed month and never ingested is refused unless ``out_of_order``
    (abpo.monthly.report.require_month_order). A completed month (a rerun or a cleared run) is not ingested again:
    the result recorded when it was (cycle/<month>.ingest.json) is returned, nothing is written."""
    import json

    from abpo.arms.versions import registered_versions
    from abpo.warehouse import config_catalog, ingest_with_config, open_warehouse

    month = Month(month)
    require_month_order(cfg, str(month), force=out_of_order)
    kept = _record(cfg, str(month))
    if month_completed(cfg, str(month)) and kept.is_file():
        log.info(f"ingest {month}: the month completed before; its ingest stands ({kept}), nothing ingested")
        return IngestResult.from_json(json.loads(kept.read_text()))
    # every contract and audit setting of section data, and the arms' registered versions (unknown_model_version)
    report, _ = ingest_with_config(cfg, month, force=force, model_versions=registered_versions(cfg))
    with open_warehouse(cfg) as wh:  # then what users consumed, when it landed (the ranker arms' refits read it)
        interactions = wh.ingest_interactions(cfg.paths.location("landing"), month, catalog=config_catalog(cfg))
    out = IngestResult(
        rows_in=report.rows_in,
        rows_clean=report.rows_clean,
        quarantined=dict(report.quarantined_by_rule),
        validation=report.audit.path,
        warehouse=str(cfg.paths.resolve("warehouse")),
        interactions=interactions,
    )
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_suffix(".tmp")
    tmp.write_text(json.dumps(out.to_json()))
    tmp.replace(kept)
    return out
