"""`abpo simulate`: one month of simulated traffic served by every arm's champion, landed for ingest."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from abpo.months import month_arg

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "simulate",
        parents=[common],
        help="Serve one simulated month with every arm's champion and land it as Parquet.",
        description="Simulate month MONTH (abpo.sim): real users from the configured dataset, assigned to arms by "
        "a salted hash with report.arm_shares, each arm's MLflow champion exposes one item per request with its "
        "propensity, the click model (config section sim) decides the click. Lands "
        "<landing>/impressions/month=MONTH/part-sim.parquet in the impressions contract (a rerun replaces it) and "
        "prints impressions and clicks per arm. Arms without a champion are bootstrapped first (pi_init; ranker "
        "fits).",
    )
    p.add_argument(
        "--month", required=True, type=month_arg, help="YYYY-MM; month index = months since sim.start_month."
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.monthly.bootstrap import bootstrap_arms
    from abpo.monthly.serve import serve_month

    bootstrap_arms(cfg)
    out = serve_month(cfg, args.month)
    total_i = sum(v["impressions"] for v in out.per_arm.values())
    total_c = sum(v["clicks"] for v in out.per_arm.values())
    print(f"simulate {args.month}: {total_i} impressions, {total_c} clicks in {out.seconds}s -> {out.path}")
    return 0
