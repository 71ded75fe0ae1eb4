"""`abpo experiment`: the paper's Table 1 and ablation, reproduced on any dataset the loaders read.

For every seed s (``experiment.seeds``):

    pi_init(s)   next-item pre-training + SFT on D_sup (abpo.policy.sft.train_sft, seed s), trained once per
                 (data, policy, sft, seed) and shared by every experiment and sweep probe:
                 <root>/experiments/_pi_init/<key>/models/pi_init
    rounds       each user's update positions x_{T+1..T+N-1} cut into R = ``experiment.rounds`` windows. In round
                 r every LLM row's round r-1 policy (pi_init for r = 1) logs a fresh D_bandit on window r
                 (abpo.policy.bandit: a ~ e(.|q), y = 1 iff a = x_{t'+1}; other logging regimes, experiment.logger /
                 clicks / log_candidates: abpo.experiment.regimes), then the row trains on it:
                 A none (nothing), B grpo, C anchor, D anchor_snips, E anchor_sc, F abpo (abpo.train.update), and
                 full_info (the upper reference: next-item fine-tuning on the true next items of the window's
                 requests, what complete feedback would give), and the GRPO controls grpo_g1 (G-1 rollouts) and
                 grpo_lr (learning rate x the gamma ratio measured in the ABPO cell of the same seed and round)
    baselines    popularity and ml_retrain (abpo.baselines), fitted on the same training data: every user's x_{1:T}
                 plus the clicked exposures of pi_init's logs of the R windows

A cell is one (seed, row, round): its metrics on the evaluation users, the target's per-user ranks, the update's
per-step metrics, and the match rates of the round's policy on the round's logged exposures, by stratum (the mean
e(a_log|q) over the clicked and over the no-response rows: the probability that a rollout names the exposed item;
the paper's Fig. 1-2). Cells are kept content-addressed (<root>/experiments/_cells/<fingerprint>.json, a copy
under <exp>/cells/), so neither a rerun nor another experiment or probe with the same settings recomputes one.
Rows and seeds run in ``experiment.workers`` processes; progress is logged per cell (this module's logger: the
workers' records are handled by the parent's loggers, abpo.logs.from_workers).

Evaluation (docs/ABPO_SPEC.md "Metrics"): HR@1, HR@5, NDCG@5, Diversity@1, Diversity@5 of the held-out target
x_{T+N} among its candidates (M = ``experiment.eval_candidates``), on the users of ``experiment.eval_split``
(test, or validation: a fixed salted-hash split of the users, so nothing is chosen on the test targets). The
table: mean ± std over seeds of the last round, and paired comparisons (abpo.experiment.stats) of each row
against No-Update (A) and against vanilla GRPO (B): Δ with its two-stage bootstrap interval and p (seeds, then
users), Holm-adjusted except the primary contrast ``experiment.primary_contrast``, the minimum detectable effect
at ``experiment.power``, and non-inferiority tests against No-Update (absolute and relative margin); with rounds,
the trend test of each row's slope over rounds.

Outputs in <exp>/: table.csv, table.md, ablation.png (HR@5 and NDCG@5, mean ± std), rounds.csv and rounds.png
(per round and row: HR@5, NDCG@5, Diversity@5 and the two match rates), experiment.json; all logged to MLflow
(``experiment.mlflow_experiment``: a parent run, a nested run per cell).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from abpo.data.splits import (
    VALIDATION_SALT as SPLIT_SALT,  # noqa: F401 (re-exported)
    split_of_user,
)

log = logging.getLogger(__name__)

KS = (1, 5)
BASELINES = ("popularity", "ml_retrain")
FULL_INFO = "full_info"
# controls of vanilla GRPO (issue 29): G-1 sampled rollouts like the anchored variants (update.grpo_equal_samples),
# and GRPO at update.learning_rate x the mean gamma ratio measured in the ABPO (F) cell of the same seed and round
CONTROLS = {"grpo_g1": "grpo", "grpo_lr": "grpo"}
GAMMA_RATIO = "abpo/gamma_ratio"


# ------------------------------------------------------------------------------------------------- rows


def row_key(row: str) -> str:
    """A row's canonical name: a variant's config name (none, grpo, ..., abpo), full_info or a baseline name."""
    from abpo.algo.variants import get_variant

    if row in BASELINES or row == FULL_INFO or row in CONTROLS:
        return row
    try:
        return get_variant(row).name
    except ValueError:
        raise ValueError(
            f"experiment.rows: {row!r}; rule: a variant (A-F or none, grpo, anchor, anchor_snips, anchor_sc, abpo), "
            f"{FULL_INFO}, a GRPO control ({', '.join(CONTROLS)}) or a baseline ({', '.join(BASELINES)})"
        ) from None


def row_label(row: str) -> str:
    """How a row is named in the table (the paper's)."""
    from abpo.algo.variants import get_variant

    if row == "popularity":
        return "Popularity"
    if row == "ml_retrain":
        return "ML-retrain"
    if row == FULL_INFO:
        return "Full-information (upper ref.)"
    if row == "grpo_g1":
        return "(B) Vanilla GRPO, G-1 rollouts"
    if row == "grpo_lr":
        return "(B) Vanilla GRPO, lr x gamma ratio of F"
    v = get_variant(row)
    names = {"A": "No-Update", "B": "Vanilla GRPO", "F": "ABPO"}
    return f"({v.letter}) {names.get(v.letter, v.description)}"


def variant_of(row: str) -> str:
    """The update variant a row trains with (a control of GRPO is vanilla GRPO, abpo.algo.variants)."""
    return CONTROLS.get(row, row)


def is_llm_row(row: str) -> bool:
    """Rows whose policy is the LLM (a variant or full_info): they go through rounds; baselines are fitted once."""
    return row not in BASELINES


def experiment_config(cfg):
    """The config an experiment runs with: ``experiment.update_steps`` and ``experiment.eval_candidates`` applied as
    data.update_steps and data.eval_candidates, and the
    experiment's settings checked (each error names the key and the rule)."""
    e = cfg.experiment
    if e.update_steps < 0:
        raise ValueError(f"experiment.update_steps={e.update_steps}; rule: 0 (keep data.update_steps) or >= 1")
    if e.update_steps:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, update_steps=e.update_steps))
    if e.rounds < 1:
        raise ValueError(f"experiment.rounds={e.rounds}; rule: at least 1")
    if e.rounds > cfg.data.update_steps:
        raise ValueError(f"experiment.rounds={e.rounds} > data.update_steps={cfg.data.update_steps}; rule: every "
                         "round needs at least one update position per user")
    if e.eval_candidates < 0:
        raise ValueError(f"experiment.eval_candidates={e.eval_candidates}; rule: 0 (keep data.eval_candidates) or >= 2")
    if e.bootstrap_samples < 1:
        raise ValueError(f"experiment.bootstrap_samples={e.bootstrap_samples}; rule: at least 1")
    if e.eval_candidates:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval_candidates=e.eval_candidates))
    from abpo.experiment.regimes import check_regime

    check_regime(e)
    return cfg


# ----------------------------------------------------------------------------------------- evaluation users


def eval_examples_for(cfg, splits, ds) -> list:
    """The evaluation examples (target x_{T+N} + M_eval - 1 unseen negatives) of the users of
    ``experiment.eval_split``, at most ``experiment.max_eval_users`` of them (seeded by data.seed)."""
    from abpo.data.candidates import build_eval_examples
    from abpo.policy.sft import seeded_subsample

    e = cfg.experiment
    if e.eval_split not in ("test", "validation"):
        raise ValueError(f"experiment.eval_split={e.eval_split!r}; rule: test | validation")
    if not 0.0 < e.validation_fraction < 1.0:
        raise ValueError(f"experiment.validation_fraction={e.validation_fraction}; rule: in (0, 1)")
    chosen = [s for s in splits if split_of_user(s.user_id, e.validation_fraction) == e.eval_split]
    examples = build_eval_examples(chosen, ds, cfg.data)
    return seeded_subsample(examples, e.max_eval_users, cfg.data.seed)


