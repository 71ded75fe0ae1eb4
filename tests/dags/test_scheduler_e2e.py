"""abpo_monthly on the real Airflow services: `airflow db migrate`, then the API server, the scheduler (LocalExecutor)
and the DAG processor as separate processes on a fresh SQLite metadata DB. The test unpauses the DAG and triggers
a run *without a logical date* through the REST API (as `airflow dags trigger` does), waits for it, and checks every
task's state through the REST API, then the registry and the warehouse it left behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMALL = ["data.max_users=40", "sft.max_steps=10", "sft.eval_max_users=15", "data.eval_candidates=20",
         "update.max_steps=2", "update.batch_size=8", "update.save_steps=100", "arms.min_rows_per_stratum=1",
         "arms.gate_ope_bootstrap=200"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, base: str):
        self.base = base
        self.token = ""

    def call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(self.base + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    def wait(self, fn, what: str, timeout: float, every: float = 2.0):
        end = time.time() + timeout
        last = None
        while time.time() < end:
            try:
                out = fn()
                if out:
                    return out
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
            time.sleep(every)
        raise TimeoutError(f"{what}: not within {timeout:.0f}s (last error: {last})")


@pytest.mark.slow
def test_a_manual_run_on_the_real_scheduler_succeeds_task_by_task(tmp_path):
    port = _free_port()
    home, state = tmp_path / "airflow", tmp_path / "state"
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "false", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
           "AIRFLOW__API__PORT": str(port), "AIRFLOW__CORE__EXECUTION_API_SERVER_URL":
           f"http://127.0.0.1:{port}/execution/", "AIRFLOW__CORE__PARALLELISM": "2",
           "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5", "ABPO_SCHEDULE": "none", "ABPO_CONFIG": "demo",
           "ABPO_STATE": str(state), "ABPO_TASK_RETRIES": "0"}
    for leaked in ("ABPO_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(leaked, None)
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    procs = []
    try:
        for cmd in (["api-server", "--port", str(port)], ["scheduler"], ["dag-processor"]):
            log = open(tmp_path / f"{cmd[0]}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append((subprocess.Popen([airflow, *cmd], env=env, stdout=log, stderr=subprocess.STDOUT), log))
        api = Api(f"http://127.0.0.1:{port}")
        api.token = api.wait(lambda: api.call("GET", "/auth/token")["access_token"], "API server token", 180)
        api.wait(lambda: api.call("GET", "/api/v2/dags/abpo_monthly")["dag_id"], "DAG parsed", 180)
        api.call("PATCH", "/api/v2/dags/abpo_monthly", {"is_paused": False})
        run = api.call("POST", "/api/v2/dags/abpo_monthly/dagRuns",
                       {"logical_date": None, "conf": {"month": "2026-01", "simulate": True, "overrides": SMALL}})
        rid = run["dag_run_id"]
        assert run["logical_date"] is None  # a manual run without a logical date

        def finished():
            r = api.call("GET", f"/api/v2/dags/abpo_monthly/dagRuns/{rid}")
            return r if r["state"] in ("success", "failed") else None

        done = api.wait(finished, "the DAG run", 1500, every=5)
        tis = api.call("GET", f"/api/v2/dags/abpo_monthly/dagRuns/{rid}/taskInstances")["task_instances"]
        states = {t["task_id"]: t["state"] for t in tis}
        assert done["state"] == "success", (states, (tmp_path / "scheduler.log").read_text()[-3000:])
        assert len(states) == 15 and set(states.values()) == {"success"}, states
    finally:
        for p, log in procs:
            p.terminate()
        for p, log in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            log.close()

    from mlflow import MlflowClient

    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for arm in ("abpo", "grpo", "ml_retrain", "popularity"):
        assert client.get_model_version_by_alias(f"abpo-arm-{arm}", "champion") is not None
    assert (state / "cycle" / "2026-01.json").exists()
    assert (state / "reports" / "2026-01" / "report.html").exists()
