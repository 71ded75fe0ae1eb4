"""abpo_monthly: the continual monthly cycle of the arms of abpo.arms.names.ARMS (abpo, grpo, grpo_cr, wll,
ml_retrain, popularity, holdback). Every arm has its task group; the tasks of an arm not in the config's arms.names
are skipped (the demo runs six: abpo, grpo, wll, ml_retrain, popularity, holdback).

Wiring only: every task is one step of `abpo.monthly`, named like the step's module (abpo/monthly/<task>.py), in the
order of abpo.monthly.steps.STEPS, the list `abpo arms month` runs too (heavy imports happen inside the tasks, so the
file parses in milliseconds). For month m:

    resolve_month -> bootstrap (refuses when an earlier month was ingested but never finished; arms without a
    champion get one) -> serve (simulate: param) -> ingest (+ GX)
    -> per LLM arm: update (from the arm's champion on month m's logs; arms.update_logs: every arm's, or its own)
       -> register (the challenger) -> gate (against the arm's champion) [-> approve: with arms.approval =
       required, a human approves or rejects a challenger that passed the gate, in the Airflow UI] -> promote (only
       when the gate passed, and approved when approval is required)
    -> per ranker arm: refit (on the interactions and clicks to date; registered and made champion at once, a refit
       has no gate)
    -> per holdback arm: hold (serves pi_init, never trains: the task checks its champion is still pi_init and
       records why nothing was trained)
    -> report (every month to date, all arms, sample-ratio check on report.arm_shares)

A month with too few rows of a stratum (arms.min_rows_per_stratum) skips an LLM arm's update and the steps after it:
the arm keeps its champion.

The month processed is the one that just ended (the run of 2026-03-01 processes 2026-02), or the `month` param:

    airflow dags trigger abpo_monthly                                     # the previous month
    airflow dags trigger abpo_monthly -c '{"month": "2026-01"}'           # logs already landed for 2026-01
    airflow dags trigger abpo_monthly -c '{"month": "2026-01", "simulate": true}'   # the simulator serves it

`serve` never fabricates data unless `simulate` is true: without it the month must have landed
(landing/impressions/month=YYYY-MM/), else the task fails and says where it looked.
Config: the preset or YAML file in $ABPO_CONFIG (default `tiny`), plus the run's `overrides` param, limited to
abpo.monthly.overrides.OVERRIDE_ALLOWED:

    airflow dags trigger abpo_monthly -c '{"month": "2026-01", "overrides": ["update.learning_rate=3e-5"]}'

Whoever may trigger the DAG may tune the month's work (the simulator, the data's sizes and seeds, the SFT's and the
update's hyperparameters within their ranges, the rankers' settings, the report's presentation, the CPU threads),
never where state lives, the tracking URI, the dataset, the warehouse's settings, the data contract, the model, the
arms that run, the gate's settings or the report's sample-ratio and integrity checks (those belong to the
deployment's config file and environment). The param's JSON schema refuses any other key when the run is triggered,
and every task checks again.
State lives where the config says (default var/ of the repo, or $ABPO_STATE).
Tasks pass months and registry version numbers, never local paths.

Operations (docs/operations.md): a *scheduled* run whose month has not landed does nothing (its tasks are skipped,
none fails or retries), so unpausing the DAG never starts a failing month; $ABPO_WAIT_FOR_LANDING=1 adds a sensor
(reschedule mode) that waits for the landing partition to be complete instead; $ABPO_SCHEDULE=asset:<name> runs a
month whenever the team's ingestion emits that Asset. A refusal (bad input, nothing landed, a refused month, a config
that breaks the series) fails its task at once; transient errors are retried with exponential backoff
(abpo.monthly.common.retry_or_fail decides). $ABPO_ON_FAILURE=package.module:function is called on every task failure.

Several machines (docs/deployment-celery.md): $ABPO_UPDATE_QUEUE=gpu puts the update tasks on the Celery queue the GPU
worker listens on; $ABPO_TASK_PYTHON=/abs/path/to/python runs bootstrap (SFT), update and gate (evaluation) in that
interpreter's environment (ExternalPythonOperator, abpo.monthly.isolated). Both unset: as above, one process per task.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import Asset, Param, TaskGroup, dag, get_current_context, task

from abpo.arms.names import ARMS  # the one registry of arms (dependency-free)

# what the tasks do besides their step: the run's config, refusals failing at once, the failure hook, the month a run
# processes, the landing check, the skips, the champion Asset events (imports only airflow.sdk and the leaf modules)
from abpo.monthly.airflow_tasks import (
    announce_champion,
    announce_hand_moves,
    champion_alias,
    fail_fast,
    landing_complete,
    month_to_process,
    movable_champions,
    on_failure,
    skip_unless_configured,
    skipped_without_feedback,
    task_config,
)

# the $ABPO_* settings the DAG's shape depends on, read now (docs/operations.md), and the month param's pattern
from abpo.monthly.dag_settings import MONTH_PARAM_PATTERN, dag_settings, schedule_of
from abpo.monthly.overrides import OVERRIDE_ALLOWED, OVERRIDE_PATTERN  # dependency-free

# the steps' order and table, which `abpo arms month` runs too (dependency-free: run_step imports a step when it runs)
from abpo.monthly.steps import PER_ARM, run_step

ENV = dag_settings(os.environ)  # retries, timeouts, the update pool and queue, $ABPO_TASK_PYTHON, the schedule, ...
# Every task has a timeout and retries for transient errors only (a refusal fails at once: fail_fast), with backoff;
# $ABPO_ON_FAILURE names a hook every failed task calls.
DEFAULT_ARGS = {**ENV.default_args, **({"on_failure_callback": on_failure} if ENV.on_failure_hook else {})}
UPDATE_QUEUE = {"queue": ENV.update_queue} if ENV.update_queue else {}  # unset: Airflow's default queue
# Assets the DAG produces (downstream DAGs can be scheduled on them): the clean impressions and each arm's champion.
CLEAN_IMPRESSIONS = Asset(name="abpo_clean_impressions", uri="abpo://warehouse/impressions")


@dag(
    dag_id="abpo_monthly",
    schedule=schedule_of(ENV.schedule),  # $ABPO_SCHEDULE
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["abpo", "recommender"],
    params={
        "month": Param(
            "",
            type="string",
            pattern=MONTH_PARAM_PATTERN,
            description="YYYY-MM to process (ASCII digits, month 01-12); empty = the month before the run.",
        ),
        "simulate": Param(
            False,
            type="boolean",
            description="Serve the month with the simulator (abpo.sim) before ingesting it. Off in production: "
            "the month must have landed.",
        ),
        "overrides": Param(
            [],
            type="array",
            items={"type": "string", "pattern": OVERRIDE_PATTERN},
            description='Config overrides, e.g. ["update.learning_rate=3e-5", "sim.requests_per_user=6"]. Allowed '
            "keys only: "
            + ", ".join(OVERRIDE_ALLOWED)
            + " (section.* = any key of that section); paths, the tracking URI, the dataset's location, the "
            "warehouse's settings, the data contract, the model, the arms that run, the gate's settings, the "
            "report's sample-ratio and integrity checks and the other sft / update keys belong to the deployment's "
            "config, not to a run; numeric keys are range-checked (update.learning_rate > 0, ...).",
        ),
    },
    doc_md=__doc__,
)
def abpo_monthly():
    @task.short_circuit
    @fail_fast
    def resolve_month() -> str:
        """The month the run processes; "" (every other task skipped, none failed) for a scheduled run whose month
        has not landed, unless the landing sensor waits for it (docs/operations.md, "Scheduling")."""
        return month_to_process(get_current_context(), wait_for_landing=ENV.wait_for_landing)

    @task(outlets=movable_champions())
    @fail_fast
    def bootstrap(month: str) -> dict:
        arms = run_step("bootstrap", task_config(), month).arms
        announce_hand_moves(get_current_context()["outlet_events"], month, arms, namespace=ENV.namespace)
        return arms

    @task
    @fail_fast
    def serve(month: str, arms: dict) -> dict:
        simulate = bool(get_current_context()["params"].get("simulate"))
        return run_step("serve", task_config(), month, simulate=simulate).to_json()

    @task(outlets=[CLEAN_IMPRESSIONS])
    @fail_fast
    def ingest(month: str, served: dict) -> dict:
        return run_step("ingest", task_config(), month).to_json()

    @task(pool=ENV.update_pool, execution_timeout=ENV.update_timeout, **UPDATE_QUEUE)
    @fail_fast
    def update(arm: str, month: str, ingested: dict) -> dict:
        cfg = task_config()
        skip_unless_configured(cfg, arm)
        with skipped_without_feedback():  # the arm keeps its champion; register/gate/promote are skipped too
            return run_step("update", cfg, month, arm=arm).to_json()

    @task
    @fail_fast
    def register(arm: str, month: str, updated: dict) -> dict:
        return run_step("register", task_config(), month, arm=arm, upstream=updated).to_json()

    @task
    @fail_fast
    def gate(arm: str, month: str, registered: dict) -> dict:
        return run_step("gate", task_config(), month, arm=arm, upstream=registered).to_json()

    @task
    @fail_fast
    def promote(arm: str, month: str, gated: dict, approval: dict | None = None) -> dict:
        out = run_step("promote", task_config(), month, arm=arm, upstream=gated, approval=approval).to_json()
        announce_champion(get_current_context()["outlet_events"], arm, month, out, namespace=ENV.namespace)
        return out

    @task
    @fail_fast
    def refit(arm: str, month: str, ingested: dict) -> dict:
        cfg = task_config()
        skip_unless_configured(cfg, arm)
        out = run_step("refit", cfg, month, arm=arm).to_json()
        announce_champion(get_current_context()["outlet_events"], arm, month, out, namespace=ENV.namespace)
        return out

    @task
    def hold(arm: str, month: str, ingested: dict) -> dict:
        cfg = task_config()
        skip_unless_configured(cfg, arm)
        return run_step("hold", cfg, month, arm=arm).to_json()

    @task(trigger_rule="none_failed")
    @fail_fast
    def report(month: str) -> dict:
        return run_step("report", task_config(), month).to_json()

    if ENV.task_python:  # the heavy steps in their own environment (the operator's import is not free at parse time)
        from abpo.monthly.airflow_isolated import isolated_task

        isolated = {"python": ENV.task_python, "namespace": ENV.namespace}
        bootstrap = isolated_task("bootstrap", outlets=movable_champions(), **isolated)
        update = isolated_task(
            "update", pool=ENV.update_pool, execution_timeout=ENV.update_timeout, **UPDATE_QUEUE, **isolated
        )
        gate = isolated_task("gate", **isolated)
    month = resolve_month()
    first = bootstrap(month)
    if ENV.wait_for_landing:  # defined only when asked for: the sensor decorator's import is not free at parse time

        @task.sensor(mode="reschedule", poke_interval=ENV.landing_poke, timeout=ENV.landing_timeout)
        @fail_fast
        def landed(month: str) -> bool:
            """Done when the month's landing partition is complete (or the simulator serves it)."""
            return landing_complete(get_current_context()["params"], month, ENV.landing_marker)

        landed(month) >> first
    ingested = ingest(month, serve(month, first))
    # per arm (a task group), the steps of its kind in order, each fed the one before; the last moves the champion
    step_tasks = dict(update=update, register=register, gate=gate, promote=promote, refit=refit, hold=hold)
    done = []
    for kind, chain in PER_ARM.items():
        for arm in (name for name, e in ARMS.items() if e.kind == kind):
            with TaskGroup(group_id=arm):
                upstream = ingested
                for step in chain:
                    t = step_tasks[step]
                    moves = step == chain[-1] and step != "hold"  # the holdback's champion never moves
                    t = t.override(outlets=[champion_alias(arm)]) if moves else t
                    if step == "promote" and ENV.approval_required:  # gate -> approve -> promote (fed both)
                        from abpo.monthly.airflow_approval import promotion_approval_operator  # only if asked

                        asked = promotion_approval_operator()(
                            task_id="approve",
                            arm=arm,
                            # the form's one field (the DAG's params are merged in by Airflow; the form shows this)
                            params={"comment": Param("", type="string", description="Why (optional): recorded.")},
                        )
                        upstream >> asked
                        upstream = t(arm, month, upstream, asked.output)
                    else:
                        upstream = t(arm, month, upstream)
            done.append(upstream)
    final = report(month)
    done >> final


abpo_monthly()
