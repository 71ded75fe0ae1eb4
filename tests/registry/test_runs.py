"""The registry's door for a run's record and for registered models' tags, on the real SQLite-backed store:
params / metrics / tags / artifacts into the active run, a run resumed, created and ended by id, runs found by tag,
a model's tags, and tracking configured once per process and store."""

import json

import pytest

from abpo import registry


def test_the_active_run_gets_params_metrics_tags_and_artifacts(make_cfg, tmp_path):
    cfg = make_cfg()
    note = tmp_path / "note.txt"
    note.write_text("hello")
    assert registry.active_run_id() is None
    with registry.start_run(cfg, "test-runs", "one") as run:
        assert registry.active_run_id() == run.info.run_id
        registry.log_param("a", 1)
        registry.log_params({"b": "x"})
        registry.log_metric("m", 0.5, step=3)
        registry.log_metrics({"n": 2.0}, step=4)
        registry.set_tag("t", "u")
        registry.set_tags({"v": "w"})
        registry.log_artifact(note, artifact_path="notes")
    got = registry.get_run(run.info.run_id)
    assert got.data.params == {"a": "1", "b": "x"}
    assert got.data.metrics == {"m": 0.5, "n": 2.0}
    assert got.data.tags["t"] == "u" and got.data.tags["v"] == "w"
    assert registry.active_run_id() is None
    dst = registry.download_artifacts(cfg, f"runs:/{run.info.run_id}/notes/note.txt", tmp_path / "dl")
    assert dst.read_text() == "hello"


def test_a_resumed_run_gets_more_and_a_step_history_is_logged_in_batches(make_cfg):
    from mlflow import MlflowClient

    cfg = make_cfg()
    with registry.start_run(cfg, "test-runs", "two") as run:
        pass
    with registry.resume_run(cfg, run.info.run_id):
        registry.log_metrics({"later": 1.0})
    history = [{"loss": 1.0 / i, "hr@1": 0.1 * i, "nan": float("nan")} for i in range(1, 8)]
    registry.log_step_metrics(run.info.run_id, history, batch=5)
    client = MlflowClient()
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == list(range(1, 8))
    assert len(client.get_metric_history(run.info.run_id, "hr_at_1")) == 7
    assert client.get_metric_history(run.info.run_id, "nan") == []
    assert registry.get_run(run.info.run_id).data.metrics["later"] == 1.0


def test_a_created_run_is_found_by_tag_and_ended_with_its_tags(make_cfg):
    cfg = make_cfg()
    exp = registry._ensure_experiment(cfg, "test-created")
    run_id = registry.create_run(cfg, exp, "entry", tags={"who": "me"}, params={"seq": "1"})
    assert registry.active_run_id() is None  # not made active
    client = registry.tracking_client(cfg)
    assert registry.experiment_id(client, registry.experiment_name(cfg, "test-created")) == exp
    assert registry.experiment_id(client, "no-such-experiment") is None
    [found] = registry.tagged_runs(client, exp, "who", "me")
    assert found.info.run_id == run_id and found.info.status == "RUNNING" and found.data.params == {"seq": "1"}
    assert registry.tagged_runs(client, exp, "who", "you") == []
    registry.terminate_run(run_id, "FAILED", tags={"why": "test"})
    got = registry.get_run(run_id)
    assert got.info.status == "FAILED" and got.data.tags["why"] == "test"
    # the active run is ended through MLflow's stack (nothing left active)
    with registry.start_run(cfg, "test-created", "active") as run:
        registry.terminate_run(run.info.run_id, "KILLED")
        assert registry.active_run_id() is None
    assert registry.get_run(run.info.run_id).info.status == "KILLED"


def test_the_latest_tagged_run_is_found_and_nothing_is_created_when_there_is_none(make_cfg):
    cfg = make_cfg()
    assert registry.latest_tagged_run_id(cfg, "test-latest", "abpo.month", "2026-01") is None
    with registry.start_run(cfg, "test-latest", "a", tags={"abpo.month": "2026-01"}):
        pass
    with registry.start_run(cfg, "test-latest", "b", tags={"abpo.month": "2026-01"}) as second:
        pass
    assert registry.latest_tagged_run_id(cfg, "test-latest", "abpo.month", "2026-01") == second.info.run_id
    assert registry.latest_tagged_run_id(cfg, "test-latest", "abpo.month", "2026-02") is None


def test_model_tags_versions_and_aliases_through_the_registry(make_cfg, tmp_path):
    cfg = make_cfg()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert registry.model_tags(cfg, "test-model") is None
    assert registry.find_version(cfg, "test-model", "champion") is None
    with registry.start_run(cfg, "test-models", "reg") as run:
        mv = registry.register(registry.log_model_dir(ckpt), alias=None, name="test-model")
    assert [v.version for v in registry.run_versions(cfg, "test-model", run.info.run_id)] == [mv.version]
    registry.set_alias(registry.CHAMPION, mv.version, name="test-model", cfg=cfg)
    assert registry.find_version(cfg, "test-model", "champion").version == mv.version
    assert registry.find_version(cfg, "test-model", str(mv.version)).version == mv.version
    assert registry.find_version(cfg, "test-model", "99") is None
    assert registry.get_version(registry.CHAMPION, name="test-model", cfg=cfg).version == mv.version
    registry.set_version_tags(cfg, "test-model", mv.version, {"gate.verdict": "promote", "n": 3})
    assert registry.model_version(cfg, "test-model", mv.version).tags == {"gate.verdict": "promote", "n": "3"}
    registry.set_model_tag(cfg, "test-model", "abpo.pinned", "1|me")
    assert registry.model_tags(cfg, "test-model") == {"abpo.pinned": "1|me"}
    registry.delete_model_tag(cfg, "test-model", "abpo.pinned")
    assert registry.model_tags(cfg, "test-model") == {}


def test_tracking_is_configured_once_per_store_and_again_for_another(make_cfg, tmp_path, monkeypatch):
    import mlflow

    from abpo.registry import store

    cfg = make_cfg()
    calls = []
    monkeypatch.setattr(store, "ensure_store", lambda uri: calls.append(uri))
    store._configured.clear()
    registry.configure(cfg)
    registry.configure(cfg)
    registry.find_version(cfg, "no-model", "champion")
    assert len(calls) == 1  # the repeats returned at once
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'other.db'}")  # someone pointed MLflow elsewhere
    registry.configure(cfg)
    assert len(calls) == 2 and mlflow.get_tracking_uri() == cfg.paths.tracking_uri()
    other = make_cfg(f"paths.root={tmp_path / 'other'}")
    registry.configure(other)
    assert len(calls) == 3


def test_is_mlflow_error_tells_mlflow_s_errors_from_others():
    from mlflow.exceptions import MlflowException

    assert registry.is_mlflow_error(MlflowException("x"))
    assert not registry.is_mlflow_error(RuntimeError("x"))


def test_a_registry_lock_is_held_touched_and_refused_to_a_second_holder(make_cfg):
    cfg = make_cfg()
    with registry.registry_lock(cfg, "test-lock", wait_s=5, ttl_s=5):
        registry.touch_lock(cfg, "test-lock")
        with pytest.raises(registry.LockHeld) as e:
            with registry.registry_lock(cfg, "test-lock", wait_s=0.3, ttl_s=5):
                pass
        assert e.value.owner.count(":") == 2  # host:pid:token
    with pytest.raises(registry.LockLost):
        registry.touch_lock(cfg, "test-lock")  # released
    assert registry.model_tags(cfg, "test-lock") is None  # the lock's registered model is gone
