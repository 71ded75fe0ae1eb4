"""`abpo experiment`: the paper's Table 1 and ablation, reproduced on any dataset the loaders read.

For every seed s (``experiment.seeds``):

    pi_init(s)   next-item pre-training + SFT on D_sup (abpo.policy.sft.train_sft, seed s), trained once per
                 (data, policy, sft, seed) and shared by every experiment and sweep probe:
                 <root>/experiments/_pi_init/<key>/models/pi_init
    rounds       each user's update positions x_{T+1..T+N-1} cut into R = ``experiment.rounds`` windows. In round
                 r every LLM row's round r-1 policy (pi_init for r = 1) logs a fresh D_bandit on window r
                 (abpo.policy.bandit: a ~ e(.|q), y = 1 iff a = x_{t'+1}; other logging regimes, experiment.logger /
                 clicks / log_candidates: abpo.experiment.regimes), then the row trains on it:
                 A none (nothing), B grpo, C anchor, D anchor_snips, E anchor_sc, F abpo (abpo.train.update), the
                 variants beside them G grpo_cr ... L grpo_ll (docs/update-variants.md), and
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

The code, one module per part (this module runs one experiment; each part is imported from its own module):
rows (the rows and the experiment's config), regime_settings (the logging regime's keys, their check and the settings
fingerprints digest), regimes (the logs under each regime), evaluation (the evaluation users and the metrics of their
scores), seeds (pi_init and what a seed's cells share), prepare (a seed's pi_init and shared logs, once), rounds
(computing one cell), match_rates (match rates, off-policy value, training diagnostics), cells (fingerprints, the cell
files and the GRPO controls' update changes), table (the table's records and their paired tests), markdown
(table.md), outputs (the files and plots).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo import registry
from abpo.experiment.cells import (
    cell_fingerprint,
    experiment_dir,
    find_cell,
    row_update_changes,
    save_cell,
)
from abpo.experiment.outputs import write_outputs
from abpo.experiment.prepare import prepare_seed
from abpo.experiment.regime_settings import describe as describe_regime
from abpo.experiment.rounds import (
    run_baseline_cell,
    run_llm_round,
)
from abpo.experiment.rows import (
    experiment_config,
    is_llm_row,
    row_key,
    row_label,
)
from abpo.experiment.seeds import (
    experiments_root,
    load_seed,
)
from abpo.experiment.table import (
    METRICS,
    ROUND_METRICS,
    round_rows,
    table_rows,
)
from abpo.logs import from_workers

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)


def _row_task(cfg: Config, seed: int, row: str, exp_dir: str) -> list[dict]:
    """Every missing round of one (seed, row): rounds run in order, each starting from the previous round's
    model; finished rounds (with their model kept) are skipped. ``cfg`` is the parent's config, pickled."""
    exp = Path(exp_dir)
    ctx = load_seed(cfg, seed)
    if not is_llm_row(row):
        base = run_baseline_cell(ctx, row)
        base["fingerprint"] = cell_fingerprint(cfg, row, seed, cfg.experiment.rounds)
        save_cell(cfg, exp, base)
        return [base]
    rounds = cfg.experiment.rounds
    out, start = [], ctx.pi_init_dir
    for r in range(1, rounds + 1):
        cell = find_cell(cfg, exp, seed, row, r)
        if cell is not None and (r == rounds or Path(cell["model_dir"]).exists()):
            start = Path(cell["model_dir"])
            continue
        fp = cell_fingerprint(cfg, row, seed, r)
        changes = row_update_changes(cfg, exp, seed, row, r)
        cell = run_llm_round(ctx, row, r, start, experiments_root(cfg) / "_runs" / "models" / fp, changes)
        cell["fingerprint"] = fp
        save_cell(cfg, exp, cell)
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


