"""`abpo loop-experiment`: the monthly loop run S times from one shared bootstrap, compared arm against arm with a
two-stage interval (docs/report.md "The replicated loop experiment"). The experiment is
abpo.experiment.loop_experiment's (planning, fingerprints, worker pool, report, sizing); this module parses the
arguments, calls it and prints its summary."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "loop-experiment",
        parents=[common],
        help="Run the monthly loop S times from one shared bootstrap and compare the arms with a two-stage interval.",
        description="Train pi_init and bootstrap every arm once, then run the monthly loop (the month driver of "
        "`abpo arms month --simulate`) --replicates times for --months months from sim.start_month, each replicate "
        "in a copy of that state with its own sim.replicate (its own traffic draws and users' arm assignment), "
        "several at once up to the machine's cores; write one report (markdown + JSON) with each arm pair's CTR "
        "difference per month and over the period, its two-stage interval (replicates, then users within a "
        "replicate), p and MDE (docs/report.md). Finished replicates are reused: rerun with a larger "
        "--replicates to add replicates.",
    )
    p.add_argument("--replicates", type=int, default=2, help="Replicates S (default 2).")
    p.add_argument("--months", type=int, default=4, help="Months per replicate from sim.start_month (default 4).")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="Replicates run at once (default: the machine's cores, at most the replicates to run); each gets "
        "cores / workers torch threads.",
    )
    p.add_argument("--out", help="Where to write report.md and report.json (default under <state>/loop-experiment).")
    p.add_argument(
        "--prune",
        action="store_true",
        help="Delete a replicate's state (warehouse, MLflow store, models) once its result is saved.",
    )
    p.add_argument(
        "--any-code",
        action="store_true",
        help="Reuse finished replicates (and the bootstrap) whatever code made them (default: only those of this "
        "code, abpo's modules less the CLI and the A/B analysis, and sql/); the report names other code.",
    )
    p.add_argument(
        "--target-mde",
        type=float,
        default=0.5,
        metavar="PP",
        help="Also size the design: the replicates (and wall time) that bring each headline pair's whole-period "
        "MDE to PP percentage points with 1..N months, from this run's variance (default 0.5; 0: no sizing).",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.experiment.loop_experiment import run_loop_experiment

    out = run_loop_experiment(
        cfg,
        config_ref=args.config,
        overrides=list(args.overrides or []),
        replicates=args.replicates,
        months=args.months,
        workers=args.workers,
        out_dir=args.out,
        prune=args.prune,
        any_code=args.any_code,
        target_mde_pp=args.target_mde,
    )
    print(f"\nabpo loop-experiment: {len(out.replicates)} replicate(s) in {out.seconds / 60:.1f} min; whole period:")
    print("\n".join(out.summary))
    print(f"  report {out.markdown}\n         {out.json}")
    return 0
