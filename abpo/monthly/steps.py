"""The monthly cycle's steps, in the order they run: the one list that the Airflow DAG (dags/abpo_monthly.py: one
task per step, named like it) and ``abpo arms month`` (:func:`abpo.monthly.month.run_month`) both follow, and a
test checks they agree. Each step is the module of the same name in abpo.monthly.

Dependency-free (the DAG file imports it when it is parsed)."""

from __future__ import annotations

ONCE = ("bootstrap", "serve", "ingest")  # once per month, in this order
PER_ARM = {  # then per arm, by the arm's kind (abpo.arms.names), each step taking the one before it
    "llm": ("update", "register", "gate", "promote"),
    "ranker": ("refit",),
    "holdback": ("hold",),  # a no-op that records why the holdback (pi_init, never updated) did not train
}
LAST = ("report",)  # after every arm
ARM_STEPS = tuple(s for chain in PER_ARM.values() for s in chain)
STEPS = (*ONCE, *ARM_STEPS, *LAST)

# The one step table: what each step's function (abpo.monthly.<step>.<step>, named like its task) is called with.
# "cfg", "month", "arm": the config, the month, the arm; "upstream": the step before's result (typed: UPSTREAM), or
# "upstream.version" its version. The DAG's tasks, `abpo arms month` (run_month) and the isolated tasks
# (abpo.monthly.isolated) all call a step through :func:`run_step`, so none holds a step -> function map of its own.
ARGS = {
    "bootstrap": ("cfg", "month"),
    "serve": ("cfg", "month"),
    "ingest": ("cfg", "month"),
    "update": ("cfg", "arm", "month"),
    "register": ("cfg", "arm", "upstream"),
    "gate": ("cfg", "arm", "upstream.version", "month"),
    "promote": ("cfg", "arm", "upstream", "month"),
    "refit": ("cfg", "arm", "month"),
    "hold": ("cfg", "arm", "month"),
    "report": ("cfg", "month"),
}
UPSTREAM = {  # the result class ("module:class") of the step a step is fed, read back from JSON (an XCom) if need be
    "register": "abpo.monthly.update:UpdateResult",
    "gate": "abpo.monthly.register:RegisterResult",
    "promote": "abpo.monthly.gate:GateResult",
}


def _named(path: str):
    import importlib

    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def function(step: str):
    """The function of step ``step``: abpo.monthly.<step>.<step> (imported now: the heavy imports stay in the
    tasks). ValueError naming the known steps for any other name."""
    if step not in ARGS:
        raise ValueError(f"monthly step {step!r}: rule: one of {list(ARGS)} (abpo.monthly.steps.ARGS)")
    return _named(f"abpo.monthly.{step}:{step}")


def run_step(step: str, cfg, month, *, arm: str = "", upstream=None, **options):
    """Run step ``step`` for ``month`` (and ``arm``, fed ``upstream``: the step before's typed result or its
    ``to_json()``) with the arguments :data:`ARGS` names, plus ``options`` (bootstrap: force; serve: simulate).
    Returns the step's typed result. A per-arm step of a month that completed before returns the result it recorded
    then (abpo.monthly.completed.run_arm_step)."""
    fn = function(step)
    version = upstream.get("version") if isinstance(upstream, dict) else getattr(upstream, "version", None)
    if "upstream" in ARGS[step] and isinstance(upstream, dict):  # an XCom: the step before's result, typed again
        upstream = _named(UPSTREAM[step]).from_json(upstream)
    values = {"cfg": cfg, "month": str(month), "arm": arm, "upstream": upstream, "upstream.version": version}
    if step in ARM_STEPS:  # a completed month's per-arm steps stand: abpo.monthly.completed (imported when it runs)
        return _named("abpo.monthly.completed:run_arm_step")(
            step, cfg, str(month), arm, lambda: fn(*(values[a] for a in ARGS[step]), **options)
        )
    return fn(*(values[a] for a in ARGS[step]), **options)
