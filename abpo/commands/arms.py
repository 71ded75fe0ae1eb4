"""`abpo arms ACTION`: the production loop's arms outside Airflow: bootstrap, one whole month, where each arm stands,
promotion and rollback. One subcommand per action, each with only its own options: here the loop's (bootstrap,
month, size-update, status); the champion's moves by hand and its record (promote, rollback, pin, unpin, history,
adopt) in abpo.commands.arms_champions."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from abpo.arms.names import arm_arg
from abpo.commands import arms_champions
from abpo.months import month_arg

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "arms",
        help="Bootstrap the arms, run one month of the loop, show, promote, roll back or adopt each arm's champion.",
        description="The arms of the production loop (abpo.arms), one action each; `abpo arms ACTION --help` "
        "shows that action's options.",
    )
    asub = p.add_subparsers(dest="arms_action", metavar="ACTION", required=True)

    _add_loop_actions(asub, common)
    arms_champions.add_champion_actions(asub, common)
    arms_champions.add_record_actions(asub, common)


def _add_loop_actions(asub, common: argparse.ArgumentParser) -> None:
    """The actions that run the loop: bootstrap, month, size-update, status."""
    a = asub.add_parser(
        "bootstrap",
        parents=[common],
        help="Give every arm without a champion its first one.",
        description="Give every arm without a champion its first one: pi_init (SFT) for the LLM arms, "
        "a fit for the rankers; prints what each arm got as JSON.",
    )
    a.set_defaults(handler=run, action="bootstrap")

    a = asub.add_parser(
        "month",
        parents=[common],
        help="Run one whole month of the cycle in one process.",
        description="Run the whole monthly cycle for --month in one process, as the abpo_monthly DAG "
        "does in tasks: serve (with --simulate), ingest, update each LLM arm from its champion on its "
        "own logs, register, gate, promote, refit the rankers, report.",
    )
    a.add_argument("--month", type=month_arg, required=True, help="The month to run, YYYY-MM.")
    a.add_argument(
        "--simulate",
        action="store_true",
        help="Serve the month with the simulator first (otherwise its logs must have landed).",
    )
    a.add_argument(
        "--force",
        action="store_true",
        help="Start the arms over (bootstrap from pi_init) even though the state has completed months and "
        "its MLflow store holds none of the arms' models (refused otherwise).",
    )
    a.set_defaults(handler=run, action="month")

    a = asub.add_parser(
        "size-update",
        parents=[common],
        help="Choose the LLM arms' update size on a simulated validation month (a grid of updates, "
        "each gated, none promoted).",
        description="In the state of the config (give it a throw-away paths.root and another seed / "
        "sim.salt than the reported series), run --month's bootstrap, serve (simulated) and ingest, "
        "then for each point of the --grid one update of --arm from its champion, registered and "
        "gated against that champion, never promoted; print each point's steps, wall time, the gate's "
        "paired offline test (ΔHR@5, SE, MDE) and off-policy ΔCTR with its 95% interval, and whether "
        "the update moves the policy beyond the gate's noise (abpo.monthly.sizing).",
    )
    a.add_argument("--month", type=month_arg, required=True, help="The validation month, YYYY-MM.")
    a.add_argument("--arm", default="abpo", type=arm_arg, help="The LLM arm to size (default abpo).")
    a.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="An axis of the grid (repeatable), e.g. --grid arms.update_max_examples=1024,2048 --grid "
        "update.learning_rate=1e-4,3e-4; none: the config as it is.",
    )
    a.add_argument("--out", help="Also write the table (markdown) and the points (JSON beside it) to this file.")
    a.set_defaults(handler=run, action="size-update")

    a = asub.add_parser(
        "status",
        parents=[common],
        help="Print each arm's champion and challenger.",
        description="Print each arm's champion and challenger with their lineage tags.",
    )
    a.set_defaults(handler=run, action="status")


def run(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.monthly.common import arms_of

    if args.action == "bootstrap":
        from abpo.monthly.bootstrap import bootstrap_arms

        # the explicit start-over: no abpo.monthly.bootstrap.require_registry check here
        print(json.dumps(bootstrap_arms(cfg).arms, indent=1))
    elif args.action == "month":
        from abpo.monthly.month import run_month

        month_out = run_month(cfg, args.month, simulate=args.simulate, force=args.force)
        print(f"report: {month_out.report.html if month_out.report is not None else '(none written)'}")
    elif args.action == "size-update":
        from pathlib import Path

        from abpo.config import load_config
        from abpo.experiment.sweep import parse_sweep, probes
        from abpo.monthly.sizing import size_update, sizing_markdown, write_sizing

        grid = probes(parse_sweep(args.grid, "--grid")) if args.grid else [[]]
        if args.out:  # refused before the month runs, not after it
            from abpo.errors import writable_file

            writable_file(args.out, "--out")
        sets = list(args.overrides or [])
        points = size_update(
            cfg, str(args.month), args.arm, grid, config_for=lambda extra: load_config(args.config, sets + list(extra))
        )
        md = sizing_markdown(points, arm=args.arm, month=str(args.month))
        print(md)
        if args.out:
            write_sizing(Path(args.out), md, points)
    else:
        from abpo.arms import versions as arm_versions
        from abpo.arms.status import arm_status
        from abpo.monthly.bootstrap import require_registry

        require_registry(cfg)  # a store that lost the arms is not shown as "no champions"
        from abpo.arms.status import arm_unfinished

        missing = 0
        for arm in arms_of(cfg):
            for s in arm_status(cfg, [arm]):
                shown = json.dumps(s.info) if s.info is not None else "none"
                if s.missing:  # deleted outside abpo while its history names one: say so
                    shown, missing = f"none: MISSING ({s.missing})", missing + 1
                print(f"{s.model:<22} {s.alias:<10} {shown}")
            for line in arm_unfinished(cfg, arm):  # what a promotion of the arm left unfinished (a killed mover)
                print(f"{arm_versions.model_name(arm, cfg):<22} {'UNFINISHED':<10} {line}")
        for o in arm_versions.orphaned_logged_models(cfg):  # what a killed update logged and never registered
            print(
                f"orphaned logged model {o['model_id']} ({o['name']}): run {o['run_id']} {o['run_status']}, never "
                f"registered; artifacts {o['artifacts']}"
            )
        if missing:  # exit 1: a script checking the arms sees that a champion the history names is gone
            return 1
    return 0
