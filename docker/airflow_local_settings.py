"""Airflow cluster policy of the docker-compose stack (copied to $AIRFLOW_HOME/config/ by the Dockerfile).

The DAG puts its update tasks into the pool ``$ABPO_UPDATE_POOL`` and knows nothing of the deployment. On the GPU
deployment (compose profile ``gpu``) ``$ABPO_UPDATE_QUEUE`` is set, and this policy sends every task of that pool to
that queue on ``$ABPO_UPDATE_EXECUTOR`` (default CeleryExecutor), where the GPU worker listens; every other task
stays on the default executor (the scheduler's LocalExecutor). Without ``$ABPO_UPDATE_QUEUE`` it changes nothing:
the CPU path. A queue set while the executor is not configured ([core] executor) is a policy violation, so the DAG
shows an import error naming the fix instead of queueing tasks nobody runs.
"""

from __future__ import annotations

import os

DEFAULT_POOL = "default_pool"


def _configured_executors() -> list[str]:
    from airflow.configuration import conf

    return [e.strip().split(".")[-1].split(":")[-1] for e in conf.get("core", "executor").split(",") if e.strip()]


def update_route(pool: str) -> tuple[str, str] | None:
    """(queue, executor) for a task in ``pool``, or None to leave the task alone."""
    queue = os.environ.get("ABPO_UPDATE_QUEUE", "").strip()
    update_pool = os.environ.get("ABPO_UPDATE_POOL", DEFAULT_POOL).strip() or DEFAULT_POOL
    if not queue or pool != update_pool:
        return None
    if update_pool == DEFAULT_POOL:  # would send every task to the GPU worker
        from airflow.exceptions import AirflowClusterPolicyViolation

        raise AirflowClusterPolicyViolation(
            f"ABPO_UPDATE_QUEUE={queue} needs a pool of its own: set ABPO_UPDATE_POOL (e.g. gpu), not {DEFAULT_POOL}"
        )
    return queue, os.environ.get("ABPO_UPDATE_EXECUTOR", "").strip() or "CeleryExecutor"


def task_policy(task) -> None:
    route = update_route(task.pool)
    if route is None:
        return
    queue, executor = route
    if executor not in _configured_executors():
        from airflow.exceptions import AirflowClusterPolicyViolation

        raise AirflowClusterPolicyViolation(
            f"task {task.task_id}: ABPO_UPDATE_QUEUE={queue} routes the pool {task.pool} to {executor}, which is "
            f"not among the configured executors {_configured_executors()}; set AIRFLOW_EXECUTOR="
            f"LocalExecutor,{executor} (docker-compose .env) or unset ABPO_UPDATE_QUEUE"
        )
    task.queue = queue
    task.executor = executor
