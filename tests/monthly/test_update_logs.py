"""arms.update_logs (issue 30, point 1): with ``all`` an LLM arm's month update reads every served arm's clean
impressions, each with the e0 its arm logged, without the gate's held-out users; rows whose e0 cannot be trusted, or
of an arm that is not served, are refused naming arm, month, impression and rule; ``own`` is the arm's rows only;
the first step's SNIPS weights e_old/e0 are the champion's propensities over the logged ones. Real DuckDB
warehouses with landed synthetic impressions; a real tiny model for the weights."""

from __future__ import annotations

import dataclasses
import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from abpo.data.holdout import holdout_unit
from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions
from abpo.warehouse import Warehouse
from tests.sizes import TINY_MODEL

M1 = "2026-01"
ARMS = ("abpo", "grpo", "ml_retrain", "popularity")


def land(cfg, n: int = 400, n_items: int = 100):
    """A month of clean synthetic impressions of the four arms (users 1..50) landed and ingested."""
    table, _ = synthetic_impressions(n, M1, seed=5, n_users=50, n_items=n_items, history_len=4, n_candidates=8)
    landing = cfg.paths.resolve("landing")
    write_impressions(table, landing, M1, part="serving")
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        wh.ingest_month(landing, M1, cfg.data.known_arms)
    return table


def test_all_reads_every_arms_rows_and_own_only_the_arms(make_cfg):
    from abpo.monthly.update import arm_strata

    table = land(make_cfg())
    # every row: the gate reads every row of the month (arms.gate_ope_rows=all), so nothing is held out
    pos, neg, held = arm_strata(make_cfg("arms.gate_ope_rows=all"), "abpo", [M1])  # default update_logs: all
    assert held is None and pos.num_rows + neg.num_rows == table.num_rows
    assert set(pos.column("arm").to_pylist()) | set(neg.column("arm").to_pylist()) == set(ARMS)
    assert sorted(pos.column("propensity").to_pylist() + neg.column("propensity").to_pylist()) == sorted(
        table.column("propensity").to_pylist()
    )  # each row keeps the e0 its arm logged
    own_pos, own_neg, _ = arm_strata(make_cfg("arms.update_logs=own", "arms.gate_ope_rows=all"), "abpo", [M1])
    assert own_pos.equals(pos.filter(pc.equal(pos.column("arm"), "abpo")))
    assert own_neg.equals(neg.filter(pc.equal(neg.column("arm"), "abpo")))


def test_all_leaves_the_gate_users_out_of_every_arms_rows(make_cfg):
    from abpo.monthly.update import arm_strata

    cfg = make_cfg("arms.gate_users=warehouse", "arms.gate_holdout_fraction=0.3")
    table = land(cfg)
    gate = {u for u in set(table.column("user_id").to_pylist()) if holdout_unit(cfg.seed, u) < 0.3}
    pos, neg, held = arm_strata(cfg, "grpo", [M1])
    kept = set(pos.column("user_id").to_pylist()) | set(neg.column("user_id").to_pylist())
    mine = [r for r in table.to_pylist() if r["user_id"] in gate]
    assert gate and not kept & gate and held.rows == len(mine) and held.users == len(gate)
    assert pos.num_rows + neg.num_rows == table.num_rows - len(mine)
    assert {r["arm"] for r in mine} == set(ARMS)  # the held-out users' rows of every arm, not only grpo's


def test_untrusted_rows_are_refused_naming_arm_month_impression_and_rule(make_cfg):
    from abpo.monthly.update import arm_strata
    from abpo.train.strata import UntrustedLogRows, refuse_untrusted_rows

    cfg = make_cfg()
    table = land(cfg)
    # an arm that is not served this month (arms.names without popularity): its rows are refused, not dropped
    names = ["abpo", "grpo", "ml_retrain"]
    with pytest.raises(
        UntrustedLogRows,
        match=r"update of arm abpo: \d+ logged row\(s\) refused, none used: arm "
        r"popularity, month 2026-01, impression 2026-01-s5-imp-\d+: e0 "
        r"[0-9.e-]+; rule: arm not in arms.names",
    ):
        arm_strata(make_cfg("arms.names=[abpo, grpo, ml_retrain]"), "abpo", [M1])
    assert arm_strata(make_cfg("arms.names=[abpo, grpo, ml_retrain]", "arms.update_logs=own"), "abpo", [M1])
    # e0 below data.min_propensity in a warehouse written around ingest's contract: named, refused
    victim = table.column("impression_id")[7].as_py()
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        wh.con.execute("UPDATE impressions SET propensity = 1e-12 WHERE impression_id = ?", [victim])
    with pytest.raises(
        UntrustedLogRows,
        match=rf"1 logged row\(s\) refused, none used: arm \w+, month 2026-01, "
        rf"impression {victim}: e0 1e-12; rule: propensity below "
        rf"data.min_propensity=1e-09",
    ):
        arm_strata(cfg, "abpo", [M1])
    # every rule, on rows the warehouse cannot hold (a null e0, NaN, inf): the first ones named, the rest counted
    bad = pa.table(
        {
            "month": [M1] * 6,
            "impression_id": [f"i{k}" for k in range(6)],
            "arm": ["abpo"] * 6,
            "propensity": [None, math.nan, math.inf, 0.0, -0.5, 1.5],
        }
    )
    with pytest.raises(UntrustedLogRows) as e:
        refuse_untrusted_rows([bad], arms=names, min_propensity=1e-9, updating="grpo", show=6)
    for k, rule in enumerate(
        (
            "propensity missing",
            "propensity not finite",
            "propensity not finite",
            "propensity <= 0",
            "propensity <= 0",
            "propensity > 1",
        )
    ):
        assert f"arm abpo, month 2026-01, impression i{k}: e0 " in str(e.value) and f"rule: {rule}" in str(e.value)
    with pytest.raises(UntrustedLogRows, match=r"6 logged row\(s\) refused.*; \.\.\. and 4 more"):
        refuse_untrusted_rows([bad], arms=names, min_propensity=1e-9, updating="grpo", show=2)
    refuse_untrusted_rows(
        [
            bad.slice(0, 0),
            bad.filter(pc.equal(bad.column("propensity"), 1.5)).set_column(3, "propensity", pa.array([1.0])),
        ],
        arms=ARMS,
        min_propensity=1e-9,
        updating="grpo",
    )  # clean rows pass


