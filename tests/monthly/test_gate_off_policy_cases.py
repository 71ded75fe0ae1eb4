"""The gate's off-policy half on months it could not read before (issue 59, points 2 and 8), through the gate step
itself (abpo.monthly.gate.gate: the warehouse's month rows, both versions scoring every row, every estimator, the
verdict, the version's tags): real tiny models (the champion adopted, the challenger the same checkpoint registered as
its update), a real DuckDB warehouse with months of synthetic impressions ingested through the data contract and the
GX suite, real MLflow.

- every logged propensity 1e-9 (the contract's floor): IPS and DR are CTRs far outside [0, 1], the weights' mean far
  above 1; they passed, refused, under the default SNDR too (its self-normalised estimate stays in [0, 1]);
- a month of no-responses: the verdict says its interval is degenerate and decides on the zero-click bound;
- a month where every row is clicked: the verdict says only IPS sees a challenger that moves its mass off the logged
  items, and IPS decides with the estimator;
- an arm that served none of the month's rows: gated on every arm's rows (before: a ValueError traceback that failed
  every rerun); with arms.gate_ope_estimator=snips (its own rows) it fails closed in one line."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.sizes import TINY_MODEL

GATE = [
    *TINY_MODEL,
    "data.eval_candidates=10",
    "arms.gate_max_users=20",
    "arms.gate_margin=0.5",  # 20 tied users pass the offline half only at a wide margin (tests/monthly/
    "arms.gate_ope_bootstrap=200",  # test_gate_fails_closed.py): the off-policy half decides here
    "arms.gate_ope_rows=all",  # every row of the month, which the cases below count (the held-out rows: last test)
]


@pytest.fixture
def gated(make_cfg, movielens_dir, build_tiny_model):
    """Factory: ``gated(*overrides)`` -> (cfg, challenger version, land(month, arms, ctr, propensity)): abpo's
    champion adopted, a challenger registered as its update (the same weights), in a fresh state."""
    from abpo.arms import versions as arm_versions
    from abpo.data.schemas import write_impressions
    from abpo.data.synthetic import synthetic_impressions
    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import CHALLENGER, dataset_and_splits, start_run
    from abpo.warehouse import config_catalog, ingest_with_config

    data = movielens_dir(60, 40, ratings_per_user=12)

    def make(*overrides: str):
        cfg = make_cfg(f"data.dataset_dir={data}", *GATE, *overrides)
        ds, _ = dataset_and_splits(cfg)
        model_dir = build_tiny_model(cfg.policy, ds.titles())
        champion = adopt_model(cfg, "abpo", model_dir).version
        with start_run(cfg, "challenger", {}) as run:
            uri = arm_versions.log_arm_model(cfg, "abpo", model_dir)
        tags = {"source": "update", "parent_version": champion}
        version = str(arm_versions.register_version(cfg, "abpo", uri, run.info.run_id, tags, alias=CHALLENGER).version)
        catalog = config_catalog(cfg)

        def land(month, arms=("abpo", "grpo", "popularity"), ctr=None, propensity=None):
            table, _ = synthetic_impressions(
                240,
                month,
                seed=7,
                arms=arms,
                ctr=None if ctr is None else dict.fromkeys(arms, ctr),
                n_users=40,
                item_ids=catalog,
                n_items=len(catalog),
                n_candidates=8,
                history_len=4,
            )
            if propensity is not None:
                at = table.schema.get_field_index("propensity")
                table = table.set_column(at, "propensity", pa.array([propensity] * table.num_rows, pa.float64()))
            write_impressions(table, cfg.paths.resolve("landing"), month, part="sim")
            report, _ = ingest_with_config(cfg, month)
            assert report.rows_clean == table.num_rows
            clicks = pc.sum(table.column("clicked")).as_py()
            return table.num_rows, clicks

        return cfg, version, land

    return make


def test_estimates_outside_0_1_are_refused_and_degenerate_months_say_so(gated):
    from abpo.arms import versions as arm_versions
    from abpo.monthly.gate import gate

    cfg, v, land = gated()  # the default estimator, SNDR: self-normalised, its estimate stays in [0, 1]
    land("2026-01", propensity=1e-9)  # the contract's floor: ingest accepts it
    res = gate(cfg, "abpo", v, "2026-01")
    assert not res.passed and "off-policy weights: the challenger's mean weight pi/e0" in res.reason, res.reason
    assert "rule: mean weight <= 1 + 4 standard errors or <= 2" in res.reason and "fails closed" in res.reason
    assert 0 <= res.off_policy["challenger_estimate"] <= 1  # SNDR's number, in range: the range alone passed it
    ips = res.off_policy["estimates"]["ips"]["challenger"]
    assert ips > 1e6 and res.off_policy["challenger_mean_weight"] > 1e6  # the numbers kept as they were
    tags = arm_versions.get_version(cfg, "abpo", v).tags
    assert tags["gate.verdict"] == "fail" and "mean weight pi/e0" in tags["gate.reason"]

    n, clicks = land("2026-02", ctr=0.0)
    assert clicks == 0
    res = gate(cfg, "abpo", v, "2026-02")
    assert f"every one of the {n} rows it read is a no-response" in res.reason, res.reason
    assert "is degenerate (no click to resample)" in res.reason and "exact binomial" in res.reason
    assert res.off_policy["clicks"] == 0

    n, clicks = land("2026-03", ctr=1.0)
    assert clicks == n
    res = gate(cfg, "abpo", v, "2026-03")
    assert f"every one of the {n} rows is clicked" in res.reason and "only IPS sees" in res.reason, res.reason
    assert "IPS diff +0.0000" in res.reason  # the same weights: IPS sees no mass moved, the gate passes
    assert res.passed, res.reason


def test_an_arm_that_served_nothing_is_gated_on_every_arms_rows(gated):
    from abpo.arms import versions as arm_versions
    from abpo.monthly.gate import gate

    cfg, v, land = gated()
    n, _ = land("2026-01", arms=("grpo", "popularity"))
    res = gate(cfg, "abpo", v, "2026-01")  # raised ValueError: no logged rows of arm abpo in 2026-01
    assert res.passed, res.reason
    assert "off-policy SNDR CTR challenger" in res.reason
    assert f"on {n} every arm's rows, none of them the arm's own" in res.reason
    assert res.off_policy["own_rows"] == 0 and res.off_policy["estimates"]["snips"]["n"] == 0
    assert res.off_policy["estimates"]["snips"]["diff"] is None  # NaN: not computed, JSON-safe
    assert arm_versions.get_version(cfg, "abpo", v).tags["gate.ope.estimates"].startswith("snips +nan")


def test_an_arm_that_served_nothing_fails_closed_in_one_line_when_its_own_rows_decide(gated):
    from abpo.monthly.gate import gate

    cfg, v, land = gated("arms.gate_ope_estimator=snips")
    n, _ = land("2026-01", arms=("grpo", "popularity"))
    res = gate(cfg, "abpo", v, "2026-01")
    assert not res.passed and "\n" not in res.reason, res.reason
    assert f"no logged rows of the arm's own among the month's {n} rows" in res.reason
    assert "rule: arms.gate_ope_estimator snips reads the arm's own rows" in res.reason and "fails closed" in res.reason


def test_with_the_redesign_the_off_policy_half_decides_on_the_held_out_users_rows_alone(gated):
    """arms.gate_primary = ope, arms.gate_ope_rows = heldout (the redesign): the gate reads every arm's rows of the held-out slice's users and no
    other, its reason and record say the off-policy half decided, and the offline half is a guardrail."""
    from abpo.arms import versions as arm_versions
    from abpo.data.holdout import in_holdout
    from abpo.monthly.gate import gate
    from abpo.warehouse import open_warehouse

    cfg, v, land = gated(
        "arms.gate_ope_rows=heldout",
        "arms.gate_holdout_fraction=0.5",
        "arms.gate_primary=ope",
        "arms.gate_ope_margin=0.005",
        "arms.gate_margin=0.02",
    )
    n, _ = land("2026-01")
    with open_warehouse(cfg, read_only=True) as wh:
        pos, neg = wh.strata(["2026-01"])
    users = pos.column("user_id").to_pylist() + neg.column("user_id").to_pylist()
    held = sum(in_holdout(u, cfg.seed, 0.5) for u in users)
    assert 0 < held < n
    res = gate(cfg, "abpo", v, "2026-01")
    assert res.off_policy["n"] == held, (res.off_policy["n"], held, n)
    assert res.decided_by == "off-policy"
    assert res.reason.startswith("decided by the off-policy half: off-policy SNDR"), res.reason
    assert "; guardrail passed: offline guardrail HR@5" in res.reason and "upper bound" in res.reason
    assert res.passed, res.reason  # the same weights: no difference, and no collapse
    tags = arm_versions.get_version(cfg, "abpo", v).tags
    assert tags["gate.decided_by"] == "off-policy" and tags["gate.guardrail.margin"] == "0.1"
    assert tags["gate.ope.n"] == str(held)
    # the challenger's LoggedModel carries the guardrail's bound and both margins as metrics (MLflow's UI compares
    # models on them), equal to the recorded verdict's
    import mlflow

    from abpo import registry

    metrics = {
        m.key: m.value
        for m in mlflow.get_logged_model(registry.logged_model_id(arm_versions.get_version(cfg, "abpo", v))).metrics
    }
    assert metrics["offline.guardrail.upper"] == pytest.approx(res.offline["upper"])
    assert metrics["offline.guardrail.margin"] == 0.1 and metrics["offline.guardrail.passed"] == 1.0
    assert metrics["ope.margin"] == 0.005 and metrics["ope.ci_low"] == pytest.approx(res.off_policy["ci_low"])
