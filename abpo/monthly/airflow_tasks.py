"""What the abpo_monthly DAG's tasks do besides running their step (dags/abpo_monthly.py wires them): the run's config
(:func:`task_config`), the wrapper that fails a refusal at once (:func:`fail_fast`), the failure callback
(:func:`on_failure`), the month a run processes (:func:`month_to_process`) and the landing sensor's check
(:func:`landing_complete`), the skips (an arm not configured, a month with too few rows), and the champion Asset
events (:func:`announce_champion`, :func:`announce_hand_moves`).

Airflow-facing: it takes Airflow's task context (or its params, its outlet events) and raises Airflow's exceptions.
The DAG file imports it when it is parsed, so at import it loads nothing but abpo's dependency-free leaf modules (a
test checks); Airflow, the config, the steps and the warehouse are imported inside the functions, when a task runs
or the DAG is built (the tasks' preload, abpo.monthly.preload, imports every abpo module and leaves Airflow out). The
isolated-step operator is abpo.monthly.airflow_isolated, the approval task abpo.monthly.airflow_approval."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from abpo.arms.names import ARMS, LLM, RANKER, model_name  # the one registry of arms (dependency-free)
from abpo.monthly.overrides import check_overrides  # dependency-free

if TYPE_CHECKING:
    from airflow.sdk import Asset, AssetAlias

log = logging.getLogger("abpo.dags")

# the kinds whose champion can be moved (a holdback's never is: its alias has no outlet)
HAND_MOVABLE = (LLM, RANKER)


def task_config(params: dict[str, Any] | None = None):
    """The run's config: $ABPO_CONFIG (default ``tiny``) with the run's ``overrides`` param (``params``: the task
    context's, by default the running task's), checked against abpo.monthly.overrides.OVERRIDE_ALLOWED; the steps' log
    lines go to the task log, once each (abpo.logs.task_logging)."""
    from abpo.config import load_config
    from abpo.logs import task_logging

    task_logging(os.environ.get("ABPO_CONSOLE_PREFIX", ""))  # the steps' log lines in the task log, once each
    if params is None:
        from airflow.sdk import get_current_context

        params = get_current_context()["params"]
    return load_config(os.environ.get("ABPO_CONFIG", "tiny"), check_overrides(params.get("overrides") or []))


def fail_fast(fn):
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
                from abpo.registry import store_failure

                said = store_failure(e) or e  # a full disk or damaged store: its one line, not SQLAlchemy's 100
                raise AirflowFailException(
                    f"{type(said).__name__}: {said} (a refusal: retrying cannot help, not retried)"
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


def month_to_process(context, *, wait_for_landing: bool) -> str:
    """Task resolve_month: the month the run processes (``YYYY-MM``): the ``month`` param, else the month an
    asset-scheduled run's triggering event names in its extra, else the month before the run's logical date (a manual
    trigger without one: the run's own time). "" (every other task skipped, none failed) for a scheduled run whose
    month has not landed, unless the landing sensor waits for it (``wait_for_landing``; docs/operations.md,
    "Scheduling"). A refused override in the run's params fails here first."""
    check_overrides(context["params"].get("overrides") or [])  # a refused override fails the run's first task
    month = context["params"].get("month") or ""
    from abpo.months import Month

    if month:
        return str(Month.parse(month, "param month"))
    run = context.get("dag_run")
    for event in triggering_events(context):  # an asset-scheduled run: the month the ingestion says it landed
        if (getattr(event, "extra", None) or {}).get("month"):
            return str(Month.parse(str(event.extra["month"]), "the triggering asset event's extra month"))
    # a manual trigger without a logical date: the run's own time
    when = context.get("logical_date") or getattr(run, "run_after", None) or datetime.now()
    month = str(Month.of_date(when).previous())
    run_type = getattr(run, "run_type", None)
    if getattr(run_type, "value", run_type) == "scheduled" and not wait_for_landing:
        from abpo.monthly.common import landing_status

        landed, found = landing_status(task_config(context["params"]), month)
        if not landed:
            log.info(f"resolve_month: scheduled run for {month}: {found}; nothing to do, the run's tasks are skipped")
            return ""
    return month


def triggering_events(context) -> list:
    """The Asset events that triggered this run (an asset-scheduled run), oldest first; [] otherwise."""
    events = context.get("triggering_asset_events") or {}
    try:
        return [e for evs in events.values() for e in evs]
    except Exception:  # noqa: BLE001 - not an asset-triggered run
        return []


def landing_complete(params: dict[str, Any], month: str, marker: str) -> bool:
    """The landing sensor's check ($ABPO_WAIT_FOR_LANDING=1): whether month ``month``'s landing partition is complete
    (its files and the marker ``marker``, abpo.monthly.common.landing_status), or the simulator serves the month (the
    ``simulate`` param)."""
    if params.get("simulate"):
        return True
    from abpo.monthly.common import landing_status

    done, found = landing_status(task_config(params), month, marker)
    log.info(f"landed {month}: {found}")
    return done


def skip_unless_configured(cfg, arm: str) -> None:
    """Skip the task (AirflowSkipException) of an arm that is not in the config's arms.names."""
    from airflow.sdk.exceptions import AirflowSkipException

    if arm not in cfg.arms.names:
        raise AirflowSkipException(f"arm {arm} is not in arms.names {cfg.arms.names}")


@contextlib.contextmanager
def skipped_without_feedback() -> Iterator[None]:
    """Around an update step: a month with too few rows of a stratum (abpo.monthly.common.NotEnoughFeedback) skips
    the task (AirflowSkipException): the arm keeps its champion; register/gate/promote are skipped too."""
    from airflow.sdk.exceptions import AirflowSkipException

    from abpo.monthly.common import NotEnoughFeedback

    try:
        yield
    except NotEnoughFeedback as e:
        raise AirflowSkipException(str(e)) from e


def champion_asset(arm: str, namespace: str) -> Asset:
    """The arm's champion as an Asset (``namespace``: paths.namespace, $ABPO_NAMESPACE): a deploy DAG scheduled on it
    runs when (and only when) the champion moved."""
    from airflow.sdk import Asset

    return Asset(name=f"abpo_champion_{arm}", uri=f"mlflow://models/{model_name(arm, namespace)}/champion")


def champion_alias(arm: str) -> AssetAlias:
    """The outlet of the step that may move the arm's champion (promote, refit). Through an alias, not the Asset
    itself: a task's Asset outlets get an event whenever the task succeeds, an alias only gets the events the task
    adds (:func:`announce_champion`), so a failed gate (the champion stays) fires nothing."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"abpo_champion_{arm}_moves")


def movable_champions() -> list[AssetAlias]:
    """The bootstrap task's outlets: the alias of every arm whose champion can move (:data:`HAND_MOVABLE`), for the
    events of :func:`announce_hand_moves`."""
    return [champion_alias(arm) for arm, e in ARMS.items() if e.kind in HAND_MOVABLE]


def announce_champion(outlet_events, arm: str, month: str, result: dict, *, namespace: str) -> bool:
    """Add the arm's champion Asset event when the step's result (PromoteResult / RefitResult ``to_json()``) says
    the champion moved, with the new version (and the one it replaced, the month, the model URI) in its extra;
    nothing otherwise. Returns whether an event was added."""
    if not result.get("moved"):
        return False
    version = str(result.get("champion_version") or result.get("version"))
    outlet_events[champion_alias(arm)].add(
        champion_asset(arm, namespace),
        extra={
            "arm": arm,
            "version": version,
            "previous_version": str(result.get("previous_version") or ""),
            "month": month,
            "model_uri": f"models:/{model_name(arm, namespace)}/{version}",
        },
    )
    return True


def announce_hand_moves(outlet_events, month: str, arms: dict, *, namespace: str) -> list[str]:
    """The bootstrap task's events: the champion Asset event of every arm whose champion was moved by hand in MLflow
    since the last recorded move (abpo.monthly.bootstrap.bootstrap_arms reports it as ``moved_by_hand``), so a deploy
    DAG listening to the champion follows a human's move too. Returns the arms announced."""
    done = []
    for arm, got in arms.items():
        hand = got.get("moved_by_hand") if isinstance(got, dict) else None
        if hand and announce_champion(
            outlet_events,
            arm,
            month,
            {"moved": True, "champion_version": hand["to"], "previous_version": hand["from"]},
            namespace=namespace,
        ):
            done.append(arm)
    return done
