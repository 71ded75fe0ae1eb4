"""The MLflow registry round trip on the real SQLite-backed store: log a checkpoint directory,
register it, move aliases, download it back."""

import json

from abpo import registry
from abpo.config import load_config


def _checkpoint(path, marker):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "marker": marker}))
    (path / "weights.bin").write_bytes(bytes([marker]) * 16)
    return path


def test_register_alias_and_download(tmp_path):
    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    versions = []
    for marker in (1, 2):
        ckpt = _checkpoint(tmp_path / f"ckpt{marker}", marker)
        with registry.start_run(cfg, "test-registry", f"run{marker}", tags={"month": "2026-02"}) as run:
            uri = registry.log_model_dir(ckpt)
            mv = registry.register(uri, tags={"run_id": run.info.run_id})
        versions.append(int(mv.version))
    assert versions == [1, 2]
    # challenger follows the newest registration; champion moves only when told
    assert int(registry.get_version(registry.CHALLENGER).version) == 2
    assert registry.get_version(registry.CHAMPION) is None
    registry.set_alias(registry.CHAMPION, 1)
    assert int(registry.get_version(registry.CHAMPION).version) == 1
    local = registry.download_model_dir(cfg, registry.CHAMPION, tmp_path / "dl")
    assert json.loads((local / "config.json").read_text())["marker"] == 1
    assert (local / "weights.bin").read_bytes() == bytes([1]) * 16
    assert (tmp_path / "var" / "mlflow.db").exists()


def test_pi_init_becomes_champion_only_when_none_exists(tmp_path):
    from abpo.policy.sft import PI_INIT_ALIAS, register_pi_init

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    registry.configure(cfg)
    uris = []
    for marker in (1, 2):
        with registry.start_run(cfg, "test-registry", f"sft{marker}"):
            uris.append(registry.log_model_dir(_checkpoint(tmp_path / f"p{marker}", marker)))
    mv1, first1 = register_pi_init(cfg, uris[0], {"role": "pi_init"})
    mv2, first2 = register_pi_init(cfg, uris[1], {"role": "pi_init"})  # a retrained pi_init
    assert (first1, first2) == (True, False)
    assert int(registry.get_version(registry.CHAMPION).version) == int(mv1.version)  # not displaced
    assert int(registry.get_version(PI_INIT_ALIAS).version) == int(mv2.version)


def test_an_unreachable_registry_raises_instead_of_reading_as_no_alias(tmp_path, monkeypatch):
    import socket

    import mlflow
    import pytest

    from abpo.arms import versions as arm_versions

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}", f"paths.mlflow_tracking_uri={uri}"])
    try:
        registry.configure(cfg)
        with pytest.raises(registry.RegistryUnavailable, match=f"127.0.0.1:{port}"):
            registry.get_version(registry.CHAMPION)
        with pytest.raises(registry.RegistryUnavailable, match="abpo-arm-abpo"):
            arm_versions.get_version(cfg, "abpo", "champion")
    finally:
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)


def test_a_task_attempt_that_never_completed_is_marked_killed_and_the_completed_one_found(tmp_path):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    assert registry.completed_task_run(cfg, "tasks", "update:abpo:2026-01") is None  # nothing yet
    client = MlflowClient()
    exp = client.get_experiment_by_name("tasks").experiment_id
    killed = client.create_run(exp, tags={registry.TASK_KEY_TAG: "update:abpo:2026-01"})  # a process killed mid-run
    assert registry.completed_task_run(cfg, "tasks", "update:abpo:2026-01") is None
    assert client.get_run(killed.info.run_id).info.status == "KILLED"
    with registry.start_run(cfg, "tasks", "update", tags={registry.TASK_KEY_TAG: "update:abpo:2026-01"}) as run:
        pass
    unrecorded = run.info.run_id  # FINISHED, but killed before it recorded its result: not completed
    with registry.start_run(cfg, "tasks", "update", tags={registry.TASK_KEY_TAG: "update:abpo:2026-01"}) as run:
        pass
    registry.record_task_result(run.info.run_id, {"version": "3"})
    found = registry.completed_task_run(cfg, "tasks", "update:abpo:2026-01")
    assert found.info.run_id == run.info.run_id and registry.task_result(found) == {"version": "3"}
    assert client.get_run(unrecorded).info.status == "KILLED"
    assert registry.completed_task_run(cfg, "tasks", "update:abpo:2026-02") is None  # keys do not mix


def test_processes_creating_one_new_sqlite_store_together_all_get_a_working_store(tmp_path):
    """MLflow migrates a new SQLite store on first use, and two processes migrating the same new file at once leave
    it broken for good (`table _alembic_tmp_model_versions already exists`: an Airflow task and a reader of the store
    starting together). registry.ensure_store serialises the creation under a lock file: four processes released at
    the same instant all succeed and the store then opens."""
    import subprocess
    import sys
    import time

    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}"
    go = tmp_path / "go"
    child = (
        "import sys, time, pathlib\n"
        "from abpo.registry import ensure_store\n"
        "import mlflow  # imported before the start, so the processes race on the migration, not on imports\n"
        "go = pathlib.Path(sys.argv[2])\n"
        "while not go.exists(): time.sleep(0.01)\n"
        "ensure_store(sys.argv[1])\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", child, uri, str(go)], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    time.sleep(8)  # every child has imported mlflow and waits
    go.touch()
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert client.search_experiments() and client.search_registered_models() == []
    assert (tmp_path / "state" / "mlflow.db.init.lock").exists()


def test_registering_prints_nothing_on_stderr_and_links_the_run(tmp_path, capfd):
    """An Airflow task logs its stderr at ERROR level: mlflow.register_model printed "Registered model ... already
    exists. Creating a new version ..." and "Created version ..." there. registry.register prints nothing, and the
    version is what register_model made: its source the logged model's URI, its run the run that logged it."""
    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}"])
    for marker in (1, 2):  # the second: the model exists already
        ckpt = _checkpoint(tmp_path / f"ckpt{marker}", marker)
        with registry.start_run(cfg, "test-registry", f"run{marker}") as run:
            uri = registry.log_model_dir(ckpt)
            capfd.readouterr()
            mv = registry.register(uri, name="abpo-quiet")
            out, err = capfd.readouterr()
        assert (out, err) == ("", ""), (out, err)
        assert int(mv.version) == marker and mv.run_id == run.info.run_id
        assert mv.source == uri and mv.status == "READY"
