"""The continual cycle on a shrunken tiny config, two months in one process: month 2's LLM updates start from month
1's champion (lineage read back from the registry), a failing gate leaves the arm's champion where it was, the ranker
arms are refitted and promoted every month, and the LLM arm's logged propensity is its champion's e_p."""

from __future__ import annotations

import pytest

# CYCLE_MONTH: each LLM arm updates from its own logs (from all traffic, with the holdback:
# tests/monthly/test_holdback_months.py)
from tests.sizes import CYCLE_MONTH, GATE_PASSES


@pytest.mark.slow
def test_two_months_lineage_gate_and_refits(tmp_path, pi_init_state):
    import json

    import mlflow
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.month import run_month
    from abpo.monthly.steps import STEPS

    # month 1 with a gate every challenger passes (margin 1: any lower bound of the paired difference clears it), so
    # that month 2 must start from month 1's promoted challenger; the gate's own verdicts are tested in test_gate*
    cfg = load_config("tiny", [f"paths.root={tmp_path}", *CYCLE_MONTH])
    cfg1 = load_config("tiny", [f"paths.root={tmp_path}", *CYCLE_MONTH, *GATE_PASSES])
    pi_init_state(cfg1)  # pi_init trained once per session at these sizes (tests/conftest.py), its bootstrap reuses it
    m1 = run_month(cfg1, "2026-01").to_json()
    # the steps ran in the order of abpo.monthly.steps.STEPS (per arm: its kind's chain), the DAG's order
    assert [s.split(".")[-1] for s in m1["ran"]] == [
        "bootstrap",
        "serve",
        "ingest",
        *["update", "register", "gate", "promote"] * 2,
        *["refit"] * 2,
        "report",
    ]
    assert list(dict.fromkeys(s.split(".")[-1] for s in m1["ran"])) == [s for s in STEPS if s != "hold"]  # no
    # holdback arm in arms.names here (its step: tests/monthly/test_holdback_months.py)
    assert {a: m1["bootstrap"][a]["version"] for a in ("abpo", "grpo", "ml_retrain", "popularity")} == {
        "abpo": "1",
        "grpo": "1",
        "ml_retrain": "1",
        "popularity": "1",
    }
    champ1 = {a: m1[a]["promote"]["champion_version"] for a in ("abpo", "grpo")}

    # month 2 with a gate no challenger can pass: every LLM arm keeps its month-1 champion
    cfg2 = load_config(
        "tiny",
        [
            f"paths.root={tmp_path}",
            *CYCLE_MONTH,
            "arms.gate_primary=offline",
            "arms.gate_ope_rows=all",
            "arms.gate_margin=-1.0",
        ],
    )
    m2 = run_month(cfg2, "2026-02").to_json()
    registry.configure(cfg)
    client = MlflowClient()
    for arm in ("abpo", "grpo"):
        new = client.get_model_version(arm_versions.model_name(arm), m2[arm]["gate"]["version"])
        assert new.tags["parent_version"] == champ1[arm]  # updated from month 1's champion, not from pi_init
        assert new.tags["months"] == "2026-01,2026-02" and new.tags["source"] == "update"
        assert new.tags["variant"] == {"abpo": "abpo", "grpo": "grpo"}[arm] and new.tags["data_hash"]
        assert not m2[arm]["gate"]["passed"] and new.tags["gate.verdict"] == "fail"
        # the off-policy half: SNDR (arms.gate_ope_estimator's default) on every arm's month-2 rows decided, SNIPS on
        # the arm's own rows (the gate's estimator before issue 42) is recorded beside it
        ope, per_arm = m2[arm]["gate"]["off_policy"], m2["serve"]["per_arm"]
        assert ope["estimator"] == "sndr" and ope["rows"] == "all" and ope["ci_low"] <= ope["diff"] <= ope["ci_high"]
        assert ope["n"] == sum(a["impressions"] for a in per_arm.values())
        snips = ope["estimates"]["snips"]
        assert snips["n"] == per_arm[arm]["impressions"] and snips["rows"] == "own"
        assert snips["champion"] == pytest.approx(per_arm[arm]["ctr"], abs=1e-4)
        assert str(arm_versions.get_version(cfg, arm, "champion").version) == champ1[arm]  # champion stayed
        assert str(arm_versions.get_version(cfg, arm, "challenger").version) == str(new.version)
        # the gate's numbers are metrics of the challenger's LoggedModel (comparable in MLflow's UI), its offline
        # metrics measured on dataset gate-users-v2; the month it trained on is a dataset input of its run, with a digest
        metrics = {m.key: m for m in mlflow.get_logged_model(registry.logged_model_id(new)).metrics}
        assert {"HR_at_5", "offline.challenger.HR_at_5", "ope.diff", "passed"} <= set(metrics)
        assert metrics["passed"].value == 0.0 and metrics["HR_at_5"].dataset_name == "gate-users-v2"
        # the offline half's paired test: its numbers are tags and metrics; no lower bound clears -margin = +1
        paired = m2[arm]["gate"]["offline"]
        assert new.tags["gate.offline.users"] == str(paired["n"]) and new.tags["gate.offline.passed"] == "false"
        assert float(new.tags["gate.offline.lower"]) == pytest.approx(paired["lower"], rel=1e-5, abs=1e-9)
        assert paired["lower"] <= 1.0 and paired["margin"] == -1.0
        assert (
            metrics["offline.paired.wins"].value
            + metrics["offline.paired.losses"].value
            + metrics["offline.paired.ties"].value
            == paired["n"]
        )
        assert not any(k.startswith("gate.m.") for k in new.tags)
        inputs = client.get_run(new.run_id).inputs.dataset_inputs
        assert [d.dataset.name for d in inputs] == [f"{arm}-impressions-2026-02"]
        assert (
            len(inputs[0].dataset.digest) == 16
            and json.loads(inputs[0].dataset.profile)["num_rows"] == m2["serve"]["per_arm"][arm]["impressions"]
        )
    gates = client.search_runs(
        [MlflowClient().get_experiment_by_name("abpo-arms").experiment_id],
        "tags.`abpo.month` = '2026-02' and attributes.run_name LIKE 'gate-%'",
    )
    assert len(gates) == 2 and all("ope.diff" in r.data.metrics for r in gates)
    for arm in ("ml_retrain", "popularity"):
        mv = arm_versions.get_version(cfg, arm, "champion")
        assert str(mv.version) == "3" and mv.tags["parent_version"] == "2" and mv.tags["months"] == "2026-01,2026-02"
        (fitted,) = client.get_run(mv.run_id).inputs.dataset_inputs
        assert (
            fitted.dataset.name == f"{arm}-interactions-through-2026-02"
            and fitted.dataset.digest == mv.tags["data_hash"]
        )

    # what the abpo arm logged in month 2 is its champion's e_p over the candidates (the update's e_old rule)
    import pyarrow.parquet as pq

    ds, _ = dataset_and_splits(cfg)
    t = pq.read_table(cfg.paths.resolve("landing") / "impressions" / "month=2026-02" / "part-sim.parquet").to_pylist()
    rows = [r for r in t if r["arm"] == "abpo"][:5]
    assert {r["model_version"] for r in rows} == {champ1["abpo"]}
    arm = arm_versions.load_arm(cfg, "abpo", ds)
    probs = arm.propensities([(r["user_id"], r["history"], r["candidates"]) for r in rows])
    for r, p in zip(rows, probs):
        assert r["propensity"] == pytest.approx(float(p[r["candidates"].index(r["item_id"])]), rel=1e-5)
    assert m2["report"]["months"] == ["2026-01", "2026-02"]


