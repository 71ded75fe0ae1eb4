"""pi_init's offline quality beside the three non-LLM rankers, on the same users and candidates, in one run.

    .venv/bin/python benchmarks/policy_quality.py [--config tiny] [--set key=value ...] [--state DIR] [--seeds 0,1]
                                                  [--smoke]
    .venv/bin/python benchmarks/policy_quality.py --sasrec-grid hidden_size=32,64 --sasrec-grid dropout=0.2,0.5 \
        --set experiment.eval_split=validation      # the SASRec-CE tuning grid, validation users only

Trains pi_init as `abpo sft` does (stage 1: next-item pre-training when sft.pretrain_epochs > 0; stage 2: the
answer-format SFT on every D_sup pair) into a throw-away state directory, then scores the experiment's test users
(`experiment.eval_split`, `experiment.max_eval_users`; the held-out target x_{T+N} among data.eval_candidates,
data.eval_hard_negative_fraction of the negatives drawn by popularity, and on the full catalog: the target among
every item the user never interacted with) with pi_init, popularity, ML-retrain (implicit ALS) and SASRec-CE
(abpo.baselines.sasrec, config section `sasrec`). The rankers are fitted on what pi_init was trained on: every
user's x_{1:T}; SASRec-CE is early-stopped, as pi_init's stage 1, on the validation users' next items
x_{T+1..T+N-1}. Nothing here is tuned on the reported users: the settings are the preset's, chosen on the
validation users (`--set experiment.eval_split=validation` shows those; `--sasrec-grid` is the SASRec grid).

With several ``--seeds`` everything is retrained per seed (the users, candidates and split follow data.seed and
stay); the interval of pi_init minus each ranker (HR@5, NDCG@5; at M and on the full catalog) is the two-stage
bootstrap of abpo.experiment.stats (Eq. TS: seeds, then users within a seed; with one seed it resamples users
only), experiment.bootstrap_samples replicates, level 1 - experiment.alpha.

Prints each stage's wall and CPU time, HR@1/HR@5/NDCG@5 of every row at M and HR@5/NDCG@5 on the full catalog,
the intervals, then as its last two lines exactly

    pi_init - sasrec: HR@5 <d> [<lo>, <hi>] at M = <m>, <d> [<lo>, <hi>] on the full catalog
    HR@5 pi_init=<v> popularity=<v> ml_retrain=<v> sasrec=<v>

``--sasrec-grid KEY=V1,V2`` (repeatable; keys of section `sasrec`) fits SASRec-CE for every combination on the
same x_{1:T} and scores the users of `experiment.eval_split`, which must be `validation` (a grid is never run on
the test users); it prints each setting's HR@5/NDCG@5 at M and on the full catalog, its epochs and CPU seconds,
the grid's total CPU time, popularity and ALS on the same users (which ML-retrain model is stronger) and the best
setting by HR@5 at M, last line ``best <settings> HR@5=<v>``.

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): 12 users, a smaller tiny model and
SASRec, one pre-training epoch, 4 SFT steps, 8 evaluation users among 10 candidates (the figures mean nothing at
that size).

Works on any dataset the loaders read: `--set data.dataset_dir=DIR` (MovieLens format) or `--config amazon18`
(`--set data.amazon_domain=...`; ../shared/data/amazon18 read in place).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# --smoke: the same stages on 12 users and a smaller tiny model (overrides before the command line's --set)
SMOKE = [
    "data.max_users=12",
    "data.sup_examples_per_user=4",
    "data.train_candidates=8",
    "data.eval_candidates=10",
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=2048",
    "update.max_completion_length=72",  # the catalog's longest answer + EOS in a 2,048-token vocabulary: 69
    "policy.max_history=3",
    "sft.pretrain_epochs=1",
    "sft.max_steps=4",
    "sft.batch_size=8",
    "experiment.max_eval_users=8",
    "experiment.eval_candidates=10",
    "experiment.bootstrap_samples=50",
    "sasrec.max_length=8",
    "sasrec.hidden_size=16",
    "sasrec.epochs=2",
]
ROWS = ("pi_init", "popularity", "ml_retrain", "sasrec")


def full_catalog_examples(examples, splits, ds) -> list:
    """The same users and targets with every catalog item the user never interacted with (x_{1:T+N}) as a
    candidate: the full-catalog ranking, no sampled negatives."""
    import dataclasses

    seqs = {s.user_id: set(s.sequence) for s in splits}
    catalog = [int(i) for i in ds.item_ids()]
    out = []
    for ex in examples:
        seen = seqs[ex.user_id] - {ex.positive}
        out.append(dataclasses.replace(ex, candidates=[i for i in catalog if i not in seen]))
    return out


def parse_grid(items: list[str]) -> list[dict]:
    """``KEY=V1,V2`` items (keys of config section sasrec) -> every combination as a dict of typed values."""
    import dataclasses
    import itertools

    from abpo.config.sasrec import SASRecConfig

    types = {f.name: f.type for f in dataclasses.fields(SASRecConfig)}
    axes = []
    for item in items:
        key, _, values = item.partition("=")
        key = key.strip().removeprefix("sasrec.")
        if key not in types or key == "refit_epochs" or not values:
            raise SystemExit(f"--sasrec-grid {item!r}: rule: KEY=V1,V2 with KEY a model setting of section sasrec")
        cast = float if types[key] in (float, "float") else int
        axes.append([(key, cast(v)) for v in values.split(",")])
    return [dict(c) for c in itertools.product(*axes)]


def fit_sasrec(cfg, splits, ds, seed: int, **overrides):
    """SASRec-CE on every user's x_{1:T}, early-stopped on the validation users' x_{T+1..T+N-1} (pi_init's stage-1
    pairs); returns the ranker and its CPU seconds."""
    from abpo.baselines.sasrec import SASRecRanker
    from abpo.data.splits import split_of_user

    train = {int(s.user_id): list(map(int, s.history)) for s in splits}
    val = {
        s.user_id: (s.history, s.update)
        for s in splits
        if split_of_user(s.user_id, cfg.experiment.validation_fraction) == "validation"
    }
    c = time.process_time()
    ranker = SASRecRanker.from_config(cfg.sasrec, seed=seed, **overrides).fit(
        train, ds.item_ids().tolist(), validation=val
    )
    return ranker, time.process_time() - c


def run_grid(cfg, splits, ds, examples, full, pop, grid: list[dict]) -> int:
    from abpo.baselines import make_ranker
    from abpo.experiment.evaluation import metrics_from_scores

    if cfg.experiment.eval_split != "validation":
        raise SystemExit(
            "--sasrec-grid: experiment.eval_split = test; rule: a grid is chosen on the validation users "
            "(--set experiment.eval_split=validation)"
        )
    m = len(examples[0].candidates) if examples else 0
    print(f"SASRec-CE grid: {len(grid)} settings, {len(examples)} validation users, M = {m} and the full catalog")
    total, results = 0.0, []
    for g in grid:
        ranker, cpu = fit_sasrec(cfg, splits, ds, cfg.seed, **g)
        total += cpu
        reqs = [(ex.user_id, ex.history, ex.candidates) for ex in examples]
        at_m = metrics_from_scores(examples, [list(s) for s in ranker.score(reqs)], pop)
        reqs = [(ex.user_id, ex.history, ex.candidates) for ex in full]
        at_full = metrics_from_scores(full, [list(s) for s in ranker.score(reqs)], pop)
        r = ranker.report
        results.append((at_m["HR@5"], g))
        print(
            f"  {g}: HR@5 {at_m['HR@5']:.4f} NDCG@5 {at_m['NDCG@5']:.4f} | full HR@5 {at_full['HR@5']:.4f} "
            f"NDCG@5 {at_full['NDCG@5']:.4f} | best epoch {r.best_epoch} of {r.epochs_run}, CPU {cpu:.0f}s",
            flush=True,
        )
    print(f"grid CPU time {total:.0f}s ({total / 60:.1f} CPU-min)")
    train = {int(s.user_id): list(map(int, s.history)) for s in splits}
    for name in ROWS[1:3]:  # the references on the same users: is SASRec-CE the stronger ML-retrain model?
        c = time.process_time()
        ranker = make_ranker(name, seed=cfg.seed, ml_retrain_epochs=cfg.experiment.ml_retrain_epochs)
        ranker.fit(train, ds.item_ids().tolist())
        r_m, r_f = (
            metrics_from_scores(
                exs, [list(s) for s in ranker.score([(e.user_id, e.history, e.candidates) for e in exs])], pop
            )
            for exs in (examples, full)
        )
        print(
            f"  reference {name}: HR@5 {r_m['HR@5']:.4f} NDCG@5 {r_m['NDCG@5']:.4f} | full HR@5 {r_f['HR@5']:.4f} "
            f"NDCG@5 {r_f['NDCG@5']:.4f} | CPU {time.process_time() - c:.0f}s"
        )
    best = max(results, key=lambda x: x[0])
    print(f"best {best[1]} HR@5={best[0]:.4f}")
    return 0


def main(argv=None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny", help="preset name or YAML file (as every abpo command)")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, repeatable (as every abpo command)",
    )
    ap.add_argument("--state", default="", help="state directory for pi_init (default: a temporary directory)")
    ap.add_argument("--seeds", default="", help="comma-separated training seeds (default: the config's seed)")
    ap.add_argument(
        "--sasrec-grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="SASRec-CE tuning grid on the validation users (repeatable; keys of section sasrec); no pi_init",
    )
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)

    import numpy as np

    from abpo.baselines import make_ranker
    from abpo.config import load_config
    from abpo.data.candidates import training_popularity
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.experiment.evaluation import eval_examples_for, metrics_from_scores
    from abpo.experiment.stats import hits_and_gains, two_stage_bootstrap
    from abpo.logs import console
    from abpo.policy.model import load_policy
    from abpo.policy.scoring import score_examples
    from abpo.policy.sft import train_sft

    console()  # pi_init's stages log through the abpo loggers: one plain line each on stdout, as `abpo sft`
    cfg = load_config(args.config, (SMOKE if args.smoke else []) + args.overrides)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [cfg.seed]
    t0 = time.time()
    ds = load_dataset(cfg.data)
    splits, report = split_users(ds, cfg.data)
    print(f"dataset {ds.name}: {len(splits)} users split ({report})", flush=True)
    examples = eval_examples_for(cfg, splits, ds)
    full = full_catalog_examples(examples, splits, ds)
    pop = training_popularity(splits, ds)
    m = len(examples[0].candidates) if examples else 0
    if args.sasrec_grid:
        return run_grid(cfg, splits, ds, examples, full, pop, parse_grid(args.sasrec_grid))
    state = Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="abpo-policy-quality-"))
    print(f"pi_init state {state}")
    print(
        f"evaluation: {len(examples)} {cfg.experiment.eval_split} users, M = {m} "
        f"({cfg.data.eval_hard_negative_fraction:.0%} popularity hard negatives) and the full catalog "
        f"({len(ds.item_ids())} items less each user's own); seeds {seeds}"
    )
    train_seqs = {int(s.user_id): list(map(int, s.history)) for s in splits}
    # per row and protocol ("M", "full"): per seed the metrics dict (with the per-user ranks)
    res: dict[str, dict[str, list[dict]]] = {r: {"M": [], "full": []} for r in ROWS}
    for seed in seeds:
        scfg = dataclasses.replace(cfg, seed=seed, paths=dataclasses.replace(cfg.paths, root=str(state / f"s{seed}")))
        c = time.process_time()
        trained = train_sft(
            scfg,
            validation_fraction=cfg.experiment.validation_fraction,
            dataset=ds,
            log_mlflow=False,
            register=False,
            evaluate=False,
        )
        for stage, secs in trained.stage_seconds.items():
            print(f"seed {seed} stage {stage}: {secs:.1f}s")
        print(
            f"seed {seed} pi_init in all (data, tokenizer, both stages, save): {trained.seconds:.1f}s wall, "
            f"{time.process_time() - c:.1f}s CPU",
            flush=True,
        )
        t = time.time()
        model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(trained.model_dir)), scfg.paths, dataset=ds)
        for proto, exs in (("M", examples), ("full", full)):
            scored = score_examples(model, tok, exs, ds.titles(), cfg.policy)
            res["pi_init"][proto].append(metrics_from_scores(exs, [s.scores.tolist() for s in scored], pop))
        print(f"seed {seed} pi_init scored at M and on the full catalog in {time.time() - t:.1f}s")
        for name in ROWS[1:]:
            t, c = time.time(), time.process_time()
            if name == "sasrec":
                ranker, _ = fit_sasrec(cfg, splits, ds, seed)
                r = ranker.report
                fit_note = f" (best epoch {r.best_epoch} of {r.epochs_run})"
            else:
                ranker = make_ranker(name, seed=seed, ml_retrain_epochs=cfg.experiment.ml_retrain_epochs).fit(
                    train_seqs, ds.item_ids().tolist()
                )
                fit_note = ""
            for proto, exs in (("M", examples), ("full", full)):
                scores = ranker.score([(ex.user_id, ex.history, ex.candidates) for ex in exs])
                res[name][proto].append(metrics_from_scores(exs, [list(map(float, s)) for s in scores], pop))
            print(
                f"seed {seed} {name} fitted and scored in {time.time() - t:.1f}s wall, "
                f"{time.process_time() - c:.1f}s CPU{fit_note}",
                flush=True,
            )

    def mean(row: str, proto: str, key: str) -> float:
        return float(np.mean([r[key] for r in res[row][proto]]))

    print(f"{'row':<12} {'HR@1':>7} {'HR@5':>7} {'NDCG@5':>7}   full catalog: {'HR@5':>7} {'NDCG@5':>7}")
    for name in ROWS:
        print(
            f"{name:<12} {mean(name, 'M', 'HR@1'):7.4f} {mean(name, 'M', 'HR@5'):7.4f} {mean(name, 'M', 'NDCG@5'):7.4f}"
            f"                 {mean(name, 'full', 'HR@5'):7.4f} {mean(name, 'full', 'NDCG@5'):7.4f}"
        )
    e = cfg.experiment
    level = 1 - e.alpha
    print(
        f"pi_init - row, two-stage bootstrap over {len(seeds)} seed(s) x users, {e.bootstrap_samples} replicates, "
        f"{level:.0%} intervals:"
    )
    headline = {}
    for name in ROWS[1:]:
        parts = []
        for proto in ("M", "full"):
            for metric, pick in (("HR@5", 0), ("NDCG@5", 1)):
                a = np.stack([hits_and_gains(r["ranks"])[pick] for r in res["pi_init"][proto]])
                b = np.stack([hits_and_gains(r["ranks"])[pick] for r in res[name][proto]])
                t = two_stage_bootstrap(a - b, samples=e.bootstrap_samples, level=level, seed=cfg.seed)
                parts.append(f"{metric}@{proto} {t['diff']:+.4f} [{t['ci_low']:+.4f}, {t['ci_high']:+.4f}]")
                if metric == "HR@5":
                    headline[(name, proto)] = t
        print(f"  pi_init - {name:<10} " + "; ".join(parts))
    print(f"total {time.time() - t0:.1f}s")
    hm, hf = headline[("sasrec", "M")], headline[("sasrec", "full")]
    print(
        f"pi_init - sasrec: HR@5 {hm['diff']:+.4f} [{hm['ci_low']:+.4f}, {hm['ci_high']:+.4f}] at M = {m}, "
        f"{hf['diff']:+.4f} [{hf['ci_low']:+.4f}, {hf['ci_high']:+.4f}] on the full catalog"
    )
    print(" ".join(["HR@5", *(f"{name}={mean(name, 'M', 'HR@5'):.4f}" for name in ROWS)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
