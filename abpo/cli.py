"""The `abpo` command. Each area registers its own subcommands (see COMMAND_MODULES); heavy imports
(torch, transformers, mlflow) happen inside the handlers so `abpo --help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import sys

import abpo

# Modules exposing `register(subparsers, common)`; each adds its subcommands with parents=[common]
# and sets `handler(args, cfg) -> int | None` via set_defaults(handler=...).
COMMAND_MODULES = [
    "abpo.pipeline",
    "abpo.abtest.cli",
    "abpo.data.cli",
    "abpo.train.cli",
    "abpo.policy.cli",
    "abpo.evaluation.cli",
    "abpo.sim.cli",
    "abpo.arms.cli",
]


def _common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", default="tiny", help="Preset name (tiny, gpu, ...) or path to a YAML config (default: tiny)."
    )
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override one config value, e.g. --set data.train_candidates=50 (repeatable).",
    )
    return common


def _cmd_config(args: argparse.Namespace, cfg) -> int:
    import yaml

    from abpo.config import Config, describe

    if args.explain:
        for key, default, help_text in describe(Config):
            print(f"{key:40s} {default!r:>22}  {help_text}")
    else:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="abpo",
        description="ABPO: monthly continual updates of an LLM recommender from its own deployment logs.",
    )
    parser.add_argument("--version", action="version", version=f"abpo {abpo.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _common_parser()
    p = sub.add_parser(
        "config", parents=[common], help="Print the resolved config (or every knob with --explain).",
        description="Print the resolved config as YAML, or with --explain every key, its default and its meaning.",
    )
    p.add_argument("--explain", action="store_true", help="List every config key with its default and help text.")
    p.set_defaults(handler=_cmd_config)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    from abpo.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"abpo: config error: {e}", file=sys.stderr)
        return 2
    from abpo.arms.registry import PromotionRace
    from abpo.registry import RegistryUnavailable
    from abpo.warehouse import WarehouseBusy

    try:
        rc = args.handler(args, cfg)
    except (RegistryUnavailable, PromotionRace, WarehouseBusy) as e:  # operational refusals: a message, not a traceback
        print(f"abpo {args.command}: {e}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
