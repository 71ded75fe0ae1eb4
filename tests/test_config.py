from pathlib import Path

import pytest

from abpo.config import Config, describe, load_config
from abpo.config.errors import ConfigError
from abpo.config.values import check_values


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
    [
        ("data.nope=1", "unknown key 'data.nope'"),
        ("nosection.x=1", "no section"),
        ("data.seed=abc", "rule: an integer"),
    ],
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


# ---- issue 32 item 12: every value is type- and range-checked when the config loads ----

# (override, the one line it must print: the key, the value and the rule broken)
REFUSED = [
    ("update.learning_rate=-1", "update.learning_rate -1.0: rule: > 0"),
    ("update.learning_rate=0", "update.learning_rate 0.0: rule: > 0"),
    ("update.learning_rate=.nan", "update.learning_rate nan: rule: a finite number"),
    ("update.learning_rate=.inf", "update.learning_rate inf: rule: a finite number"),
    ("update.learning_rate=-.inf", "update.learning_rate -inf: rule: a finite number"),
    ("sft.learning_rate=-1e-3", "sft.learning_rate -0.001: rule: > 0"),
    ("experiment.full_info_learning_rate=0", "experiment.full_info_learning_rate 0.0: rule: > 0"),
    ("update.group_size=0", "update.group_size 0: rule: >= 3"),
    ("update.group_size=2", "update.group_size 2: rule: >= 3"),
    ("policy.tau=0", "policy.tau 0.0: rule: >= 0.001"),
    ("policy.tau=-0.5", "policy.tau -0.5: rule: >= 0.001"),
    # subnormal but > 0: scores / tau overflowed and serving failed on a NaN softmax
    ("policy.tau=1e-320", "policy.tau 1e-320: rule: >= 0.001"),
    ("data.min_propensity=2", "data.min_propensity 2.0: rule: in (0, 1]"),
    ("data.min_propensity=0", "data.min_propensity 0.0: rule: in (0, 1]"),
    ("data.max_quarantine_fraction=1.5", "data.max_quarantine_fraction 1.5: rule: in [0, 1]"),
    ("sim.click_next=-0.1", "sim.click_next -0.1: rule: in [0, 1]"),
    ("sim.base_ctr=1", "sim.base_ctr 1.0: rule: in [0, 1)"),
    ("report.confidence=1", "report.confidence 1.0: rule: in (0, 1)"),
    ("arms.gate_alpha=0.5", "arms.gate_alpha 0.5: rule: in (0, 0.5)"),
    ("arms.gate_min_ess=-1", "arms.gate_min_ess -1.0: rule: >= 0"),
    ("update.batch_size=0", "update.batch_size 0: rule: >= 1"),
    ("update.max_steps=-2", "update.max_steps -2: rule: >= -1"),
    ("data.max_users=-1", "data.max_users -1: rule: >= 0"),
    ("update.top_p=0", "update.top_p 0.0: rule: in (0, 1]"),
    ("experiment.seeds=[0, -1]", "experiment.seeds[1] -1: rule: >= 0"),
    ("report.arm_shares={abpo: 1.5}", "report.arm_shares.abpo 1.5: rule: in [0, 1]"),
    ("sim.oracle_weights={knn: -1}", "sim.oracle_weights.knn -1.0: rule: >= 0"),
    # strict types: nothing is coerced
    ("update.learning_rate=true", "update.learning_rate True: rule: a finite number (not coerced)"),
    ("update.learning_rate='1e-4'", "update.learning_rate '1e-4': rule: a finite number (not coerced)"),
    ("update.group_size=2.5", "update.group_size 2.5: rule: an integer (not coerced)"),
    ("update.group_size=4.0", "update.group_size 4.0: rule: an integer (not coerced)"),
    ("update.group_size=true", "update.group_size True: rule: an integer (not coerced)"),
    ("update.bf16='yes'", "update.bf16 'yes': rule: true or false (YAML booleans only; not coerced)"),
    ("update.bf16=yes", "update.bf16 'yes': rule: true or false (YAML booleans only; not coerced)"),
    ("update.bf16=on", "update.bf16 'on': rule: true or false (YAML booleans only; not coerced)"),
    ("update.bf16=1", "update.bf16 1: rule: true or false (YAML booleans only; not coerced)"),
    ("data.format=3", "data.format 3: rule: a string (quote it)"),
    ("data.seed=abc", "data.seed 'abc': rule: an integer (not coerced)"),
    ("report.arm_shares=0.5", "report.arm_shares 0.5: rule: a mapping"),
    ("update.learning_rate=[1", "update.learning_rate '[1': rule: a YAML value"),
]


