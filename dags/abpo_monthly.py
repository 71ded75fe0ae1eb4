"""abpo_monthly: the continual monthly cycle of the arms (abpo, grpo, ml_retrain, popularity, holdback).

Wiring only: every task is one step of `abpo.monthly`, named like the step's module (abpo/monthly/<task>.py), in the
order of abpo.monthly.steps.STEPS, the list `abpo arms month` runs too (heavy imports happen inside the tasks, so the
file parses in milliseconds). For month m:

    resolve_month -> bootstrap (refuses when an earlier month was ingested but never finished; arms without a
    champion get one) -> serve (simulate: param) -> ingest (+ GX)
    -> per LLM arm (task group): update from the arm's champion on month m's logs (arms.update_logs: every arm's,
       or its own) -> register (challenger)
       -> gate (against the arm's champion) [-> approve: with arms.approval = required, a human approves or rejects
       a challenger that passed the gate in the Airflow UI] -> promote (only when the gate passed, and approved
       when approval is required); a month with too few rows of a stratum (arms.min_rows_per_stratum) skips the
       arm's group: it keeps its champion
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
(`["update.learning_rate=1e-4", ...]`), limited to OVERRIDE_ALLOWED: whoever may trigger the DAG may tune the month's
cycle (simulator, report, update hyperparameters within their ranges, seed), never where state lives, the tracking
URI, the warehouse's settings, the data contract, the gate's settings or the report's sample-ratio check (those belong
to the deployment's config file and environment). The
param's JSON schema refuses any other key when the run is triggered, and every task checks again.
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

import functools
import logging
import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, AssetAlias, Param, TaskGroup, dag, get_current_context, task

from abpo.arms.names import ARMS, LLM, RANKER, model_name  # the one registry of arms (dependency-free)
from abpo.monthly.overrides import OVERRIDE_ALLOWED, OVERRIDE_PATTERN, check_overrides  # dependency-free

# the steps' order and table, which `abpo arms month` runs too (dependency-free: run_step imports a step when it runs)
from abpo.monthly.steps import PER_ARM, run_step

# Every task has a timeout (a hung task fails and can be retried); the update tasks get their own, longer one and
# run in the pool named by $ABPO_UPDATE_POOL (create it with `airflow pools set gpu <slots> "ABPO updates"` and set
# ABPO_UPDATE_POOL=gpu on a GPU deployment; default_pool otherwise).
# Retries are for transient errors only (a refusal fails at once: _fail_fast), each waiting longer than the one before
# (retry_delay, then times $ABPO_TASK_RETRY_BACKOFF, at most $ABPO_TASK_MAX_RETRY_DELAY_MIN).
DEFAULT_ARGS = {
    "retries": int(os.environ.get("ABPO_TASK_RETRIES", "1")),
    "retry_delay": timedelta(seconds=int(os.environ.get("ABPO_TASK_RETRY_DELAY_S", "300"))),
    "retry_exponential_backoff": float(os.environ.get("ABPO_TASK_RETRY_BACKOFF", "2")),
    "max_retry_delay": timedelta(minutes=int(os.environ.get("ABPO_TASK_MAX_RETRY_DELAY_MIN", "60"))),
    "execution_timeout": timedelta(minutes=int(os.environ.get("ABPO_TASK_TIMEOUT_MIN", "120"))),
}
UPDATE_TIMEOUT = timedelta(minutes=int(os.environ.get("ABPO_UPDATE_TIMEOUT_MIN", "720")))
UPDATE_POOL = os.environ.get("ABPO_UPDATE_POOL", "default_pool")
# The Celery queue of the update tasks: $ABPO_UPDATE_QUEUE (e.g. gpu, the queue the GPU worker listens on:
# `airflow celery worker --queues gpu`); unset: Airflow's default queue (as before). docs/deployment-celery.md
UPDATE_QUEUE = os.environ.get("ABPO_UPDATE_QUEUE", "").strip()
# $ABPO_TASK_PYTHON: an absolute path to the python of another environment (a venv with abpo and its training stack;
# it needs no Airflow): the heavy tasks (bootstrap's SFT, update, gate's evaluation) run there, through Airflow's
# ExternalPythonOperator (abpo.monthly.isolated). Unset (default): every task runs in Airflow's own process, as before.
TASK_PYTHON = os.environ.get("ABPO_TASK_PYTHON", "").strip()
if TASK_PYTHON and not os.path.isabs(TASK_PYTHON):
    raise ValueError(
        f"ABPO_TASK_PYTHON={TASK_PYTHON!r}: rule: an absolute path to a python executable (e.g. "
        "/opt/abpo-train/bin/python), or unset to run every task in Airflow's own environment"
    )
# When a month starts. $ABPO_SCHEDULE: a cron string or preset (default @monthly), "none" (manual runs only), or
# "asset:<name>" (a run whenever the team's ingestion emits Asset <name>; the event's extra {"month": "YYYY-MM"}
# names the month, else the month before the event). $ABPO_WAIT_FOR_LANDING=1 (off by default): a sensor waits,
# in reschedule mode (no worker slot held between pokes), until the month's landing partition is complete: files
# and the marker $ABPO_LANDING_MARKER (default _SUCCESS; empty: files suffice), poking every $ABPO_LANDING_POKE_S
# seconds (600) for at most $ABPO_LANDING_TIMEOUT_H hours (72), then failing.
SCHEDULE_ENV = os.environ.get("ABPO_SCHEDULE", "@monthly").strip()
WAIT_FOR_LANDING = os.environ.get("ABPO_WAIT_FOR_LANDING", "").strip().lower() in ("1", "true", "yes", "on")
LANDING_MARKER = os.environ.get("ABPO_LANDING_MARKER", "_SUCCESS")
LANDING_POKE = timedelta(seconds=int(os.environ.get("ABPO_LANDING_POKE_S", "600")))
LANDING_TIMEOUT = timedelta(hours=float(os.environ.get("ABPO_LANDING_TIMEOUT_H", "72")))


def schedule_of(value: str):
    """$ABPO_SCHEDULE as the DAG's schedule: None for "none", [Asset] for "asset:<name>", else the cron string."""
    if value.lower() == "none":
        return None
    if value.lower().startswith("asset:"):
        name = value.split(":", 1)[1].strip()
        if not name:
            raise ValueError(f"ABPO_SCHEDULE={value!r}: rule: asset:<the Asset name the ingestion emits>")
        return [Asset(name=name)]
    return value


