"""`abpo experiment`: the paper's Table 1 and ablation, reproduced on any dataset the loaders read.

For every seed s (``experiment.seeds``):

    pi_init(s)   SFT on D_sup (abpo.policy.sft.train_sft, seed s)                          <exp>/seed<s>/models/pi_init
    D_bandit(s)  pi_init(s) logs one exposure per bandit request (abpo.policy.bandit)         <exp>/seed<s>/d_bandit.parquet
    cells        one per table row, all ranked on the same evaluation candidates:
                 A none (pi_init itself), B grpo, C anchor, D anchor_snips, E anchor_sc, F abpo (each an update of
                 pi_init(s) on D_bandit(s), abpo.train.update.run_update), popularity and ml_retrain (abpo.baselines,
                 fitted on the same training data: every user's x_{1:T} plus the clicked exposures of D_bandit(s))

A cell is saved as JSON (<exp>/cells/seed<s>-<row>.json: metrics, the per-user ranks, the update's per-step
metrics); a rerun skips every finished cell whose settings are unchanged. Cells run in ``experiment.workers``
processes; progress is printed per cell.

Evaluation (ABPO_SPEC.md "Metrics"): HR@1, HR@5, NDCG@5, Diversity@1, Diversity@5 of the held-out target
x_{T+N} among its candidates, on the users of ``experiment.eval_split`` (test, or validation: a fixed salted-hash
split of the users, so nothing is chosen on the test targets). The table: mean ± std over seeds, and paired tests
over (seed, user) units of each row against No-Update (A) and against vanilla GRPO (B): McNemar's exact test on
HR@5 hits and Wilcoxon's signed-rank test on NDCG@5.

Outputs in <exp>/: table.csv, table.md, ablation.png (HR@5 and NDCG@5, mean ± std), experiment.json; all logged
to MLflow (``experiment.mlflow_experiment``: a parent run, a nested run per cell).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from abpo.data.splits import VALIDATION_SALT as SPLIT_SALT, split_of_user  # noqa: F401 (re-exported)

KS = (1, 5)
BASELINES = ("popularity", "ml_retrain")


# ------------------------------------------------------------------------------------------------- rows


def row_key(row: str) -> str:
    """A row's canonical name: a variant's config name (none, grpo, ..., abpo) or a baseline name."""
    from abpo.algo.variants import get_variant

    if row in BASELINES:
        return row
    try:
        return get_variant(row).name
    except ValueError:
        raise ValueError(
            f"experiment.rows: {row!r}; rule: a variant (A-F or none, grpo, anchor, anchor_snips, anchor_sc, abpo) "
            f"or a baseline ({', '.join(BASELINES)})"
        ) from None


def row_label(row: str) -> str:
    """How a row is named in the table (the paper's)."""
    from abpo.algo.variants import get_variant

    if row == "popularity":
        return "Popularity"
    if row == "ml_retrain":
        return "ML-retrain"
    v = get_variant(row)
    names = {"A": "No-Update", "B": "Vanilla GRPO", "F": "ABPO"}
    return f"({v.letter}) {names.get(v.letter, v.description)}"


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


@dataclass
class SeedContext:
    """Everything a seed's cells share (loaded in the worker process)."""

    cfg: Any
    seed_dir: Path
    dataset: Any
    splits: list
    eval_examples: list
    popularity: dict[int, int]
    pi_init_dir: Path
    d_bandit: Any  # pyarrow Table (IMPRESSIONS_SCHEMA)


def seed_config(cfg, seed: int, exp_dir: Path):
    """The config of one seed: seed, its own state directory (models, checkpoints), quiet MLflow-free steps."""
    c = dataclasses.replace(cfg, seed=int(seed))
    c.paths = dataclasses.replace(cfg.paths, root=str(exp_dir / f"seed{seed}"))
    c.sft = dataclasses.replace(cfg.sft, output="pi_init")
    return c


def prepare_seed(cfg, seed: int, exp_dir: Path, echo=print) -> dict[str, Any]:
    """pi_init(seed) and D_bandit(seed), each computed once (kept under <exp>/seed<seed>/)."""
    import pyarrow.parquet as pq

    from abpo.data.loaders import load_dataset
    from abpo.policy.bandit import build_bandit_log
    from abpo.policy.sft import train_sft

    c = seed_config(cfg, seed, exp_dir)
    seed_dir = c.paths.resolve("root")
    seed_dir.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(c.data)
    pi_dir = c.paths.resolve("models") / "pi_init"
    t0 = time.time()
    done = {}
    if not (pi_dir / "abpo_sft.json").exists():
        echo(f"[seed {seed}] SFT of pi_init on D_sup ...")
        train_sft(c, dataset=ds, log_mlflow=False, register=False, evaluate=False, echo=lambda *_: None)
        done["sft_seconds"] = round(time.time() - t0, 1)
    log_path = seed_dir / "d_bandit.parquet"
    if not log_path.exists():
        echo(f"[seed {seed}] D_bandit logged by pi_init ...")
        t1 = time.time()
        table = build_bandit_log(c, month=cfg.experiment.month, arm="abpo", dataset=ds, write=False, progress=False,
                                 model_version=f"pi_init-seed{seed}")
        tmp = log_path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        tmp.replace(log_path)
        done["bandit_seconds"] = round(time.time() - t1, 1)
    table = pq.read_table(log_path)
    clicks = int(sum(table.column("clicked").to_pylist()))
    echo(f"[seed {seed}] pi_init and D_bandit ready ({table.num_rows} logged rows, {clicks} clicks)")
    return {"seed": seed, "rows": table.num_rows, "clicks": clicks, **done}


def load_seed(cfg, seed: int, exp_dir: Path) -> SeedContext:
    import pyarrow.parquet as pq

    from abpo.data.candidates import training_popularity
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    c = seed_config(cfg, seed, exp_dir)
    seed_dir = c.paths.resolve("root")
    ds = load_dataset(c.data)
    splits, _ = split_users(ds, c.data)
    return SeedContext(
        cfg=c, seed_dir=seed_dir, dataset=ds, splits=splits, eval_examples=eval_examples_for(c, splits, ds),
        popularity=training_popularity(splits, ds), pi_init_dir=c.paths.resolve("models") / "pi_init",
        d_bandit=pq.read_table(seed_dir / "d_bandit.parquet"),
    )


# ------------------------------------------------------------------------------------------------ cells


def training_sequences(ctx: SeedContext) -> dict[int, list[int]]:
    """What the baselines are trained on, the same information the LLM rows saw: every user's x_{1:T} (pi_init's
    D_sup) followed by the items they clicked in D_bandit (chronological). No-responses are not interactions."""
    seqs = {int(s.user_id): list(map(int, s.history)) for s in ctx.splits}
    t = ctx.d_bandit.sort_by([("user_id", "ascending"), ("event_time", "ascending")])
    for u, item, y in zip(t.column("user_id").to_pylist(), t.column("item_id").to_pylist(), t.column("clicked").to_pylist()):
        if y == 1:
            seqs.setdefault(int(u), []).append(int(item))
    return seqs


def _llm_scores(ctx: SeedContext, model_dir: Path) -> list[list[float]]:
    from abpo.policy.model import load_policy
    from abpo.policy.scoring import score_examples

    model, tok = load_policy(dataclasses.replace(ctx.cfg.policy, model=str(model_dir)), ctx.cfg.paths, dataset=ctx.dataset)
    model.eval()
    scored = score_examples(model, tok, ctx.eval_examples, ctx.dataset.titles(), ctx.cfg.policy)
    return [s.scores.tolist() for s in scored]


def _step_echo(prefix: str, echo):
    """A TrainerCallback printing a cell's update progress every 10 steps (cells run in worker processes)."""
    from transformers import TrainerCallback

    class StepEcho(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 10 == 0 or state.global_step == state.max_steps:
                echo(f"{prefix} update step {state.global_step}/{state.max_steps}")

    return StepEcho()


def run_cell(ctx: SeedContext, row: str, echo=print) -> dict[str, Any]:
    """One cell of the table: train (or fit) the row's model for this seed and score the evaluation users."""
    import pyarrow.compute as pc

    from abpo.algo.variants import get_variant

    prefix = f"[seed {ctx.cfg.seed} {row}]"
    t0 = time.time()
    out: dict[str, Any] = {"row": row, "seed": ctx.cfg.seed}
    if row in BASELINES:
        from abpo.baselines import make_ranker

        ranker = make_ranker(row, ctx.cfg, seed=ctx.cfg.seed)
        seqs = training_sequences(ctx)
        echo(f"{prefix} fitting on {sum(len(s) for s in seqs.values())} interactions of {len(seqs)} users")
        ranker.fit(seqs, ctx.dataset.item_ids().tolist())
        scores = ranker.score([(ex.user_id, ex.history, ex.candidates) for ex in ctx.eval_examples])
        scores = [np.asarray(s, dtype=np.float64).tolist() for s in scores]
    else:
        v = get_variant(row)
        model_dir = ctx.pi_init_dir
        if v.update:
            from abpo.train.update import run_update

            u = dataclasses.replace(
                ctx.cfg.update, variant=v.name, output_name=f"update-{v.name}", init_model=str(ctx.pi_init_dir),
                months=[ctx.cfg.experiment.month], resume=False,
                max_examples=ctx.cfg.experiment.update_max_examples or ctx.cfg.update.max_examples,
            )
            c = dataclasses.replace(ctx.cfg, update=u)
            pos = ctx.d_bandit.filter(pc.equal(ctx.d_bandit.column("clicked"), 1))
            neg = ctx.d_bandit.filter(pc.equal(ctx.d_bandit.column("clicked"), 0))
            res = run_update(c, progress=False, strata=(pos, neg, [ctx.cfg.experiment.month]), log_mlflow=False,
                             callbacks=[_step_echo(prefix, echo)])
            model_dir = res.model_dir
            out["update"] = {"steps": res.global_step, "final": res.metrics, "history": res.history,
                             "batching": res.batching}
            out["update_seconds"] = round(time.time() - t0, 1)
        echo(f"{prefix} scoring {len(ctx.eval_examples)} users")
        scores = _llm_scores(ctx, model_dir)
    out.update(metrics_from_scores(ctx.eval_examples, scores, ctx.popularity))
    out["seconds"] = round(time.time() - t0, 1)
    echo(f"{prefix} HR@5 {out['HR@5']:.4f} NDCG@5 {out['NDCG@5']:.4f} in {out['seconds']:.0f}s")
    return out


# ---------------------------------------------------------------------------------------------- the table


def paired_tests(cells_a: Sequence[Mapping], cells_b: Sequence[Mapping]) -> dict[str, float]:
    """Row a against row b over (seed, user) units (the same users and candidates in both): McNemar's exact test
    on HR@5 hits (two-sided binomial test of the discordant pairs) and Wilcoxon's signed-rank test on NDCG@5.
    Differences are a minus b."""
    from scipy.stats import binomtest, wilcoxon

    by_seed_b = {int(c["seed"]): c for c in cells_b}
    hit_a, hit_b, nd_a, nd_b = [], [], [], []
    for ca in cells_a:
        cb = by_seed_b.get(int(ca["seed"]))
        if cb is None:
            continue
        if ca["users"] != cb["users"]:
            raise ValueError(f"seed {ca['seed']}: rows {ca['row']} and {cb['row']} were scored on different users")
        ra, rb = np.asarray(ca["ranks"]), np.asarray(cb["ranks"])
        hit_a.append(ra <= 5)
        hit_b.append(rb <= 5)
        nd_a.append(np.where(ra <= 5, 1.0 / np.log2(ra + 1.0), 0.0))
        nd_b.append(np.where(rb <= 5, 1.0 / np.log2(rb + 1.0), 0.0))
    if not hit_a:
        return {}
    ha, hb = np.concatenate(hit_a), np.concatenate(hit_b)
    da = np.concatenate(nd_a) - np.concatenate(nd_b)
    b, c = int((ha & ~hb).sum()), int((~ha & hb).sum())
    p_mcnemar = float(binomtest(min(b, c), b + c, 0.5).pvalue) if b + c else 1.0
    p_wilcoxon = float(wilcoxon(da).pvalue) if np.any(da != 0) else 1.0
    return {
        "units": int(len(ha)), "dHR@5": float(ha.mean() - hb.mean()), "hr5_wins": b, "hr5_losses": c,
        "p_mcnemar_HR@5": p_mcnemar, "dNDCG@5": float(da.mean()), "p_wilcoxon_NDCG@5": p_wilcoxon,
    }


METRICS = ("HR@1", "HR@5", "NDCG@5", "Diversity@1", "Diversity@5")


def table_rows(cells: Sequence[Mapping], rows: Sequence[str]) -> list[dict[str, Any]]:
    """One dict per row: mean and std over seeds of every metric, and the paired tests against A and B."""
    by_row: dict[str, list[Mapping]] = {}
    for c in cells:
        by_row.setdefault(c["row"], []).append(c)
    out = []
    for row in rows:
        cs = sorted(by_row.get(row, []), key=lambda c: c["seed"])
        if not cs:
            continue
        rec: dict[str, Any] = {"row": row, "label": row_label(row), "seeds": len(cs)}
        for m in METRICS:
            vals = np.array([c[m] for c in cs], dtype=np.float64)
            rec[m] = float(vals.mean())
            rec[f"{m}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        for ref in ("none", "grpo"):
            if row != ref and ref in by_row:
                for k, v in paired_tests(cs, by_row[ref]).items():
                    rec[f"vs_{ref}_{k}"] = v
        out.append(rec)
    return out


def _fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def table_markdown(recs: Sequence[Mapping], *, title: str, note: str = "") -> str:
    head = ["Row", *METRICS, "ΔHR@5 vs A (p)", "ΔNDCG@5 vs A (p)", "ΔHR@5 vs B (p)", "ΔNDCG@5 vs B (p)"]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in recs:
        cells = [r["label"]]
        for m in METRICS:
            digits = 2 if m.startswith("Diversity") else 4  # Diversity is on a 0-100 scale
            cells.append(f"{r[m]:.{digits}f} ± {r[m + '_std']:.{digits}f}")
        for ref in ("none", "grpo"):
            for d, p in (("dHR@5", "p_mcnemar_HR@5"), ("dNDCG@5", "p_wilcoxon_NDCG@5")):
                key = f"vs_{ref}_{d}"
                cells.append(f"{r[key]:+.4f} ({_fmt_p(r[f'vs_{ref}_{p}'])})" if key in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def write_outputs(exp_dir: Path, recs: Sequence[Mapping], summary: Mapping[str, Any]) -> dict[str, Path]:
    """table.csv, table.md, ablation.png and experiment.json in ``exp_dir`` (each written then renamed)."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {k: exp_dir / n for k, n in (("csv", "table.csv"), ("md", "table.md"), ("png", "ablation.png"),
                                          ("json", "experiment.json"))}
    tmp = {k: p.with_name(p.name + ".tmp") for k, p in paths.items()}
    keys = sorted({k for r in recs for k in r}, key=lambda k: (k not in ("row", "label", "seeds"), k))
    with open(tmp["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in recs:
            w.writerow(r)
    note = (f"{summary['eval_users']} {summary['eval_split']} users x {summary['seeds']} seeds; mean ± std over seeds; "
            "paired tests over (seed, user): McNemar exact on HR@5, Wilcoxon signed-rank on NDCG@5. "
            f"Wall time {summary['wall_seconds'] / 60:.1f} min.")
    tmp["md"].write_text(table_markdown(recs, title=f"{summary['dataset']}: {summary['name']}", note=note))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [r["label"] for r in recs]
    for ax, m in zip(axes, ("HR@5", "NDCG@5")):
        ax.bar(range(len(recs)), [r[m] for r in recs], yerr=[r[m + "_std"] for r in recs], capsize=4,
               color=["#d62728" if r["row"] == "abpo" else "#1f77b4" if r["row"] not in BASELINES else "#7f7f7f"
                      for r in recs])
        ax.set_xticks(range(len(recs)), labels, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{m} (mean ± std over {summary['seeds']} seeds)")
    fig.tight_layout()
    fig.savefig(tmp["png"], dpi=110, format="png")
    plt.close(fig)
    tmp["json"].write_text(json.dumps({"summary": summary, "table": list(recs)}, indent=1, default=str))
    for k in paths:
        tmp[k].replace(paths[k])
    return paths


# ----------------------------------------------------------------------------------------- orchestration


def cell_fingerprint(cfg, row: str) -> str:
    """What a cell's result depends on: the data, policy, SFT, update (for variants) and experiment settings."""
    d = {k: dataclasses.asdict(getattr(cfg, k)) for k in ("data", "policy", "sft")}
    updates = row not in BASELINES and row_key(row) != "none"  # A is pi_init itself: no update setting matters
    d["update"] = dataclasses.asdict(cfg.update) if updates else None
    e = dataclasses.asdict(cfg.experiment)
    keys = ["eval_split", "validation_fraction", "max_eval_users", "month"]
    keys += ["update_max_examples"] if updates else []
    keys += ["ml_retrain_epochs"] if row == "ml_retrain" else []
    d["experiment"] = {k: e[k] for k in keys}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def experiment_dir(cfg) -> Path:
    return cfg.paths.resolve("root") / "experiments" / cfg.experiment.name


def _cell_path(exp_dir: Path, seed: int, row: str) -> Path:
    return exp_dir / "cells" / f"seed{seed}-{row}.json"


def _load_cell(path: Path, fingerprint: str) -> dict | None:
    if not path.exists():
        return None
    cell = json.loads(path.read_text())
    return cell if cell.get("fingerprint") == fingerprint else None


def _worker_config(config_ref: str, overrides: list[str]):
    from abpo.config import load_config

    return load_config(config_ref, overrides)


def _prepare_task(config_ref: str, overrides: list[str], seed: int, exp_dir: str) -> dict:
    cfg = _worker_config(config_ref, overrides)
    return prepare_seed(cfg, seed, Path(exp_dir), echo=lambda m: print(m, flush=True))


def _cell_task(config_ref: str, overrides: list[str], seed: int, row: str, exp_dir: str) -> dict:
    cfg = _worker_config(config_ref, overrides)
    ctx = load_seed(cfg, seed, Path(exp_dir))
    cell = run_cell(ctx, row, echo=lambda m: print(m, flush=True))
    cell["fingerprint"] = cell_fingerprint(cfg, row)
    path = _cell_path(Path(exp_dir), seed, row)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cell))
    tmp.replace(path)
    return cell


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


def _log_cell(cell: Mapping, cfg, reused: bool) -> None:
    import mlflow

    from abpo import registry

    with registry.start_run(cfg, cfg.experiment.mlflow_experiment, f"seed{cell['seed']}-{cell['row']}", nested=True,
                            tags={"abpo.row": cell["row"], "abpo.cell_seed": cell["seed"], "abpo.reused": reused}):
        mlflow.log_params({"row": cell["row"], "seed": cell["seed"], "eval_users": len(cell["ranks"])})
        mlflow.log_metrics({k.replace("@", "_at_"): float(cell[k]) for k in METRICS + ("NDCG@1",) if k in cell})
        mlflow.log_metric("cell_seconds", float(cell["seconds"]))
        for i, h in enumerate(cell.get("update", {}).get("history", []), 1):
            mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in h.items() if math.isfinite(v)}, step=i)


