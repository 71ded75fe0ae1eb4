"""abpo.experiment.regime_table: the 'Where ABPO differs from GRPO' lines restate each experiment's table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from abpo.experiment.regime_table import regime_label, regime_line, regime_table


def _experiment(tmp_path, name, logger="pi_init", clicks="simulator"):
    f = {
        "row": "abpo",
        "vs_grpo_dHR@5": -0.0123,
        "vs_grpo_ci_low_HR@5": -0.03,
        "vs_grpo_ci_high_HR@5": 0.005,
        "vs_grpo_p_HR@5": 0.2,
        "vs_grpo_p_holm_HR@5": 0.9,
        "vs_grpo_mde_HR@5": 0.021,
        "vs_grpo_dNDCG@5": 0.001,
        "vs_grpo_ci_low_NDCG@5": -0.01,
        "vs_grpo_ci_high_NDCG@5": 0.012,
        "vs_grpo_p_holm_NDCG@5": 0.8,
        "vs_none_dHR@5": 0.02,
        "vs_none_ci_low_HR@5": 0.001,
        "vs_none_ci_high_HR@5": 0.04,
        "vs_none_p_holm_HR@5": 0.0004,
    }
    exp = {
        "summary": {
            "name": name,
            "dataset": "movielens:ml-latest-small",
            "seeds": 5,
            "eval_users": 444,
            "eval_split": "test",
            "rounds": 6,
            "logger": logger,
            "clicks": clicks,
            "log_candidates": "offline",
            "group_size": 8,
            "wall_seconds": 1260,
            "primary_contrast": "abpo-grpo",
        },
        "table": [{"row": "none"}, {"row": "grpo"}, f],
        "rounds": [
            {
                "row": "abpo",
                "round": 6,
                "train_w_p99": 5.43,
                "train_w_ess_share": 0.47,
                "trend_vs_grpo_dslope_HR@5": -0.002,
                "trend_vs_grpo_dslope_ci_low_HR@5": -0.005,
                "trend_vs_grpo_dslope_ci_high_HR@5": 0.001,
                "trend_vs_grpo_dslope_p_holm_HR@5": 0.31,
            }
        ],
    }
    d = tmp_path / "experiments" / name
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps(exp))
    return d


def test_a_line_restates_the_experiment_with_the_primary_contrast_unadjusted(tmp_path):
    line = regime_line(json.loads((_experiment(tmp_path, "a") / "experiment.json").read_text()))
    assert line["F - B HR@5"] == "-0.0123 [-0.0300, +0.0050] (0.200, primary)"  # the unadjusted p
    assert line["F - B NDCG@5"] == "+0.0010 [-0.0100, +0.0120] (0.800)"
    assert line["F - A HR@5"] == "+0.0200 [+0.0010, +0.0400] (<0.001)" and line["F - A NDCG@5"] == "-"
    assert line["MDE F - B"] == "0.0210" and line["ŵ p99 / ESS share (F, last round)"] == "5.43 / 0.47"
    assert line["Δ slope HR@5 F - B per round"] == "-0.0020 [-0.0050, +0.0010] (0.310)"
    assert line["wall"] == "21.0 min" and line["design"] == "5 seeds × 444 test users, 6 round(s)"
    assert (
        regime_label({"logger": "foreign", "clicks": "simulator", "log_candidates": "paper", "group_size": 4})
        == "foreign × simulator clicks × M = 200 uniform × G = 4"
    )


def test_the_table_needs_rows_f_and_b_and_names_a_missing_experiment(tmp_path):
    d = _experiment(tmp_path, "a")
    exp = json.loads((d / "experiment.json").read_text())
    exp["table"] = [{"row": "none"}, {"row": "abpo"}]
    with pytest.raises(ValueError, match="needs rows abpo and grpo"):
        regime_line(exp)
    with pytest.raises(FileNotFoundError, match="no experiment.json"):
        regime_table([tmp_path / "missing"])


def test_cli_prints_the_table_of_named_experiments(tmp_path):
    _experiment(tmp_path, "a")
    _experiment(tmp_path, "b", logger="foreign")
    out = subprocess.run(
        [sys.executable, "-m", "abpo.cli", "experiment", "--set", f"paths.root={tmp_path}", "--regime-table", "a,b"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.startswith("| ml-latest-small")]
    assert len(lines) == 2 and "pi_init × simulator" in lines[0] and "foreign × simulator" in lines[1]
    bad = subprocess.run(
        [sys.executable, "-m", "abpo.cli", "experiment", "--set", f"paths.root={tmp_path}", "--regime-table", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "no experiment.json" in bad.stderr and "Traceback" not in bad.stderr
