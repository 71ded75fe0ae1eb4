"""``abpo arms month``: the whole monthly cycle in one process, running the steps of abpo.monthly.steps.STEPS in
their order, as the Airflow DAG runs them as tasks (bootstrap -> serve -> ingest -> per LLM arm update, register,
gate, promote -> per ranker arm refit -> per holdback arm hold, which trains nothing -> report)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from abpo.arms.names import entry
from abpo.monthly import steps
from abpo.monthly.bootstrap import BootstrapResult
from abpo.monthly.common import NotEnoughFeedback, StepResult, arms_of
from abpo.monthly.ingest import IngestResult
from abpo.monthly.report import ReportResult
from abpo.monthly.serve import ServeResult
from abpo.months import Month

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class MonthResult(StepResult):
    month: str
    bootstrap: BootstrapResult | None = None
    serve: ServeResult | None = None
    ingest: IngestResult | None = None
    arms: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # arm -> step -> result (or skipped)
    report: ReportResult | None = None
    ran: list[str] = dataclasses.field(default_factory=list)  # the steps run, in order ("<arm>.<step>" per arm)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "month": self.month,
            "bootstrap": self.bootstrap.arms if self.bootstrap else None,
            "serve": self.serve.to_json() if self.serve else None,
            "ingest": self.ingest.to_json() if self.ingest else None,
        }
        for arm, done in self.arms.items():
            out[arm] = {k: (v.to_json() if isinstance(v, StepResult) else v) for k, v in done.items()}
        out["report"] = self.report.to_json() if self.report else None
        out["ran"] = list(self.ran)
        return out


def _arm_chain(cfg: Config, arm: str, month: Month, ingested: IngestResult, res: MonthResult) -> None:
    """The arm's steps (abpo.monthly.steps.PER_ARM of its kind), each fed the one before."""
    done: dict[str, Any] = {}
    upstream: Any = ingested
    for name in steps.PER_ARM[entry(arm).kind]:
        try:
            upstream = steps.run_step(name, cfg, month, arm=arm, upstream=upstream)
        except NotEnoughFeedback as e:  # the update: the arm keeps its champion; register/gate/promote are skipped
            log.info(f"{name} {arm}: skipped: {e}")
            done["skipped"] = str(e)
            res.ran.append(f"{arm}.{name} (skipped)")
            break
        done[name] = upstream
        res.ran.append(f"{arm}.{name}")
    res.arms[arm] = done


def run_month(cfg: Config, month: str, *, simulate: bool = True, force: bool = False) -> MonthResult:
    """The whole cycle for ``month`` in one process; ``simulate``: the simulator serves the month (else it must have
    landed); ``force``: start over on a store that lost the arms (abpo.monthly.bootstrap.require_registry). A
    completed month run again changes nothing: its serve and ingest stand, every task finds its completed run. One
    month at a time per state: another month running on it is refused before anything is read (MonthBusy,
    abpo.monthly.month_lock)."""
    from abpo.monthly.month_lock import month_lock

    month = Month(month)
    if simulate:  # the simulator routes users by report.arm_shares: a split it would refuse at serve is refused here,
        from abpo.abtest.assignment import check_shares
        from abpo.config.errors import ConfigError  # before bootstrap registers anything

        try:
            check_shares(cfg.report.arm_shares, arms_of(cfg))
        except ValueError as e:
            raise ConfigError(f"month {month}: {e} (the simulated serve routes users by them); nothing was run") from e
    command = f"abpo arms month --month {month}" + (" --simulate" if simulate else "") + (" --force" if force else "")
    with month_lock(cfg, str(month), command):
        return _run_month(cfg, month, simulate=simulate, force=force)


def _run_month(cfg: Config, month: Month, *, simulate: bool, force: bool) -> MonthResult:
    res = MonthResult(str(month))
    options: dict[str, dict[str, Any]] = {"bootstrap": {"force": force}, "serve": {"simulate": simulate}}
    for name in steps.ONCE:
        setattr(res, name, steps.run_step(name, cfg, month, **options.get(name, {})))
        res.ran.append(name)
    ingested = res.ingest
    if ingested is None:  # the ingest step returns its result or raises: None here is a bug
        raise RuntimeError(f"month {month}: the ingest step returned no result; the arms' steps start from it")
    for kind in steps.PER_ARM:  # every LLM arm's chain, then every ranker arm's, then the holdback's, as the DAG
        for arm in arms_of(cfg):
            if entry(arm).kind == kind:
                _arm_chain(cfg, arm, month, ingested, res)
    for name in steps.LAST:
        setattr(res, name, steps.run_step(name, cfg, month))
        res.ran.append(name)
    return res
