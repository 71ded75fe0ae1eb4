"""`abpo arms`: the production loop's arms outside Airflow: bootstrap, one whole month, and where each arm stands."""

from __future__ import annotations

import argparse
import json

from abpo.months import month_arg


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "arms", parents=[common], help="Bootstrap the arms, run one month of the loop, or show each arm's champion.",
        description="The four arms of the production loop (abpo.arms). `bootstrap` gives every arm without one a "
        "champion (pi_init for the LLM arms; ranker fits); `month --month M` runs the whole monthly cycle in one "
        "process, as the abpo_monthly DAG does in tasks (serve with --simulate, ingest, update each LLM arm from its "
        "champion on its own logs, register, gate, promote, refit the rankers, report); `status` prints each "
        "arm's champion and challenger with their lineage tags; `promote` / `rollback` move a champion by hand; "
        "`adopt --arm A --model DIR|models:/...` makes an existing model an LLM arm's first champion (no SFT).",
    )
    p.add_argument("action", choices=["bootstrap", "month", "status", "promote", "rollback", "adopt"])
    p.add_argument("--arm", help="actions promote / rollback / adopt: the arm (abpo, grpo, ml_retrain, popularity; "
                   "adopt: an LLM arm).")
    p.add_argument("--model", help="action adopt: a Hugging Face save_pretrained directory or a registered MLflow "
                   "model (models:/NAME/VERSION, models:/NAME@ALIAS) to register as the arm's first champion without "
                   "SFT, after checking that it scores the configured prompt format (policy.*).")
    p.add_argument("--version", help="action promote: the registered version to make champion.")
    p.add_argument("--expect-champion", help="action promote: refuse unless the champion is this version (a race "
                   "with another promotion changes nothing).")
    p.add_argument("--reason", default="", help="actions promote / rollback: recorded on the version as a tag.")
    p.add_argument("--month", type=month_arg, help="YYYY-MM (action month).")
    p.add_argument("--simulate", action="store_true",
                   help="action month: serve the month with the simulator first (otherwise it must have landed).")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, cfg) -> int:
    from abpo.monthly.common import CHALLENGER, CHAMPION, arms_of

    if args.action == "bootstrap":
        from abpo.monthly.bootstrap import bootstrap_arms

        print(json.dumps(bootstrap_arms(cfg).arms, indent=1))
    elif args.action == "month":
        from abpo.monthly.month import run_month

        if not args.month:
            raise SystemExit("abpo arms month: --month YYYY-MM is required")
        out = run_month(cfg, args.month, simulate=args.simulate)
        print(f"report: {out.report.html}")
    elif args.action == "adopt":
        from abpo.monthly.adopt import adopt_model

        if not args.arm or not args.model:
            raise SystemExit("abpo arms adopt: --arm and --model are required")
        out = adopt_model(cfg, args.arm, args.model)
        print(f"{out.arm}: {args.model} is champion v{out.version} (checked on {out.checked_requests} held-out "
              "requests; no SFT)")
    elif args.action in ("promote", "rollback"):
        from abpo.arms import versions as arm_versions

        if not args.arm or (args.action == "promote" and not args.version):
            raise SystemExit(f"abpo arms {args.action}: --arm" + (" and --version are" if args.action == "promote"
                                                                   else " is") + " required")
        if args.action == "promote":
            out = arm_versions.promote(cfg, args.arm, args.version, expected_champion=args.expect_champion,
                                       reason=args.reason)
        else:
            out = arm_versions.rollback(cfg, args.arm, reason=args.reason)
        print(f"{arm_versions.model_name(args.arm)}: champion v{out['champion']} (was v{out['previous'] or 'none'})")
    else:
        from abpo.arms import versions as arm_versions

        for arm in arms_of(cfg):
            for alias in (CHAMPION, CHALLENGER):
                mv = arm_versions.get_version(cfg, arm, alias)
                shown = json.dumps(arm_versions.version_info(mv)) if mv is not None else "none"
                print(f"{arm_versions.model_name(arm):<22} {alias:<10} {shown}")
    return 0