@pytest.mark.parametrize("override, says", REFUSED, ids=[o for o, _ in REFUSED])
def test_a_value_out_of_its_range_or_type_is_refused_by_load_config(override, says):
    with pytest.raises(ConfigError) as e:
        load_config("tiny", [override])
    assert str(e.value).startswith(f"--set: {says}") and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("override, says", REFUSED, ids=[o for o, _ in REFUSED])
def test_a_value_out_of_its_range_or_type_is_one_line_from_the_cli(override, says, capsys):
    from abpo.cli import main

    assert main(["config", "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"abpo config: --set: {says}") and err.count("\n") == 1 and "Traceback" not in err, err


def _yaml_line(key: str, value: str) -> str:
    section, leaf = key.split(".", 1)
    if "." in leaf:  # arms.popularity.temperature
        sub, leaf = leaf.split(".", 1)
        return f"{section}:\n  {sub}:\n    {leaf}: {value}\n"
    return f"{section}:\n  {leaf}: {value}\n"


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("update.learning_rate", "-1.0e-4", "update.learning_rate -0.0001: rule: > 0"),
        ("update.learning_rate", ".nan", "update.learning_rate nan: rule: a finite number"),
        ("update.learning_rate", "true", "update.learning_rate True: rule: a finite number (not coerced)"),
        ("update.group_size", "2.5", "update.group_size 2.5: rule: an integer (not coerced)"),
        ("update.group_size", "0", "update.group_size 0: rule: >= 3"),
        ("update.bf16", '"yes"', "update.bf16 'yes': rule: true or false"),
        ("update.bf16", "yes", "update.bf16 'yes': rule: true or false"),
        ("policy.tau", "0", "policy.tau 0.0: rule: >= 0.001"),
        ("data.min_propensity", "2", "data.min_propensity 2.0: rule: in (0, 1]"),
        ("arms.popularity.temperature", "0", "arms.popularity.temperature 0.0: rule: > 0"),
    ],
)
def test_a_yaml_value_out_of_its_range_or_type_names_the_file(tmp_path, capsys, key, value, says):
    from abpo.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(_yaml_line(key, value))
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert str(e.value).startswith(f"{bad}: {says}"), str(e.value)
    assert main(["config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: {says}" in err and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    "text, key, line, first",
    [
        ("update:\n  learning_rate: 1.0e-4\n  batch_size: 4\n  learning_rate: 1.0e-2\n", "learning_rate", 4, 2),
        ("update:\n  batch_size: 4\nname: x\nupdate:\n  batch_size: 8\n", "update", 4, 1),
        ("report:\n  arm_shares: {abpo: 0.5, abpo: 0.5}\n", "abpo", 2, 2),
    ],
)
def test_a_duplicate_yaml_key_is_refused_with_the_file_key_and_line(tmp_path, capsys, text, key, line, first):
    from abpo.cli import main

    dup = tmp_path / "dup.yaml"
    dup.write_text(text)
    says = f"{dup}: duplicate key {key!r} at line {line} (first at line {first}); rule: each key once per mapping"
    with pytest.raises(ConfigError) as e:
        load_config(dup)
    assert str(e.value) == says
    assert main(["config", "--config", str(dup)]) == 2
    assert capsys.readouterr().err == f"abpo config: {says}\n"


def test_a_yaml_file_that_does_not_parse_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("update:\n  learning_rate: [1\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: not valid YAML at line 3"):
        load_config(bad)


def test_yaml_1_2_numbers_and_booleans_load_as_such(tmp_path):
    """1e-5 is a float (PyYAML's YAML 1.1 read a string, which float() coerced); true/false are the booleans."""
    cfg = load_config(
        "tiny",
        [
            "update.learning_rate=1e-5",
            "sft.learning_rate=3E-4",
            "update.bf16=false",
            "update.use_vllm=True",
            "policy.constrained_rollouts=False",  # constrained rollouts run through HF generate, never vLLM
            "experiment.seeds=0,1,2",
            "arms.names=abpo,grpo",
        ],
    )
    assert cfg.update.learning_rate == 1e-5 and cfg.sft.learning_rate == 3e-4
    assert cfg.update.bf16 is False and cfg.update.use_vllm is True and cfg.policy.constrained_rollouts is False
    assert cfg.experiment.seeds == [0, 1, 2] and cfg.arms.names == ["abpo", "grpo"]
    good = tmp_path / "good.yaml"
    good.write_text("update:\n  learning_rate: 2e-5\n  group_size: 3\n  bf16: true\npolicy:\n  tau: 1\n")
    cfg = load_config(good)
    assert (cfg.update.learning_rate, cfg.update.group_size, cfg.update.bf16) == (2e-5, 3, True)
    assert cfg.policy.tau == 1.0 and isinstance(cfg.policy.tau, float)  # an integer is a number: taken as a float


def test_an_environment_value_is_taken_as_it_is(tmp_path, monkeypatch):
    """$ABPO_STATE etc. are paths and names, never read as YAML (a state directory called `true` stays a path)."""
    monkeypatch.setenv("ABPO_STATE", str(tmp_path / "true"))
    monkeypatch.setenv("ABPO_NAMESPACE", "2026")
    cfg = load_config("tiny")
    assert cfg.paths.root == str(tmp_path / "true") and cfg.paths.namespace == "2026"


@pytest.mark.parametrize(
    "preset", sorted(p.stem for p in (Path(__file__).parents[1] / "configs").glob("*.yaml") if p.stem != "regimes")
)  # regimes.yaml: regimes, not a preset
def test_every_preset_loads(preset):
    cfg = load_config(preset)
    check_values(cfg)


def test_every_default_satisfies_its_own_rule():
    check_values(Config())


def test_explain_shows_each_range(capsys):
    from abpo.cli import main

    assert main(["config", "--explain"]) == 0
    out = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "Allowed: > 0." in out["update.learning_rate"]
    assert "Allowed: >= 3." in out["update.group_size"]
    assert "Allowed: in (0, 1]." in out["data.min_propensity"]
    assert "Allowed: in [0, 1]." in out["report.arm_shares"]
    assert "Allowed" not in out["paths.root"]


@pytest.mark.parametrize("preset", ["tiny", "gpu", "smollm2"])
def test_a_dumped_config_loads_back_the_same(tmp_path, preset):
    """`abpo config` output and the multi-process update's config.yaml (abpo.monthly.update: yaml.safe_dump of
    to_dict) load back unchanged under the strict loader."""
    import yaml

    cfg = load_config(preset, ["update.learning_rate=1e-5", "sim.salt=yes"])
    f = tmp_path / "dumped.yaml"
    f.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    assert load_config(f).to_dict() == cfg.to_dict()


def test_comma_lists_keep_names_as_they_are_and_read_numbers():
    cfg = load_config("tiny", ["arms.names=abpo,off", "data.known_arms=abpo,off", "experiment.seeds=3,4"])
    assert cfg.arms.names == ["abpo", "off"] and cfg.experiment.seeds == [3, 4]
    with pytest.raises(ConfigError, match=r"^--set: experiment.seeds\[1\] 2.5: rule: an integer \(not coerced\)$"):
        load_config("tiny", ["experiment.seeds=3,2.5"])


def test_a_cross_section_combination_is_refused_at_load_in_one_line_naming_both_keys():
    """abpo.config.validate, run by load_config once the preset, the environment and the overrides are applied:
    experiment.rounds above the update positions per user (data.update_steps, or experiment.update_steps where set)
    is refused before any step runs (issue 45), in one line naming both keys and the rule."""
    from abpo.config import load_config
    from abpo.config.errors import ConfigError
    from abpo.config.validate import validate

    with pytest.raises(ConfigError) as e:
        load_config("tiny", ["experiment.update_steps=0", "data.update_steps=3", "experiment.rounds=4"])
    assert str(e.value) == (
        "experiment.rounds=4 > data.update_steps=3; rule: every round needs at least one update position per user"
    )
    with pytest.raises(
        ConfigError, match=r"^experiment\.rounds=5 > data\.update_steps=4 \(experiment\.update_steps=4 "
    ):
        load_config("tiny", ["experiment.update_steps=4", "data.update_steps=9", "experiment.rounds=5"])
    cfg = load_config("tiny", ["experiment.update_steps=0", "data.update_steps=3", "experiment.rounds=3"])  # the bound
    validate(cfg)
    assert "\n" not in str(e.value)
