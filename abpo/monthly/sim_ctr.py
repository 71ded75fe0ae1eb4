"""The models a simulated month's expected-CTR figures score (step ``serve`` with ``simulate``: the climb the report shows).

Each distinct model once: an arm's champion is keyed by its lineage, so the arms that serve the same model share one
key and one scoring. A version bootstrap registered from pi_init (lineage tag ``source = pi_init``, no parent: the
holdback's champion, and an LLM arm's until its first promotion) is ``pi_init (<pi_init_version tag>)``; any other
version is ``<arm> v<version>`` (``<arm> v1 (adopted)`` for a model abpo.monthly.adopt brought in). The loop's starting model, the figures' pi_init reference, is the first LLM arm's
version 1 (as benchmarks/headroom.py reads it; the holdback's champion when the config has no LLM arm), loaded only
when no arm serves it this month.

The scoring itself is abpo.sim.expected_ctr (the serve step calls it: only that step reads the simulator), the
stored figures abpo.abtest.sim_ctr.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from abpo.arms import versions as arm_versions
from abpo.arms.names import HOLDBACK, LLM, entry

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


def model_key(arm: str, version: str, tags: Mapping[str, str] | None) -> str:
    """The key of the arm's version ``version`` (see the module docstring)."""
    tags = tags or {}
    if tags.get("source") == "pi_init" and not tags.get("parent_version"):
        return f"pi_init ({tags.get('pi_init_version') or 'registered by bootstrap'})"
    return f"{arm} v{version}" + (" (adopted)" if tags.get("source") == "adopt" else "")  # abpo.monthly.adopt


def served_models(cfg: Config, arms: Mapping[str, Any], dataset) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """(models, arm_model, start): model key -> a servable (each distinct model once, the arm that serves it first
    in ``arms``), arm -> its champion's key, and the starting model's key (None without an LLM or holdback arm).
    ``arms``: arm -> the champion that served the month (abpo.arms.versions.load_arm)."""
    models: dict[str, Any] = {}
    arm_model: dict[str, str] = {}
    for arm, served in arms.items():
        mv = arm_versions.get_version(cfg, arm, str(served.model_version))
        key = model_key(arm, str(served.model_version), None if mv is None else mv.tags)
        arm_model[arm] = key
        models.setdefault(key, served)
    first = [a for a in arms if entry(a).kind == LLM] or [a for a in arms if entry(a).kind == HOLDBACK]
    if not first:
        return models, arm_model, None
    arm = first[0]
    mv = arm_versions.get_version(cfg, arm, "1")
    if mv is None:
        raise LookupError(
            f"{arm_versions.model_name(arm, cfg)}: no version 1; rule: the arm's first version is the loop's start"
        )
    start = model_key(arm, "1", mv.tags)
    if start not in models:
        models[start] = arm_versions.load_arm(cfg, arm, dataset, "1")
        log.info(f"expected CTR: the starting model {start} loaded (no arm serves it this month)")
    return models, arm_model, start
