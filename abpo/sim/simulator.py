"""Month m of simulated traffic: real users, each arm's champion serving, the click model, one landed Parquet
month partition in the impressions contract.

Users and their true behaviour come from real sequences (the configured dataset, the bundled MovieLens by
default), split as in the offline construction (abpo.data.splits): x_{1:T} is the initial history pi_init was
trained on, the update segment x_{T+1..T+N-1} is what users go on to do, and the target x_{T+N} stays held out for
offline evaluation (the gate). Month index i = months since ``sim.start_month`` serves, per user, the update
positions t' = T + i*k .. T + (i+1)*k - 1 (k = ``sim.requests_per_user``): windows are consecutive and never
overlap. A request at t' is the user's real history x_{1:t'} and the offline construction's candidate set C_{t'}
(x_{t'+1} plus M-1 seeded distractors never interacted with, abpo.data.candidates.build_bandit_requests). The
user's arm (abpo.sim.assignment) exposes one item with its propensity; the click model (abpo.sim.clicks) decides
the click. Deterministic for (config seed, month): exposures and clicks use pre-drawn uniforms per request.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from abpo.months import Month

SIM_PART = "sim"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimRequest:
    request_id: str  # "<user>:<t'>", as in the offline construction
    user_id: int
    history: list[int]  # x_{1:t'}
    candidates: list[int]  # C_{t'}
    next_item: int  # x_{t'+1}
    soon: list[int]  # x_{t'+2 ..}: at most sim.soon_horizon items, never the held-out target
    step: int  # position in the user's month window, 0..k-1


@dataclass
class SimResult:
    month: str
    table: pa.Table
    path: Path | None
    per_arm: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0


def month_index(start: str, month: str) -> int:
    """Months from ``start`` (``sim.start_month``, index 0) to ``month``."""
    return Month(month).minus(Month(start, "sim.start_month"))


def months_available(cfg) -> int:
    return cfg.data.update_steps // max(cfg.sim.requests_per_user, 1)


def month_requests(cfg, dataset, splits, month: str) -> list[SimRequest]:
    """Every user's requests of ``month`` (see the module docstring), ordered by (window step, user)."""
    from abpo.data.candidates import build_bandit_requests

    k = cfg.sim.requests_per_user
    if k < 1:
        raise ValueError(f"config sim.requests_per_user = {k}: rule: >= 1")
    i = month_index(cfg.sim.start_month, month)
    n = months_available(cfg)
    if not 0 <= i < n:
        raise ValueError(
            f"month {month}: simulated month index {i} (sim.start_month = {cfg.sim.start_month}); rule: 0 <= index < "
            f"data.update_steps // sim.requests_per_user = {cfg.data.update_steps} // {k} = {n} (raise "
            "data.update_steps for more months)")
    by_user = {s.user_id: s for s in splits}
    out = []
    for ex in build_bandit_requests(splits, dataset, cfg.data):
        s = by_user[ex.user_id]
        T = len(s.history)
        t = len(ex.history)  # t': x_{1:t'} is the history
        j = t - T
        if not i * k <= j < (i + 1) * k:
            continue
        seq = s.sequence
        end = T + len(s.update)  # index of the held-out target: never a "soon" item
        soon = seq[t + 1 : min(t + 1 + cfg.sim.soon_horizon, end)]
        out.append(SimRequest(ex.request_id, ex.user_id, list(ex.history), list(ex.candidates), ex.positive,
                              list(soon), j - i * k))
    out.sort(key=lambda r: (r.step, r.user_id))
    return out


def month_interactions(cfg, splits, month: str, times: dict[tuple[int, int], datetime] | None = None) -> pa.Table:
    """What users consume in ``month`` (INTERACTIONS_SCHEMA): each user's real items of the month's window
    x_{T+i*k+1 .. T+(i+1)*k} (the next items of the month's requests), with their positions in the user's sequence;
    ``times``: (user, window step) -> the request's time (else the month's start). Landed with the impressions, so
    the warehouse holds the interactions to date (the ranker arms' training data) without asking the simulator."""
    from abpo.data.schemas import INTERACTIONS_SCHEMA

    k = cfg.sim.requests_per_user
    i = month_index(cfg.sim.start_month, month)
    start, _ = Month(month).bounds()
    rows: dict[str, list] = {f.name: [] for f in INTERACTIONS_SCHEMA}
    for s in splits:
        T = len(s.history)
        for j in range(max(i * k, 0), min((i + 1) * k, len(s.update))):
            rows["user_id"].append(int(s.user_id))
            rows["item_id"].append(int(s.update[j]))
            rows["event_time"].append((times or {}).get((int(s.user_id), j - i * k), start))
            rows["rating"].append(None)
            rows["position"].append(T + j)
    return pa.table(rows, schema=INTERACTIONS_SCHEMA)


