"""``abpo arms month``: the whole monthly cycle in one process, running the steps of abpo.monthly.steps.STEPS in
their order, as the Airflow DAG runs them as tasks (bootstrap -> serve -> ingest -> per LLM arm update, register,
gate, promote -> per ranker arm refit -> per holdback arm hold, which trains nothing -> report)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from abpo.arms.names import entry
from abpo.monthly import steps
from abpo.monthly.bootstrap import BootstrapResult, bootstrap
from abpo.monthly.common import NotEnoughFeedback, StepResult, arms_of
from abpo.monthly.gate import gate_arm
from abpo.monthly.hold import hold_arm
from abpo.monthly.ingest import IngestResult, ingest_and_validate
from abpo.monthly.promote import promote_arm
from abpo.monthly.refit import refit_ranker_arm
from abpo.monthly.register import register_update
from abpo.monthly.report import ReportResult, report_to_date
from abpo.monthly.serve import ServeResult, serve
from abpo.monthly.update import update_llm_arm
from abpo.months import Month

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
        out = {"month": self.month, "bootstrap": self.bootstrap.arms if self.bootstrap else None,
               "serve": self.serve.to_json() if self.serve else None,
               "ingest": self.ingest.to_json() if self.ingest else None}
        for arm, done in self.arms.items():
            out[arm] = {k: (v.to_json() if isinstance(v, StepResult) else v) for k, v in done.items()}
        out["report"] = self.report.to_json() if self.report else None
        out["ran"] = list(self.ran)
        return out


def _arm_chain(cfg, arm: str, month: Month, ingested: IngestResult, res: MonthResult) -> None:
    """The arm's steps (abpo.monthly.steps.PER_ARM of its kind), each fed the one before."""
    done: dict[str, Any] = {}
    upstream: Any = ingested
    for name in steps.PER_ARM[entry(arm).kind]:
        if name == "update":
            try:
                upstream = update_llm_arm(cfg, arm, month)
            except NotEnoughFeedback as e:  # the arm keeps its champion; register/gate/promote are skipped too
                log.info(f"update {arm}: skipped: {e}")
                done["skipped"] = str(e)
                res.ran.append(f"{arm}.{name} (skipped)")
                break
        elif name == "register":
            upstream = register_update(cfg, arm, upstream)
        elif name == "gate":
            upstream = gate_arm(cfg, arm, upstream.version, month)
        elif name == "promote":
            upstream = promote_arm(cfg, arm, upstream, str(month))
        elif name == "refit":
            upstream = refit_ranker_arm(cfg, arm, month)
        elif name == "hold":
            upstream = hold_arm(cfg, arm, month)
        else:
            raise ValueError(f"run_month: no runner for step {name!r} of abpo.monthly.steps")
        done[name] = upstream
        res.ran.append(f"{arm}.{name}")
    res.arms[arm] = done


def run_month(cfg, month: str, *, simulate: bool = True, force: bool = False) -> MonthResult:
    """The whole cycle for ``month`` in one process; ``simulate``: the simulator serves the month (else it must have
    landed); ``force``: start over on a store that lost the arms (abpo.monthly.bootstrap.require_registry). A
    completed month run again changes nothing: its serve and ingest stand, every task finds its completed run."""
    month = Month(month)
    res = MonthResult(str(month))
    for name in steps.ONCE:
        if name == "bootstrap":
            res.bootstrap = bootstrap(cfg, month, force=force)
        elif name == "serve":
            res.serve = serve(cfg, month, simulate=simulate)
        elif name == "ingest":
            res.ingest = ingest_and_validate(cfg, month)
        res.ran.append(name)
    for kind in steps.PER_ARM:  # every LLM arm's chain, then every ranker arm's, then the holdback's, as the DAG
        for arm in arms_of(cfg):
            if entry(arm).kind == kind:
                _arm_chain(cfg, arm, month, res.ingest, res)
    for name in steps.LAST:
        res.report = report_to_date(cfg, month)
        res.ran.append(name)
    return res
