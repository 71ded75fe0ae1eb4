"""$ABPO_TASK_PYTHON: the heavy tasks (bootstrap's SFT, update, gate's evaluation) run in another Python environment
through Airflow's ExternalPythonOperator (dags/abpo_monthly.py IsolatedStep, abpo.monthly.isolated); unset, every
task is the in-process one, as before. The update task is run here for real in a separate interpreter (a venv of its
own): a refusal fails the task at once, an arm that is not configured skips it; the slow Celery test
(test_celery_e2e.py) runs a whole month with the heavy steps isolated."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from airflow_services import separate_python

from abpo.arms.names import LLM_ARMS

DAGS = Path(__file__).resolve().parents[2] / "dags"
HEAVY = ("bootstrap", *(f"{a}.{s}" for a in LLM_ARMS for s in ("update", "gate")))  # every LLM arm of abpo.arms.names


def _bag(monkeypatch, **env):
    from airflow.dag_processing.dagbag import DagBag

    for k in ("ABPO_TASK_PYTHON", "ABPO_UPDATE_QUEUE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return DagBag(dag_folder=str(DAGS))


class _TaskInstance:
    """What the operator's execute uses of the task instance: xcom_push (recorded)."""

    def __init__(self):
        self.xcoms: dict[str, object] = {}

    def xcom_push(self, key: str, value) -> None:
        self.xcoms[key] = value


def _context(overrides: list[str], ti: _TaskInstance) -> dict:
    """The part of a task's context the operator reads (the run's params and task instance; the run id and date
    stand for the rest: Airflow's merge of the callable's arguments needs a context that is not empty)."""
    return {"params": {"overrides": overrides}, "ti": ti, "run_id": "manual__2026-02-01", "ds": "2026-02-01"}


def test_by_default_no_task_leaves_airflows_process(monkeypatch):
    from airflow.providers.standard.operators.python import ExternalPythonOperator

    dag = _bag(monkeypatch).dags["abpo_monthly"]
    assert not [t.task_id for t in dag.tasks if isinstance(t, ExternalPythonOperator)]
    assert dag.get_task("abpo.update").queue == "default"  # Airflow's default queue unless $ABPO_UPDATE_QUEUE


def test_the_heavy_tasks_run_in_the_task_python_and_keep_their_place(monkeypatch, tmp_path):
    from airflow.providers.standard.operators.python import ExternalPythonOperator

    plain = _bag(monkeypatch).dags["abpo_monthly"]
    python = "/opt/abpo-train/bin/python"  # checked when the task runs (the DAG processor may not have it)
    bag = _bag(monkeypatch, ABPO_TASK_PYTHON=python, ABPO_UPDATE_QUEUE="gpu")
    assert bag.import_errors == {}
    dag = bag.dags["abpo_monthly"]
    isolated = {t.task_id: t for t in dag.tasks if isinstance(t, ExternalPythonOperator)}
    assert sorted(isolated) == sorted(HEAVY)
    assert {t.python for t in isolated.values()} == {python}
    assert set(dag.task_ids) == set(plain.task_ids)
    for t in plain.tasks:  # the same edges, timeouts, pools and outlets as the in-process tasks
        mine = dag.get_task(t.task_id)
        assert mine.downstream_task_ids == t.downstream_task_ids and mine.upstream_task_ids == t.upstream_task_ids
        assert (mine.execution_timeout, mine.pool) == (t.execution_timeout, t.pool), t.task_id
        assert [a.name for a in mine.outlets] == [a.name for a in t.outlets], t.task_id
    assert {dag.get_task(f"{a}.update").queue for a in LLM_ARMS} == {"gpu"}
    assert dag.get_task("abpo.gate").queue == dag.get_task("ingest").queue == "default"


def test_a_relative_task_python_is_an_import_error_naming_the_rule(monkeypatch):
    bag = _bag(monkeypatch, ABPO_TASK_PYTHON="venv/bin/python")
    (error,) = bag.import_errors.values()
    assert "ABPO_TASK_PYTHON='venv/bin/python': rule: an absolute path" in str(error)


def test_the_update_task_runs_in_a_separate_interpreter(monkeypatch, tmp_path, abpo_only_config):
    """The real operator of the DAG's abpo.update / grpo.update tasks, executed: the step runs in the other
    environment's interpreter (its own process, a child of the task's, its own sys.prefix, no Airflow importable). With nothing bootstrapped
    the update refuses (no champion): the task fails at once, naming the reason and the interpreter; an arm outside
    arms.names is skipped, as in-process."""
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    env_dir = tmp_path / "train-env"
    python = separate_python(env_dir)
    dag = _bag(monkeypatch, ABPO_TASK_PYTHON=str(python), ABPO_STATE=str(tmp_path / "state"), ABPO_CONFIG="tiny").dags[
        "abpo_monthly"
    ]
    op = dag.get_task("abpo.update")
    op.op_kwargs = {**op.op_kwargs, "month": "2026-01", "upstream": {}}  # what rendering the XComArgs gives
    ti = _TaskInstance()
    with pytest.raises(AirflowFailException, match=rf"no champion.*isolated interpreter {python}: .*not retried"):
        op.execute(_context([], ti))
    where = ti.xcoms["isolated"]
    assert where["pid"] != os.getpid() and where["ppid"] == os.getpid()  # another process, started by the task
    assert where["python"] == str(python) and Path(where["prefix"]) == env_dir  # the other environment

    # arms.names is the deployment's design, not a trigger override: a config file that runs abpo alone
    monkeypatch.setenv("ABPO_CONFIG", str(abpo_only_config))
    op = dag.get_task("grpo.update")
    op.op_kwargs = {**op.op_kwargs, "month": "2026-01", "upstream": {}}
    ti = _TaskInstance()
    with pytest.raises(AirflowSkipException, match=r"arm grpo is not in arms.names \['abpo'\]"):
        op.execute(_context([], ti))
    assert Path(ti.xcoms["isolated"]["prefix"]) == env_dir
