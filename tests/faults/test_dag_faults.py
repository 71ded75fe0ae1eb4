"""The DAG's params by the route a user takes (a triggered run's conf, validated by Airflow against each param's JSON
schema) and inside the tasks: config overrides only from an allow-list, the month strict (issue 18, items 2 and 6)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest

from abpo.monthly.overrides import check_overrides

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="abpo-airflow-home-"))
DAGS = Path(__file__).resolve().parents[2] / "dags"
EVIL = [
    "data.warehouse_memory_limit=1GB'; CREATE TABLE pwned AS SELECT 42 AS x; --",
    "data.warehouse_temp_directory=/tmp/x",
    "paths.root=/etc",
    "paths.mlflow_tracking_uri=http://attacker:5000",
    "update.deepspeed=/tmp/other-deepspeed.json",
    "policy.model=/tmp/x",
    "policy.tiny_layers=1",  # of policy.*, only policy.num_threads (CPU threads) is a run's business
    "data.dataset_dir=/etc",
    "data.min_propensity=0",
    "data.max_quarantine_fraction=1",
    "data.known_arms=abpo,shadow",
    "sft.output=/tmp/x",
    " sim.base_ctr=0.01",
    "sim.base_ctr",
]


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    return bag.dags["abpo_monthly"]


@pytest.mark.parametrize("item", EVIL)
def test_a_triggered_run_cannot_override_keys_outside_the_allow_list(dag, item):
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError):
        dag.params.get_param("overrides").resolve([item])
    with pytest.raises(ValueError, match=r"rule: key=value with a key in sim\.\*"):
        check_overrides(["sim.base_ctr=0.01", item])


def test_the_e2e_tests_and_the_demo_overrides_are_allowed():
    """What `abpo demo --set ...` and the slow DAG tests pass as the run's overrides (sizes and steps) stays allowed."""
    from tests.sizes import CYCLE_MONTH, DAG_MONTH, DAG_MONTH_CLICKS

    # DAG_MONTH: what the demo test passes; DAG_MONTH_CLICKS: the other DAG tests' runs; CYCLE_MONTH: test_cycle's month
    for small in (DAG_MONTH, DAG_MONTH_CLICKS, CYCLE_MONTH):
        assert check_overrides(small) == small


def test_allowed_overrides_pass_and_load(dag):
    from abpo.config import load_config

    ok = [
        "arms.min_rows_per_stratum=5",
        "sim.base_ctr=0.02",
        "report.confidence=0.9",
        "seed=3",
        "update.learning_rate=0.001",
        "arms.popularity.temperature=0.3",
        "policy.num_threads=1",
        "sft.pretrain_epochs=2",
    ]
    assert dag.params.get_param("overrides").resolve(ok) == ok
    cfg = load_config("tiny", check_overrides(ok))
    assert cfg.arms.min_rows_per_stratum == 5 and cfg.seed == 3 and cfg.arms.popularity.temperature == 0.3
    assert cfg.policy.num_threads == 1 and cfg.sft.pretrain_epochs == 2
    assert "Allowed keys only: sim.*" in dag.params.get_param("overrides").description


GATE_SWITCHES = [
    "arms.gate_margin=1",
    "arms.gate_ope_margin=-1",
    "arms.gate_min_ess=0",
    "arms.gate_alpha=0.5",
    "arms.gate_power=0.1",
    "arms.gate_metric=NDCG@10",
    "arms.gate_max_users=1",
    "arms.gate_users=dataset",
    "arms.gate_holdout_fraction=0.9",
    "arms.names=abpo",
    "report.srm_alpha=0",
    "report.arm_shares.abpo=0.9",
]


@pytest.mark.parametrize("item", GATE_SWITCHES)
def test_a_trigger_cannot_change_the_gate_or_switch_a_safety_check_off(dag, item):
    """Issue 32 item 4: the gate's settings and the report's sample-ratio check are not run-time overrides. The
    trigger's params are refused by Airflow (the JSON schema), and every task (the first: resolve_month) refuses them
    again, naming the key and the rule."""
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError):
        dag.params.get_param("overrides").resolve([item])
    with pytest.raises(
        ValueError,
        match=rf"overrides item '{re.escape(item)}': rule: {re.escape(item.split('=')[0])} "
        r"is .*not a run-time override.*\$ABPO_CONFIG",
    ):
        check_overrides([item])


@pytest.mark.parametrize(
    "item",
    [
        "update.learning_rate=0",
        "update.learning_rate=-1e-4",
        "update.learning_rate=nan",
        "update.learning_rate=inf",
        "update.learning_rate=fast",
        "sft.learning_rate=0",
        "update.max_steps=0.5",
        "update.batch_size=0",
        "update.epsilon=0",
        "arms.min_rows_per_stratum=0",
        "arms.gate_ope_bootstrap=1",
        "data.eval_candidates=5",
        "report.confidence=1",
    ],
)
def test_an_overridable_key_outside_its_range_is_refused_by_every_task(dag, dag_module, item, monkeypatch):
    """Where a key stays overridable its range is enforced: the run's first task (resolve_month, whose callable runs
    check_overrides on the triggered params) fails at once, naming the item and its range; nothing else ran."""
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setattr(
        dag_module, "get_current_context", lambda: {"params": {"month": "2026-01", "overrides": ["seed=3", item]}}
    )
    callable_ = dag_module.abpo_monthly().get_task("resolve_month").python_callable  # its globals: dag_module's
    with pytest.raises(
        AirflowFailException,
        match=rf"overrides item '{re.escape(item)}': rule: "
        rf"{re.escape(item.split('=')[0])} must be",
    ):
        callable_()
    ok = {"update.learning_rate=0": "update.learning_rate=0.0003"}.get(item)
    if ok:
        monkeypatch.setattr(
            dag_module, "get_current_context", lambda: {"params": {"month": "2026-01", "overrides": [ok]}}
        )
        assert callable_() == "2026-01"


@pytest.mark.parametrize("month", ["2026-01\n", "٢٠٢٦-٠١", "2026-13", "2026-1", "x"])
def test_the_month_param_is_strict(dag, month):
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError):
        dag.params.get_param("month").resolve(month)


def test_the_month_param_pattern_is_the_one_month_grammar(dag_module):
    from abpo.months import MONTH_PATTERN, is_month

    assert dag_module.MONTH_PARAM_PATTERN == f"^(?:|{MONTH_PATTERN})" + r"(?![\s\S])"
    for m in ("2026-01", "1999-12", "", "2026-00", "20260-1", "2026-01\n", "0000-01", "0001-01"):
        assert bool(re.search(dag_module.MONTH_PARAM_PATTERN, m)) == (is_month(m) or m == "")
