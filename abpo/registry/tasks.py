"""Task attempts: a pipeline task runs inside an MLflow run tagged with its task key.

A pipeline task (an arm's update, refit, gate, bootstrap) runs inside an MLflow run tagged with a task key: what it
does and on which inputs (arm, month, data hash, parent version, config hash). A retried or re-run task with the same
key finds the run that completed it and reuses its result instead of training or registering again; attempts that
never completed (a killed process leaves its run RUNNING) are marked KILLED. So a month re-run on the same data
doubles nothing: one completed run per key, one registered version per completed run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from abpo.registry.store import _ensure_experiment, configure

if TYPE_CHECKING:
    from abpo.config import Config

TASK_KEY_TAG = "abpo.task_key"
TASK_RESULT_ARTIFACT = "task_result.json"
TASK_DONE_TAG = "abpo.task_done"


def completed_task_run(cfg: Config, experiment: str, key: str):
    """The run of ``experiment`` that completed task ``key`` (status FINISHED and its result recorded), or None.
    Every other run with that key (RUNNING after a killed attempt, FAILED, or FINISHED without a result) is marked
    KILLED, so it is never mistaken for a live or completed attempt. (Airflow runs one attempt of a task at a time.)"""
    from mlflow import MlflowClient

    configure(cfg)
    exp_id = _ensure_experiment(cfg, experiment)
    client = MlflowClient()
    runs = client.search_runs(
        [exp_id], filter_string=f"tags.`{TASK_KEY_TAG}` = '{key}'", order_by=["attributes.start_time DESC"]
    )
    done = [r for r in runs if r.info.status == "FINISHED" and r.data.tags.get(TASK_DONE_TAG) == "true"]
    for r in runs:
        if r not in done[:1] and r.info.status != "KILLED":
            client.set_terminated(r.info.run_id, status="KILLED")
            client.set_tag(
                r.info.run_id,
                "abpo.superseded",
                "an attempt of this task that did not complete"
                if not done
                else f"duplicate of completed run {done[0].info.run_id}",
            )
    return done[0] if done else None


def task_result(run) -> dict:
    """The result a completed task recorded (:func:`record_task_result`)."""
    import mlflow

    return mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/{TASK_RESULT_ARTIFACT}")


def record_task_result(run_id: str, result: dict) -> None:
    """Record ``result`` (JSON-safe) in the task's run and mark the task completed: the last step of a task, after
    everything it registers exists."""
    from mlflow import MlflowClient

    client = MlflowClient()
    client.log_dict(run_id, result, TASK_RESULT_ARTIFACT)
    client.set_tag(run_id, TASK_DONE_TAG, "true")
