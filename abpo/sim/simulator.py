"""Month m of simulated traffic: real users, each arm's champion serving, the click model, one landed Parquet
month partition in the impressions contract (docs/loop.md "Simulator").

Users and their true behaviour come from real sequences (the configured dataset, the bundled MovieLens by
default), split as in the offline construction (abpo.data.splits): x_{1:T} is the initial history pi_init was
trained on, the update segment x_{T+1..T+N-1} is what users go on to do, and the target x_{T+N} stays held out for
offline evaluation (the gate). Month index i = months since ``sim.start_month`` covers, per user, the update
positions T + k*w .. T + (k+1)*w - 1 (w = ``sim.window``) of window k = i mod n, n = data.update_steps // w the
windows the update segment holds (:func:`window_of`): the first n months use consecutive windows that never overlap;
month n and later wrap around (month n is window 0 again, ...), so the loop runs any number of months without
changing the data split. The same user positions (histories, next items) then recur, while everything drawn per
month is fresh: the candidates (retrieval fitted on the interactions to date, seeded by the month), the exposures
and the clicks (uniforms seeded by the month), and the arms serving are that month's champions. The items of the
window are what the user consumes that month (landed as the month's interactions; a wrapped month lands them
again, as a user who re-consumes them).

In month i a user makes ``sim.requests_per_user`` requests, spread over the window's positions; a request at t'
carries the real history x_{1:t'} and a candidate set from the retrieval stage (abpo.sim.retrieval, fitted on the
interactions to date; ``sim.candidates = offline``: the offline construction's x_{t'+1} plus distractors). The
user's arm (abpo.abtest.assignment) exposes one item with its propensity; the click model (abpo.sim.clicks, on the
ground-truth preference model abpo.sim.preference that no arm can read) decides the click. Deterministic for
(config seed, month): candidates, exposures and clicks use seeded generators and pre-drawn uniforms per request.

Replicates (``sim.replicate`` r >= 1, abpo loop-experiment): the same data, seed and models, another series of
traffic: users are assigned to arms with the salt :func:`series_salt` = ``<sim.salt>/replicate-<r>``, and every
generator above is keyed by (seed, that salt's hash, month, ...) (:func:`series_entropy`), so each replicate's
assignment, retrieval candidates, exposures and clicks are independent of every other's. Replicate 0 is the series
as it always was (keys without the salt). With ``sim.candidates = offline`` the candidate sets are the offline
construction's, the same in every replicate; exposures and clicks still differ.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from abpo.months import Month

if TYPE_CHECKING:
    from abpo.config import Config

SIM_PART = "sim"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimRequest:
    request_id: str  # "<user>:<t'>" (offline construction) or "<user>:<t'>:<slot>" (retrieval)
    user_id: int
    history: list[int]  # x_{1:t'}
    candidates: list[int]  # C_{t'}
    next_item: int  # x_{t'+1}
    soon: list[int]  # x_{t'+2 ..}: at most sim.soon_horizon items, never the held-out target
    step: int  # the request's slot in the user's month, 0..requests_per_user-1
    offset: int = 0  # the position in the user's month window, 0..window-1 (t' = T + month index * window + offset)


@dataclass
class SimResult:
    month: str
    table: pa.Table
    path: Path | str | None  # the landing file written (an object-store URI for an s3:// landing zone)
    per_arm: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    calibration: dict[str, float] = field(default_factory=dict)  # the preference link of the month


def month_index(start: str, month: str) -> int:
    """Months from ``start`` (``sim.start_month``, index 0) to ``month``."""
    return Month(month).minus(Month(start, "sim.start_month"))


def months_available(cfg: Config) -> int:
    """n = data.update_steps // sim.window: the months whose windows are new positions (see :func:`window_of`)."""
    return cfg.data.update_steps // max(cfg.sim.window, 1)


