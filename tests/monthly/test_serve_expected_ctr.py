"""The serve step of a simulated month stores the simulator's expected CTR of every arm's champion (issue 60 point 4):
each distinct model scored once (the holdback and the LLM arms not yet promoted all serve pi_init), on one request per
user, with the month's own click calibration, beside each arm's realised CTR; a rerun of the month writes the same
bytes; benchmarks/headroom.py --record stores an online bound beside it only on the requests the month served.

The five arms of tests/monthly/test_holdback_months.py (real tiny model, simulator, MLflow), bootstrapped and served;
no update is trained."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.monthly.test_holdback_months import SMALL
from tests.sizes import FIVE_ARMS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_simulated_month_stores_each_champions_expected_ctr(tmp_path, pi_init_state):
    from abpo import registry
    from abpo.abtest import sim_ctr
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly.bootstrap import bootstrap
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.serve import serve
    from abpo.sim.expected_ctr import scored_sample
    from abpo.sim.headroom import candidate_click_probabilities, expected_ctr
    from abpo.sim.simulator import month_requests

    cfg = load_config("tiny", [f"paths.root={tmp_path}", *SMALL])
    pi_init_state(cfg)
    registry.configure(cfg)
    bootstrap(cfg, "2026-01")
    res = serve(cfg, "2026-01", simulate=True)
    path = sim_ctr.figures_path(cfg, "2026-01")
    assert res.expected_ctr == str(path) and path == tmp_path / "sim" / "expected_ctr" / "2026-01.json"
    first = path.read_bytes()
    f = sim_ctr.read_month_figures(cfg, "2026-01")

    ds, splits = dataset_and_splits(cfg)
    requests = month_requests(cfg, ds, splits, "2026-01")
    assert f["requests"]["month"] == len(requests) == len(splits) * cfg.sim.requests_per_user
    assert f["requests"]["scored"] == len(splits) and f["requests"]["sample"] == "one request per user"
    sample = scored_sample(cfg, "2026-01", requests)
    assert sorted(requests[j].user_id for j in sample) == sorted(s.user_id for s in splits)  # one per user

    # the LLM arms and the holdback all serve pi_init this month: one model, scored once, the same figure
    assert set(f["arms"]) == set(FIVE_ARMS)
    pi = {a: f["arms"][a]["model"] for a in ("abpo", "grpo", "holdback")}
    assert len(set(pi.values())) == 1 and next(iter(pi.values())).startswith("pi_init (")
    assert f["reference"]["start"]["model"] == pi["abpo"]
    assert f["models_scored"] == 3  # pi_init, ml_retrain v1, popularity v1
    assert {f["arms"][a]["expected_ctr"] for a in pi} == {f["reference"]["start"]["expected_ctr"]}
    assert f["arms"]["popularity"]["model"] == f"popularity v{res.per_arm['popularity']['model_version']}"

    # an independent computation: the click probabilities of the whole month (its own calibration, as simulate_month
    # calibrates), the sample taken from them, Eq. H1 by hand for pi_init (the holdback's champion) and a ranker
    probs, _ = candidate_click_probabilities(cfg, ds, requests)
    landed = pq.read_table(res.path, columns=["request_id", "arm"])  # which arm served each request, as landed
    arm_of = dict(zip(landed.column("request_id").to_pylist(), landed.column("arm").to_pylist(), strict=True))
    p = [probs[j] for j in sample]
    served = [(requests[j].user_id, requests[j].history, requests[j].candidates) for j in sample]
    for arm in ("holdback", "ml_retrain"):
        pol = arm_versions.load_arm(cfg, arm, ds)
        e = pol.propensities(served)
        want = float(np.mean([float(np.dot(ei, pi_)) for ei, pi_ in zip(e, p, strict=True)]))
        assert f["arms"][arm]["expected_ctr"] == pytest.approx(want, abs=2e-6), arm
        own = [k for k, j in enumerate(sample) if arm_of[requests[j].request_id] == arm]
        assert f["arms"][arm]["scored_own"] == len(own)
        if own:
            assert f["arms"][arm]["expected_ctr_own"] == pytest.approx(
                expected_ctr([p[k] for k in own], [e[k] for k in own]), abs=2e-6
            )
    assert f["reference"]["oracle_greedy"] == pytest.approx(float(np.mean([q.max() for q in p])), abs=2e-6)
    assert f["reference"]["random_floor"] == pytest.approx(float(np.mean([q.mean() for q in p])), abs=2e-6)
    assert all(a["expected_ctr"] <= f["reference"]["oracle_greedy"] for a in f["arms"].values())  # H2 bounds H1
    for arm, v in res.per_arm.items():  # realised: the month's simulated clicks, as served
        assert f["arms"][arm]["impressions"] == v["impressions"] and f["arms"][arm]["clicks"] == v["clicks"]
        assert f["arms"][arm]["realised_ctr"] == pytest.approx(v["clicks"] / v["impressions"], abs=1e-6)

    # the month served again (not completed yet: simulated again, the same champions): the same bytes
    serve(cfg, "2026-01", simulate=True)
    assert path.read_bytes() == first
    assert sorted(p.name for p in path.parent.iterdir()) == ["2026-01.json"]  # no temporary left

    # benchmarks/headroom.py --record: the bound only on the month's own requests; two real policies stand in for
    # the two trained updates (the recording, not the training, is under test here)
    import importlib.util

    spec = importlib.util.spec_from_file_location("headroom_bench", ROOT / "benchmarks" / "headroom.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from abpo.sim.headroom import month_headroom

    other = dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, requests_per_user=cfg.sim.requests_per_user + 1))
    with pytest.raises(ValueError, match=r"--record 2026-01: .*2026-01\.json: requests\.sha256 differs from this run"):
        bench.check_recordable(other, "2026-01", month_requests(other, ds, splits, "2026-01"), True)
    with pytest.raises(ValueError, match=r"--record 2026-02: .*2026-02\.json: no expected-CTR figures"):
        bench.check_recordable(cfg, "2026-02", requests, True)
    bench.check_recordable(cfg, "2026-01", requests, True)
    trained = {
        bench.BOUND: arm_versions.load_arm(cfg, "ml_retrain", ds),
        "abpo update (logged reward)": arm_versions.load_arm(cfg, "abpo", ds),
    }
    head = month_headroom(
        cfg,
        "2026-01",
        {"pi_init": trained["abpo update (logged reward)"], **trained},
        dataset=ds,
        splits=splits,
        requests=requests,
    )
    bpath = bench.record_bound(cfg, "2026-01", "abpo", "1", requests, trained, head, ds, seed=0)
    b = sim_ctr.load_sim_ctr(cfg, ["2026-01"]).months[0].bound
    assert bpath == sim_ctr.bound_path(cfg, "2026-01")
    assert b["online_bound"] == f["arms"]["ml_retrain"]["expected_ctr"]  # the same policy on the same requests
    assert b["logged_update"] == f["arms"]["abpo"]["expected_ctr"]
    assert b["all_requests"]["requests"] == len(requests)
