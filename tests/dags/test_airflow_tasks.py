"""abpo.monthly.airflow_tasks: what the abpo_monthly DAG's tasks do besides their step, called as the tasks call them,
with Airflow's own objects (its current context, its DAG run and asset event models, its outlet accessors and
exceptions): the run's config, the month a run processes, the landing check, the skips, the failure hook and the
champion Asset events. The wrapper that fails a refusal at once: tests/dags/test_operations.py; the events of real
promote and refit steps: tests/dags/test_champion_events.py."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest

from abpo.monthly import airflow_tasks as tasks


def _run(run_type: str, logical_date: datetime | None = None, months: tuple[str, ...] = ()):
    """Airflow's DAG run model, as the task runner puts it in the context, and its triggering asset events (one
    event per month in ``months``, whose extra names it, as the team's ingestion would emit it)."""
    from airflow.sdk.api.datamodels._generated import (
        AssetEventDagRunReference,
        AssetReferenceAssetEventDagRun,
        DagRun,
        DagRunState,
        DagRunType,
    )
    from airflow.sdk.execution_time.comms import AssetEventDagRunReferenceResult
    from airflow.sdk.execution_time.context import TriggeringAssetEventsAccessor

    now = datetime(2026, 3, 5, tzinfo=UTC)
    events = [
        AssetEventDagRunReference(
            asset=AssetReferenceAssetEventDagRun(name="team_landed", uri="team_landed", extra={}),
            extra={"month": m} if m else {},
            source_task_id=None,
            source_dag_id=None,
            source_run_id=None,
            source_map_index=None,
            source_aliases=[],
            timestamp=now,
        )
        for m in months
    ]
    run = DagRun(
        dag_id="abpo_monthly",
        run_id=f"{run_type}__x",
        logical_date=logical_date,
        data_interval_start=None,
        data_interval_end=None,
        run_after=now,
        start_date=now,
        end_date=None,
        run_type=DagRunType(run_type),
        state=DagRunState.RUNNING,
        consumed_asset_events=events,
        partition_key=None,
    )
    accessor = TriggeringAssetEventsAccessor.build(
        AssetEventDagRunReferenceResult.from_asset_event_dag_run_reference(e) for e in events
    )
    return {"dag_run": run, "logical_date": logical_date, "triggering_asset_events": accessor}


def _land(state, month: str, marker: bool) -> None:
    d = state / "landing" / "impressions" / f"month={month}"
    d.mkdir(parents=True)
    (d / "part-0.parquet").write_bytes(b"not read: the check lists the directory")
    if marker:
        (d / "_SUCCESS").write_text("")


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("ABPO_STATE", str(tmp_path / "state"))
    monkeypatch.delenv("ABPO_CONFIG", raising=False)
    return tmp_path / "state"


def test_the_runs_config_is_the_deployments_with_the_runs_allowed_overrides(state, monkeypatch, abpo_only_config):
    from airflow.sdk.execution_time.context import set_current_context

    cfg = tasks.task_config({"overrides": ["seed=3"]})
    assert (cfg.name, cfg.seed, cfg.paths.root) == ("tiny", 3, str(state))
    with set_current_context({"params": {"overrides": ["seed=4"]}}):  # by default the running task's params
        assert tasks.task_config().seed == 4
    monkeypatch.setenv("ABPO_CONFIG", str(abpo_only_config))
    assert tasks.task_config({}).arms.names == ["abpo"]
    with pytest.raises(ValueError, match=r"overrides item 'paths.root=/etc': rule:"):
        tasks.task_config({"overrides": ["paths.root=/etc"]})


