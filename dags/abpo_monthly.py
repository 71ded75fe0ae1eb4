"""abpo_monthly: the continual monthly cycle of the arms (abpo, grpo, ml_retrain, popularity, holdback).

Wiring only: every task is one step of `abpo.monthly`, named like the step's module (abpo/monthly/<task>.py), in the
order of abpo.monthly.steps.STEPS, the list `abpo arms month` runs too (heavy imports happen inside the tasks, so the
file parses in milliseconds). For month m:

    resolve_month -> bootstrap (refuses when an earlier month was ingested but never finished; arms without a
    champion get one) -> serve (simulate: param) -> ingest (+ GX)
    -> per LLM arm (task group): update from the arm's champion on month m's logs (arms.update_logs: every arm's,
       or its own) -> register (challenger)
       -> gate (against the arm's champion) -> promote (only when the gate passed); a month with too few rows of
       a stratum (arms.min_rows_per_stratum) skips the arm's group: it keeps its champion
    -> per ranker arm: refit on everything to date -> register (champion)
    -> per holdback arm: hold (serves pi_init, never trains: the task checks its champion is still pi_init and
       records why nothing was trained)
    -> report (every month to date, all arms, sample-ratio check on report.arm_shares)

The month processed is the one that just ended (the run of 2026-03-01 processes 2026-02), or the `month` param:

    airflow dags trigger abpo_monthly                                     # the previous month
    airflow dags trigger abpo_monthly -c '{"month": "2026-01"}'           # logs already landed for 2026-01
    airflow dags trigger abpo_monthly -c '{"month": "2026-01", "simulate": true}'   # the simulator serves it

`serve` never fabricates data unless `simulate` is true: without it the month must have landed
(landing/impressions/month=YYYY-MM/), else the task fails and says where it looked.
Config: the preset or YAML file in $ABPO_CONFIG (default `tiny`), plus the `overrides` param
(`["arms.gate_margin=0.01", ...]`), limited to OVERRIDE_ALLOWED: whoever may trigger the DAG may tune the month's
cycle (gate, simulator, report, update hyperparameters, seed), never where state lives, the tracking URI, the
warehouse's settings or the data contract (those belong to the deployment's config file and environment). The
param's JSON schema refuses any other key when the run is triggered, and every task checks again.
State lives where the config says (default var/ of the repo, or $ABPO_STATE).
Tasks pass months and registry version numbers, never local paths.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, AssetAlias, Param, TaskGroup, dag, get_current_context, task

from abpo.arms.names import ARMS, MODEL_PREFIX  # the one registry of arms (dependency-free)
from abpo.monthly.overrides import OVERRIDE_ALLOWED, OVERRIDE_PATTERN, check_overrides  # dependency-free
from abpo.monthly.steps import PER_ARM  # the steps' order, which `abpo arms month` runs too (dependency-free)

# Every task has a timeout (a hung task fails and can be retried); the update tasks get their own, longer one and
# run in the pool named by $ABPO_UPDATE_POOL (create it with `airflow pools set gpu <slots> "ABPO updates"` and set
# ABPO_UPDATE_POOL=gpu on a GPU deployment; default_pool otherwise).
DEFAULT_ARGS = {"retries": int(os.environ.get("ABPO_TASK_RETRIES", "1")),
                "retry_delay": timedelta(seconds=int(os.environ.get("ABPO_TASK_RETRY_DELAY_S", "300"))),
                "execution_timeout": timedelta(minutes=int(os.environ.get("ABPO_TASK_TIMEOUT_MIN", "120")))}
UPDATE_TIMEOUT = timedelta(minutes=int(os.environ.get("ABPO_UPDATE_TIMEOUT_MIN", "720")))
UPDATE_POOL = os.environ.get("ABPO_UPDATE_POOL", "default_pool")
# Assets the DAG produces (downstream DAGs can be scheduled on them): the clean impressions and each arm's champion.
CLEAN_IMPRESSIONS = Asset(name="abpo_clean_impressions", uri="abpo://warehouse/impressions")


def champion_asset(arm: str) -> Asset:
    """The arm's champion as an Asset: a deploy DAG scheduled on it runs when (and only when) the champion moved."""
    return Asset(name=f"abpo_champion_{arm}", uri=f"mlflow://models/{MODEL_PREFIX}{arm}/champion")


