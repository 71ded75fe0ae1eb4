"""Which MLflow store abpo uses: the user's MLFLOW_TRACKING_URI is honoured (read once at start-up, below
$ABPO_TRACKING_URI and --set, above the YAML and the default SQLite store under paths.root), printed with where it came
from, and never leaked back into the environment after abpo has pointed MLflow elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import abpo
from abpo import registry
from abpo.config import load_config


def _store_with_champion(db: Path) -> str:
    """A SQLite MLflow store holding model abpo-arm-abpo v1 with alias champion (written with a client of its own)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{db}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("abpo-arm-abpo")
    client.create_model_version("abpo-arm-abpo", source=(db.parent / "nowhere").as_uri(), tags={"source": "marker"})
    client.set_registered_model_alias("abpo-arm-abpo", "champion", "1")
    return uri


def _status(env_extra: dict[str, str], state: Path) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ABPO_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    }
    env.update({"ABPO_STATE": str(state), **env_extra})
    return subprocess.run(
        [str(Path(sys.executable).with_name("abpo")), "arms", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )  # a loaded CI box


def test_abpo_arms_status_uses_the_store_in_MLFLOW_TRACKING_URI(tmp_path):
    uri = _store_with_champion(tmp_path / "x.db")
    proc = _status({"MLFLOW_TRACKING_URI": uri}, tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"MLflow store {uri} (from $MLFLOW_TRACKING_URI)" in proc.stdout
    champion = next(
        line for line in proc.stdout.splitlines() if line.startswith("abpo-arm-abpo") and "champion" in line
    )
    assert '"version": "1"' in champion and '"source": "marker"' in champion
    assert not (tmp_path / "state" / "mlflow.db").exists()  # the default store was never created

    # $ABPO_TRACKING_URI wins over it; without either, the default SQLite store under the state directory
    other = f"sqlite:///{tmp_path / 'y.db'}"
    proc = _status({"MLFLOW_TRACKING_URI": uri, "ABPO_TRACKING_URI": other}, tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"MLflow store {other} (from $ABPO_TRACKING_URI)" in proc.stdout
    assert "abpo-arm-abpo          champion   none" in proc.stdout
    proc = _status({}, tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-3000:]
    default = f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}"
    assert f"MLflow store {default} (from the default: SQLite mlflow.db under paths.root)" in proc.stdout


def test_precedence_set_then_abpo_variable_then_mlflow_variable_then_yaml(tmp_path, monkeypatch):
    monkeypatch.setattr(abpo, "USER_MLFLOW_TRACKING_URI", "http://user-mlflow:5000")
    monkeypatch.delenv("ABPO_TRACKING_URI", raising=False)
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("paths:\n  mlflow_tracking_uri: http://from-yaml:5000\n")
    cfg = load_config(yaml_file)
    assert (cfg.paths.tracking_uri(), cfg.paths.tracking_uri_source()) == (
        "http://user-mlflow:5000",
        "$MLFLOW_TRACKING_URI",
    )
    monkeypatch.setenv("ABPO_TRACKING_URI", "http://abpo-mlflow:5000")
    cfg = load_config(yaml_file)
    assert (cfg.paths.tracking_uri(), cfg.paths.tracking_uri_source()) == (
        "http://abpo-mlflow:5000",
        "$ABPO_TRACKING_URI",
    )
    cfg = load_config(yaml_file, ["paths.mlflow_tracking_uri=http://cli:5000"])
    assert (cfg.paths.tracking_uri(), cfg.paths.tracking_uri_source()) == (
        "http://cli:5000",
        "--set paths.mlflow_tracking_uri",
    )
    monkeypatch.delenv("ABPO_TRACKING_URI")
    monkeypatch.setattr(abpo, "USER_MLFLOW_TRACKING_URI", "")
    cfg = load_config(yaml_file)
    assert (cfg.paths.tracking_uri(), cfg.paths.tracking_uri_source()) == (
        "http://from-yaml:5000",
        f"{yaml_file} paths.mlflow_tracking_uri",
    )
    # the store line never shows a password
    cfg = load_config("tiny", ["paths.mlflow_tracking_uri=http://abpo:hunter2@mlflow:5000"])
    assert registry.store_line(cfg) == (
        "MLflow store http://abpo:***@mlflow:5000 (from --set paths.mlflow_tracking_uri)"
    )


def test_configure_leaves_the_users_variable_as_it_was(tmp_path, monkeypatch):
    import mlflow

    mine = f"sqlite:///{tmp_path / 'mine.db'}"
    monkeypatch.setattr(abpo, "USER_MLFLOW_TRACKING_URI", "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        registry.configure(load_config("tiny", [f"paths.root={tmp_path / 'a'}"]))
        assert mlflow.get_tracking_uri() == f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}"
        assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ
        monkeypatch.setattr(abpo, "USER_MLFLOW_TRACKING_URI", mine)
        registry.configure(
            load_config(
                "tiny", [f"paths.root={tmp_path / 'b'}", f"paths.mlflow_tracking_uri=sqlite:///{tmp_path / 'b.db'}"]
            )
        )
        assert os.environ["MLFLOW_TRACKING_URI"] == mine  # the user's value, not the one set just now
    finally:
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        os.environ.pop("MLFLOW_REGISTRY_URI", None)
