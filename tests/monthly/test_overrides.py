"""abpo.monthly.overrides: the run-time override ranges a DAG trigger is held to. The module may not import abpo (the
DAG reads it at parse time), so its ranges repeat the config fields' own; a range a trigger accepts must never be one
the config then refuses at load (update.group_size=2 and update.delta=0 were: the run failed after serve and ingest
instead of at the trigger)."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from abpo.config import Config, load_config
from abpo.monthly.overrides import OVERRIDE_RANGES, check_range


def _field(key: str) -> tuple[typing.Mapping, type]:
    cls: typing.Any = Config
    *sections, name = key.split(".")
    for part in sections:
        cls = typing.get_type_hints(cls)[part]
    return {f.name: f for f in dataclasses.fields(cls)}[name].metadata, typing.get_type_hints(cls)[name]


@pytest.mark.parametrize("key", sorted(OVERRIDE_RANGES))
def test_every_override_range_lies_inside_the_config_fields_range(key):
    lo, lo_in, hi, hi_in, integer = OVERRIDE_RANGES[key]
    meta, tp = _field(key)
    assert integer == (tp is int), (key, tp)
    if "gt" in meta:  # the field needs > gt: the override's low end must exclude it
        assert lo > meta["gt"] or (lo == meta["gt"] and not lo_in), (key, OVERRIDE_RANGES[key], meta)
    if "min" in meta:
        assert lo >= meta["min"], (key, OVERRIDE_RANGES[key], meta)
    if "lt" in meta:
        assert hi < meta["lt"] or (hi == meta["lt"] and not hi_in), (key, OVERRIDE_RANGES[key], meta)
    if "max" in meta:
        assert hi <= meta["max"], (key, OVERRIDE_RANGES[key], meta)


# the keys a rule between keys (abpo.config.validate) ties to an edge: data.update_steps = 1 needs sim.window <= 1
# (the tiny preset's window is 2, refused at load with both keys named)
COMPANIONS = {"data.update_steps": ["sim.window=1"]}


@pytest.mark.parametrize("key", sorted(OVERRIDE_RANGES))
def test_the_edge_an_override_accepts_loads(key):
    """The smallest value a trigger accepts for each key is one the config loads (the edges, concretely), with the
    keys a rule between keys ties to it (COMPANIONS)."""
    lo, lo_in, hi, hi_in, integer = OVERRIDE_RANGES[key]
    if integer:
        value = str(int(lo if lo_in else lo + 1))
    else:
        value = repr(lo if lo_in else (lo + min(1e-3, (hi - lo) / 2 if math.isfinite(hi) else 1e-3)))
    check_range(key, value)
    load_config("tiny", [f"{key}={value}", *COMPANIONS.get(key, [])])