def champion_alias(arm: str) -> AssetAlias:
    """The outlet of the step that may move the arm's champion (promote, refit). Through an alias, not the Asset
    itself: a task's Asset outlets get an event whenever the task succeeds, an alias only gets the events the task
    adds (:func:`announce_champion`), so a failed gate (the champion stays) fires nothing."""
    return AssetAlias(name=f"abpo_champion_{arm}_moves")


def announce_champion(outlet_events, arm: str, month: str, result: dict) -> bool:
    """Add the arm's champion Asset event when the step's result (PromoteResult / RefitResult ``to_json()``) says
    the champion moved, with the new version (and the one it replaced, the month, the model URI) in its extra;
    nothing otherwise. Returns whether an event was added."""
    if not result.get("moved"):
        return False
    version = str(result.get("champion_version") or result.get("version"))
    outlet_events[champion_alias(arm)].add(champion_asset(arm), extra={
        "arm": arm, "version": version, "previous_version": str(result.get("previous_version") or ""),
        "month": month, "model_uri": f"models:/{MODEL_PREFIX}{arm}/{version}"})
    return True
# abpo.months.MONTH_PATTERN (not imported: the file must parse without abpo; a test checks they agree), or empty.
# Ends in (?![\s\S]), "no character follows", not $: JSON-schema validation searches with Python's re, where $ also
# matches before a trailing newline ("2026-01\n" passed); the lookahead means the same in JavaScript (the trigger form).
MONTH_PARAM_PATTERN = "^(?:|[0-9]{4}-(?:0[1-9]|1[0-2]))(?![\\s\\S])"


def _cfg():
    from abpo.config import load_config
    from abpo.logs import console

    console(os.environ.get("ABPO_CONSOLE_PREFIX", ""))  # the steps' log lines on the task's stdout
    params = get_current_context()["params"]
    return load_config(os.environ.get("ABPO_CONFIG", "tiny"), check_overrides(params.get("overrides") or []))


def _skip_unless_configured(cfg, arm: str) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    if arm not in cfg.arms.names:
        raise AirflowSkipException(f"arm {arm} is not in arms.names {cfg.arms.names}")


