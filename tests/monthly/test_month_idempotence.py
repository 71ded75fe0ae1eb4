"""Issue 32 item 1: a completed month run again (`abpo arms month`'s run_month, what a cleared or re-triggered DAG
run does task by task) changes nothing: no registry version, no alias, no promotion-history entry, no training. The
update's task key is computed from the month's inputs: the champion recorded at the month's start (not the one its
own promotion made), the rows, the config with canonical paths (ABPO_STATE with a trailing slash is the same
state). Before, the rerun's key held the promoted champion, so the month trained and promoted again (grpo v6, v7).

Real tiny model (adopted, so no SFT), simulator, DuckDB, Great Expectations and MLflow."""

from __future__ import annotations

import pytest

from tests.sizes import RERUN_MONTH


def registry_state(cfg) -> dict:
    """Every version (with its tags), alias and promotion-history entry of the arms: what a rerun must not change."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import history, versions as arm_versions

    registry.configure(cfg)
    client = MlflowClient()
    out = {}
    for arm in cfg.arms.names:
        name = arm_versions.model_name(arm, cfg)
        rm = client.get_registered_model(name)
        out[arm] = {
            "versions": sorted(
                (int(v.version), v.run_id, sorted(v.tags.items()))
                for v in client.search_model_versions(f"name='{name}'")
            ),
            "aliases": dict(rm.aliases),
            "history": [(e.action, e.from_version, e.to_version) for e in history.entries(cfg, arm)],
        }
    return out


@pytest.mark.slow
def test_a_completed_month_run_again_changes_no_version_and_no_alias(tmp_path, build_tiny_model):
    from abpo.config import load_config
    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.month import run_month

    root = tmp_path / "k1"
    cfg = load_config("tiny", [f"paths.root={root}", *RERUN_MONTH])
    ds, _ = dataset_and_splits(cfg)
    adopt_model(cfg, "abpo", build_tiny_model(cfg.policy, ds.titles()))  # the first champion, without SFT
    first = run_month(cfg, "2026-01").to_json()
    assert first["abpo"]["promote"]["promoted"] and first["abpo"]["promote"]["moved"], first["abpo"]
    before = registry_state(cfg)
    assert str(before["abpo"]["aliases"]["champion"]) == first["abpo"]["register"]["version"] != "1"

    again = run_month(cfg, "2026-01").to_json()  # a rerun, or a cleared DAG run
    assert registry_state(cfg) == before
    assert again["abpo"]["update"]["run_id"] == first["abpo"]["update"]["run_id"]  # found again, not retrained
    assert again["abpo"]["update"]["parent_version"] == "1"  # the champion of the month's start, not the promoted one
    assert again["abpo"]["promote"]["promoted"] and not again["abpo"]["promote"]["moved"]  # no champion event
    assert again["popularity"]["refit"]["version"] == first["popularity"]["refit"]["version"]
    assert not again["popularity"]["refit"]["moved"]
    assert again["serve"] == {"month": "2026-01", "files": 1, "simulated": False}  # the month's logs stand
    assert again["ingest"] == first["ingest"]

    # the same state spelled with a trailing slash (ABPO_STATE=.../k1/): the same keys, nothing retrained
    slashed = load_config("tiny", [f"paths.root={root}/", *RERUN_MONTH])
    run_month(slashed, "2026-01")
    assert registry_state(cfg) == before


def test_task_keys_use_canonical_paths_and_the_month_start_is_recorded_once(tmp_path, monkeypatch):
    """The cheap half of the above: ABPO_STATE=.../k1/ (a trailing slash) or .../x/../k1 gives the same task keys as
    .../k1 (the config's hash reads canonical paths; the default relative paths hash as before); the champion a month
    started from is recorded once, and a later champion (the month's own promotion) does not replace the record."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config
    from abpo.monthly.common import task_key

    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    keys = set()
    for spelled in (f"{tmp_path}/k1", f"{tmp_path}/k1/", f"{tmp_path}/x/../k1"):
        monkeypatch.setenv("ABPO_STATE", spelled)
        keys.add(task_key(load_config("tiny"), "update", "abpo", "2026-04", "rows", "parent-v1"))
    assert len(keys) == 1
    # another directory holding the same state (a relocated copy): the same keys too (tests/monthly/
    # test_update_relocated.py); another setting: another key
    monkeypatch.setenv("ABPO_STATE", f"{tmp_path}/k2")
    assert task_key(load_config("tiny"), "update", "abpo", "2026-04", "rows", "parent-v1") in keys
    assert task_key(load_config("tiny", ["seed=7"]), "update", "abpo", "2026-04", "rows", "parent-v1") not in keys

    from abpo.monthly.common import champion_at_month_start, record_month_start

    cfg = load_config("tiny")
    registry.configure(cfg)
    client = MlflowClient()
    client.create_registered_model("abpo-arm-abpo")
    for _ in range(2):
        client.create_model_version("abpo-arm-abpo", source=(tmp_path / "nothing").as_uri())
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
    assert record_month_start(cfg, "abpo", "2026-04", "1") == "1"
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "2")  # the month's promotion
    assert record_month_start(cfg, "abpo", "2026-04", "2") == "1"  # a rerun's bootstrap keeps the record
    assert str(champion_at_month_start(cfg, "abpo", "2026-04").version) == "1"
    assert str(champion_at_month_start(cfg, "abpo", "2026-05").version) == "2"  # none recorded: the champion now
