"""`abpo experiment` (abpo.experiment.runner): the user split, the shared metric code, the paired tests, the
table, and an end-to-end run on a small MovieLens-format directory (cells reused on rerun, MLflow parent + nested
runs, outputs)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from abpo.data.splits import split_of_user
from abpo.experiment.evaluation import metrics_from_scores
from abpo.experiment.markdown import table_markdown
from abpo.experiment.rows import row_key, row_label
from abpo.experiment.table import paired_tests, table_rows
from tests.sizes import EXPERIMENT_MODEL, EXPERIMENT_TRAINING, EXPERIMENT_TWO_ROUNDS

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_rows_are_variants_or_baselines():
    assert [row_key(r) for r in ("A", "B", "F", "anchor_sc", "popularity")] == [
        "none",
        "grpo",
        "abpo",
        "anchor_sc",
        "popularity",
    ]
    assert (
        row_label("none") == "(A) No-Update"
        and row_label("abpo") == "(F) ABPO"
        and row_label("ml_retrain") == "ML-retrain"
    )
    with pytest.raises(ValueError, match="experiment.rows"):
        row_key("bogus")


def test_user_split_is_stable_and_near_its_fraction():
    users = range(5000)
    a = [split_of_user(u, 0.3) for u in users]
    assert a == [split_of_user(u, 0.3) for u in users]  # stable across calls (and processes: a hash, not random)
    share = a.count("validation") / len(a)
    assert abs(share - 0.3) < 3 * np.sqrt(0.3 * 0.7 / len(a))


def test_metrics_from_scores_by_hand():
    from abpo.data.candidates import Example

    cands = [10, 11, 12, 13, 14, 15]
    exs = [Example("u1", 1, [9], cands, 11), Example("u2", 2, [9], cands, 12)]
    scores = [[0.1, 0.9, 0.5, 0, 0, 0], [0.9, 0.1, 0.5, 0, 0, 0]]  # u1: target first; u2: target second
    pop = {10: 100, 11: 10, 12: 1, 13: 1, 14: 1, 15: 1}
    m = metrics_from_scores(exs, scores, pop)
    assert m["ranks"] == [1, 2] and m["users"] == [1, 2]
    assert m["HR@1"] == 0.5 and m["HR@5"] == 1.0
    assert m["NDCG@5"] == pytest.approx((1.0 + 1.0 / np.log2(3)) / 2)
    # top-1: item 11 (u1) and item 10 (u2); novelty (log 100 - log c)/(log 100 - log 1): 0.5 and 0 -> 25
    assert m["Diversity@1"] == pytest.approx(25.0)
    with pytest.raises(ValueError, match="scores for 6 candidates"):
        metrics_from_scores(exs[:1], [[0.1, 0.2]], pop)


def _cell(row, seed, ranks):
    return {
        "row": row,
        "seed": seed,
        "ranks": ranks,
        "users": list(range(len(ranks))),
        **{m: float(np.mean(np.asarray(ranks) <= 5)) for m in ("HR@1", "HR@5", "NDCG@5", "Diversity@1", "Diversity@5")},
    }


def test_paired_tests_count_discordant_users_by_hand():
    a = [_cell("abpo", 0, [1, 1, 1, 9, 9, 2]), _cell("abpo", 1, [1, 9, 9, 9, 9, 9])]
    b = [_cell("none", 0, [9, 9, 1, 9, 1, 2]), _cell("none", 1, [9, 9, 9, 9, 9, 9])]
    t = paired_tests(a, b)
    # seed 0: a wins users 0, 1; loses user 4; seed 1: a wins user 0 -> 3 wins, 1 loss over 12 units
    assert (t["units"], t["users"], t["seeds"], t["hr5_wins"], t["hr5_losses"]) == (12, 6, 2, 3, 1)
    assert t["dHR@5"] == pytest.approx(2 / 12)
    assert t["p_mcnemar_HR@5"] == pytest.approx(0.625)  # two-sided binomial, 1 of 4 discordant pairs
    # per-user differences averaged over seeds: user 0 (1+1)/2, user 1 1/2, user 4 -1/2, others 0
    d_u = np.array([1.0, 0.5, 0, 0, -0.5, 0])
    assert t["se_users_HR@5"] == pytest.approx(d_u.std(ddof=1) / np.sqrt(6))  # the user-only SE, an extra column
    assert t["ci_low_HR@5"] <= t["dHR@5"] <= t["ci_high_HR@5"]
    assert (
        0 < t["se_HR@5"] and 0 <= t["p_HR@5"] <= 1
    )  # the two-stage bootstrap's SE and p (tests/experiment/test_stats)
    assert paired_tests(a, a)["p_mcnemar_HR@5"] == 1.0 and paired_tests(a, a)["p_wilcoxon_NDCG@5"] == 1.0
    with pytest.raises(ValueError, match="different users"):
        paired_tests(a, [dict(b[0], users=[5, 4, 3, 2, 1, 0])])


def test_table_has_mean_std_over_seeds_and_tests_against_a_and_b():
    cells = [_cell(r, s, [1 + (s + i) % 7 for i in range(20)]) for r in ("none", "grpo", "abpo") for s in (0, 1, 2)]
    recs = table_rows(cells, ["none", "grpo", "abpo"])
    assert [r["row"] for r in recs] == ["none", "grpo", "abpo"] and all(r["seeds"] == 3 for r in recs)
    vals = [c["HR@5"] for c in cells if c["row"] == "abpo"]
    assert recs[2]["HR@5"] == pytest.approx(np.mean(vals)) and recs[2]["HR@5_std"] == pytest.approx(
        np.std(vals, ddof=1)
    )
    assert "vs_none_p_mcnemar_HR@5" in recs[2] and "vs_grpo_p_wilcoxon_NDCG@5" in recs[2]
    assert "vs_none_dHR@5" not in recs[0]  # a row is not tested against itself
    md = table_markdown(recs, title="t")
    assert md.count("\n| ") == 4 + 4 and "(F) ABPO" in md  # the metrics table, then the comparisons of A, B, F
    assert "MDE HR@5 vs A" in md and "[95% CI]" in md
    assert "95% two-stage bootstrap (seeds, then users)" in md and "(p Holm)" in md


def test_table_marks_the_primary_contrast_and_holm_adjusts_the_rest():
    from abpo.config.experiment import ExperimentConfig
    from abpo.experiment.stats import holm

    ranks = {
        "none": lambda s, i: 1 + (s + i) % 9,
        "grpo": lambda s, i: 1 + (s + i) % 9,
        "abpo": lambda s, i: 1 + (s + i) % 6,
    }
    cells = [_cell(r, s, [f(s, i) for i in range(60)]) for r, f in ranks.items() for s in (0, 1, 2)]
    e = ExperimentConfig(bootstrap_samples=300)
    recs = table_rows(cells, ["none", "grpo", "abpo"], e)
    f = recs[2]
    assert f["vs_grpo_primary"] and f["primary_reference"] == "grpo" and "vs_grpo_p_holm_HR@5" not in f
    family = [
        (recs[1], "none", "HR@5"),
        (recs[1], "none", "NDCG@5"),
        (f, "none", "HR@5"),
        (f, "none", "NDCG@5"),
        (f, "grpo", "NDCG@5"),
    ]  # B vs A (A vs B is the same comparison), F vs A and B, less the primary
    adj = holm([r[f"vs_{ref}_p_{m}"] for r, ref, m in family])
    assert [r[f"vs_{ref}_p_holm_{m}"] for r, ref, m in family] == pytest.approx(adj)
    assert recs[0]["vs_grpo_p_holm_HR@5"] == recs[1]["vs_none_p_holm_HR@5"]
    assert {"vs_none_ni_rel_p", "vs_none_non_inferior_rel", "vs_none_ni_p"} <= set(f)
    md = table_markdown(recs, title="t")
    assert ", primary)" in md and md.count(", primary)") == 1 and "rel 5%" in md
    with pytest.raises(ValueError, match="primary_contrast"):
        table_rows(cells, ["none", "abpo"], ExperimentConfig(primary_contrast="abpo"))


def test_rounds_table_has_the_trend_test_when_rounds_exceed_one():
    from abpo.config.experiment import ExperimentConfig
    from abpo.experiment.markdown import rounds_markdown
    from abpo.experiment.table import round_rows

    def cells(row, grow):
        return [
            dict(
                _cell(row, s, [1 if u < (10 * r if grow else 10) else 9 for u in range(40)]),
                round=r,
                match_positive=0.5,
                match_no_response=0.1,
            )
            for s in (0, 1)
            for r in (1, 2, 3)
        ]

    recs = round_rows(
        cells("grpo", False) + cells("abpo", True), ["grpo", "abpo"], ExperimentConfig(bootstrap_samples=200)
    )
    last = [r for r in recs if r["row"] == "abpo"][-1]
    assert last["round"] == 3 and last["trend_slope_HR@5"] == pytest.approx(0.25)
    assert last["trend_vs_grpo_dslope_HR@5"] == pytest.approx(0.25) and "trend_vs_grpo_dslope_p_holm_HR@5" in last
    assert "trend_vs_grpo_dslope_HR@5" not in [r for r in recs if r["row"] == "grpo"][-1]  # B is the reference
    md = rounds_markdown(recs)
    assert "HR@5 slope/round [95% CI] (p)" in md and "+0.2500 [" in md
    one = round_rows([c for c in cells("abpo", True) if c["round"] == 1], ["abpo"])
    assert "trend_slope_HR@5" not in one[0] and "slope/round" not in rounds_markdown(one)


def test_off_policy_value_is_the_snips_ratio_by_hand():
    """Eq. SNIPS-V: w = e/e0; V = sum w y / sum w; the ESS share (sum w)^2 / (n sum w^2). The logger itself
    (e = e0) gets the log's click rate."""
    from abpo.experiment.match_rates import off_policy_value

    v = off_policy_value([0.4, 0.1, 0.2, 0.3], [0.2, 0.1, 0.4, 0.3], [1, 0, 1, 0])
    w = [2.0, 1.0, 0.5, 1.0]
    assert v["ope_snips"] == pytest.approx((2.0 + 0.5) / sum(w))
    assert v["ope_ess_share"] == pytest.approx(sum(w) ** 2 / (4 * sum(x * x for x in w)))
    own = off_policy_value([0.2, 0.1, 0.4], [0.2, 0.1, 0.4], [1, 0, 0])
    assert own["ope_snips"] == pytest.approx(1 / 3) and own["ope_ess_share"] == pytest.approx(1.0)
    assert math.isnan(off_policy_value([], [], [])["ope_snips"])


