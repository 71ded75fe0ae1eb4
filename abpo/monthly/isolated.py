"""The heavy steps of the monthly cycle run in a Python environment of their own (docs/deployment-celery.md,
"Isolated heavy steps"): ``bootstrap`` (pi_init's SFT), ``update`` (the arm's training) and ``gate`` (the
challenger's evaluation). With ``$ABPO_TASK_PYTHON`` set, dags/abpo_monthly.py runs these three tasks through
Airflow's ExternalPythonOperator (the operator behind ``@task.external_python``; abpo.monthly.airflow_isolated): the
task process on the Airflow worker starts that interpreter, which calls :func:`run_isolated` here; Airflow's own
environment then only parses the DAG and runs the light steps (serve, ingest, register, promote, refit, hold,
report).

Nothing here imports Airflow: the isolated environment needs abpo and its training stack (torch, transformers, TRL,
MLflow), not Airflow. What Airflow would decide from an exception (skip the arm, fail at once without retrying, retry)
comes back as a plain envelope, which the DAG's operator turns into Airflow's exceptions (:data:`SKIPPED`,
:data:`REFUSED`); an error that may be transient is raised as it is, so the interpreter exits non-zero and Airflow
retries the task as it would in-process (abpo.monthly.common.retry_or_fail decides which is which)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from abpo.logs import task_logging
from abpo.monthly.common import NotEnoughFeedback, retry_or_fail
from abpo.monthly.overrides import check_overrides
from abpo.monthly.steps import run_step

if TYPE_CHECKING:
    from abpo.config import Config

ISOLATED_STEPS = ("bootstrap", "update", "gate")
OK, SKIPPED, REFUSED = "ok", "skipped", "refused"


class NotConfigured(RuntimeError):
    """The arm is not in the config's arms.names: its task is skipped (as in-process)."""


def _bootstrap(cfg: Config, arm: str, month: str, upstream: Any) -> dict:
    return run_step("bootstrap", cfg, month).arms


def _step(step: str):
    def run(cfg: Config, arm: str, month: str, upstream: Any) -> dict:
        return run_step(step, cfg, month, arm=arm, upstream=upstream).to_json()

    return run


_STEPS = {"bootstrap": _bootstrap, "update": _step("update"), "gate": _step("gate")}
_NEEDS_ARM = ("update",)  # the in-process task of these skips an arm that is not configured


def run_isolated(
    step: str, *, month: str, arm: str = "", upstream: Any = None, overrides: list[str] | tuple = (), config: str = ""
) -> dict[str, Any]:
    """Run monthly step ``step`` (one of :data:`ISOLATED_STEPS`) for ``month`` (and ``arm``, fed the upstream task's
    result ``upstream``) with the config ``config`` (default ``$ABPO_CONFIG``, else ``tiny``) and the run's
    ``overrides`` (checked against abpo.monthly.overrides.OVERRIDE_ALLOWED, as every in-process task does).

    Returns ``{"status": "ok", "result": <the step's JSON result>}``, ``{"status": "skipped", "message": ...}`` (too
    few rows of a stratum: the arm keeps its champion; or an arm not configured) or ``{"status": "refused",
    "message": ...}`` (a refusal: retrying cannot help), each with the interpreter that ran it (``pid``, ``ppid``,
    ``python``: sys.executable, ``prefix``: sys.prefix). Any other exception is raised (a transient or unknown error:
    the orchestrator retries)."""
    from abpo.config import load_config

    if step not in _STEPS:
        raise ValueError(f"isolated step {step!r}: rule: one of {ISOLATED_STEPS}")
    task_logging(os.environ.get("ABPO_CONSOLE_PREFIX", ""))
    where = {"pid": os.getpid(), "ppid": os.getppid(), "python": sys.executable, "prefix": sys.prefix}
    try:
        cfg = load_config(config or os.environ.get("ABPO_CONFIG", "tiny"), check_overrides(list(overrides or [])))
        if step in _NEEDS_ARM and arm not in cfg.arms.names:
            raise NotConfigured(f"arm {arm} is not in arms.names {cfg.arms.names}")
        return {"status": OK, "result": _STEPS[step](cfg, arm, month, upstream), **where}
    except (NotEnoughFeedback, NotConfigured) as e:
        return {"status": SKIPPED, "message": str(e), **where}
    except Exception as e:
        if retry_or_fail(e) == "fail":
            return {"status": REFUSED, "message": f"{type(e).__name__}: {e}", **where}
        raise


# Exit codes of `python -m abpo.monthly.isolated` (the KubernetesPodOperator variant, docs/deployment-celery.md): the
# operator's skip_on_exit_code=EXIT_SKIPPED skips the task; EXIT_REFUSED fails it (a refusal: give the pod task
# retries only for transient errors, or none); any other non-zero code is an error that may be transient.
EXIT_OK, EXIT_REFUSED, EXIT_SKIPPED = 0, 98, 99


def main(argv: list[str] | None = None) -> int:
    """``python -m abpo.monthly.isolated STEP --month YYYY-MM [--arm ARM] [--upstream JSON] [--overrides JSON]
    [--xcom PATH]``: run one isolated step in this interpreter (a pod's container, a job), print the envelope of
    :func:`run_isolated` as JSON on the last line, write the step's result to ``--xcom`` (a KubernetesPodOperator reads
    /airflow/xcom/return.json), and exit with EXIT_OK / EXIT_SKIPPED / EXIT_REFUSED."""
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m abpo.monthly.isolated", description=main.__doc__)
    p.add_argument("step", choices=ISOLATED_STEPS)
    p.add_argument("--month", required=True)
    p.add_argument("--arm", default="")
    p.add_argument("--upstream", default="null", help="the upstream task's result, as JSON")
    p.add_argument("--overrides", default="[]", help="the run's overrides param, as a JSON list")
    p.add_argument("--xcom", default="", help="write the step's result (JSON) here, e.g. /airflow/xcom/return.json")
    args = p.parse_args(argv)
    out = run_isolated(
        args.step,
        month=args.month,
        arm=args.arm,
        upstream=json.loads(args.upstream),
        overrides=json.loads(args.overrides),
    )
    if args.xcom and out["status"] == OK:
        Path(args.xcom).parent.mkdir(parents=True, exist_ok=True)
        Path(args.xcom).write_text(json.dumps(out["result"]))
    print(json.dumps(out), flush=True)
    return {OK: EXIT_OK, SKIPPED: EXIT_SKIPPED}.get(out["status"], EXIT_REFUSED)


if __name__ == "__main__":
    sys.exit(main())