def window_of(cfg: Config, i: int) -> int:
    """The window k of month index ``i``: k = i mod n (n = :func:`months_available`). Months 0..n-1 cover new
    positions; month i >= n wraps around and covers window i mod n again ("lap" i // n), with fresh draws."""
    return i % max(months_available(cfg), 1)


def _lap_suffix(cfg: Config, i: int) -> str:
    """ "" in the first lap (request ids as before), else ``@<lap>``: a request id stays unique in the warehouse when
    its position recurs in a wrapped month."""
    lap = i // max(months_available(cfg), 1)
    return f"@{lap}" if lap else ""


def _check_month(cfg: Config, month: str) -> int:
    from abpo.config.sim import CANDIDATE_SOURCES
    from abpo.config.validate import check_sim_windows

    w, k = cfg.sim.window, cfg.sim.requests_per_user
    if w < 1 or k < 1:
        raise ValueError(f"config sim.window = {w}, sim.requests_per_user = {k}: rule: each >= 1")
    if cfg.sim.candidates not in CANDIDATE_SOURCES:
        raise ValueError(f"config sim.candidates = {cfg.sim.candidates!r}: rule: one of {list(CANDIDATE_SOURCES)}")
    check_sim_windows(cfg)  # the rules between keys, as load_config checked them (a config built otherwise too)
    i = month_index(cfg.sim.start_month, month)
    if i < 0:
        raise ValueError(
            f"month {month}: simulated month index {i} (sim.start_month = {cfg.sim.start_month}); rule: "
            "a month at or after sim.start_month"
        )
    return i


def _soon(cfg: Config, s, t: int) -> list[int]:
    end = len(s.history) + len(s.update)  # index of the held-out target: never a "soon" item
    return s.sequence[t + 1 : min(t + 1 + cfg.sim.soon_horizon, end)]


def series_salt(cfg: Config) -> str:
    """The salt of the user -> arm hash of this series: ``sim.salt``, or ``<sim.salt>/replicate-<r>`` for
    replicate r = ``sim.replicate`` >= 1 (module docstring; abpo.abtest.assignment.series_salt, which the report's
    assignment check uses too)."""
    from abpo.abtest.assignment import series_salt as salt_of

    return salt_of(cfg.sim.salt, cfg.sim.replicate)


def series_entropy(cfg: Config) -> list[int]:
    """What keys this series' traffic generators besides (seed, month, ...): nothing for replicate 0 (the draws
    as they always were), the first 32 bits of sha256(:func:`series_salt`) for a replicate r >= 1."""
    if int(cfg.sim.replicate) == 0:
        return []
    return [int.from_bytes(hashlib.sha256(series_salt(cfg).encode()).digest()[:4], "big")]


def month_requests(cfg: Config, dataset, splits, month: str) -> list[SimRequest]:
    """Every user's requests of ``month`` (see the module docstring), ordered by (slot, user)."""
    i = _check_month(cfg, month)
    out = (
        _offline_requests(cfg, dataset, splits, i)
        if cfg.sim.candidates == "offline"
        else _retrieval_requests(cfg, dataset, splits, month, i)
    )
    out.sort(key=lambda r: (r.step, r.user_id))
    return out


def _offline_requests(cfg: Config, dataset, splits, i: int) -> list[SimRequest]:
    """The offline construction's requests of month index ``i``: one per window position, x_{t'+1} forced in."""
    from abpo.data.candidates import build_bandit_requests

    w, k, lap = cfg.sim.window, window_of(cfg, i), _lap_suffix(cfg, i)
    by_user = {s.user_id: s for s in splits}
    out = []
    for ex in build_bandit_requests(splits, dataset, cfg.data):
        s = by_user[ex.user_id]
        t = len(ex.history)  # t': x_{1:t'} is the history
        j = t - len(s.history)
        if not k * w <= j < (k + 1) * w:
            continue
        out.append(
            SimRequest(
                ex.request_id + lap,
                ex.user_id,
                list(ex.history),
                list(ex.candidates),
                ex.positive,
                _soon(cfg, s, t),
                j - k * w,
                j - k * w,
            )
        )
    return out


