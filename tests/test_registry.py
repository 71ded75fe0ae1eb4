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