def test_training_diagnostics_and_match_curves_come_from_the_update_history():
    """The per-cell means of the per-step diagnostics (the max for w_max), and the training-time match curves per
    stratum: x = round - 1 + the step's bin centre, averaged over seeds."""
    from abpo.experiment.markdown import rounds_markdown
    from abpo.experiment.match_rates import training_diagnostics
    from abpo.experiment.outputs import training_match_curves

    def cell(seed, r, pos, neg):
        hist = [
            {
                "step": float(k),
                "abpo/match_rate/positive": pos[k - 1],
                "abpo/match_rate/no_response": neg,
                "abpo/w_p99": 2.0 * k,
                "abpo/w_max": 10.0 * k,
                "abpo/gamma_ratio": 0.8,
                "abpo/advantages/no_response_abs_share": 0.5 + 0.2 * k,
            }
            for k in (1, 2)
        ]
        return {"row": "abpo", "seed": seed, "round": r, "update": {"history": hist}}

    d = training_diagnostics(cell(0, 1, [0.2, 0.4], 0.1))
    assert d["train_match_positive"] == pytest.approx(0.3) and d["train_w_p99"] == pytest.approx(3.0)
    assert d["train_w_max"] == 20.0 and d["train_gamma_ratio"] == pytest.approx(0.8)
    assert d["train_no_response_abs_share"] == pytest.approx(0.8)  # the mean of 0.7 and 0.9
    assert math.isnan(d["train_w_ess_share"])  # not logged
    assert all(math.isnan(v) for v in training_diagnostics({"row": "none"}).values())  # trained nothing
    cells = [cell(0, 1, [0.2, 0.4], 0.1), cell(1, 1, [0.4, 0.6], 0.3), cell(0, 2, [0.5, 0.5], 0.2)]
    xs, ys = training_match_curves(cells, bins=2)["abpo"]["positive"]
    assert xs == [0.25, 0.75, 1.25, 1.75] and ys == pytest.approx([0.3, 0.5, 0.5, 0.5])
    assert training_match_curves(cells, bins=2)["abpo"]["no_response"][1] == pytest.approx([0.2, 0.2, 0.2, 0.2])
    md = rounds_markdown(
        [
            {
                "row": "abpo",
                "label": "(F) ABPO",
                "round": 1,
                **{
                    m: 0.5
                    for m in ("HR@5", "NDCG@5", "Diversity@5", "match_positive", "match_no_response", "ope_snips")
                },
                **{
                    f"{m}_std": 0.0
                    for m in ("HR@5", "NDCG@5", "Diversity@5", "match_positive", "match_no_response", "ope_snips")
                },
                "train_w_p99": 5.5,
                "train_gamma_ratio": float("nan"),
            }
        ]
    )
    assert "off-policy CTR (SNIPS, own log)" in md and "ŵ p99 (train)" in md and "| 5.500 |" in md
    assert "γ ratio" not in md  # a diagnostic no row has is left out


