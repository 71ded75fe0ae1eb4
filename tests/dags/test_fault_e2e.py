"""A month on the real Airflow services (tests/dags/airflow_services.py), triggered *without a logical date* through the
REST API (as `airflow dags trigger` does), with a fault in the middle of it: the scheduler and every process it started (the running update task included)
are SIGKILLed while the abpo arm's update is training, as a lost machine would be. A new scheduler takes over: the
orphaned task instance times out, is retried, and the month completes. Nothing is doubled or lost: the month's rows
are in the warehouse once, every task key has exactly one completed MLflow run (the killed attempt's run is marked
KILLED, none is left RUNNING, pi_init's SFT included), and each arm has one model version per completed
registration. The month's twenty tasks all succeed (checked task by task through the REST API), every arm has a
champion, and the month's cycle record and report are written."""

from __future__ import annotations

import time

import pytest
from airflow_services import AirflowServices, assert_month_tasks

from tests.sizes import DAG_MONTH_CLICKS

# Recovery fast enough for a test, yet not so eager that a busy 2-core machine trips it: a scheduler whose own
# heartbeat lags past SCHEDULER_HEALTH_CHECK_THRESHOLD is declared dead and every task it queued is reset (with 10 s
# the live scheduler reset its own running bootstrap, mid-SFT), and a running task whose heartbeat lags past
# TASK_INSTANCE_HEARTBEAT_TIMEOUT is failed. 60 s each: the killed scheduler's tasks are taken over about a minute
# after the kill.
FAST_RECOVERY = {
    "ABPO_TASK_RETRIES": "2",
    "ABPO_TASK_RETRY_DELAY_S": "5",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "60",
}


def _client(state):
    from mlflow import MlflowClient

    from abpo.registry import ensure_store

    uri = f"sqlite:///{state / 'mlflow.db'}"
    ensure_store(uri)  # the bootstrap task may be creating the store right now
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _all_runs(client):
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, max_results=5000) if exps else []


@pytest.mark.slow
def test_killing_the_scheduler_mid_update_loses_and_doubles_nothing(tmp_path):
    overrides = [
        *DAG_MONTH_CLICKS,
        "update.max_steps=60",
    ]  # long enough an update to be killed inside it (item-token steps take ~0.1 s)
    with AirflowServices(tmp_path, FAST_RECOVERY) as af:
        rid = af.trigger({"month": "2026-01", "simulate": True, "overrides": overrides})

        def update_training():  # the abpo arm's update has opened its MLflow run: kill it now
            if not (af.state / "mlflow.db").exists():
                return None
            runs = [
                r
                for r in _all_runs(_client(af.state))
                if r.data.tags.get("abpo.task_key", "").startswith("update:abpo:") and r.info.status == "RUNNING"
            ]
            return runs[0] if runs else None

        victim = af.api.wait(update_training, "the abpo update's MLflow run", 900, every=1)
        killed = af.kill("scheduler")
        assert len(killed) > 1  # the scheduler and the processes it started
        time.sleep(3)
        af.start("scheduler")
        done = af.api.wait_run(rid, 1500)
        tis = af.api.task_states(rid)
        states = {k: t["state"] for k, t in tis.items()}
        assert done["state"] == "success", (states, af.log("scheduler"))
        # the demo preset's six arms (abpo_monthly's services run ABPO_CONFIG=demo): holdback.hold and wll too
        assert_month_tasks(states)
        assert tis["abpo.update"]["try_number"] >= 2  # the killed attempt failed and was retried

    client = _client(af.state)
    runs = _all_runs(client)
    running = [
        (r.info.run_id, r.info.run_name, r.data.tags.get("abpo.task_key")) for r in runs if r.info.status == "RUNNING"
    ]
    assert not running, (running, [(r.info.run_name, r.info.status, r.data.tags.get("abpo.task_key")) for r in runs])
    assert client.get_run(victim.info.run_id).info.status == "KILLED"
    by_key: dict[str, list] = {}
    for r in runs:
        if "abpo.task_key" in r.data.tags and r.info.status == "FINISHED":
            by_key.setdefault(r.data.tags["abpo.task_key"], []).append(r.info.run_id)
    assert by_key and all(len(v) == 1 for v in by_key.values()), by_key
    assert sum(k.startswith("update:") for k in by_key) == 3  # abpo, grpo and wll, once each
    for arm in ("abpo", "grpo", "wll", "ml_retrain", "popularity"):  # bootstrap + this month's update or refit
        versions = client.search_model_versions(f"name='abpo-arm-{arm}'")
        assert len(versions) == 2, (arm, [(v.version, v.run_id) for v in versions])
        assert len({v.run_id for v in versions}) == 2
    assert len(client.search_model_versions("name='abpo-arm-holdback'")) == 1  # the holdback: pi_init only
    for arm in ("abpo", "grpo", "ml_retrain", "popularity", "holdback"):
        assert client.get_model_version_by_alias(f"abpo-arm-{arm}", "champion") is not None
    assert (af.state / "cycle" / "2026-01.json").exists()
    assert (af.state / "reports" / "2026-01" / "report.html").exists()

    import duckdb

    con = duckdb.connect(str(af.state / "warehouse.duckdb"), read_only=True)
    rows, ids = con.execute(
        "SELECT count(*), count(DISTINCT impression_id) FROM impressions WHERE month = '2026-01'"
    ).fetchone()
    landed = con.execute(
        "SELECT rows_clean FROM ingest_runs WHERE month = '2026-01' ORDER BY ingested_at DESC LIMIT 1"
    ).fetchone()[0]
    con.close()
    assert rows == ids == landed > 0
