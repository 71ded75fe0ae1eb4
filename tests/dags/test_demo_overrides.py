"""`abpo demo --set ...`: every month's DAG run gets the demo's overrides except the ones its environment carries
(paths.root as ABPO_STATE, the tracking URI as ABPO_TRACKING_URI), and an override the DAG would refuse stops the
demo at once, naming it, before pi_init is trained (it used to fail month 1's run after the whole bootstrap)."""

from __future__ import annotations

import pytest

from abpo.cli import main
from abpo.config import load_config
from abpo.config.errors import ConfigError
from abpo.monthly.local_airflow import airflow_env, carried_by_env, month_run_overrides


def test_paths_travel_in_the_environment_and_the_rest_reach_the_run(tmp_path):
    sets = [
        f"paths.root={tmp_path}",
        "update.learning_rate=0.001",
        f"paths.mlflow_tracking_uri=sqlite:///{tmp_path}/m.db",
        "sim.requests_per_user=3",
        "paths.namespace=staging",
    ]
    assert month_run_overrides(sets) == ["update.learning_rate=0.001", "sim.requests_per_user=3"]
    cfg = load_config("demo", sets)
    env = airflow_env(cfg, "demo")
    assert env["ABPO_STATE"] == str(tmp_path) and env["ABPO_TRACKING_URI"] == f"sqlite:///{tmp_path}/m.db"
    assert env["ABPO_NAMESPACE"] == "staging"
    assert carried_by_env() == {
        "paths.root": "ABPO_STATE",
        "paths.mlflow_tracking_uri": "ABPO_TRACKING_URI",
        "paths.namespace": "ABPO_NAMESPACE",
    }
    assert set(carried_by_env().values()) <= set(env)


@pytest.mark.parametrize("item", ["paths.models=/elsewhere", "data.dataset_dir=/x", "policy.model=gpt2"])
def test_an_override_the_dag_refuses_is_refused_up_front(item):
    with pytest.raises(
        ConfigError,
        match=rf"--set: overrides item '{item}': rule: key=value with a key in sim\.\*.*"
        r"nothing was run",
    ):
        month_run_overrides(["sim.base_ctr=0.01", item])


def test_the_demo_command_refuses_before_it_prepares_anything(tmp_path, capsys):
    rc = main(
        [
            "demo",
            "--config",
            "demo",
            "--set",
            f"paths.root={tmp_path / 'state'}",
            "--set",
            "data.dataset_dir=/nowhere",
            "--months",
            "1",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "abpo demo: --set: overrides item 'data.dataset_dir=/nowhere'" in err and "ABPO_STATE" in err
    assert not (tmp_path / "state").exists()  # nothing prepared, nothing bootstrapped