def test_the_month_is_the_param_the_asset_events_or_the_month_before_the_run(state):
    assert tasks.month_to_process({"params": {"month": "2026-01"}}, wait_for_landing=False) == "2026-01"
    with pytest.raises(ValueError, match=r"param month"):
        tasks.month_to_process({"params": {"month": "2026-13"}}, wait_for_landing=False)
    with pytest.raises(ValueError, match=r"overrides item 'paths.root=/etc'"):  # checked before anything else
        tasks.month_to_process(
            {"params": {"month": "2026-01", "overrides": ["paths.root=/etc"]}}, wait_for_landing=False
        )

    asset_run = _run("asset_triggered", months=("", "2026-01"))  # the first event with a month names it
    assert tasks.month_to_process({"params": {}, **asset_run}, wait_for_landing=False) == "2026-01"
    assert len(tasks.triggering_events(asset_run)) == 2 and tasks.triggering_events({}) == []
    unnamed = _run("asset_triggered", months=("",))  # no month in the extra: the month before the run (March 5)
    assert tasks.month_to_process({"params": {}, **unnamed}, wait_for_landing=False) == "2026-02"
    with pytest.raises(ValueError, match=r"the triggering asset event's extra month"):
        tasks.month_to_process({"params": {}, **_run("asset_triggered", months=("2026-1",))}, wait_for_landing=False)

    manual = _run("manual", logical_date=datetime(2026, 7, 1, tzinfo=UTC))
    assert tasks.month_to_process({"params": {}, **manual}, wait_for_landing=False) == "2026-06"


def test_a_scheduled_month_that_has_not_landed_is_empty_unless_the_sensor_waits(state, caplog):
    scheduled = {"params": {}, **_run("scheduled", logical_date=datetime(2026, 11, 1, tzinfo=UTC))}
    with caplog.at_level(logging.INFO, logger="abpo.dags"):
        assert tasks.month_to_process(scheduled, wait_for_landing=False) == ""
    assert "resolve_month: scheduled run for 2026-10: " in caplog.text and "no landing partition yet" in caplog.text
    assert tasks.month_to_process(scheduled, wait_for_landing=True) == "2026-10"  # the sensor waits for it
    _land(state, "2026-10", marker=False)
    assert tasks.month_to_process(scheduled, wait_for_landing=False) == "2026-10"


def test_the_landing_sensor_is_done_when_the_partition_and_its_marker_are_there(state, caplog):
    assert tasks.landing_complete({"simulate": True}, "2026-03", "_SUCCESS") is True  # the simulator serves it
    assert tasks.landing_complete({}, "2026-03", "_SUCCESS") is False
    _land(state, "2026-03", marker=False)
    with caplog.at_level(logging.INFO, logger="abpo.dags"):
        assert tasks.landing_complete({}, "2026-03", "_SUCCESS") is False
    assert "landed 2026-03: " in caplog.text and "no _SUCCESS marker yet" in caplog.text
    assert tasks.landing_complete({}, "2026-03", "") is True  # no marker asked for: the files suffice
    (state / "landing" / "impressions" / "month=2026-03" / "_SUCCESS").write_text("")
    assert tasks.landing_complete({}, "2026-03", "_SUCCESS") is True


def test_an_arm_not_configured_and_a_month_without_feedback_skip_the_task(make_cfg):
    from airflow.sdk.exceptions import AirflowSkipException

    from abpo.monthly.common import NotEnoughFeedback

    cfg = make_cfg()
    cfg.arms.names = ["abpo"]
    tasks.skip_unless_configured(cfg, "abpo")
    with pytest.raises(AirflowSkipException, match=r"^arm grpo is not in arms.names \['abpo'\]$"):
        tasks.skip_unless_configured(cfg, "grpo")
    with pytest.raises(AirflowSkipException, match=r"^too few rows$") as info:
        with tasks.skipped_without_feedback():
            raise NotEnoughFeedback("too few rows")
    assert isinstance(info.value.__cause__, NotEnoughFeedback)
    with pytest.raises(KeyError), tasks.skipped_without_feedback():  # anything else is the step's own error
        raise KeyError("x")
    with tasks.skipped_without_feedback():
        pass


