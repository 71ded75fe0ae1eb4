"""Step ``serve`` (Airflow task ``serve``): month m's traffic. With ``simulate`` the simulator (abpo.sim) serves it:
every arm's champion exposes, the click model clicks, and the month lands as Parquet. Without it (production) the
month must have landed already (landing/impressions/month=YYYY-MM/): the step checks it and fails saying where it
looked; it never fabricates data."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from abpo.arms import versions as arm_versions
from abpo.monthly.common import StepResult, arms_of, dataset_and_splits
from abpo.monthly.report import month_completed
from abpo.months import Month
from abpo.sim.simulator import month_requests, simulate_month
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
    expected_ctr: str = ""  # the simulator's expected-CTR figures of the month (abpo.abtest.sim_ctr)

    def to_json(self) -> dict[str, Any]:  # the keys the DAG's serve task returned before
        if not self.simulated:
            return {"month": self.month, "files": self.files, "simulated": False}
        return {"month": self.month, "path": self.path, "seconds": self.seconds, "per_arm": self.per_arm}


def serve_month(cfg: Config, month: Month) -> ServeResult:
    """Month ``month``'s traffic served by every arm's champion (abpo.sim.simulate_month), landed as Parquet, and
    the simulator's expected CTR of each champion on the month's requests stored for the report
    (:func:`record_expected_ctr`)."""

    ds, splits = dataset_and_splits(cfg)
    arms = {a: arm_versions.load_arm(cfg, a, ds) for a in arms_of(cfg)}
    requests = month_requests(cfg, ds, splits, str(month))
    res = simulate_month(cfg, month, arms, dataset=ds, splits=splits, requests=requests)
    for a, v in res.per_arm.items():
        ctr = "-" if v["ctr"] is None else f"{v['ctr']:.4f}"  # None: no request of the arm this month
        log.info(f"  {a:<11} {v['impressions']:>6} impressions {v['clicks']:>5} clicks  CTR {ctr}")
    figures = record_expected_ctr(cfg, str(month), requests, res, arms, ds)
    return ServeResult(
        str(month), True, path=str(res.path), seconds=res.seconds, per_arm=res.per_arm, expected_ctr=str(figures)
    )


def record_expected_ctr(cfg: Config, month: str, requests, res, arms, dataset):
    """Score each distinct champion that served ``month`` (abpo.monthly.sim_ctr.served_models) and the starting
    model on the month's scored requests (abpo.sim.expected_ctr.month_figures: Eq. H1 with the month's intercept,
    H2, H3, beside each arm's realised CTR) and store the figures (``<paths.root>/sim/expected_ctr/<month>.json``,
    written whole: a rerun of the month writes the same bytes). Returns the file's path."""
    from abpo.abtest.sim_ctr import write_month_figures
    from abpo.monthly.sim_ctr import served_models
    from abpo.sim.expected_ctr import month_figures

    t = time.perf_counter()
    models, arm_model, start = served_models(cfg, arms, dataset)
    figures = month_figures(
        cfg,
        month,
        requests,
        dataset=dataset,
        intercept=res.calibration["intercept"],
        arm_of_request=dict(zip(res.table.column("request_id").to_pylist(), res.table.column("arm").to_pylist())),
        models=models,
        arm_model=arm_model,
        start=start,
        realised=res.per_arm,
    )
    path = write_month_figures(cfg, month, figures)
    log.info(
        f"serve {month}: expected CTR of {len(models)} distinct model(s) on {figures['requests']['scored']} of "
        f"{len(requests)} requests ({figures['requests']['sample']}) in {time.perf_counter() - t:.1f}s: {path}"
    )
    return path


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
