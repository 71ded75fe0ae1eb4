"""abpo_monthly on the real Airflow services (tests/dags/airflow_services.py): the test triggers a run *without a
logical date* through the REST API (as `airflow dags trigger` does), waits for it, and checks every task's state
through the REST API, then the registry and the warehouse it left behind."""

from __future__ import annotations

import pytest
from airflow_services import AirflowServices

from tests.sizes import DAG_MONTH_CLICKS


@pytest.mark.slow
def test_a_manual_run_on_the_real_scheduler_succeeds_task_by_task(tmp_path):
    with AirflowServices(tmp_path, {}) as af:
        rid = af.trigger({"month": "2026-01", "simulate": True, "overrides": DAG_MONTH_CLICKS})
        done = af.api.wait_run(rid, 1500)
        states = {k: t["state"] for k, t in af.api.task_states(rid).items()}
        assert done["state"] == "success", (states, af.log("scheduler"))
        # the demo preset's six arms (abpo_monthly's services run ABPO_CONFIG=demo): holdback.hold and grpo_cr too
        assert len(states) == 20 and set(states.values()) == {"success"}, sorted(states.items())

    from mlflow import MlflowClient

    state = af.state
    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for arm in ("abpo", "grpo", "ml_retrain", "popularity", "holdback"):
        assert client.get_model_version_by_alias(f"abpo-arm-{arm}", "champion") is not None
    assert (state / "cycle" / "2026-01.json").exists()
    assert (state / "reports" / "2026-01" / "report.html").exists()
