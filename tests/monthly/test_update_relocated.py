"""A state moved in the middle of a month (its update completed and registered as the challenger, the process killed
before the month went on), copied with `cp -a` and relocated, runs the month's update again: it finds the challenger
it registered instead of training and registering a second version of the same month. Before, the task keys hashed
the absolute paths.root, so the relocated state's keys found nothing and a second version (v3 beside v2) was trained
from the same champion on the same rows. A damaged task record (the update's run lost its result) is found the same
way. Real DuckDB, Great Expectations and MLflow; the training itself is replaced by a hook that counts its calls (a
registered checkpoint directory is the model: the update's own training is tested in tests/train)."""

from __future__ import annotations

import json
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from abpo.config import load_config

MONTH = "2026-01"
SETTINGS = ["arms.update_logs=own", "arms.min_rows_per_stratum=1"]


def _checkpoint(path):
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(path / "model.safetensors"))
    return path


@pytest.fixture
def trained(monkeypatch, tmp_path):
    """The arm's refresh replaced by a run in the update's experiment that logs nothing but what the step expects:
    ``trained.calls`` counts the trainings."""
    from abpo import registry
    from abpo.arms.llm import LLMArm

    calls = []

    def refresh(cls, name, cfg, *, month, parent_dir, months, strata, run_tags):
        calls.append(str(cfg.paths.resolve("root")))
        with registry.start_run(cfg, cfg.update.mlflow_experiment, f"update-{name}-{month}", tags=run_tags) as run:
            pass
        model = _checkpoint(tmp_path / f"trained-{len(calls)}")
        return SimpleNamespace(mlflow_run_id=run.info.run_id, model_dir=model, global_step=2, variant=name)

    monkeypatch.setattr(LLMArm, "refresh", classmethod(refresh))
    return SimpleNamespace(calls=calls)


def _month_with_an_update(root, tmp_path):
    """A state at ``root`` with month 2026-01 ingested, arm abpo's champion v1 and its update registered as v2."""
    from abpo import registry
    from abpo.arms import promotion, versions as arm_versions
    from abpo.data.schemas import write_impressions
    from abpo.data.synthetic import synthetic_impressions
    from abpo.monthly.common import record_month_start
    from abpo.monthly.register import register
    from abpo.monthly.update import update
    from abpo.warehouse import config_catalog, ingest_with_config

    cfg = load_config("tiny", [f"paths.root={root}", *SETTINGS])
    catalog = config_catalog(cfg)
    table, _ = synthetic_impressions(
        300, MONTH, seed=3, arms=("abpo",), n_users=80, item_ids=catalog, n_items=min(5_000, len(catalog))
    )
    write_impressions(table, cfg.paths.resolve("landing"), MONTH, part="sim")
    landed, _ = ingest_with_config(cfg, MONTH)
    assert landed.rows_clean > 0
    with registry.start_run(cfg, arm_versions.EXPERIMENT, "pi_init") as run:
        uri = registry.log_model_dir(_checkpoint(tmp_path / "pi_init"))
    champion = promotion.register_champion(cfg, "abpo", uri, run.info.run_id, {"source": "pi_init", "months": ""})
    record_month_start(cfg, "abpo", MONTH, str(champion.version))
    updated = update(cfg, "abpo", MONTH)
    registered = register(cfg, "abpo", updated)
    assert registered.version == "2" and registered.parent_version == str(champion.version)
    return cfg, updated


def _versions(cfg) -> list[int]:
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.arms import versions as arm_versions

    registry.configure(cfg)
    return sorted(
        int(v.version) for v in MlflowClient().search_model_versions(f"name='{arm_versions.model_name('abpo')}'")
    )


def test_a_relocated_state_finds_the_update_it_registered_and_trains_nothing(tmp_path, monkeypatch, trained):
    from abpo import registry
    from abpo.monthly.register import register
    from abpo.monthly.update import update

    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    monkeypatch.delenv("ABPO_STATE", raising=False)
    old, new = tmp_path / "old" / "var", tmp_path / "new" / "var"
    cfg, first = _month_with_an_update(old, tmp_path)
    assert len(trained.calls) == 1 and _versions(cfg) == [1, 2]

    # the kill at register: v2 exists, the month did not go on; the state is copied as an operator would, relocated
    new.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(old), str(new)], check=True)
    moved = load_config("tiny", [f"paths.root={new}", *SETTINGS])
    registry.relocate_state(moved, old)
    shutil.rmtree(tmp_path / "old")

    again = update(moved, "abpo", MONTH)
    assert len(trained.calls) == 1, "the relocated state trained the month's update again"
    assert again.run_id == first.run_id and again.model_uri == first.model_uri
    assert register(moved, "abpo", again).version == "2" and _versions(moved) == [1, 2]
    assert not (tmp_path / "old").exists()  # nothing written under the old directory


def test_an_update_whose_task_record_is_damaged_is_found_by_its_registered_version(tmp_path, monkeypatch, trained):
    from mlflow import MlflowClient

    from abpo import registry
    from abpo.monthly.register import register
    from abpo.monthly.update import update

    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    monkeypatch.delenv("ABPO_STATE", raising=False)
    cfg, first = _month_with_an_update(tmp_path / "var", tmp_path)
    # the run's record damaged: its done mark gone and its result file truncated
    client = MlflowClient()
    client.delete_tag(first.run_id, registry.TASK_DONE_TAG)
    artifacts = client.get_run(first.run_id).info.artifact_uri.removeprefix("file://")
    (__import__("pathlib").Path(artifacts) / registry.TASK_RESULT_ARTIFACT).write_text('{"arm": "ab')

    again = update(cfg, "abpo", MONTH)
    assert len(trained.calls) == 1, "a damaged task record trained the month's update again"
    assert again.run_id == first.run_id and again.model_uri == first.model_uri
    assert (again.parent_version, again.data_hash, again.months, again.rows) == (
        first.parent_version,
        first.data_hash,
        first.months,
        first.rows,
    )
    assert register(cfg, "abpo", again).version == "2" and _versions(cfg) == [1, 2]
    # the run is the task's completed run again: found by its key from now on, FINISHED, not marked superseded
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[registry.TASK_DONE_TAG] == "true"
    assert "abpo.superseded" not in run.data.tags
    assert update(cfg, "abpo", MONTH).run_id == first.run_id and len(trained.calls) == 1


def test_task_keys_do_not_hash_where_the_state_is(tmp_path):
    """The cheap half: the same config at two state directories (a relocated copy), with its paths under the root
    written relative or absolute, and its own SQLite store named or left to the default, hashes as one; another
    setting does not."""
    from abpo.arms.versions import config_hash

    a = load_config("tiny", [f"paths.root={tmp_path}/a/var"])
    b = load_config("tiny", [f"paths.root={tmp_path}/b/var"])
    spelled = load_config(
        "tiny",
        [
            f"paths.root={tmp_path}/b/var",
            f"paths.models={tmp_path}/b/var/models",
            f"paths.mlflow_tracking_uri=sqlite:///{tmp_path}/b/var/mlflow.db",
        ],
    )
    assert config_hash(a) == config_hash(b) == config_hash(spelled)
    assert config_hash(load_config("tiny", [f"paths.root={tmp_path}/b/var", f"paths.models={tmp_path}/m"])) != (
        config_hash(b)
    )
    assert config_hash(load_config("tiny", [f"paths.root={tmp_path}/b/var", "update.max_steps=3"])) != config_hash(b)
