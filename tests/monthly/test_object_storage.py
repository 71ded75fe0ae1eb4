"""A month of the loop with its landing zone and MLflow's artifacts in a bucket of a real S3 API (moto's server on
127.0.0.1, IAM enforced; fixture ``s3`` in tests/conftest.py), on the shrunken tiny config of
tests/arms/test_cycle.py: the month lands in the bucket, is ingested from there, updates, registers with its
artifacts in the bucket, and the next month is served by the champions downloaded from the bucket. Credentials and
the endpoint come from the environment only (AWS_* variables, AWS_ENDPOINT_URL)."""

from __future__ import annotations

import pytest

from tests.sizes import GATE_PASSES, LIKELY_CLICKS, MONTH

ARMS = ["abpo", "popularity"]
SMALL = [
    *MONTH,
    *LIKELY_CLICKS,
    *GATE_PASSES,
    "arms.update_max_examples=48",
    f"arms.names=[{', '.join(ARMS)}]",
    f"data.known_arms=[{', '.join(ARMS)}]",
    "report.arm_shares={abpo: 0.5, popularity: 0.5}",
]


@pytest.mark.slow
def test_a_month_lands_in_a_bucket_and_runs_ingest_update_register_serve(s3, tmp_path):
    import shutil

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly.month import run_month
    from abpo.monthly.serve import serve

    landing = f"s3://{s3.bucket}/landing"
    cfg = load_config(
        "tiny",
        [
            f"paths.root={tmp_path}",
            f"paths.landing={landing}",
            f"paths.mlflow_artifacts=s3://{s3.bucket}/mlartifacts",
            *SMALL,
        ],
    )
    registry.configure(cfg)

    def keys(prefix):
        pages = s3.client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    m = run_month(cfg, "2026-01").to_json()  # bootstrap, serve (lands in the bucket), ingest from it, update, ...
    assert sorted(keys("landing/impressions/month=2026-01/")) == [
        "landing/impressions/month=2026-01/_SUCCESS",
        "landing/impressions/month=2026-01/part-sim.parquet",
    ]
    served = sum(v["impressions"] for v in m["serve"]["per_arm"].values())
    assert m["ingest"]["rows_in"] == served > 0 and m["ingest"]["interactions"] > 0
    assert m["abpo"]["update"]["run_id"] and m["abpo"]["promote"]["promoted"]
    assert not (tmp_path / "landing").exists() and not list(tmp_path.rglob("s3:*"))  # nothing became a local dir

    # the registered versions' artifacts are in the bucket, and their source says so
    from mlflow import MlflowClient

    for arm in ARMS:
        champ = arm_versions.get_version(cfg, arm, "champion")
        source = MlflowClient().get_model_version_download_uri(arm_versions.model_name(arm, cfg), champ.version)
        assert source.startswith(f"s3://{s3.bucket}/mlartifacts/"), source
        prefix = source.removeprefix(f"s3://{s3.bucket}/")
        stored = keys(prefix)
        assert any(k.endswith("MLmodel") for k in stored), stored
        assert any(k.endswith(("config.json", "ranker.json")) for k in stored), stored
    assert any(k.endswith((".safetensors", ".bin")) for k in keys("mlartifacts/"))  # the weights, not only metadata

    # the next month is served by the champions as downloaded from the bucket (the local copies removed first)
    shutil.rmtree(cfg.paths.resolve("models") / "registry", ignore_errors=True)
    res = serve(cfg, "2026-02", simulate=True)
    assert res.path == f"{landing}/impressions/month=2026-02/part-sim.parquet"
    assert set(res.per_arm) == set(ARMS) and all(v["impressions"] > 0 for v in res.per_arm.values())
    assert (cfg.paths.resolve("models") / "registry").is_dir()  # downloaded again, from the bucket
    assert "landing/impressions/month=2026-02/_SUCCESS" in keys("landing/impressions/month=2026-02/")
