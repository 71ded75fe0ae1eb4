"""pi_init's offline quality beside the two non-LLM arms, on the same users and candidates, in one run.

    .venv/bin/python benchmarks/policy_quality.py [--config tiny] [--set key=value ...] [--state DIR] [--smoke]

Trains pi_init as `abpo sft` does (stage 1: next-item pre-training when sft.pretrain_epochs > 0; stage 2: the
answer-format SFT on every D_sup pair) into a throw-away state directory, then scores the experiment's test users
(`experiment.eval_split`, `experiment.max_eval_users`; the held-out target x_{T+N} among data.eval_candidates,
data.eval_hard_negative_fraction of the negatives drawn by popularity) with pi_init, popularity and ML-retrain
(implicit ALS). The baselines are fitted on what pi_init was trained on: every user's x_{1:T}. Nothing here is
tuned: the settings are the preset's, chosen on the validation users (`--set experiment.eval_split=validation`
shows those).

Prints each stage's wall time, HR@1/HR@5/NDCG@5 of every row, and as its last line exactly

    HR@5 pi_init=<v> popularity=<v> ml_retrain=<v>

``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): 12 users, a smaller tiny model, one
pre-training epoch, 4 SFT steps, 8 evaluation users among 10 candidates (the figures mean nothing at that size).

Works on any dataset the loaders read: `--set data.dataset_dir=DIR` (MovieLens format) or
`--set data.format=amazon18 --set data.dataset_dir=../shared/data/amazon18 --set data.amazon_domain=...`.
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
    "policy.max_history=3",
    "sft.pretrain_epochs=1",
    "sft.max_steps=4",
    "sft.batch_size=8",
    "experiment.max_eval_users=8",
    "experiment.eval_candidates=10",
]


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
    ap.add_argument("--smoke", action="store_true", help="the smallest sizes that run the same path (seconds)")
    args = ap.parse_args(argv)

    from abpo.baselines import make_ranker
    from abpo.config import load_config
    from abpo.data.candidates import training_popularity
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users
    from abpo.experiment.evaluation import eval_examples_for, metrics_from_scores
    from abpo.logs import console
    from abpo.policy.model import load_policy
    from abpo.policy.scoring import score_examples
    from abpo.policy.sft import train_sft

    console()  # pi_init's stages log through the abpo loggers: one plain line each on stdout, as `abpo sft`
    cfg = load_config(args.config, (SMOKE if args.smoke else []) + args.overrides)
    state = Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="abpo-policy-quality-"))
    cfg.paths = dataclasses.replace(cfg.paths, root=str(state))
    t0 = time.time()
    ds = load_dataset(cfg.data)
    splits, report = split_users(ds, cfg.data)
    print(f"dataset {ds.name}: {len(splits)} users split ({report}); state {state}", flush=True)
    res = train_sft(
        cfg,
        validation_fraction=cfg.experiment.validation_fraction,
        dataset=ds,
        log_mlflow=False,
        register=False,
        evaluate=False,
    )
    for stage, secs in res.stage_seconds.items():
        print(f"stage {stage}: {secs:.1f}s")
    print(f"pi_init in all (data, tokenizer, both stages, save): {res.seconds:.1f}s", flush=True)

    examples = eval_examples_for(cfg, splits, ds)
    pop = training_popularity(splits, ds)
    m = len(examples[0].candidates) if examples else 0
    print(
        f"evaluation: {len(examples)} {cfg.experiment.eval_split} users, M = {m}, "
        f"{cfg.data.eval_hard_negative_fraction:.0%} popularity hard negatives"
    )
    rows = {}
    t = time.time()
    model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(res.model_dir)), cfg.paths, dataset=ds)
    scored = score_examples(model, tok, examples, ds.titles(), cfg.policy)
    rows["pi_init"] = metrics_from_scores(examples, [s.scores.tolist() for s in scored], pop)
    print(f"pi_init scored in {time.time() - t:.1f}s ({len(examples) / max(time.time() - t, 1e-9):.1f} users/s)")
    train_seqs = {int(s.user_id): list(map(int, s.history)) for s in splits}
    for name in ("popularity", "ml_retrain"):
        t = time.time()
        ranker = make_ranker(name, seed=cfg.seed, ml_retrain_epochs=cfg.experiment.ml_retrain_epochs).fit(
            train_seqs, ds.item_ids().tolist()
        )
        scores = ranker.score([(ex.user_id, ex.history, ex.candidates) for ex in examples])
        rows[name] = metrics_from_scores(examples, [list(map(float, s)) for s in scores], pop)
        print(f"{name} fitted and scored in {time.time() - t:.1f}s")
    print(f"{'row':<12} {'HR@1':>7} {'HR@5':>7} {'NDCG@5':>7}")
    for name, r in rows.items():
        print(f"{name:<12} {r['HR@1']:7.4f} {r['HR@5']:7.4f} {r['NDCG@5']:7.4f}")
    print(f"total {time.time() - t0:.1f}s")
    print(
        f"HR@5 pi_init={rows['pi_init']['HR@5']:.4f} popularity={rows['popularity']['HR@5']:.4f} "
        f"ml_retrain={rows['ml_retrain']['HR@5']:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
