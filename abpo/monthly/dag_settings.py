"""The deployment's settings of the abpo_monthly DAG (dags/abpo_monthly.py), read from the environment when the file
is parsed: every ``$ABPO_*`` variable the DAG's shape depends on (its retries and timeouts, the update tasks' pool and
queue, the isolated interpreter, the schedule, the landing sensor, the namespace of the champion Assets, whether the
LLM arms wait for an approval); docs/operations.md lists them. The workers read the others when a task runs.

Dependency-free (the DAG file imports it when it is parsed): the standard library, and abpo.paths, abpo.yamlfile,
yaml and airflow.sdk's Asset inside the functions that need them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

# abpo.months.MONTH_PATTERN (not imported: abpo.months is not among the modules the DAG file loads when parsed; a test
# checks they agree), or empty.
# Ends in (?![\s\S]), "no character follows", not $: JSON-schema validation searches with Python's re, where $ also
# matches before a trailing newline ("2026-01\n" passed); the lookahead means the same in JavaScript (the trigger form).
MONTH_PARAM_PATTERN = (
    "^(?:|(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(?:0[1-9]|1[0-2]))(?![\\s\\S])"  # year 0001-9999
)


@dataclasses.dataclass(frozen=True)
class DagSettings:
    """What :func:`dag_settings` read, one field per variable (docs/operations.md)."""

    # Every task has a timeout (a hung task fails and can be retried); the update tasks get their own, longer one and
    # run in the pool named by $ABPO_UPDATE_POOL (create it with `airflow pools set gpu <slots> "ABPO updates"` and
    # set ABPO_UPDATE_POOL=gpu on a GPU deployment; default_pool otherwise).
    # Retries are for transient errors only (a refusal fails at once: abpo.monthly.airflow_tasks.fail_fast), each
    # waiting longer than the one before (retry_delay, then times $ABPO_TASK_RETRY_BACKOFF, at most
    # $ABPO_TASK_MAX_RETRY_DELAY_MIN).
    default_args: dict[str, Any]
    update_timeout: timedelta
    update_pool: str
    # The Celery queue of the update tasks: $ABPO_UPDATE_QUEUE (e.g. gpu, the queue the GPU worker listens on:
    # `airflow celery worker --queues gpu`); "": Airflow's default queue. docs/deployment-celery.md
    update_queue: str
    # $ABPO_TASK_PYTHON: an absolute path to the python of another environment (a venv with abpo and its training
    # stack; it needs no Airflow): the heavy tasks (bootstrap's SFT, update, gate's evaluation) run there, through
    # Airflow's ExternalPythonOperator (abpo.monthly.airflow_isolated). "": every task runs in Airflow's own process.
    task_python: str
    # When a month starts. $ABPO_SCHEDULE: a cron string or preset (default @monthly), "none" (manual runs only), or
    # "asset:<name>" (a run whenever the team's ingestion emits Asset <name>; the event's extra {"month": "YYYY-MM"}
    # names the month, else the month before the event): :func:`schedule_of`.
    schedule: str
    # $ABPO_WAIT_FOR_LANDING=1 (off by default): a sensor waits, in reschedule mode (no worker slot held between
    # pokes), until the month's landing partition is complete: files and the marker $ABPO_LANDING_MARKER (default
    # _SUCCESS; empty: files suffice), poking every $ABPO_LANDING_POKE_S seconds (600) for at most
    # $ABPO_LANDING_TIMEOUT_H hours (72), then failing.
    wait_for_landing: bool
    landing_marker: str
    landing_poke: timedelta
    landing_timeout: timedelta
    # The deployment's environment prefix of MLflow names (paths.namespace, set through $ABPO_NAMESPACE so that the
    # DAG file, parsed without the config, names the same registered models as the tasks): docs/operations.md
    # "Namespaces"
    namespace: str
    # arms.approval (docs/gate.md "Approval") of $ABPO_CONFIG: "required" puts an approval task <arm>.approve between
    # each LLM arm's gate and promote; "none" (every preset's default): the DAG as without approval.
    approval_required: bool
    # $ABPO_ON_FAILURE=package.module:function is set: every task's on-failure callback calls it
    # (abpo.monthly.airflow_tasks.on_failure)
    on_failure_hook: bool


def dag_settings(environ: Mapping[str, str] = os.environ) -> DagSettings:
    """The DAG's settings from ``environ`` (the DAG file passes os.environ when it is parsed). ValueError for
    $ABPO_TASK_PYTHON set to a relative path (and int()/float()'s for a number that does not parse)."""
    default_args = {
        "retries": int(environ.get("ABPO_TASK_RETRIES", "1")),
        "retry_delay": timedelta(seconds=int(environ.get("ABPO_TASK_RETRY_DELAY_S", "300"))),
        "retry_exponential_backoff": float(environ.get("ABPO_TASK_RETRY_BACKOFF", "2")),
        "max_retry_delay": timedelta(minutes=int(environ.get("ABPO_TASK_MAX_RETRY_DELAY_MIN", "60"))),
        "execution_timeout": timedelta(minutes=int(environ.get("ABPO_TASK_TIMEOUT_MIN", "120"))),
    }
    update_timeout = timedelta(minutes=int(environ.get("ABPO_UPDATE_TIMEOUT_MIN", "720")))
    update_pool = environ.get("ABPO_UPDATE_POOL", "default_pool")
    update_queue = environ.get("ABPO_UPDATE_QUEUE", "").strip()
    task_python = environ.get("ABPO_TASK_PYTHON", "").strip()
    if task_python and not os.path.isabs(task_python):
        raise ValueError(
            f"ABPO_TASK_PYTHON={task_python!r}: rule: an absolute path to a python executable (e.g. "
            "/opt/abpo-train/bin/python), or unset to run every task in Airflow's own environment"
        )
    return DagSettings(
        default_args=default_args,
        update_timeout=update_timeout,
        update_pool=update_pool,
        update_queue=update_queue,
        task_python=task_python,
        schedule=environ.get("ABPO_SCHEDULE", "@monthly").strip(),
        wait_for_landing=environ.get("ABPO_WAIT_FOR_LANDING", "").strip().lower() in ("1", "true", "yes", "on"),
        landing_marker=environ.get("ABPO_LANDING_MARKER", "_SUCCESS"),
        landing_poke=timedelta(seconds=int(environ.get("ABPO_LANDING_POKE_S", "600"))),
        landing_timeout=timedelta(hours=float(environ.get("ABPO_LANDING_TIMEOUT_H", "72"))),
        namespace=environ.get("ABPO_NAMESPACE", ""),
        approval_required=approval_of(environ.get("ABPO_CONFIG", "tiny")) != "none",
        on_failure_hook=bool(environ.get("ABPO_ON_FAILURE", "").strip()),
    )


def schedule_of(value: str):
    """$ABPO_SCHEDULE as the DAG's schedule: None for "none", [Asset] for "asset:<name>", else the cron string."""
    if value.lower() == "none":
        return None
    if value.lower().startswith("asset:"):
        name = value.split(":", 1)[1].strip()
        if not name:
            raise ValueError(f"ABPO_SCHEDULE={value!r}: rule: asset:<the Asset name the ingestion emits>")
        from airflow.sdk import Asset

        return [Asset(name=name)]
    return value


def approval_of(config: str) -> str:
    """``arms.approval`` of the deployment's config ($ABPO_CONFIG: a preset name or a YAML file, resolved as
    abpo.config.preset_path does, with the files it extends), read when the DAG file is parsed because the DAG's shape
    depends on it: "required" adds an approval task per LLM arm (docs/gate.md "Approval"). The tasks read the same key
    through load_config (a test checks both agree on every preset); a run's overrides may not set it. Any value but
    "none" adds the tasks (a misspelt one fails every task at load anyway); a config that cannot be read gives "none"
    (every task fails at load then, nothing is promoted)."""
    import yaml

    from abpo.paths import CONFIG_DIR
    from abpo.yamlfile import config_chain

    path = config if config.endswith((".yaml", ".yml")) or os.path.exists(config) else CONFIG_DIR / f"{config}.yaml"
    try:
        chain = config_chain(path, CONFIG_DIR)  # the farthest parent first: the last file that sets the key wins
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: abpo.yamlfile.YAMLFileError
        return "none"
    value = "none"
    for _, raw in chain:
        arms = raw.get("arms")
        if isinstance(arms, dict) and "approval" in arms:
            value = arms["approval"]
    return "none" if value is None else str(value)