# Assets the DAG produces (downstream DAGs can be scheduled on them): the clean impressions and each arm's champion.
CLEAN_IMPRESSIONS = Asset(name="abpo_clean_impressions", uri="abpo://warehouse/impressions")


# The deployment's environment prefix of MLflow names (paths.namespace, set through $ABPO_NAMESPACE so that this file,
# parsed without the config, names the same registered models as the tasks): docs/operations.md "Namespaces"
NAMESPACE = os.environ.get("ABPO_NAMESPACE", "")


def approval_of(config: str) -> str:
    """``arms.approval`` of the deployment's config ($ABPO_CONFIG: a preset name or a YAML file, resolved as
    abpo.config.preset_path does), read when this file is parsed because the DAG's shape depends on it: "required"
    adds an approval task per LLM arm (docs/gate.md "Approval"). The tasks read the same key through load_config (a
    test checks both agree on every preset); a run's overrides may not set it. Any value but "none" adds the tasks
    (a misspelt one fails every task at load anyway); a config that cannot be read gives "none" (every task fails
    at load then, nothing is promoted)."""
    import yaml

    from abpo.paths import CONFIG_DIR

    path = config if config.endswith((".yaml", ".yml")) or os.path.exists(config) else CONFIG_DIR / f"{config}.yaml"
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return "none"
    arms = raw.get("arms") if isinstance(raw, dict) else None
    value = arms.get("approval", "none") if isinstance(arms, dict) else "none"
    return "none" if value is None else str(value)


# arms.approval (docs/gate.md "Approval"): "required" puts an approval task <arm>.approve between each LLM arm's gate
# and promote; "none" (every preset's default): the DAG as without approval.
APPROVAL_REQUIRED = approval_of(os.environ.get("ABPO_CONFIG", "tiny")) != "none"


def champion_asset(arm: str) -> Asset:
    """The arm's champion as an Asset: a deploy DAG scheduled on it runs when (and only when) the champion moved."""
    return Asset(name=f"abpo_champion_{arm}", uri=f"mlflow://models/{model_name(arm, NAMESPACE)}/champion")


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
    outlet_events[champion_alias(arm)].add(
        champion_asset(arm),
        extra={
            "arm": arm,
            "version": version,
            "previous_version": str(result.get("previous_version") or ""),
            "month": month,
            "model_uri": f"models:/{model_name(arm, NAMESPACE)}/{version}",
        },
    )
    return True


