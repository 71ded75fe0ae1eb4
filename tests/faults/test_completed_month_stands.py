"""A completed month run again trains, registers and gates nothing (issue 48 item 11): after a month completed
(serve, ingest, each LLM arm's update, register, gate and promote, each ranker's refit, the report), `abpo arms month
--month M --simulate` again returns the results recorded when each step ran (<state>/cycle/<M>.<arm>.<step>.json), as
its serve and ingest already did ("the month completed before"), whatever the config now hashes to. Before, a rerun
whose config hashed otherwise than the month's run (a demo's DAG run, then the CLI) found no completed update under
its task key: it trained the LLM arms again from the month-start champion, registered a new challenger, ran the gate,
and only its promotion refused ("champion is v3, not the expected v2").

Real tiny model (adopted, so no SFT), simulator, DuckDB, Great Expectations and MLflow."""

from __future__ import annotations

import logging
import time

import pytest

from tests.sizes import RERUN_MONTH


def registry_and_runs(cfg) -> dict:
    """Every version (with its tags), alias and promotion-history entry of the arms, and every MLflow run of the
    store (id and status): what a rerun of a completed month must not change."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import history, versions as arm_versions

    registry.configure(cfg)
    client = MlflowClient()
    out: dict = {}
    for arm in cfg.arms.names:
        name = arm_versions.model_name(arm, cfg)
        out[arm] = {
            "versions": sorted(
                (int(v.version), v.run_id, sorted(v.tags.items()))
                for v in client.search_model_versions(f"name='{name}'")
            ),
            "aliases": dict(client.get_registered_model(name).aliases),
            "history": [(e.action, e.from_version, e.to_version) for e in history.entries(cfg, arm)],
        }
    experiments = [e.experiment_id for e in client.search_experiments()]
    out["runs"] = sorted((r.info.run_id, r.info.status) for r in client.search_runs(experiments, max_results=1000))
    return out


@pytest.mark.slow
def test_a_completed_month_run_again_under_another_config_trains_and_registers_nothing(
    tmp_path, build_tiny_model, caplog
):
    from abpo.config import load_config
    from abpo.monthly.adopt import adopt_model
    from abpo.monthly.common import dataset_and_splits
    from abpo.monthly.month import run_month

    root = tmp_path / "var"
    cfg = load_config("tiny", [f"paths.root={root}", *RERUN_MONTH])
    ds, _ = dataset_and_splits(cfg)
    adopt_model(cfg, "abpo", build_tiny_model(cfg.policy, ds.titles()))
    first = run_month(cfg, "2026-01").to_json()
    assert first["abpo"]["promote"]["moved"] and first["popularity"]["refit"]["moved"], first
    before = registry_and_runs(cfg)

    # the same month under a config that hashes otherwise (another learning rate: every task key differs)
    other = load_config("tiny", [f"paths.root={root}", *RERUN_MONTH, "update.learning_rate=0.0003"])
    caplog.set_level(logging.INFO)
    t0 = time.monotonic()
    again = run_month(other, "2026-01").to_json()
    seconds = time.monotonic() - t0

    assert registry_and_runs(cfg) == before  # no version, alias, history entry or MLflow run
    for step in ("update", "register", "gate"):
        assert again["abpo"][step] == first["abpo"][step]
    assert again["abpo"]["promote"] == {**first["abpo"]["promote"], "moved": False}  # announced when it ran
    assert again["popularity"]["refit"] == {**first["popularity"]["refit"], "moved": False}
    said = caplog.text
    for arm, step in (
        ("abpo", "update"),
        ("abpo", "register"),
        ("abpo", "gate"),
        ("abpo", "promote"),
        ("popularity", "refit"),
    ):
        assert f"{step} {arm}: month 2026-01 completed before; its {step} stands" in said, (arm, step)
    # nothing trained: the rerun is the bootstrap's checks, the report and the records read back (seconds; the month
    # itself took far longer)
    print(f"rerun of the completed month: {seconds:.1f} s")
    assert seconds < 60, seconds


def test_a_step_record_is_read_only_once_the_month_completed(tmp_path):
    """The records are what a completed month's steps did; before the month's report marks it complete (a failed
    month, a retried task) every step runs as before, with its own task key."""
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config
    from abpo.monthly import completed
    from abpo.monthly.common import NotEnoughFeedback
    from abpo.monthly.hold import HoldResult
    from abpo.monthly.report import mark_month_complete

    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    registry.configure(cfg)  # the holdback's champion v1, registered (what the record names must exist)
    name = arm_versions.model_name("holdback", cfg)
    MlflowClient().create_registered_model(name)
    MlflowClient().create_model_version(name, source=str(tmp_path))
    calls = []

    def hold():
        calls.append(1)
        return HoldResult(arm="holdback", month="2026-01", champion_version="1", reason="not updated")

    assert completed.run_arm_step("hold", cfg, "2026-01", "holdback", hold).champion_version == "1"
    assert completed.run_arm_step("hold", cfg, "2026-01", "holdback", hold).champion_version == "1"
    assert len(calls) == 2  # the month is not complete: the step runs
    mark_month_complete(cfg, "2026-01", {})
    assert completed.run_arm_step("hold", cfg, "2026-01", "holdback", hold).reason == "not updated"
    assert len(calls) == 2  # it stands

    def skipped():
        raise NotEnoughFeedback("arm grpo: 0 positive rows")

    with pytest.raises(NotEnoughFeedback):
        completed.run_arm_step("update", cfg, "2026-02", "grpo", skipped)
    mark_month_complete(cfg, "2026-02", {})
    with pytest.raises(NotEnoughFeedback, match="0 positive rows"):  # the skip stands too, with its reason
        completed.run_arm_step("update", cfg, "2026-02", "grpo", lambda: pytest.fail("ran again"))
    # a month completed before the records existed: its steps run (their own task keys find what they can)
    assert completed.run_arm_step("hold", cfg, "2026-02", "holdback", hold).arm == "holdback"
    assert len(calls) == 3
    # a record naming a version the registry no longer holds (a store lost or replaced) does not stand
    MlflowClient().delete_model_version(name, "1")
    completed.run_arm_step("hold", cfg, "2026-01", "holdback", hold)
    assert len(calls) == 4
