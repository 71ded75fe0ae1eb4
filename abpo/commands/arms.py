"""`abpo arms ACTION`: the production loop's arms outside Airflow: bootstrap, one whole month, where each arm stands,
promotion and rollback. One subcommand per action, each with only its own options."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from abpo.months import month_arg

if TYPE_CHECKING:
    from abpo.config import Config


def _history_field(field: str):
    """An argparse type for a history field (--reason, --actor): abpo.arms.history.check_text_field's refusal (a
    control character) is argparse's one-line error, before anything is read or written."""

    def check(value: str) -> str:
        from abpo.arms.history import HistoryFieldRefused, check_text_field

        try:
            return check_text_field(field, value)
        except HistoryFieldRefused as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    check.__name__ = field
    return check


_reason, _actor = _history_field("reason"), _history_field("actor")


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "arms",
        help="Bootstrap the arms, run one month of the loop, show, promote, roll back or adopt each arm's champion.",
        description="The arms of the production loop (abpo.arms), one action each; `abpo arms ACTION --help` "
        "shows that action's options.",
    )
    asub = p.add_subparsers(dest="arms_action", metavar="ACTION", required=True)

    _add_loop_actions(asub, common)
    _add_champion_actions(asub, common)
    _add_record_actions(asub, common)


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
    a.add_argument("--arm", default="abpo", help="The LLM arm to size (default abpo).")
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


def _add_champion_actions(asub, common: argparse.ArgumentParser) -> None:
    """The actions that move or hold a champion by hand: promote, rollback, pin, unpin."""
    actor = "Who does it, recorded in the promotion history (default: $ABPO_ACTOR, else the OS user)."
    a = asub.add_parser(
        "promote",
        parents=[common],
        help="Make a registered version an arm's champion.",
        description="Make --version the champion of --arm (alias champion), recorded in the arm's "
        "promotion history (who, when, from, to, why, the version's gate verdict; `abpo arms "
        "history`), which `abpo arms rollback` follows. A pin does not stop a human's promotion.",
    )
    a.add_argument("--arm", required=True, help="The arm: abpo, grpo, ml_retrain or popularity.")
    a.add_argument("--version", required=True, help="The registered version to make champion.")
    a.add_argument(
        "--expect-champion",
        help="Refuse unless the champion is this version (a race with another promotion changes nothing).",
    )
    a.add_argument(
        "--reason", default="", type=_reason, help="Why: recorded in the promotion history and on the version."
    )
    a.add_argument("--actor", default="", type=_actor, help=actor)
    a.set_defaults(handler=run, action="promote")

    a = asub.add_parser(
        "rollback",
        parents=[common],
        help="Put back the arm's previous champion (its promotion history).",
        description="Make the champion before the current one in --arm's promotion "
        "history the champion again (repeated: further back); refused, nothing changed, when that "
        "version no longer exists.",
    )
    a.add_argument("--arm", required=True, help="The arm: abpo, grpo, ml_retrain or popularity.")
    a.add_argument(
        "--reason", default="", type=_reason, help="Why: recorded in the promotion history and on the version."
    )
    a.add_argument("--actor", default="", type=_actor, help=actor)
    a.set_defaults(handler=run, action="rollback")

    a = asub.add_parser(
        "pin",
        parents=[common],
        help="Keep an arm's champion: the gate no longer promotes over it.",
        description="Pin --arm's champion: the monthly gate still runs and reports, but its promote "
        "records 'pinned: not promoted' (a ranker's refit registers without promoting) until `abpo "
        "arms unpin`. Recorded in the promotion history. A champion moved by hand in MLflow is "
        "pinned when the next month detects it.",
    )
    a.add_argument("--arm", required=True, help="The arm: abpo, grpo, ml_retrain or popularity.")
    a.add_argument("--reason", default="", type=_reason, help="Why: recorded in the promotion history.")
    a.add_argument("--actor", default="", type=_actor, help=actor)
    a.set_defaults(handler=run, action="pin")

    a = asub.add_parser(
        "unpin",
        parents=[common],
        help="Let the gate promote an arm again.",
        description="Remove --arm's pin (`abpo arms pin`); recorded in the promotion history.",
    )
    a.add_argument("--arm", required=True, help="The arm: abpo, grpo, ml_retrain or popularity.")
    a.add_argument("--reason", default="", type=_reason, help="Why: recorded in the promotion history.")
    a.add_argument("--actor", default="", type=_actor, help=actor)
    a.set_defaults(handler=run, action="unpin")


