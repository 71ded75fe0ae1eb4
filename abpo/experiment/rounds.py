"""Computing one cell: an LLM row's round (log the round's window under the regime, train the row on it, score
the evaluation users and the match rates) or a baseline's fit on the same training data."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from abpo.baselines import make_ranker
from abpo.experiment.evaluation import metrics_from_scores
from abpo.experiment.match_rates import logged_match_rates, match_rates, policy_scores
from abpo.experiment.regime_settings import LOGGING_ARM, shared_kind
from abpo.experiment.regimes import round_log, shared_log, window_requests
from abpo.experiment.rows import FULL_INFO, variant_of
from abpo.experiment.seeds import SeedContext, load_model
from abpo.months import Month
from abpo.policy.model import save_policy
from abpo.policy.sft import run_sft, sft_records
from abpo.train.runs import UpdateRun

log = logging.getLogger("abpo.experiment.runner")  # the experiment's progress lines keep the runner's logger


def training_sequences(ctx: SeedContext, logs: Sequence | None = None) -> dict[int, list[int]]:
    """What the baselines are trained on, the same information the LLM rows saw: every user's x_{1:T} (pi_init's
    D_sup) followed by the items they clicked in pi_init's logs (chronological). No-responses are not
    interactions. ``logs``: those logs (default: every round's shared log of the regime,
    abpo.experiment.regimes.shared_log: pi_init's, or the pi_init / foreign / uniform logger's)."""
    import pyarrow as pa

    if logs is None:
        rounds = ctx.cfg.experiment.rounds
        logs = [shared_log(ctx, r, rounds, shared_kind(ctx.cfg)) for r in range(1, rounds + 1)]
    seqs = {int(s.user_id): list(map(int, s.history)) for s in ctx.splits}
    t = pa.concat_tables([lg.select(["user_id", "event_time", "item_id", "clicked"]) for lg in logs]).sort_by(
        [("user_id", "ascending"), ("event_time", "ascending")]
    )
    for u, item, y in zip(
        t.column("user_id").to_pylist(), t.column("item_id").to_pylist(), t.column("clicked").to_pylist()
    ):
        if y == 1:
            seqs.setdefault(int(u), []).append(int(item))
    return seqs


def _step_logger(prefix: str):
    """A TrainerCallback logging a cell's update progress every 50 steps (the update runs without a progress bar:
    cells share the console)."""
    from transformers import TrainerCallback

    class StepLogger(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 50 == 0 or state.global_step == state.max_steps:
                log.info(f"{prefix} update step {state.global_step}/{state.max_steps}")

    return StepLogger()


def update_round(
    ctx: SeedContext,
    row: str,
    start_dir: Path,
    bandit_log,
    out_dir: Path,
    prefix: str,
    update_changes: Mapping[str, Any] | None = None,
) -> dict:
    """Train the row's round: a variant's update of ``start_dir`` on ``bandit_log`` into ``out_dir``
    (abpo.train.update.run_update), from scratch (no resume), on ``experiment.update_max_examples`` rows.
    ``update_changes``: section update's fields a control row changes (row_update_changes)."""
    import pyarrow.compute as pc

    from abpo.train.update import run_update

    u = dataclasses.replace(
        ctx.cfg.update,
        resume=False,
        max_examples=ctx.cfg.experiment.update_max_examples or ctx.cfg.update.max_examples,
        **dict(update_changes or {}),
    )
    run = UpdateRun(
        variant=variant_of(row),
        arm="",
        months=(Month(ctx.cfg.experiment.month, "update month"),),
        init_model=start_dir,
        output=out_dir,
    )
    pos = bandit_log.filter(pc.equal(bandit_log.column("clicked"), 1))
    neg = bandit_log.filter(pc.equal(bandit_log.column("clicked"), 0))
    res = run_update(
        dataclasses.replace(ctx.cfg, update=u),
        run,
        progress=False,
        strata=(pos, neg),
        log_mlflow=False,
        callbacks=[_step_logger(prefix)],
    )
    return {
        "model_dir": str(res.model_dir),
        "steps": res.global_step,
        "final": res.metrics,
        "history": res.history,
        "batching": res.batching,
    }


