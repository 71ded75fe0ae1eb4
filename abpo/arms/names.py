"""Every arm by name: the one registry from an arm's name to its class, its kind and what it refreshes with.

Dependency-free (no numpy, no other abpo module), so the DAG file and the Airflow UI plugin import it when they
are parsed. Classes are named as ``module:Class`` and imported only by :func:`arm_class`.

Adding an arm is one :class:`ArmEntry` here plus its class (a subclass of :class:`abpo.arms.base.Arm`; an LLM
variant or a ranker reuses :class:`abpo.arms.llm.LLMArm` or :class:`abpo.arms.rankers.RankerArm`) and its config
block in section ``arms`` (see docs/loop.md, "Adding an arm")."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Any

from abpo.errors import UsageError
from abpo.paths import namespaced

MODEL_PREFIX = "abpo-arm-"  # one registered MLflow model per arm: abpo-arm-<arm> (model_name: with the namespace)
LOCK_PREFIX = "abpo-lock-"  # an arm's promotion lock: abpo-lock-<arm> (lock_name: with the namespace)

LLM, RANKER, HOLDBACK = "llm", "ranker", "holdback"


@dataclass(frozen=True)
class ArmEntry:
    name: str
    cls: str  # "module:Class" of the arm's abpo.arms.base.Arm subclass
    kind: str  # "llm": updated, registered as challenger, gated and promoted monthly; "ranker": refitted, champion;
    #            "holdback": an LLM arm whose champion stays pi_init (never updated, never promoted): the control
    refreshed_by: str  # llm: the update variant (abpo.algo.variants); ranker: the ranker (abpo.baselines.RANKERS);
    #                    holdback: "none", variant (A), no update


ARMS: dict[str, ArmEntry] = {
    e.name: e
    for e in (
        ArmEntry("abpo", "abpo.arms.llm:LLMArm", LLM, "abpo"),
        ArmEntry("grpo", "abpo.arms.llm:LLMArm", LLM, "grpo"),
        # variant G (B with the no-response rows weighted c/(1-c), docs/update-variants.md Eq. N2): the one
        # update that beat No-Update in the test tables (docs/which-update.md); an arm beside the paper's two
        ArmEntry("grpo_cr", "abpo.arms.llm:LLMArm", LLM, "grpo_cr"),
        # chosen by the budget curve's rule on the validation series (docs/which-update.md "The budget
        # curve"): variant J, the SNIPS-weighted likelihood of the clicked logged items alone (Eq. L1), the update
        # that rose where every GRPO-surrogate update on the logged reward fell; the demo serves it in grpo_cr's place
        ArmEntry("wll", "abpo.arms.llm:LLMArm", LLM, "wll"),
        ArmEntry("ml_retrain", "abpo.arms.rankers:RankerArm", RANKER, "ml_retrain"),
        ArmEntry("popularity", "abpo.arms.rankers:RankerArm", RANKER, "popularity"),
        ArmEntry("holdback", "abpo.arms.llm:HoldbackArm", HOLDBACK, "none"),
    )
}
LLM_ARMS = tuple(n for n, e in ARMS.items() if e.kind == LLM)
RANKER_ARMS = tuple(n for n, e in ARMS.items() if e.kind == RANKER)
HOLDBACK_ARMS = tuple(n for n, e in ARMS.items() if e.kind == HOLDBACK)


def check_arm(name: str) -> str:
    """``name`` when it is one of abpo's arms; UsageError (a ValueError) naming it and the rule otherwise."""
    if name not in ARMS:
        raise UsageError(f"arm {name!r}: unknown; rule: one of {sorted(ARMS)}")
    return name


def arm_arg(value: str) -> str:
    """argparse type of an ``--arm`` option: the arm checked (:func:`check_arm`) when the command line is parsed,
    before any store is opened; argparse's one-line error otherwise."""
    try:
        return check_arm(value)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def entry(name: str) -> ArmEntry:
    return ARMS[check_arm(name)]


def arm_class(name: str) -> Any:
    """The arm's class (imported on first use): a subclass of abpo.arms.base.Arm, typed Any because this module
    imports no other abpo module (the DAG file and the UI plugin import it when parsed)."""
    module, _, cls = entry(name).cls.partition(":")
    return getattr(importlib.import_module(module), cls)


def model_name(name: str, namespace: str = "") -> str:
    """The arm's registered MLflow model: ``abpo-arm-<arm>``, ``<namespace>-abpo-arm-<arm>`` in an environment
    (``paths.namespace``, abpo.paths.namespaced)."""

    return namespaced(MODEL_PREFIX + check_arm(name), namespace)


def lock_name(name: str, namespace: str = "") -> str:
    """The arm's promotion lock (a registered model, abpo.arms.promotion_lock.promotion_lock): ``abpo-lock-<arm>``,
    ``<namespace>-abpo-lock-<arm>`` in an environment."""

    return namespaced(LOCK_PREFIX + check_arm(name), namespace)
