"""Bounds (issue 48, item 10): every numeric key a trigger may override has a finite range (update.group_size=1e9 and
sim.requests_per_user=1e9 were taken), a seed past 2^32 is refused when the config loads (it failed at the update), a
namespace is at most 64 characters (a 300-character one failed at the first artifact write, blamed on free space),
and a month's year is 0001-9999 (`0000-01` raised "year 0 is out of range")."""

from __future__ import annotations

import dataclasses
import math
import re
import typing

import pytest


def _numeric_keys(cls, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(tp):
            yield from _numeric_keys(tp, key + ".")
        elif tp in (int, float):
            yield key, f.metadata


def test_every_numeric_override_a_trigger_may_set_has_a_finite_range_inside_the_config_field():
    from abpo.config import Config
    from abpo.monthly.overrides import NOT_OVERRIDABLE, OVERRIDE_PATTERN, OVERRIDE_RANGES

    overridable = [
        (key, meta)
        for key, meta in _numeric_keys(Config)
        if re.fullmatch(OVERRIDE_PATTERN, f"{key}=1") and key not in NOT_OVERRIDABLE
    ]
    assert len(overridable) > 60
    missing = [key for key, _ in overridable if key not in OVERRIDE_RANGES or math.isinf(OVERRIDE_RANGES[key][2])]
    assert not missing, f"numeric overrides without a finite upper bound: {missing}"
    for key, meta in overridable:
        lo, lo_in, hi, hi_in, _integer = OVERRIDE_RANGES[key]
        assert "min" not in meta or lo >= meta["min"], key
        assert "gt" not in meta or lo > meta["gt"] or (lo == meta["gt"] and not lo_in), key
        assert "max" not in meta or hi <= meta["max"], key
        assert "lt" not in meta or hi < meta["lt"] or (hi == meta["lt"] and not hi_in), key


@pytest.mark.parametrize(
    "item, says",
    [
        ("update.group_size=1000000000", "update.group_size must be an integer >= 3 and <= 256"),
        ("update.group_size=1e9", "update.group_size must be an integer"),
        ("sim.requests_per_user=1000000000", "sim.requests_per_user must be an integer >= 1 and <= 1000"),
        ("data.max_users=100000000000", "data.max_users must be an integer >= 0 and <= 1e+08"),
        ("seed=4294967296", "seed must be an integer >= 0 and <= 4.29497e+09"),
        ("sim.oracle_factors=100000", "sim.oracle_factors must be an integer >= 1 and <= 4096"),
    ],
)
def test_a_trigger_override_past_its_upper_bound_is_refused(item, says):
    from abpo.monthly.overrides import check_overrides

    with pytest.raises(ValueError, match=re.escape(says)):
        check_overrides([item])


@pytest.mark.parametrize("key", ["seed", "data.seed", "data.tie_seed"])
def test_a_seed_past_2_to_the_32_is_refused_when_the_config_loads(abpo, state, key):
    rc, out, err = abpo("config", "--set", f"{key}=4294967296")
    assert rc == 2 and "Traceback" not in err, err
    assert f"{key} 4294967296: rule: in [0, 4.29497e+09]" in err, err
    assert abpo("config", "--set", f"{key}=4294967295")[0] == 0


def test_a_namespace_longer_than_64_characters_is_refused_when_the_config_loads(abpo, state, monkeypatch):
    rc, out, err = abpo("config", "--set", f"paths.namespace={'s' * 300}")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "(300 characters)" in err and "at most 64 characters" in err, err
    monkeypatch.setenv("ABPO_NAMESPACE", "p" * 65)
    rc, out, err = abpo("config")
    assert rc == 2 and "at most 64 characters" in err, err
    monkeypatch.setenv("ABPO_NAMESPACE", "p" * 64)
    assert abpo("config")[0] == 0


@pytest.mark.parametrize("month", ["0000-01", "0000-12"])
def test_a_month_of_year_zero_is_refused_as_not_a_month(abpo, state, month):
    from abpo.months import Month, MonthError, is_month

    rc, out, err = abpo("data", "synth", "--month", month, "--n", "5")
    assert rc == 2 and "Traceback" not in err and "a year 0001-9999" in err, err
    assert not is_month(month)
    with pytest.raises(MonthError):
        Month(month)
    assert Month("0001-01").bounds()[0].year == 1 and Month("9999-01").bounds()[0].year == 9999


@pytest.mark.parametrize(
    "override, rule",
    [
        ("update.save_steps=9223372036854775808", "an integer within int64"),  # 2^63: was taken, failed in training
        ("update.max_steps=-9223372036854775809", "an integer within int64"),
        ("arms.replay_months=1000000000", "in [0, 1200]"),  # was taken; the update then named month -83331308-10
    ],
)
def test_an_integer_past_int64_or_a_replay_before_year_one_is_refused_naming_the_key(override, rule):
    from abpo.config import load_config
    from abpo.config.errors import ConfigError

    key = override.split("=", 1)[0]
    with pytest.raises(ConfigError) as info:
        load_config("tiny", [override])
    assert f"{key} " in str(info.value) and f"rule: {rule}" in str(info.value), str(info.value)
    load_config("tiny", ["update.save_steps=9223372036854775807", "arms.replay_months=1200"])  # the bounds themselves