def metrics_from_scores(examples: Sequence, scores: Sequence[Sequence[float]], popularity: Mapping[int, int]) -> dict:
    """HR@K, NDCG@K, Diversity@K (K = 1, 5) and the per-user ranks of the target from candidate scores (higher =
    better; ties count against the target). The same code for every row of the table."""
    from abpo.evaluation.metrics import diversity_at_k, hit_rate_at_k, ndcg_at_k, target_rank

    ranks, tops = [], {k: [] for k in KS}
    for ex, s in zip(examples, scores, strict=True):
        s = np.asarray(s, dtype=np.float64)
        if s.shape != (len(ex.candidates),) or not np.all(np.isfinite(s)):
            raise ValueError(f"request {ex.request_id}: {s.shape} scores for {len(ex.candidates)} candidates (or not finite)")
        ranks.append(target_rank(s.tolist(), list(ex.candidates).index(ex.positive)))
        order = sorted(range(len(s)), key=lambda m: (-s[m], m))
        for k in KS:
            tops[k].append([ex.candidates[m] for m in order[:k]])
    out: dict[str, Any] = {"ranks": ranks, "users": [int(ex.user_id) for ex in examples]}
    for k in KS:
        out[f"HR@{k}"] = hit_rate_at_k(ranks, k)
        out[f"NDCG@{k}"] = ndcg_at_k(ranks, k)
        out[f"Diversity@{k}"] = diversity_at_k(tops[k], dict(popularity), k, unseen="tail")
    return out


# --------------------------------------------------------------------------------------------- per seed

# policy settings that do not change pi_init (its key leaves them out, so a sweep of tau reuses it)
PI_INIT_INDEPENDENT = ("tau", "num_threads", "constrained_rollouts", "scoring_batch_tokens")


def experiments_root(cfg) -> Path:
    return cfg.paths.resolve("root") / "experiments"


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pi_init_key(cfg, seed: int) -> str:
    """What pi_init(seed) depends on: the data, the policy's model and prompt settings, the SFT settings, the seed
    and the validation users (early stopping)."""
    policy = {k: v for k, v in dataclasses.asdict(cfg.policy).items() if k not in PI_INIT_INDEPENDENT}
    return _digest({"data": dataclasses.asdict(cfg.data), "policy": policy, "sft": dataclasses.asdict(cfg.sft),
                    "seed": int(seed), "validation_fraction": cfg.experiment.validation_fraction})


def seed_config(cfg, seed: int):
    """The config of one seed: its seed, and its state directory (the shared pi_init store, where its SFT writes
    ``models/pi_init``)."""
    store = experiments_root(cfg) / "_pi_init" / pi_init_key(cfg, seed)
    c = dataclasses.replace(cfg, seed=int(seed))
    c.paths = dataclasses.replace(cfg.paths, root=str(store))
    c.sft = dataclasses.replace(cfg.sft, output="pi_init")
    return c


def round_positions(n_update: int, r: int, rounds: int) -> range:
    """Window r (1-based) of R: the indices i (t' = T + i) of a user's n_update update positions, cut into R
    consecutive windows of near-equal length (numpy.array_split's rule: the first n mod R windows one longer)."""
    if not 1 <= r <= rounds:
        raise ValueError(f"round {r}: rule: 1..{rounds}")
    base, extra = divmod(n_update, rounds)
    start = (r - 1) * base + min(r - 1, extra)
    return range(start, start + base + (1 if r <= extra else 0))


def round_month(month: str, r: int) -> str:
    """The month stamped on round r's log: experiment.month, then one month per round."""
    from abpo.months import Month

    return str(Month.parse(month, "experiment.month").plus(r - 1))


@dataclass
class SeedContext:
    """Everything a seed's cells share (loaded in the worker process)."""

    cfg: Any  # the seed's config (seed_config)
    store: Path  # the shared pi_init store of this seed (<root>/experiments/_pi_init/<key>)
    dataset: Any
    splits: list
    eval_examples: list
    popularity: dict[int, int]
    pi_init_dir: Path
    requests: list  # every D_bandit request t' in {T..T+N-2} of every user (build_bandit_requests)

    def window(self, r: int, rounds: int) -> list:
        """The requests of round r's window (round_positions) of every user."""
        first = {s.user_id: len(s.history) for s in self.splits}
        n_upd = {s.user_id: len(s.update) for s in self.splits}
        keep = []
        for ex in self.requests:
            i = len(ex.history) - first[ex.user_id]
            if i in round_positions(n_upd[ex.user_id], r, rounds):
                keep.append(ex)
        return keep


def pi_init_log_path(ctx: SeedContext, r: int, rounds: int) -> Path:
    """pi_init's log of round r's window (shared: No-Update's rounds, every row's round 1, the baselines)."""
    tau = ctx.cfg.policy.tau
    return ctx.store / "d_bandit" / f"r{r}of{rounds}-tau{tau:g}-m{ctx.cfg.experiment.month}.parquet"


def log_window(ctx: SeedContext, model, tokenizer, r: int, rounds: int, model_version: str):
    """Round r's D_bandit: ``model`` logs one exposure per request of window r (a ~ e(.|q) at policy.tau)."""
    from abpo.policy.bandit import build_bandit_log

    return build_bandit_log(
        ctx.cfg, month=round_month(ctx.cfg.experiment.month, r), arm="abpo", model=model, tokenizer=tokenizer,
        dataset=ctx.dataset, write=False, progress=False, model_version=model_version,
        requests=ctx.window(r, rounds), rng_stream=7 + 1000 * (r - 1),
    )


