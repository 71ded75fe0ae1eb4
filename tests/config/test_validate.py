"""abpo.config.validate: every rule between config keys is checked once, by load_config, after the preset, the
environment and the overrides: a combination that cannot run is refused at load (issue 45 point 3), in one line
naming each key involved and the rule; a value outside a key's choices (sim.candidates, sim.oracle, ...) is
refused there too."""

from __future__ import annotations

from pathlib import Path

import pytest

from abpo.config import load_config
from abpo.config.arms import UPDATE_LOGS
from abpo.config.errors import ConfigError
from abpo.config.policy import DTYPES, LOSS_TOKENS, PROMPT_STYLES
from abpo.config.sim import CANDIDATE_SOURCES, ORACLE_COMPONENTS, ORACLES
from abpo.config.update import LOSS_TYPES, NO_RESPONSE_WEIGHT_RULES, RATIO_LEVELS
from abpo.config.validate import validate
from abpo.data.batching import STRATIFICATIONS
from abpo.data.holdout import GATE_USERS
from abpo.data.loaders import FORMATS

PRESETS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml") if p.stem != "regimes"
)


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        load_config("tiny", overrides)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_keeps_every_rule(preset):
    validate(load_config(preset))


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (
            ["experiment.update_steps=0", "data.update_steps=3", "experiment.rounds=4"],
            ["experiment.rounds", "data.update_steps"],
        ),
        (["experiment.update_steps=2", "experiment.rounds=3"], ["experiment.rounds", "experiment.update_steps"]),
        (["arms.names=abpo,grpo,holdback"], ["arms.names", "data.known_arms", "'holdback'"]),
        (["arms.update_max_examples_by_arm={grpo_cr: 64}"], ["arms.update_max_examples_by_arm", "arms.names"]),
        (["arms.update_max_examples_by_arm={abpo: -1}"], ["arms.update_max_examples_by_arm", ">= 0"]),
        # an arm's update budget (issue 60): a served arm, budget keys only, each value as the update key's rule
        (["arms.update_by_arm={grpo_cr: {epochs: 2}}"], ["arms.update_by_arm", "arms.names"]),
        (["arms.update_by_arm={abpo: {beta: 0.1}}"], ["arms.update_by_arm.abpo", "'beta'", "learning_rate"]),
        (["arms.update_by_arm={abpo: {learning_rate: 0}}"], ["arms.update_by_arm.abpo.learning_rate", "> 0"]),
        (["arms.update_by_arm={abpo: {epochs: many}}"], ["arms.update_by_arm.abpo.epochs", "'many'"]),
        (["arms.update_by_arm={abpo: 3}"], ["arms.update_by_arm.abpo", "a mapping"]),
        (["data.update_steps=3", "sim.window=4", "experiment.update_steps=0"], ["data.update_steps", "sim.window"]),
        (
            ["sim.candidates=offline", "sim.requests_per_user=3"],
            ["sim.requests_per_user", "sim.candidates", "sim.window"],
        ),
        (
            ["sim.retrieval_fraction=0.6", "sim.popular_fraction=0.5"],
            ["sim.retrieval_fraction", "sim.popular_fraction"],
        ),
        (["sim.oracle_weights={knn: 1, bert: 1}"], ["sim.oracle_weights.bert", "sim.oracle"]),
        (["sim.oracle_weights={knn: 0, als: 0}"], ["sim.oracle_weights", "sim.oracle"]),
        (["policy.tiny_hidden_size=30", "policy.tiny_heads=4"], ["policy.tiny_hidden_size", "policy.tiny_heads"]),
        (
            ["policy.constrained_rollouts=true", "update.use_vllm=true"],
            ["policy.constrained_rollouts", "update.use_vllm"],
        ),
        (["update.batch_size=6", "update.processes=4"], ["update.batch_size", "update.processes"]),
        # the report's arms name served arms (issue 59 point 9: raw HTML reached report.md through them)
        (["report.candidate_arm=<b>x</b>"], ["report.candidate_arm", "'<b>x</b>'", "arms.names"]),
        (["report.candidate_arm=grpo_cr"], ["report.candidate_arm", "arms.names"]),
        (["report.holdback_arm=<script>x</script>"], ["report.holdback_arm", "arms.names", "'holdback'"]),
        (["report.holdback_arm=holdbak"], ["report.holdback_arm", "'holdbak'", "arms.names"]),
    ],
)
def test_a_bad_combination_is_refused_at_load_in_one_line_naming_its_keys(overrides, keys):
    msg = refusal(overrides)
    assert all(k in msg for k in keys) and "rule:" in msg, msg


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiment.update_steps=0", "data.update_steps=3", "experiment.rounds=3"],  # each bound itself is allowed
        ["data.update_steps=4", "sim.window=4", "experiment.update_steps=0"],
        ["arms.names=abpo,holdback", "data.known_arms=abpo,grpo,holdback"],
        ["arms.update_max_examples_by_arm={abpo: 0}"],
        ["arms.update_by_arm={abpo: {learning_rate: 1e-3, epochs: 3, lr_scheduler_type: constant}}"],
        ["sim.candidates=offline", "sim.requests_per_user=2", "sim.window=2"],
        ["sim.retrieval_fraction=0.5", "sim.popular_fraction=0.5"],
        ["sim.oracle=knn", "sim.oracle_weights={knn: 0, bert: 0}"],  # the weights are the mixture's only
        ["policy.model=smollm2-135m", "policy.tiny_hidden_size=30"],  # the tiny shape is the tiny model's only
        ["policy.constrained_rollouts=false", "update.use_vllm=true"],
        ["update.batch_size=6", "update.processes=3"],
        ["report.candidate_arm=grpo"],
        ["report.holdback_arm=''"],  # no holdback table
        ["report.holdback_arm=holdback"],  # abpo's holdback arm, not served by this config: no table
        ["arms.names=abpo,holdback", "data.known_arms=abpo,holdback", "report.holdback_arm=holdback"],
    ],
)
def test_a_combination_at_the_bound_loads(overrides):
    validate(load_config("tiny", overrides))


