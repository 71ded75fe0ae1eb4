"""The champion Asset event fires only when the champion moved: the DAG's promote and refit tasks have an AssetAlias
outlet (an Asset outlet would get an event on every successful run, a failed gate included) and add the champion's
event to it, with the version in its extra, only when the step's result says the champion moved. The steps run for
real (MLflow registry, the popularity refit); the events go into Airflow's own outlet accessors."""

from __future__ import annotations

from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"


def _events(arm: str, month: str, result: dict, namespace: str = "") -> list:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from abpo.monthly.airflow_tasks import announce_champion, champion_alias

    accessors = OutletEventAccessors()
    announce_champion(accessors, arm, month, result, namespace=namespace)
    return list(accessors[champion_alias(arm)].asset_alias_events)


def test_the_steps_that_move_a_champion_have_an_alias_outlet_not_an_asset():
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import AssetAlias

    bag = DagBag(dag_folder=str(DAGS))
    dag = bag.dags["abpo_monthly"]
    for arm, task_id in (
        ("abpo", "abpo.promote"),
        ("grpo", "grpo.promote"),
        ("ml_retrain", "ml_retrain.refit"),
        ("popularity", "popularity.refit"),
    ):
        outlets = dag.get_task(task_id).outlets
        assert [(type(o), o.name) for o in outlets] == [(AssetAlias, f"abpo_champion_{arm}_moves")], task_id


def test_a_failed_gate_fires_nothing_and_a_passed_one_fires_the_new_version(tmp_path):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config
    from abpo.monthly.gate import GateResult
    from abpo.monthly.promote import promote

    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    registry.configure(cfg)
    client = MlflowClient()
    client.create_registered_model("abpo-arm-abpo")
    for _ in range(3):
        client.create_model_version("abpo-arm-abpo", source=(tmp_path / "nothing").as_uri())
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")

    def gate(version: str, passed: bool) -> GateResult:
        return GateResult(
            arm="abpo",
            version=version,
            champion_version="1",
            passed=passed,
            reason="test",
            metric="HR@5",
            challenger={},
            champion={},
            off_policy=None,
        )

    failed = promote(cfg, "abpo", gate("2", False)).to_json()
    assert (failed["champion_version"], failed["moved"]) == ("1", False)
    assert _events("abpo", "2026-01", failed) == []

    passed = promote(cfg, "abpo", gate("3", True)).to_json()
    assert (passed["champion_version"], passed["previous_version"], passed["moved"]) == ("3", "1", True)
    (event,) = _events("abpo", "2026-02", passed)
    assert event.dest_asset_key.name == "abpo_champion_abpo"
    assert event.dest_asset_key.uri == "mlflow://models/abpo-arm-abpo/champion"
    assert event.extra == {
        "arm": "abpo",
        "version": "3",
        "previous_version": "1",
        "month": "2026-02",
        "model_uri": "models:/abpo-arm-abpo/3",
    }
    # a retried promote (its first attempt moved the alias, then the task died) still announces the move
    again = promote(cfg, "abpo", gate("3", True)).to_json()
    assert again["moved"] and len(_events("abpo", "2026-02", again)) == 1


def test_a_refit_fires_when_it_moved_the_champion_and_a_rerun_does_not(tmp_path):
    from abpo.config import load_config
    from abpo.monthly.refit import refit

    cfg = load_config("tiny", [f"paths.root={tmp_path}", "data.max_users=40"])
    first = refit(cfg, "popularity", None).to_json()
    (event,) = _events("popularity", "", first)
    assert event.extra["version"] == "1" and event.extra["previous_version"] == ""
    rerun = refit(cfg, "popularity", None).to_json()  # same data: its completed run is reused
    assert (rerun["version"], rerun["moved"]) == ("1", False)
    assert _events("popularity", "", rerun) == []
    other = load_config("tiny", [f"paths.root={tmp_path}", "data.max_users=40", "seed=1"])  # a new fit
    moved = refit(other, "popularity", None).to_json()
    (event,) = _events("popularity", "2026-01", moved)
    assert (event.extra["version"], event.extra["previous_version"]) == ("2", "1")


def test_a_hand_move_found_at_the_month_start_fires_the_champion_event(tmp_path):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import promotion
    from abpo.config import load_config
    from abpo.monthly.airflow_tasks import announce_hand_moves, champion_alias
    from abpo.monthly.bootstrap import bootstrap_arms

    outlets = DagBag(dag_folder=str(DAGS)).dags["abpo_monthly"].get_task("bootstrap").outlets
    assert {o.name for o in outlets if isinstance(o, AssetAlias)} >= {
        "abpo_champion_abpo_moves",
        "abpo_champion_popularity_moves",
    }
    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    cfg.arms.names = ["abpo"]
    registry.configure(cfg)
    client = MlflowClient()
    client.create_registered_model("abpo-arm-abpo")
    for _ in range(3):
        client.create_model_version("abpo-arm-abpo", source=(tmp_path / "nothing").as_uri())
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
    promotion.promote(cfg, "abpo", "2")
    quiet = bootstrap_arms(cfg, "2026-02").arms
    accessors = OutletEventAccessors()
    assert announce_hand_moves(accessors, "2026-02", quiet, namespace="") == []  # nothing moved outside abpo
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "3")  # by hand in the MLflow UI
    arms = bootstrap_arms(cfg, "2026-03").arms
    assert announce_hand_moves(accessors, "2026-03", arms, namespace="") == ["abpo"]
    (event,) = list(accessors[champion_alias("abpo")].asset_alias_events)
    assert event.dest_asset_key.name == "abpo_champion_abpo"
    assert (event.extra["version"], event.extra["previous_version"], event.extra["month"]) == ("3", "2", "2026-03")