# the kinds whose champion can be moved (a holdback's never is: its alias has no outlet)
HAND_MOVABLE = (LLM, RANKER)


def announce_hand_moves(outlet_events, month: str, arms: dict) -> list[str]:
    """The bootstrap task's events: the champion Asset event of every arm whose champion was moved by hand in MLflow
    since the last recorded move (abpo.monthly.bootstrap.bootstrap_arms reports it as ``moved_by_hand``), so a deploy
    DAG listening to the champion follows a human's move too. Returns the arms announced."""
    done = []
    for arm, got in arms.items():
        hand = got.get("moved_by_hand") if isinstance(got, dict) else None
        if hand and announce_champion(
            outlet_events, arm, month, {"moved": True, "champion_version": hand["to"], "previous_version": hand["from"]}
        ):
            done.append(arm)
    return done


# abpo.months.MONTH_PATTERN (not imported: the file must parse without abpo; a test checks they agree), or empty.
# Ends in (?![\s\S]), "no character follows", not $: JSON-schema validation searches with Python's re, where $ also
# matches before a trailing newline ("2026-01\n" passed); the lookahead means the same in JavaScript (the trigger form).
MONTH_PARAM_PATTERN = (
    "^(?:|(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(?:0[1-9]|1[0-2]))(?![\\s\\S])"  # year 0001-9999
)


def _cfg():
    from abpo.config import load_config
    from abpo.logs import task_logging

    task_logging(os.environ.get("ABPO_CONSOLE_PREFIX", ""))  # the steps' log lines in the task log, once each
    params = get_current_context()["params"]
    return load_config(os.environ.get("ABPO_CONFIG", "tiny"), check_overrides(params.get("overrides") or []))


def _fail_fast(fn):
    """A task's callable whose refusals fail the task at once (AirflowFailException: no retry, whatever the retries
    left) while transient and unknown errors are raised as they are (retried with backoff):
    abpo.monthly.common.retry_or_fail decides."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            from airflow.sdk.exceptions import AirflowException, AirflowFailException

            if isinstance(e, AirflowException):  # Airflow's own (a skip, a sensor timeout) decide for themselves
                raise
            from abpo.monthly.common import retry_or_fail

            if retry_or_fail(e) == "fail":
                raise AirflowFailException(
                    f"{type(e).__name__}: {e} (a refusal: retrying cannot help, not retried)"
                ) from e
            raise

    return run


def on_failure(context) -> None:
    """Every task's on-failure callback when $ABPO_ON_FAILURE is set: calls the hook it names
    (package.module:attribute). An Airflow notifier (a BaseNotifier instance) is called with the context, as Airflow
    calls notifiers; any other callable with keywords month (YYYY-MM, or "" when not resolved yet), task (the task
    id), error (the exception, or None) and context."""
    from airflow.sdk import BaseNotifier

    from abpo.monthly.common import resolve_hook

    hook = resolve_hook(os.environ["ABPO_ON_FAILURE"])
    if isinstance(hook, BaseNotifier):
        hook(context)
        return
    ti = context.get("ti") or context.get("task_instance")
    month = ""
    try:
        month = (ti.xcom_pull(task_ids="resolve_month") if ti is not None else "") or ""
    except Exception:  # noqa: BLE001 - resolve_month did not run or failed: the param, if any
        pass
    month = month or (context.get("params") or {}).get("month") or ""
    hook(month=str(month), task=getattr(ti, "task_id", ""), error=context.get("exception"), context=context)


if os.environ.get("ABPO_ON_FAILURE", "").strip():
    DEFAULT_ARGS["on_failure_callback"] = on_failure


def isolated_step(step: str, month: str, arm: str = "", upstream=None, overrides=()) -> dict:
    """The callable of an isolated task: Airflow copies this function's source into a script that $ABPO_TASK_PYTHON
    runs (so it is self-contained: it imports what it needs)."""
    from abpo.monthly.isolated import run_isolated

    return run_isolated(step, month=month, arm=arm, upstream=upstream, overrides=overrides)


if TASK_PYTHON:  # defined only when asked for: the operator's import is not free at parse time
    from airflow.providers.standard.operators.python import ExternalPythonOperator

    class IsolatedStep(ExternalPythonOperator):
        """A heavy step in $ABPO_TASK_PYTHON (abpo.monthly.isolated.run_isolated): the interpreter's envelope becomes
        what the in-process task would have done: the step's result (XCom), a skip, or a refusal that fails at once
        (no retry); an interpreter that failed otherwise (a transient error, a crash) fails the task, retried. Where
        it ran (pid, ppid, python, prefix) is the task's XCom "isolated"."""

        def execute(self, context):
            from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

            self.op_kwargs = {**self.op_kwargs, "overrides": list(context["params"].get("overrides") or [])}
            out = super().execute(context)
            where = {k: out.get(k) for k in ("pid", "ppid", "python", "prefix")}
            context["ti"].xcom_push(key="isolated", value=where)
            logging.getLogger("abpo.dags").info(f"{self.task_id}: ran in {where['python']} (pid {where['pid']})")
            if out.get("status") == "skipped":
                raise AirflowSkipException(out["message"])
            if out.get("status") != "ok":
                raise AirflowFailException(
                    f"{out.get('message')} (a refusal, in the isolated interpreter "
                    f"{where['python']}: retrying cannot help, not retried)"
                )
            if self.op_kwargs["step"] == "bootstrap":
                announce_hand_moves(context["outlet_events"], self.op_kwargs["month"], out["result"])
            return out["result"]