def _log_cell(cell: Mapping, cfg: Config, reused: bool) -> None:
    name = f"seed{cell['seed']}-{cell['row']}" + (f"-r{cell['round']}" if cfg.experiment.rounds > 1 else "")
    with registry.start_run(
        cfg,
        cfg.experiment.mlflow_experiment,
        name,
        nested=True,
        tags={
            "abpo.row": cell["row"],
            "abpo.cell_seed": cell["seed"],
            "abpo.reused": reused,
            "abpo.round": cell.get("round", 1),
        },
    ) as run:
        registry.log_params(
            {"row": cell["row"], "seed": cell["seed"], "eval_users": len(cell["ranks"]), "round": cell.get("round", 1)}
        )
        registry.log_metrics(
            {
                k.replace("@", "_at_"): float(cell[k])
                for k in (*METRICS, "match_positive", "match_no_response")
                if k in cell and math.isfinite(float(cell[k]))
            }
        )
        registry.log_metric("cell_seconds", float(cell["seconds"]))
        # the update's per-step metrics, in batches (one call per step would take minutes for 500-step updates)
        registry.log_step_metrics(run.info.run_id, cell.get("update", {}).get("history", []))


def run_experiment(
    cfg: Config,
    *,
    config_ref: str = "tiny",
    overrides: Sequence[str] = (),
    mlflow_tags: Mapping[str, str] | None = None,
) -> ExperimentResult:
    """Compute every missing cell of the table (in ``experiment.workers`` processes), then the tables, the plots
    and the MLflow runs. The worker processes get ``cfg`` itself (pickled); ``config_ref`` / ``overrides`` only
    say in the summary and in MLflow how it was made. Progress is logged; the workers' lines come through this
    process's loggers."""
    from abpo.data.loaders import load_dataset

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
    cells, todo, reused = _done_cells(cfg, exp_dir, rows)
    total = len(e.seeds) * (sum(rounds if is_llm_row(r) else 1 for r in rows))
    log.info(
        f"experiment {e.name}: {total} cells ({len(rows)} rows x {len(e.seeds)} seeds x {rounds} round(s)), "
        f"{reused} already done, {len(todo)} row chain(s) to compute with {e.workers} worker(s); directory "
        f"{exp_dir}"
    )
    prep: list[dict] = []
    computed = 0
    if todo:
        prep, computed = _compute_cells(cfg, exp_dir, todo, cells, reused=reused, total=total, t0=t0)
    final = [cells[(s, r, rounds)][0] for s in e.seeds for r in rows]
    recs = table_rows(final, rows, e)
    rounds_recs = round_rows([c for c, _ in cells.values()], rows, e)
    wall = time.time() - t0
    ds = load_dataset(cfg.data)
    summary = _summary(
        cfg, ds, rows, final, wall=wall, computed=computed, reused=reused, config_ref=config_ref, overrides=overrides
    )
    outputs = write_outputs(exp_dir, recs, summary, rounds_recs, [c for c, _ in cells.values()])
    run_id = _log_experiment_run(cfg, ds, summary, overrides, recs, rounds_recs, outputs, cells, mlflow_tags)
    log.info(f"experiment {e.name}: wall time {wall / 60:.1f} min ({computed} cells computed, {reused} reused)")
    return ExperimentResult(exp_dir, recs, outputs, wall, computed, reused, run_id, prep, rounds_recs)


def _done_cells(
    cfg: Config, exp_dir: Path, rows: list[str]
) -> tuple[dict[tuple[int, str, int], tuple[dict, bool]], list[tuple[int, str]], int]:
    """(cells already on disk by (seed, row, round) -> (cell, reused=True), the (seed, row) chains with a round
    missing, the number of cells found)."""
    e = cfg.experiment
    rounds = e.rounds
    cells: dict[tuple[int, str, int], tuple[dict, bool]] = {}
    todo: list[tuple[int, str]] = []
    reused = 0
    for seed in e.seeds:
        for row in rows:
            row_rounds = range(1, rounds + 1) if is_llm_row(row) else [rounds]
            found = {r: find_cell(cfg, exp_dir, seed, row, r) for r in row_rounds}
            for r, cell in found.items():
                if cell is not None:
                    cells[(seed, row, r)] = (cell, True)
                    reused += 1
            if any(c is None for c in found.values()):
                todo.append((seed, row))
    return cells, todo, reused


