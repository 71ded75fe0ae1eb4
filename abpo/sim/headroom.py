"""Headroom: what any policy could gain on the requests a month served: the first thing to know before asking an update to gain.

For a month's requests r (abpo.sim.simulator.month_requests: the same users, histories and candidate sets the
loop served, whichever arm served them) the click model (abpo.sim.clicks on the ground truth abpo.sim.preference)
gives every candidate a of C_r its click probability p_r(a) = P(click | a exposed), with the preference link's
intercept calibrated on the month's candidates exactly as abpo.sim.simulator.simulate_month calibrates it. A policy
pi with exposure distribution pi(. | r) over C_r then has the **expected** simulated CTR

    CTR(pi) = (1/R) sum_r sum_{a in C_r} pi(a | r) p_r(a)                                                 (Eq. H1)

(the CTR the simulator's clicks average to, without their Bernoulli noise), and two policies bound every other:

    oracle-greedy    (1/R) sum_r max_{a in C_r} p_r(a)      each request's best candidate under the click model (H2)
    random floor     (1/R) sum_r (1/|C_r|) sum_a p_r(a)     a uniformly random candidate                       (H3)

No policy that ranks the served candidate sets can exceed H2; a policy below H3 does worse than exposing at random.
Every figure is on the same requests and the same p_r, so differences between rows have no sampling noise from
clicks (they still depend on the month's users and candidate draws). This module computes; benchmarks/headroom.py
loads a run's pi_init and champions from its registry and prints the table per month (docs/which-update.md).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from abpo.config import Config
    from abpo.sim.simulator import SimRequest

ORACLE_GREEDY = "oracle-greedy"
RANDOM_FLOOR = "random candidate"


def candidate_click_probabilities(
    cfg: Config, dataset, requests: Sequence[SimRequest], *, intercept: float | None = None
) -> tuple[list[np.ndarray], float]:
    """p_r(a) of the module docstring for every candidate of every request (one array per request, aligned with
    its candidates) and the preference link's intercept, calibrated on the z-scores of every candidate of
    ``requests`` to mean sim.base_ctr, as simulate_month does for a month's requests (pass a whole month), or
    ``intercept`` when given (the whole month's, abpo.sim.simulator.SimResult.calibration, for a part of its
    requests)."""
    from abpo.sim.clicks import check_click_config
    from abpo.sim.preference import calibrate_intercept, preference_probability
    from abpo.sim.simulator import ground_truth

    check_click_config(cfg.sim)
    if not requests:
        return [], 0.0
    oracle = ground_truth(cfg, dataset)
    z = [oracle.z(r.user_id, r.candidates, history=r.history) for r in requests]
    if intercept is None:
        intercept = calibrate_intercept(np.concatenate(z), cfg.sim.preference_slope, cfg.sim.base_ctr)
    out = []
    for r, zr in zip(requests, z, strict=True):
        p_pref = preference_probability(zr, intercept, cfg.sim.preference_slope)
        soon = {int(i) for i in r.soon}
        boost = np.array(
            [
                cfg.sim.click_next if int(a) == int(r.next_item) else cfg.sim.click_soon if int(a) in soon else 0.0
                for a in r.candidates
            ],
            dtype=np.float64,
        )
        out.append(1.0 - (1.0 - p_pref) * (1.0 - boost))  # abpo.sim.clicks.click_probability, per candidate
    return out, float(intercept)


def _check(click_probs: Sequence[np.ndarray]) -> None:
    if not click_probs:
        raise ValueError("headroom: no requests; rule: at least one request to average over")
    for j, p in enumerate(click_probs):
        p = np.asarray(p)
        if p.ndim != 1 or p.size == 0 or not np.all((p >= 0) & (p <= 1)):
            raise ValueError(f"headroom: request {j}: click probabilities {p!r}; rule: a non-empty vector in [0, 1]")


def expected_ctr(click_probs: Sequence[np.ndarray], exposure: Sequence[np.ndarray]) -> float:
    """Eq. H1: the mean over requests of sum_a pi(a | r) p_r(a). ``exposure``: one distribution per request,
    aligned with its candidates (what abpo.arms.base.Servable.propensities returns), each summing to 1."""
    _check(click_probs)
    if len(exposure) != len(click_probs):
        raise ValueError(
            f"headroom: {len(exposure)} exposure distributions for {len(click_probs)} requests; rule: one each"
        )
    total = 0.0
    for j, (p, e) in enumerate(zip(click_probs, exposure, strict=True)):
        e = np.asarray(e, dtype=np.float64)
        if e.shape != np.shape(p) or np.any(e < 0) or abs(float(e.sum()) - 1.0) > 1e-6:
            raise ValueError(
                f"headroom: request {j}: exposure {e!r} for {np.size(p)} candidates; rule: a distribution "
                "over the request's candidates (>= 0, summing to 1)"
            )
        total += float(e @ np.asarray(p, dtype=np.float64))
    return total / len(click_probs)


def oracle_greedy_ctr(click_probs: Sequence[np.ndarray]) -> float:
    """Eq. H2: each request's best candidate under the click model."""
    _check(click_probs)
    return float(np.mean([np.max(p) for p in click_probs]))