@pytest.mark.slow
def test_experiment_end_to_end_on_a_movielens_format_directory(tmp_path, caplog, small_movielens):
    """Two seeds x (No-Update, vanilla GRPO, ABPO, popularity, ML-retrain) on 40 users with a very small model:
    every cell computed once, the table/CSV/PNG written, the workers' progress logged through this process's loggers,
    MLflow holds the parent and one nested run per cell, and a rerun recomputes nothing."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config
    from abpo.experiment.runner import run_experiment

    data = small_movielens(tmp_path / "ml40")
    overrides = [
        f"paths.root={tmp_path / 'var'}",
        f"data.dataset_dir={data}",
        "data.eval_candidates=20",
        "experiment.eval_candidates=0",
        "experiment.update_steps=0",
        *EXPERIMENT_MODEL,
        *EXPERIMENT_TRAINING,
        "experiment.seeds=0,1",
        "experiment.rows=none,grpo,abpo,popularity,ml_retrain",
        "experiment.workers=1",
        "experiment.name=t",
    ]
    cfg = load_config("tiny", overrides)
    with caplog.at_level(logging.INFO, logger="abpo"):
        res = run_experiment(cfg, config_ref="tiny", overrides=overrides)
    assert res.computed == 10 and res.reused == 0
    assert [r["row"] for r in res.table] == ["none", "grpo", "abpo", "popularity", "ml_retrain"]
    for key in ("csv", "md", "png", "json"):
        assert res.outputs[key].exists() and res.outputs[key].stat().st_size > 0
    cells = sorted((res.exp_dir / "cells").glob("*.json"))
    assert len(cells) == 10
    f = json.loads((res.exp_dir / "cells" / "seed1-abpo.json").read_text())
    assert f["update"]["steps"] == 2 and f["update"]["history"][0]["abpo/rollouts/well_formed"] == 1.0
    a, b = (json.loads((res.exp_dir / "cells" / f"seed0-{r}.json").read_text()) for r in ("none", "popularity"))
    assert a["users"] == b["users"] and len(a["users"]) > 0  # every row scored on the same users
    assert "[seed 0 abpo] update step 2/2" in caplog.messages  # a worker's line (abpo.logs.from_workers)
    assert any(m.startswith("[seed 1] pi_init and its D_bandit ready") for m in caplog.messages)
    assert any("wall time" in m for m in caplog.messages)

    registry.configure(cfg)
    client = MlflowClient()
    exp = client.get_experiment_by_name(cfg.experiment.mlflow_experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 11
    assert "abpo.HR_at_5" in parents[0].data.metrics and "none.NDCG_at_5" in parents[0].data.metrics

    again = run_experiment(cfg, config_ref="tiny", overrides=overrides)
    assert again.computed == 0 and again.reused == 10
    assert again.table[2]["HR@5"] == res.table[2]["HR@5"]


AMAZON = Path(__file__).resolve().parents[3] / "shared" / "data" / "amazon18"


@pytest.mark.slow
@pytest.mark.skipif(not (AMAZON / "index").is_dir(), reason="../shared/data/amazon18 not present (not vendored)")
def test_experiment_runs_on_an_amazon18_domain(tmp_path):
    """The amazon18 preset (Office_Products, read in place) with the same runner: 60 users, a very small model, one
    seed."""
    from abpo.config import load_config
    from abpo.experiment.runner import run_experiment

    overrides = [
        f"paths.root={tmp_path / 'var'}",
        f"data.dataset_dir={AMAZON}",
        "data.max_users=60",
        "experiment.eval_candidates=20",
        "policy.tiny_hidden_size=32",
        "policy.tiny_intermediate_size=64",
        "policy.tiny_vocab_size=800",
        "update.max_completion_length=128",
        "sft.max_steps=4",
        "update.max_steps=1",
        "update.batch_size=4",
        "update.save_steps=100",
        "experiment.seeds=0",
        "experiment.rows=none,abpo,popularity",
        "experiment.workers=1",
        "experiment.name=amazon",
    ]
    res = run_experiment(load_config("amazon18", overrides), config_ref="amazon18", overrides=overrides)
    assert res.computed == 3 and [r["row"] for r in res.table] == ["none", "abpo", "popularity"]
    assert "Office_Products" in res.outputs["md"].read_text()


def test_round_windows_partition_the_update_positions():
    from abpo.experiment.seeds import round_positions

    for n in (1, 2, 5, 12):
        for rounds in range(1, n + 1):
            windows = [list(round_positions(n, r, rounds)) for r in range(1, rounds + 1)]
            assert [i for w in windows for i in w] == list(range(n))  # consecutive, in order, each position once
            assert max(map(len, windows)) - min(map(len, windows)) <= 1 and all(windows)
    assert list(round_positions(12, 2, 3)) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="round 4"):
        round_positions(12, 4, 3)


def test_round_months_follow_the_experiment_month():
    from abpo.experiment.seeds import round_month

    assert [round_month("2024-11", r) for r in (1, 2, 3)] == ["2024-11", "2024-12", "2025-01"]


def test_experiment_config_applies_and_checks_its_settings():
    from abpo.config import load_config
    from abpo.experiment.rows import experiment_config

    cfg = experiment_config(load_config("tiny", ["experiment.update_steps=12", "experiment.eval_candidates=200"]))
    assert (cfg.data.update_steps, cfg.data.eval_candidates) == (12, 200)
    kept = experiment_config(load_config("tiny", ["experiment.update_steps=0", "experiment.eval_candidates=0"]))
    assert (kept.data.update_steps, kept.data.eval_candidates) == (4, 100)  # data's own values
    for bad, msg in (
        ("experiment.rounds=0", "experiment.rounds 0: rule: >= 1"),
        ("experiment.rounds=13", "data.update_steps=12"),
        ("experiment.update_steps=-1", "experiment.update_steps -1: rule: >= 0"),
        ("experiment.bootstrap_samples=0", "bootstrap_samples"),
    ):
        with pytest.raises(ValueError, match=msg):
            experiment_config(load_config("tiny", [bad]))


def test_pi_init_is_shared_across_tau_but_not_seeds_and_cells_are_keyed_by_round():
    from abpo.config import load_config
    from abpo.experiment.cells import cell_fingerprint
    from abpo.experiment.seeds import pi_init_key

    base = load_config("tiny")
    other_tau = load_config("tiny", ["policy.tau=0.5"])
    assert pi_init_key(base, 0) == pi_init_key(other_tau, 0) != pi_init_key(base, 1)
    assert pi_init_key(base, 0) != pi_init_key(load_config("tiny", ["sft.learning_rate=0.01"]), 0)
    fp = cell_fingerprint(base, "abpo", 0, 1)
    assert fp != cell_fingerprint(base, "abpo", 0, 2) != cell_fingerprint(base, "grpo", 0, 2)
    assert fp != cell_fingerprint(load_config("tiny", ["experiment.rounds=3"]), "abpo", 0, 1)
    assert fp != cell_fingerprint(load_config("tiny", ["update.learning_rate=0.001"]), "abpo", 0, 1)
    # No-Update and the baselines do not depend on the update settings: a sweep of them reuses these cells
    lr = load_config("tiny", ["update.learning_rate=0.001"])
    assert cell_fingerprint(base, "none", 0, 1) == cell_fingerprint(lr, "none", 0, 1)
    assert cell_fingerprint(base, "popularity", 0, 1) == cell_fingerprint(lr, "popularity", 0, 1)
    fi = load_config("tiny", ["experiment.full_info_learning_rate=0.01"])
    assert cell_fingerprint(base, "full_info", 0, 1) != cell_fingerprint(fi, "full_info", 0, 1)
    assert cell_fingerprint(base, "abpo", 0, 1) == cell_fingerprint(fi, "abpo", 0, 1)


def test_an_added_update_key_enters_the_fingerprint_only_away_from_its_default():
    from abpo.config import load_config
    from abpo.experiment.cells import ADDED_UPDATE_KEYS, cell_fingerprint
    from abpo.experiment.rows import experiment_config

    base = experiment_config(load_config("tiny"))
    assert ADDED_UPDATE_KEYS["self_certainty_positions"] == base.update.self_certainty_positions == "choice"
    answer = experiment_config(load_config("tiny", ["update.self_certainty_positions=answer"]))
    assert cell_fingerprint(answer, "abpo", 0, 1) != cell_fingerprint(base, "abpo", 0, 1)
    assert cell_fingerprint(answer, "none", 0, 1) == cell_fingerprint(base, "none", 0, 1)


def test_an_added_sft_key_enters_the_fingerprint_only_away_from_its_default():
    from abpo.config import load_config
    from abpo.experiment.cells import ADDED_SFT_KEYS, cell_fingerprint
    from abpo.experiment.rows import experiment_config

    base = experiment_config(load_config("tiny"))
    assert ADDED_SFT_KEYS["item_init"] == base.sft.item_init == "random"
    als = experiment_config(load_config("tiny", ["sft.item_init=als"]))
    assert cell_fingerprint(als, "abpo", 0, 1) != cell_fingerprint(base, "abpo", 0, 1)
    assert cell_fingerprint(als, "none", 0, 1) != cell_fingerprint(base, "none", 0, 1)  # pi_init itself differs


def test_how_often_checkpoints_and_metrics_are_written_enters_no_fingerprint():
    """update.save_steps / save_total_limit / logging_steps change no result (abpo.experiment.cells
    RESULT_FREE_UPDATE_KEYS): a checkpoint interval set for speed keeps every cached cell; a learning rate does not."""
    from abpo.config import load_config
    from abpo.experiment.cells import cell_fingerprint
    from abpo.experiment.rows import experiment_config

    base = experiment_config(load_config("tiny"))
    for kv in ("update.save_steps=100", "update.save_total_limit=0", "update.logging_steps=5"):
        other = experiment_config(load_config("tiny", [kv]))
        assert cell_fingerprint(other, "abpo", 0, 1) == cell_fingerprint(base, "abpo", 0, 1), kv
    lr = experiment_config(load_config("tiny", ["update.learning_rate=0.001"]))
    assert cell_fingerprint(lr, "abpo", 0, 1) != cell_fingerprint(base, "abpo", 0, 1)


def test_cell_fingerprints_of_the_tiny_preset_are_pinned():
    """Cells are cached under their fingerprint: a change of these values makes every cached cell recompute. The
    run inputs that left section ``update`` (abpo.train.runs.UpdateRun) keep their old values in the digest
    (RETIRED_UPDATE_KEYS), so these are the fingerprints from before they left. Update the pins only for a change
    that is meant to invalidate the cache."""
    from abpo.config import load_config
    from abpo.experiment.cells import cell_fingerprint
    from abpo.experiment.rows import experiment_config

    cfg = experiment_config(load_config("tiny"))
    assert {row: cell_fingerprint(cfg, row, 0, 1) for row in ("abpo", "grpo", "none", "full_info", "popularity")} == {
        "abpo": "f27fe5069103f35b",
        "grpo": "1575ecb5b862dc0b",
        "none": "b631ac967f1d35b8",
        "full_info": "0def14c7a32f9ac4",
        "popularity": "1d9c3eeb4d699508",
    }


@pytest.mark.slow
def test_rounds_full_information_and_sweep_end_to_end(tmp_path, small_movielens):
    """Two rounds of No-Update, ABPO and the full-information row on 40 users: round 2 starts from round 1's model
    and logs with it, the match rates are probabilities, the rounds table/plot are written; a rerun computes
    nothing; a sweep of the update's learning rate over two probes reuses No-Update's cells and refuses the test
    users."""
    import pyarrow.parquet as pq

    from abpo.config import load_config
    from abpo.experiment.runner import run_experiment
    from abpo.experiment.sweep import parse_sweep, run_sweep

    data = small_movielens(tmp_path / "ml40")
    overrides = [
        f"paths.root={tmp_path / 'var'}",
        f"data.dataset_dir={data}",
        *EXPERIMENT_TWO_ROUNDS,
        *EXPERIMENT_TRAINING,
        "experiment.bootstrap_samples=100",
        "experiment.seeds=0",
        "experiment.rows=none,abpo,full_info",
        "experiment.workers=1",
        "experiment.name=r",
    ]
    cfg = load_config("tiny", overrides)
    res = run_experiment(cfg, config_ref="tiny", overrides=overrides)
    assert res.computed == 6 and res.reused == 0
    assert [(r["row"], r["round"]) for r in res.rounds] == [
        ("none", 1),
        ("none", 2),
        ("abpo", 1),
        ("abpo", 2),
        ("full_info", 1),
        ("full_info", 2),
    ]
    cells = {p.name: json.loads(p.read_text()) for p in (res.exp_dir / "cells").glob("*.json")}
    r1, r2 = cells["seed0-abpo-r1of2.json"], cells["seed0-abpo-r2of2.json"]
    assert r1["update"]["steps"] == 2 and r2["update"]["steps"] == 2
    assert r1["model_dir"] != r2["model_dir"] and Path(r1["model_dir"]).exists()
    assert r1["log_rows"] == r2["log_rows"] > 0  # 4 update positions: 2 per window and user
    for c in cells.values():
        assert 0 <= c["match_positive"] <= 1 and 0 <= c["match_no_response"] <= 1
        assert 0 <= c["ope_snips"] <= 1 and 0 < c["ope_ess_share"] <= 1  # the round policy's off-policy CTR
    assert r1["ope_ess_share"] < 1 and cells["seed0-none-r1of2.json"]["ope_ess_share"] == pytest.approx(1.0)
    assert cells["seed0-full_info-r1of2.json"]["full_info"]["examples"] == r1["log_rows"]
    # No-Update's rates come from the log's stored propensities: the same as scoring the log with pi_init again
    from abpo.experiment.match_rates import match_rates
    from abpo.experiment.seeds import load_model, load_seed, pi_init_log

    ctx = load_seed(cfg, 0)
    rescored = match_rates(*load_model(ctx, ctx.pi_init_dir), ctx, pi_init_log(ctx, 1, 2))
    none1 = cells["seed0-none-r1of2.json"]
    assert none1["match_positive"] == pytest.approx(rescored["match_positive"], abs=1e-6)
    assert none1["match_no_response"] == pytest.approx(rescored["match_no_response"], abs=1e-6)
    assert (none1["log_rows"], none1["log_clicks"]) == (rescored["log_rows"], rescored["log_clicks"])
    # No-Update's round-2 log was logged by pi_init on window 2 (its own store), ABPO's by its round-1 model
    store_logs = sorted((Path(cfg.paths.resolve("root")) / "experiments" / "_pi_init").glob("*/d_bandit/*.parquet"))
    assert [p.name.split("-")[0] for p in store_logs] == ["r1of2", "r2of2"]
    assert pq.read_table(store_logs[1]).num_rows == r2["log_rows"]
    for key in ("rounds_csv", "rounds_png", "train_match_png", "md"):
        assert res.outputs[key].stat().st_size > 0
    assert "#### Rounds" in res.outputs["md"].read_text()

    again = run_experiment(cfg, config_ref="tiny", overrides=overrides)
    assert again.computed == 0 and again.reused == 6

    val = [
        *overrides,
        "experiment.eval_split=validation",
        "experiment.rounds=1",
        "experiment.rows=none,abpo",
        "experiment.name=s",
    ]
    axes = parse_sweep(["update.learning_rate=1e-4,1e-3"])
    sweep = run_sweep(load_config("tiny", val), axes, config_for=lambda ov: load_config("tiny", ov), overrides=val)
    assert [(line["probe"], line["row"]) for line in sweep.lines] == [
        ("learning_rate=1e-4", "none"),
        ("learning_rate=1e-4", "abpo"),
        ("learning_rate=1e-3", "none"),
        ("learning_rate=1e-3", "abpo"),
    ]
    assert sweep.lines[0]["HR@5"] == sweep.lines[2]["HR@5"]  # the same No-Update cell, computed once
    assert (sweep.sweep_dir / "learning_rate=1e-3" / "table.md").exists() and sweep.outputs["md"].exists()
    with pytest.raises(ValueError, match="validation users only"):
        run_sweep(
            load_config("tiny", overrides), axes, config_for=lambda ov: load_config("tiny", ov), overrides=overrides
        )
