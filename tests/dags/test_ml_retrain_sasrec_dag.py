"""Issue 43, Done when 3: the ML-retrain arm with ``arms.ml_retrain.kind: sasrec`` runs a month through the
abpo_monthly DAG (`airflow dags test` on a fresh SQLite metadata DB, the route of test_month_rerun_e2e.py, with
simulate=true): the bootstrap task fits and registers SASRec-CE, the simulated serve logs its impressions, and the
month's ml_retrain.refit task registers a warm-started SASRec-CE version. Each ml_retrain row the month served carries
the exposure probability of its item under the registered version that served it, and that version, loaded through
mlflow.pyfunc from the registry, gives propensities summing to 1 over the row's candidates.

A ranker-only month (ml_retrain and popularity: no SFT, no update); real simulator, DuckDB, Great Expectations, MLflow
and Airflow. The in-process month of the same config is tests/arms/test_ml_retrain_sasrec.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from airflow_services import dags_test_month

from tests.sizes import SASREC_RANKER_MONTH

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~2 CPU-min: Airflow's db migrate and a DAG run whose tasks each start a process
def test_a_sasrec_ml_retrain_month_through_the_dag_registers_and_serves_propensities(tmp_path, monkeypatch):
    import mlflow
    import pandas as pd
    from mlflow import MlflowClient

    from abpo.arms.versions import model_name
    from abpo.config import load_config

    state = tmp_path / "state"
    monkeypatch.setenv("ABPO_STATE", str(state))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    config = tmp_path / "month.yaml"  # the deployment's config file: sasrec.* is no run override, so it is set here
    config.write_text(yaml.safe_dump(load_config("tiny", SASREC_RANKER_MONTH).to_dict(), sort_keys=False))
    cfg = load_config(config)
    assert cfg.arms.ml_retrain.kind == "sasrec" and cfg.paths.resolve("root") == state

    tis = dags_test_month(tmp_path, config, state, "2026-01", "2026-02-01T00:00:00+00:00")
    for task in ("bootstrap", "serve", "ingest", "ml_retrain.refit", "popularity.refit", "report"):
        assert tis.get(task) == "success", (task, tis)
    assert tis.get("abpo.update") == "skipped"  # no LLM arm configured: its chain is skipped, not failed

    # the registry: the bootstrap's SASRec-CE (v1, early-stopped cold fit) and the month's refit (v2, warm-started
    # from v1), the champion; their registered artifacts say kind sasrec and the logged model's requirements pin torch
    uri = cfg.paths.tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient()
    name = model_name("ml_retrain", cfg)
    versions = {str(v.version): v for v in client.search_model_versions(f"name='{name}'")}
    assert sorted(versions) == ["1", "2"]
    v2 = versions["2"]
    assert v2.tags["source"] == "refit" and v2.tags["parent_version"] == "1" and v2.tags["months"] == "2026-01"
    assert str(client.get_registered_model(name).aliases["champion"]) == "2"
    for v, warm in (("1", False), ("2", True)):
        model_dir = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/{v}", dst_path=str(tmp_path / f"v{v}")))
        (meta_file,) = model_dir.rglob("ranker.json")
        meta = json.loads(meta_file.read_text())
        assert meta["kind"] == "sasrec" and meta["fit"]["warm_started"] is warm, (v, meta["fit"])
        assert meta["params"]["hidden_size"] == 16 and meta["params"]["max_length"] == 16
        assert "torch==" in Path(mlflow.pyfunc.get_model_dependencies(f"models:/{name}/{v}")).read_text()

    # the month's served rows: every ml_retrain row's logged propensity is its item's probability under the version
    # that served it (v1, loaded from the registry through mlflow.pyfunc), whose propensities sum to 1 over the
    # row's candidates
    served = pd.read_parquet(cfg.paths.resolve("landing") / "impressions" / "month=2026-01")
    rows = served[served["arm"] == "ml_retrain"]
    assert len(rows) > 0 and set(rows["model_version"]) == {"1"}
    model = mlflow.pyfunc.load_model(f"models:/{name}/1")
    request = pd.DataFrame(
        {"history_item_ids": [list(h) for h in rows["history"]], "candidate_ids": [list(c) for c in rows["candidates"]]}
    )
    pred = model.predict(request)
    for (_, row), p in zip(rows.iterrows(), pred["propensities"], strict=True):
        p = np.asarray(p, dtype=np.float64)
        cands = list(row["candidates"])
        assert p.shape == (len(cands),) and (p > 0).all() and p.sum() == pytest.approx(1.0, abs=1e-9)
        assert row["propensity"] == pytest.approx(p[cands.index(row["item_id"])], rel=1e-5), row["impression_id"]
