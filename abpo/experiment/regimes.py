"""The experiment's logs under each logging regime: who logs each round's D_bandit, which candidates
it logs over and how the users click (the regime's keys, their choices and their check: abpo.experiment.regime_settings).

The stored ``propensity`` is always the logging policy's own e0(a_log | q) (Eq. e_p for an LLM, softmax(score/T)
for a ranker, 1/|C| for uniform), and every row names its logger in the column ``logging_arm`` (LOGGING_ARMS).
Logs of loggers that do not depend on the row (pi_init, foreign, uniform) are computed once per seed and round and
kept in the seed's store under a name that digests their settings (:func:`shared_log_path`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from abpo.arms.names import LLM_ARMS, RANKER_ARMS
from abpo.baselines import make_ranker, softmax_propensities
from abpo.config.experiment import FOREIGN
from abpo.data.candidates import build_bandit_requests
from abpo.experiment.regime_settings import (
    CLICK_STREAM,
    EXPOSE_STREAM,
    LOGGING_ARM,
    MIX_STREAM,
    is_default,
    regime_settings,
    shared_kind,
)
from abpo.experiment.seeds import (
    load_model,
    log_window,
    pi_init_log,
    pi_init_log_path,
    round_month,
    round_positions,
    write_parquet,
)

if TYPE_CHECKING:
    from abpo.config import Config


def log_requests(ctx) -> list:
    """Every D_bandit request of the seed with the regime's candidates (abpo.data.candidates.build_bandit_requests:
    paper = experiment.log_candidate_count uniform distractors)."""

    e = ctx.cfg.experiment
    if e.log_candidates == "offline":
        return ctx.requests
    dc = dataclasses.replace(ctx.cfg.data, train_candidates=e.log_candidate_count, train_hard_negative_fraction=0.0)
    return build_bandit_requests(ctx.splits, ctx.dataset, dc)


def window_requests(ctx, r: int, rounds: int) -> list:
    """The regime's requests of round r's window (SeedContext.window's positions)."""
    keep = {ex.request_id for ex in ctx.window(r, rounds)}
    return [ex for ex in log_requests(ctx) if ex.request_id in keep]


def shared_log_path(ctx, r: int, rounds: int, kind: str) -> Path:
    """Where the seed keeps the shared log of ``kind`` (pi_init | foreign | uniform) for round r: the default
    regime's pi_init log keeps its old name; any other is named by a digest of what it depends on."""
    if kind == "pi_init" and is_default(ctx.cfg):
        return pi_init_log_path(ctx, r, rounds)
    settings = {k: v for k, v in regime_settings(ctx.cfg).items() if k not in ("logger", "arm_shares")}
    settings["kind"] = kind
    if kind == "foreign":
        settings["foreign_logger"] = ctx.cfg.experiment.foreign_logger
    if kind != "pi_init":  # pi_init's log does not depend on the rankers
        settings["arms"] = {n: dataclasses.asdict(getattr(ctx.cfg.arms, n)) for n in FOREIGN}
        settings["foreign_temperature"] = ctx.cfg.experiment.foreign_temperature
    else:
        settings.pop("arms", None)
        settings.pop("foreign_temperature", None)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    tau = ctx.cfg.policy.tau
    return ctx.store / "d_bandit" / f"r{r}of{rounds}-{kind}-tau{tau:g}-m{ctx.cfg.experiment.month}-{digest}.parquet"


def shared_log(ctx, r: int, rounds: int, kind: str, model=None, tokenizer=None):
    """The shared log of ``kind`` for round r, computed once and kept (shared_log_path); the default regime's
    pi_init log is runner.pi_init_log (abpo.policy.bandit), with its logging_arm column added on read."""
    import pyarrow.parquet as pq

    if kind == "pi_init" and is_default(ctx.cfg):
        return with_logging_arm(pi_init_log(ctx, r, rounds, model, tokenizer), "pi_init")
    path = shared_log_path(ctx, r, rounds, kind)
    if not path.exists():
        if kind == "pi_init" and model is None:
            model, tokenizer = load_model(ctx, ctx.pi_init_dir)
        write_parquet(regime_log(ctx, r, rounds, kind, model, tokenizer, f"pi_init-seed{ctx.cfg.seed}"), path)
    return pq.read_table(path)


def with_logging_arm(table, name: str):
    """``table`` with the column logging_arm (every row ``name``) if it has none."""
    import pyarrow as pa

    if LOGGING_ARM in table.column_names:
        return table
    return table.append_column(LOGGING_ARM, pa.array([name] * table.num_rows, type=pa.string()))


# ------------------------------------------------------------------------------------------- the loggers


def llm_propensities(ctx, model, tokenizer, requests) -> list[np.ndarray]:
    """e(.|q) = softmax(s / policy.tau) over each request's candidates (Eq. s_p, Eq. e_p)."""
    from abpo.policy.scoring import candidate_propensities, score_examples

    scored = score_examples(model, tokenizer, requests, ctx.dataset.titles(), ctx.cfg.policy, progress=False)
    return [np.asarray(candidate_propensities(s.scores, ctx.cfg.policy.tau), dtype=np.float64) for s in scored]


def uniform_propensities(requests) -> list[np.ndarray]:
    """Uniform exploration: e0 = 1 / |C|."""
    return [np.full(len(ex.candidates), 1.0 / len(ex.candidates)) for ex in requests]


def ranker_sequences(ctx, r: int, rounds: int) -> dict[int, list[int]]:
    """What a ranker logger of round r is fitted on: every user's x_{1:T} and the real items of the windows before
    r (the interactions to date; nothing of window r itself)."""
    seqs = {}
    for s in ctx.splits:
        earlier = [i for q in range(1, r) for i in round_positions(len(s.update), q, rounds)]
        seqs[int(s.user_id)] = [*map(int, s.history), *(int(s.update[i]) for i in earlier)]
    return seqs


def ranker_temperature(cfg: Config, name: str) -> float:
    """T of a ranker logger: experiment.foreign_temperature, or arms.<name>.temperature when that is 0."""
    t = cfg.experiment.foreign_temperature or float(getattr(cfg.arms, name).temperature)
    if not t > 0:
        raise ValueError(f"arms.{name}.temperature={t}; rule: > 0 for a ranker that logs")
    return t


def ranker_propensities(ctx, name: str, requests, r: int, rounds: int) -> list[np.ndarray]:
    """softmax(score / T) of the ranker ``name`` (abpo.baselines, fitted as :func:`ranker_sequences`)."""

    if not requests:
        return []
    ranker = make_ranker(name, seed=ctx.cfg.seed, ml_retrain_epochs=ctx.cfg.experiment.ml_retrain_epochs)
    ranker.fit(ranker_sequences(ctx, r, rounds), ctx.dataset.item_ids().tolist())
    t = ranker_temperature(ctx.cfg, name)
    scores = ranker.score([(ex.user_id, ex.history, ex.candidates) for ex in requests])
    return [softmax_propensities(np.asarray(s, dtype=np.float64), t) for s in scores]


def mixed_loggers(cfg: Config, n: int, r: int) -> list[str]:
    """Each request's logger under report.arm_shares (seeded by seed and round): an LLM arm's draw is the row's
    current policy ("llm"), a ranker arm's draw that ranker."""

    shares = {k: float(v) for k, v in cfg.report.arm_shares.items()}
    bad = [k for k in shares if k not in (*LLM_ARMS, *RANKER_ARMS)]
    total = sum(shares.values())
    if bad or not total > 0 or any(v < 0 for v in shares.values()):
        raise ValueError(
            f"report.arm_shares={shares}; rule: shares >= 0 of the arms {LLM_ARMS + RANKER_ARMS}, "
            "summing to more than 0 (experiment.logger = mixed)"
        )
    names = sorted(shares)
    cum = np.cumsum([shares[k] / total for k in names])
    u = np.random.default_rng([int(cfg.seed), MIX_STREAM, int(r)]).random(n)
    drawn = [names[min(int(np.searchsorted(cum, x, side="right")), len(names) - 1)] for x in u]
    return ["llm" if d in LLM_ARMS else d for d in drawn]


def clicks_for(ctx, requests, items: Sequence[int], r: int) -> list[int]:
    """y of each logged (request, item): next_item (y = 1 iff item = x_{t'+1}) or simulator (a seeded uniform below
    abpo.sim.simulator.click_probabilities; the same uniform for a request whoever logs it)."""
    if ctx.cfg.experiment.clicks == "next_item":
        return [int(int(a) == int(ex.positive)) for ex, a in zip(requests, items, strict=True)]
    from abpo.sim.simulator import click_probabilities, soon_items

    by_user = {s.user_id: s for s in ctx.splits}
    reqs = [
        (
            ex.user_id,
            ex.history,
            ex.candidates,
            int(a),
            ex.positive,
            soon_items(ctx.cfg, by_user[ex.user_id], len(ex.history)),
        )
        for ex, a in zip(requests, items, strict=True)
    ]
    p, _ = click_probabilities(ctx.cfg, ctx.dataset, reqs)
    u = _request_uniforms(ctx.cfg.seed, CLICK_STREAM, [ex.request_id for ex in requests])
    return [int(x < q) for x, q in zip(u, p, strict=True)]


def _request_uniforms(seed: int, stream: int, request_ids: Sequence[str]) -> np.ndarray:
    """One uniform per request id, seeded by (seed, stream, request id): independent of which other requests are
    logged with it."""
    out = np.empty(len(request_ids))
    for j, rid in enumerate(request_ids):
        key = int.from_bytes(hashlib.sha256(str(rid).encode()).digest()[:8], "big")
        out[j] = np.random.default_rng([int(seed), stream, key]).random()
    return out


def regime_log(ctx, r: int, rounds: int, kind: str, model=None, tokenizer=None, model_version: str = "", row: str = ""):
    """Round r's D_bandit under the regime, logged by ``kind``: pi_init or policy (``model``, the row's current
    policy), foreign, uniform or mixed (``model`` for its LLM share). In IMPRESSIONS_SCHEMA plus logging_arm."""
    import pyarrow as pa

    from abpo.data.schemas import IMPRESSIONS_SCHEMA, SCHEMA_VERSION
    from abpo.policy.bandit import _month_times
    from abpo.policy.scoring import sample_logged_action

    e = ctx.cfg.experiment
    requests = window_requests(ctx, r, rounds)
    if not requests:
        raise ValueError(f"round {r}: no bandit requests (data.update_steps={ctx.cfg.data.update_steps})")
    llm_name = "pi_init" if kind == "pi_init" or model_version.startswith("pi_init") else "policy"
    if kind in ("pi_init", "policy"):
        loggers = [llm_name] * len(requests)
    elif kind == "foreign":
        loggers = [e.foreign_logger] * len(requests)
    elif kind == "uniform":
        loggers = ["uniform"] * len(requests)
    elif kind == "mixed":
        loggers = [llm_name if d == "llm" else d for d in mixed_loggers(ctx.cfg, len(requests), r)]
    else:
        raise ValueError(f"regime_log: logger kind {kind!r}; rule: pi_init | policy | foreign | uniform | mixed")
    dists: list[np.ndarray | None] = [None] * len(requests)
    for name in dict.fromkeys(loggers):
        idx = [j for j, lg in enumerate(loggers) if lg == name]
        sub = [requests[j] for j in idx]
        if name in ("pi_init", "policy"):
            if model is None:
                raise ValueError(f"regime_log: logger {name} needs the policy's model")
            ps = llm_propensities(ctx, model, tokenizer, sub)
        elif name == "uniform":
            ps = uniform_propensities(sub)
        else:
            ps = ranker_propensities(ctx, name, sub, r, rounds)
        for j, p in zip(idx, ps, strict=True):
            dists[j] = p
    month = round_month(e.month, r)
    rng = np.random.default_rng([int(ctx.cfg.seed), EXPOSE_STREAM, 7 + 1000 * (r - 1)])
    items, props = [], []
    for ex, dist in zip(requests, dists, strict=True):
        if dist is None:  # every request has a logger, whose propensities were filled in above
            raise RuntimeError(f"regime_log: request {ex.request_id} has no logging propensities")
        j, q = sample_logged_action(dist, rng)  # a_log ~ Categorical(e0), q = e0(a_log|q): the logger's own
        items.append(int(ex.candidates[j]))
        props.append(float(q))
    clicked = clicks_for(ctx, requests, items, r)
    times = _month_times(month, len(requests))
    tau = ctx.cfg.policy.tau
    policy_of = {
        "pi_init": f"softmax(tau={tau})",
        "policy": f"softmax(tau={tau})",
        "uniform": "uniform",
        **{n: f"softmax(score/T, T={ranker_temperature(ctx.cfg, n)}) {n}" for n in set(loggers) & set(FOREIGN)},
    }
    version = {"pi_init": model_version or "pi_init", "policy": model_version or row}
    cols: dict[str, list] = {f.name: [] for f in IMPRESSIONS_SCHEMA}
    for ex, a, q, y, lg, ts in zip(requests, items, props, clicked, loggers, times, strict=True):
        cols["impression_id"].append(f"{month}:abpo:{ex.request_id}")
        cols["event_time"].append(ts)
        cols["user_id"].append(int(ex.user_id))
        cols["arm"].append("abpo")
        cols["model_version"].append(str(version.get(lg, lg)))
        cols["history"].append([int(i) for i in ex.history])
        cols["candidates"].append([int(c) for c in ex.candidates])
        cols["item_id"].append(a)
        cols["propensity"].append(q)
        cols["clicked"].append(int(y))
        cols["request_id"].append(ex.request_id)
        cols["position"].append(0)
        cols["logging_policy"].append(policy_of[lg])
        cols["served_at"].append(ts)
        cols["schema_version"].append(SCHEMA_VERSION)
    table = pa.table(cols, schema=IMPRESSIONS_SCHEMA)
    return table.append_column(LOGGING_ARM, pa.array(loggers, type=pa.string()))


def round_log(ctx, row: str, r: int, rounds: int, start_dir: Path):
    """The log a row's round r trains on under the regime (module docstring): shared logs for pi_init, foreign
    and uniform (and for on_policy's round 1), the row's own previous-round policy otherwise."""
    lg = ctx.cfg.experiment.logger
    at_init = Path(start_dir) == Path(ctx.pi_init_dir)
    if lg in ("pi_init", "foreign", "uniform") or (lg == "on_policy" and at_init):
        return shared_log(ctx, r, rounds, shared_kind(ctx.cfg) if lg != "on_policy" else "pi_init")
    model, tok = load_model(ctx, start_dir)
    version = f"pi_init-seed{ctx.cfg.seed}" if at_init else f"{row}-round{r - 1}-seed{ctx.cfg.seed}"
    if lg == "on_policy" and is_default(ctx.cfg):
        return with_logging_arm(log_window(ctx, model, tok, r, rounds, version), "policy")
    return regime_log(ctx, r, rounds, "policy" if lg == "on_policy" else "mixed", model, tok, version, row)
