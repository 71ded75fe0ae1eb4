"""The `abpo` commands a text names, checked against the CLI's parser: what tests/test_cli_help.py and
tests/test_docs.py use to find a README, docs page or message naming a command or subcommand that does not exist."""

from __future__ import annotations

import re

# `abpo CMD [SUB]` inside backticks, or at the start of a command line in a code block (optionally .venv/bin/abpo)
NAMED = re.compile(r"(?:`|^\s*(?:\.venv/bin/)?)abpo ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)", re.M)


def cli_commands() -> dict[str, set[str] | None]:
    """Each top-level command -> the names of its subcommands (None: it has none)."""
    import argparse

    from abpo.cli import build_parser

    def subs(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                return dict(a.choices)
        return None

    top = subs(build_parser())
    return {name: (set(s) if (s := subs(p)) else None) for name, p in top.items()}


def named_commands(text: str) -> list[str]:
    """Every `abpo CMD [SUB]` that ``text`` names (see :data:`NAMED`), in order."""
    return [m.group(1) for m in NAMED.finditer(text)]


def unknown_commands(named: list[str], commands: dict[str, set[str] | None]) -> list[str]:
    """The names of ``named`` whose command, or whose command's subcommand, is not one of ``commands``."""
    bad = []
    for ref in named:
        cmd, *rest = ref.split()
        if cmd not in commands:
            bad.append(ref)
        elif commands[cmd] is not None and rest and rest[0] not in commands[cmd]:
            bad.append(ref)
    return bad
