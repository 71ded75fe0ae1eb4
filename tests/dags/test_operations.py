"""The DAG's operations settings, parsed by a real DagBag: refusals fail at once (the task callable's wrapper,
abpo.monthly.airflow_tasks.fail_fast, and abpo.monthly.common.retry_or_fail), retries back off, the optional landing sensor (reschedule mode) and Asset
schedule, and the $ABPO_ON_FAILURE hook. The end-to-end checks are in test_operations_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


def _dag(monkeypatch, **env):
    from airflow.dag_processing.dagbag import DagBag

    for k in ("ABPO_SCHEDULE", "ABPO_WAIT_FOR_LANDING", "ABPO_ON_FAILURE", "ABPO_LANDING_MARKER"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    return bag.dags["abpo_monthly"]


def test_a_refusal_fails_at_once_and_a_transient_error_is_raised_for_a_retry():
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from abpo.monthly.airflow_tasks import fail_fast
    from abpo.monthly.serve import NothingLanded
    from abpo.warehouse import WarehouseBusy

    def step(e):
        @fail_fast
        def run(month):
            raise e

        return run

    with pytest.raises(AirflowFailException, match="NothingLanded: nothing landed for month=2026-10") as info:
        step(NothingLanded("nothing landed for month=2026-10"))("2026-10")
    assert isinstance(info.value.__cause__, NothingLanded)
    with pytest.raises(WarehouseBusy):
        step(WarehouseBusy("lock held"))("2026-10")
    with pytest.raises(AirflowSkipException):  # Airflow's own exceptions pass as they are
        step(AirflowSkipException("arm not configured"))("2026-10")
    assert step.__name__ == "step" and fail_fast(len)("abc") == 3


def test_defaults_retries_back_off_no_sensor_no_hook(monkeypatch):
    dag = _dag(monkeypatch)
    assert "landed" not in dag.task_ids and dag.catchup is False
    for t in dag.tasks:
        assert t.retry_exponential_backoff >= 2 and t.max_retry_delay is not None, t.task_id
        assert not t.on_failure_callback, t.task_id
    assert dag.timetable.expression == "0 0 1 * *"  # @monthly


def test_the_landing_sensor_waits_in_reschedule_mode_before_bootstrap(monkeypatch):
    dag = _dag(monkeypatch, ABPO_WAIT_FOR_LANDING="1")
    sensor = dag.get_task("landed")
    assert sensor.mode == "reschedule" and sensor.poke_interval == 600 and sensor.timeout == 72 * 3600
    assert sensor.upstream_task_ids == {"resolve_month"} and "bootstrap" in sensor.downstream_task_ids


def test_an_asset_schedule_runs_on_the_ingestions_asset(monkeypatch):
    dag = _dag(monkeypatch, ABPO_SCHEDULE="asset:team_impressions_landed")
    assert type(dag.timetable).__name__ == "AssetTriggeredTimetable"
    assert "Asset(name='team_impressions_landed'" in repr(dag.timetable.asset_condition)
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("ABPO_SCHEDULE", "asset:")
    assert "rule: asset:<the Asset name" in str(DagBag(dag_folder=str(DAGS)).import_errors)


def test_the_failure_hook_is_every_tasks_on_failure_callback(monkeypatch):
    dag = _dag(monkeypatch, ABPO_ON_FAILURE="failure_hook:record")
    assert all(t.on_failure_callback for t in dag.tasks)
