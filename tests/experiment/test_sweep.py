"""abpo.experiment.sweep: parsing --sweep, the probe grid, probe names, and the refusal to tune on test users
(the end-to-end sweep runs in tests/experiment/test_runner.py)."""

from __future__ import annotations

import pytest

from abpo.experiment.sweep import parse_sweep, probe_name, probes, sweep_markdown


def test_parse_and_grid():
    axes = parse_sweep(["update.learning_rate=1e-4, 5e-4", "update.group_size=8,16"])
    assert axes == [("update.learning_rate", ["1e-4", "5e-4"]), ("update.group_size", ["8", "16"])]
    grid = probes(axes)
    assert len(grid) == 4 and grid[0] == ["update.learning_rate=1e-4", "update.group_size=8"]
    assert probe_name(grid[-1]) == "learning_rate=5e-4,group_size=16"
    assert probe_name(["policy.tau=0.5"]) == "tau=0.5"


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("learning_rate=1e-4", "section.key"),
        ("update.learning_rate=", "section.key"),
        ("update.learning_rate", "section.key"),
        ("experiment.eval_split=test", "sweep's frame"),
        ("experiment.seeds=1,2", "sweep's frame"),
    ],
)
def test_bad_specs_name_the_rule(spec, msg):
    with pytest.raises(ValueError, match=msg):
        parse_sweep([spec])


def test_a_key_twice_and_no_key_are_refused():
    with pytest.raises(ValueError, match="each key once"):
        parse_sweep(["update.beta=0", "update.beta=0.04"])
    with pytest.raises(ValueError, match="at least one"):
        parse_sweep([])


def test_the_sweep_refuses_test_users(tmp_path):
    from abpo.config import load_config
    from abpo.experiment.sweep import run_sweep

    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    assert cfg.experiment.eval_split == "test"
    with pytest.raises(ValueError, match="validation users only"):
        run_sweep(cfg, parse_sweep(["update.beta=0,0.04"]), config_for=lambda ov: load_config("tiny", ov))
    assert not (tmp_path / "experiments").exists()  # refused before anything ran


def test_summary_markdown_lines():
    line = {
        "probe": "beta=0",
        "label": "(F) ABPO",
        "HR@5": 0.3,
        "HR@5_std": 0.01,
        "NDCG@5": 0.2,
        "NDCG@5_std": 0.01,
        "vs_none_dHR@5": 0.01,
        "vs_none_ci_low_HR@5": -0.01,
        "vs_none_ci_high_HR@5": 0.03,
        "vs_none_p_mcnemar_HR@5": 0.2,
        "vs_none_mde_HR@5": 0.02,
    }
    md = sweep_markdown([line], "s")
    assert (
        "| beta=0 | (F) ABPO | 0.3000 ± 0.0100 |" in md and "+0.0100 [-0.0100, +0.0300] (0.200)" in md
    )  # an old result: McNemar
    md = sweep_markdown([dict(line, **{"vs_none_p_HR@5": 0.04, "vs_none_p_holm_HR@5": 0.12})], "s")
    assert "+0.0100 [-0.0100, +0.0300] (0.120)" in md and "(p Holm)" in md  # the Holm-adjusted two-stage p
