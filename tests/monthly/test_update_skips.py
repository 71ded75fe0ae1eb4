"""Issue 32 item 7: an LLM arm that served no rows this month skips its update with a recorded reason (the DAG task is
skipped with it, `abpo arms month` records it per arm, MLflow keeps it as a run of experiment abpo-arms) and the month
completes: its report is written and the next month is not refused. Before, the update raised UpdateInputMissing, a
refusal that failed the task, blocked the report and every later month. Real DuckDB, GX and MLflow; the arm's
champion is a registered checkpoint directory (the update never loads it: it stops before training)."""

from __future__ import annotations

import json

import pytest

from abpo.config import load_config
from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions


@pytest.fixture
def state(tmp_path, monkeypatch):
    root = tmp_path / "var"
    monkeypatch.setenv("ABPO_STATE", str(root))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    monkeypatch.delenv("ABPO_CONFIG", raising=False)
    return root


def test_an_arm_with_no_rows_skips_its_update_with_a_reason_and_the_month_completes(state, tmp_path, dag_module):
    from airflow.sdk.exceptions import AirflowSkipException
    from airflow.sdk.execution_time.context import set_current_context
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import promotion, versions as arm_versions
    from abpo.monthly.report import report, require_previous_month
    from abpo.warehouse import config_catalog, ingest_with_config

    overrides = ["arms.update_logs=own"]  # the arm's own rows: abpo served none of them this month
    cfg = load_config("tiny", overrides)
    month = "2026-01"
    catalog = config_catalog(cfg)  # items in the dataset: the ingest quarantines others (item_not_in_catalog)
    table, _ = synthetic_impressions(
        400,
        month,
        seed=3,
        arms=("grpo", "ml_retrain", "popularity"),
        n_users=100,
        item_ids=catalog,
        n_items=min(5_000, len(catalog)),
    )
    write_impressions(table, cfg.paths.resolve("landing"), month, part="sim")
    landed, _ = ingest_with_config(cfg, month)
    assert landed.rows_clean > 0
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with registry.start_run(cfg, arm_versions.EXPERIMENT, "pi_init") as run:
        uri = registry.log_model_dir(ckpt)
    champion = promotion.register_champion(cfg, "abpo", uri, run.info.run_id, {"source": "pi_init"}).version

    # the DAG's abpo.update task, as a triggered run calls it (in Airflow's current context, with the run's params)
    context = {"params": {"month": month, "overrides": overrides}}
    update = dag_module.abpo_monthly().get_task("abpo.update").python_callable
    with set_current_context(context), pytest.raises(AirflowSkipException) as info:
        update("abpo", month, {})
    why = str(info.value)
    assert (
        f"no impressions of arm 'abpo' in months ['{month}']" in why
        and "rule: an arm with no rows skips its update" in why
        and f"keeps champion v{champion}" in why
    )
    # the reason is kept in MLflow, once however often the task runs
    with set_current_context(context), pytest.raises(AirflowSkipException):
        update("abpo", month, {})
    exp = MlflowClient().get_experiment_by_name(arm_versions.EXPERIMENT)
    runs = MlflowClient().search_runs([exp.experiment_id], f"attributes.run_name = 'update-abpo-{month}-skipped'")
    assert len(runs) == 1 and runs[0].data.tags["abpo.skipped"] == why and runs[0].data.tags["abpo.month"] == month
    assert str(arm_versions.get_version(cfg, "abpo", "champion").version) == str(champion)  # nothing registered
    assert [int(v.version) for v in MlflowClient().search_model_versions("name='abpo-arm-abpo'")] == [int(champion)]

    # the month completes: the report task (trigger rule none_failed) runs after a skipped group
    out = report(cfg, month)
    assert out.months == [month]
    require_previous_month(cfg, "2026-02")
