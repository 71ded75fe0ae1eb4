"""The heavy tasks of the abpo_monthly DAG in another Python environment ($ABPO_TASK_PYTHON, docs/deployment-celery.md
"Isolated heavy steps"): bootstrap (pi_init's SFT), update and gate run through Airflow's ExternalPythonOperator
(:class:`IsolatedStep`), which starts that interpreter on :func:`isolated_step`, which calls
abpo.monthly.isolated.run_isolated there. :func:`isolated_task` makes the DAG's stand-in for the in-process task.

The DAG file calls it only when $ABPO_TASK_PYTHON is set: the operator's import is not free at parse time, so the
class is built on first use (:func:`isolated_step_operator`); importing this module imports no Airflow (the tasks'
preload, abpo.monthly.preload, imports every abpo module and leaves Airflow out)."""

from __future__ import annotations

import functools

from abpo.monthly.airflow_tasks import announce_hand_moves, log


def isolated_step(step: str, month: str, arm: str = "", upstream=None, overrides=()) -> dict:
    """The callable of an isolated task: Airflow copies this function's source into a script that $ABPO_TASK_PYTHON
    runs (so it is self-contained: it imports what it needs)."""
    from abpo.monthly.isolated import run_isolated

    return run_isolated(step, month=month, arm=arm, upstream=upstream, overrides=overrides)


@functools.cache
def isolated_step_operator() -> type:
    """The operator class of the isolated tasks, :class:`IsolatedStep` (an ExternalPythonOperator), built once."""
    from airflow.providers.standard.operators.python import ExternalPythonOperator

    class IsolatedStep(ExternalPythonOperator):
        """A heavy step in $ABPO_TASK_PYTHON (abpo.monthly.isolated.run_isolated): the interpreter's envelope becomes
        what the in-process task would have done: the step's result (XCom), a skip, or a refusal that fails at once
        (no retry); an interpreter that failed otherwise (a transient error, a crash) fails the task, retried. Where
        it ran (pid, ppid, python, prefix) is the task's XCom "isolated". ``namespace``: the champion Assets' (bootstrap
        announces the champions moved by hand)."""

        def __init__(self, *, namespace: str, **kwargs):
            super().__init__(**kwargs)
            self.namespace = namespace

        def execute(self, context):
            from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

            self.op_kwargs = {**self.op_kwargs, "overrides": list(context["params"].get("overrides") or [])}
            out = super().execute(context)
            where = {k: out.get(k) for k in ("pid", "ppid", "python", "prefix")}
            context["ti"].xcom_push(key="isolated", value=where)
            log.info(f"{self.task_id}: ran in {where['python']} (pid {where['pid']})")
            if out.get("status") == "skipped":
                raise AirflowSkipException(out["message"])
            if out.get("status") != "ok":
                raise AirflowFailException(
                    f"{out.get('message')} (a refusal, in the isolated interpreter "
                    f"{where['python']}: retrying cannot help, not retried)"
                )
            if self.op_kwargs["step"] == "bootstrap":
                announce_hand_moves(
                    context["outlet_events"], self.op_kwargs["month"], out["result"], namespace=self.namespace
                )
            return out["result"]

    return IsolatedStep


def isolated_task(step: str, *, python: str, namespace: str, **task_kwargs):
    """A stand-in for the decorated task ``step`` (called like it: ``(month)`` for bootstrap, ``(arm, month,
    upstream)`` otherwise) whose work runs in the interpreter ``python``; returns the task's output, as a decorated
    task does. ``task_kwargs``: the task's (outlets, pool, timeout, queue)."""

    def make(*args):
        kw = {"month": args[0]} if step == "bootstrap" else dict(zip(("arm", "month", "upstream"), args))
        return isolated_step_operator()(
            task_id=step,
            python=python,
            python_callable=isolated_step,
            expect_airflow=False,
            op_kwargs={"step": step, **kw},
            namespace=namespace,
            **task_kwargs,
        ).output

    return make
