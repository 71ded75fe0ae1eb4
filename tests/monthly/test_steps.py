"""The one step table (abpo.monthly.steps): every step of STEPS has its arguments in ARGS, its function is
abpo.monthly.<step>.<step> (named like its task) and takes those arguments; an unknown step is refused by name."""

from __future__ import annotations

import inspect

import pytest


def test_every_step_has_a_function_named_like_it_taking_the_arguments_of_the_table():
    from abpo.monthly import steps

    assert set(steps.ARGS) == set(steps.STEPS)
    assert set(steps.UPSTREAM) <= set(steps.ARGS)
    for step, args in steps.ARGS.items():
        fn = steps.function(step)
        assert fn.__name__ == step and fn.__module__ == f"abpo.monthly.{step}", (step, fn)
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in positional if p.default is p.empty]
        assert len(required) <= len(args) <= len(positional), (step, args, params)
        assert params[0].name == "cfg"


def test_an_unknown_step_is_refused_by_name():
    from abpo.monthly import steps

    with pytest.raises(ValueError, match="'train'.*rule: one of"):
        steps.function("train")


def test_an_upstream_xcom_is_read_back_as_the_step_before_result(make_cfg):
    """The gate is fed the register task's JSON (an XCom): run_step reads it back as a RegisterResult and passes its
    version; a version the registry does not hold is refused by the gate (NotInRegistry), naming the arm's model."""
    from abpo.arms.versions import NotInRegistry
    from abpo.monthly import steps

    cfg = make_cfg()
    with pytest.raises(NotInRegistry, match="abpo-arm-abpo: no champion to gate v7 "):
        steps.run_step(
            "gate", cfg, "2026-01", arm="abpo", upstream={"arm": "abpo", "version": "7", "parent_version": "6"}
        )
