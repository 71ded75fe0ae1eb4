"""abpo.pipeline.ensure_pi_init on a tiny slice: pi_init's SFT runs under a task key, so an attempt killed mid-SFT
(its MLflow run left RUNNING, as a lost worker or a task the scheduler reset leaves it) is marked KILLED by the next
call, which trains and records its result; a later call reuses the registered pi_init and trains nothing."""

from __future__ import annotations

import torch


def test_a_killed_sft_attempt_is_marked_killed_and_pi_init_trained_once(tmp_path):
    from mlflow import MlflowClient

    from abpo import pipeline, registry
    from abpo.arms.registry import config_hash
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    cfg.data.max_users, cfg.data.sup_examples_per_user = 12, 4
    cfg.data.train_candidates, cfg.data.eval_candidates, cfg.data.update_steps = 8, 10, 2
    p = cfg.policy
    p.tiny_hidden_size, p.tiny_layers, p.tiny_heads, p.tiny_intermediate_size, p.tiny_vocab_size = 32, 1, 2, 64, 2048
    p.max_history, p.scoring_batch_tokens = 3, 8192
    cfg.sft.use_lora, cfg.sft.max_steps, cfg.sft.batch_size, cfg.sft.eval_max_users = False, 2, 8, 4
    torch.set_num_threads(1)

    key = f"sft:pi_init:{config_hash(cfg)}"
    registry.configure(cfg)
    client = MlflowClient()
    exp = registry._ensure_experiment(cfg, cfg.sft.experiment)
    killed = client.create_run(exp, tags={registry.TASK_KEY_TAG: key}, run_name="sft-pi_init")  # left RUNNING

    first = pipeline.ensure_pi_init(cfg)
    assert not first["reused"] and str(first["model_version"]) == "1"
    assert client.get_run(killed.info.run_id).info.status == "KILLED"
    assert client.get_run(killed.info.run_id).data.tags["abpo.superseded"]
    done = registry.completed_task_run(cfg, cfg.sft.experiment, key)
    assert done.info.run_id == first["mlflow_run"] and registry.task_result(done)["model_version"] == "1"

    again = pipeline.ensure_pi_init(cfg)  # registered: reused, nothing trained or registered again
    assert again["reused"] and str(again["model_version"]) == "1"
    runs = client.search_runs([exp])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]
    assert len(client.search_model_versions(f"name='{registry.MODEL_NAME}'")) == 1