def _compute_cells(
    cfg: Config,
    exp_dir: Path,
    todo: list[tuple[int, str]],
    cells: dict[tuple[int, str, int], tuple[dict, bool]],
    *,
    reused: int,
    total: int,
    t0: float,
) -> tuple[list[dict], int]:
    """Compute the ``todo`` chains in ``experiment.workers`` spawned processes (each seed prepared first; grpo_lr
    after its seed's abpo chain), adding their cells to ``cells`` (reused=False); returns (the seeds'
    preparations, the number of cells computed). A failed cell stops the run with its own error."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    e = cfg.experiment
    prep: list[dict] = []
    computed = 0
    seeds_needed = sorted({s for s, _ in todo})
    spawn = mp.get_context("spawn")
    with (
        from_workers(spawn) as (init_logging, logging_args),
        ProcessPoolExecutor(
            max_workers=max(1, e.workers), mp_context=spawn, initializer=init_logging, initargs=logging_args
        ) as pool,
    ):
        # a future -> (kind, seed, row): "prep" (prepare_seed's dict; row "") or "row" (_row_task's list of cells)
        pending: dict[Future[Any], tuple[str, int, str]] = {
            pool.submit(prepare_seed, cfg, s): ("prep", s, "") for s in seeds_needed
        }
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
                        log.info(
                            f"[{reused + computed}/{total}] seed {seed} {row_label(row)}: HR@5 "
                            f"{last['HR@5']:.4f} ({time.time() - t0:.0f}s elapsed)"
                        )
    return prep, computed


def _summary(
    cfg: Config,
    ds,
    rows: list[str],
    final: list[dict],
    *,
    wall: float,
    computed: int,
    reused: int,
    config_ref: str,
    overrides: list[str],
) -> dict[str, Any]:
    """The experiment's summary (summary.json, the MLflow run's parameters): what was run, on what, how long."""
    e = cfg.experiment
    rounds = e.rounds
    return {
        "name": e.name,
        "dataset": ds.name,
        "seeds": len(e.seeds),
        "rows": rows,
        "eval_split": e.eval_split,
        "eval_users": len(final[0]["ranks"]),
        "eval_candidates": cfg.data.eval_candidates,
        "rounds": rounds,
        "wall_seconds": round(wall, 1),
        "computed_cells": computed,
        "reused_cells": reused,
        "update_max_examples": e.update_max_examples or cfg.update.max_examples,
        "workers": e.workers,
        "update_steps": cfg.data.update_steps,
        "group_size": cfg.update.group_size,
        "alpha": e.alpha,
        "power": e.power,
        "noninferiority_margin": e.noninferiority_margin,
        "noninferiority_relative_margin": e.noninferiority_relative_margin,
        "noninferiority_alpha": e.noninferiority_alpha,
        "primary_contrast": e.primary_contrast,
        "bootstrap_samples": e.bootstrap_samples,
        "config": config_ref,
        "overrides": overrides,
        "cpu_count": os.cpu_count(),
        "logger": e.logger,
        "clicks": e.clicks,
        "log_candidates": e.log_candidates,
        "regime": describe_regime(cfg),
    }


def _log_experiment_run(
    cfg: Config,
    ds,
    summary: dict[str, Any],
    overrides: list[str],
    recs: list[dict],
    rounds_recs: list[dict],
    outputs: dict,
    cells: dict[tuple[int, str, int], tuple[dict, bool]],
    mlflow_tags: Mapping[str, str] | None,
) -> str:
    """The experiment's MLflow run: the summary as parameters, the overrides as a tag, the table's and the rounds'
    metrics, the output files, then one nested run per cell; returns the run id."""
    e = cfg.experiment
    with registry.start_run(
        cfg, e.mlflow_experiment, f"experiment-{e.name}", tags={"abpo.dataset": ds.name, **dict(mlflow_tags or {})}
    ) as run:
        run_id = run.info.run_id
        registry.log_params(
            {
                k: (",".join(map(str, v)) if isinstance(v, list) else v)
                for k, v in summary.items()
                if k not in ("overrides",)
            }
        )
        if overrides:
            registry.set_tag("abpo.overrides", " ".join(overrides)[:5000])
        for r in recs:
            registry.log_metrics({f"{r['row']}.{m.replace('@', '_at_')}": r[m] for m in METRICS})
        for r in rounds_recs:
            registry.log_metrics(
                {f"{r['row']}.{m.replace('@', '_at_')}": r[m] for m in ROUND_METRICS if math.isfinite(r[m])},
                step=int(r["round"]),
            )
        for p in outputs.values():
            registry.log_artifact(p)
        for (_, _, _), (cell, was_reused) in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            _log_cell(cell, cfg, was_reused)
    return run_id