def full_info_round(ctx: SeedContext, start_dir: Path, requests: list, out_dir: Path) -> dict:
    """The upper reference: next-item fine-tuning of ``start_dir`` on the true next item x_{t'+1} of every request
    of the window (the answer-format SFT loss, sft.loss_tokens), one epoch at experiment.full_info_learning_rate:
    what complete feedback on the same positions would teach."""
    import shutil

    import torch

    torch.manual_seed(ctx.cfg.seed)
    model, tok = load_model(ctx, start_dir)
    model.train()
    records = sft_records(requests, ctx.dataset.titles(), tok, ctx.cfg.policy, ctx.cfg.sft.loss_tokens)
    c = dataclasses.replace(
        ctx.cfg,
        sft=dataclasses.replace(
            ctx.cfg.sft, learning_rate=ctx.cfg.experiment.full_info_learning_rate, epochs=1, max_steps=-1
        ),
    )
    work = out_dir.with_name(f".{out_dir.name}.trainer")
    trained, history = run_sft(model, tok, records, c, work)
    shutil.rmtree(work, ignore_errors=True)
    save_policy(trained, tok, out_dir)
    losses = [h["loss"] for h in history if "loss" in h]
    return {
        "model_dir": str(out_dir),
        "examples": len(records),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }


def run_baseline_cell(ctx: SeedContext, row: str) -> dict[str, Any]:
    """A baseline's cell: fit on x_{1:T} + the clicks of pi_init's logs, score the evaluation users."""

    prefix = f"[seed {ctx.cfg.seed} {row}]"
    t0 = time.time()
    ranker = make_ranker(row, seed=ctx.cfg.seed, ml_retrain_epochs=ctx.cfg.experiment.ml_retrain_epochs)
    seqs = training_sequences(ctx)
    log.info(f"{prefix} fitting on {sum(len(s) for s in seqs.values())} interactions of {len(seqs)} users")
    ranker.fit(seqs, ctx.dataset.item_ids().tolist())
    scores = ranker.score([(ex.user_id, ex.history, ex.candidates) for ex in ctx.eval_examples])
    out: dict[str, Any] = {"row": row, "seed": ctx.cfg.seed, "round": ctx.cfg.experiment.rounds}
    out.update(
        metrics_from_scores(
            ctx.eval_examples, [np.asarray(s, dtype=np.float64).tolist() for s in scores], ctx.popularity
        )
    )
    out["seconds"] = round(time.time() - t0, 1)
    log.info(f"{prefix} HR@5 {out['HR@5']:.4f} NDCG@5 {out['NDCG@5']:.4f} in {out['seconds']:.0f}s")
    return out


def run_llm_round(
    ctx: SeedContext, row: str, r: int, start_dir: Path, out_dir: Path, update_changes: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One (seed, LLM row, round) cell: log window r under the regime (abpo.experiment.regimes.round_log: the start
    policy logs on-policy), train the row on it, score the evaluation users and the match rates on the round's log.
    Returns the cell (with ``model_dir``)."""
    from abpo.algo.variants import get_variant

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
    model, tok = load_model(ctx, model_dir)
    log.info(f"{prefix} scoring {len(ctx.eval_examples)} users and {bandit_log.num_rows} logged exposures")
    # a row that trained nothing this round (No-Update) is the policy that logged it if it logged on-policy or
    # pi_init logged it: its rates are in the log
    own_log = set(loggers) <= {"pi_init", "policy"}
    out.update(
        logged_match_rates(bandit_log)
        if (model_dir == start_dir and own_log)
        else match_rates(model, tok, ctx, bandit_log)
    )
    out.update(
        metrics_from_scores(
            ctx.eval_examples,
            [s.scores.tolist() for s in policy_scores(model, tok, ctx, ctx.eval_examples)],
            ctx.popularity,
        )
    )
    out["model_dir"] = str(model_dir)
    out["seconds"] = round(time.time() - t0, 1)
    log.info(
        f"{prefix} HR@5 {out['HR@5']:.4f} NDCG@5 {out['NDCG@5']:.4f} match pos {out['match_positive']:.3f} "
        f"no-resp {out['match_no_response']:.3f} in {out['seconds']:.0f}s"
    )
    return out
