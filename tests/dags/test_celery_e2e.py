"""abpo_monthly on Celery workers (docs/deployment-celery.md), for real: Debian's Redis server as the broker on a
free port of 127.0.0.1, the Airflow services of tests/dags/airflow_services.py with the CeleryExecutor, and two
`airflow celery worker` processes: one on the default queue, one on the `gpu` queue ($ABPO_UPDATE_QUEUE, the update
tasks'). Each worker reports its own hostname (tests/dags/worker_hostname.py), as two machines would. The heavy
steps run in a Python environment of their own ($ABPO_TASK_PYTHON: a venv without Airflow). One month runs end to
end; Airflow's metadata (task_instance.hostname / queue / pid, the XCom "isolated") says which worker ran each task:
the updates on the gpu worker, every other task on the other, the heavy ones in the other interpreter."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from airflow_services import REPO, AirflowServices, assert_month_tasks, free_port, separate_python

from tests.listeners import require_loopback_only
from tests.sizes import DAG_MONTH_CLICKS

HERE = Path(__file__).resolve().parent
WORKERS = {"cpu-worker": "default", "gpu-worker": "gpu"}  # hostname -> the queue it listens on
# the demo preset's three LLM arms (the services run ABPO_CONFIG=demo)
UPDATES = ("abpo.update", "grpo.update", "wll.update")
HEAVY = ("bootstrap", *UPDATES, "abpo.gate", "grpo.gate", "wll.gate")


@contextlib.contextmanager
def redis_server(tmp_path: Path):
    """Debian's redis-server on a free port of 127.0.0.1, nothing persisted; yields its URL prefix."""
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("ABPO_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server not found but ABPO_REQUIRE_REDIS=1: run `bash scripts/setup-redis.sh`")
        pytest.skip("redis-server not found: `bash scripts/setup-redis.sh` (Debian's redis-server) runs this test")
    port = free_port()
    log = open(tmp_path / "redis.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        end = time.time() + 60
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if time.time() > end or proc.poll() is not None:
                    raise
                time.sleep(0.5)
        require_loopback_only([proc.pid], "redis-server")  # issue 59 point 12
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_a_month_runs_on_two_celery_workers_with_the_updates_on_the_gpu_queue(tmp_path):
    train_env = tmp_path / "train-env"
    python = separate_python(train_env)
    with redis_server(tmp_path) as broker:
        env = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": f"{broker}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"{broker}/1",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            # the workers import abpo.monthly.preload before their pools fork (docs/operations.md, "Task start-up")
            "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": "abpo.monthly.celery_preload.CELERY_CONFIG",
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "21600",
            # the workers' calls to the Execution API (default 5 s, 5 tries): a first run on a loaded 2-core machine
            # timed out on `task-instances/<id>/run` while the API server and the scheduler shared SQLite
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            "ABPO_UPDATE_QUEUE": "gpu",
            "ABPO_TASK_PYTHON": str(python),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        with AirflowServices(tmp_path, env) as af:
            for host, queue in WORKERS.items():
                af.start(
                    host,
                    [
                        af.airflow,
                        "celery",
                        "worker",
                        "--queues",
                        queue,
                        "--concurrency",
                        "1",
                        "--celery-hostname",
                        f"{host}@%h",
                        "--pid",
                        str(tmp_path / f"{host}.pid"),
                        "--skip-serve-logs",
                    ],
                    {"AIRFLOW__CORE__HOSTNAME_CALLABLE": "worker_hostname.hostname", "ABPO_TEST_WORKER_HOSTNAME": host},
                )
            rid = af.trigger({"month": "2026-01", "simulate": True, "overrides": DAG_MONTH_CLICKS})
            done = af.api.wait_run(rid, 2400)
            tis = af.api.task_states(rid)
            assert done["state"] == "success", (
                {k: t["state"] for k, t in tis.items()},
                af.log("scheduler"),
                af.log("cpu-worker"),
                af.log("gpu-worker"),
            )
            assert_month_tasks({k: t["state"] for k, t in tis.items()})

    # Airflow's metadata: which worker (its hostname) ran each task, from which queue, in which process
    with contextlib.closing(sqlite3.connect(af.home / "airflow.db")) as db:
        rows = db.execute(
            "SELECT task_id, hostname, queue, pid, state FROM task_instance WHERE run_id = ?", (rid,)
        ).fetchall()
        isolated = {
            task: _xcom(value)
            for task, value in db.execute(
                "SELECT task_id, value FROM xcom WHERE run_id = ? AND key = 'isolated'", (rid,)
            )
        }
    # the tasks that ran (an arm the config does not serve, grpo_cr, is skipped: its update task on the gpu queue too)
    ran = {task: (host, queue) for task, host, queue, _, state in rows if state == "success"}
    assert {ran[t] for t in UPDATES} == {("gpu-worker", "gpu")}, ran
    assert {v for t, v in ran.items() if t not in UPDATES} == {("cpu-worker", "default")}, ran
    # the heavy steps ran in the other environment: a process of their own, started by the task's process
    pids = {task: pid for task, _, _, pid, _ in rows}
    isolated = {t: v for t, v in isolated.items() if t in ran}  # grpo_cr.update (not served) skips inside its step
    assert sorted(isolated) == sorted(HEAVY), isolated
    for task, where in isolated.items():
        assert Path(where["prefix"]) == train_env and where["python"] == str(python), (task, where)
        assert where["pid"] != pids[task] and where["ppid"] == pids[task], (task, where, pids[task])

    from mlflow import MlflowClient

    uri = f"sqlite:///{af.state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for arm in ("abpo", "grpo"):  # each update registered a challenger, which its gate judged
        versions = client.search_model_versions(f"name='abpo-arm-{arm}'")
        assert len(versions) == 2, [(v.version, v.tags) for v in versions]  # pi_init + the month's challenger
    assert (af.state / "reports" / "2026-01" / "report.html").exists()


def _xcom(value):
    """An XCom row's value as Airflow 3 stores it (JSON, a string of JSON for a serialized dict)."""
    out = json.loads(value) if isinstance(value, (str, bytes)) else value
    return json.loads(out) if isinstance(out, str) else out