def test_the_failure_hook_gets_the_month_the_task_and_the_error(tmp_path, monkeypatch):
    """A plain callable (tests/dags/failure_hook.py) gets keywords; an Airflow notifier gets the context; a spec that
    does not import names ABPO_ON_FAILURE. The hook called by a real failed task: tests/dags/test_operations_e2e.py."""
    from airflow.sdk import BaseNotifier

    log = tmp_path / "failures.jsonl"
    monkeypatch.setenv("ABPO_TEST_FAILURE_LOG", str(log))
    monkeypatch.setenv("ABPO_ON_FAILURE", "failure_hook:record")
    error = ValueError("refused")
    tasks.on_failure({"params": {"month": "2026-04"}, "exception": error, "run_id": "manual__1"})
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert call == {
        "month": "2026-04",  # resolve_month did not run: the param
        "task": "",
        "error_type": "ValueError",
        "cause_type": "NoneType",
        "error": "refused",
        "run_id": "manual__1",
    }

    class Page(BaseNotifier):
        calls: list = []

        def notify(self, context):
            self.calls.append(context["run_id"])

    monkeypatch.setattr(tasks, "PAGE", Page(), raising=False)  # a notifier instance in an importable module
    monkeypatch.setenv("ABPO_ON_FAILURE", "abpo.monthly.airflow_tasks:PAGE")
    tasks.on_failure({"params": {}, "exception": error, "run_id": "manual__2", "ti": None})
    assert Page.calls == ["manual__2"]

    monkeypatch.setenv("ABPO_ON_FAILURE", "no_such_module:page")
    with pytest.raises(ValueError, match=r"ABPO_ON_FAILURE='no_such_module:page': cannot be imported"):
        tasks.on_failure({"params": {}})


def test_the_champion_event_names_the_namespaced_model_and_only_a_move_fires():
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from abpo.arms.names import model_name

    accessors = OutletEventAccessors()
    stay = {"moved": False, "champion_version": "1"}
    assert tasks.announce_champion(accessors, "abpo", "2026-01", stay, namespace="stg") is False
    moved = {"moved": True, "version": "4", "previous_version": "3"}  # a refit's result: version, not champion_
    assert tasks.announce_champion(accessors, "popularity", "2026-01", moved, namespace="stg") is True
    assert list(accessors[tasks.champion_alias("abpo")].asset_alias_events) == []
    (event,) = accessors[tasks.champion_alias("popularity")].asset_alias_events
    name = model_name("popularity", "stg")
    assert name != model_name("popularity", "")  # the namespace is in the model's name
    assert (event.dest_asset_key.name, event.dest_asset_key.uri) == (
        "abpo_champion_popularity",
        f"mlflow://models/{name}/champion",
    )
    assert event.extra == {
        "arm": "popularity",
        "version": "4",
        "previous_version": "3",
        "month": "2026-01",
        "model_uri": f"models:/{name}/4",
    }
    assert tasks.champion_asset("popularity", "stg").uri == f"mlflow://models/{name}/champion"


def test_bootstraps_outlets_are_the_aliases_of_every_arm_whose_champion_can_move():
    from abpo.arms.names import ARMS

    assert [a.name for a in tasks.movable_champions()] == [
        f"abpo_champion_{arm}_moves" for arm, e in ARMS.items() if e.kind in ("llm", "ranker")
    ]
    assert "abpo_champion_holdback_moves" not in {a.name for a in tasks.movable_champions()}


def test_importing_the_dags_modules_imports_no_airflow():
    """The tasks' preload (abpo.monthly.preload) imports every abpo module into the scheduler's forkserver, which must
    not import Airflow (it never did): the operators are built on first use, Airflow is imported inside the
    functions."""
    import subprocess
    import sys

    probe = (
        "import sys; import abpo.monthly.airflow_tasks, abpo.monthly.airflow_isolated, abpo.monthly.airflow_approval, "
        "abpo.monthly.dag_settings, abpo.monthly.local_airflow; print(sorted(m for m in sys.modules if "
        "m.split('.')[0] == 'airflow'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "[]", out.stdout[:2000]
    from abpo.monthly.airflow_approval import promotion_approval_operator
    from abpo.monthly.airflow_isolated import isolated_step_operator

    assert isolated_step_operator() is isolated_step_operator()  # one class, built once
    assert [c.__name__ for c in promotion_approval_operator().__mro__[:2]] == ["PromotionApproval", "HITLOperator"]
    assert [c.__name__ for c in isolated_step_operator().__mro__[:2]] == ["IsolatedStep", "ExternalPythonOperator"]