@pytest.mark.slow
def test_months_beyond_the_windows_a_refused_split_change_and_a_moved_state(tmp_path):
    """data.update_steps // sim.window = 1: month 1 uses the last window, month 2 runs anyway (the window wraps
    around, the split unchanged); data.update_steps=4 for month 3 is refused naming the key (nothing runs); the state
    copied to another directory (the old one deleted) and relocated runs month 3, writing only under the new one."""
    import shutil

    from abpo.cli import main
    from abpo.config import load_config
    from abpo.monthly.month import run_month
    from abpo.monthly.series import SeriesChanged
    from abpo.sim.simulator import months_available

    small = [*CYCLE_MONTH, "data.update_steps=2", *GATE_PASSES]
    old, new = tmp_path / "old" / "var", tmp_path / "new" / "var"
    cfg = load_config("tiny", [f"paths.root={old}", *small])
    assert months_available(cfg) == 1
    m1 = run_month(cfg, "2026-01").to_json()
    m2 = run_month(cfg, "2026-02").to_json()  # index 1 >= 1 window: window 0 again, fresh draws
    assert m2["report"]["months"] == ["2026-01", "2026-02"]
    assert m2["serve"]["per_arm"]["abpo"]["impressions"] == m1["serve"]["per_arm"]["abpo"]["impressions"]
    with pytest.raises(SeriesChanged, match=r"data.update_steps = 4 \(recorded 2\)"):
        run_month(load_config("tiny", [f"paths.root={old}", *small, "data.update_steps=4"]), "2026-03")
    assert not (old / "landing" / "impressions" / "month=2026-03").exists()  # refused before serving

    shutil.copytree(old, new)
    shutil.rmtree(tmp_path / "old")
    assert main(["state", "relocate", "--set", f"paths.root={new}"]) == 0
    m3 = run_month(load_config("tiny", [f"paths.root={new}", *small]), "2026-03").to_json()
    assert m3["report"]["months"] == ["2026-01", "2026-02", "2026-03"]
    assert not (tmp_path / "old").exists()  # nothing was written under the old directory