if APPROVAL_REQUIRED:  # defined only when asked for: the operator's import is not free at parse time
    from airflow.providers.standard.operators.hitl import HITLOperator

    from abpo.monthly import approval as approvals  # dependency-free at import

    class PromotionApproval(HITLOperator):
        """Task ``<arm>.approve`` (arms.approval = required): when the arm's gate passed, asks a human in the Airflow
        UI (Browse > Required Actions, or the task's page) whether to promote, showing the gate's numbers
        (abpo.monthly.approval.request), and waits, without holding a worker slot, at most arms.approval_timeout;
        no answer by then is Reject (the scheduler applies the default). Its XCom is the answer
        (abpo.monthly.approval.Approval), which the arm's promote step obeys and records. A gate that failed asks
        nobody (decision not-asked), nor does a completed month run again (its promotion stands as recorded) or a run
        whose config says arms.approval = none (not-required)."""

        def __init__(self, *, arm: str, **kwargs):
            super().__init__(
                subject=f"Promote {arm}'s challenger?",  # the gate's versions are filled in when it asks
                options=[approvals.APPROVE, approvals.REJECT],
                defaults=[approvals.REJECT],
                multiple=False,
                response_timeout=timedelta(hours=72),  # replaced by arms.approval_timeout when the task asks
                **kwargs,
            )
            self.arm = arm

        def _common(self, context, cfg) -> dict:
            ti = context["ti"]
            return {"timeout": cfg.arms.approval_timeout, "task": ti.task_id, "run_id": ti.run_id}

        def execute(self, context):
            from datetime import UTC

            from abpo.config.values import duration_seconds

            cfg = _cfg()
            ti = context["ti"]
            log = logging.getLogger("abpo.dags")
            if cfg.arms.approval != "required":
                log.info(f"approve {self.arm}: arms.approval = {cfg.arms.approval}: nobody asked")
                return approvals.Approval(approvals.NOT_REQUIRED, **self._common(context, cfg)).to_json()
            gated = ti.xcom_pull(task_ids=f"{self.arm}.gate") or {}
            if not gated.get("passed"):
                log.info(f"approve {self.arm}: the gate did not pass v{gated.get('version')}: nothing to approve")
                return approvals.Approval(approvals.NOT_ASKED, **self._common(context, cfg)).to_json()
            month = ti.xcom_pull(task_ids="resolve_month") or ""
            from abpo.monthly.report import month_completed

            if month and month_completed(
                cfg, month
            ):  # a completed month run again: its promote step stands as recorded
                log.info(f"approve {self.arm}: month {month} completed before: its promotion stands, nobody asked")
                return approvals.Approval(approvals.NOT_ASKED, **self._common(context, cfg)).to_json()
            self.subject, self.body = approvals.request(self.arm, month, gated, cfg.arms.approval_timeout)
            self.response_timeout = timedelta(seconds=duration_seconds(cfg.arms.approval_timeout) or 0)
            ti.xcom_push(key="asked_at", value=datetime.now(UTC).isoformat(timespec="seconds"))
            log.info(f"approve {self.arm}: {self.subject} (waiting at most {cfg.arms.approval_timeout})")
            return super().execute(context)

        def execute_complete(self, context, event):
            if event.get("error_type") != "timeout":
                super().execute_complete(context, event)  # checks the chosen option (and the comment) as Airflow does
            cfg = _cfg()
            ti = context["ti"]
            try:
                asked_at = ti.xcom_pull(task_ids=ti.task_id, key="asked_at") or ""
            except Exception:  # noqa: BLE001 - when it was asked is for the record only
                asked_at = ""
            answer = approvals.from_event(event, asked_at=str(asked_at), **self._common(context, cfg))
            logging.getLogger("abpo.dags").info(f"approve {self.arm}: {answer.sentence()}")
            return answer.to_json()


