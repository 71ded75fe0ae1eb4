"""The approval task ``<arm>.approve`` of the abpo_monthly DAG (arms.approval = required, docs/gate.md "Approval"):
Airflow's human-in-the-loop operator asking whether to promote the arm's challenger (:class:`PromotionApproval`).
What it asks and what its answer means are abpo.monthly.approval's, which needs no Airflow.

The DAG file asks for it only when the deployment's config requires approval: the operator's import is not free at
parse time, so the class is built on first use (:func:`promotion_approval_operator`); importing this module imports no
Airflow (the tasks' preload, abpo.monthly.preload, imports every abpo module and leaves Airflow out)."""

from __future__ import annotations

import functools
import logging
from datetime import datetime, timedelta

from abpo.monthly import approval as approvals  # dependency-free at import
from abpo.monthly.airflow_tasks import task_config


@functools.cache
def promotion_approval_operator() -> type:
    """The operator class of task ``<arm>.approve``, :class:`PromotionApproval` (a HITLOperator), built once."""
    from airflow.providers.standard.operators.hitl import HITLOperator

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

            cfg = task_config(context["params"])
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
            cfg = task_config(context["params"])
            ti = context["ti"]
            try:
                asked_at = ti.xcom_pull(task_ids=ti.task_id, key="asked_at") or ""
            except Exception:  # noqa: BLE001 - when it was asked is for the record only
                asked_at = ""
            answer = approvals.from_event(event, asked_at=str(asked_at), **self._common(context, cfg))
            logging.getLogger("abpo.dags").info(f"approve {self.arm}: {answer.sentence()}")
            return answer.to_json()

    return PromotionApproval
