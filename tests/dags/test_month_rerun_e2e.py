"""Issue 32: a completed month run again through Airflow (`airflow dags test abpo_monthly <logical date>` with the
month's param, what a re-triggered or cleared DAG run does) changes no registry version and no alias of any abpo
registered model, and moves no champion. The month is completed first in one process (run_month, the route of
tests/monthly/test_month_idempotence.py) on the same config file the DAG's tasks load ($ABPO_CONFIG), so both runs
compute the same task keys; the rerun's update and promote tasks run (not skipped) and find their completed runs.

Real tiny model (adopted, so no SFT), simulator, DuckDB, Great Expectations, MLflow and Airflow."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
import yaml
from airflow_services import dags_test_month

from tests.sizes import RERUN_MONTH

REPO = Path(__file__).resolve().parents[2]


def registry_snapshot(tracking_uri: str) -> dict:
    """Every registered model of the store (the arms', pi_init's): its versions (number, run, tags) and aliases."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    out = {}
    for rm in client.search_registered_models(max_results=1000):
        out[rm.name] = {
            "aliases": dict(rm.aliases),
            "versions": sorted(
                (int(v.version), v.run_id, sorted((v.tags or {}).items()))
                for v in client.search_model_versions(f"name='{rm.name}'")
            ),
        }
    return out


@pytest.mark.slow
def test_a_completed_month_rerun_through_airflow_changes_no_version_and_no_alias(
    tmp_path, monkeypatch, build_tiny_model
):
    from abpo.config import load_config
    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.month import run_month

    state = tmp_path / "state"
    monkeypatch.setenv("ABPO_STATE", str(state))
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    config = tmp_path / "month.yaml"  # the deployment's config file: read by this process and by every task
    config.write_text(yaml.safe_dump(load_config("tiny", RERUN_MONTH).to_dict(), sort_keys=False))
    cfg = load_config(config)
    ds, _ = dataset_and_splits(cfg)
    adopt_model(cfg, "abpo", build_tiny_model(cfg.policy, ds.titles()))  # the first champion, without SFT
    first = run_month(cfg, "2026-01").to_json()
    assert first["abpo"]["promote"]["moved"], first["abpo"]  # the month moved the champion
    uri = cfg.paths.tracking_uri()
    before = registry_snapshot(uri)
    assert {"abpo-arm-abpo", "abpo-arm-popularity"} <= set(before), before
    assert str(before["abpo-arm-abpo"]["aliases"]["champion"]) == first["abpo"]["register"]["version"] != "1"

    home = tmp_path / "airflow"
    tis = dags_test_month(tmp_path, config, state, "2026-01", "2026-02-01T00:00:00+00:00")
    for task in (
        "bootstrap",
        "serve",
        "ingest",
        "abpo.update",
        "abpo.register",
        "abpo.gate",
        "abpo.promote",
        "popularity.refit",
        "report",
    ):  # the rerun ran every step of the configured arms
        assert tis.get(task) == "success", (task, tis)

    assert registry_snapshot(uri) == before  # no version, no alias, no tag of a version changed
    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:  # and no champion Asset event fired
        events = db.execute(
            "SELECT a.name FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name LIKE 'abpo_champion_%'"
        ).fetchall()
    assert events == [], events
