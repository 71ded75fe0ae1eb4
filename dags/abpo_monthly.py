"""abpo_monthly: the monthly ABPO update of the LLM recommender from its own deployment logs.

Wiring only: every task calls one step of `abpo.pipeline` (heavy imports happen inside the tasks, so the file
parses in milliseconds). The month processed is the one that just ended (the run of 2026-03-01 processes
2026-02), or the `month` param of a manual trigger:

    airflow dags trigger abpo_monthly                      # the previous month
    airflow dags trigger abpo_monthly -c '{"month": "2024-01"}'

Config: the preset or YAML file in $ABPO_CONFIG (default `tiny`), plus the `overrides` param
(`["update.variant=grpo", ...]`). State lives where the config says (default var/ of the repo, or $ABPO_STATE).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task

DEFAULT_ARGS = {"retries": int(os.environ.get("ABPO_TASK_RETRIES", "1")), "retry_delay": timedelta(minutes=5)}


def _cfg():
    from abpo.config import load_config

    params = get_current_context()["params"]
    return load_config(os.environ.get("ABPO_CONFIG", "tiny"), list(params.get("overrides") or []))


def _plain(d: dict) -> dict:
    """XCom-safe copy (paths and other objects as strings)."""
    return {k: (v if isinstance(v, (int, float, bool, str, type(None), list, dict)) else str(v)) for k, v in d.items()}


@dag(
    dag_id="abpo_monthly",
    schedule="@monthly",
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["abpo", "recommender"],
    params={
        "month": Param("", type="string", description="YYYY-MM to process; empty = the month before the run."),
        "simulate_if_missing": Param(
            True, type="boolean",
            description="When nothing has landed for the month, land the offline bandit log of pi_init "
            "(ABPO_SPEC.md offline construction) instead of failing.",
        ),
        "overrides": Param([], type="array", description="Config overrides, e.g. [\"update.variant=grpo\"]."),
    },
    doc_md=__doc__,
)
def abpo_monthly():
    @task
    def resolve_month() -> str:
        ctx = get_current_context()
        month = ctx["params"].get("month") or ""
        if month:
            from abpo.data.schemas import check_month

            return check_month(month)
        return (ctx["logical_date"] - timedelta(days=1)).strftime("%Y-%m")

    @task
    def pi_init() -> dict:
        from abpo.pipeline import ensure_pi_init

        return _plain(ensure_pi_init(_cfg()))

    @task
    def land(month: str, init: dict) -> dict:
        from abpo.pipeline import land_bandit_log
        from abpo.warehouse import IngestError, Warehouse

        cfg = _cfg()
        try:
            files = Warehouse.landing_files(cfg.paths.resolve("landing"), month)
        except IngestError:  # no partition for the month yet
            files = []
        if files:
            return {"files": len(files), "simulated": False}
        if not get_current_context()["params"]["simulate_if_missing"]:
            raise FileNotFoundError(f"{cfg.paths.resolve('landing')}: nothing landed for month={month}")
        return _plain({**land_bandit_log(cfg, month), "simulated": True})

    @task
    def ingest(month: str, landed: dict) -> dict:
        from abpo.pipeline import ingest_and_validate

        return _plain(ingest_and_validate(_cfg(), month))

    @task
    def update(month: str, ingested: dict) -> dict:
        import dataclasses

        from abpo.pipeline import update_policy

        return _plain(dataclasses.asdict(update_policy(_cfg())))

    @task
    def register(month: str, updated: dict) -> str:
        from types import SimpleNamespace

        from abpo.pipeline import register_update

        return str(register_update(_cfg(), SimpleNamespace(**updated), month).version)

    @task
    def evaluate(updated: dict, init: dict) -> dict:
        from pathlib import Path

        from abpo.pipeline import evaluate_gate

        return evaluate_gate(_cfg(), Path(updated["model_dir"]), Path(init["model_dir"]))

    @task
    def promote(gate: dict, version: str) -> str:
        from abpo.pipeline import promote as promote_version

        if gate["passed"]:
            promote_version(_cfg(), version)
            return f"champion -> version {version}"
        return f"version {version} stays challenger ({gate['metric']} below the champion)"

    @task
    def report(month: str, promoted: str) -> dict:
        from abpo.abtest.report import report_from_warehouse
        from abpo.warehouse import Warehouse

        cfg = _cfg()
        with Warehouse(cfg.paths.resolve("warehouse")) as wh:
            months = [m for m in wh.months() if m <= month]
        _, files = report_from_warehouse(cfg, months)
        return {"html": str(files.html), "markdown": str(files.markdown), "png": str(files.png)}

    month = resolve_month()
    init = pi_init()
    landed = land(month, init)
    ingested = ingest(month, landed)
    updated = update(month, ingested)
    version = register(month, updated)
    gate = evaluate(updated, init)
    report(month, promote(gate, version))


abpo_monthly()
