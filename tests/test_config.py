import pytest

from abpo.config import Config, ConfigError, describe, load_config


def test_presets_load_and_differ():
    tiny, gpu = load_config("tiny"), load_config("gpu")
    assert tiny.name == "tiny" and gpu.name == "gpu"
    assert gpu.update.group_size == 16 and gpu.data.train_candidates == 200
    assert gpu.policy.lora_r == 8 and gpu.policy.lora_alpha == 16
    assert tiny.policy.model == "tiny"


def test_overrides_are_typed():
    cfg = load_config("tiny", ["data.train_candidates=50", "update.bf16=true", "policy.tau=0.5"])
    assert cfg.data.train_candidates == 50 and cfg.update.bf16 is True and cfg.policy.tau == 0.5


@pytest.mark.parametrize(
    "override, message",
    [("data.nope=1", "unknown key 'data.nope'"), ("nosection.x=1", "no section"), ("data.seed=abc", "expected int")],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", [override])


def test_unknown_yaml_key_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  train_candidate: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.data: unknown key\(s\) \['train_candidate'\]"):
        load_config(bad)


def test_every_knob_has_help():
    missing = [key for key, _, help_text in describe(Config) if not help_text and key not in ("name", "seed")]
    assert missing == []


def test_paths_resolve_relative_to_root(tmp_path):
    cfg = load_config("tiny", [f"paths.root={tmp_path}"])
    assert cfg.paths.resolve("warehouse") == tmp_path / "warehouse.duckdb"
    assert cfg.paths.tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_environment_overrides_yaml_and_set_overrides_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ABPO_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("ABPO_TRACKING_URI", "http://mlflow:5000")
    cfg = load_config("tiny")
    assert cfg.paths.resolve("root") == tmp_path / "state" and cfg.paths.tracking_uri() == "http://mlflow:5000"
    cfg = load_config("tiny", [f"paths.root={tmp_path / 'cli'}"])
    assert cfg.paths.resolve("root") == tmp_path / "cli"