def test_a_bad_update_logs_value_names_the_key_and_the_rule(make_cfg):
    """Refused at load (a choice of abpo.config.arms.UPDATE_LOGS), and again where the update reads it when a config
    was changed after loading."""
    import dataclasses

    from abpo.config.errors import ConfigError
    from abpo.monthly.update import arm_strata

    with pytest.raises(ConfigError, match=r"arms.update_logs 'mine': rule: one of own, all"):
        make_cfg("arms.update_logs=mine")
    cfg = make_cfg()
    cfg = dataclasses.replace(cfg, arms=dataclasses.replace(cfg.arms, update_logs="mine"))
    land(cfg, 50)
    with pytest.raises(ValueError, match=r"arms.update_logs='mine'; rule: one of \['own', 'all'\]"):
        arm_strata(cfg, "abpo", [M1])


def test_logged_by_is_the_share_of_rows_by_logging_arm(make_cfg):
    from collections import Counter

    from abpo.monthly.update import arm_strata
    from abpo.train.strata import logged_by

    table = land(make_cfg())
    pos, neg, _ = arm_strata(make_cfg("arms.gate_ope_rows=all"), "abpo", [M1])  # every row, none held out
    counts = Counter(table.column("arm").to_pylist())
    assert logged_by((pos, neg)) == pytest.approx({a: counts[a] / table.num_rows for a in ARMS})
    assert logged_by((pos.slice(0, 0),)) == {}


def test_first_step_weights_are_the_champions_propensity_over_the_logged_one(make_cfg, movielens_dir, build_tiny_model):
    """Rows whose e0 is the champion's own propensity (what the arm logs when it serves) give w = 1 at every row;
    the same rows with half that e0 give w = 2; a cap (arms.update_max_examples) scores the update's subsample."""
    import numpy as np

    from abpo.arms.llm import LLMArm
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.update import first_step_weights

    cfg = make_cfg(
        f"data.dataset_dir={movielens_dir(100, 30, ratings_per_user=8)}",
        *TINY_MODEL,
    )
    ds, _ = dataset_and_splits(cfg)
    model_dir = build_tiny_model(cfg.policy, ds.titles())
    table, _ = synthetic_impressions(24, M1, seed=1, n_users=30, n_items=100, history_len=3, n_candidates=6)
    champion = LLMArm.from_dir("abpo", model_dir, cfg, ds, "1")
    requests = list(zip(*(table.column(c).to_pylist() for c in ("user_id", "history", "candidates")), strict=True))
    e = [
        float(p[list(c).index(i)])
        for (_, _, c), p, i in zip(
            requests, champion.propensities(requests), table.column("item_id").to_pylist(), strict=True
        )
    ]
    logged = table.set_column(table.schema.get_field_index("propensity"), "propensity", pa.array(e))
    pos = logged.filter(pc.equal(logged.column("clicked"), 1))
    neg = logged.filter(pc.equal(logged.column("clicked"), 0))
    w = first_step_weights(cfg, "abpo", model_dir, pos, neg)
    assert w["rows"] == 24 and w["p50"] == pytest.approx(1.0, rel=1e-5) and w["max"] == pytest.approx(1.0, rel=1e-5)
    assert w["ess_share"] == pytest.approx(1.0)
    half = [
        t.set_column(t.schema.get_field_index("propensity"), "propensity", pc.multiply(t.column("propensity"), 0.5))
        for t in (pos, neg)
    ]
    w2 = first_step_weights(cfg, "abpo", model_dir, *half)
    assert w2["p99"] == pytest.approx(2.0, rel=1e-5) and np.isclose(w2["ess"], 24)
    capped = make_cfg(
        f"data.dataset_dir={cfg.data.dataset_dir}",
        "arms.update_max_examples=10",
        *[
            f"policy.{k}={getattr(cfg.policy, k)}"
            for k in ("tiny_hidden_size", "tiny_layers", "tiny_heads", "tiny_intermediate_size", "tiny_vocab_size")
        ],
    )
    assert first_step_weights(capped, "abpo", model_dir, pos, neg)["rows"] == 10
    own = dataclasses.replace(capped.arms, update_max_examples_by_arm={"abpo": 12})  # the arm's own cap wins
    assert first_step_weights(dataclasses.replace(capped, arms=own), "abpo", model_dir, pos, neg)["rows"] == 12