def interactions_to_date(cfg, splits, month: str) -> dict[int, list[int]]:
    """What the platform has seen users consume before ``month``: x_{1:T} and the real items of every earlier
    simulated month (what the warehouse's interactions to date hold once those months are ingested: tests check
    the two agree)."""
    k = cfg.sim.requests_per_user
    i = max(month_index(cfg.sim.start_month, month), 0)
    return {s.user_id: [*s.history, *s.update[: min(i * k, len(s.update))]] for s in splits}


def _uniforms(seed: int, month: str, stream: int, n: int) -> np.ndarray:
    key = int.from_bytes(hashlib.sha256(month.encode()).digest()[:4], "big")
    return np.random.default_rng([int(seed), key, stream]).random(n)


def _times(month: str, n: int) -> list[datetime]:
    start, end = Month(month).bounds()
    step = (end - start).total_seconds() / max(n, 1)
    return [start + timedelta(seconds=int(j * step)) for j in range(n)]


def simulate_month(cfg, month: str, arms: Mapping[str, Any], *, dataset=None, splits=None,
                   write: bool = True) -> SimResult:
    """Serve ``month``'s requests with ``arms`` (arm name -> abpo.arms.Arm, the champions), click, and (``write``)
    land the impressions as ``landing/impressions/month=<month>/part-sim.parquet`` (a rerun replaces it)."""
    from abpo.arms.base import expose
    from abpo.data.loaders import load_dataset
    from abpo.data.schemas import IMPRESSIONS_SCHEMA, SCHEMA_VERSION, write_impressions, write_interactions
    from abpo.data.splits import split_users
    from abpo.sim.assignment import assign_users, check_shares
    from abpo.sim.clicks import check_click_config, click_probability

    t0 = time.time()
    check_click_config(cfg.sim)
    shares = check_shares(cfg.report.arm_shares, list(arms))
    ds = dataset if dataset is not None else load_dataset(cfg.data)
    if splits is None:
        splits, _ = split_users(ds, cfg.data)
    requests = month_requests(cfg, ds, splits, month)
    arm_of = assign_users([s.user_id for s in splits], cfg.sim.salt, shares)
    u_expose = _uniforms(cfg.seed, month, 1, len(requests))
    u_click = _uniforms(cfg.seed, month, 2, len(requests))
    genres = dict(zip(ds.catalog.column("item_id").to_pylist(), ds.catalog.column("genres").to_pylist()))
    log.info(f"simulate {month}: {len(requests)} requests of {len(splits)} users, arms {dict(shares)}")

    exposures: dict[int, Any] = {}
    per_arm: dict[str, dict[str, Any]] = {}
    for name, arm in arms.items():
        idx = [j for j, r in enumerate(requests) if arm_of[r.user_id] == name]
        t = time.time()
        exp = expose(arm, [(requests[j].user_id, requests[j].history, requests[j].candidates) for j in idx],
                     [float(u_expose[j]) for j in idx])
        exposures.update(zip(idx, exp))
        per_arm[name] = {"impressions": len(idx), "users": len({requests[j].user_id for j in idx}),
                         "model_version": str(arm.model_version), "serve_seconds": round(time.time() - t, 2)}
        log.info(f"  serve {name:<11} v{arm.model_version}: {len(idx)} requests in {time.time() - t:.1f}s")

    times = _times(month, len(requests))
    cols: dict[str, list] = {f.name: [] for f in IMPRESSIONS_SCHEMA}
    for j, (r, ts) in enumerate(zip(requests, times, strict=True)):
        e = exposures[j]
        name = arm_of[r.user_id]
        p_click = click_probability(e.item_id, r.next_item, r.soon, r.history, genres, cfg.sim)
        clicked = int(u_click[j] < p_click)
        cols["impression_id"].append(f"{month}:{name}:{r.request_id}")
        cols["event_time"].append(ts)
        cols["user_id"].append(r.user_id)
        cols["arm"].append(name)
        cols["model_version"].append(e.model_version)
        cols["history"].append(r.history)
        cols["candidates"].append(r.candidates)
        cols["item_id"].append(e.item_id)
        cols["propensity"].append(e.propensity)
        cols["clicked"].append(clicked)
        cols["request_id"].append(r.request_id)
        cols["position"].append(0)
        cols["logging_policy"].append(e.logging_policy)
        cols["served_at"].append(ts)
        cols["schema_version"].append(SCHEMA_VERSION)
        per_arm[name]["clicks"] = per_arm[name].get("clicks", 0) + clicked
    table = pa.table(cols, schema=IMPRESSIONS_SCHEMA)
    for v in per_arm.values():
        v.setdefault("clicks", 0)
        v["ctr"] = round(v["clicks"] / v["impressions"], 4) if v["impressions"] else float("nan")
    path = None
    if write:
        path = write_impressions(table, cfg.paths.resolve("landing"), month, part=SIM_PART)
        when = {(r.user_id, r.step): ts for r, ts in zip(requests, times, strict=True)}
        write_interactions(month_interactions(cfg, splits, month, when), cfg.paths.resolve("landing"), month,
                           part=SIM_PART)
    return SimResult(month, table, path, per_arm, round(time.time() - t0, 1))
