# PYTHON_ARGCOMPLETE_OK  (argcomplete looks for this marker: `eval "$(register-python-argcomplete abpo)"`)
"""The `abpo` command. Each area registers its own subcommands (see COMMAND_MODULES); heavy imports
(torch, transformers, mlflow) happen inside the handlers so `abpo --help` stays fast. Help is formatted by
rich-argparse (colour on a terminal, plain text in a pipe); shell completion comes from argcomplete."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING

import abpo

if TYPE_CHECKING:
    from abpo.config import Config

# Modules exposing `register(subparsers, common)`; each adds its subcommands with parents=[common]
# and sets `handler(args, cfg) -> int | None` via set_defaults(handler=...).
COMMAND_MODULES = [
    "abpo.commands.demo",
    "abpo.commands.report",
    "abpo.commands.data",
    "abpo.commands.update",
    "abpo.commands.policy",
    "abpo.commands.experiment",
    "abpo.commands.simulate",
    "abpo.commands.arms",
    "abpo.commands.airflow_install",
    "abpo.commands.state",
]
# attributes naming a subcommand's action (`abpo data prepare`, `abpo arms month`, `abpo airflow install`)
SUBCOMMAND_DESTS = ("data_command", "arms_action", "airflow_command", "state_command")


def _help_formatter():
    from rich_argparse import RichHelpFormatter

    class HelpFormatter(RichHelpFormatter):
        text_markup = False  # help texts are plain: "[core] dags_folder" is text, not a rich style tag
        help_markup = False

    return HelpFormatter


class Parser(argparse.ArgumentParser):
    """argparse with rich-argparse's help formatter; the subcommands' parsers are of this class too (argparse
    builds them with the class of their parent). A bad argument is one line on stderr, exit code 2, like every other
    expected error (argparse's usage block is what ``--help`` prints)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _help_formatter())
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        message = " | ".join(line.strip() for line in message.splitlines() if line.strip())
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def _common_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
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
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="On an expected error (bad input, a missing version, an unreadable store) print the "
        "traceback too, not only the one-line message.",
    )
    return common


def _cmd_config(args: argparse.Namespace, cfg: Config) -> int:
    import yaml

    from abpo.config import explain
    from abpo.redact import redact

    if args.explain:  # every key: its value, where it came from (and the default it replaced), its meaning
        rows = [
            (key, repr(value), source, help_text if source == "default" else f"(default {default!r}) {help_text}")
            for key, value, source, default, help_text in explain(cfg)
        ]
        width = max(len(r[2]) for r in rows)
        print(redact("\n".join(f"{k:40s} {v:>22}  {s:{width}s}  {h}".rstrip() for k, v, s, h in rows)))
    else:  # a tracking URI's password (or any known secret) is printed as ***
        print(redact(yaml.safe_dump(cfg.to_dict(), sort_keys=False)), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="abpo",
        description="ABPO: monthly continual updates of an LLM recommender from its own deployment logs.",
    )
    parser.add_argument("--version", action="version", version=f"abpo {abpo.__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        default=False,
        help="Print the traceback of an expected error too (also $ABPO_DEBUG=1).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _common_parser()
    p = sub.add_parser(
        "config",
        parents=[common],
        help="Print the resolved config (or every knob and where its value came from, with --explain).",
        description="Print the resolved config as YAML (the preset merged with the files it extends, the environment "
        "and --set), or with --explain every key: its value, where the value came from (default, the preset file "
        "that set it, an environment variable or --set; with the default it replaced) and its meaning.",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="List every config key: its resolved value, its source (default, a preset file, $ABPO_*, --set), "
        "its help text.",
    )
    p.set_defaults(handler=_cmd_config)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, common)
    return parser


def expected_errors() -> tuple[type[BaseException], ...]:
    """The errors a user can cause or meet (bad input, a missing version or arm, an unreadable or busy store, a
    refused promotion): :func:`main` turns them into one line on stderr and exit code 2. Anything else is a bug and
    keeps its traceback. First abpo.errors.ExpectedError, the base a library error type a user can meet subclasses
    (and UsageError, what an argument check raises): the boundary needs no entry for those; then the error types
    from before it, each named here."""
    from abpo.abtest.analysis import ReportInputError
    from abpo.abtest.inputs import CSVFormatError
    from abpo.arms.history import ChampionMissing, HistoryFieldRefused
    from abpo.arms.promotion_lock import PromotionRace
    from abpo.arms.versions import NotInRegistry
    from abpo.config.errors import ConfigError
    from abpo.data.schemas import SchemaError
    from abpo.data.storage import StorageError
    from abpo.errors import ExpectedError
    from abpo.monthly.adopt import ModelRefused
    from abpo.monthly.gate_users import GateUsersMissing
    from abpo.months import MonthError
    from abpo.registry import ModelFilesDamaged, NamespaceMismatch, RegistryUnavailable, StateMoved
    from abpo.validation import ValidationNotRun
    from abpo.warehouse import IngestError, WarehouseBusy, WarehouseSettingError, WarehouseUnreadable

    return (
        ExpectedError,
        ConfigError,
        MonthError,
        CSVFormatError,
        ReportInputError,
        SchemaError,
        IngestError,
        WarehouseBusy,
        WarehouseUnreadable,
        WarehouseSettingError,
        RegistryUnavailable,
        PromotionRace,
        NotInRegistry,
        ModelRefused,
        GateUsersMissing,
        ValidationNotRun,
        ModelFilesDamaged,
        StateMoved,
        NamespaceMismatch,
        HistoryFieldRefused,
        ChampionMissing,
        StorageError,
    )


def one_line(e: BaseException) -> str:
    """The error's message on one line (a multi-line message keeps its lines, joined by ' | '), every URI's password
    and every known secret blanked out (abpo.redact.redact)."""
    from abpo.redact import redact

    text = " | ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return redact(text) or type(e).__name__


def _redacted_excepthook(kind, value, tb) -> None:
    """sys.excepthook of the `abpo` process: an unexpected error's traceback (a bug) as Python prints it, with
    every URI's password and known secret blanked out."""
    import traceback

    from abpo.redact import redact

    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))


def main(argv: list[str] | None = None) -> int:
    """The CLI error boundary: an expected error (:func:`expected_errors`) prints ``abpo <command>: <message>`` and
    returns 2; ``--debug`` (or $ABPO_DEBUG=1) adds the traceback."""
    import os
    import traceback

    import argcomplete

    sys.excepthook = _redacted_excepthook  # a bug's traceback holds no password either
    parser = build_parser()
    argcomplete.autocomplete(parser)  # answers a completion request from the shell ($_ARGCOMPLETE) and exits
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    debug = bool(getattr(args, "debug", False)) or os.environ.get("ABPO_DEBUG", "") not in ("", "0")
    command = " ".join(x for x in (args.command, *(getattr(args, d, None) for d in SUBCOMMAND_DESTS)) if x)
    from abpo.logs import console

    console()  # the steps' progress (logging, loggers under `abpo`) as plain lines on stdout
    try:
        from abpo.config import load_config

        cfg = load_config(args.config, args.overrides)
        rc = args.handler(args, cfg)
    except expected_errors() as e:
        if debug:
            from abpo.redact import redact

            sys.stderr.write(redact(traceback.format_exc()))
        print(f"abpo {command}: {one_line(e)}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