def random_floor_ctr(click_probs: Sequence[np.ndarray]) -> float:
    """Eq. H3: a uniformly random candidate of each request."""
    _check(click_probs)
    return float(np.mean([np.mean(p) for p in click_probs]))


@dataclasses.dataclass
class HeadroomRow:
    """One policy on one month's requests: Eq. H1 (or H2, H3), and what fraction of the gap from the random
    floor to the oracle it closes: (CTR - floor) / (oracle - floor)."""

    month: str
    policy: str
    version: str
    ctr: float
    gap_closed: float
    requests: int
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class MonthHeadroom:
    month: str
    requests: int
    intercept: float
    rows: list[HeadroomRow]

    def row(self, policy: str) -> HeadroomRow:
        for r in self.rows:
            if r.policy == policy:
                return r
        raise KeyError(f"headroom {self.month}: no row {policy!r}; rows: {[r.policy for r in self.rows]}")


def month_headroom(
    cfg: Config,
    month: str,
    policies: Mapping[str, Any],
    *,
    dataset,
    splits,
    requests: Sequence[SimRequest] | None = None,
) -> MonthHeadroom:
    """The month's rows: oracle-greedy (H2), each of ``policies`` (name -> a Servable: its exposure distribution
    scored on every request of the month, Eq. H1) and the random floor (H3), on ``month``'s requests
    (abpo.sim.simulator.month_requests of ``cfg``, unless ``requests`` are given)."""
    from abpo.sim.simulator import month_requests

    reqs = list(requests) if requests is not None else month_requests(cfg, dataset, splits, month)
    probs, intercept = candidate_click_probabilities(cfg, dataset, reqs)
    best, floor = oracle_greedy_ctr(probs), random_floor_ctr(probs)

    def closed(c: float) -> float:
        return (c - floor) / (best - floor) if best > floor else float("nan")

    rows = [HeadroomRow(month, ORACLE_GREEDY, "", best, 1.0 if best > floor else float("nan"), len(reqs))]
    served = [(r.user_id, r.history, r.candidates) for r in reqs]
    for name, policy in policies.items():
        t = time.perf_counter()
        c = expected_ctr(probs, policy.propensities(served))
        rows.append(
            HeadroomRow(
                month,
                name,
                str(getattr(policy, "model_version", "")),
                c,
                closed(c),
                len(reqs),
                round(time.perf_counter() - t, 1),
            )
        )
    rows.append(HeadroomRow(month, RANDOM_FLOOR, "", floor, 0.0 if best > floor else float("nan"), len(reqs)))
    return MonthHeadroom(month, len(reqs), intercept, rows)


def headroom_markdown(months: Sequence[MonthHeadroom]) -> str:
    """One markdown table: a row per (month, policy), expected CTR in percent and the share of the floor-to-oracle
    gap it closes."""
    lines = [
        "| month | policy | version | requests | expected CTR % | gap closed |",
        "|---|---|---|---:|---:|---:|",
    ]
    for m in months:
        for r in m.rows:
            lines.append(
                f"| {r.month} | {r.policy} | {r.version or '-'} | {r.requests} | {100 * r.ctr:.2f} | "
                f"{r.gap_closed:.3f} |"
            )
    return "\n".join(lines)
