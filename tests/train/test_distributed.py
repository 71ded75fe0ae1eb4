"""Multi-process updates (abpo.train.distributed, abpo.train.update): the launches refused before anything trains or
an MLflow run opens, the batch geometry over processes, and (slow) real `torchrun` launches of `abpo update` on the
CPU: 2 processes x batch B/2 against 1 process x batch B with greedy rollouts, under DDP (gloo) and DeepSpeed ZeRO-2
(DeepSpeed's CPU accelerator; skipped where deepspeed is not installed, failed instead under `make test`, which
installs it)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MONTH = "2025-02"
REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------- refusals (fast)


def test_cpu_launch_asking_for_several_processes_that_starts_one_is_refused(
    tmp_path, monkeypatch, capsys, tiny_model_dir
):
    """`accelerate launch --cpu --num_processes 2` without MPI: one process with ACCELERATE_USE_CPU and MASTER_ADDR
    but no WORLD_SIZE. `abpo update` says so in one line and exits 2 before any model, warehouse or MLflow run."""
    from abpo.cli import main
    from abpo.config.update import UpdateConfig
    from abpo.train.distributed import LaunchRefused, check_launch

    env = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(LaunchRefused, match="starts one process"):
        check_launch(UpdateConfig(), env)
    check_launch(UpdateConfig(), {**env, "WORLD_SIZE": "2", "RANK": "0"})  # a real 2-process launch passes
    check_launch(UpdateConfig(), {"ACCELERATE_USE_CPU": "True"})  # `accelerate launch --cpu` of one process passes

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    root = tmp_path / "var"
    assert main(["update", "--init-model", str(tiny_model_dir), "--set", f"paths.root={root}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "rule: launch CPU processes with `torchrun" in err
    assert not (root / "mlflow.db").exists()  # no MLflow run was opened (nor a store created)


def test_deepspeed_config_that_would_be_dropped_is_refused(load_tiny, update_rows, tiny_update_cfg, tmp_path):
    """update.deepspeed with the CPU forced through ACCELERATE_USE_CPU (transformers would build a plain CPU state
    and drop DeepSpeed), and a built trainer without DeepSpeed while update.deepspeed is set."""
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.distributed import LaunchRefused, check_launch, check_trainer
    from abpo.train.grpo_args import grpo_config
    from abpo.train.records import ABPOSettings
    from abpo.train.trainer import ABPOTrainer

    ds = dataclasses.replace(tiny_update_cfg, deepspeed="configs/deepspeed_zero2.json")
    with pytest.raises(LaunchRefused, match="drop DeepSpeed"):
        check_launch(ds, {"ACCELERATE_USE_CPU": "true"})
    check_launch(ds, {})

    model, tok = load_tiny()
    args = grpo_config(tiny_update_cfg, "abpo", output_dir=tmp_path / "ckpt", seed=0, disable_tqdm=True)
    trainer = ABPOTrainer(
        model=model,
        args=args,
        settings=ABPOSettings(variant="abpo", scoring_batch_tokens=4096),
        train_dataset=to_hf_dataset(update_rows),
        processing_class=tok,
    )
    check_trainer(trainer, tiny_update_cfg)  # no DeepSpeed asked, none built: fine
    with pytest.raises(LaunchRefused, match="built without DeepSpeed"):
        check_trainer(trainer, ds)


def test_zero3_config_is_refused(tmp_path):
    """ZeRO stage 3 over several processes partitions the parameters, so every rank must run the same forwards in the same order; the
    rollouts and e_old scoring do not (a gloo collective mismatch aborts the launch after the MLflow run opened):
    refused before anything loads, naming the file and stage. The bundled ZeRO-2 config passes."""
    from abpo.config.update import UpdateConfig
    from abpo.train.distributed import LaunchRefused, check_launch

    z3 = tmp_path / "zero3.json"
    z3.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_batch_size": "auto"}))
    with pytest.raises(LaunchRefused, match=r"zero3.json: zero_optimization.stage=3.*rule: ZeRO stage 2"):
        check_launch(dataclasses.replace(UpdateConfig(), deepspeed=str(z3)), {"WORLD_SIZE": "2"})
    check_launch(dataclasses.replace(UpdateConfig(), deepspeed=str(z3)), {})  # one process: no ranks to mismatch
    check_launch(dataclasses.replace(UpdateConfig(), deepspeed="configs/deepspeed_zero2.json"), {"WORLD_SIZE": "2"})


def test_process_group_without_a_distributed_trainer_is_refused(
    load_tiny, update_rows, tiny_update_cfg, tmp_path, monkeypatch
):
    """A launcher announced 2 processes (WORLD_SIZE) but the trainer trains as one: each process would train the
    whole update alone."""
    from abpo.train.dataset import to_hf_dataset
    from abpo.train.distributed import LaunchRefused, check_trainer
    from abpo.train.grpo_args import grpo_config
    from abpo.train.records import ABPOSettings
    from abpo.train.trainer import ABPOTrainer

    model, tok = load_tiny()
    args = grpo_config(tiny_update_cfg, "abpo", output_dir=tmp_path / "ckpt", seed=0, disable_tqdm=True)
    trainer = ABPOTrainer(
        model=model,
        args=args,
        settings=ABPOSettings(variant="abpo", scoring_batch_tokens=4096),
        train_dataset=to_hf_dataset(update_rows),
        processing_class=tok,
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LaunchRefused, match="a process group needs a distributed trainer"):
        check_trainer(trainer, tiny_update_cfg)


def test_batch_the_process_count_does_not_divide_is_refused_and_geometry(tiny_update_cfg, monkeypatch):
    """update.batch_size counts the examples of a micro-batch over all processes: each of N trains batch_size / N,
    and N must divide it. On a machine without CUDA the trainer is told use_cpu (not with DeepSpeed, which brings
    its own CPU accelerator); update.greedy_rollouts turns sampling off."""
    from abpo.train.distributed import LaunchRefused, check_launch, cuda_available
    from abpo.train.grpo_args import grpo_kwargs

    u = dataclasses.replace(tiny_update_cfg, batch_size=3)
    with pytest.raises(LaunchRefused, match="update.batch_size=3 with 2 processes"):
        check_launch(u, {"WORLD_SIZE": "2"})
    check_launch(u, {"WORLD_SIZE": "3"})

    u = dataclasses.replace(tiny_update_cfg, batch_size=4, group_size=3)  # F: 2 rollouts per example
    assert grpo_kwargs(u, "abpo", output_dir="x", seed=0)["per_device_train_batch_size"] == 8
    assert "generation_kwargs" not in grpo_kwargs(u, "abpo", output_dir="x", seed=0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    kw = grpo_kwargs(u, "abpo", output_dir="x", seed=0)
    assert kw["per_device_train_batch_size"] == 4 and kw["use_cpu"] is (not cuda_available())
    ds = grpo_kwargs(dataclasses.replace(u, deepspeed="configs/deepspeed_zero2.json"), "abpo", output_dir="x", seed=0)
    assert ds["use_cpu"] is False
    # DeepSpeed over CPU processes: the trainer reuses dist_state's state (the one transformers would rebuild there
    # counts one process); on GPUs, and without DeepSpeed, transformers builds its own as before
    assert (ds.get("accelerator_config") == {"use_configured_state": True}) is (not cuda_available())
    assert "accelerator_config" not in kw
    assert grpo_kwargs(dataclasses.replace(u, greedy_rollouts=True), "abpo", output_dir="x", seed=0)[
        "generation_kwargs"
    ] == {"do_sample": False}


def test_read_update_json_round_trip(tmp_path):
    from abpo.train.runs import UpdateResult, read_update_json

    res = UpdateResult(
        "abpo", tmp_path, tmp_path / "adapter", tmp_path / "model", None, tmp_path / "init", "r1", 3, metrics={"a": 1.0}
    )
    (tmp_path / "update.json").write_text(
        json.dumps({k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(res).items()})
    )
    assert read_update_json(tmp_path / "update.json") == res


# ------------------------------------------------------------------------------ real launches (slow, CPU)


def _warehouse(root, tiny_titles, make_impressions, ingested_impressions):
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={root}"])
    ingested_impressions(cfg, make_impressions(tiny_titles, 16), MONTH)
    return cfg


def _update(root, init_model, output, procs, extra=()):
    """`abpo update` as `procs` processes (torchrun) or one plain process; returns the finished process."""
    sets = [
        f"paths.root={root}",
        "update.max_steps=2",
        "update.batch_size=4",
        "update.group_size=3",
        "update.max_completion_length=64",
        "update.save_steps=1",
        "update.max_examples=16",
        "update.greedy_rollouts=true",
        "update.learning_rate=0.01",
        "update.warmup_ratio=0",
        "policy.lora_r=4",
        *extra,
    ]
    args = [
        "update",
        "--variant",
        "abpo",
        "--init-model",
        str(init_model),
        "--output",
        output,
        *[a for s in sets for a in ("--set", s)],
    ]
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
        if procs > 1
        else [sys.executable]
    )
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    # mlflow.set_tracking_uri (an earlier test's, or _runs') also sets $MLFLOW_TRACKING_URI, which would send this
    # update's runs to that store: the update's own store is the one under paths.root
    for var in ("MLFLOW_TRACKING_URI", "ABPO_TRACKING_URI"):
        env.pop(var, None)
    p = subprocess.run(
        [*launcher, "-m", "abpo.cli", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=900
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "adapter_model.safetensors"))


def _relative_difference(a, b) -> float:
    import torch

    num = sum(float(torch.sum((a[k].float() - b[k].float()) ** 2)) for k in a)
    den = sum(float(torch.sum(a[k].float() ** 2)) for k in a)
    return (num / den) ** 0.5


def _runs(cfg, output_dir):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(cfg.paths.tracking_uri())
    exp = MlflowClient().get_experiment_by_name(cfg.update.mlflow_experiment)
    runs = MlflowClient().search_runs([exp.experiment_id], max_results=100)
    return [r for r in runs if r.data.tags.get("abpo.output_dir") == str(output_dir)]


def _two_against_one(tmp_path, tiny_model_dir, tiny_titles, make_impressions, ingested_impressions, extra=()):
    import torch

    root = tmp_path / "var"
    cfg = _warehouse(root, tiny_titles, make_impressions, ingested_impressions)
    _update(root, tiny_model_dir, "one", 1)  # the reference: one plain process
    _update(root, tiny_model_dir, "two", 2, extra)
    models = cfg.paths.resolve("models")
    one, two = _weights(models / "one" / "adapter"), _weights(models / "two" / "adapter")
    assert set(one) == set(two)
    moved = max(float(torch.max(torch.abs(v))) for k, v in one.items() if "lora_B" in k)
    assert moved > 0  # the update moved the adapter (lora_B starts at 0): the comparison is not of two zeros
    assert _relative_difference(one, two) < 1e-4
    runs = _runs(cfg, models / "two")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # rank 0 alone opened a run
    assert "entropy" in runs[0].data.metrics and "abpo/objective" in runs[0].data.metrics
    res = json.loads((models / "two" / "update.json").read_text())
    assert res["mlflow_run_id"] == runs[0].info.run_id and res["global_step"] == 2
    # the loss-side metrics logged for 2 processes are those of the whole batch, as 1 process logs them
    one_run = _runs(cfg, models / "one")[0]
    for key in ("abpo/objective", "entropy"):
        assert runs[0].data.metrics[key] == pytest.approx(one_run.data.metrics[key], rel=1e-3, abs=1e-5), key
    return root, cfg


@pytest.mark.slow
def test_ddp_two_processes_match_one(tmp_path, tiny_model_dir, tiny_titles, make_impressions, ingested_impressions):
    root, cfg = _two_against_one(tmp_path, tiny_model_dir, tiny_titles, make_impressions, ingested_impressions)
    # a rerun into the same output directory retrains (rank 0 clears update.json and the checkpoints once)
    _update(root, tiny_model_dir, "two", 2)
    assert len(_runs(cfg, cfg.paths.resolve("models") / "two")) == 2
    assert (cfg.paths.resolve("models") / "two" / "update.json").exists()


@pytest.mark.slow
def test_zero2_two_processes_match_one(tmp_path, tiny_model_dir, tiny_titles, make_impressions, ingested_impressions):
    """ZeRO-2 on DeepSpeed's CPU accelerator (gloo; oneCCL not needed): the same as DDP, and every rank writes its own
    ZeRO shard of the optimizer state under the checkpoint (no plain optimizer.pt: DeepSpeed was not dropped)."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        if os.environ.get("ABPO_REQUIRE_DEEPSPEED") == "1":  # make test (CI) installs it: there it must run
            pytest.fail("deepspeed not found but ABPO_REQUIRE_DEEPSPEED=1: `make test` installs the distributed extra")
        pytest.skip(
            "deepspeed is not installed: it is the optional `distributed` extra, which `make test` installs and "
            "`make setup`/`make demo` do not (pip install 'abpo[distributed]', or ABPO_EXTRAS=distributed make setup)"
        )
    ds = ("update.deepspeed=configs/deepspeed_zero2.json",)
    root, cfg = _two_against_one(tmp_path, tiny_model_dir, tiny_titles, make_impressions, ingested_impressions, ds)
    ckpt = cfg.paths.resolve("models") / "two" / "checkpoints" / "checkpoint-2" / "global_step2"
    shards = sorted(p.name for p in ckpt.glob("*optim_states.pt"))
    assert [s.split("zero_pp_rank_")[1].split("_")[0] for s in shards] == ["0", "1"], shards  # rank 0's and rank 1's
    assert not (cfg.paths.resolve("models") / "two" / "checkpoints" / "checkpoint-2" / "optimizer.pt").exists()
    _update(root, tiny_model_dir, "two", 2, ds)
    assert len(_runs(cfg, cfg.paths.resolve("models") / "two")) == 2
    assert (cfg.paths.resolve("models") / "two" / "update.json").exists()
