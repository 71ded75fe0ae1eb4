"""Step ``serve`` (Airflow task ``serve``): month m's traffic. With ``simulate`` the simulator (abpo.sim) serves it:
every arm's champion exposes, the click model clicks, and the month lands as Parquet. Without it (production) the
month must have landed already (landing/impressions/month=YYYY-MM/): the step checks it and fails saying where it
looked; it never fabricates data."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from abpo.arms import versions as arm_versions
from abpo.monthly.common import StepResult, arms_of, dataset_and_splits
from abpo.monthly.report import month_completed
from abpo.months import Month
from abpo.sim.simulator import simulate_month
from abpo.warehouse import IngestError, Warehouse

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


class NothingLanded(IngestError, FileNotFoundError):
    """Nothing landed for the month and the simulator is not asked to serve it (the `abpo` command reports it in one
    line, as an ingest error)."""


@dataclasses.dataclass
class ServeResult(StepResult):
    month: str
    simulated: bool
    files: int = 0  # landed files found (not simulated)
    path: str = ""  # the simulated part written
    seconds: float = 0.0
    per_arm: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:  # the keys the DAG's serve task returned before
        if not self.simulated:
            return {"month": self.month, "files": self.files, "simulated": False}
        return {"month": self.month, "path": self.path, "seconds": self.seconds, "per_arm": self.per_arm}


def serve_month(cfg: Config, month: Month) -> ServeResult:
    """Month ``month``'s traffic served by every arm's champion (abpo.sim.simulate_month), landed as Parquet."""

    ds, splits = dataset_and_splits(cfg)
    arms = {a: arm_versions.load_arm(cfg, a, ds) for a in arms_of(cfg)}
    res = simulate_month(cfg, month, arms, dataset=ds, splits=splits)
    for a, v in res.per_arm.items():
        ctr = "-" if v["ctr"] is None else f"{v['ctr']:.4f}"  # None: no request of the arm this month
        log.info(f"  {a:<11} {v['impressions']:>6} impressions {v['clicks']:>5} clicks  CTR {ctr}")
    return ServeResult(str(month), True, path=str(res.path), seconds=res.seconds, per_arm=res.per_arm)


def check_landed(cfg: Config, month: Month) -> ServeResult:
    """The month's landed files (production); NothingLanded (an IngestError and a FileNotFoundError) naming the
    landing zone when there are none."""

    try:
        files = Warehouse.landing_files(cfg.paths.location("landing"), month)
    except IngestError as e:
        raise NothingLanded(
            f"{cfg.paths.location('landing')}: nothing landed for month={month} ({e}); "
            "land the month's logs, or trigger with simulate=true (abpo arms month: --simulate)"
        ) from e
    return ServeResult(str(month), False, files=len(files))


def serve(cfg: Config, month: Month, *, simulate: bool) -> ServeResult:
    """The step: :func:`serve_month` when ``simulate``, else :func:`check_landed`. A completed month (its report
    written: a rerun or a cleared run) is never simulated again: its landed files are what it served (a new
    simulation, by the champions its own promotion moved, would rewrite the month's logs and retrain its updates)."""

    if simulate and month_completed(cfg, str(Month(month))):
        log.info(f"serve {month}: the month completed before; its landed logs stand, nothing simulated")
        return check_landed(cfg, Month(month))
    return serve_month(cfg, Month(month)) if simulate else check_landed(cfg, Month(month))
