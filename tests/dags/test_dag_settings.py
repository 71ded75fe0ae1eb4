"""abpo.monthly.dag_settings: the $ABPO_* variables the abpo_monthly DAG reads when its file is parsed (its retries,
timeouts, the update tasks' pool and queue, the isolated interpreter, the schedule, the landing sensor, the namespace,
approval, the failure hook), read from a plain mapping; the DAG built from them: tests/dags/test_operations.py,
test_isolated_steps.py, test_approval.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from abpo.monthly.dag_settings import dag_settings, schedule_of


def test_an_empty_environment_gives_the_documented_defaults():
    env = dag_settings({})
    assert env.default_args == {
        "retries": 1,
        "retry_delay": timedelta(seconds=300),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=60),
        "execution_timeout": timedelta(minutes=120),
    }
    assert (env.update_timeout, env.update_pool, env.update_queue) == (timedelta(minutes=720), "default_pool", "")
    assert (env.task_python, env.schedule, env.namespace) == ("", "@monthly", "")
    assert (env.wait_for_landing, env.landing_marker) == (False, "_SUCCESS")
    assert (env.landing_poke, env.landing_timeout) == (timedelta(seconds=600), timedelta(hours=72))
    assert (env.approval_required, env.on_failure_hook) == (False, False)  # tiny: arms.approval none


def test_every_variable_is_read():
    env = dag_settings(
        {
            "ABPO_TASK_RETRIES": "3",
            "ABPO_TASK_RETRY_DELAY_S": "7",
            "ABPO_TASK_RETRY_BACKOFF": "1.5",
            "ABPO_TASK_MAX_RETRY_DELAY_MIN": "9",
            "ABPO_TASK_TIMEOUT_MIN": "11",
            "ABPO_UPDATE_TIMEOUT_MIN": "13",
            "ABPO_UPDATE_POOL": "gpu",
            "ABPO_UPDATE_QUEUE": " gpu ",
            "ABPO_TASK_PYTHON": " /opt/abpo-train/bin/python ",
            "ABPO_SCHEDULE": " asset:landed ",
            "ABPO_WAIT_FOR_LANDING": "Yes",
            "ABPO_LANDING_MARKER": "",
            "ABPO_LANDING_POKE_S": "5",
            "ABPO_LANDING_TIMEOUT_H": "0.5",
            "ABPO_NAMESPACE": "stg",
            "ABPO_ON_FAILURE": "my_alerts:page",
        }
    )
    assert env.default_args == {
        "retries": 3,
        "retry_delay": timedelta(seconds=7),
        "retry_exponential_backoff": 1.5,
        "max_retry_delay": timedelta(minutes=9),
        "execution_timeout": timedelta(minutes=11),
    }
    assert (env.update_timeout, env.update_pool, env.update_queue) == (timedelta(minutes=13), "gpu", "gpu")
    assert (env.task_python, env.schedule, env.namespace) == ("/opt/abpo-train/bin/python", "asset:landed", "stg")
    assert (env.wait_for_landing, env.landing_marker) == (True, "")
    assert (env.landing_poke, env.landing_timeout) == (timedelta(seconds=5), timedelta(minutes=30))
    assert env.on_failure_hook is True
    assert dag_settings({"ABPO_WAIT_FOR_LANDING": "0", "ABPO_ON_FAILURE": "  "}).wait_for_landing is False
    assert dag_settings({"ABPO_ON_FAILURE": "  "}).on_failure_hook is False


def test_arms_approval_of_the_config_decides_the_approval_tasks(tmp_path):
    path = tmp_path / "approval.yaml"
    path.write_text("arms:\n  approval: required\n")
    assert dag_settings({"ABPO_CONFIG": str(path)}).approval_required is True
    assert dag_settings({"ABPO_CONFIG": "demo"}).approval_required is False


def test_arms_approval_is_read_through_the_files_a_config_extends(tmp_path):
    """A deployment's file that extends another (abpo.config.extends): the DAG reads arms.approval as load_config
    does, the child's value over its parent's, a parent's when the child says nothing."""
    from abpo.config import load_config

    (tmp_path / "prod.yaml").write_text("extends: demo\narms:\n  approval: required\n")
    (tmp_path / "prod-eu.yaml").write_text("extends: prod.yaml\nname: prod-eu\n")
    (tmp_path / "trial.yaml").write_text("extends: prod-eu.yaml\narms:\n  approval: none\n")
    for name, required in (("prod", True), ("prod-eu", True), ("trial", False)):
        path = tmp_path / f"{name}.yaml"
        assert dag_settings({"ABPO_CONFIG": str(path)}).approval_required is required, name
        assert (load_config(path).arms.approval == "required") is required, name
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\narms:\n  approval: required\n")
    assert dag_settings({"ABPO_CONFIG": str(tmp_path / "loop.yaml")}).approval_required is False  # unreadable


def test_a_relative_task_python_and_a_number_that_does_not_parse_are_refused():
    with pytest.raises(ValueError, match=r"ABPO_TASK_PYTHON='venv/bin/python': rule: an absolute path"):
        dag_settings({"ABPO_TASK_PYTHON": "venv/bin/python"})
    with pytest.raises(ValueError, match=r"invalid literal for int\(\) with base 10: 'two'"):
        dag_settings({"ABPO_TASK_RETRIES": "two"})


def test_the_schedule_is_a_cron_string_none_or_the_ingestions_asset():
    from airflow.sdk import Asset

    assert schedule_of("@monthly") == "@monthly" and schedule_of("0 6 2 * *") == "0 6 2 * *"
    assert schedule_of("none") is None and schedule_of("None") is None
    assert schedule_of("asset: team_landed") == [Asset(name="team_landed")]
    with pytest.raises(ValueError, match=r"ABPO_SCHEDULE='asset: ': rule: asset:<the Asset name the ingestion emits>"):
        schedule_of("asset: ")
