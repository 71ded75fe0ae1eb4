"""The arms of the production loop: what serves each user group, refreshed every month.

One interface, :class:`Arm`: an arm is a servable model version that gives, for a request (the user's history, a
candidate set C), an exposure distribution over C with every candidate's probability > 0. :func:`expose` samples
the exposed item from it and returns it with its exact propensity, the arm's ``logging_policy`` and the registered
``model_version``: the columns of an impression row (abpo.data.schemas).

    popularity   abpo.arms.rankers: log(1 + count) over a rolling window of interactions and clicks to date,
                 exposure softmax(log popularity / T)
    ml_retrain   abpo.arms.rankers: implicit's ALS (the experiment's ML-retrain) refitted on all interactions and
                 clicks to date, exposure softmax(score / T)
    grpo         abpo.arms.llm: the LLM policy updated monthly with variant B on its own arm's logs
    abpo         abpo.arms.llm: the LLM policy updated monthly with variant F on its own arm's logs

LLM arms expose by sampling e_p(.|q) = softmax(s_p / tau) over C (ABPO_SPEC.md Eq. e_p) with the same shared-prefix
scorer and tau the update uses for e_old, so the logged propensity of month m is exactly e_old of month m+1's
update. How each month refreshes an arm (update, gate, refit, registration with lineage): abpo.arms.cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# arm name -> how it is refreshed: the update variant of an LLM arm, or "ranker"
ARM_KINDS = {"abpo": "abpo", "grpo": "grpo", "ml_retrain": "ranker", "popularity": "ranker"}
LLM_ARMS = tuple(a for a, k in ARM_KINDS.items() if k != "ranker")
RANKER_ARMS = tuple(a for a, k in ARM_KINDS.items() if k == "ranker")

Request = tuple[int, Sequence[int], Sequence[int]]  # (user id, history oldest first, candidate ids)


@dataclass(frozen=True)
class Exposure:
    item_id: int
    propensity: float  # P(item_id | request) under the arm's exposure distribution, exact over C, > 0
    logging_policy: str
    model_version: str


class Arm(Protocol):
    name: str
    model_version: str  # the registered version that serves (abpo.arms.registry)
    logging_policy: str  # how propensities are made, e.g. "softmax(tau=1.0)"

    def propensities(self, requests: Sequence[Request]) -> list[np.ndarray]:
        """One probability vector per request, aligned with its candidates, summing to 1, all > 0."""
        ...


def check_arm(name: str) -> str:
    if name not in ARM_KINDS:
        raise ValueError(f"arm {name!r}: unknown; rule: one of {sorted(ARM_KINDS)}")
    return name


def sample_index(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from ``p`` with the uniform ``u`` in [0, 1): index j with P(j) = p[j]. Pre-drawn uniforms
    make a month's exposures independent of the order arms are served in."""
    c = np.cumsum(np.asarray(p, dtype=np.float64))
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(c) - 1))


def expose(arm: Arm, requests: Sequence[Request], uniforms: Sequence[float]) -> list[Exposure]:
    """Sample the exposed item of every request from ``arm``'s distribution (one pre-drawn uniform per request)."""
    if len(uniforms) != len(requests):
        raise ValueError(f"expose({arm.name}): {len(uniforms)} uniforms for {len(requests)} requests")
    out = []
    for (user, _, cands), p, u in zip(requests, arm.propensities(requests), uniforms, strict=True):
        if len(p) != len(cands) or not np.all(p > 0) or abs(float(np.sum(p)) - 1.0) > 1e-6:
            raise ValueError(f"arm {arm.name} (version {arm.model_version}), user {user}: exposure distribution "
                             f"breaks the rule 'one probability > 0 per candidate, summing to 1'")
        j = sample_index(p, u)
        out.append(Exposure(int(cands[j]), float(p[j]), arm.logging_policy, str(arm.model_version)))
    return out