def _write_parquet(table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def _load_model(ctx: SeedContext, model_dir: Path):
    from abpo.policy.model import load_policy

    model, tok = load_policy(dataclasses.replace(ctx.cfg.policy, model=str(model_dir)), ctx.cfg.paths,
                             dataset=ctx.dataset)
    model.eval()
    return model, tok


def pi_init_log(ctx: SeedContext, r: int, rounds: int, model=None, tokenizer=None):
    """pi_init's log of window r, computed once per (seed, pi_init, tau, window) and kept in the store."""
    import pyarrow.parquet as pq

    path = pi_init_log_path(ctx, r, rounds)
    if not path.exists():
        if model is None:
            model, tokenizer = _load_model(ctx, ctx.pi_init_dir)
        _write_parquet(log_window(ctx, model, tokenizer, r, rounds, f"pi_init-seed{ctx.cfg.seed}"), path)
    return pq.read_table(path)


def prepare_seed(cfg, seed: int) -> dict[str, Any]:
    """pi_init(seed) and its logs of every round's window, each computed once (kept in the shared store; a second
    experiment preparing the same seed at the same time waits on the store's lock, then reuses them)."""
    import fcntl

    cfg = experiment_config(cfg)
    c = seed_config(cfg, seed)
    store = c.paths.resolve("root")
    store.mkdir(parents=True, exist_ok=True)
    with open(store / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare_locked(cfg, c, seed)


def _prepare_locked(cfg, c, seed: int) -> dict[str, Any]:
    from abpo.logs import quiet
    from abpo.policy.sft import train_sft

    ctx = load_seed(cfg, seed)
    done: dict[str, Any] = {}
    if not (ctx.pi_init_dir / "abpo_sft.json").exists():
        log.info(f"[seed {seed}] pi_init: next-item pre-training + SFT on D_sup ...")
        t0 = time.time()
        with quiet("abpo.policy"):  # the per-epoch lines of every seed at once would drown the cells' progress
            train_sft(c, validation_fraction=c.experiment.validation_fraction, dataset=ctx.dataset, log_mlflow=False,
                      register=False, evaluate=False)
        done["sft_seconds"] = round(time.time() - t0, 1)
    from abpo.experiment.regimes import shared_kind, shared_log, shared_log_path

    rounds = cfg.experiment.rounds
    kind = shared_kind(ctx.cfg)  # pi_init's logs, or the regime's row-independent logger's
    t1 = time.time()
    model = tokenizer = None
    if kind == "pi_init" and not all(shared_log_path(ctx, r, rounds, kind).exists() for r in range(1, rounds + 1)):
        model, tokenizer = _load_model(ctx, ctx.pi_init_dir)  # once for every missing window
    rows = clicks = 0
    for r in range(1, rounds + 1):
        t = shared_log(ctx, r, rounds, kind, model, tokenizer)
        rows += t.num_rows
        clicks += int(sum(t.column("clicked").to_pylist()))
    done["bandit_seconds"] = round(time.time() - t1, 1)
    log.info(f"[seed {seed}] pi_init and its D_bandit ready ({rows} logged rows over {rounds} round(s), {clicks} clicks"
             f", logged by {kind})")
    return {"seed": seed, "rows": rows, "clicks": clicks, **done}


def load_seed(cfg, seed: int) -> SeedContext:
    from abpo.data.candidates import build_bandit_requests, training_popularity
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    cfg = experiment_config(cfg)
    c = seed_config(cfg, seed)
    ds = load_dataset(c.data)
    splits, _ = split_users(ds, c.data)
    return SeedContext(
        cfg=c, store=c.paths.resolve("root"), dataset=ds, splits=splits, eval_examples=eval_examples_for(c, splits, ds),
        popularity=training_popularity(splits, ds), pi_init_dir=c.paths.resolve("models") / "pi_init",
        requests=build_bandit_requests(splits, ds, c.data),
    )


# ------------------------------------------------------------------------------------------------ cells


def training_sequences(ctx: SeedContext, logs: Sequence | None = None) -> dict[int, list[int]]:
    """What the baselines are trained on, the same information the LLM rows saw: every user's x_{1:T} (pi_init's
    D_sup) followed by the items they clicked in pi_init's logs (chronological). No-responses are not
    interactions. ``logs``: those logs (default: every round's shared log of the regime,
    abpo.experiment.regimes.shared_log: pi_init's, or the pi_init / foreign / uniform logger's)."""
    import pyarrow as pa

    from abpo.experiment.regimes import shared_kind, shared_log

    if logs is None:
        rounds = ctx.cfg.experiment.rounds
        logs = [shared_log(ctx, r, rounds, shared_kind(ctx.cfg)) for r in range(1, rounds + 1)]
    seqs = {int(s.user_id): list(map(int, s.history)) for s in ctx.splits}
    t = pa.concat_tables([lg.select(["user_id", "event_time", "item_id", "clicked"]) for lg in logs]).sort_by([("user_id", "ascending"), ("event_time", "ascending")])
    for u, item, y in zip(t.column("user_id").to_pylist(), t.column("item_id").to_pylist(), t.column("clicked").to_pylist()):
        if y == 1:
            seqs.setdefault(int(u), []).append(int(item))
    return seqs


def _scores(model, tok, ctx: SeedContext, examples) -> list:
    from abpo.policy.scoring import score_examples

    return score_examples(model, tok, examples, ctx.dataset.titles(), ctx.cfg.policy)


def match_rates(model, tok, ctx: SeedContext, bandit_log) -> dict[str, float]:
    """The policy's match rates on ``bandit_log``'s exposures, by stratum: the mean e(a_log|q) (Eq. e_p at
    policy.tau) over the clicked rows and over the no-response rows, i.e. the probability that a constrained rollout
    names the exposed item (the quantity the update's rollout match rates estimate)."""
    from abpo.data.candidates import Example
    from abpo.policy.scoring import candidate_propensities

    cols = {k: bandit_log.column(k).to_pylist()
            for k in ("request_id", "user_id", "history", "candidates", "item_id")}
    exs = [Example(rid, int(u), list(h), list(c), int(a)) for rid, u, h, c, a in
           zip(cols["request_id"], cols["user_id"], cols["history"], cols["candidates"], cols["item_id"])]
    probs = []
    for s in _scores(model, tok, ctx, exs):
        e = candidate_propensities(s.scores, ctx.cfg.policy.tau)
        probs.append(float(e[list(s.example.candidates).index(s.example.positive)]))
    clicked = bandit_log.column("clicked").to_pylist()
    return {**_rates_by_stratum(probs, clicked),
            **off_policy_value(probs, bandit_log.column("propensity").to_pylist(), clicked)}


def logged_match_rates(bandit_log) -> dict[str, float]:
    """``match_rates`` of the policy that logged ``bandit_log``, without scoring again: its e(a_log|q) is the
    stored propensity (abpo.policy.bandit), so its off-policy value is the log's click rate (every weight 1)."""
    e0, clicked = bandit_log.column("propensity").to_pylist(), bandit_log.column("clicked").to_pylist()
    return {**_rates_by_stratum(e0, clicked), **off_policy_value(e0, e0, clicked)}


def _rates_by_stratum(probs: Sequence[float], clicked: Sequence[int]) -> dict[str, float]:
    """Mean e(a_log|q) over the clicked and over the no-response rows, and the row counts."""
    sums, counts = {1: 0.0, 0: 0.0}, {1: 0, 0: 0}
    for p, y in zip(probs, clicked, strict=True):
        sums[int(y)] += float(p)
        counts[int(y)] += 1
    return {"match_positive": sums[1] / counts[1] if counts[1] else float("nan"),
            "match_no_response": sums[0] / counts[0] if counts[0] else float("nan"),
            "log_rows": len(probs), "log_clicks": counts[1]}


def off_policy_value(probs: Sequence[float], e0: Sequence[float], clicked: Sequence[int]) -> dict[str, float]:
    """The round policy's off-policy click rate on the round's log (Eq. SNIPS-V of docs/regimes.md, the
    self-normalised estimator): V = sum_i w_i y_i / sum_i w_i with w_i = e(a_log,i | q_i) / e0_i, the policy's
    propensity of the logged item over the logger's; and the weights' effective sample size share
    (sum w)^2 / (n sum w^2). The log is the one the round trained on, so for an updated row this is an in-sample
    value (it says what the policy would collect on the requests it learned from, not on new ones)."""
    w = np.asarray(probs, dtype=np.float64) / np.asarray(e0, dtype=np.float64)
    y = np.asarray(clicked, dtype=np.float64)
    if w.size == 0 or not np.isfinite(w).all() or w.sum() <= 0:
        return {"ope_snips": float("nan"), "ope_ess_share": float("nan")}
    return {"ope_snips": float((w * y).sum() / w.sum()),
            "ope_ess_share": float(w.sum() ** 2 / (w.size * (w ** 2).sum()))}


TRAINING_DIAGNOSTICS = {  # per-step update metrics (docs/diagnostics.md) averaged over a cell's steps
    "train_match_positive": "abpo/match_rate/positive", "train_match_no_response": "abpo/match_rate/no_response",
    "train_w_p99": "abpo/w_p99", "train_w_max": "abpo/w_max", "train_w_ess_share": "abpo/w_ess_share",
    "train_gamma_ratio": "abpo/gamma_ratio", "train_grad_cosine": "abpo/grad_cosine_vs_grpo",
}


def training_diagnostics(cell: Mapping) -> dict[str, float]:
    """A cell's TRAINING_DIAGNOSTICS: the mean over its update's logged steps of each per-step metric (NaN where the
    cell trained nothing or the metric was not logged); ``train_w_max`` is the maximum, not the mean."""
    hist = [h for h in (cell.get("update") or {}).get("history", []) if isinstance(h, Mapping)]
    out = {}
    for name, key in TRAINING_DIAGNOSTICS.items():
        v = [float(h[key]) for h in hist if key in h and h[key] is not None and math.isfinite(float(h[key]))]
        out[name] = (max(v) if name == "train_w_max" else float(np.mean(v))) if v else float("nan")
    return out


def _step_logger(prefix: str):
    """A TrainerCallback logging a cell's update progress every 50 steps (the update runs without a progress bar:
    cells share the console)."""
    from transformers import TrainerCallback

    class StepLogger(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 50 == 0 or state.global_step == state.max_steps:
                log.info(f"{prefix} update step {state.global_step}/{state.max_steps}")

    return StepLogger()


def update_round(ctx: SeedContext, row: str, start_dir: Path, bandit_log, out_dir: Path, prefix: str,
                 update_changes: Mapping[str, Any] | None = None) -> dict:
    """Train the row's round: a variant's update of ``start_dir`` on ``bandit_log`` into ``out_dir``
    (abpo.train.update.run_update), from scratch (no resume), on ``experiment.update_max_examples`` rows.
    ``update_changes``: section update's fields a control row changes (row_update_changes)."""
    import pyarrow.compute as pc

    from abpo.train.update import UpdateRun, run_update

    u = dataclasses.replace(ctx.cfg.update, resume=False,
                            max_examples=ctx.cfg.experiment.update_max_examples or ctx.cfg.update.max_examples,
                            **dict(update_changes or {}))
    run = UpdateRun(variant=variant_of(row), arm="", months=(ctx.cfg.experiment.month,), init_model=start_dir, output=out_dir)
    pos = bandit_log.filter(pc.equal(bandit_log.column("clicked"), 1))
    neg = bandit_log.filter(pc.equal(bandit_log.column("clicked"), 0))
    res = run_update(dataclasses.replace(ctx.cfg, update=u), run, progress=False, strata=(pos, neg),
                     log_mlflow=False, callbacks=[_step_logger(prefix)])
    return {"model_dir": str(res.model_dir), "steps": res.global_step, "final": res.metrics, "history": res.history,
            "batching": res.batching}


def full_info_round(ctx: SeedContext, start_dir: Path, requests: list, out_dir: Path) -> dict:
    """The upper reference: next-item fine-tuning of ``start_dir`` on the true next item x_{t'+1} of every request
    of the window (the answer-format SFT loss, sft.loss_tokens), one epoch at experiment.full_info_learning_rate:
    what complete feedback on the same positions would teach."""
    import shutil

    import torch

    from abpo.policy.model import save_policy
    from abpo.policy.sft import run_sft, sft_records

    torch.manual_seed(ctx.cfg.seed)
    model, tok = _load_model(ctx, start_dir)
    model.train()
    records = sft_records(requests, ctx.dataset.titles(), tok, ctx.cfg.policy, ctx.cfg.sft.loss_tokens)
    c = dataclasses.replace(ctx.cfg, sft=dataclasses.replace(
        ctx.cfg.sft, learning_rate=ctx.cfg.experiment.full_info_learning_rate, epochs=1, max_steps=-1))
    work = out_dir.with_name(f".{out_dir.name}.trainer")
    trained, history = run_sft(model, tok, records, c, work)
    shutil.rmtree(work, ignore_errors=True)
    save_policy(trained, tok, out_dir)
    losses = [h["loss"] for h in history if "loss" in h]
    return {"model_dir": str(out_dir), "examples": len(records), "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None}


def run_baseline_cell(ctx: SeedContext, row: str) -> dict[str, Any]:
    """A baseline's cell: fit on x_{1:T} + the clicks of pi_init's logs, score the evaluation users."""
    from abpo.baselines import make_ranker

    prefix = f"[seed {ctx.cfg.seed} {row}]"
    t0 = time.time()
    ranker = make_ranker(row, seed=ctx.cfg.seed, ml_retrain_epochs=ctx.cfg.experiment.ml_retrain_epochs)
    seqs = training_sequences(ctx)
    log.info(f"{prefix} fitting on {sum(len(s) for s in seqs.values())} interactions of {len(seqs)} users")
    ranker.fit(seqs, ctx.dataset.item_ids().tolist())
    scores = ranker.score([(ex.user_id, ex.history, ex.candidates) for ex in ctx.eval_examples])
    out: dict[str, Any] = {"row": row, "seed": ctx.cfg.seed, "round": ctx.cfg.experiment.rounds}
    out.update(metrics_from_scores(ctx.eval_examples, [np.asarray(s, dtype=np.float64).tolist() for s in scores],
                                   ctx.popularity))
    out["seconds"] = round(time.time() - t0, 1)
    log.info(f"{prefix} HR@5 {out['HR@5']:.4f} NDCG@5 {out['NDCG@5']:.4f} in {out['seconds']:.0f}s")
    return out


def run_llm_round(ctx: SeedContext, row: str, r: int, start_dir: Path, out_dir: Path,
                  update_changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One (seed, LLM row, round) cell: log window r under the regime (abpo.experiment.regimes.round_log: the start
    policy logs on-policy), train the row on it, score the evaluation users and the match rates on the round's log.
    Returns the cell (with ``model_dir``)."""
    from abpo.algo.variants import get_variant
    from abpo.experiment.regimes import LOGGING_ARM, round_log, window_requests

    rounds = ctx.cfg.experiment.rounds
    prefix = f"[seed {ctx.cfg.seed} {row} round {r}/{rounds}]" if rounds > 1 else f"[seed {ctx.cfg.seed} {row}]"
    t0 = time.time()
    out: dict[str, Any] = {"row": row, "seed": ctx.cfg.seed, "round": r}
    bandit_log = round_log(ctx, row, r, rounds, start_dir)
    loggers = bandit_log.column(LOGGING_ARM).to_pylist()
    out["logging_arms"] = {k: loggers.count(k) for k in sorted(set(loggers))}
    if update_changes:
        out["update_changes"] = dict(update_changes)
    model_dir = start_dir
    if row == FULL_INFO:
        log.info(f"{prefix} full-information fine-tuning on {bandit_log.num_rows} requests")
        out["full_info"] = full_info_round(ctx, start_dir, window_requests(ctx, r, rounds), out_dir)
        model_dir = Path(out["full_info"]["model_dir"])
    elif get_variant(variant_of(row)).update:
        out["update"] = update_round(ctx, row, start_dir, bandit_log, out_dir, prefix, update_changes)
        model_dir = Path(out["update"].pop("model_dir"))
    out["train_seconds"] = round(time.time() - t0, 1)
    model, tok = _load_model(ctx, model_dir)
    log.info(f"{prefix} scoring {len(ctx.eval_examples)} users and {bandit_log.num_rows} logged exposures")
    # a row that trained nothing this round (No-Update) is the policy that logged it if it logged on-policy or
    # pi_init logged it: its rates are in the log
    own_log = set(loggers) <= {"pi_init", "policy"}
    out.update(logged_match_rates(bandit_log) if (model_dir == start_dir and own_log)
               else match_rates(model, tok, ctx, bandit_log))
    out.update(metrics_from_scores(ctx.eval_examples, [s.scores.tolist() for s in _scores(model, tok, ctx, ctx.eval_examples)],
                                   ctx.popularity))
    out["model_dir"] = str(model_dir)
    out["seconds"] = round(time.time() - t0, 1)
    log.info(f"{prefix} HR@5 {out['HR@5']:.4f} NDCG@5 {out['NDCG@5']:.4f} match pos {out['match_positive']:.3f} "
             f"no-resp {out['match_no_response']:.3f} in {out['seconds']:.0f}s")
    return out


# ---------------------------------------------------------------------------------------------- the table


def paired_tests(cells_a: Sequence[Mapping], cells_b: Sequence[Mapping], **kw) -> dict[str, float]:
    """Row a against row b over the same (seed, user) units: abpo.experiment.stats.paired_comparison (Δ, the
    two-stage bootstrap interval, p and SE, MDE; McNemar and Wilcoxon as extra columns; non-inferiority with
    ``margin`` / ``relative_margin``). Differences are a - b."""
    from abpo.experiment.stats import paired_comparison

    return paired_comparison(cells_a, cells_b, **kw)


METRICS = ("HR@1", "HR@5", "NDCG@5", "Diversity@1", "Diversity@5")
ROUND_METRICS = ("HR@5", "NDCG@5", "Diversity@5", "match_positive", "match_no_response", "ope_snips")
ROUND_DIAGNOSTICS = ("train_match_positive", "train_match_no_response", "train_w_p99", "train_w_ess_share",
                     "train_gamma_ratio")
TESTED = ("HR@5", "NDCG@5")  # the metrics with paired comparisons
REFERENCES = ("none", "grpo")  # every row is compared with No-Update (A) and vanilla GRPO (B)


def _mean_std(vals) -> tuple[float, float]:
    v = np.asarray([x for x in vals if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def primary_contrast(spec: str) -> tuple[str, str]:
    """experiment.primary_contrast 'ROW-REFERENCE' (names or letters, e.g. 'abpo-grpo' or 'F-B') as canonical row
    names (row, reference)."""
    parts = [x.strip() for x in str(spec).split("-")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"experiment.primary_contrast={spec!r}; rule: 'ROW-REFERENCE', e.g. 'abpo-grpo'")
    row, ref = (row_key(x) for x in parts)
    if row == ref:
        raise ValueError(f"experiment.primary_contrast={spec!r}; rule: two different rows")
    return row, ref


def _by_row(cells: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    by_row: dict[str, list[Mapping]] = {}
    for c in cells:
        by_row.setdefault(c["row"], []).append(c)
    return by_row


def table_rows(cells: Sequence[Mapping], rows: Sequence[str], experiment_cfg=None) -> list[dict[str, Any]]:
    """One dict per row: mean and std over seeds of every metric, and the paired comparisons (abpo.experiment.stats,
    two-stage bootstrap) against No-Update (with both non-inferiority tests) and against vanilla GRPO.

    The pre-registered primary contrast (experiment.primary_contrast, HR@5 of ROW minus REFERENCE) keeps its
    unadjusted p and is marked ``vs_<ref>_primary``; every other p of the table (each row against A and B, HR@5 and
    NDCG@5; A vs B and B vs A counted once) is one family, Holm-adjusted into ``vs_<ref>_p_holm_<metric>``."""
    from abpo.experiment.stats import holm

    e = experiment_cfg
    kw = {} if e is None else {"bootstrap_samples": e.bootstrap_samples, "alpha": e.alpha, "power": e.power}
    primary = primary_contrast(e.primary_contrast if e is not None else "abpo-grpo")
    by_row = _by_row(cells)
    out, contrasts = [], []
    for row in rows:
        cs = sorted(by_row.get(row, []), key=lambda c: c["seed"])
        if not cs:
            continue
        rec: dict[str, Any] = {"row": row, "label": row_label(row), "seeds": len(cs)}
        for m in (*METRICS, "match_positive", "match_no_response"):
            if all(m in c for c in cs):
                rec[m], rec[f"{m}_std"] = _mean_std([c[m] for c in cs])
        refs = [*REFERENCES, *([primary[1]] if row == primary[0] and primary[1] not in REFERENCES else [])]
        for ref in refs:
            if row != ref and ref in by_row:
                ni = {}
                if e is not None and ref == "none":
                    ni = {"margin": e.noninferiority_margin, "relative_margin": e.noninferiority_relative_margin,
                          "ni_alpha": e.noninferiority_alpha}
                for k, v in paired_tests(cs, by_row[ref], **ni, **kw).items():
                    rec[f"vs_{ref}_{k}"] = v
                contrasts.append((rec, ref))
                if (row, ref) == primary:
                    rec[f"vs_{ref}_primary"] = True
                    rec["primary_reference"] = ref
        out.append(rec)
    # the family: one member per unordered pair of rows and metric (A vs B and B vs A are one comparison, same p)
    family: dict[tuple[frozenset, str], list[tuple[dict, str]]] = {}
    for rec, ref in contrasts:
        for m in TESTED:
            if f"vs_{ref}_p_{m}" in rec and not (rec.get(f"vs_{ref}_primary") and m == "HR@5"):
                family.setdefault((frozenset((rec["row"], ref)), m), []).append((rec, ref))
    members = list(family.items())
    adjusted = holm([pairs[0][0][f"vs_{pairs[0][1]}_p_{m}"] for (_, m), pairs in members])
    for ((_, m), pairs), adj in zip(members, adjusted):
        for rec, ref in pairs:
            rec[f"vs_{ref}_p_holm_{m}"] = adj
    return out


def round_rows(cells: Sequence[Mapping], rows: Sequence[str], experiment_cfg=None) -> list[dict[str, Any]]:
    """Per (row, round) of the LLM rows: mean and std over seeds of ROUND_METRICS (the rounds' curves). With more
    than one round, the row's last round also carries the trend test (abpo.experiment.stats.trend_comparison:
    per-(seed, user) slope over rounds, two-stage bootstrap): ``trend_slope_*`` against 0 and, for rows other than
    B, ``trend_vs_grpo_dslope_*`` against vanilla GRPO, whose HR@5 p-values are Holm-adjusted as one family
    (``trend_vs_grpo_dslope_p_holm_HR@5``)."""
    from abpo.experiment.stats import holm, trend_comparison

    e = experiment_cfg
    kw = {} if e is None else {"bootstrap_samples": e.bootstrap_samples, "alpha": e.alpha}
    groups: dict[tuple[str, int], list[Mapping]] = {}
    for c in cells:
        if is_llm_row(c["row"]):
            groups.setdefault((c["row"], int(c["round"])), []).append(c)
    llm_cells = _by_row([c for cs in groups.values() for c in cs])
    out = []
    for row in rows:
        recs = []
        for (rw, r), cs in sorted(groups.items(), key=lambda kv: kv[0][1]):
            if rw != row:
                continue
            rec: dict[str, Any] = {"row": row, "label": row_label(row), "round": r, "seeds": len(cs)}
            for m in ROUND_METRICS:
                rec[m], rec[f"{m}_std"] = _mean_std([c.get(m) for c in cs])
            diag = [training_diagnostics(c) for c in cs]
            for m in ROUND_DIAGNOSTICS:
                rec[m], rec[f"{m}_std"] = _mean_std([d[m] for d in diag])
            recs.append(rec)
        if len(recs) > 1 and all("ranks" in c for c in llm_cells[row]):
            ref = llm_cells.get("grpo") if row != "grpo" else None
            t = trend_comparison(llm_cells[row], ref, **kw)
            recs[-1].update({k if k.startswith("trend") else f"trend_{k}" if k.startswith("slope")
                             else f"trend_vs_grpo_{k}": v for k, v in t.items()})
        out += recs
    family = [r for r in out if "trend_vs_grpo_dslope_p_HR@5" in r]
    for r, adj in zip(family, holm([r["trend_vs_grpo_dslope_p_HR@5"] for r in family])):
        r["trend_vs_grpo_dslope_p_holm_HR@5"] = adj
    return out


def _fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _fmt_interval(d: float, lo: float | None, hi: float | None, p: str) -> str:
    ci = f" [{lo:+.4f}, {hi:+.4f}]" if lo is not None and math.isfinite(lo) else ""
    return f"{d:+.4f}{ci} ({p})"


def _fmt_diff(r: Mapping, ref: str, metric: str) -> str:
    """Δ [interval] (p): the Holm-adjusted p, or the unadjusted p marked 'primary' for the primary contrast."""
    key = f"vs_{ref}_d{metric}"
    if key not in r:
        return "-"
    if r.get(f"vs_{ref}_primary") and metric == "HR@5":
        p = f"{_fmt_p(r.get(f'vs_{ref}_p_{metric}'))}, primary"
    else:
        p = _fmt_p(r.get(f"vs_{ref}_p_holm_{metric}", r.get(f"vs_{ref}_p_{metric}")))
    return _fmt_interval(r[key], r.get(f"vs_{ref}_ci_low_{metric}"), r.get(f"vs_{ref}_ci_high_{metric}"), p)


def _fmt_ni(r: Mapping) -> str:
    parts = []
    if "vs_none_non_inferior" in r:
        parts.append(f"abs {r['vs_none_ni_margin']:g}: {'yes' if r['vs_none_non_inferior'] else 'no'} "
                     f"({_fmt_p(r['vs_none_ni_p'])})")
    if "vs_none_non_inferior_rel" in r:
        parts.append(f"rel {100 * r['vs_none_ni_rel_share']:g}% (= {r['vs_none_ni_rel_margin']:.4f}): "
                     f"{'yes' if r['vs_none_non_inferior_rel'] else 'no'} ({_fmt_p(r['vs_none_ni_rel_p'])})")
    return "; ".join(parts) or "-"


def table_markdown(recs: Sequence[Mapping], *, title: str, note: str = "") -> str:
    """The metrics table (mean ± std over seeds) and the comparisons table (Δ [95% two-stage bootstrap interval]
    (p, Holm-adjusted; the primary contrast unadjusted and marked), MDE, non-inferiority)."""
    head = ["Row", *METRICS]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in recs:
        cells = [r["label"]]
        for m in METRICS:
            digits = 2 if m.startswith("Diversity") else 4  # Diversity is on a 0-100 scale
            cells.append(f"{r[m]:.{digits}f} ± {r[m + '_std']:.{digits}f}")
        lines.append("| " + " | ".join(cells) + " |")
    comp = ["Row", "ΔHR@5 vs A [95% CI] (p Holm)", "MDE HR@5 vs A", "Non-inferior to A (one-sided p)",
            "ΔNDCG@5 vs A [95% CI] (p Holm)", "ΔHR@5 vs B [95% CI] (p Holm)", "MDE HR@5 vs B",
            "ΔNDCG@5 vs B [95% CI] (p Holm)"]
    lines += ["", "| " + " | ".join(comp) + " |", "|" + "---|" * len(comp)]
    for r in recs:
        if not any(k.startswith("vs_") for k in r):
            continue
        mde = {ref: (f"{r[f'vs_{ref}_mde_HR@5']:.4f}" if f"vs_{ref}_mde_HR@5" in r else "-") for ref in REFERENCES}
        lines.append("| " + " | ".join([
            r["label"], _fmt_diff(r, "none", "HR@5"), mde["none"], _fmt_ni(r), _fmt_diff(r, "none", "NDCG@5"),
            _fmt_diff(r, "grpo", "HR@5"), mde["grpo"], _fmt_diff(r, "grpo", "NDCG@5"),
        ]) + " |")
    for r in recs:  # a primary contrast against another reference than A or B: its own line
        ref = r.get("primary_reference")
        if ref is not None and ref not in REFERENCES:
            lines += ["", f"Primary contrast {r['label']} vs {row_label(ref)}: ΔHR@5 {_fmt_diff(r, ref, 'HR@5')}"]
    lines += ["", "Intervals: 95% two-stage bootstrap (seeds, then users); p: two-sided, percentile inversion of the "
              "same bootstrap, Holm-adjusted over every comparison in this table except the primary contrast "
              "(marked 'primary', unadjusted)."]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _fmt_trend(r: Mapping, prefix: str, p_key: str) -> str:
    if f"{prefix}_HR@5" not in r:
        return "-"
    p = _fmt_p(r.get(p_key))
    return _fmt_interval(r[f"{prefix}_HR@5"], r.get(f"{prefix.replace('slope', 'slope_ci_low')}_HR@5"),
                         r.get(f"{prefix.replace('slope', 'slope_ci_high')}_HR@5"), p)


def rounds_markdown(recs: Sequence[Mapping]) -> str:
    """The rounds table; with a trend test (more than one round) two more columns on each row's last round: the
    HR@5 slope per round [95% two-stage interval] (p against 0) and its difference against B (p, Holm)."""
    trend = any("trend_slope_HR@5" in r for r in recs)
    diag = [m for m in ROUND_DIAGNOSTICS if any(math.isfinite(r.get(m, float("nan"))) for r in recs)]
    names = {"ope_snips": "off-policy CTR (SNIPS, own log)", "train_match_positive": "train match, positive",
             "train_match_no_response": "train match, no-response", "train_w_p99": "ŵ p99 (train)",
             "train_w_ess_share": "ESS share (train)", "train_gamma_ratio": "γ ratio vs B (train)"}
    head = ["Row", "Round", *(names.get(m, m) for m in (*ROUND_METRICS, *diag))]
    if trend:
        head += ["HR@5 slope/round [95% CI] (p)", "Δ slope HR@5 vs B [95% CI] (p Holm)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in recs:
        vals = [f"{r[m]:.{2 if m.startswith('Diversity') else 4}f} ± {r[m + '_std']:.{2 if m.startswith('Diversity') else 4}f}"
                if math.isfinite(r.get(m, float("nan"))) else "-" for m in ROUND_METRICS]
        vals += [f"{r[m]:.3f}" if math.isfinite(r.get(m, float("nan"))) else "-" for m in diag]
        if trend:
            vals += [_fmt_trend(r, "trend_slope", "trend_slope_p_HR@5"),
                     _fmt_trend(r, "trend_vs_grpo_dslope", "trend_vs_grpo_dslope_p_holm_HR@5")]
        lines.append("| " + " | ".join([r["label"], str(r["round"]), *vals]) + " |")
    if trend:
        lines += ["", "Trend: per (seed, user) least-squares slope of the HR@5 hit over rounds 1..R, averaged; 95% "
                  "two-stage bootstrap (seeds, then users); the Δ slope p-values vs B are Holm-adjusted as one family."]
    return "\n".join(lines) + "\n"


def _plot_rounds(path: Path, rounds_recs: Sequence[Mapping], table: Sequence[Mapping]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(ROUND_METRICS), figsize=(4 * len(ROUND_METRICS), 3.6))
    rows = list(dict.fromkeys(r["row"] for r in rounds_recs))
    pi0 = next((r for r in rounds_recs if r["row"] == "none" and r["round"] == 1), None)  # pi_init itself
    for ax, m in zip(axes, ROUND_METRICS):
        for row in rows:
            pts = [r for r in rounds_recs if r["row"] == row]
            xs, ys = [r["round"] for r in pts], [r[m] for r in pts]
            if pi0 is not None and not m.startswith(("match", "ope")):  # round 0: pi_init, where every row starts
                xs, ys = [0, *xs], [pi0[m], *ys]
            ax.plot(xs, ys, marker="o", label=pts[0]["label"], lw=2.2 if row == "abpo" else 1.2)
        for t in table:
            if t["row"] in BASELINES and m in t:
                ax.axhline(t[m], ls="--", lw=0.8, color="grey")
        ax.set_title(m.replace("match_positive", "match rate, positive").replace("match_no_response", "match rate, no-response")
                     .replace("ope_snips", "off-policy CTR (SNIPS, own log)"), fontsize=9)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def training_match_curves(cells: Sequence[Mapping], bins: int = 10) -> dict[str, dict[str, tuple[list, list]]]:
    """The paper's Fig. 2 quantity over successive rounds: per updated row and stratum, the training-time rollout
    match rate (abpo/match_rate/positive | no_response of the update's logged steps) against the position in
    training, x = (round - 1) + (step - 1) / steps of that round, averaged in ``bins`` equal bins per round over the
    row's seeds. Returns {row: {stratum: (xs, ys)}}; strata 'positive' and 'no_response'."""
    acc: dict[tuple[str, str, int, int], list[float]] = {}
    for c in cells:
        hist = [h for h in (c.get("update") or {}).get("history", []) if isinstance(h, Mapping) and "step" in h]
        steps = max((float(h["step"]) for h in hist), default=0.0)
        for h in hist:
            b = min(int(bins * (float(h["step"]) - 1) / steps), bins - 1) if steps else 0  # steps count from 1
            for stratum in ("positive", "no_response"):
                v = h.get(f"abpo/match_rate/{stratum}")
                if v is not None and math.isfinite(float(v)):
                    acc.setdefault((c["row"], stratum, int(c["round"]), b), []).append(float(v))
    out: dict[str, dict[str, tuple[list, list]]] = {}
    for (row, stratum, r, b), vals in sorted(acc.items()):
        xs, ys = out.setdefault(row, {}).setdefault(stratum, ([], []))
        xs.append(r - 1 + (b + 0.5) / bins)
        ys.append(float(np.mean(vals)))
    return out


def _plot_training_match(path: Path, cells: Sequence[Mapping], title: str) -> None:
    """training_match.png: training_match_curves per stratum, one line per updated row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = training_match_curves(cells)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    for ax, stratum in zip(axes, ("positive", "no_response")):
        for row, by in curves.items():
            if stratum in by:
                ax.plot(*by[stratum], label=row_label(row), lw=2.2 if row == "abpo" else 1.2)
        ax.set_title(f"training-time match rate, {stratum.replace('_', '-')} exposures", fontsize=9)
        ax.set_xlabel("round (position within each round's update)")
    if curves:
        axes[0].legend(fontsize=7)
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def write_outputs(exp_dir: Path, recs: Sequence[Mapping], summary: Mapping[str, Any],
                  rounds_recs: Sequence[Mapping] = (), cells: Sequence[Mapping] = ()) -> dict[str, Path]:
    """table.csv, table.md, ablation.png, rounds.csv, rounds.png and experiment.json in ``exp_dir`` (each written
    then renamed)."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = (("csv", "table.csv"), ("md", "table.md"), ("png", "ablation.png"), ("rounds_csv", "rounds.csv"),
             ("rounds_png", "rounds.png"), ("train_match_png", "training_match.png"), ("json", "experiment.json"))
    paths = {k: exp_dir / n for k, n in names}
    tmp = {k: p.with_name(p.name + ".tmp") for k, p in paths.items()}
    for key, data in (("csv", recs), ("rounds_csv", rounds_recs)):
        keys = sorted({k for r in data for k in r}, key=lambda k: (k not in ("row", "label", "round", "seeds"), k))
        with open(tmp[key], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys or ["row"])
            w.writeheader()
            for r in data:
                w.writerow(r)
    e = summary
    ni_rel = e.get("noninferiority_relative_margin")
    note = (f"{e['eval_users']} {e['eval_split']} users x {e['seeds']} seeds, M = {e['eval_candidates']} candidates, "
            f"{e['rounds']} round(s); mean ± std over seeds. Comparisons: Δ = row - reference with a {100 * (1 - e['alpha']):.0f}% "
            f"two-stage bootstrap interval (seeds, then users inside each drawn seed); p: two-sided from the same "
            f"bootstrap (percentile inversion), Holm-adjusted except the pre-registered primary contrast "
            f"{e.get('primary_contrast', 'abpo-grpo')} on HR@5 (unadjusted); McNemar / Wilcoxon over (seed, user) "
            f"pairs are extra columns of table.csv only; MDE: minimum detectable ΔHR@5 at {100 * e['power']:.0f}% "
            f"power from the two-stage SE, two-sided α = {e['alpha']}; non-inferiority to No-Update (one-sided, "
            f"α = {e.get('noninferiority_alpha', 0.025)}) with the absolute margin {e['noninferiority_margin']} HR@5"
            + (f" and the relative margin {100 * ni_rel:g}% of No-Update's HR@5" if ni_rel else "") + ". "
            f"Wall time {e['wall_seconds'] / 60:.1f} min." + (f" {e['regime']}" if e.get("regime") else ""))
    md = table_markdown(recs, title=f"{e['dataset']}: {e['name']}", note=note)
    if rounds_recs and e["rounds"] > 1:
        md += "\n#### Rounds (mean ± std over seeds; match rates on each round's logged exposures)\n\n" + rounds_markdown(rounds_recs)
    tmp["md"].write_text(md)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [r["label"] for r in recs]
    for ax, m in zip(axes, ("HR@5", "NDCG@5")):
        ax.bar(range(len(recs)), [r[m] for r in recs], yerr=[r[m + "_std"] for r in recs], capsize=4,
               color=["#d62728" if r["row"] == "abpo" else "#1f77b4" if r["row"] not in BASELINES else "#7f7f7f"
                      for r in recs])
        ax.set_xticks(range(len(recs)), labels, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{m} (mean ± std over {e['seeds']} seeds)")
    fig.tight_layout()
    fig.savefig(tmp["png"], dpi=110, format="png")
    plt.close(fig)
    _plot_rounds(tmp["rounds_png"], rounds_recs, recs)
    _plot_training_match(tmp["train_match_png"], cells, f"{e['dataset']}: {e['name']}"
                         + (f" ({e['regime']})" if e.get("regime") else ""))
    tmp["json"].write_text(json.dumps({"summary": summary, "table": list(recs), "rounds": list(rounds_recs)},
                                      indent=1, default=str))
    for k in paths:
        tmp[k].replace(paths[k])
    return paths


# ----------------------------------------------------------------------------------------- orchestration


# The run inputs section `update` held until they became arguments (abpo.train.update.UpdateRun), with the values
# every preset gave them. A cell's update never read them (its row and round set them), but they were part of the
# digested section: putting them back keeps the fingerprints, and so every cached cell, of before the change.
RETIRED_UPDATE_KEYS: dict[str, Any] = {"variant": "abpo", "months": [], "arm": "abpo", "init_model": "",
                                       "output_name": ""}

# Keys added to section `update` after cells were cached, with their default (= the behaviour before they existed):
# at that default a key is left out of the digest, so cached cells keep their fingerprints; any other value enters it.
ADDED_UPDATE_KEYS: dict[str, Any] = {"self_certainty_positions": "choice", "greedy_rollouts": False, "processes": 1}


def cell_fingerprint(cfg, row: str, seed: int | None = None, r: int | None = None) -> str:
    """What a cell's result depends on: the data, policy and SFT settings (pi_init and the candidates), the seed,
    the round and the number of rounds, the update settings (variants that update), full_info's learning rate, the
    experiment's evaluation settings, the logging regime where it is not the default
    (abpo.experiment.regimes.regime_settings) and, for grpo_lr, the ABPO cell its learning rate is measured in."""
    from abpo.experiment.regimes import regime_settings

    e = cfg.experiment
    d: dict[str, Any] = {k: dataclasses.asdict(getattr(cfg, k)) for k in ("data", "policy", "sft")}
    d.update(row=row, seed=None if seed is None else int(seed), round=r, rounds=e.rounds)
    updates = is_llm_row(row) and row != FULL_INFO and row_key(row) != "none"
    upd = {k: v for k, v in dataclasses.asdict(cfg.update).items()
           if not (k in ADDED_UPDATE_KEYS and v == ADDED_UPDATE_KEYS[k])}
    d["update"] = {**upd, **RETIRED_UPDATE_KEYS} if updates else None
    keys = ["eval_split", "validation_fraction", "max_eval_users", "month"]
    keys += ["update_max_examples"] if updates else []
    keys += ["full_info_learning_rate"] if row == FULL_INFO else []
    keys += ["ml_retrain_epochs"] if row == "ml_retrain" else []
    ed = dataclasses.asdict(e)
    d["experiment"] = {k: ed[k] for k in keys}
    regime = regime_settings(cfg)
    if regime:  # only away from the default regime: the cells of before keep their fingerprints
        d["regime"] = regime
    if row == "grpo_lr":
        d["gamma_ratio_of"] = cell_fingerprint(cfg, "abpo", seed, r)
    return _digest(d)


def experiment_dir(cfg) -> Path:
    return experiments_root(cfg) / cfg.experiment.name


def _cell_path(exp_dir: Path, seed: int, row: str, r: int = 1, rounds: int = 1) -> Path:
    suffix = "" if rounds == 1 else f"-r{r}of{rounds}"
    return exp_dir / "cells" / f"seed{seed}-{row}{suffix}.json"


def _cache_path(cfg, fingerprint: str) -> Path:
    return experiments_root(cfg) / "_cells" / f"{fingerprint}.json"


def _load_cell(path: Path, fingerprint: str) -> dict | None:
    if not path.exists():
        return None
    cell = json.loads(path.read_text())
    return cell if cell.get("fingerprint") == fingerprint else None


def _find_cell(cfg, exp_dir: Path, seed: int, row: str, r: int) -> dict | None:
    """A finished cell with these settings: the experiment's own copy, or one any experiment or probe computed."""
    fp = cell_fingerprint(cfg, row, seed, r)
    cell = _load_cell(_cell_path(exp_dir, seed, row, r, cfg.experiment.rounds), fp)
    if cell is None:
        cell = _load_cell(_cache_path(cfg, fp), fp)
        if cell is not None:
            _save_json(_cell_path(exp_dir, seed, row, r, cfg.experiment.rounds), cell)
    return cell


def _save_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two experiments may finish the same shared cell
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def _save_cell(cfg, exp_dir: Path, cell: dict) -> None:
    _save_json(_cache_path(cfg, cell["fingerprint"]), cell)
    _save_json(_cell_path(exp_dir, cell["seed"], cell["row"], cell["round"], cfg.experiment.rounds), cell)


def measured_gamma_ratio(abpo_cell: Mapping | None, where: str) -> float:
    """The mean over update steps of the per-step metric ``abpo/gamma_ratio`` in an ABPO (F) cell's update history
    (the trainer's logged metrics); an error naming ``where`` if the cell or the metric is missing."""
    hist = [] if abpo_cell is None else abpo_cell.get("update", {}).get("history", [])
    vals = [float(h[GAMMA_RATIO]) for h in hist if GAMMA_RATIO in h and math.isfinite(float(h[GAMMA_RATIO]))]
    if not vals:
        state = "no ABPO (F) cell" if abpo_cell is None else f"no {GAMMA_RATIO} in its update history"
        raise ValueError(f"experiment.rows grpo_lr ({where}): {state}; rule: the learning rate is update.learning_rate "
                         f"x the mean {GAMMA_RATIO} measured in the ABPO cell of the same seed and round: run row "
                         "abpo (F) first with the same settings (or add it to experiment.rows)")
    return float(np.mean(vals))


def row_update_changes(cfg, exp_dir: Path, seed: int, row: str, r: int) -> dict[str, Any]:
    """Section update's fields a GRPO control changes: grpo_g1 samples G-1 rollouts (update.grpo_equal_samples);
    grpo_lr trains at update.learning_rate x measured_gamma_ratio of the ABPO cell of (seed, round r)."""
    if row == "grpo_g1":
        return {"grpo_equal_samples": True}
    if row == "grpo_lr":
        ratio = measured_gamma_ratio(_find_cell(cfg, exp_dir, seed, "abpo", r), f"seed {seed}, round {r}")
        return {"learning_rate": cfg.update.learning_rate * ratio}
    return {}


def _row_task(cfg, seed: int, row: str, exp_dir: str) -> list[dict]:
    """Every missing round of one (seed, row): rounds run in order, each starting from the previous round's
    model; finished rounds (with their model kept) are skipped. ``cfg`` is the parent's config, pickled."""
    exp = Path(exp_dir)
    ctx = load_seed(cfg, seed)
    if not is_llm_row(row):
        cell = run_baseline_cell(ctx, row)
        cell["fingerprint"] = cell_fingerprint(cfg, row, seed, cfg.experiment.rounds)
        _save_cell(cfg, exp, cell)
        return [cell]
    rounds = cfg.experiment.rounds
    out, start = [], ctx.pi_init_dir
    for r in range(1, rounds + 1):
        cell = _find_cell(cfg, exp, seed, row, r)
        if cell is not None and (r == rounds or Path(cell["model_dir"]).exists()):
            start = Path(cell["model_dir"])
            continue
        fp = cell_fingerprint(cfg, row, seed, r)
        changes = row_update_changes(cfg, exp, seed, row, r)
        cell = run_llm_round(ctx, row, r, start, experiments_root(cfg) / "_runs" / "models" / fp, changes)
        cell["fingerprint"] = fp
        _save_cell(cfg, exp, cell)
        out.append(cell)
        start = Path(cell["model_dir"])
    return out


@dataclass
class ExperimentResult:
    exp_dir: Path
    table: list[dict[str, Any]]
    outputs: dict[str, Path]
    wall_seconds: float
    computed: int
    reused: int
    mlflow_run_id: str | None = None
    prep: list[dict] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)


def _log_cell(cell: Mapping, cfg, reused: bool) -> None:
    import mlflow

    from abpo import registry

    name = f"seed{cell['seed']}-{cell['row']}" + (f"-r{cell['round']}" if cfg.experiment.rounds > 1 else "")
    with registry.start_run(cfg, cfg.experiment.mlflow_experiment, name, nested=True,
                            tags={"abpo.row": cell["row"], "abpo.cell_seed": cell["seed"], "abpo.reused": reused,
                                  "abpo.round": cell.get("round", 1)}) as run:
        mlflow.log_params({"row": cell["row"], "seed": cell["seed"], "eval_users": len(cell["ranks"]),
                           "round": cell.get("round", 1)})
        mlflow.log_metrics({k.replace("@", "_at_"): float(cell[k]) for k in (*METRICS, "match_positive", "match_no_response")
                            if k in cell and math.isfinite(float(cell[k]))})
        mlflow.log_metric("cell_seconds", float(cell["seconds"]))
        _log_history(run.info.run_id, cell.get("update", {}).get("history", []))


def _log_history(run_id: str, history: Sequence[Mapping[str, float]], batch: int = 1000) -> None:
    """The update's per-step metrics in batches of ``batch`` (MLflow's limit per call): one call per step would
    take minutes for a table of 500-step updates."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(k.replace("@", "_at_"), float(v), now, i) for i, h in enumerate(history, 1)
               for k, v in h.items() if math.isfinite(v)]
    client = MlflowClient()
    for i in range(0, len(metrics), batch):
        client.log_batch(run_id, metrics=metrics[i:i + batch])


def run_experiment(cfg, *, config_ref: str = "tiny", overrides: Sequence[str] = (),
                   mlflow_tags: Mapping[str, str] | None = None) -> ExperimentResult:
    """Compute every missing cell of the table (in ``experiment.workers`` processes), then the tables, the plots
    and the MLflow runs. The worker processes get ``cfg`` itself (pickled); ``config_ref`` / ``overrides`` only
    say in the summary and in MLflow how it was made. Progress is logged; the workers' lines come through this
    process's loggers."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from abpo import registry
    from abpo.data.loaders import load_dataset
    from abpo.experiment.regimes import describe as describe_regime
    from abpo.logs import from_workers

    t0 = time.time()
    cfg = experiment_config(cfg)
    e = cfg.experiment
    rows = [row_key(r) for r in e.rows]
    if len(set(rows)) != len(rows):
        raise ValueError(f"experiment.rows: {e.rows} names a row twice")
    if not e.seeds:
        raise ValueError("experiment.seeds: rule: at least one seed")
    exp_dir = experiment_dir(cfg)
    exp_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(overrides)
    rounds = e.rounds
    cells: dict[tuple[int, str, int], tuple[dict, bool]] = {}
    todo: list[tuple[int, str]] = []
    reused = 0
    for seed in e.seeds:
        for row in rows:
            row_rounds = range(1, rounds + 1) if is_llm_row(row) else [rounds]
            found = {r: _find_cell(cfg, exp_dir, seed, row, r) for r in row_rounds}
            for r, cell in found.items():
                if cell is not None:
                    cells[(seed, row, r)] = (cell, True)
                    reused += 1
            if any(c is None for c in found.values()):
                todo.append((seed, row))
    total = len(e.seeds) * (sum(rounds if is_llm_row(r) else 1 for r in rows))
    log.info(f"experiment {e.name}: {total} cells ({len(rows)} rows x {len(e.seeds)} seeds x {rounds} round(s)), "
             f"{reused} already done, {len(todo)} row chain(s) to compute with {e.workers} worker(s); directory "
             f"{exp_dir}")
    prep: list[dict] = []
    computed = 0
    if todo:
        seeds_needed = sorted({s for s, _ in todo})
        spawn = mp.get_context("spawn")
        with (from_workers(spawn) as (init_logging, logging_args),
              ProcessPoolExecutor(max_workers=max(1, e.workers), mp_context=spawn, initializer=init_logging,
                                  initargs=logging_args) as pool):
            pending = {pool.submit(prepare_seed, cfg, s): ("prep", s, None) for s in seeds_needed}
            # grpo_lr measures its learning rate in the ABPO cells of its seed: it waits for that chain
            waiting = {s for s, r2 in todo if r2 == "abpo"}
            deferred: list[tuple[int, str]] = []
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    kind, seed, row = pending.pop(fut)
                    result = fut.result()  # a failed cell stops the run with its own error
                    if kind == "prep":
                        prep.append(result)
                        for s2, r2 in todo:
                            if s2 == seed and r2 == "grpo_lr" and s2 in waiting:
                                deferred.append((s2, r2))
                            elif s2 == seed:
                                pending[pool.submit(_row_task, cfg, s2, r2, str(exp_dir))] = ("row", s2, r2)
                    else:
                        if row == "abpo":
                            waiting.discard(seed)
                            for s2, r2 in [d for d in deferred if d[0] == seed]:
                                deferred.remove((s2, r2))
                                pending[pool.submit(_row_task, cfg, s2, r2, str(exp_dir))] = ("row", s2, r2)
                        for cell in result:
                            computed += 1
                            cells[(seed, row, int(cell["round"]))] = (cell, False)
                        last = result[-1] if result else None
                        if last is not None:
                            log.info(f"[{reused + computed}/{total}] seed {seed} {row_label(row)}: HR@5 "
                                     f"{last['HR@5']:.4f} ({time.time() - t0:.0f}s elapsed)")
    final = [cells[(s, r, rounds)][0] for s in e.seeds for r in rows]
    recs = table_rows(final, rows, e)
    rounds_recs = round_rows([c for c, _ in cells.values()], rows, e)
    wall = time.time() - t0
    ds = load_dataset(cfg.data)
    summary = {
        "name": e.name, "dataset": ds.name, "seeds": len(e.seeds), "rows": rows, "eval_split": e.eval_split,
        "eval_users": len(final[0]["ranks"]), "eval_candidates": cfg.data.eval_candidates, "rounds": rounds,
        "wall_seconds": round(wall, 1), "computed_cells": computed, "reused_cells": reused,
        "update_max_examples": e.update_max_examples or cfg.update.max_examples, "workers": e.workers,
        "update_steps": cfg.data.update_steps, "group_size": cfg.update.group_size, "alpha": e.alpha,
        "power": e.power, "noninferiority_margin": e.noninferiority_margin,
        "noninferiority_relative_margin": e.noninferiority_relative_margin,
        "noninferiority_alpha": e.noninferiority_alpha, "primary_contrast": e.primary_contrast,
        "bootstrap_samples": e.bootstrap_samples,
        "config": config_ref, "overrides": overrides, "cpu_count": os.cpu_count(),
        "logger": e.logger, "clicks": e.clicks, "log_candidates": e.log_candidates, "regime": describe_regime(cfg),
    }
    outputs = write_outputs(exp_dir, recs, summary, rounds_recs, [c for c, _ in cells.values()])
    with registry.start_run(cfg, e.mlflow_experiment, f"experiment-{e.name}",
                            tags={"abpo.dataset": ds.name, **dict(mlflow_tags or {})}) as run:
        import mlflow

        run_id = run.info.run_id
        mlflow.log_params({k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in summary.items()
                           if k not in ("overrides",)})
        if overrides:
            mlflow.set_tag("abpo.overrides", " ".join(overrides)[:5000])
        for r in recs:
            mlflow.log_metrics({f"{r['row']}.{m.replace('@', '_at_')}": r[m] for m in METRICS})
        for r in rounds_recs:
            mlflow.log_metrics({f"{r['row']}.{m.replace('@', '_at_')}": r[m] for m in ROUND_METRICS
                                if math.isfinite(r[m])}, step=int(r["round"]))
        for p in outputs.values():
            mlflow.log_artifact(str(p))
        for (_, _, _), (cell, was_reused) in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            _log_cell(cell, cfg, was_reused)
    log.info(f"experiment {e.name}: wall time {wall / 60:.1f} min ({computed} cells computed, {reused} reused)")
    return ExperimentResult(exp_dir, recs, outputs, wall, computed, reused, run_id, prep, rounds_recs)