def _retrieval_requests(cfg: Config, dataset, splits, month: str, i: int) -> list[SimRequest]:
    """Month index ``i``'s requests with retrieval-stage candidates (abpo.sim.retrieval): requests_per_user per
    user, spread evenly over the window's positions, the retrieval model and popularity fitted on the interactions
    to date (before the month)."""
    from abpo.sim.retrieval import CooccurrenceRetrieval, mix_counts, retrieve_candidates

    sc = cfg.sim
    items = dataset.item_ids().tolist()
    to_date = interactions_to_date(cfg, splits, month)
    retrieval = CooccurrenceRetrieval(window=sc.retrieval_window, recent=sc.retrieval_recent).fit(to_date, items)
    popularity = np.zeros(len(items))
    for seq in to_date.values():
        for it in seq:
            j = retrieval.index.get(int(it))
            if j is not None:
                popularity[j] += 1
    counts = mix_counts(sc.candidate_count, sc.retrieval_fraction, sc.popular_fraction)
    key = _month_key(month)
    entropy = series_entropy(cfg)
    k, lap = window_of(cfg, i), _lap_suffix(cfg, i)
    out = []
    for s in sorted(splits, key=lambda s: s.user_id):
        T = len(s.history)
        offsets = [j - k * sc.window for j in range(k * sc.window, min((k + 1) * sc.window, len(s.update)))]
        if not offsets:
            continue
        seq = s.sequence
        for r in range(sc.requests_per_user):
            o = offsets[r * len(offsets) // sc.requests_per_user]
            t = T + k * sc.window + o
            rng = np.random.default_rng([int(cfg.seed), key, int(s.user_id), r, 3, *entropy])
            cands = retrieve_candidates(
                seq[:t], retrieval=retrieval, popularity=popularity, counts=counts, rng=rng, exclude=(s.target,)
            )
            out.append(
                SimRequest(
                    f"{s.user_id}:{t}:{r}{lap}", int(s.user_id), seq[:t], cands, int(seq[t]), _soon(cfg, s, t), r, o
                )
            )
    return out


def month_interactions(
    cfg: Config, splits, month: str, times: dict[tuple[int, int], datetime] | None = None
) -> pa.Table:
    """What users consume in ``month`` (INTERACTIONS_SCHEMA): each user's real items of the month's window
    x_{T+k*w+1 .. T+(k+1)*w} (w = ``sim.window``, k = :func:`window_of` the month index), with their positions in the user's sequence; ``times``: (user,
    window offset) -> the time of the first request at that position (else the month's start). Landed with the
    impressions, so the warehouse holds the interactions to date (the ranker arms' training data) without asking
    the simulator."""
    from abpo.data.schemas import INTERACTIONS_SCHEMA

    w = cfg.sim.window
    i = month_index(cfg.sim.start_month, month)
    k = window_of(cfg, i) if i >= 0 else i
    start, _ = Month(month).bounds()
    rows: dict[str, list] = {f.name: [] for f in INTERACTIONS_SCHEMA}
    for s in splits:
        T = len(s.history)
        for j in range(max(k * w, 0), min((k + 1) * w, len(s.update))):
            rows["user_id"].append(int(s.user_id))
            rows["item_id"].append(int(s.update[j]))
            rows["event_time"].append((times or {}).get((int(s.user_id), j - k * w), start))
            rows["rating"].append(None)
            rows["position"].append(T + j)
    return pa.table(rows, schema=INTERACTIONS_SCHEMA)


def interactions_to_date(cfg: Config, splits, month: str) -> dict[int, list[int]]:
    """What the platform has seen users consume before ``month``: x_{1:T} and the real items of every earlier
    simulated month (what the warehouse's interactions to date hold once those months are ingested: tests check
    the two agree): month j's window k = j mod n (:func:`window_of`), so after a wrap the windows recur."""
    w = cfg.sim.window
    i = max(month_index(cfg.sim.start_month, month), 0)
    ks = [window_of(cfg, j) for j in range(i)] if months_available(cfg) >= 1 else []
    return {
        s.user_id: [*s.history, *(x for k in ks for x in s.update[k * w : min((k + 1) * w, len(s.update))])]
        for s in splits
    }


_ORACLES: dict[tuple, Any] = {}
_COMPONENTS: dict[tuple, Any] = {}


def _component(cfg: Config, dataset, name: str, reference: list[int]):
    """One fitted ground-truth component (abpo.sim.oracles), cached per process by its settings: switching
    ``sim.oracle`` or the weights refits nothing."""
    from abpo.sim.oracles import AlsComponent, KnnComponent, ReplayComponent, SequentialComponent

    sc = cfg.sim
    settings = {
        "als": (sc.oracle_factors, sc.oracle_iterations, sc.oracle_regularization),
        "knn": (sc.oracle_knn_window, sc.oracle_knn_recent, sc.oracle_reference_users),
        "sequential": (sc.oracle_markov_order, sc.oracle_markov_smoothing, sc.oracle_reference_users),
        "replay": (sc.replay_horizon, sc.replay_decay, sc.replay_strength, sc.replay_popularity_exponent),
    }[name]
    key = (dataset.name, dataset.interactions.num_rows, dataset.catalog.num_rows, int(cfg.seed), name, settings)
    if key not in _COMPONENTS:
        if any(k[:4] != key[:4] for k in _COMPONENTS):
            _COMPONENTS.clear()  # one dataset at a time: a process never needs two
        t = time.time()
        items = {int(i): j for j, i in enumerate(dataset.item_ids().tolist())}
        comp: AlsComponent | ReplayComponent | KnnComponent | SequentialComponent
        if name == "als":
            comp = AlsComponent.fit(
                dataset.sequences,
                items,
                factors=sc.oracle_factors,
                iterations=sc.oracle_iterations,
                regularization=sc.oracle_regularization,
                seed=cfg.seed,
            )
        elif name == "replay":
            comp = ReplayComponent(
                horizon=sc.replay_horizon,
                decay=sc.replay_decay,
                strength=sc.replay_strength,
                popularity_exponent=sc.replay_popularity_exponent,
            ).fit(dataset.sequences, items)
        elif name == "knn":
            comp = KnnComponent(window=sc.oracle_knn_window, recent=sc.oracle_knn_recent).fit(
                dataset.sequences, items, reference
            )
        else:
            comp = SequentialComponent(order=sc.oracle_markov_order, smoothing=sc.oracle_markov_smoothing).fit(
                dataset.sequences, items, reference
            )
        _COMPONENTS[key] = comp
        log.info(
            f"simulate: ground-truth component {name} fitted on {dataset.interactions.num_rows} interactions "
            f"of {len(dataset.sequences)} users in {time.time() - t:.1f}s"
        )
    return _COMPONENTS[key]


def ground_truth(cfg: Config, dataset):
    """The users' preference model (abpo.sim.preference: ``sim.oracle``, the mixture of ``sim.oracle_weights`` by
    default), its components fitted once per process on every interaction of ``dataset``, future windows and
    held-out targets included. Only the click model reads it; ``oracle.z(user, items, history=...)`` with a
    request's history is the z its clicks use."""
    from abpo.sim.oracles import reference_users
    from abpo.sim.preference import PreferenceOracle, oracle_weights

    sc = cfg.sim
    weights = oracle_weights(sc)
    key = (
        dataset.name,
        dataset.interactions.num_rows,
        dataset.catalog.num_rows,
        int(cfg.seed),
        sc.oracle,
        tuple(sorted(weights.items())),
        sc.oracle_factors,
        sc.oracle_iterations,
        sc.oracle_regularization,
        sc.oracle_knn_window,
        sc.oracle_knn_recent,
        sc.oracle_markov_order,
        sc.oracle_markov_smoothing,
        sc.oracle_reference_users,
        sc.replay_horizon,
        sc.replay_decay,
        sc.replay_strength,
    )
    if key not in _ORACLES:
        reference = reference_users(dataset.sequences, sc.oracle_reference_users, cfg.seed)
        comps = {name: _component(cfg, dataset, name, reference) for name in weights}
        if any(k[:4] != key[:4] for k in _ORACLES):
            _ORACLES.clear()
        _ORACLES[key] = PreferenceOracle.build(
            comps, weights, dataset.sequences, dataset.item_ids().tolist(), reference
        )
    return _ORACLES[key]


def soon_items(cfg: Config, split, t: int) -> list[int]:
    """The "soon" items of a request at t' = ``t`` of ``split``'s user: x_{t'+2 .. t'+1+sim.soon_horizon}, never the
    held-out target (what the click model boosts with sim.click_soon)."""
    return _soon(cfg, split, t)


def click_probabilities(
    cfg: Config, dataset, requests: Sequence[tuple[int, Sequence[int], Sequence[int], int, int, Sequence[int]]]
) -> tuple[np.ndarray, float]:
    """P(click | exposed item) of the production loop's click model (abpo.sim.clicks) for offline logs: one
    (user id, history x_{1:t'}, candidates, exposed item, next item x_{t'+1}, soon items) per request. The oracle
    scores each request against its own history, as :func:`simulate_month` does (its sequential and co-occurrence
    components read the user's recent items at t', never the items after it). The preference link's
    intercept is calibrated, as :func:`simulate_month` does per month, on the oracle scores of every candidate of
    ``requests`` so that the mean preference probability is sim.base_ctr. Returns the probabilities and the
    intercept."""
    from abpo.sim.clicks import check_click_config, click_probability
    from abpo.sim.preference import calibrate_intercept, preference_probability

    check_click_config(cfg.sim)
    if not requests:
        return np.zeros(0, dtype=np.float64), 0.0
    oracle = ground_truth(cfg, dataset)
    z = [oracle.z(int(u), list(c), history=list(h)) for u, h, c, _, _, _ in requests]
    intercept = calibrate_intercept(np.concatenate(z), cfg.sim.preference_slope, cfg.sim.base_ctr)
    out = np.empty(len(requests), dtype=np.float64)
    for j, ((_, _, c, a, nxt, soon), zj) in enumerate(zip(requests, z, strict=True)):
        p_pref = float(preference_probability(zj[list(c).index(int(a))], intercept, cfg.sim.preference_slope))
        out[j] = click_probability(p_pref, int(a), int(nxt), soon, cfg.sim)
    return out, float(intercept)


def _month_key(month: str) -> int:
    return int.from_bytes(hashlib.sha256(month.encode()).digest()[:4], "big")


def _uniforms(seed: int, month: str, stream: int, n: int, entropy: Sequence[int] = ()) -> np.ndarray:
    return np.random.default_rng([int(seed), _month_key(month), stream, *entropy]).random(n)


def _times(month: str, n: int) -> list[datetime]:
    start, end = Month(month).bounds()
    step = (end - start).total_seconds() / max(n, 1)
    return [start + timedelta(seconds=int(j * step)) for j in range(n)]


def simulate_month(
    cfg: Config,
    month: str,
    arms: Mapping[str, Any],
    *,
    dataset=None,
    splits=None,
    write: bool = True,
    requests: Sequence[SimRequest] | None = None,
) -> SimResult:
    """Serve ``month``'s requests with ``arms`` (arm name -> abpo.arms.Arm, the champions), click, and (``write``)
    land the impressions as ``landing/impressions/month=<month>/part-sim.parquet`` (a rerun replaces it).
    ``requests``: the month's requests when the caller already built them with :func:`month_requests` (they do not
    depend on the oracle or the shares: benchmarks/simulate.py serves one month under several oracles)."""
    from abpo.abtest.assignment import assign_users, check_shares
    from abpo.arms.base import expose
    from abpo.data.loaders import load_dataset
    from abpo.data.schemas import IMPRESSIONS_SCHEMA, SCHEMA_VERSION, write_impressions, write_interactions
    from abpo.data.splits import split_users
    from abpo.sim.clicks import check_click_config, click_probability
    from abpo.sim.preference import calibrate_intercept, preference_probability

    t0 = time.time()
    check_click_config(cfg.sim)
    shares = check_shares(cfg.report.arm_shares, list(arms))
    ds = dataset if dataset is not None else load_dataset(cfg.data)
    if splits is None:
        splits, _ = split_users(ds, cfg.data)
    if requests is None:
        requests = month_requests(cfg, ds, splits, month)
    arm_of = assign_users([s.user_id for s in splits], series_salt(cfg), shares)
    u_expose = _uniforms(cfg.seed, month, 1, len(requests), series_entropy(cfg))
    u_click = _uniforms(cfg.seed, month, 2, len(requests), series_entropy(cfg))
    oracle = ground_truth(cfg, ds)
    z = [oracle.z(r.user_id, r.candidates, history=r.history) for r in requests]
    intercept = calibrate_intercept(np.concatenate(z), cfg.sim.preference_slope, cfg.sim.base_ctr) if z else 0.0
    rep = f", replicate {cfg.sim.replicate} (salt {series_salt(cfg)!r})" if cfg.sim.replicate else ""
    log.info(f"simulate {month}: {len(requests)} requests of {len(splits)} users, arms {dict(shares)}{rep}")

    exposures: dict[int, Any] = {}
    per_arm: dict[str, dict[str, Any]] = {}
    for name, arm in arms.items():
        idx = [j for j, r in enumerate(requests) if arm_of[r.user_id] == name]
        t = time.time()
        exp = expose(
            arm,
            [(requests[j].user_id, requests[j].history, requests[j].candidates) for j in idx],
            [float(u_expose[j]) for j in idx],
        )
        exposures.update(zip(idx, exp))
        per_arm[name] = {
            "impressions": len(idx),
            "users": len({requests[j].user_id for j in idx}),
            "model_version": str(arm.model_version),
            "serve_seconds": round(time.time() - t, 2),
        }
        log.info(f"  serve {name:<11} v{arm.model_version}: {len(idx)} requests in {time.time() - t:.1f}s")

    times = _times(month, len(requests))
    cols: dict[str, list] = {f.name: [] for f in IMPRESSIONS_SCHEMA}
    for j, (r, ts) in enumerate(zip(requests, times, strict=True)):
        e = exposures[j]
        name = arm_of[r.user_id]
        pos = r.candidates.index(e.item_id)
        p_pref = float(preference_probability(z[j][pos], intercept, cfg.sim.preference_slope))
        clicked = int(u_click[j] < click_probability(p_pref, e.item_id, r.next_item, r.soon, cfg.sim))
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
        # an arm with no request this month (a small share of few users) has no CTR: None, which JSON (the serve
        # task's XCom) carries; NaN is refused there
        v["ctr"] = round(v["clicks"] / v["impressions"], 4) if v["impressions"] else None
    path = None
    if write:
        path = write_impressions(table, cfg.paths.location("landing"), month, part=SIM_PART)
        when: dict[tuple[int, int], datetime] = {}
        for r, ts in zip(requests, times, strict=True):
            when.setdefault((r.user_id, r.offset), ts)
        write_interactions(
            month_interactions(cfg, splits, month, when), cfg.paths.location("landing"), month, part=SIM_PART
        )
    calibration = {"intercept": intercept, "base_ctr": cfg.sim.base_ctr, "slope": cfg.sim.preference_slope}
    return SimResult(month, table, path, per_arm, round(time.time() - t0, 1), calibration)
