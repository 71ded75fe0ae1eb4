"""benchmarks/gate_refusals.py: each gate's halves read from its record (or the paired test's
verdict and the gate's own off-policy rule for a record written before the halves were kept), the count of the
challengers the expected CTR ranks higher that the gate refused, and a real month's gates scored on the next month."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gate_refusals", ROOT / "benchmarks" / "gate_refusals.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


def _row(bench, diff: float, passed: bool, offline: bool = True, ope: bool | None = True):
    return bench.GateRow("2026-01", "abpo", "2", "1", "2026-02", 0.10 + diff, 0.10, offline, ope, passed)


def test_the_count_names_which_half_refused_a_challenger_ranked_higher(bench):
    rows = [
        _row(bench, +0.01, True),
        _row(bench, +0.02, False, offline=False, ope=True),
        _row(bench, +0.03, False, offline=True, ope=False),
        _row(bench, +0.01, False, offline=False, ope=False),  # both halves refused: counted in each
        _row(bench, -0.01, True),
        _row(bench, -0.02, False, offline=False, ope=None),  # off-policy half not run
        _row(bench, 0.0, True),  # a tie is not ranked higher
    ]
    assert bench.summary_line(rows) == (
        "Gate refusals: 3 of 4 challenger(s) ranked higher by expected CTR refused (offline half 2, off-policy "
        "half 2); 2 of 3 ranked lower passed"
    )
    table = bench.markdown(rows)
    assert "| 2026-01 | abpo | v2 vs v1 | 2026-02 | 11.00 | 10.00 | +1.00 | pass | pass | passed |" in table
    assert "| **refused** | not run | refused |" in table


def test_the_clear_count_reads_only_the_gates_beyond_half_a_point(bench):
    rows = [
        _row(bench, +0.005, True),  # exactly +0.5 points: counted
        _row(bench, +0.007, False, offline=True, ope=False),
        _row(bench, +0.004, False),  # inside: not counted
        _row(bench, -0.005, True),  # exactly -0.5 points, passed: a miss
        _row(bench, -0.009, False),
        _row(bench, -0.001, True),  # inside
    ]
    assert bench.clear_line(rows) == (
        "Beyond 0.5 points: 1 of 2 challenger(s) ranked higher passed; 1 of 2 ranked lower refused"
    )
    assert (
        bench.clear_line([])
        == "Beyond 0.5 points: 0 of 0 challenger(s) ranked higher passed; 0 of 0 ranked lower refused"
    )


def test_a_record_s_halves_come_from_its_fields_or_are_recomputed_by_the_gates_rule(bench, tmp_path):
    from abpo.config import load_config

    cfg = load_config("tiny")
    path = tmp_path / "2026-01.abpo.gate.json"
    assert bench.halves(cfg, {"offline_passed": False, "ope_passed": True, "off_policy": {}}, path) == (False, True)
    assert bench.halves(cfg, {"offline": {"passed": True}, "off_policy": None}, path) == (True, None)
    # a record of before the halves were kept: the off-policy half by abpo.monthly.gate_verdict.ope_verdict, which
    # fails closed on a record without rows to read
    assert bench.halves(cfg, {"offline": {"passed": True}, "off_policy": {"n": 0, "rows": "own"}}, path) == (
        True,
        False,
    )
    with pytest.raises(ValueError, match=r"2026-01\.abpo\.gate\.json: no field offline_passed nor offline\.passed"):
        bench.halves(cfg, {"passed": True}, path)


def check_smoke_state(tmp_path: Path) -> None:
    """What ``gate_refusals.py --smoke --state {tmp}/state --json {tmp}/rows.json`` left (run by
    tests/benchmarks/test_smoke.py, once): one row per gate record of the month, with the record's versions, verdict
    and halves, and each version's expected CTR Eq. H1 computed here independently on the next month's scored
    requests with that month's own calibration."""
    import numpy as np

    from abpo import registry
    from abpo.arms import versions
    from abpo.arms.names import arm_class
    from abpo.config import load_config
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.completed import record_path
    from abpo.sim.expected_ctr import scored_sample
    from abpo.sim.headroom import candidate_click_probabilities
    from abpo.sim.simulator import month_requests

    spec = importlib.util.spec_from_file_location("bench_gate_refusals", ROOT / "benchmarks" / "gate_refusals.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    cfg = load_config("demo", [*bench.SMOKE, f"paths.root={tmp_path / 'state'}"])
    registry.configure(cfg)
    got = json.loads((tmp_path / "rows.json").read_text())
    month, nxt = cfg.sim.start_month, "2026-02"
    gated = sorted(p.name for p in (tmp_path / "state" / "cycle").glob("*.gate.json"))
    assert gated and [f"{month}.{r['arm']}.gate.json" for r in got["rows"]] == gated  # every gate, in arm order
    ds, splits = dataset_and_splits(cfg)
    requests = month_requests(cfg, ds, splits, nxt)
    probs, _ = candidate_click_probabilities(cfg, ds, requests)  # the whole month's calibration
    sample = scored_sample(cfg, nxt, requests)
    served = [(requests[j].user_id, requests[j].history, requests[j].candidates) for j in sample]
    for row in got["rows"]:
        rec = json.loads(record_path(cfg, month, row["arm"], "gate").read_text())["result"]
        assert (row["month"], row["scored_month"]) == (month, nxt)
        assert (row["challenger"], row["champion"]) == (rec["version"], rec["champion_version"])
        assert (row["passed"], row["offline_passed"], row["ope_passed"]) == (
            rec["passed"],
            rec["offline_passed"],
            rec["ope_passed"],
        )
        for key in ("challenger", "champion"):
            v, arm = row[key], row["arm"]
            pol = arm_class(arm).load(arm, versions.local_dir(cfg, arm, v), cfg, dataset=ds, model_version=v)
            e = pol.propensities(served)
            want = float(np.mean([float(np.dot(ei, probs[j])) for ei, j in zip(e, sample, strict=True)]))
            assert row[f"{key}_ctr"] == pytest.approx(want, abs=2e-6), (arm, key)
        assert row["diff_pp"] == pytest.approx(100 * (row["challenger_ctr"] - row["champion_ctr"]))
    rows = [bench.GateRow(**{k: r[k] for k in r if k != "diff_pp"}) for r in got["rows"]]
    assert got["summary"] == bench.summary_line(rows)
    assert got["clear"] == bench.clear_line(rows)
