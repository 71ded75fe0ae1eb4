"""`abpo demo` on a shrunken config: bootstrap, then three simulated months through the real abpo_monthly DAG
(`airflow dags test` on a fresh SQLite metadata DB, subprocesses of the demo), and the final A/B report holds four
arms and three months. A missing month without simulate=true fails the DAG instead of fabricating data."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = ["data.max_users=60", "sft.max_steps=20", "sft.eval_max_users=20", "data.eval_candidates=20",
         "update.max_steps=2", "update.batch_size=8", "update.save_steps=100", "arms.min_rows_per_stratum=1"]


def _env(tmp_path):
    env = {**os.environ, "ABPO_STATE": str(tmp_path / "state")}
    for leaked in ("ABPO_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "AIRFLOW_HOME"):
        env.pop(leaked, None)
    return env


@pytest.mark.slow
def test_demo_runs_three_months_through_the_dag(tmp_path):
    sets = [x for s in SMALL for x in ("--set", s)]
    proc = subprocess.run([str(Path(sys.executable).with_name("abpo")), "demo", "--config", "demo", "--months", "3", *sets],
                          env=_env(tmp_path),
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])
    assert "3 months through abpo_monthly" in proc.stdout and "wall time" in proc.stdout
    # the console view: the tasks' log lines (abpo.logs) picked out of Airflow's output, one per step and arm
    for line in ("   simulate 2026-02:", "   update abpo (abpo) from champion", "   gate grpo: ", "   promote abpo: ",
                 "   refit popularity: ", "   report 2026-01..2026-03: "):
        assert line in proc.stdout, line
    assert "abpo| " not in proc.stdout
    state = tmp_path / "state"
    report = json.loads((state / "reports" / "2026-01..2026-03" / "report.json").read_text())
    cells = {(r["period"], r["arm"]) for r in report["cells"]}
    assert {m for m, _ in cells} == {"2026-01", "2026-02", "2026-03"}
    assert {a for _, a in cells} == {"abpo", "grpo", "ml_retrain", "popularity"}

    from mlflow import MlflowClient

    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for arm in ("abpo", "grpo", "ml_retrain", "popularity"):
        champion = client.get_model_version_by_alias(f"abpo-arm-{arm}", "champion")
        assert int(champion.version) >= 1
    assert len(client.search_model_versions("name='abpo-arm-popularity'")) == 4  # bootstrap + 3 monthly refits

    # production default: a month nothing landed for fails in `serve`, nothing is simulated
    env = {**_env(tmp_path), "AIRFLOW_HOME": str(state / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
           "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).resolve().parents[2] / "dags"),
           "ABPO_CONFIG": "demo", "ABPO_TASK_RETRIES": "0"}
    conf = json.dumps({"month": "2026-04", "overrides": SMALL})
    airflow = Path(sys.executable).with_name("airflow")
    proc = subprocess.run([str(airflow), "dags", "test", "abpo_monthly", "2026-05-01T00:00:00+00:00", "-c", conf],
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert "nothing landed for month=2026-04" in out
    assert not (state / "landing" / "impressions" / "month=2026-04").exists()