def _add_record_actions(asub, common: argparse.ArgumentParser) -> None:
    """The promotion history and adopting an existing model: history, adopt."""
    a = asub.add_parser(
        "history",
        parents=[common],
        help="Print every champion move (and pin, unpin, refusal).",
        description="Print the promotion history (MLflow experiment abpo-promotions): every champion "
        "move by the gate, a refit, `abpo arms promote`, a rollback or by hand in MLflow, with who, "
        "when, from, to, why and the gate's verdict; oldest first.",
    )
    a.add_argument("--arm", action="append", default=[], help="Only this arm (repeatable; default: every arm).")
    a.add_argument("--json", action="store_true", help="One JSON object per entry instead of a table.")
    a.set_defaults(handler=run, action="history")

    a = asub.add_parser(
        "adopt",
        parents=[common],
        help="Make an existing model an LLM arm's first champion (no SFT).",
        description="Register --model as --arm's first champion without SFT, after checking that it "
        "scores the configured prompt format (policy.*): the answer format survives its tokenizer, "
        "item_tokens style has one token per catalog item, it has a chat template, and it scores "
        "held-out requests.",
    )
    a.add_argument("--arm", required=True, help="The LLM arm: abpo or grpo.")
    a.add_argument(
        "--model",
        required=True,
        help="A Hugging Face save_pretrained directory or a registered MLflow "
        "model (models:/NAME/VERSION, models:/NAME@ALIAS).",
    )
    a.set_defaults(handler=run, action="adopt")


def run(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.monthly.common import CHALLENGER, CHAMPION, arms_of

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
        from abpo.monthly.sizing import size_update, sizing_markdown

        grid = probes(parse_sweep(args.grid)) if args.grid else [[]]
        sets = list(args.overrides or [])
        points = size_update(
            cfg, str(args.month), args.arm, grid, config_for=lambda extra: load_config(args.config, sets + list(extra))
        )
        md = sizing_markdown(points, arm=args.arm, month=str(args.month))
        print(md)
        if args.out:
            out_file = Path(args.out)
            out_file.parent.mkdir(parents=True, exist_ok=True)
            out_file.write_text(md)
            out_file.with_suffix(".json").write_text(json.dumps([p.to_json() for p in points], indent=1))
    elif args.action == "adopt":
        from abpo.monthly.adopt import adopt_model

        adopted = adopt_model(cfg, args.arm, args.model)
        print(
            f"{adopted.arm}: {args.model} is champion v{adopted.version} (checked on {adopted.checked_requests} "
            "held-out requests; no SFT)"
        )
    elif args.action in ("promote", "rollback"):
        from abpo.arms import promotion, versions as arm_versions

        if args.action == "promote":
            out = promotion.promote(
                cfg,
                args.arm,
                args.version,
                expected_champion=args.expect_champion,
                reason=args.reason,
                actor=args.actor,
            )
        else:
            out = promotion.rollback(cfg, args.arm, reason=args.reason, actor=args.actor)
        print(
            f"{arm_versions.model_name(args.arm, cfg)}: champion v{out['champion']} (was v{out['previous'] or 'none'})"
        )
    elif args.action in ("pin", "unpin"):
        from abpo.arms import promotion, versions as arm_versions

        fn = promotion.pin if args.action == "pin" else promotion.unpin
        out = fn(cfg, args.arm, reason=args.reason, actor=args.actor)
        print(
            f"{arm_versions.model_name(args.arm, cfg)}: champion v{out['champion'] or 'none'} "
            + ("pinned" if out["pinned"] == "true" else "not pinned")
        )
    elif args.action == "history":
        from abpo.arms import history
        from abpo.logs import console

        if args.json:  # stdout is the JSON lines alone: the store line and any other log line go to stderr
            console(stderr=True)
        for arm in args.arm or arms_of(cfg):
            for e in history.entries(cfg, arm):
                if args.json:
                    print(json.dumps(e.to_json()))
                else:
                    print(history_line(e))
    else:
        from abpo.arms import promotion, versions as arm_versions
        from abpo.monthly.bootstrap import require_registry

        require_registry(cfg)  # a store that lost the arms is not shown as "no champions"
        missing = 0
        for arm in arms_of(cfg):
            for alias in (CHAMPION, CHALLENGER):
                mv = arm_versions.get_version(cfg, arm, alias)
                shown = json.dumps(arm_versions.version_info(mv)) if mv is not None else "none"
                if mv is None and alias == CHAMPION:  # deleted outside abpo while its history names one: say so
                    from abpo.arms.history import ChampionMissing, require_champion_or_none_recorded

                    try:
                        require_champion_or_none_recorded(cfg, arm, arm_versions.model_name(arm, cfg))
                    except ChampionMissing as e:
                        shown, missing = f"none: MISSING ({e})", missing + 1
                print(f"{arm_versions.model_name(arm, cfg):<22} {alias:<10} {shown}")
        for o in arm_versions.orphaned_logged_models(cfg):  # what a killed update logged and never registered
            print(
                f"orphaned logged model {o['model_id']} ({o['name']}): run {o['run_id']} {o['run_status']}, never "
                f"registered; artifacts {o['artifacts']}"
            )
        if missing:  # exit 1: a script checking the arms sees that a champion the history names is gone
            return 1
    return 0


def history_line(e) -> str:
    """One entry of the promotion history as a line of `abpo arms history`."""
    move = f"v{e.from_version or '-'} -> v{e.to_version}" if e.from_version != e.to_version else f"v{e.to_version}"
    extra = "".join(f" {k} {v}" for k, v in (("month", e.month), ("verdict", e.verdict[:80])) if v)
    return f"{e.arm:<11} #{e.seq:<4} {e.at}  {e.action:<12} {move:<14} by {e.actor}: {e.reason[:160]}{extra}"
