"""The `update` section, its mapping onto trl.GRPOConfig (CPU preset built for real, GPU preset checked as
keyword arguments: no GPU or DeepSpeed here), the DeepSpeed file, D_bandit -> trainer rows, and `abpo update`
failing clearly when its inputs do not exist."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest

from abpo.config import load_config
from abpo.paths import REPO_ROOT
from abpo.train.grpo_args import grpo_config, grpo_kwargs


def test_every_update_knob_is_documented():
    from abpo.config.update import UpdateConfig

    for f in dataclasses.fields(UpdateConfig):
        assert f.metadata.get("help"), f"update.{f.name} has no help text"


def test_an_updates_run_inputs_are_arguments_not_settings(tmp_path):
    """What one update trains (UpdateRun) names its directories; section `update` holds none of it."""
    from pathlib import Path

    from abpo.config.update import UpdateConfig
    from abpo.months import Month, MonthError
    from abpo.train.grpo_args import output_dir_for
    from abpo.train.runs import UpdateRun
    from abpo.train.update import init_dir_for

    settings = {f.name for f in dataclasses.fields(UpdateConfig)}
    assert not {"variant", "arm", "months", "init_model", "output_name"} & settings
    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    models = tmp_path / "models"
    run = UpdateRun(variant="B", months=("2026-01", "2026-03"))
    assert run.months == ("2026-01", "2026-03") and all(isinstance(m, Month) for m in run.months)
    assert output_dir_for(cfg, run) == models / f"update-B-2026-01_2026-03-seed{cfg.seed}"
    assert output_dir_for(cfg, UpdateRun()) == models / f"update-F-all-seed{cfg.seed}"
    assert output_dir_for(cfg, UpdateRun(output=Path("arms/abpo/2026-01"))) == models / "arms/abpo/2026-01"
    assert output_dir_for(cfg, UpdateRun(output=tmp_path / "elsewhere")) == tmp_path / "elsewhere"
    assert init_dir_for(cfg, UpdateRun()) == models / cfg.sft.output
    assert init_dir_for(cfg, UpdateRun(init_model=tmp_path / "m")) == tmp_path / "m"
    with pytest.raises(MonthError, match="update month '2026-13'"):
        UpdateRun(months=("2026-13",))


def test_tiny_preset_builds_a_cpu_grpo_config(tmp_path):
    cfg = load_config("tiny")
    args = grpo_config(cfg.update, "abpo", output_dir=tmp_path, seed=cfg.seed)
    g = cfg.update.group_size
    assert args.num_generations == g - 1  # the anchor is not sampled
    assert args.per_device_train_batch_size == cfg.update.batch_size * (g - 1)
    assert args.generation_batch_size // args.num_generations == cfg.update.batch_size * cfg.update.grad_accum
    assert args.shuffle_dataset is False and args.num_iterations == 1
    assert args.bf16 is False and args.use_vllm is False and args.report_to == []
    grpo = grpo_config(cfg.update, "grpo", output_dir=tmp_path, seed=0)
    assert grpo.num_generations == g  # vanilla GRPO samples all G


def test_gpu_preset_maps_the_paper_values():
    cfg = load_config("gpu")
    kw = grpo_kwargs(cfg.update, "abpo", output_dir="/tmp/x", seed=cfg.seed)
    assert kw["num_generations"] == 15 and kw["per_device_train_batch_size"] == 4 * 15  # G = 16, batch 4
    assert kw["gradient_accumulation_steps"] == 8 and kw["learning_rate"] == 5e-5
    assert kw["warmup_steps"] == 0.05 and kw["weight_decay"] == 0.01 and kw["max_grad_norm"] == 1.0
    assert kw["bf16"] and kw["activation_checkpointing"] and kw["optim"] == "paged_adamw_8bit"
    assert kw["use_vllm"] and kw["vllm_mode"] == "colocate" and kw["num_train_epochs"] == 1
    assert kw["deepspeed"] == str(REPO_ROOT / "configs" / "deepspeed_zero2.json")
    assert cfg.policy.lora_r == 8 and cfg.policy.lora_alpha == 16 and cfg.policy.lora_dropout == 0.0


def test_deepspeed_file_is_zero2_with_trainer_managed_values():
    ds = json.loads((REPO_ROOT / "configs" / "deepspeed_zero2.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2
    # batch sizes, accumulation, clipping and precision come from the Trainer ("auto"), never hard-coded twice
    for key in (
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "train_batch_size",
    ):
        assert ds[key] == "auto"
    assert ds["bf16"]["enabled"] == "auto"


@pytest.fixture
def _impressions(make_impressions):
    def make(titles, ys):
        rows = make_impressions(titles, len(ys))
        for r, y in zip(rows, ys):
            r["clicked"] = y
        return rows

    return make


def test_rows_follow_the_log_and_the_prompt_format(tiny_titles, tiny_policy_cfg, load_tiny, _impressions):
    from abpo.policy.prompt import build_prompt, format_answer
    from abpo.train.dataset import COLUMNS, BatchingReport, build_update_rows

    _, tok = load_tiny()
    imps = _impressions(tiny_titles, [1, 0, 0, 1])
    report = BatchingReport()
    rows = build_update_rows([imps], tiny_titles, tok, tiny_policy_cfg, examples_per_batch=4, report=report)
    assert [set(r) for r in rows] == [set(COLUMNS)] * 4
    for r, imp in zip(rows, imps):
        assert r["a_log"] == imp["item_id"] and r["y"] == imp["clicked"] and r["e0"] == imp["propensity"]
        assert r["anchor_text"] == format_answer(imp["item_id"], tiny_titles[imp["item_id"]])
        assert r["candidate_answers"] == [format_answer(c, tiny_titles[c]) for c in imp["candidates"]]
        hist = [tiny_titles[i] for i in imp["history"]]
        assert r["prompt"] == [
            {
                "role": "user",
                "content": build_prompt(
                    hist, [(c, tiny_titles[c]) for c in imp["candidates"]], tiny_policy_cfg.max_history
                ),
            }
        ]
    assert report.batches == 1 and report.rows_in_batches == 4


def test_rows_reject_bad_batches_and_bad_rows(tiny_titles, tiny_policy_cfg, load_tiny, _impressions):
    from abpo.train.dataset import BatchingReport, UpdateDataError, build_update_rows

    _, tok = load_tiny()
    with pytest.raises(UpdateDataError, match="both a positive and a no-response"):
        build_update_rows(
            [_impressions(tiny_titles, [1, 1])],
            tiny_titles,
            tok,
            tiny_policy_cfg,
            examples_per_batch=2,
            report=BatchingReport(),
        )
    bad = _impressions(tiny_titles, [1, 0])
    bad[1]["item_id"] = -5
    with pytest.raises(UpdateDataError, match=r"impression imp-0-1: item_id -5 is not in its candidates"):
        build_update_rows([bad], tiny_titles, tok, tiny_policy_cfg, examples_per_batch=2, report=BatchingReport())
    report = BatchingReport()
    rows = build_update_rows(
        [_impressions(tiny_titles, [1, 0]), _impressions(tiny_titles, [1])],
        tiny_titles,
        tok,
        tiny_policy_cfg,
        examples_per_batch=2,
        report=report,
    )
    assert len(rows) == 2 and report.rows_not_in_batches == 1 and "not a full batch" in report.notes[0]


def test_dataset_from_warehouse_strata_is_stratified(tiny_titles, tiny_policy_cfg, load_tiny, _impressions):
    from abpo.train.dataset import update_dataset_from_strata

    _, tok = load_tiny()
    imps = _impressions(tiny_titles, [1, 0, 0, 0, 1, 0, 0, 0, 0, 1])
    pos = pa.Table.from_pylist([r for r in imps if r["clicked"] == 1])
    neg = pa.Table.from_pylist([r for r in imps if r["clicked"] == 0])
    ds, report = update_dataset_from_strata(pos, neg, tiny_titles, tok, tiny_policy_cfg, examples_per_batch=4, seed=3)
    ys = ds["y"]
    assert len(ys) % 4 == 0
    for b in range(0, len(ys), 4):
        assert set(ys[b : b + 4]) == {0, 1}, f"batch {b // 4} is not stratified"
    assert report.rows_not_in_batches == 0  # every logged row is used at least once
    assert {r for r in ds["request_id"]} == {r["impression_id"] for r in imps}
    with pytest.raises(ValueError, match="both strata"):
        update_dataset_from_strata(
            pos.slice(0, 0), neg, tiny_titles, tok, tiny_policy_cfg, examples_per_batch=4, seed=0
        )
    # update.stratification=proportional: each logged row at most once; the rows filling no batch are reported
    ds, report = update_dataset_from_strata(
        pos, neg, tiny_titles, tok, tiny_policy_cfg, examples_per_batch=4, seed=3, stratification="proportional"
    )
    assert len(ds) == 8 and len(set(ds["request_id"])) == 8 and report.rows_repeated == 0
    assert report.rows_not_in_batches == 2 and "not placed in any batch" in report.notes[-1]
    for b in range(0, 8, 4):
        assert set(ds["y"][b : b + 4]) == {0, 1}


def test_cli_update_names_the_missing_input(tmp_path, capsys):
    from abpo.cli import main

    rc = main(["update", "--set", f"paths.root={tmp_path}", "--max-steps", "1"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "abpo sft" in err and str(tmp_path) in err
    rc = main(["update", "--variant", "Z", "--set", f"paths.root={tmp_path}"])
    assert rc == 2 and "unknown variant" in capsys.readouterr().err


def test_subsample_keeps_both_strata_in_proportion():
    from abpo.train.dataset import subsample_strata

    pos = pa.table({"impression_id": [f"p{i}" for i in range(10)]})
    neg = pa.table({"impression_id": [f"n{i}" for i in range(90)]})
    p2, n2, note = subsample_strata(pos, neg, 20, seed=1)
    assert (p2.num_rows, n2.num_rows) == (2, 18) and "kept 2 of 10 positive" in note
    again = subsample_strata(pos, neg, 20, seed=1)
    assert again[0].equals(p2) and again[1].equals(n2)  # seeded
    p3, n3, _ = subsample_strata(pos.slice(0, 1), neg, 10, seed=1)
    assert p3.num_rows == 1 and n3.num_rows == 9  # a rare stratum is never sampled away
    assert subsample_strata(pos, neg, 0, seed=1)[2] is None  # 0 = the whole log


def test_run_update_from_the_warehouse_needs_the_gate_settings_as_arguments(tmp_path):
    """Section `arms` sits above abpo.train in the layers: run_update reading D_bandit from the warehouse takes
    arms.gate_users / arms.gate_holdout_fraction from its caller, and refuses before a model loads without them."""
    from abpo.train.runs import UpdateRun
    from abpo.train.update import run_update

    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    with pytest.raises(ValueError, match="gate_users / gate_holdout_fraction; rule: reading D_bandit"):
        run_update(cfg, UpdateRun(variant="abpo", init_model=tmp_path / "no-model"), log_mlflow=False)
    assert not (tmp_path / "models").exists()  # nothing was written


def test_abpo_train_reads_no_config_section_above_its_layer():
    """abpo.train receives the values of the sections above it (arms, experiment, sim, monthly...) as arguments:
    no `cfg.<section>` read of theirs in its sources (import-linter cannot see attribute reads)."""
    import re

    above = ("arms", "experiment", "sim", "monthly", "report", "serving", "abtest")
    pattern = re.compile(r"\bcfg\.(" + "|".join(above) + r")\b")
    hits = [
        f"{p.name}:{i}: {line.strip()}"
        for p in sorted((REPO_ROOT / "abpo" / "train").glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), start=1)
        if pattern.search(line)
    ]
    assert not hits, f"abpo/train reads config sections above its layer: {hits}"
