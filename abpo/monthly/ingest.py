"""Step ``ingest`` (Airflow task ``ingest``): write, audit, publish the month's landing files
(abpo.warehouse.Warehouse.ingest_month): contract violations quarantined, the replace guard and the Great
Expectations suite run on the staged rows, and only then the month's partition is replaced. A failed audit raises
IngestRefused and leaves the partition as it was. Then the month's landed interactions (what users consumed, when
serving or the simulator landed them) replace the month's partition of ``interactions``."""

from __future__ import annotations

import dataclasses

from abpo.monthly.common import StepResult
from abpo.months import Month


@dataclasses.dataclass
class IngestResult(StepResult):
    rows_in: int
    rows_clean: int
    quarantined: dict[str, int]
    validation: str | None  # the GX summary file
    warehouse: str
    interactions: int | None = None  # rows of the month's landed interactions ingested (None: none landed)


def ingest_and_validate(cfg, month: Month, *, force: bool = False) -> IngestResult:
    from abpo.warehouse import config_catalog, ingest_with_config, open_warehouse

    report, _ = ingest_with_config(cfg, Month(month), force=force)  # every contract and audit setting of section data
    with open_warehouse(cfg) as wh:  # then what users consumed, when it landed (the ranker arms' refits read it)
        interactions = wh.ingest_interactions(cfg.paths.location("landing"), Month(month), catalog=config_catalog(cfg))
    return IngestResult(rows_in=report.rows_in, rows_clean=report.rows_clean,
                        quarantined=dict(report.quarantined_by_rule), validation=report.audit.path,
                        warehouse=str(cfg.paths.resolve("warehouse")), interactions=interactions)
