"""The simulator's expected CTR of a served month, per arm (the climb, shown in the report).

The serve step (abpo.monthly.serve, with ``simulate``) serves the month's requests with each arm's champion; here
every distinct model that served is scored on the same requests with Eq. H1 of abpo.sim.headroom

    CTR(pi) = (1/R) sum_r sum_{a in C_r} pi(a | r) p_r(a)                                                 (Eq. H1)

(the click model's probabilities p_r, with the month's own calibrated intercept, no click noise), beside the
references on those requests: the loop's starting model (pi_init, Eq. H1), oracle-greedy (Eq. H2) and the random
floor (Eq. H3). Each arm's figure is also given on its own users' requests among them (the expectation its realised
CTR draws around), and its realised CTR (the simulated clicks over its impressions of the whole month).

**Which requests.** Scoring an LLM champion on every request of a demo month (7,320) costs 50-90 s of CPU per
model (7-13 ms a request with the demo's 2 threads, on the shared 2-core machine), so each month scores a fixed,
seeded subsample: **one request per user** (:data:`SAMPLE_RULE`, :func:`scored_sample`: the user's request drawn
with a generator keyed by the config seed, the month and the series), 610 requests in the demo, 4-9 s of CPU per
LLM. Every model is scored on the same sample, so differences between arms carry no sampling noise from clicks or
from which users an arm served. Each distinct model is scored once a month: arms whose champion is the same model
(the holdback and an LLM arm not promoted yet both serve pi_init) share its scores.

A diagnostic of simulated months only: it never trains, never selects, and the report reads the stored figures
(abpo.abtest.sim_ctr), never this module.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from abpo.sim.headroom import candidate_click_probabilities, expected_ctr, oracle_greedy_ctr, random_floor_ctr

if TYPE_CHECKING:
    from abpo.config import Config
    from abpo.sim.simulator import SimRequest

log = logging.getLogger(__name__)

SAMPLE_RULE = "one request per user"  # what :func:`scored_sample` keeps (the report's label says so)
DIGITS = 6  # figures are rounded to 1e-6 (1e-4 points): a rerun of the month writes the same bytes


def requests_sha256(requests: Sequence[SimRequest]) -> str:
    """The fingerprint of a month's requests: sha256 of their ids in order (benchmarks/headroom.py records its
    online bound only on the requests the month served)."""
    return hashlib.sha256("\n".join(r.request_id for r in requests).encode()).hexdigest()


def scored_sample(cfg: Config, month: str, requests: Sequence[SimRequest]) -> list[int]:
    """The indices (ascending) of the requests scored: :data:`SAMPLE_RULE`, each user's drawn by a generator keyed
    by (seed, month, series), so the same month of the same series always scores the same requests."""
    from abpo.sim.simulator import series_entropy

    by_user: dict[int, list[int]] = {}
    for j, r in enumerate(requests):
        by_user.setdefault(int(r.user_id), []).append(j)
    key = int.from_bytes(hashlib.sha256(f"expected-ctr/{month}".encode()).digest()[:4], "big")
    rng = np.random.default_rng([int(cfg.seed), key, *series_entropy(cfg)])
    return sorted(idx[int(rng.integers(len(idx)))] for _, idx in sorted(by_user.items()))


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), DIGITS)


def month_figures(
    cfg: Config,
    month: str,
    requests: Sequence[SimRequest],
    *,
    dataset,
    intercept: float,
    arm_of_request: Mapping[str, str],
    models: Mapping[str, Any],
    arm_model: Mapping[str, str],
    start: str | None,
    realised: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The month's figures (what abpo.abtest.sim_ctr stores and the report reads).

    ``requests``: every request of the month as served; ``intercept``: the preference link's intercept the month
    was served with (SimResult.calibration); ``arm_of_request``: request id -> the arm that served it; ``models``:
    model key -> a Servable, each distinct model once; ``arm_model``: arm -> its champion's model key; ``start``:
    the key of the loop's starting model (pi_init) or None; ``realised``: SimResult.per_arm (impressions, clicks,
    ctr per arm)."""
    missing = sorted(set(arm_model) - set(realised)) + sorted(k for k in arm_model.values() if k not in models)
    if missing or (start is not None and start not in models):
        raise ValueError(
            f"expected CTR {month}: arms or models {missing or [start]} not scored; rule: every arm served and its "
            "champion's model (and the starting model) among the models"
        )
    sample = scored_sample(cfg, month, requests)
    reqs = [requests[j] for j in sample]
    probs, _ = candidate_click_probabilities(cfg, dataset, reqs, intercept=intercept)
    served = [(r.user_id, r.history, r.candidates) for r in reqs]
    arms_of = [arm_of_request[r.request_id] for r in reqs]
    scores: dict[str, dict[str, Any]] = {}
    for key, model in models.items():
        t = time.perf_counter()
        exposure = model.propensities(served)
        own = {}
        for arm in (a for a, k in arm_model.items() if k == key):
            idx = [j for j, a in enumerate(arms_of) if a == arm]
            own[arm] = (expected_ctr([probs[j] for j in idx], [exposure[j] for j in idx]) if idx else None, len(idx))
        scores[key] = {"all": expected_ctr(probs, exposure), "own": own, "seconds": time.perf_counter() - t}
        log.info(f"  expected CTR {month}: {key} on {len(reqs)} requests in {scores[key]['seconds']:.1f}s")
    arms = {}
    for arm, key in arm_model.items():
        v = realised[arm]
        own_ctr, own_n = scores[key]["own"][arm]
        arms[arm] = {
            "model": key,
            "model_version": str(getattr(models[key], "model_version", "")),
            "expected_ctr": _r(scores[key]["all"]),
            "expected_ctr_own": _r(own_ctr),
            "scored_own": own_n,
            "impressions": int(v["impressions"]),
            "clicks": int(v["clicks"]),
            "realised_ctr": None if not v["impressions"] else _r(v["clicks"] / v["impressions"]),
        }
    return {
        "month": str(month),
        "what": "the simulator's expected CTR (Eq. H1 of abpo.sim.headroom: the click model's probabilities, no "
        "click noise); realised_ctr: the simulated clicks over the arm's impressions",
        "requests": {
            "month": len(requests),
            "scored": len(reqs),
            "sample": SAMPLE_RULE,
            "sha256": requests_sha256(requests),
        },
        "exposure_tau": float(cfg.policy.tau),
        # -inf when sim.base_ctr is 0 (abpo.sim.preference.calibrate_intercept: no preference click), which JSON
        # cannot hold: stored as null, with every expected CTR 0 but the boosts'
        "intercept": _r(intercept) if math.isfinite(intercept) else None,
        "models_scored": len(models),
        "arms": arms,
        "reference": {
            "start": None if start is None else {"model": start, "expected_ctr": _r(scores[start]["all"])},
            "oracle_greedy": _r(oracle_greedy_ctr(probs)),
            "random_floor": _r(random_floor_ctr(probs)),
        },
    }


def sample_scores(
    cfg: Config, month: str, requests: Sequence[SimRequest], policies: Mapping[str, Any], *, dataset, intercept: float
) -> dict[str, float]:
    """Eq. H1 of each of ``policies`` (label -> Servable) on the requests :func:`month_figures` scores for the
    month (benchmarks/headroom.py --record: its online bound on the serve step's requests)."""
    reqs = [requests[j] for j in scored_sample(cfg, month, requests)]
    probs, _ = candidate_click_probabilities(cfg, dataset, reqs, intercept=intercept)
    served = [(r.user_id, r.history, r.candidates) for r in reqs]
    return {label: round(expected_ctr(probs, p.propensities(served)), DIGITS) for label, p in policies.items()}