@pytest.mark.parametrize(
    "key, choices",
    [
        ("sim.candidates", CANDIDATE_SOURCES),
        ("sim.oracle", ORACLES),
        ("policy.prompt_style", PROMPT_STYLES),
        ("sft.loss_tokens", LOSS_TOKENS),
        ("arms.gate_users", GATE_USERS),
        ("arms.update_logs", UPDATE_LOGS),
        ("update.ratio_level", RATIO_LEVELS),
        ("update.loss_type", LOSS_TYPES),
        ("update.no_response_weight_rule", NO_RESPONSE_WEIGHT_RULES),
        ("update.stratification", STRATIFICATIONS),
        ("policy.dtype", DTYPES),
        ("data.format", FORMATS),
    ],
)
def test_a_key_with_choices_refuses_any_other_value_at_load(key, choices):
    msg = refusal([f"{key}=bogus"])
    assert msg == f"--set: {key} 'bogus': rule: one of {', '.join(choices)}"
    section, name = key.split(".")
    for choice in choices:
        assert getattr(getattr(load_config("tiny", [f"{key}={choice}"]), section), name) == choice


def test_the_simulator_builds_every_choice():
    """Every oracle the config accepts is one abpo.sim.preference weighs, and every component (and replay) has its
    class in abpo.sim.oracles: a new choice written in abpo/config/sim.py alone fails here."""
    from types import SimpleNamespace

    from abpo.sim import oracles
    from abpo.sim.preference import oracle_weights

    built = {c.name for c in vars(oracles).values() if isinstance(c, type) and isinstance(getattr(c, "name", 0), str)}
    assert set(ORACLE_COMPONENTS) | {"replay"} <= built
    for oracle in ORACLES:
        weights = {c: 1.0 for c in ORACLE_COMPONENTS}
        got = oracle_weights(SimpleNamespace(oracle=oracle, oracle_weights=weights))
        assert set(got) == (set(ORACLE_COMPONENTS) if oracle == "mixture" else {oracle})


def test_the_code_that_dispatches_on_a_choice_takes_every_choice():
    """The choices are the tuples the dispatching code reads (one list each, issue 45 point 3); each value works
    there: a torch dtype of that name, a step-5 ratio level, a kappa rule, a batching mode."""
    import typing

    import torch

    from abpo.algo.stratum_weight import no_response_weight
    from abpo.algo.surrogate import RatioLevel, clipped_surrogate
    from abpo.data.batching import stratified_batch_plan
    from abpo.policy.model import torch_dtype

    assert [torch_dtype(d) for d in DTYPES] == [torch.float32, torch.bfloat16]
    assert typing.get_args(RatioLevel) == RATIO_LEVELS
    new = torch.zeros(2, 3, requires_grad=True)
    for level in RATIO_LEVELS:
        clipped_surrogate(new, torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3), 0.2, ratio_level=level)
    assert [no_response_weight(rule, 1.0, click_rate=0.2) for rule in NO_RESPONSE_WEIGHT_RULES] == [1.0, 0.25]
    for mode in STRATIFICATIONS:
        assert stratified_batch_plan(3, 9, 4, seed=0, mode=mode) is not None


def test_an_arms_own_update_rows_win_over_the_shared_cap():
    arms = load_config(
        "tiny", ["arms.update_max_examples=128", "arms.update_max_examples_by_arm={grpo: 512, abpo: 0}"]
    ).arms
    assert (arms.update_rows("grpo", 7), arms.update_rows("grpo_cr", 7), arms.update_rows("abpo", 7)) == (512, 128, 7)


def test_the_configs_holdback_arm_is_abpos_one_holdback_arm():
    """report.holdback_arm may name abpo's holdback arm without serving it (the config layer cannot import the arms'
    registry, so it keeps the name: the two must agree)."""
    from abpo.arms.names import HOLDBACK_ARMS
    from abpo.config.report import HOLDBACK_ARM, ReportConfig

    assert HOLDBACK_ARMS == (HOLDBACK_ARM,) and ReportConfig().holdback_arm == HOLDBACK_ARM


def test_an_arms_update_budget_replaces_section_updates_keys_for_that_arm_only():
    cfg = load_config("tiny", ["arms.update_by_arm={abpo: {learning_rate: 2e-3, epochs: 3}}", "update.epochs=1"])
    mine, other = cfg.arms.update_settings("abpo", cfg.update), cfg.arms.update_settings("grpo", cfg.update)
    assert (mine.learning_rate, mine.epochs) == (2e-3, 3.0)
    assert (other.learning_rate, other.epochs) == (cfg.update.learning_rate, 1.0)
    assert mine.max_examples == cfg.arms.update_rows("abpo", cfg.update.max_examples)
