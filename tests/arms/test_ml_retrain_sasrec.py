"""The ML-retrain arm with ``arms.ml_retrain.kind: sasrec`` (issue 43 point 4): bootstrapped early-stopped on the
validation users, refitted in a month warm-started from the champion's weights, registered in MLflow like ALS, and
served through the same mlflow.pyfunc path with propensities that sum to 1 over the candidates.

A month of the ranker arms only (ml_retrain and popularity: no LLM, so it runs in seconds), real simulator, DuckDB,
Great Expectations and MLflow."""

from __future__ import annotations

import numpy as np
import pytest

from tests.sizes import SASREC_RANKER_MONTH


def test_kind_dispatch_picks_the_ranker(make_cfg):
    from abpo.arms.rankers import RankerArm

    assert RankerArm.make_ranker("ml_retrain", make_cfg()).name == "ml_retrain"  # als, the default
    r = RankerArm.make_ranker("ml_retrain", make_cfg("arms.ml_retrain.kind=sasrec", "sasrec.hidden_size=32"))
    assert r.name == "sasrec" and r.params["hidden_size"] == 32
    assert RankerArm.make_ranker("popularity", make_cfg("arms.ml_retrain.kind=sasrec")).name == "popularity"


@pytest.mark.slow  # ~35 CPU-s: bootstrap, simulated serve, ingest and refit of two ranker arms
def test_a_month_with_kind_sasrec_registers_a_warm_started_version_that_serves_propensities(make_cfg):
    import json
    from pathlib import Path

    import mlflow
    import pandas as pd

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.month import run_month

    cfg = make_cfg(*SASREC_RANKER_MONTH)
    res = run_month(cfg, "2026-01").to_json()
    refit = res["ml_retrain"]["refit"]
    champion = arm_versions.get_version(cfg, "ml_retrain")
    assert str(champion.version) == refit["version"] == "2" and refit["months"] == ["2026-01"]
    assert champion.tags["parent_version"] == "1" and champion.tags["source"] == "refit"
    local = arm_versions.local_dir(cfg, "ml_retrain", champion.version)
    meta = json.loads((local / "ranker.json").read_text())
    assert meta["kind"] == "sasrec" and meta["fit"]["warm_started"] and meta["fit"]["epochs_run"] == 1
    boot = json.loads((arm_versions.local_dir(cfg, "ml_retrain", "1") / "ranker.json").read_text())
    assert boot["kind"] == "sasrec" and not boot["fit"]["warm_started"] and boot["fit"]["n_val_positions"] > 0

    # served through mlflow.pyfunc like ALS: the logged model's requirements pin torch, propensities sum to 1
    registry.configure(cfg)
    model = mlflow.pyfunc.load_model(f"models:/{arm_versions.model_name('ml_retrain', cfg)}@champion")
    ds, splits = dataset_and_splits(cfg)
    items = ds.item_ids().tolist()
    rows = [
        {"history_item_ids": s.history[-5:], "candidate_ids": [s.target, *items[k * 7 : k * 7 + 9]]}
        for k, s in enumerate(splits[:4])
    ]
    out = model.predict(pd.DataFrame(rows))
    for row, p, ranked in zip(rows, out["propensities"], out["ranked_item_ids"]):
        p = np.asarray(p)
        assert p.shape == (len(row["candidate_ids"]),) and (p > 0).all() and p.sum() == pytest.approx(1.0)
        assert sorted(ranked) == sorted(row["candidate_ids"])
    uri = f"models:/{arm_versions.model_name('ml_retrain', cfg)}/{champion.version}"
    assert "torch==" in Path(mlflow.pyfunc.get_model_dependencies(uri)).read_text()  # its loader imports torch