def _isolated(step: str, **task_kwargs):
    """A stand-in for the decorated task ``step`` (called like it: ``(month)`` for bootstrap, ``(arm, month,
    upstream)`` otherwise) whose work runs in $ABPO_TASK_PYTHON; returns the task's output, as a decorated task does."""

    def make(*args):
        kw = {"month": args[0]} if step == "bootstrap" else dict(zip(("arm", "month", "upstream"), args))
        return IsolatedStep(
            task_id=step,
            python=TASK_PYTHON,
            python_callable=isolated_step,
            expect_airflow=False,
            op_kwargs={"step": step, **kw},
            **task_kwargs,
        ).output

    return make


def _skip_unless_configured(cfg, arm: str) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    if arm not in cfg.arms.names:
        raise AirflowSkipException(f"arm {arm} is not in arms.names {cfg.arms.names}")


@dag(
    dag_id="abpo_monthly",
    schedule=schedule_of(SCHEDULE_ENV),  # $ABPO_SCHEDULE (see SCHEDULE_ENV)
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
            description='Config overrides, e.g. ["arms.gate_margin=0.01"]. Allowed keys only: '
            + ", ".join(OVERRIDE_ALLOWED)
            + " (section.* = any key of that section); paths, the tracking URI, the "
            "dataset's location, the warehouse's settings, the data contract, the gate's settings, the report's "
            "sample-ratio check, the model and the other sft / update keys belong to the deployment's config, not to "
            "a run; numeric keys are range-checked (update.learning_rate > 0, ...).",
        ),
    },
    doc_md=__doc__,
)
def abpo_monthly():
    @task.short_circuit
    @_fail_fast
    def resolve_month() -> str:
        """The month the run processes; "" (every other task skipped, none failed) for a scheduled run whose month
        has not landed, unless the landing sensor waits for it (docs/operations.md, "Scheduling")."""
        ctx = get_current_context()
        check_overrides(ctx["params"].get("overrides") or [])  # a refused override fails the run's first task
        month = ctx["params"].get("month") or ""
        from abpo.months import Month

        if month:
            return str(Month.parse(month, "param month"))
        run = ctx.get("dag_run")
        for event in _triggering_events(ctx):  # an asset-scheduled run: the month the ingestion says it landed
            if (getattr(event, "extra", None) or {}).get("month"):
                return str(Month.parse(str(event.extra["month"]), "the triggering asset event's extra month"))
        # a manual trigger without a logical date: the run's own time
        when = ctx.get("logical_date") or getattr(run, "run_after", None) or datetime.now()
        month = str(Month.of_date(when).previous())
        run_type = getattr(run, "run_type", None)
        if getattr(run_type, "value", run_type) == "scheduled" and not WAIT_FOR_LANDING:
            from abpo.monthly.common import landing_status

            landed, found = landing_status(_cfg(), month)
            if not landed:
                logging.getLogger("abpo.dags").info(
                    f"resolve_month: scheduled run for {month}: {found}; nothing to do, the run's tasks are skipped"
                )
                return ""
        return month

    @task(outlets=[champion_alias(arm) for arm, e in ARMS.items() if e.kind in HAND_MOVABLE])
    @_fail_fast
    def bootstrap(month: str) -> dict:
        arms = run_step("bootstrap", _cfg(), month).arms
        announce_hand_moves(get_current_context()["outlet_events"], month, arms)
        return arms

    @task
    @_fail_fast
    def serve(month: str, arms: dict) -> dict:
        simulate = bool(get_current_context()["params"].get("simulate"))
        return run_step("serve", _cfg(), month, simulate=simulate).to_json()

    @task(outlets=[CLEAN_IMPRESSIONS])
    @_fail_fast
    def ingest(month: str, served: dict) -> dict:
        return run_step("ingest", _cfg(), month).to_json()

    @task(pool=UPDATE_POOL, execution_timeout=UPDATE_TIMEOUT, **({"queue": UPDATE_QUEUE} if UPDATE_QUEUE else {}))
    @_fail_fast
    def update(arm: str, month: str, ingested: dict) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        from abpo.monthly.common import NotEnoughFeedback

        cfg = _cfg()
        _skip_unless_configured(cfg, arm)
        try:
            return run_step("update", cfg, month, arm=arm).to_json()
        except NotEnoughFeedback as e:  # the arm keeps its champion; register/gate/promote are skipped too
            raise AirflowSkipException(str(e)) from e

    @task
    @_fail_fast
    def register(arm: str, month: str, updated: dict) -> dict:
        return run_step("register", _cfg(), month, arm=arm, upstream=updated).to_json()

    @task
    @_fail_fast
    def gate(arm: str, month: str, registered: dict) -> dict:
        return run_step("gate", _cfg(), month, arm=arm, upstream=registered).to_json()

    @task
    @_fail_fast
    def promote(arm: str, month: str, gated: dict, approval: dict | None = None) -> dict:
        out = run_step("promote", _cfg(), month, arm=arm, upstream=gated, approval=approval).to_json()
        announce_champion(get_current_context()["outlet_events"], arm, month, out)
        return out

    @task
    @_fail_fast
    def refit(arm: str, month: str, ingested: dict) -> dict:
        cfg = _cfg()
        _skip_unless_configured(cfg, arm)
        out = run_step("refit", cfg, month, arm=arm).to_json()
        announce_champion(get_current_context()["outlet_events"], arm, month, out)
        return out

    @task
    def hold(arm: str, month: str, ingested: dict) -> dict:
        cfg = _cfg()
        _skip_unless_configured(cfg, arm)
        return run_step("hold", cfg, month, arm=arm).to_json()

    @task(trigger_rule="none_failed")
    @_fail_fast
    def report(month: str) -> dict:
        return run_step("report", _cfg(), month).to_json()

    if TASK_PYTHON:  # the heavy steps in their own environment (abpo.monthly.isolated)
        bootstrap = _isolated(
            "bootstrap", outlets=[champion_alias(arm) for arm, e in ARMS.items() if e.kind in HAND_MOVABLE]
        )
        update = _isolated(
            "update",
            pool=UPDATE_POOL,
            execution_timeout=UPDATE_TIMEOUT,
            **({"queue": UPDATE_QUEUE} if UPDATE_QUEUE else {}),
        )
        gate = _isolated("gate")
    month = resolve_month()
    first = bootstrap(month)
    if WAIT_FOR_LANDING:  # defined only when asked for: the sensor decorator's import is not free at parse time

        @task.sensor(mode="reschedule", poke_interval=LANDING_POKE, timeout=LANDING_TIMEOUT)
        @_fail_fast
        def landed(month: str) -> bool:
            """Done when the month's landing partition is complete (or the simulator serves it)."""
            if get_current_context()["params"].get("simulate"):
                return True
            from abpo.monthly.common import landing_status

            done, found = landing_status(_cfg(), month, LANDING_MARKER)
            logging.getLogger("abpo.dags").info(f"landed {month}: {found}")
            return done

        landed(month) >> first
    ingested = ingest(month, serve(month, first))
    # per arm (a task group), the steps of its kind in order, each fed the one before; the last moves the champion
    step_tasks = {
        "update": update,
        "register": register,
        "gate": gate,
        "promote": promote,
        "refit": refit,
        "hold": hold,
    }
    done = []
    for kind, chain in PER_ARM.items():
        for arm in (name for name, e in ARMS.items() if e.kind == kind):
            with TaskGroup(group_id=arm):
                upstream = ingested
                for step in chain:
                    t = step_tasks[step]
                    moves = step == chain[-1] and step != "hold"  # the holdback's champion never moves
                    t = t.override(outlets=[champion_alias(arm)]) if moves else t
                    if step == "promote" and APPROVAL_REQUIRED:  # gate -> approve -> promote (fed both)
                        asked = PromotionApproval(
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


def _triggering_events(ctx) -> list:
    """The Asset events that triggered this run (an asset-scheduled run), oldest first; [] otherwise."""
    events = ctx.get("triggering_asset_events") or {}
    try:
        return [e for evs in events.values() for e in evs]
    except Exception:  # noqa: BLE001 - not an asset-triggered run
        return []


abpo_monthly()
