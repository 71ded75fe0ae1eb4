"""The experiment's logging regimes (abpo.experiment.regimes, issue 29): the config keys and the cell fingerprints,
each logger's log (its own propensities, the logging_arm column), the simulator's clicks, the paper's candidates,
the GRPO control rows, the --regime presets, and a two-round end-to-end run with pi_init logging every round and
simulator clicks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.sizes import EXPERIMENT_TRAINING, EXPERIMENT_TWO_ROUNDS

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, small_movielens):
    return small_movielens(tmp_path_factory.mktemp("regimes") / "ml40")


def _cfg(data_dir, tmp_path, *overrides):
    from abpo.config import load_config

    return load_config(
        "tiny", [f"paths.root={tmp_path / 'var'}", f"data.dataset_dir={data_dir}", *EXPERIMENT_TWO_ROUNDS, *overrides]
    )


def _ctx(data_dir, tmp_path, *overrides):
    from abpo.experiment.seeds import load_seed

    return load_seed(_cfg(data_dir, tmp_path, *overrides), 0)


def _tiny_model(ctx):
    """A freshly initialised tiny policy (seeded): a real LLM logger without training one."""
    from abpo.policy.model import load_policy

    model, tok = load_policy(ctx.cfg.policy, ctx.cfg.paths, dataset=ctx.dataset, seed=0)
    model.eval()
    return model, tok


def test_the_default_regime_keeps_every_fingerprint_and_each_factor_changes_them():
    from abpo.config import load_config
    from abpo.experiment.cells import cell_fingerprint
    from abpo.experiment.rows import experiment_config

    base = experiment_config(load_config("tiny"))
    explicit = experiment_config(
        load_config(
            "tiny",
            [
                "experiment.logger=on_policy",
                "experiment.clicks=next_item",
                "experiment.log_candidates=offline",
                "experiment.foreign_logger=popularity",
                "experiment.foreign_temperature=3",
                "experiment.log_candidate_count=50",
            ],
        )
    )
    for row in ("abpo", "grpo", "none", "full_info", "popularity"):
        assert cell_fingerprint(base, row, 0, 1) == cell_fingerprint(explicit, row, 0, 1)
    seen = {cell_fingerprint(base, "abpo", 0, 1)}
    for ov in (
        ["experiment.logger=pi_init"],
        ["experiment.logger=uniform"],
        ["experiment.logger=mixed"],
        ["experiment.logger=foreign"],
        ["experiment.logger=foreign", "experiment.foreign_logger=popularity"],
        ["experiment.logger=foreign", "experiment.foreign_temperature=2"],
        ["experiment.clicks=simulator"],
        ["experiment.clicks=simulator", "sim.base_ctr=0.2"],
        ["experiment.log_candidates=paper"],
        ["experiment.log_candidates=paper", "experiment.log_candidate_count=50"],
    ):
        fp = cell_fingerprint(experiment_config(load_config("tiny", ov)), "abpo", 0, 1)
        assert fp not in seen, ov
        seen.add(fp)
    # sim settings only matter with simulator clicks, the rankers only with a ranker that logs
    assert cell_fingerprint(base, "abpo", 0, 1) == cell_fingerprint(
        experiment_config(load_config("tiny", ["sim.base_ctr=0.2"])), "abpo", 0, 1
    )
    assert cell_fingerprint(base, "abpo", 0, 1) == cell_fingerprint(
        experiment_config(load_config("tiny", ["arms.popularity.temperature=7"])), "abpo", 0, 1
    )


def test_regime_keys_are_checked_with_the_key_named():
    from abpo.config import load_config
    from abpo.experiment.rows import experiment_config

    for bad, msg in (
        ("experiment.logger=greedy", "experiment.logger"),
        ("experiment.clicks=all", "experiment.clicks"),
        ("experiment.log_candidates=big", "experiment.log_candidates"),
        ("experiment.foreign_logger=als", "experiment.foreign_logger"),
        ("experiment.foreign_temperature=-1", "foreign_temperature"),
        ("experiment.log_candidate_count=1", "log_candidate_count"),
    ):
        with pytest.raises(ValueError, match=msg):
            experiment_config(load_config("tiny", [bad]))


def test_uniform_logger_over_the_papers_candidates(data_dir, tmp_path):
    from abpo.experiment.regimes import regime_log, shared_log, shared_log_path

    ctx = _ctx(
        data_dir,
        tmp_path,
        "experiment.logger=uniform",
        "experiment.log_candidates=paper",
        "experiment.log_candidate_count=60",
    )
    t = regime_log(ctx, 1, 2, "uniform")
    window = ctx.window(1, 2)
    assert t.num_rows == len(window) > 0
    by_id = {ex.request_id: ex for ex in window}
    by_user = {s.user_id: s for s in ctx.splits}
    rows = t.to_pylist()
    for row in rows:
        ex = by_id[row["request_id"]]
        assert len(row["candidates"]) == 60 and ex.positive in row["candidates"]  # the next item is kept
        assert len(set(row["candidates"])) == 60
        assert not (set(row["candidates"]) - {ex.positive}) & set(by_user[row["user_id"]].sequence)  # unseen
        assert row["propensity"] == pytest.approx(1 / 60) and row["logging_arm"] == "uniform"
        assert row["clicked"] == int(row["item_id"] == ex.positive)  # next_item clicks
        assert row["history"] == list(ex.history)
    # the paper's distractors are uniform: the offline sets' hard negatives make them far more popular
    pop = ctx.popularity
    paper = np.mean([pop.get(c, 0) for r in rows for c in r["candidates"] if c != by_id[r["request_id"]].positive])
    offline = np.mean([pop.get(c, 0) for ex in window for c in ex.candidates if c != ex.positive])
    assert paper < offline
    # shared, content-addressed by the settings, written once
    p = shared_log_path(ctx, 1, 2, "uniform")
    assert shared_log(ctx, 1, 2, "uniform").to_pylist() == rows and p.exists()
    other = _ctx(data_dir, tmp_path, "experiment.logger=uniform")
    assert shared_log_path(other, 1, 2, "uniform") != p


def test_foreign_logger_stores_the_rankers_own_propensity(data_dir, tmp_path):
    from abpo.baselines import make_ranker, softmax_propensities
    from abpo.experiment.regimes import ranker_sequences, regime_log, shared_log_path
    from abpo.experiment.rounds import training_sequences
    from abpo.experiment.seeds import round_positions

    ctx = _ctx(data_dir, tmp_path, "experiment.logger=foreign", "experiment.foreign_logger=popularity")
    t = regime_log(ctx, 2, 2, "foreign")
    seqs = ranker_sequences(ctx, 2, 2)
    for s in ctx.splits[:5]:  # x_{1:T} and window 1's real items, nothing of window 2
        w1 = [s.update[i] for i in round_positions(len(s.update), 1, 2)]
        assert seqs[s.user_id] == [*s.history, *w1]
    ranker = make_ranker("popularity", seed=0).fit(seqs, ctx.dataset.item_ids().tolist())
    temp = ctx.cfg.arms.popularity.temperature
    rows = t.to_pylist()
    scores = ranker.score([(r["user_id"], r["history"], r["candidates"]) for r in rows])
    for r, s in zip(rows, scores):
        e0 = softmax_propensities(np.asarray(s, dtype=np.float64), temp)
        assert r["propensity"] == pytest.approx(e0[r["candidates"].index(r["item_id"])])
        assert r["logging_arm"] == "popularity" and r["logging_policy"].endswith("popularity")
    # the exposures follow the ranker: the logged items are more popular than the candidates on average
    pop = ctx.popularity
    assert np.mean([pop.get(r["item_id"], 0) for r in rows]) > np.mean(
        [pop.get(c, 0) for r in rows for c in r["candidates"]]
    )
    hot = _ctx(
        data_dir,
        tmp_path,
        "experiment.logger=foreign",
        "experiment.foreign_logger=popularity",
        "experiment.foreign_temperature=100",
    )
    flat = regime_log(hot, 2, 2, "foreign").column("propensity").to_pylist()
    assert max(flat) < max(r["propensity"] for r in rows)  # a higher T flattens the exposure
    assert shared_log_path(hot, 2, 2, "foreign") != shared_log_path(ctx, 2, 2, "foreign")
    # the baselines then train on the foreign logger's clicks (the shared log of the regime)
    both = training_sequences(ctx)
    clicked = [r for r in (*regime_log(ctx, 1, 2, "foreign").to_pylist(), *rows) if r["clicked"]]
    assert sum(len(v) for v in both.values()) == sum(len(s.history) for s in ctx.splits) + len(clicked)


def test_simulator_clicks_reduce_to_next_item_clicks_and_otherwise_click_liked_items(data_dir, tmp_path):
    from abpo.experiment.regimes import regime_log

    strict = _ctx(
        data_dir,
        tmp_path,
        "experiment.logger=uniform",
        "experiment.clicks=simulator",
        "sim.base_ctr=0",
        "sim.click_next=1",
        "sim.click_soon=0",
    )
    t = regime_log(strict, 1, 2, "uniform")
    pos = {ex.request_id: ex.positive for ex in strict.window(1, 2)}
    assert t.column("clicked").to_pylist() == [
        int(a == pos[q]) for a, q in zip(t.column("item_id").to_pylist(), t.column("request_id").to_pylist())
    ]
    loose = _ctx(
        data_dir,
        tmp_path,
        "experiment.logger=uniform",
        "experiment.clicks=simulator",
        "sim.base_ctr=0.5",
        "sim.click_next=0.5",
    )
    rows = regime_log(loose, 1, 2, "uniform").to_pylist()
    assert rows == regime_log(loose, 1, 2, "uniform").to_pylist()  # seeded
    assert [r["item_id"] for r in rows] == t.column("item_id").to_pylist()  # the same exposures, other clicks
    non_next = [r["clicked"] for r in rows if r["item_id"] != pos[r["request_id"]]]
    assert 0.3 < np.mean(non_next) < 0.7  # a liked non-next item is clicked at about base CTR ...
    assert 0 < sum(non_next) < len(non_next)  # ... and a no-response is not the absence of a liked item


def test_pi_init_and_mixed_loggers_store_each_loggers_own_propensity(data_dir, tmp_path):
    from abpo.baselines import make_ranker, softmax_propensities
    from abpo.experiment.regimes import llm_propensities, mixed_loggers, ranker_sequences, regime_log

    ctx = _ctx(data_dir, tmp_path, "experiment.logger=mixed", "report.arm_shares={abpo: 0.5, popularity: 0.5}")
    model, tok = _tiny_model(ctx)
    t = regime_log(ctx, 1, 2, "mixed", model, tok, "pi_init-seed0")
    rows = t.to_pylist()
    arms = {r["logging_arm"] for r in rows}
    assert arms == {"pi_init", "popularity"}
    llm = [r for r in rows if r["logging_arm"] == "pi_init"]
    by_id = {ex.request_id: ex for ex in ctx.window(1, 2)}
    e0 = llm_propensities(ctx, model, tok, [by_id[r["request_id"]] for r in llm])
    for r, p in zip(llm, e0):
        assert r["propensity"] == pytest.approx(p[r["candidates"].index(r["item_id"])], rel=1e-5)
    ranker = make_ranker("popularity", seed=0).fit(ranker_sequences(ctx, 1, 2), ctx.dataset.item_ids().tolist())
    rk = [r for r in rows if r["logging_arm"] == "popularity"]
    for r, s in zip(rk, ranker.score([(r["user_id"], r["history"], r["candidates"]) for r in rk])):
        p = softmax_propensities(np.asarray(s, dtype=np.float64), ctx.cfg.arms.popularity.temperature)
        assert r["propensity"] == pytest.approx(p[r["candidates"].index(r["item_id"])])
    # the draws follow report.arm_shares (LLM arms -> the row's policy)
    from abpo.config import load_config

    draws = mixed_loggers(load_config("tiny"), 20000, 1)
    shares = load_config("tiny").report.arm_shares
    assert abs(draws.count("llm") / 20000 - shares["abpo"] - shares["grpo"]) < 0.015
    assert abs(draws.count("ml_retrain") / 20000 - shares["ml_retrain"]) < 0.015
    with pytest.raises(ValueError, match="report.arm_shares"):
        mixed_loggers(load_config("tiny", ["report.arm_shares={abpo: 0.5, bogus: 0.5}"]), 10, 1)
    # pi_init logging every round: the LLM's own e0 and one logger
    stale = _ctx(data_dir, tmp_path, "experiment.logger=pi_init", "experiment.clicks=simulator")
    s2 = regime_log(stale, 2, 2, "pi_init", model, tok, "pi_init-seed0")
    assert set(s2.column("logging_arm").to_pylist()) == {"pi_init"}
    assert all(0 < p <= 1 for p in s2.column("propensity").to_pylist())


def test_grpo_control_rows(tmp_path):
    from abpo.config import load_config
    from abpo.experiment.cells import cell_fingerprint, row_update_changes, save_cell
    from abpo.experiment.rows import experiment_config, is_llm_row, row_key, row_label, variant_of
    from abpo.train.records import rollouts_per_example

    assert row_key("grpo_g1") == "grpo_g1" and row_key("grpo_lr") == "grpo_lr"
    assert is_llm_row("grpo_g1") and is_llm_row("grpo_lr") and variant_of("grpo_lr") == "grpo"
    assert "G-1" in row_label("grpo_g1") and "gamma" in row_label("grpo_lr")
    cfg = experiment_config(load_config("tiny", [f"paths.root={tmp_path}"]))
    fps = {r: cell_fingerprint(cfg, r, 0, 1) for r in ("grpo", "grpo_g1", "grpo_lr", "abpo")}
    assert len(set(fps.values())) == 4
    g = cfg.update.group_size
    changes = row_update_changes(cfg, tmp_path / "exp", 0, "grpo_g1", 1)
    assert changes == {"grpo_equal_samples": True}
    assert rollouts_per_example("grpo", g, equal_samples=True) == rollouts_per_example("abpo", g) == g - 1
    with pytest.raises(ValueError, match="run row abpo"):
        row_update_changes(cfg, tmp_path / "exp", 0, "grpo_lr", 1)
    f = {
        "row": "abpo",
        "seed": 0,
        "round": 1,
        "fingerprint": fps["abpo"],
        "update": {"history": [{"loss": 1.0}, {"abpo/gamma_ratio": 0.5, "loss": 1.0}, {"abpo/gamma_ratio": 0.25}]},
    }
    save_cell(cfg, tmp_path / "exp", f)
    lr = row_update_changes(cfg, tmp_path / "exp", 0, "grpo_lr", 1)["learning_rate"]
    assert lr == pytest.approx(cfg.update.learning_rate * 0.375)
    with pytest.raises(ValueError, match="abpo/gamma_ratio"):  # an F cell without the metric
        save_cell(cfg, tmp_path / "exp", {**f, "update": {"history": [{"loss": 1.0}]}})
        row_update_changes(cfg, tmp_path / "exp", 0, "grpo_lr", 1)


def test_regime_presets_make_valid_configs_and_the_table_names_the_regime():
    from abpo.config import load_config
    from abpo.experiment.regime_settings import describe, regime_overrides
    from abpo.experiment.rows import experiment_config

    path = REPO_ROOT / "configs" / "regimes.yaml"
    cfgs = {
        n: experiment_config(load_config("tiny", regime_overrides(n, path)))
        for n in ("today", "stale_sim", "foreign_sim", "uniform_paper", "mixed_sim")
    }
    e = {n: c.experiment for n, c in cfgs.items()}
    assert (e["stale_sim"].logger, e["stale_sim"].clicks) == ("pi_init", "simulator")
    assert (e["foreign_sim"].logger, e["foreign_sim"].foreign_logger) == ("foreign", "ml_retrain")
    assert (e["uniform_paper"].logger, e["uniform_paper"].log_candidates) == ("uniform", "paper")
    from abpo.experiment.cells import cell_fingerprint

    assert cell_fingerprint(cfgs["today"], "abpo", 0, 1) == cell_fingerprint(
        experiment_config(load_config("tiny")), "abpo", 0, 1
    )
    with pytest.raises(ValueError, match="stale_simm"):
        regime_overrides("stale_simm", path)
    line = describe(cfgs["uniform_paper"])
    assert "uniform" in line and "M = 200" in line and "next item" in line
    assert "simulator" in describe(cfgs["stale_sim"]) and "pi_init every round" in describe(cfgs["stale_sim"])


@pytest.mark.slow
def test_two_rounds_with_pi_init_logging_and_simulator_clicks_on_validation_users(data_dir, tmp_path):
    """Two rounds of No-Update, ABPO and the G-1 GRPO control, one seed, on the validation users (the probe of
    issue 29 point 5), pi_init logging every round with the simulator's clicks: round 2 of ABPO trains on pi_init's
    shared round-2 log, not its own round-1 model's; the table names the regime; a rerun computes nothing."""
    import pyarrow.parquet as pq

    from abpo.config import load_config
    from abpo.experiment.regimes import shared_log_path
    from abpo.experiment.runner import run_experiment
    from abpo.experiment.seeds import load_seed

    overrides = [
        f"paths.root={tmp_path / 'var'}",
        f"data.dataset_dir={data_dir}",
        *EXPERIMENT_TWO_ROUNDS,
        *EXPERIMENT_TRAINING,
        "experiment.bootstrap_samples=50",
        "experiment.seeds=0",
        "experiment.rows=none,abpo,grpo_g1",
        "experiment.workers=1",
        "experiment.name=stale",
        "experiment.eval_split=validation",
        "experiment.logger=pi_init",
        "experiment.clicks=simulator",
    ]
    cfg = load_config("tiny", overrides)
    res = run_experiment(cfg, config_ref="tiny", overrides=overrides)
    assert res.computed == 6
    cells = {p.name: json.loads(p.read_text()) for p in (res.exp_dir / "cells").glob("*.json")}
    ctx = load_seed(cfg, 0)
    r2 = pq.read_table(shared_log_path(ctx, 2, 2, "pi_init"))
    for row in ("none", "abpo", "grpo_g1"):
        c = cells[f"seed0-{row}-r2of2.json"]
        assert c["logging_arms"] == {"pi_init": r2.num_rows} and c["log_clicks"] == sum(
            r2.column("clicked").to_pylist()
        )
    assert cells["seed0-grpo_g1-r1of2.json"]["update_changes"] == {"grpo_equal_samples": True}
    nxt = {ex.request_id: ex.positive for ex in ctx.window(2, 2)}
    assert any(
        y and a != nxt[q]
        for a, y, q in zip(
            r2.column("item_id").to_pylist(), r2.column("clicked").to_pylist(), r2.column("request_id").to_pylist()
        )
    )  # simulator clicks
    md = res.outputs["md"].read_text()
    assert "Logs: logger pi_init every round" in md and "clicks simulator" in md and "validation users" in md
    again = run_experiment(cfg, config_ref="tiny", overrides=overrides)
    assert again.computed == 0 and again.reused == 6
    # a validation sweep over the click model names each probe's regime under its summary
    from abpo.experiment.sweep import parse_sweep, run_sweep

    val = [*overrides, "experiment.rows=none", "experiment.name=v"]
    sweep = run_sweep(
        load_config("tiny", val),
        parse_sweep(["experiment.clicks=next_item,simulator"]),
        config_for=lambda ov: load_config("tiny", ov),
        overrides=val,
    )
    text = sweep.outputs["md"].read_text()
    assert "- clicks=next_item: Logs: logger pi_init every round" in text and "clicks simulator" in text
    assert sweep.lines[1]["HR@5"] == res.table[0]["HR@5"]  # the simulator probe's No-Update is the cell above


