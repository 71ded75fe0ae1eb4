"""abpo.config.extends: a config file that says only what differs (``extends: <preset or file>``), merged with its
parents before anything is checked; `abpo config --explain` names where each value came from; every preset in
configs/ loads and keeps only what differs from its parent or the defaults."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from abpo.config import Config, explain, load_config, sources
from abpo.config.errors import ConfigError
from abpo.config.extends import merge, shown
from abpo.config.values import build
from abpo.paths import CONFIG_DIR
from abpo.yamlfile import config_chain

PRESETS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "regimes")  # regimes.yaml: not a preset


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch):
    for var in ("ABPO_STATE", "ABPO_TRACKING_URI", "ABPO_NAMESPACE"):
        monkeypatch.delenv(var, raising=False)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_a_child_merges_over_its_parent_section_by_section(tmp_path):
    write(
        tmp_path,
        "base.yaml",
        "name: base\nupdate:\n  learning_rate: 3.0e-4\n  group_size: 6\n"
        "arms:\n  popularity:\n    temperature: 2.0\n    window: 3\n"
        "report:\n  arm_shares: {abpo: 0.5, grpo: 0.5}\n",
    )
    child = write(
        tmp_path,
        "child.yaml",
        "extends: base.yaml\nname: child\nupdate:\n  group_size: 8\n"
        "arms:\n  popularity:\n    window: 5\nreport:\n  arm_shares: {abpo: 1.0}\n",
    )
    cfg = load_config(child)
    assert cfg.name == "child"
    assert (cfg.update.learning_rate, cfg.update.group_size) == (3.0e-4, 8)  # the parent's, then the child's
    assert (cfg.arms.popularity.temperature, cfg.arms.popularity.window) == (2.0, 5)  # a block merges key by key
    assert cfg.report.arm_shares == {"abpo": 1.0}  # a mapping value is the child's whole, not merged item by item
    assert cfg.update.beta == Config().update.beta  # what neither says: the default


def test_a_chain_of_files_and_a_preset_by_name(tmp_path):
    write(tmp_path, "a.yaml", "extends: demo\nsim:\n  requests_per_user: 6\n")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "b.yaml", "extends: ../a.yaml\nname: b\nupdate:\n  save_steps: 50\n")
    cfg = load_config(tmp_path / "sub" / "b.yaml")
    demo = load_config("demo")
    assert (cfg.name, cfg.sim.requests_per_user, cfg.update.save_steps) == ("b", 6, 50)
    assert cfg.arms.names == demo.arms.names and cfg.policy.tau == demo.policy.tau  # demo's, through a.yaml
    assert [p.name for p, _ in config_chain(tmp_path / "sub" / "b.yaml", CONFIG_DIR)][-3:] == [
        "demo.yaml",
        "a.yaml",
        "b.yaml",
    ]


@pytest.mark.parametrize(
    "files, start",
    [
        ({"a.yaml": "extends: a.yaml\n"}, "a.yaml"),
        ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: c.yaml\n", "c.yaml": "extends: a.yaml\n"}, "a.yaml"),
    ],
)
def test_a_cycle_is_refused_naming_the_file_and_the_rule(tmp_path, files, start):
    for name, text in files.items():
        write(tmp_path, name, text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / start)
    message = str(e.value)
    assert "makes a cycle" in message and "rule: a config may not extend itself" in message
    last = list(files)[-1]
    assert message.startswith(f"{tmp_path / last}: extends 'a.yaml'")  # the file whose extends closes the loop


def test_a_missing_parent_is_refused_naming_the_file_and_the_rule(tmp_path):
    child = write(tmp_path, "child.yaml", "extends: no_such_preset\n")
    with pytest.raises(ConfigError) as e:
        load_config(child)
    message = str(e.value)
    assert message.startswith(f"{child}: extends 'no_such_preset': no such file {CONFIG_DIR / 'no_such_preset.yaml'}")
    assert "rule: extends names a preset" in message and "'demo'" in message  # the presets it could have named
    write(tmp_path, "other.yaml", "extends: base.yaml\n")
    with pytest.raises(ConfigError, match=r"other.yaml: extends 'base.yaml': no such file .*base.yaml; rule:"):
        load_config(tmp_path / "other.yaml")
    write(tmp_path, "empty.yaml", "extends: ''\n")
    with pytest.raises(ConfigError, match=r"empty.yaml: extends '': rule: extends names a preset"):
        load_config(tmp_path / "empty.yaml")


def test_the_rules_between_keys_are_checked_after_the_merge(tmp_path):
    # the parent alone breaks a rule (an arm the warehouse does not accept); the child completes it
    write(tmp_path, "base.yaml", "arms:\n  names: [abpo, holdback]\n")
    with pytest.raises(ConfigError, match="holdback"):
        load_config(tmp_path / "base.yaml")
    fixed = write(tmp_path, "fixed.yaml", "extends: base.yaml\ndata:\n  known_arms: [abpo, holdback]\n")
    assert load_config(fixed).arms.names == ["abpo", "holdback"]
    # and a child can break a rule with a key of its parent's: refused on the whole config
    broken = write(tmp_path, "broken.yaml", "extends: fixed.yaml\nreport:\n  candidate_arm: grpo\n")
    with pytest.raises(ConfigError, match="report.candidate_arm"):
        load_config(broken)


def test_a_parents_mistake_names_the_parent(tmp_path):
    write(tmp_path, "base.yaml", "update:\n  group_size: 1\n")
    child = write(tmp_path, "child.yaml", "extends: base.yaml\nname: child\n")
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'base.yaml'}: update.group_size 1: rule: >= 3"):
        load_config(child)
    write(tmp_path, "typo.yaml", "update:\n  group_sise: 4\n")
    with pytest.raises(ConfigError, match=r"typo.yaml.update: unknown key\(s\) \['group_sise'\]"):
        load_config(write(tmp_path, "child2.yaml", "extends: typo.yaml\n"))


def test_sources_name_the_default_the_file_the_environment_and_set(tmp_path, monkeypatch):
    base = write(tmp_path, "base.yaml", "extends: tiny\nupdate:\n  learning_rate: 3.0e-4\n  group_size: 6\n")
    child = write(tmp_path, "child.yaml", "extends: base.yaml\nname: child\nupdate:\n  group_size: 8\n")
    monkeypatch.setenv("ABPO_STATE", str(tmp_path / "state"))
    cfg = load_config(child, ["update.beta=0.1", "arms.popularity.window=4"])
    given = sources(cfg)
    assert given["name"] == given["update.group_size"] == str(child)
    assert given["update.learning_rate"] == str(base)
    assert given["policy.tiny_hidden_size"] == "configs/tiny.yaml"  # a preset, wherever abpo is installed
    assert given["paths.root"] == "$ABPO_STATE"
    assert given["update.beta"] == given["arms.popularity.window"] == "--set"
    rows = {key: (value, source, default) for key, value, source, default, _ in explain(cfg)}
    assert rows["update.group_size"] == (8, str(child), Config().update.group_size)
    assert rows["update.max_steps"][1] == "default"
    assert set(rows) == set(given) | {k for k, (_, s, _) in rows.items() if s == "default"}


def test_config_explain_prints_every_value_and_where_it_came_from(tmp_path, capsys):
    from abpo.cli import main

    child = write(tmp_path, "child.yaml", "extends: demo\nname: child\nsim:\n  window: 1\n")
    assert main(["config", "--config", str(child), "--set", "update.beta=0.1", "--explain"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert set(lines) == {key for key, *_ in explain(Config())}
    assert f"'child'  {child}" in lines["name"] and "(default 'tiny')" in lines["name"]
    assert f"1  {child}" in lines["sim.window"] and "(default 2)" in lines["sim.window"]
    assert "configs/demo.yaml" in lines["sim.requests_per_user"]
    assert "configs/tiny.yaml" in lines["policy.tiny_hidden_size"]  # demo extends tiny
    assert "0.1  --set" in lines["update.beta"]
    assert lines["update.max_steps"].split()[2] == "default" and "(default" not in lines["update.max_steps"]
    assert "Allowed: >= 3." in lines["update.group_size"]  # the help text and its rule stay


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_loads_and_extends_only_presets(preset):
    cfg = load_config(preset)
    assert cfg.name == preset
    chain = config_chain(CONFIG_DIR / f"{preset}.yaml", CONFIG_DIR)
    assert all(p.parent.resolve() == CONFIG_DIR.resolve() for p, _ in chain)  # a preset never leaves configs/
    assert {s for s in sources(cfg).values()} <= {shown(p) for p, _ in chain}


def _leaves(cls, values: dict, prefix: str = "") -> list[str]:
    """The dotted keys a file sets: a section's keys, each other value (a list, a mapping such as arm_shares) one."""
    hints = typing.get_type_hints(cls)
    keys = []
    for k, v in values.items():
        if dataclasses.is_dataclass(hints[k]):
            keys += _leaves(hints[k], v, f"{prefix}{k}.")
        else:
            keys.append(f"{prefix}{k}")
    return keys


def _value(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_says_only_what_differs_from_its_parent_or_the_defaults(preset):
    *parents, (path, own) = config_chain(CONFIG_DIR / f"{preset}.yaml", CONFIG_DIR)
    inherited: dict = {}
    for file, values in parents:
        merge(Config, inherited, values, str(file), {})
    before, mine = build(Config, inherited, "parents"), build(Config, own, str(path))
    same = [k for k in _leaves(Config, own) if k != "name" and _value(mine, k) == _value(before, k)]
    assert not same, f"{path}: these keys restate their parent's value or the default: {same}"
