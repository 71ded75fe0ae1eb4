"""arms.approval in the DAG's shape: the file reads the deployment config's key when it is parsed
(abpo.monthly.dag_settings.approval_of, as load_config reads it, checked on every preset), and with ``required`` each LLM arm's gate feeds an approval task that feeds its
promote (Airflow's human-in-the-loop operator: Approve / Reject, Reject by default when no one answers). With
``none`` the DAG is the one tests/dags/test_abpo_monthly.py checks, unchanged."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from abpo.paths import CONFIG_DIR

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "abpo_monthly.py"
PRESETS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "regimes")


def _dag_module():
    spec = importlib.util.spec_from_file_location("abpo_monthly_for_approval_test", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config(tmp_path, approval: str) -> Path:
    from abpo.config import load_config

    path = tmp_path / f"approval-{approval}.yaml"
    path.write_text(yaml.safe_dump(load_config("demo", [f"arms.approval={approval}"]).to_dict(), sort_keys=False))
    return path


def test_the_dag_reads_arms_approval_as_load_config_does(tmp_path, monkeypatch):
    from abpo.config import load_config
    from abpo.monthly.dag_settings import approval_of

    monkeypatch.delenv("ABPO_CONFIG", raising=False)
    dag = _dag_module()
    assert dag.ENV.approval_required is False  # the default preset (tiny): none
    for preset in PRESETS:
        assert approval_of(preset) == load_config(preset).arms.approval == "none", preset  # the demo unattended
    for approval in ("none", "required"):
        path = _config(tmp_path, approval)
        assert approval_of(str(path)) == load_config(path).arms.approval == approval
    assert approval_of(str(tmp_path / "missing.yaml")) == "none"  # every task fails on it at load anyway


@pytest.fixture
def approval_dag(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("ABPO_CONFIG", str(_config(tmp_path, "required")))
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    return bag.dags["abpo_monthly"]


def test_with_approval_required_each_llm_arm_waits_between_gate_and_promote(approval_dag):
    dag = approval_dag
    from abpo.arms.names import HOLDBACK_ARMS, LLM_ARMS, RANKER_ARMS

    llm = LLM_ARMS  # every LLM arm of abpo.arms.names has its task group (one not served skips)
    base = 5 + 4 * len(llm) + len(RANKER_ARMS) + len(HOLDBACK_ARMS)  # the DAG without approval (24 with six arms)
    assert len(dag.task_ids) == base + len(llm)  # and one approval task per LLM arm
    for arm in llm:
        approve = dag.get_task(f"{arm}.approve")
        assert type(approve).__name__ == "PromotionApproval" and approve.arm == arm
        assert approve.upstream_task_ids == {f"{arm}.gate"}
        assert approve.downstream_task_ids == {f"{arm}.promote"}
        assert dag.get_task(f"{arm}.promote").upstream_task_ids == {"resolve_month", f"{arm}.gate", f"{arm}.approve"}
        assert (approve.options, approve.defaults, approve.multiple) == (["Approve", "Reject"], ["Reject"], False)
        assert list(approve.serialized_params) == ["comment"]  # the form shows the comment, not the run's params
        assert approve.execution_timeout is not None  # the execute phase is bounded; the wait is response_timeout
    for other in ("ml_retrain.refit", "popularity.refit", "holdback.hold"):
        assert not any(t.endswith(".approve") for t in dag.get_task(other).downstream_task_ids)
