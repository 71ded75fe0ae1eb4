"""abpo.train.records.ABPOSettings: the trainer's settings are config keys with the config's defaults, built from the
config's sections (issue 45: no default written twice)."""

from __future__ import annotations

import dataclasses

from abpo.config import load_config
from abpo.config.policy import PolicyConfig
from abpo.config.update import UpdateConfig
from abpo.train.grpo_args import settings_for, variant_update_config
from abpo.train.records import POLICY_KEYS, UPDATE_KEYS, ABPOSettings

# what one update is, not a config key: the variant, the click rate of its logged rows, the reward mode
RUN_FIELDS = {"variant", "click_rate", "reward"}


def test_every_setting_is_a_config_key_or_a_run_field():
    names = {f.name for f in dataclasses.fields(ABPOSettings)}
    assert names == RUN_FIELDS | set(UPDATE_KEYS) | set(POLICY_KEYS)
    assert not set(UPDATE_KEYS) & set(POLICY_KEYS)
    assert set(UPDATE_KEYS) <= {f.name for f in dataclasses.fields(UpdateConfig)}
    assert set(POLICY_KEYS) <= {f.name for f in dataclasses.fields(PolicyConfig)}


def test_the_defaults_are_the_configs():
    s, u, p = ABPOSettings(), UpdateConfig(), PolicyConfig()
    assert {k: getattr(s, k) for k in UPDATE_KEYS} == {k: getattr(u, k) for k in UPDATE_KEYS}
    assert {k: getattr(s, k) for k in POLICY_KEYS} == {k: getattr(p, k) for k in POLICY_KEYS}


def test_settings_for_copies_every_key_from_the_sections():
    """Every key away from its default on both sections: each lands in the settings under its own name."""
    cfg = load_config(
        "tiny",
        [
            "update.delta=0.003",
            "update.lambda_sc=0.7",
            "update.ratio_level=token",
            "update.no_response_weight_rule=click_rate",
            "update.offpolicy_gamma=0.5",
            "policy.tau=0.5",
            "policy.scoring_batch_tokens=123",
        ],
    )
    for variant in ("abpo", "grpo", "abpo_ll"):
        s = settings_for(cfg, variant, click_rate=0.25)
        u = variant_update_config(cfg.update, variant)
        assert (s.variant, s.click_rate, s.reward) == (variant, 0.25, "logged")
        assert {k: getattr(s, k) for k in UPDATE_KEYS} == {k: getattr(u, k) for k in UPDATE_KEYS}
        assert {k: getattr(s, k) for k in POLICY_KEYS} == {k: getattr(cfg.policy, k) for k in POLICY_KEYS}
    assert settings_for(cfg, "abpo").tau == 0.5 and settings_for(cfg, "abpo").delta == 0.003
