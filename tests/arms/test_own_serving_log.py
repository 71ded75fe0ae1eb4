"""What a user's own serving must log (docs/data.md "What your serving must log"), followed literally: the registered
champion served through MLflow gives the propensities; one impression row per request with the exposed item's
propensity, the champion's version and `softmax(tau=<the tau used>)`; landed with abpo.data.schemas.write_impressions,
it ingests with nothing quarantined, and the propensity abpo recomputes for the logged item from the warehouse row
(the e0 the update and the gate read) is the one logged."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pyarrow as pa

from tests.sizes import ADOPTED_MONTH


def test_rows_logged_as_the_readme_says_are_what_abpo_scores(make_cfg, build_tiny_model):
    import mlflow

    from abpo.arms import versions as arm_versions
    from abpo.data.schemas import IMPRESSIONS_SCHEMA, write_impressions
    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import dataset_and_splits
    from abpo.warehouse import Warehouse

    cfg = make_cfg(*ADOPTED_MONTH)
    ds, splits = dataset_and_splits(cfg)
    titles = ds.titles()
    adopt_model(cfg, "abpo", build_tiny_model(cfg.policy, titles))
    champion = arm_versions.get_version(cfg, "abpo", "champion")
    served = mlflow.pyfunc.load_model("models:/abpo-arm-abpo@champion")
    tau = cfg.policy.tau

    rng = np.random.default_rng(0)
    items = sorted(titles)
    rows, now = [], datetime(2026, 1, 15, 12, tzinfo=UTC)
    for k, s in enumerate(splits[:6]):
        history = [int(i) for i in s.history[-20:]]
        candidates = [int(i) for i in rng.choice(items, size=8, replace=False)]
        request = {
            "history_item_ids": history,
            "history_titles": [titles[i] for i in history],
            "candidate_ids": candidates,
            "candidate_titles": [titles[i] for i in candidates],
        }
        p = served.predict(pd.DataFrame([request]), params={"tau": tau})["propensities"][0]
        j = int(rng.choice(len(candidates), p=np.asarray(p) / np.sum(p)))  # the exposure drawn from e_p
        rows.append(
            {
                "impression_id": f"req-{k}-0",
                "event_time": now,
                "user_id": int(s.user_id),
                "arm": "abpo",
                "model_version": str(champion.version),
                "history": history,
                "candidates": candidates,
                "item_id": candidates[j],
                "propensity": float(p[j]),
                "clicked": int(k % 2),
                "request_id": f"req-{k}",
                "position": 0,
                "logging_policy": f"softmax(tau={tau})",
                "served_at": now,
                "schema_version": 1,
            }
        )
    landing = cfg.paths.resolve("landing")
    write_impressions(pa.Table.from_pylist(rows, schema=IMPRESSIONS_SCHEMA), landing, "2026-01", part="serving")
    with Warehouse(cfg.paths.resolve("warehouse")) as wh:
        report = wh.ingest_month(landing, "2026-01", cfg.data.known_arms)
        pos, neg = wh.strata(["2026-01"])
    assert report.rows_clean == len(rows) and sum(report.quarantined_by_rule.values()) == 0
    logged = pa.concat_tables([pos, neg]).to_pylist()
    arm = arm_versions.load_arm(cfg, "abpo", ds)  # what the update (e_old) and the gate (e_champion) score
    again = arm.propensities([(r["user_id"], r["history"], r["candidates"]) for r in logged])
    for r, e in zip(logged, again):
        assert r["propensity"] == float(np.float64(r["propensity"]))
        assert abs(r["propensity"] - float(e[r["candidates"].index(r["item_id"])])) < 1e-5, r["impression_id"]