@dag(
    dag_id="abpo_monthly",
    # $ABPO_SCHEDULE overrides the cadence (a cron string, "@monthly", or "none" for manual runs only)
    schedule=None if os.environ.get("ABPO_SCHEDULE", "@monthly").lower() == "none" else os.environ.get(
        "ABPO_SCHEDULE", "@monthly"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["abpo", "recommender"],
    params={
        "month": Param("", type="string", pattern=MONTH_PARAM_PATTERN,
                       description="YYYY-MM to process (ASCII digits, month 01-12); empty = the month before the run."),
        "simulate": Param(
            False, type="boolean",
            description="Serve the month with the simulator (abpo.sim) before ingesting it. Off in production: "
            "the month must have landed.",
        ),
        "overrides": Param(
            [], type="array", items={"type": "string", "pattern": OVERRIDE_PATTERN},
            description="Config overrides, e.g. [\"arms.gate_margin=0.01\"]. Allowed keys only: "
            + ", ".join(OVERRIDE_ALLOWED) + " (section.* = any key of that section); paths, the tracking URI, the "
            "dataset's location, the warehouse's settings, the data contract, the model and the other sft / update "
            "keys belong to the deployment's config, not to a run."),
    },
    doc_md=__doc__,
)
def abpo_monthly():
    @task
    def resolve_month() -> str:
        ctx = get_current_context()
        month = ctx["params"].get("month") or ""
        from abpo.months import Month

        if month:
            return str(Month.parse(month, "param month"))
        # a manual trigger without a logical date: the run's own time
        when = ctx.get("logical_date") or getattr(ctx.get("dag_run"), "run_after", None) or datetime.now()
        return str(Month.of_date(when).previous())

    @task
    def bootstrap(month: str) -> dict:
        from abpo.monthly.bootstrap import bootstrap

        return bootstrap(_cfg(), month).arms

    @task
    def serve(month: str, arms: dict) -> dict:
        from abpo.monthly.serve import serve

        return serve(_cfg(), month, simulate=bool(get_current_context()["params"].get("simulate"))).to_json()

    @task(outlets=[CLEAN_IMPRESSIONS])
    def ingest(month: str, served: dict) -> dict:
        from abpo.monthly.ingest import ingest_and_validate

        return ingest_and_validate(_cfg(), month).to_json()

    @task(pool=UPDATE_POOL, execution_timeout=UPDATE_TIMEOUT)
    def update(arm: str, month: str, ingested: dict) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        from abpo.monthly.common import NotEnoughFeedback
        from abpo.monthly.update import update_llm_arm

        cfg = _cfg()
        _skip_unless_configured(cfg, arm)
        try:
            return update_llm_arm(cfg, arm, month).to_json()
        except NotEnoughFeedback as e:  # the arm keeps its champion; register/gate/promote are skipped too
            raise AirflowSkipException(str(e)) from e

    @task
    def register(arm: str, month: str, updated: dict) -> dict:
        from abpo.monthly.register import register_update
        from abpo.monthly.update import UpdateResult

        return register_update(_cfg(), arm, UpdateResult.from_json(updated)).to_json()

    @task
    def gate(arm: str, month: str, registered: dict) -> dict:
        from abpo.monthly.gate import gate_arm

        return gate_arm(_cfg(), arm, registered["version"], month).to_json()

    @task
    def promote(arm: str, month: str, gated: dict) -> dict:
        from abpo.monthly.gate import GateResult
        from abpo.monthly.promote import promote_arm

        out = promote_arm(_cfg(), arm, GateResult.from_json(gated)).to_json()
        announce_champion(get_current_context()["outlet_events"], arm, month, out)
        return out

    @task
    def refit(arm: str, month: str, ingested: dict) -> dict:
        from abpo.monthly.refit import refit_ranker_arm

        cfg = _cfg()
        _skip_unless_configured(cfg, arm)
        out = refit_ranker_arm(cfg, arm, month).to_json()
        announce_champion(get_current_context()["outlet_events"], arm, month, out)
        return out

    @task
    def hold(arm: str, month: str, ingested: dict) -> dict:
        from abpo.monthly.hold import hold_arm

        cfg = _cfg()
        _skip_unless_configured(cfg, arm)
        return hold_arm(cfg, arm, month).to_json()

    @task(trigger_rule="none_failed")
    def report(month: str) -> dict:
        from abpo.monthly.report import report_to_date

        return report_to_date(_cfg(), month).to_json()

    month = resolve_month()
    ingested = ingest(month, serve(month, bootstrap(month)))
    # per arm (a task group), the steps of its kind in order, each fed the one before; the last moves the champion
    step_tasks = {"update": update, "register": register, "gate": gate, "promote": promote, "refit": refit,
                  "hold": hold}
    done = []
    for kind, chain in PER_ARM.items():
        for arm in (name for name, e in ARMS.items() if e.kind == kind):
            with TaskGroup(group_id=arm):
                upstream = ingested
                for step in chain:
                    t = step_tasks[step]
                    moves = step == chain[-1] and step != "hold"  # the holdback's champion never moves
                    upstream = (t.override(outlets=[champion_alias(arm)]) if moves else t)(arm, month, upstream)
            done.append(upstream)
    final = report(month)
    done >> final


abpo_monthly()