def run_experiment(cfg, *, config_ref: str = "tiny", overrides: Sequence[str] = (), echo=print) -> ExperimentResult:
    """Compute every missing cell of the table (in ``experiment.workers`` processes), then the table, the plot and
    the MLflow runs. ``config_ref`` / ``overrides`` rebuild the same config in the worker processes."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from abpo import registry
    from abpo.data.loaders import load_dataset

    t0 = time.time()
    e = cfg.experiment
    rows = [row_key(r) for r in e.rows]
    if len(set(rows)) != len(rows):
        raise ValueError(f"experiment.rows: {e.rows} names a row twice")
    if not e.seeds:
        raise ValueError("experiment.seeds: rule: at least one seed")
    exp_dir = experiment_dir(cfg)
    exp_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(overrides)
    todo, cells, reused = [], {}, 0
    for seed in e.seeds:
        for row in rows:
            cell = _load_cell(_cell_path(exp_dir, seed, row), cell_fingerprint(cfg, row))
            if cell is None:
                todo.append((seed, row))
            else:
                cells[(seed, row)] = (cell, True)
                reused += 1
    total = len(e.seeds) * len(rows)
    echo(f"experiment {e.name}: {total} cells ({len(rows)} rows x {len(e.seeds)} seeds), {reused} already done, "
         f"{len(todo)} to compute with {e.workers} worker(s); directory {exp_dir}")
    prep: list[dict] = []
    if todo:
        seeds_needed = sorted({s for s, _ in todo})
        with ProcessPoolExecutor(max_workers=max(1, e.workers), mp_context=mp.get_context("spawn")) as pool:
            pending = {pool.submit(_prepare_task, config_ref, overrides, s, str(exp_dir)): ("prep", s, None)
                       for s in seeds_needed}
            done_n = reused
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    kind, seed, row = pending.pop(fut)
                    result = fut.result()  # a failed cell stops the run with its own error
                    if kind == "prep":
                        prep.append(result)
                        for s2, r2 in todo:
                            if s2 == seed:
                                pending[pool.submit(_cell_task, config_ref, overrides, s2, r2, str(exp_dir))] = ("cell", s2, r2)
                    else:
                        done_n += 1
                        cells[(seed, row)] = (result, False)
                        echo(f"[{done_n}/{total}] seed {seed} {row_label(row)}: HR@5 {result['HR@5']:.4f} "
                             f"({time.time() - t0:.0f}s elapsed)")
    all_cells = [cells[(s, r)][0] for s in e.seeds for r in rows]
    recs = table_rows(all_cells, rows)
    wall = time.time() - t0
    ds = load_dataset(cfg.data)
    summary = {
        "name": e.name, "dataset": ds.name, "seeds": len(e.seeds), "rows": rows, "eval_split": e.eval_split,
        "eval_users": len(all_cells[0]["ranks"]), "eval_candidates": cfg.data.eval_candidates,
        "wall_seconds": round(wall, 1), "computed_cells": len(todo), "reused_cells": reused,
        "update_max_examples": e.update_max_examples or cfg.update.max_examples, "workers": e.workers,
        "config": config_ref, "overrides": overrides, "cpu_count": os.cpu_count(),
    }
    outputs = write_outputs(exp_dir, recs, summary)
    run_id = None
    with registry.start_run(cfg, e.mlflow_experiment, f"experiment-{e.name}", tags={"abpo.dataset": ds.name}) as run:
        import mlflow

        run_id = run.info.run_id
        mlflow.log_params({k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in summary.items()
                           if k not in ("overrides",)})
        for r in recs:
            mlflow.log_metrics({f"{r['row']}.{m.replace('@', '_at_')}": r[m] for m in METRICS})
        for p in outputs.values():
            mlflow.log_artifact(str(p))
        for s in e.seeds:
            for row in rows:
                cell, was_reused = cells[(s, row)]
                _log_cell(cell, cfg, was_reused)
    echo(f"experiment {e.name}: wall time {wall / 60:.1f} min ({len(todo)} cells computed, {reused} reused)")
    return ExperimentResult(exp_dir, recs, outputs, wall, len(todo), reused, run_id, prep)
