"""`abpo update` end to end on a real warehouse (DuckDB, landing Parquet, ingest) and a real MLflow store:
impressions of real catalog items -> strata -> stratified batches -> ABPOTrainer -> adapter + merged model."""

from __future__ import annotations

import pytest

from tests.sizes import TINY_UPDATE

MONTH = "2025-02"


@pytest.mark.slow
def test_abpo_update_cli_on_the_warehouse(
    tmp_path, tiny_model_dir, tiny_titles, make_impressions, ingested_impressions, capsys
):
    import mlflow
    from mlflow import MlflowClient

    from abpo.cli import main
    from abpo.config import load_config

    root = tmp_path / "var"
    sets = [
        f"paths.root={root}",
        *TINY_UPDATE,
    ]
    cfg = load_config("tiny", sets)
    rows = make_impressions(tiny_titles, 16)
    rows.append(dict(rows[0], impression_id="other-arm", arm="grpo"))  # another arm's log is not trained on
    ingested_impressions(cfg, rows, MONTH, known_arms=("abpo", "grpo"))

    sets_argv = [a for s in sets for a in ("--set", s)]
    argv = ["update", "--variant", "abpo", "--init-model", str(tiny_model_dir), *sets_argv]
    assert main(argv) == 0
    out = capsys.readouterr().out
    out_dir = cfg.paths.resolve("models") / f"update-F-{MONTH}_{MONTH}-seed0"
    assert f"LoRA adapter   {out_dir / 'adapter'}" in out
    assert (out_dir / "adapter" / "adapter_config.json").exists() and (out_dir / "model" / "config.json").exists()
    assert (out_dir / "update.json").exists()
    run_id = out.split("MLflow run ")[1].split()[0]
    mlflow.set_tracking_uri(cfg.paths.tracking_uri())
    run = MlflowClient().get_run(run_id)
    assert run.data.tags["abpo.variant"] == "abpo" and run.data.tags["abpo.months"] == MONTH
    assert run.data.params["data.positive_rows"] == "6" and run.data.params["data.no_response_rows"] == "6"
    assert run.data.params["update.arm"] == "abpo" and run.data.params["update.months"] == MONTH
    assert [m.step for m in MlflowClient().get_metric_history(run_id, "abpo/snips/ess")] == [1, 2]
    # the printed and logged rollout summary (constrained rollouts: the tiny preset's default)
    assert "update: rollouts over 2 steps (means): format_reward 1.000" in out
    assert run.data.metrics["summary/format_reward"] == 1.0

    # variant A: no update, the policy stays pi_init
    assert main(["update", "--variant", "none", "--init-model", str(tiny_model_dir), *sets_argv]) == 0
    assert f"the policy stays pi_init at {tiny_model_dir}" in capsys.readouterr().out
