"""The whole monthly DAG, run for real by Airflow (`dag.test()` on a fresh SQLite metadata DB) on a shrunken
tiny config: pi_init SFT -> landed bandit log -> ingest + GX -> ABPO update -> register -> gate -> promote ->
report. Runs in a subprocess so its AIRFLOW_HOME and MLflow state stay its own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"

RUN = r"""
import json, sys
from airflow.utils import db
db.initdb()
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[1])
assert not bag.import_errors, bag.import_errors
overrides = ["data.max_users=30", "sft.max_steps=4", "sft.max_examples=60", "sft.eval_max_users=15",
             "data.eval_candidates=20", "update.max_steps=2", "update.max_examples=8", "update.batch_size=4",
             "update.save_steps=1"]
run = bag.dags["abpo_monthly"].test(run_conf={"month": "2024-01", "overrides": overrides})
print("DAGRUN_STATE=" + str(run.state))
"""


@pytest.mark.slow
def test_monthly_dag_runs_end_to_end(tmp_path):
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "ABPO_STATE": str(tmp_path / "state"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "false", "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
           "ABPO_TASK_RETRIES": "0"}
    for leaked in ("ABPO_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # set by earlier tests
        env.pop(leaked, None)
    proc = subprocess.run([sys.executable, "-c", RUN, str(DAGS)], env=env, capture_output=True, text=True,
                          timeout=1800)
    assert "DAGRUN_STATE=success" in proc.stdout, (proc.stdout[-3000:], proc.stderr[-6000:])

    state = tmp_path / "state"
    import duckdb

    con = duckdb.connect(str(state / "warehouse.duckdb"), read_only=True)
    (rows,) = con.execute("select count(*) from impressions where month = '2024-01'").fetchall()[0]
    con.close()
    assert rows > 0
    assert json.loads((state / "validation" / "impressions_2024-01.json").read_text())["success"] is True
    assert (state / "reports" / "2024-01" / "report.html").stat().st_size > 1000

    from mlflow import MlflowClient

    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    versions = client.search_model_versions("name='abpo-recommender'")
    assert len(versions) == 2  # pi_init and the ABPO update
    champion = client.get_model_version_by_alias("abpo-recommender", "champion")
    challenger = client.get_model_version_by_alias("abpo-recommender", "challenger")
    assert int(challenger.version) == 2 and int(champion.version) in (1, 2)
