"""abpo.monthly.bootstrap.ensure_pi_init on a tiny slice: pi_init's SFT runs under a task key, so an attempt killed mid-SFT
(its MLflow run left RUNNING, as a lost worker or a task the scheduler reset leaves it) is marked KILLED by the next
call, which trains and records its result; a later call reuses the registered pi_init and trains nothing."""

from __future__ import annotations

import torch


def test_a_killed_sft_attempt_is_marked_killed_and_pi_init_trained_once(slice_cfg):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.monthly.bootstrap import ensure_pi_init
    from abpo.monthly.common import task_key

    cfg = slice_cfg
    cfg.sft.max_steps, cfg.sft.eval_max_users, cfg.sft.eval_generation = 2, 4, False
    torch.set_num_threads(1)

    key = task_key(cfg, "sft", "pi_init")
    registry.configure(cfg)
    client = MlflowClient()
    exp = registry._ensure_experiment(cfg, cfg.sft.experiment)
    killed = client.create_run(exp, tags={registry.TASK_KEY_TAG: key}, run_name="sft-pi_init")  # left RUNNING

    first = ensure_pi_init(cfg)
    assert not first["reused"] and str(first["model_version"]) == "1"
    assert client.get_run(killed.info.run_id).info.status == "KILLED"
    assert client.get_run(killed.info.run_id).data.tags["abpo.superseded"]
    done = registry.completed_task_run(cfg, cfg.sft.experiment, key)
    assert done.info.run_id == first["mlflow_run"] and registry.task_result(done)["model_version"] == "1"

    again = ensure_pi_init(cfg)  # registered: reused, nothing trained or registered again
    assert again["reused"] and str(again["model_version"]) == "1"
    runs = client.search_runs([exp])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]
    assert len(client.search_model_versions(f"name='{registry.MODEL_NAME}'")) == 1
