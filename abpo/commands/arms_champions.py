"""`abpo arms promote | rollback | pin | unpin | history | adopt`: an arm's champion moved, held or adopted by hand,
and its promotion history (abpo.arms.promotion, abpo.arms.history, abpo.monthly.adopt). `abpo arms` and its loop
actions: abpo.commands.arms, which registers these beside them."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from abpo.arms.names import arm_arg

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
ARM_HELP = "The arm: abpo, grpo, ml_retrain or popularity."
ACTOR_HELP = "Who does it, recorded in the promotion history (default: $ABPO_ACTOR, else the OS user)."


def _hand_move_options(a: argparse.ArgumentParser, reason_help: str, action: str) -> None:
    """--arm, --reason and --actor of an action that moves or holds a champion by hand, and its handler."""
    a.add_argument("--arm", type=arm_arg, required=True, help=ARM_HELP)
    a.add_argument("--reason", default="", type=_reason, help=reason_help)
    a.add_argument("--actor", default="", type=_actor, help=ACTOR_HELP)
    a.set_defaults(handler=run, action=action)


def add_champion_actions(asub, common: argparse.ArgumentParser) -> None:
    """The actions that move or hold a champion by hand: promote, rollback, pin, unpin."""
    a = asub.add_parser(
        "promote",
        parents=[common],
        help="Make a registered version an arm's champion.",
        description="Make --version the champion of --arm (alias champion), recorded in the arm's "
        "promotion history (who, when, from, to, why, the version's gate verdict; `abpo arms "
        "history`), which `abpo arms rollback` follows. A pin does not stop a human's promotion.",
    )
    a.add_argument("--arm", type=arm_arg, required=True, help=ARM_HELP)
    a.add_argument("--version", required=True, help="The registered version to make champion.")
    a.add_argument(
        "--expect-champion",
        help="Refuse unless the champion is this version (a race with another promotion changes nothing).",
    )
    a.add_argument(
        "--reason", default="", type=_reason, help="Why: recorded in the promotion history and on the version."
    )
    a.add_argument("--actor", default="", type=_actor, help=ACTOR_HELP)
    a.set_defaults(handler=run, action="promote")

    a = asub.add_parser(
        "rollback",
        parents=[common],
        help="Put back the arm's previous champion (its promotion history).",
        description="Make the champion before the current one in --arm's promotion "
        "history the champion again (repeated: further back); refused, nothing changed, when that "
        "version no longer exists.",
    )
    _hand_move_options(a, "Why: recorded in the promotion history and on the version.", "rollback")

    a = asub.add_parser(
        "pin",
        parents=[common],
        help="Keep an arm's champion: the gate no longer promotes over it.",
        description="Pin --arm's champion: the monthly gate still runs and reports, but its promote "
        "records 'pinned: not promoted' (a ranker's refit registers without promoting) until `abpo "
        "arms unpin`. Recorded in the promotion history. A champion moved by hand in MLflow is "
        "pinned when the next month detects it.",
    )
    _hand_move_options(a, "Why: recorded in the promotion history.", "pin")

    a = asub.add_parser(
        "unpin",
        parents=[common],
        help="Let the gate promote an arm again.",
        description="Remove --arm's pin (`abpo arms pin`); recorded in the promotion history.",
    )
    _hand_move_options(a, "Why: recorded in the promotion history.", "unpin")


def add_record_actions(asub, common: argparse.ArgumentParser) -> None:
    """The promotion history and adopting an existing model: history, adopt."""
    a = asub.add_parser(
        "history",
        parents=[common],
        help="Print every champion move (and pin, unpin, refusal).",
        description="Print the promotion history (MLflow experiment abpo-promotions): every champion "
        "move by the gate, a refit, `abpo arms promote`, a rollback or by hand in MLflow, with who, "
        "when, from, to, why and the gate's verdict; oldest first.",
    )
    a.add_argument(
        "--arm", type=arm_arg, action="append", default=[], help="Only this arm (repeatable; default: every arm)."
    )
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
    a.add_argument("--arm", type=arm_arg, required=True, help="The LLM arm: abpo or grpo.")
    a.add_argument(
        "--model",
        required=True,
        help="A Hugging Face save_pretrained directory or a registered MLflow "
        "model (models:/NAME/VERSION, models:/NAME@ALIAS).",
    )
    a.set_defaults(handler=run, action="adopt")


def run(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.monthly.common import arms_of

    if args.action == "adopt":
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
    else:  # history
        from abpo.arms import history
        from abpo.logs import console

        if args.json:  # stdout is the JSON lines alone: the store line and any other log line go to stderr
            console(stderr=True)
        for arm in args.arm or arms_of(cfg):
            for e in history.entries(cfg, arm):
                print(json.dumps(e.to_json()) if args.json else e.line())
    return 0
