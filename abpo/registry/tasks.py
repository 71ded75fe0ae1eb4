"""Task attempts: a pipeline task runs inside an MLflow run tagged with its task key.

A pipeline task (an arm's update, refit, gate, bootstrap) runs inside an MLflow run tagged with a task key: what it
does and on which inputs (arm, month, data hash, parent version, config hash). A retried or re-run task with the same
key finds the run that completed it and reuses its result instead of training or registering again; attempts that
never completed (a killed process leaves its run RUNNING) are marked KILLED, but only once their process is gone: an
attempt whose process is alive on this host is refused to the caller (TaskAttemptLive), so two attempts never train
side by side. An attempt superseded anyway (from another machine, which cannot see its process) records nothing
(:func:`require_current_attempt`). So a month re-run on the same data doubles nothing: one completed run per key, one
registered version per completed run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from abpo.registry import attempts
from abpo.registry.attempts import TASK_KEY_TAG
from abpo.registry.errors import TaskAttemptLive, TaskSuperseded
from abpo.registry.store import _ensure_experiment, configure

if TYPE_CHECKING:
    from abpo.config import Config

TASK_RESULT_ARTIFACT = "task_result.json"
TASK_DONE_TAG = "abpo.task_done"


def completed_task_run(cfg: Config, experiment: str, key: str):
    """The run of ``experiment`` that completed task ``key`` (status FINISHED and its result recorded), or None.
    Every other run with that key (RUNNING after a killed attempt, FAILED, or FINISHED without a result) is marked
    KILLED, so it is never mistaken for a live or completed attempt, unless its attempt's process is alive on this
    host (:func:`live_attempts`): then, with no completed run, TaskAttemptLive naming it, nothing marked. (Airflow
    runs one attempt of a task at a time; another machine's process cannot be seen, and its attempt, if it still
    runs, records nothing: :func:`require_current_attempt`.)"""
    from mlflow import MlflowClient

    configure(cfg)
    exp_id = _ensure_experiment(cfg, experiment)
    client = MlflowClient()
    runs = client.search_runs(
        [exp_id], filter_string=f"tags.`{TASK_KEY_TAG}` = '{key}'", order_by=["attributes.start_time DESC"]
    )
    done = [r for r in runs if r.info.status == "FINISHED" and r.data.tags.get(TASK_DONE_TAG) == "true"]
    live = live_attempts([r for r in runs if r not in done])
    if live and not done:
        r = live[0]
        raise TaskAttemptLive(
            f"task {key.rsplit(':', 1)[0]}: its attempt in MLflow run {r.info.run_id} (experiment "
            f"{experiment}) is still running ({attempts.describe(r.data.tags.get(attempts.ATTEMPT_TAG))}, started "
            f"{_since(r)}); rule: an attempt is superseded only when its process is gone; nothing was done (wait for "
            "it to end or stop it, then retry)"
        )
    for r in runs:
        if r not in done[:1] and r.info.status != "KILLED" and r not in live:
            client.set_terminated(r.info.run_id, status="KILLED")
            client.set_tag(
                r.info.run_id,
                attempts.SUPERSEDED_TAG,
                "an attempt of this task that did not complete"
                if not done
                else f"duplicate of completed run {done[0].info.run_id}",
            )
    return done[0] if done else None


def live_attempts(runs: list) -> list:
    """The runs of ``runs`` (none completed) whose attempt may still record a result: RUNNING, or FINISHED and not
    yet recorded (between the end of its training and its result), with its process alive on this host and not this
    process (an attempt of this process that did not complete is over)."""
    return [
        r
        for r in runs
        if r.info.status in ("RUNNING", "FINISHED")
        and not attempts.is_this_process(r.data.tags.get(attempts.ATTEMPT_TAG))
        and attempts.attempt_alive(r.data.tags.get(attempts.ATTEMPT_TAG))
    ]


def _since(run) -> str:
    from datetime import UTC, datetime

    ms = run.info.start_time
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds") if ms else "at an unknown time"


def require_current_attempt(run_id: str) -> None:
    """Before an attempt of this process writes into its task's run (reopens it, records its result): TaskSuperseded
    when the run was superseded while it ran (marked KILLED by another attempt) or another run completed the task
    meanwhile; then it must record nothing. A run this process did not start (an update's torchrun processes, a run
    recorded again later) is not checked."""
    from mlflow import MlflowClient

    client = MlflowClient()
    run = client.get_run(run_id)
    tags = run.data.tags or {}
    if not attempts.is_this_process(tags.get(attempts.ATTEMPT_TAG)) or TASK_DONE_TAG in tags:
        return
    key = tags.get(TASK_KEY_TAG, "")
    what = f"task {key.rsplit(':', 1)[0]}" if key else "a task"
    if tags.get(attempts.SUPERSEDED_TAG):
        raise TaskSuperseded(
            f"{what}: this attempt's MLflow run {run_id} was superseded while it ran ({tags[attempts.SUPERSEDED_TAG]});"
            " rule: a superseded attempt records nothing; its result is discarded (retry: the attempt that completed "
            "the task is reused)"
        )
    if key:
        other = [
            r
            for r in client.search_runs(
                [run.info.experiment_id],
                filter_string=f"tags.`{TASK_KEY_TAG}` = '{key}' and tags.`{TASK_DONE_TAG}` = 'true'",
            )
            if r.info.run_id != run_id and r.info.status == "FINISHED"
        ]
        if other:
            raise TaskSuperseded(
                f"{what}: MLflow run {other[0].info.run_id} completed it while this attempt (run {run_id}) ran; rule:"
                " one completed run per task; this attempt's result is discarded (retry: the completed run is reused)"
            )


def task_result(run) -> dict:
    """The result a completed task recorded (:func:`record_task_result`)."""
    import mlflow

    return mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/{TASK_RESULT_ARTIFACT}")


def record_task_result(run_id: str, result: dict) -> None:
    """Record ``result`` (JSON-safe) in the task's run and mark the task completed: the last step of a task, after
    everything it registers exists. An attempt superseded while it ran records nothing (TaskSuperseded,
    :func:`require_current_attempt`)."""
    from mlflow import MlflowClient

    require_current_attempt(run_id)
    client = MlflowClient()
    client.log_dict(run_id, result, TASK_RESULT_ARTIFACT)
    client.set_tag(run_id, TASK_DONE_TAG, "true")


def adopt_task_run(run_id: str, key: str, result: dict) -> None:
    """Record run ``run_id`` again as the completed run of task ``key`` with ``result``: for a completed task found by
    what it registered rather than by its key (a state relocated from a directory its old key hashed, a damaged
    record). Its key tag becomes ``key``, its result and done tag are written again, its status is FINISHED and a
    superseded mark (set while its record looked incomplete) is removed, so the next lookup by key finds it."""
    from mlflow import MlflowClient

    client = MlflowClient()
    client.set_tag(run_id, TASK_KEY_TAG, key)
    if attempts.SUPERSEDED_TAG in client.get_run(run_id).data.tags:
        client.delete_tag(run_id, attempts.SUPERSEDED_TAG)
    # written directly, not through record_task_result: the run completed its task (its version is registered), so
    # its attempt's supersession check does not apply to this second record of it
    client.log_dict(run_id, result, TASK_RESULT_ARTIFACT)
    client.set_tag(run_id, TASK_DONE_TAG, "true")
    client.set_terminated(run_id, status="FINISHED")