def test_a_regime_or_key_given_twice_in_the_regimes_file_is_refused(tmp_path):
    """configs/regimes.yaml is read like every config file (abpo.yamlfile): the last of two same-named regimes no
    longer silently wins."""
    from abpo.experiment.regime_settings import regime_overrides

    f = tmp_path / "regimes.yaml"
    f.write_text("stale:\n  logger: pi_init\nother:\n  logger: uniform\nstale:\n  logger: foreign\n")
    with pytest.raises(
        ValueError,
        match=rf"^{f}: duplicate key 'stale' at line 5 \(first at line 1\); "
        r"rule: each key once per mapping$",
    ):
        regime_overrides("stale", f)
    f.write_text("stale:\n  logger: pi_init\n  rounds: 2\n  logger: uniform\n")
    with pytest.raises(ValueError, match=r"duplicate key 'logger' at line 4 \(first at line 2\)"):
        regime_overrides("stale", f)
    f.write_text("stale:\n  logger: pi_init\n  rounds: 2\n")
    assert regime_overrides("stale", f) == ["experiment.logger=pi_init", "experiment.rounds=2"]


def test_every_regime_of_the_repo_loads():
    from abpo.config import load_config
    from abpo.experiment.regime_settings import regime_overrides
    from abpo.paths import CONFIG_DIR
    from abpo.yamlfile import read_yaml

    for name in read_yaml(CONFIG_DIR / "regimes.yaml"):
        load_config("tiny", regime_overrides(name, CONFIG_DIR / "regimes.yaml"))


def test_the_config_choices_are_the_regimes_own():
    """experiment.logger, foreign_logger, clicks and log_candidates are refused when the config loads unless they
    are one of the values abpo.experiment.regimes knows (the section cannot import them: the same tuples, checked)."""
    import dataclasses

    from abpo.config import load_config
    from abpo.config.errors import ConfigError
    from abpo.config.experiment import CLICKS, FOREIGN, LOG_CANDIDATES, LOGGERS, ExperimentConfig

    meta = {f.name: f.metadata for f in dataclasses.fields(ExperimentConfig)}
    for key, options in (
        ("logger", LOGGERS),
        ("foreign_logger", FOREIGN),
        ("clicks", CLICKS),
        ("log_candidates", LOG_CANDIDATES),
    ):
        assert tuple(meta[key]["choices"]) == options
    with pytest.raises(
        ConfigError,
        match=r"^--set: experiment.logger 'greedy': rule: one of on_policy, pi_init, "
        r"foreign, uniform, mixed$",
    ):
        load_config("tiny", ["experiment.logger=greedy"])
