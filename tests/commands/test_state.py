"""`abpo state relocate`: a state copied elsewhere is refused until relocated (abpo.registry.StateMoved), then its
MLflow store and airflow.cfg name the new directory only: versions download, new runs and registrations land under
it, and the old directory (deleted here) is never read or written. The full month on a copied state:
tests/arms/test_cycle.py."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from abpo import registry
from abpo.arms import promotion, versions as arm_versions
from abpo.config import load_config


def _checkpoint(path, marker):
    """A version's files as a download needs them (config.json and whole weights: Arm.missing_files)."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "marker": marker}))
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(path / "model.safetensors"))
    return path


def _register(cfg, tmp_path, marker):
    with registry.start_run(cfg, arm_versions.EXPERIMENT, f"r{marker}") as run:
        uri = registry.log_model_dir(_checkpoint(tmp_path / f"ckpt{marker}", marker))
    return promotion.register_champion(cfg, "abpo", uri, run.info.run_id, {"marker": str(marker)})


def _texts(db):
    with sqlite3.connect(db) as con:
        out = []
        for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for row in con.execute(f'SELECT * FROM "{t}"').fetchall():
                out += [v for v in row if isinstance(v, str)]
    return out


def test_a_copied_state_is_refused_until_relocated_then_uses_only_its_new_directory(tmp_path):
    from abpo.cli import main

    old, new = tmp_path / "old" / "var", tmp_path / "new" / "var"
    cfg_old = load_config("tiny", [f"paths.root={old}"])
    _register(cfg_old, tmp_path, 1)
    (old / "airflow").mkdir()
    (old / "airflow" / "airflow.cfg").write_text(
        f"[core]\ndags_folder = /opt/dags\n[logging]\nbase_log_folder = {old}/airflow/logs\n"
        f"[database]\nsql_alchemy_conn = sqlite:///{old}/airflow/airflow.db\n"
    )
    assert sum(str(old) in v for v in _texts(old / "mlflow.db")) >= 4  # experiment, run, version, logged model
    shutil.copytree(old, new)
    shutil.rmtree(tmp_path / "old")  # nothing may be read or written there any more

    cfg = load_config("tiny", [f"paths.root={new}"])
    assert registry.moved_from(cfg) == str(old)
    with pytest.raises(registry.StateMoved, match=f"abpo state relocate --from {old}"):
        arm_versions.get_version(cfg, "abpo", registry.CHAMPION)
    assert main(["state", "relocate", "--set", f"paths.root={new}", "--dry-run"]) == 0
    assert sum(str(old) in v for v in _texts(new / "mlflow.db")) >= 4  # a dry run writes nothing
    assert main(["state", "relocate", "--set", f"paths.root={new}"]) == 0
    assert not [v for v in _texts(new / "mlflow.db") if str(old) in v]
    assert str(old) not in (new / "airflow" / "airflow.cfg").read_text()
    assert f"sqlite:///{new}/airflow/airflow.db" in (new / "airflow" / "airflow.cfg").read_text()
    assert "dags_folder = /opt/dags" in (new / "airflow" / "airflow.cfg").read_text()  # outside the state: kept
    assert registry.moved_from(cfg) is None

    # the relocated state works: its champion downloads from the new directory, a new version registers there
    assert json.loads((arm_versions.local_dir(cfg, "abpo", 1) / "config.json").read_text())["marker"] == 1
    mv = _register(cfg, tmp_path, 2)
    assert str(arm_versions.get_version(cfg, "abpo", registry.CHAMPION).version) == str(mv.version) == "2"
    assert mv.source.startswith("models:/") or str(new) in mv.source
    assert not (tmp_path / "old").exists()
    assert not [v for v in _texts(new / "mlflow.db") if str(old) in v]
