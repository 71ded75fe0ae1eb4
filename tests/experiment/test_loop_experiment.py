"""The replicated loop experiment (abpo.experiment.loop_experiment, `abpo loop-experiment`) end to end at a tiny size (issue 47): one replicate, then two (the first reused, the shared
bootstrap reused), one month each; the report's two-stage interval recomputed by hand from the replicates' raw
impressions in their warehouses; each replicate with its own salt and arm assignment; pi_init trained once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.sizes import HOLDBACK_ARMS, LIKELY_CLICKS, MONTH

TINY = [*MONTH, "arms.gate_ope_bootstrap=200", "arms.update_max_examples=48", *LIKELY_CLICKS, *HOLDBACK_ARMS]


def per_user(warehouse: Path, arm: str) -> list[tuple[int, int]]:
    """(clicks, impressions) of each user of ``arm``, from the raw impressions."""
    import duckdb

    with duckdb.connect(str(warehouse), read_only=True) as con:
        return con.execute(
            "SELECT sum(clicked)::BIGINT, count(*)::BIGINT FROM impressions WHERE arm = ? GROUP BY user_id", [arm]
        ).fetchall()


def arm_of_user(warehouse: Path) -> dict[int, str]:
    import duckdb

    with duckdb.connect(str(warehouse), read_only=True) as con:
        return dict(con.execute("SELECT DISTINCT user_id, arm FROM impressions").fetchall())


def ctr_and_variance(users: list[tuple[int, int]]) -> tuple[float, float]:
    """R = sum X / sum Y and the delta-method variance sum_u (X_u - R Y_u)^2 / (n - 1) / (n Ybar^2), by hand."""
    n = len(users)
    r = sum(x for x, _ in users) / sum(y for _, y in users)
    ybar = sum(y for _, y in users) / n
    return r, sum((x - r * y) ** 2 for x, y in users) / (n - 1) / (n * ybar * ybar)


@pytest.mark.slow
def test_two_replicates_one_month_match_a_hand_computation_and_finished_ones_are_reused(tmp_path, monkeypatch):
    from abpo.config import load_config
    from abpo.experiment import loop_experiment as le, loop_fingerprints

    monkeypatch.setattr(loop_fingerprints, "code_digest", lambda: "fixed")  # helpers edit the tree beside this test
    cfg = load_config("tiny", [f"paths.root={tmp_path}", *TINY])
    lines: list[str] = []
    kw = dict(config_ref="tiny", overrides=[f"paths.root={tmp_path}", *TINY], months=1, echo=lines.append)
    one = le.run_loop_experiment(cfg, replicates=1, **kw)
    assert one.reused == [] and not one.bootstrap_reused
    two = le.run_loop_experiment(cfg, replicates=2, **kw)
    assert two.reused == [0] and two.bootstrap_reused  # replicate 0 and the bootstrap found finished
    assert two.replicates[0] == one.replicates[0]
    # each result recorded by the run that received it (a worker writes none), the lock released at the end
    assert one.replicates[0]["clean"] is True and two.replicates[1]["clean"] is True
    assert one.replicates[0]["run"] != two.replicates[1]["run"]
    saved = json.loads((Path(two.replicates[1]["state"]).parent / "result.json").read_text())
    assert saved["run"] == two.replicates[1]["run"] == json.loads(two.json.read_text())["run"]
    assert (tmp_path / le.DIR / "run.lock").read_text() == ""
    assert any("2 replicate(s) x 1 month(s)" in x and "1 finished before, 1 to run" in x for x in lines)

    # pi_init was trained once: by the shared bootstrap, never in a replicate
    root = tmp_path / le.DIR
    boot_logs = list((root / "bootstrap").glob("*/bootstrap.log"))
    assert len(boot_logs) == 1 and "sft: saved pi_init" in boot_logs[0].read_text()
    runs = [Path(r["state"]).parent / "run.log" for r in two.replicates]
    assert all("sft: saved pi_init" not in p.read_text() for p in runs)

    # each replicate has its own salt and its own split of users into arms
    assert [r["salt"] for r in two.replicates] == [cfg.sim.salt, f"{cfg.sim.salt}/replicate-1"]
    houses = [Path(r["state"]) / "warehouse.duckdb" for r in two.replicates]
    assignment = [arm_of_user(h) for h in houses]
    assert set(assignment[0]) == set(assignment[1])  # the same users ...
    assert assignment[0] != assignment[1]  # ... in other arms

    # the whole-period abpo - holdback of the report, by hand from the raw impressions
    deltas, variances = [], []
    for h in houses:
        ra, va = ctr_and_variance(per_user(h, "abpo"))
        rb, vb = ctr_and_variance(per_user(h, "holdback"))
        deltas.append(ra - rb)
        variances.append(va + vb)
    mean = sum(deltas) / 2
    between = sum((d - mean) ** 2 for d in deltas) / 1
    within = sum(variances) / 2
    se = math.sqrt(max(between, within) / 2)
    report = json.loads(two.json.read_text())
    got = next(d for d in report["analysis"]["periods"]["all"]["diffs"] if (d["a"], d["b"]) == ("abpo", "holdback"))
    assert got["per_replicate"] == pytest.approx(deltas)
    assert got["estimate"] == pytest.approx(mean) and got["se"] == pytest.approx(se)
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((mean - 1.959964 * se, mean + 1.959964 * se), abs=1e-6)
    assert got["mde"] == pytest.approx((1.959964 + 0.841621) * se, abs=1e-6)
    assert got["basis"] == ("between" if between >= within else "within")
    month = report["analysis"]["periods"]["2026-01"]["diffs"]  # one month: the month's row is the period's
    assert next(d for d in month if (d["a"], d["b"]) == ("abpo", "holdback"))["se"] == pytest.approx(se)
    md = two.markdown.read_text()
    assert "| whole period | abpo − holdback |" in md and "2 replicate(s) run now" not in md
    assert "1 replicate(s) run now, 1 reused; shared bootstrap reused" in md
    assert "## Sizing: replicates for a whole-period MDE of 0.5 pp" in md
    sized = next(r for r in report["sizing"]["rows"] if (r["a"], r["b"]) == ("abpo", "holdback"))
    k = (1.959964 + 0.841621) ** 2
    assert sized["replicates_needed"] == math.ceil(k * max(between, within) / 0.005**2)

    # other code: its replicates are reused only when asked (--any-code), and the report says so
    monkeypatch.setattr(loop_fingerprints, "code_digest", lambda: "changed")
    again = le.run_loop_experiment(cfg, replicates=2, any_code=True, **kw)
    assert again.reused == [0, 1] and "2 replicate(s) were made by other code, digest(s) fixed" in (
        again.markdown.read_text()
    )
