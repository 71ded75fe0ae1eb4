"""update.processes = 2: the monthly arm update (the DAG's task code, abpo.monthly.month.run_month) runs each LLM arm's
update as 2 torchrun processes (abpo.monthly.update.launch_refresh): inputs from the files under the update's
launch/ directory, the result read back from update.json; one MLflow run and one registered version per arm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sizes import CYCLE_MONTH


@pytest.mark.slow
def test_month_with_two_update_processes_registers_one_version_per_arm(tmp_path, monkeypatch, pi_init_state):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly.month import run_month

    repo = Path(__file__).resolve().parents[2]  # the worker processes import this checkout
    monkeypatch.setenv("PYTHONPATH", f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cfg = load_config("tiny", [f"paths.root={tmp_path}", *CYCLE_MONTH, "update.processes=2"])
    pi_init_state(cfg)  # pi_init trained once per session at these sizes (tests/conftest.py)
    m1 = run_month(cfg, "2026-01").to_json()
    registry.configure(cfg)
    client = MlflowClient()
    exp = client.get_experiment_by_name(cfg.update.mlflow_experiment)
    for arm in ("abpo", "grpo"):
        out = cfg.paths.resolve("models") / "arms" / arm / "2026-01"
        assert (out / "launch" / "positive.parquet").exists() and (out / "update.json").exists()
        versions = client.search_model_versions(f"name = '{arm_versions.model_name(arm)}'")
        assert sorted(int(v.version) for v in versions) == [1, 2]  # bootstrap + this month's one update
        new = next(v for v in versions if int(v.version) == 2)
        assert new.tags["source"] == "update" and m1[arm]["update"]["steps"] == 2
        runs = [
            r
            for r in client.search_runs([exp.experiment_id], max_results=100)
            if r.data.tags.get("abpo.output_dir") == str(out)
        ]
        assert len(runs) == 1 and runs[0].info.run_id == m1[arm]["update"]["run_id"]
